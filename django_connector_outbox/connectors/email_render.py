"""A Message as an email: a multipart message of plain text and HTML whose subject is the title.

The HTML is a plain document with inline styles only (mail clients drop <style> sheets and
scripts alike): the title as a heading, the text's Markdown as HTML (markdown.to_html, every
text escaped), the fields as a two-column table, the buttons as links, the image, and the
context line in small grey type. Without a title the subject is the first line of the text.
"""

from __future__ import annotations

import html
from typing import Any

from django_connector_outbox.connectors.markdown import to_html
from django_connector_outbox.connectors.text_render import plain_text
from django_connector_outbox.message import Message

#: The longest subject derived from a Message's text: RFC 5322 asks for header lines of at
#: most 78 characters (section 2.1.1), so a longer first line is cut there, with an ellipsis.
SUBJECT_CHARS = 78


def render_email(message: Message) -> dict[str, Any]:
    """The email connector's body: ``subject``, ``text`` and ``html``."""
    text = plain_text(message)
    return {"subject": subject(message, text), "text": text, "html": html_document(message)}


def subject(message: Message, text: str) -> str:
    """The title on one line (a header may not hold a line break), else the text's first line."""
    if message.title:
        return " ".join(message.title.split())
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return first if len(first) <= SUBJECT_CHARS else first[: SUBJECT_CHARS - 1].rstrip() + "…"


def html_document(message: Message) -> str:
    """Every part of `message` as an HTML document, escaped."""
    parts = []
    if message.title:
        parts.append(f"<h2>{_escape(message.title)}</h2>")
    if message.text:
        parts.append(to_html(message.text))
    if message.fields:
        rows = "".join(
            f'<tr><th align="left" style="padding:2px 12px 2px 0">{_escape(label)}</th>'
            f"<td>{_escape(value)}</td></tr>"
            for label, value in message.fields
        )
        parts.append(f"<table>{rows}</table>")
    if message.actions:
        links = " &middot; ".join(
            f'<a href="{_escape(link.url)}"><strong>{_escape(link.label)}</strong></a>'
            for link in message.actions
        )
        parts.append(f"<p>{links}</p>")
    if message.image_url:
        parts.append(f'<p><img src="{_escape(message.image_url)}" alt="" style="max-width:100%"></p>')
    if message.context:
        parts.append(f'<div style="color:#666666;font-size:small">{to_html(message.context)}</div>')
    body = "\n".join(parts)
    return f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"></head><body>\n{body}\n</body></html>\n'


def _escape(text: str) -> str:
    return html.escape(text, quote=True)
