"""A Message as Slack shows it: Block Kit blocks, plus the `text` fallback for notifications.

The title is a header block, the text one or more section blocks of mrkdwn (a section holds
3,000 characters: a longer text is split over several, at paragraph, then line, then word
boundaries), the fields a section of fields (ten a section), the image an image block, the
links an actions block of link buttons, the context a context block. `text` carries the whole
Message as plain text: Slack shows it in notifications and where blocks cannot be shown.

mrkdwn is not Markdown (docs.slack.dev/messaging/formatting-message-text): bold is ``*x*``,
italic ``_x_``, strike ``~x~``, a link ``<url|label>``, and ``&``, ``<`` and ``>`` must be
written ``&amp;``, ``&lt;`` and ``&gt;`` everywhere, `text` included, or Slack reads them as
its own controls (``<!channel>`` pings everyone).
"""

from __future__ import annotations

import re
from typing import Any

from django_connector_outbox.connectors import markdown
from django_connector_outbox.connectors.limits import first, too_long, too_many
from django_connector_outbox.connectors.text_render import plain_text
from django_connector_outbox.message import Message

PLATFORM = "Slack"
MAX_BLOCKS = 50  # docs.slack.dev/reference/block-kit/blocks: "up to 50 blocks in each message"
SECTION_TEXT_CHARS = 3000  # python-slack-sdk blocks.py SectionBlock.text_max_length
SECTION_FIELDS = 10  # blocks.py SectionBlock.fields_max_length
FIELD_TEXT_CHARS = 2000  # section-block reference: each field's text "max 2000 characters"
HEADER_TEXT_CHARS = 150  # blocks.py HeaderBlock.text_max_length
ACTIONS_ELEMENTS = 25  # blocks.py ActionsBlock.elements_max_length
IMAGE_URL_CHARS = 3000  # blocks.py ImageBlock.image_url_max_length
ALT_TEXT_CHARS = 2000  # blocks.py ImageBlock.alt_text_max_length
BUTTON_TEXT_CHARS = 75  # block_elements.py ButtonElement.text_max_length
BUTTON_URL_CHARS = 3000  # block_elements.py ButtonElement.url_max_length
#: chat.update refuses a `text` over 4,000 characters (msg_too_long, chat.update's errors), and
#: a status is edited with the same body: the fallback is cut to it, ending with an ellipsis.
FALLBACK_CHARS = 4000
ZWSP = "\u200b"

_URL = re.compile(r"(https?://\S+)")
MARKERS = "*_~`"


