"""A Message as plain text: the base connector's rendering, and the text part of others'.

Nothing of the Message is dropped: the title, the text with its Markdown markers taken off
(links keep their url), the fields as "label: value" lines, the buttons as "label: url"
lines, the image's url and the context line, each part a paragraph.
"""

from __future__ import annotations

from django_connector_outbox.connectors.markdown import to_plain
from django_connector_outbox.message import Message


def plain_text(message: Message) -> str:
    """Every part of `message` as readable plain text."""
    parts = [message.title] if message.title else []
    if message.text:
        parts.append(to_plain(message.text))
    if message.fields:
        parts.append("\n".join(f"{label}: {value}" for label, value in message.fields))
    if message.actions:
        parts.append("\n".join(f"{link.label}: {link.url}" for link in message.actions))
    if message.image_url:
        parts.append(message.image_url)
    if message.context:
        parts.append(to_plain(message.context))
    return "\n\n".join(part for part in parts if part)
