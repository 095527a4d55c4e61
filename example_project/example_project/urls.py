from importlib.util import find_spec

from django.contrib import admin
from django.urls import include, path

urlpatterns = [path("admin/", admin.site.urls)]

if find_spec("slack_sdk") is not None:
    # The "Add to Slack" flow of sources with "installations": True (the "slack" extra).
    urlpatterns.append(path("slack/", include("django_connector_outbox.installations.slack_urls")))
