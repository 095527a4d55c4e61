"""A Message as Mattermost shows it: the post's message, and an attachment for the rest.

The text is the post's `message`, in Mattermost's Markdown. A title, fields, an image, links
or a context line go into one message attachment (developers.mattermost.com/integrate/
reference/message-attachments): `title`, `fields` (short ones side by side), `image_url`, the
links as a line of Markdown links in its `text` (an attachment's buttons call an integration's
URL, they cannot open a page), the context as its `footer`, and the required plain-text
`fallback` that notifications show. `disable_group_highlight` keeps an ``@channel`` or
``@all`` in a Message's text from notifying a whole channel.

Mattermost's Markdown is CommonMark with extensions: every character that could start other
syntax (headings, lists, quotes, tables, emoji) is escaped with a backslash, which it hides.
"""

from __future__ import annotations

import json
import re
from typing import Any

from django_connector_outbox.connectors import markdown
from django_connector_outbox.connectors.limits import first, too_long
from django_connector_outbox.connectors.markdown_links import link_target
from django_connector_outbox.connectors.text_render import plain_text
from django_connector_outbox.message import Message

PLATFORM = "Mattermost"
#: model/post.go PostMessageMaxRunesV2 (the server's default; runes, as Python counts).
MESSAGE_CHARS = 16383
#: model/post.go PostPropsMaxUserRunes: the JSON of a post's props, marker included.
PROPS_CHARS = 400000

#: A field this short goes beside another (`short`: two a row, as Slack's attachments did);
#: a longer one takes the attachment's width, where it reads without wrapping in a half.
SHORT_FIELD_CHARS = 40

_SPECIAL = re.compile(r"([\\*_~`|>#\-+\[\]()<:!])")
_URL = re.compile(r"(https?://\S+)")


def escape(text: str) -> str:
    """`text` as Mattermost shows it literally; bare urls left whole, so they stay links."""
    parts = _URL.split(text)
    return "".join(part if number % 2 else _SPECIAL.sub(r"\\\1", part) for number, part in enumerate(parts))


class MattermostMarkdown(markdown.Markup):
    """Mattermost's Markdown."""

    def text(self, text: str) -> str:
        return escape(text)

    def bold(self, inner: str) -> str:
        return f"**{inner}**"

    def italic(self, inner: str) -> str:
        return f"_{inner}_"

    def strike(self, inner: str) -> str:
        return f"~~{inner}~~"

    def code(self, text: str) -> str:
        fence = "``" if "`" in text else "`"
        return f"{fence} {text} {fence}" if fence == "``" else f"`{text}`"

    def link(self, inner: str, url: str) -> str:
        return f"[{inner}]({link_target(url)})"

    def line_break(self) -> str:
        # CommonMark joins lines of a paragraph; two spaces before the newline keep the break.
        return "  \n"

    def code_block(self, text: str, language: str) -> str:
        fence = "````" if "```" in text else "```"
        return f"{fence}{language}\n{text}\n{fence}"


MARKDOWN = MattermostMarkdown()


def render(message: Message) -> dict[str, Any]:
    """The Create Post (and Patch Post) body that shows `message`."""
    props: dict[str, Any] = {"disable_group_highlight": True}
    rest = attachment(message)
    if rest:
        props["attachments"] = [rest]
    return {"message": MARKDOWN.render(message.text), "props": props}


def attachment(message: Message) -> dict[str, Any]:
    """The attachment of everything but the text, or {} if there is nothing else."""
    out: dict[str, Any] = {}
    if message.title:
        out["title"] = message.title
    if message.fields:
        out["fields"] = [
            {"title": label, "value": escape(value), "short": len(value) <= SHORT_FIELD_CHARS}
            for label, value in message.fields
        ]
    if message.image_url:
        out["image_url"] = message.image_url
    if message.actions:
        out["text"] = " · ".join(MARKDOWN.link(escape(link.label), link.url) for link in message.actions)
    if message.context:
        out["footer"] = markdown.to_plain(message.context)  # a footer is plain text
    if out:
        out["fallback"] = plain_text(message)
    return out


def problem(message: Message) -> str | None:
    """What of `message` Mattermost cannot show, or None."""
    rendered = render(message)
    return first(
        too_long("text", len(rendered["message"]), PLATFORM, MESSAGE_CHARS),
        too_long(
            "the attachment (title, fields, links, context)",
            len(json.dumps(rendered["props"], ensure_ascii=False)),
            PLATFORM,
            PROPS_CHARS,
        ),
    )
