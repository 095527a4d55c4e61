"""How the admin shows a post queued with a Message: its parts, readable, and the body its
source's connector renders from it (what the platform is sent), rather than the stored JSON."""

from __future__ import annotations

import json
import logging

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext

from django_connector_outbox.connectors import connectors
from django_connector_outbox.message import Message

logger = logging.getLogger("django_connector_outbox.admin")


def message_html(message: Message, source: str) -> SafeString:
    """A table of the Message's parts (the text as written, Markdown and all), and the body
    `source`'s connector renders from it; everything escaped, and no link made clickable."""
    rows: list[tuple[str, SafeString]] = []
    if message.title is not None:
        rows.append((gettext("Title"), format_html("{}", message.title)))
    rows.append((gettext("Text"), _pre(message.text)))
    if message.fields:
        pairs = format_html_join("", "<tr><th>{}</th><td>{}</td></tr>", message.fields)
        rows.append((gettext("Fields"), format_html("<table>{}</table>", pairs)))
    if message.actions:
        links = format_html_join(
            mark_safe("<br>"), "{} &rarr; <code>{}</code>", ((a.label, a.url) for a in message.actions)
        )
        rows.append((gettext("Buttons"), links))
    if message.image_url is not None:
        rows.append((gettext("Image"), format_html("<code>{}</code>", message.image_url)))
    if message.context is not None:
        rows.append((gettext("Context"), _pre(message.context)))
    table = format_html_join("", "<tr><th>{}</th><td>{}</td></tr>", rows)
    parts = format_html('<table class="outbox-message">{}</table>', table)
    rendered = _rendered(message, source)
    if rendered is None:
        return parts
    title = gettext("Rendered for %(source)s") % {"source": source}
    return format_html("{}<p><strong>{}</strong></p>{}", parts, title, _pre(rendered))


def _rendered(message: Message, source: str) -> str | None:
    """The connector's rendering as JSON, or None where it cannot be had here (a source no
    longer configured, a renderer that raises): the page still shows the Message."""
    try:
        body = connectors[source].render(message)
    except Exception:
        logger.warning("could not render a Message for the admin source=%s", source, exc_info=True)
        return None
    return json.dumps(body, indent=2, ensure_ascii=False, sort_keys=True, default=str)


def _pre(text: str) -> SafeString:
    return format_html('<pre class="outbox-pre">{}</pre>', text)
