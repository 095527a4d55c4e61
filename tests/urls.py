from django.contrib import admin
from django.urls import include, path

from tests import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("slack/", include("django_connector_outbox.installations.slack_urls")),
    path("async/queue/", views.queue_post),
    path("async/queue-sync/", views.queue_post_sync),
    path("async/sign-up/", views.sign_up),
]
