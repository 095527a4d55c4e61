"""A Message as Teams shows it: an Adaptive Card (version 1.5) in the activity's attachments.

The card's body: the title a large bold TextBlock, the text one TextBlock a paragraph (a code
block a Container of monospace lines), the fields a FactSet, the image an Image, the context a
small subtle TextBlock; the links are the card's Action.OpenUrl actions. The activity's `summary` is the
plain text that Teams shows in notifications and the activity feed.

A TextBlock's Markdown is a subset (adaptivecards.io, "Text features"; msteams-docs cards/
cards-format.md): bold, italic and links; no strike and no code, so those show as their plain
text. Other Markdown characters are escaped with a backslash.
"""

from __future__ import annotations

import json
import re
from typing import Any

from django_connector_outbox.connectors import markdown
from django_connector_outbox.connectors.limits import too_long
from django_connector_outbox.connectors.markdown_links import link_target
from django_connector_outbox.connectors.text_render import plain_text
from django_connector_outbox.message import Message

PLATFORM = "Teams"
CONTENT_TYPE = "application/vnd.microsoft.card.adaptive"
#: Teams renders cards of schema versions up to 1.5 in bots' messages (msteams-docs
#: task-modules-and-cards/cards/cards-reference.md).
VERSION = "1.5"
#: "The message size limit is approximately 100 KB", counted in UTF-16 (msteams-docs
#: bots/how-to/format-your-bot-messages.md); the docs advise keeping well under it.
MESSAGE_BYTES = 100 * 1024
#: What the connector adds around the rendering (the activity's type, its reply-to): room
#: kept for it, so that a Message taken at queue time is never too big at send time.
ENVELOPE_BYTES = 1024

#: An empty line of code still takes its line (a TextBlock needs some text).
NBSP = "\u00a0"

_SPECIAL = re.compile(r"([\\*_~`\[\]()#>\-])")
_URL = re.compile(r"(https?://\S+)")


def escape(text: str) -> str:
    """`text` as a TextBlock shows it literally; bare urls left whole, so they stay links."""
    parts = _URL.split(text)
    return "".join(part if number % 2 else _SPECIAL.sub(r"\\\1", part) for number, part in enumerate(parts))


class CardMarkdown(markdown.Markup):
    """The Markdown of an Adaptive Card's TextBlock."""

    def text(self, text: str) -> str:
        return escape(text)

    def bold(self, inner: str) -> str:
        return f"**{inner}**"

    def italic(self, inner: str) -> str:
        return f"_{inner}_"

    def link(self, inner: str, url: str) -> str:
        return f"[{inner}]({link_target(url)})"

    def line_break(self) -> str:
        # Teams shows a TextBlock's single newline as a space (OfficeDev/Microsoft-Teams-
        # Samples#1087); a blank line starts a new line.
        return "\n\n"


MARKDOWN = CardMarkdown()


def render(message: Message) -> dict[str, Any]:
    """The activity fields that show `message`: its card, and the summary."""
    return {
        "summary": plain_text(message),
        "attachments": [{"contentType": CONTENT_TYPE, "content": card(message)}],
    }


def card(message: Message) -> dict[str, Any]:
    """The Adaptive Card of `message`."""
    body: list[dict[str, Any]] = []
    if message.title:
        body.append(
            {
                "type": "TextBlock",
                "text": escape(message.title),
                "size": "Large",
                "weight": "Bolder",
                "wrap": True,
            }
        )
    for block in markdown.parse(message.text):
        if isinstance(block, markdown.CodeBlock):
            body.append(code_block(block.text))
        else:
            body.append({"type": "TextBlock", "text": MARKDOWN.block(block), "wrap": True})
    if message.fields:
        body.append(
            {
                "type": "FactSet",
                "facts": [
                    {"title": escape(label), "value": escape(value)} for label, value in message.fields
                ],
            }
        )
    if message.image_url:
        body.append({"type": "Image", "url": message.image_url, "altText": message.title or "image"})
    if message.context:
        body.append(
            {
                "type": "TextBlock",
                "text": MARKDOWN.render(message.context),
                "size": "Small",
                "isSubtle": True,
                "wrap": True,
            }
        )
    out: dict[str, Any] = {"type": "AdaptiveCard", "version": VERSION, "body": body}
    if message.actions:
        out["actions"] = [
            {"type": "Action.OpenUrl", "title": link.label, "url": link.url} for link in message.actions
        ]
    return out


def code_block(text: str) -> dict[str, Any]:
    """A code block as a Container of monospace TextBlocks, one a line and no space between:
    Teams does not break a TextBlock's line at a single newline (OfficeDev/Microsoft-Teams-
    Samples#1087), and a code block's lines must stay as typed. Still Markdown: escaped, and the
    indentation in no-break spaces, which Markdown does not trim."""
    lines = [
        {
            "type": "TextBlock",
            "text": _indented(escape(line)) or NBSP,
            "fontType": "Monospace",
            "wrap": True,
            "spacing": "None",
        }
        for line in text.split("\n")
    ]
    return {"type": "Container", "items": lines}


def _indented(line: str) -> str:
    text = line.lstrip(" ")
    return NBSP * (len(line) - len(text)) + text


def problem(message: Message) -> str | None:
    """What of `message` Teams cannot show, or None."""
    size = len(json.dumps(render(message), ensure_ascii=False).encode("utf-16-le"))
    return too_long("the card", size, PLATFORM, MESSAGE_BYTES - ENVELOPE_BYTES, unit="bytes (UTF-16)")
