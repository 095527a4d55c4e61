"""A Message as Telegram shows it: one text in the Bot API's HTML, with a keyboard of links.

The title is bold, the text follows in the tags Telegram supports (b, i, s, code, pre, a; the
Bot API's "HTML style"), each field a line of its bold label and its value, the context an italic last line;
the image is the link preview, shown large (`link_preview_options`, Bot API 7.0), since a text
message holds no picture; the links are an inline keyboard of url buttons, one a row.

Everything else is escaped: "All <, > and & symbols that are not a part of a tag or an HTML
entity must be replaced with the corresponding HTML entities" (core.telegram.org/bots/api,
HTML style); quotes too inside an attribute.
"""

from __future__ import annotations

import html
import re
from typing import Any

from django_connector_outbox.connectors import markdown
from django_connector_outbox.connectors.limits import too_long
from django_connector_outbox.message import Message

PLATFORM = "Telegram"
#: sendMessage.text: "1-4096 characters after entities parsing" (Bot API 10.1).
TEXT_CHARS = 4096

_TAG = re.compile(r"<[^>]*>")


def escape(text: str) -> str:
    return html.escape(text, quote=False)


class TelegramHtml(markdown.Markup):
    """The Bot API's HTML subset."""

    def text(self, text: str) -> str:
        return escape(text)

    def bold(self, inner: str) -> str:
        return f"<b>{inner}</b>"

    def italic(self, inner: str) -> str:
        return f"<i>{inner}</i>"

    def strike(self, inner: str) -> str:
        return f"<s>{inner}</s>"

    def code(self, text: str) -> str:
        return f"<code>{escape(text)}</code>"

    def link(self, inner: str, url: str) -> str:
        return f'<a href="{html.escape(url, quote=True)}">{inner}</a>'

    def code_block(self, text: str, language: str) -> str:
        if language:  # the Bot API's way to name it: <pre><code class="language-python">
            return (
                f'<pre><code class="language-{html.escape(language, quote=True)}">{escape(text)}</code></pre>'
            )
        return f"<pre>{escape(text)}</pre>"


HTML = TelegramHtml()


def render(message: Message) -> dict[str, Any]:
    """The sendMessage (and editMessageText) arguments that show `message`."""
    body: dict[str, Any] = {"text": text(message), "parse_mode": "HTML"}
    if message.image_url:
        body["link_preview_options"] = {"url": message.image_url, "prefer_large_media": True}
    else:
        body["link_preview_options"] = {"is_disabled": True}
    if message.actions:
        body["reply_markup"] = {
            "inline_keyboard": [[{"text": link.label, "url": link.url}] for link in message.actions]
        }
    return body


def text(message: Message) -> str:
    """The message's HTML: title, text, fields, context."""
    parts = [f"<b>{escape(message.title)}</b>"] if message.title else []
    if message.text.strip():
        parts.append(HTML.render(message.text))
    if message.fields:
        parts.append("\n".join(f"<b>{escape(label)}:</b> {escape(value)}" for label, value in message.fields))
    if message.context:
        parts.append(f"<i>{HTML.render(message.context)}</i>")
    if not parts and message.image_url:  # an image alone: Telegram needs some text to preview
        parts.append(escape(message.image_url))
    return "\n\n".join(parts)


def shown_length(rendered: str) -> int:
    """The characters of `rendered` (our own well-formed HTML) after entities parsing."""
    return len(html.unescape(_TAG.sub("", rendered)))


def problem(message: Message) -> str | None:
    """What of `message` Telegram cannot show, or None."""
    return too_long(
        "the text (title, text, fields and context after entities parsing)",
        shown_length(text(message)),
        PLATFORM,
        TEXT_CHARS,
    )
