"""Template tags for a project's own pages: ``{% load connector_outbox %}``.

``{% add_to_slack_button "slack" %}`` renders Slack's "Add to Slack" button (the markup and
images Slack publishes for it) linking to this package's install view of that source, so a
page needs no hand-copied URL. The install view must be routed
(``path("slack/", include("django_connector_outbox.installations.slack_urls"))``); without it
the tag raises ImproperlyConfigured saying so, rather than rendering a dead link.
"""

from __future__ import annotations

from typing import Any

from django import template
from django.core.exceptions import ImproperlyConfigured
from django.urls import NoReverseMatch, reverse

register = template.Library()


@register.inclusion_tag("django_connector_outbox/slack/add_to_slack_button.html")
def add_to_slack_button(source: str) -> dict[str, Any]:
    """Slack's "Add to Slack" button, linking to ``slack/install/<source>/``."""
    try:
        url = reverse("connector_outbox_slack:install", args=[source])
    except NoReverseMatch as error:
        raise ImproperlyConfigured(
            "add_to_slack_button needs the install view in your URLconf: "
            'path("slack/", include("django_connector_outbox.installations.slack_urls"))'
        ) from error
    return {"url": url}
