"""The "Add to Slack" flow's URLs (needs slack-sdk, the "slack" extra):

    path("slack/", include("django_connector_outbox.installations.slack_urls"))

gives `slack/install/<source>/` (link an "Add to Slack" button there) and
`slack/oauth_redirect/<source>/` (the Redirect URL to set in the Slack app's OAuth settings).
"""

from django.urls import path

from django_connector_outbox.installations import slack_views

app_name = "connector_outbox_slack"

urlpatterns = [
    path("install/<str:source>/", slack_views.install, name="install"),
    path("oauth_redirect/<str:source>/", slack_views.oauth_redirect, name="oauth_redirect"),
]
