from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("slack/", include("django_connector_outbox.installations.slack_urls")),
]
