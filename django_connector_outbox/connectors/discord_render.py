"""A Message as Discord shows it: the content, or an embed, with link buttons under it.

A Message of text alone (up to 2,000 characters) is the message's `content`. Anything more (a
title, fields, an image, a context line, or a longer text) is one embed: the title, the text as
its description (4,096 characters), the fields inline, the image, the context as its footer.
The links are link buttons (style 5), five to an action row. `allowed_mentions` is empty, so
that an ``@everyone`` or a ``<@id>`` in a Message's text never pings anyone.

Discord's Markdown is close to the subset, but its other syntax (headings, lists, quotes,
spoilers, masked links, mentions) is live in any text: every character that could start one
is escaped with a backslash, which Discord hides.
"""

from __future__ import annotations

import re
from typing import Any

from django_connector_outbox.connectors import markdown
from django_connector_outbox.connectors.limits import first, too_long, too_many
from django_connector_outbox.connectors.markdown_links import link_target
from django_connector_outbox.message import Message

PLATFORM = "Discord"
CONTENT_CHARS = 2000  # discord-api-docs resources/message.mdx, Create Message
EMBED_TOTAL_CHARS = 6000  # message.mdx, Embed Limits: every embed of a message together
TITLE_CHARS = 256  # Embed Limits
DESCRIPTION_CHARS = 4096  # Embed Limits
FIELDS = 25  # Embed Limits
FIELD_NAME_CHARS = 256  # Embed Limits
FIELD_VALUE_CHARS = 1024  # Embed Limits
FOOTER_CHARS = 2048  # Embed Limits
ROW_BUTTONS = 5  # components/reference.mdx, Action Row: up to 5 buttons
ACTION_ROWS = 5  # components/reference.mdx: up to 5 action rows in a message
BUTTON_LABEL_CHARS = 80  # components/reference.mdx, Button label
LINK_STYLE = 5  # Button styles: Link, "navigates to a URL"
#: The connector's own embed (a footer "outbox:" + 22 characters) counts in the 6,000 too.
MARKER_CHARS = len("outbox:") + 22
#: A field's value may not be empty (Discord: "This field is required"): a zero-width space
#: shows nothing and is accepted.
EMPTY = "\u200b"

_SPECIAL = re.compile(r"([\\*_~`|>#\-\[\]()<@:])")
#: A bare url, left as it is: escaped, Discord would no longer make it a link.
_URL = re.compile(r"(https?://\S+)")


def escape(text: str) -> str:
    """`text` as Discord shows it literally (Discord hides a backslash before punctuation)."""
    parts = _URL.split(text)
    return "".join(part if number % 2 else _SPECIAL.sub(r"\\\1", part) for number, part in enumerate(parts))


class DiscordMarkdown(markdown.Markup):
    """Discord's Markdown."""

    def text(self, text: str) -> str:
        return escape(text)

    def bold(self, inner: str) -> str:
        return f"**{inner}**"

    def italic(self, inner: str) -> str:
        return f"_{inner}_"

    def strike(self, inner: str) -> str:
        return f"~~{inner}~~"

    def code(self, text: str) -> str:
        # A backtick inside needs a longer fence; spaces keep one at an edge apart from it.
        fence = "``" if "`" in text else "`"
        return f"{fence} {text} {fence}" if fence == "``" else f"`{text}`"

    def link(self, inner: str, url: str) -> str:
        return f"[{inner}]({link_target(url)})"

    def code_block(self, text: str, language: str) -> str:
        # A fence inside would close the block: a zero-width space breaks it up.
        inside = text.replace("```", "`" + EMPTY + "``")
        return f"```{language}\n{inside}\n```"


MARKDOWN = DiscordMarkdown()


def render(message: Message) -> dict[str, Any]:
    """The Create Message (and Edit Message) body that shows `message`.

    Content, embeds and components are always all there, empty or not: an edit leaves what
    its body does not name, and a status may go from text alone to an embed and back.
    """
    text = MARKDOWN.render(message.text)
    alone = _text_alone(message) and len(text) <= CONTENT_CHARS
    buttons = [
        {"type": 2, "style": LINK_STYLE, "label": link.label, "url": link.url} for link in message.actions
    ]
    return {
        "content": text if alone else "",
        "embeds": [] if alone else [embed(message, text)],
        "components": [
            {"type": 1, "components": buttons[start : start + ROW_BUTTONS]}
            for start in range(0, len(buttons), ROW_BUTTONS)
        ],
        "allowed_mentions": {"parse": []},
    }


def embed(message: Message, text: str) -> dict[str, Any]:
    """The embed of `message`, its `text` rendered."""
    out: dict[str, Any] = {}
    if message.title:
        out["title"] = message.title
    if text:
        out["description"] = text
    if message.fields:
        out["fields"] = [
            {"name": label, "value": value or EMPTY, "inline": True} for label, value in message.fields
        ]
    if message.image_url:
        out["image"] = {"url": message.image_url}
    if message.context:
        # A footer is plain text: Discord shows its Markdown as typed.
        out["footer"] = {"text": markdown.to_plain(message.context)}
    return out


def problem(message: Message) -> str | None:
    """What of `message` Discord cannot show, or None."""
    text = MARKDOWN.render(message.text)
    if _text_alone(message) and len(text) <= CONTENT_CHARS:
        return _buttons_problem(message)
    rendered = embed(message, text)
    fields = rendered.get("fields", [])
    total = MARKER_CHARS + sum(
        len(part)
        for part in (
            rendered.get("title", ""),
            rendered.get("description", ""),
            rendered.get("footer", {}).get("text", ""),
            *(f["name"] + f["value"] for f in fields),
        )
    )
    return first(
        too_long("title", len(message.title or ""), PLATFORM, TITLE_CHARS),
        too_long("text", len(text), PLATFORM, DESCRIPTION_CHARS),
        too_many("fields", len(fields), PLATFORM, FIELDS),
        *(too_long(f"field {f['name']!r}", len(f["name"]), PLATFORM, FIELD_NAME_CHARS) for f in fields),
        *(
            too_long(f"the value of field {f['name']!r}", len(f["value"]), PLATFORM, FIELD_VALUE_CHARS)
            for f in fields
        ),
        too_long("context", len(rendered.get("footer", {}).get("text", "")), PLATFORM, FOOTER_CHARS),
        too_long("the embed (title, text, fields and context)", total, PLATFORM, EMBED_TOTAL_CHARS),
        _buttons_problem(message),
    )


def _buttons_problem(message: Message) -> str | None:
    return first(
        too_many("buttons", len(message.actions), PLATFORM, ROW_BUTTONS * ACTION_ROWS),
        *(
            too_long(f"button {link.label!r}", len(link.label), PLATFORM, BUTTON_LABEL_CHARS)
            for link in message.actions
        ),
    )


def _text_alone(message: Message) -> bool:
    return not (message.title or message.fields or message.image_url or message.context)