def escape(text: str) -> str:
    """`text` with ``&``, ``<``, ``>`` as their entities, as Slack requires of any text."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def code_text(text: str) -> str:
    """`text` inside a code block: escaped, and a fence in it broken by a zero-width space (it
    would end the block)."""
    return escape(text).replace("```", "`" + ZWSP + "``")


def literal(text: str) -> str:
    """`text` as mrkdwn shows it literally: escaped, and each ``*``, ``_``, ``~`` or backtick
    that could open or close a span (one at a word's edge) set apart by zero-width spaces.
    mrkdwn has no escape character ("there's no way to escape these characters", Slack's
    formatting guide): a span opens only after a space or punctuation and closes only before
    one, and a zero-width space is neither. Bare urls are left whole, so they stay links."""
    parts = _URL.split(escape(text))
    return "".join(part if number % 2 else _set_apart(part) for number, part in enumerate(parts))


def _set_apart(text: str) -> str:
    return "".join(
        ZWSP + char + ZWSP
        if char in MARKERS and not (text[i - 1 : i].isalnum() and text[i + 1 : i + 2].isalnum())
        else char
        for i, char in enumerate(text)
    )


class Mrkdwn(markdown.Markup):
    """Slack's mrkdwn."""

    def text(self, text: str) -> str:
        return literal(text)

    def bold(self, inner: str) -> str:
        return f"*{inner}*"

    def italic(self, inner: str) -> str:
        return f"_{inner}_"

    def strike(self, inner: str) -> str:
        return f"~{inner}~"

    def code(self, text: str) -> str:
        return f"`{escape(text)}`"

    def link(self, inner: str, url: str) -> str:
        # A "|" in the url would end it early: percent-encoded, the link still opens.
        return f"<{escape(url).replace('|', '%7C')}|{inner}>"

    def code_block(self, text: str, language: str) -> str:
        return f"```\n{code_text(text)}\n```"


MRKDWN = Mrkdwn()


def render(message: Message) -> dict[str, Any]:
    """The chat.postMessage (and chat.update) arguments that show `message`."""
    return {"text": fallback(message), "blocks": blocks(message)}


def blocks(message: Message) -> list[dict[str, Any]]:
    """Every block of `message`, in reading order."""
    out: list[dict[str, Any]] = []
    if message.title:
        out.append({"type": "header", "text": _plain(message.title)})
    out += [{"type": "section", "text": _mrkdwn(chunk)} for chunk in sections(message.text)]
    for start in range(0, len(message.fields), SECTION_FIELDS):
        chunk = message.fields[start : start + SECTION_FIELDS]
        out.append({"type": "section", "fields": [_mrkdwn(_field(label, value)) for label, value in chunk]})
    if message.image_url:
        out.append({"type": "image", "image_url": message.image_url, "alt_text": message.title or "image"})
    for start in range(0, len(message.actions), ACTIONS_ELEMENTS):
        links = message.actions[start : start + ACTIONS_ELEMENTS]
        buttons = [
            {"type": "button", "text": _plain(link.label), "url": link.url, "action_id": f"link-{start + n}"}
            for n, link in enumerate(links)
        ]
        out.append({"type": "actions", "elements": buttons})
    if message.context:
        out.append({"type": "context", "elements": [_mrkdwn(MRKDWN.render(message.context))]})
    return out


def sections(text: str) -> list[str]:
    """`text` as mrkdwn, in pieces of at most `SECTION_TEXT_CHARS`: whole blocks (paragraphs,
    code blocks) together while they fit, a longer one cut at its lines, a longer line at a
    space (or anywhere, but never inside an entity)."""
    pieces: list[str] = []
    for block in markdown.parse(text):
        rendered = MRKDWN.block(block)
        if len(rendered) <= SECTION_TEXT_CHARS:
            pieces.append(rendered)
        elif isinstance(block, markdown.CodeBlock):
            room = SECTION_TEXT_CHARS - len("```\n\n```")
            pieces += [f"```\n{part}\n```" for part in _cut(code_text(block.text), room)]
        else:
            pieces += _cut(rendered, SECTION_TEXT_CHARS)
    chunks: list[str] = []
    for piece in pieces:
        if chunks and len(chunks[-1]) + 2 + len(piece) <= SECTION_TEXT_CHARS:
            chunks[-1] += "\n\n" + piece
        else:
            chunks.append(piece)
    return chunks


def _cut(text: str, room: int) -> list[str]:
    """`text` in parts of at most `room` characters, cut after a newline or a space if one is
    near the end of the room, never inside an ``&...;`` entity."""
    parts = []
    while len(text) > room:
        at = max(text.rfind("\n", 0, room), text.rfind(" ", 0, room))
        if at < room // 2:
            at = room
            entity = text.rfind("&", 0, at)
            if entity != -1 and text.find(";", entity) >= at:
                at = entity
        else:
            at += 1
        parts.append(text[:at].rstrip("\n"))
        text = text[at:]
    return [*parts, text]


def fallback(message: Message) -> str:
    """The whole Message as plain text for `text`, escaped, at most `FALLBACK_CHARS`."""
    text = escape(plain_text(message))
    if len(text) <= FALLBACK_CHARS:
        return text
    cut = text[: FALLBACK_CHARS - 1]
    entity = cut.rfind("&")
    if entity != -1 and ";" not in cut[entity:]:
        cut = cut[:entity]
    return cut + "…"


def problem(message: Message) -> str | None:
    """What of `message` Slack cannot show, or None."""
    longest_field = max((len(_field(label, value)) for label, value in message.fields), default=0)
    return first(
        too_long("title", len(message.title or ""), PLATFORM, HEADER_TEXT_CHARS),
        too_long("a field", longest_field, PLATFORM, FIELD_TEXT_CHARS),
        *(
            too_long(f"button {link.label!r}", len(link.label), PLATFORM, BUTTON_TEXT_CHARS)
            for link in message.actions
        ),
        *(
            too_long(f"the url of button {link.label!r}", len(link.url), PLATFORM, BUTTON_URL_CHARS)
            for link in message.actions
        ),
        too_long("image_url", len(message.image_url or ""), PLATFORM, IMAGE_URL_CHARS),
        too_long("context", len(MRKDWN.render(message.context or "")), PLATFORM, SECTION_TEXT_CHARS),
        too_many(
            "blocks (the text in sections of 3,000 characters, and the rest)",
            len(blocks(message)),
            PLATFORM,
            MAX_BLOCKS,
        ),
    )


def _field(label: str, value: str) -> str:
    return f"*{literal(label)}*\n{literal(value)}" if label else literal(value)


def _plain(text: str) -> dict[str, Any]:
    return {"type": "plain_text", "text": text, "emoji": True}


def _mrkdwn(text: str) -> dict[str, Any]:
    return {"type": "mrkdwn", "text": text}
