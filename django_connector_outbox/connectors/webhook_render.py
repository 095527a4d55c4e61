"""A Message as a webhook's JSON: the Message itself, for a receiver that renders it its own
way, and its plain-text rendering under ``text``, the key that incoming webhooks of chat
platforms (Slack, Mattermost, Rocket.Chat) and most receivers' logs show as they are."""

from __future__ import annotations

from typing import Any

from django_connector_outbox.connectors.text_render import plain_text
from django_connector_outbox.message import Message


def render_webhook(message: Message) -> dict[str, Any]:
    """``{"text": <plain text>, "message": <the Message's JSON>}``."""
    return {"text": plain_text(message), "message": message.to_json()}
