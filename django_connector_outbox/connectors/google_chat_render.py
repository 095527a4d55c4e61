"""A Message as a Google Chat message: its `text` in Chat's formatting, and a card (cardsV2)
for what text cannot show: fields, link buttons, an image, a context line.

Text (developers.google.com/workspace/chat/format-messages): ``*bold*``, ``_italic_``,
``~strike~``, ``` `code` ```, fenced ```` ``` ```` blocks and ``<url|label>`` links. Chat has
no escape for these markers, so a literal ``*`` pair in a Message's text shows in bold.

The card (cardsV2, Card v2 of the Chat API): the title as its header, the fields as
decoratedText widgets (label above, value below), the image, the buttons as one buttonList of
openLink buttons, the context as a textParagraph. Card widgets take Chat's HTML subset
(``<b>``, ``<i>``, ``<s>``, ``<a href>``; format-messages, "Format text in cards"), so their
text is escaped. A Message with no more than a title and text needs no card: the title is its
text's first line, in bold.
"""

from __future__ import annotations

import html
import json
from typing import Any

from django_connector_outbox.connectors.markdown import Markup
from django_connector_outbox.message import Message

#: "The maximum message size, including text and cards, is 32,000 bytes" (spaces.messages.create;
#: reference/limits.json google_chat.message_bytes).
MESSAGE_BYTES = 32_000
#: A message's text: 4,096 characters, Chat's limit on a message typed in its composer; the API
#: documents only the 32,000 bytes of the whole message (so this is the stricter of the two).
TEXT_CHARS = 4_096
#: "You can add up to 100 widgets per card"; widgets beyond it are ignored, so a Message that
#: needs more is refused (reference/limits.json google_chat.widgets_per_card).
WIDGETS_PER_CARD = 100
CARD_ID = "message"


class ChatText(Markup):
    """Google Chat's text formatting."""

    def bold(self, inner: str) -> str:
        return f"*{inner}*"

    def italic(self, inner: str) -> str:
        return f"_{inner}_"

    def strike(self, inner: str) -> str:
        return f"~{inner}~"

    def code(self, text: str) -> str:
        return f"`{text}`"

    def link(self, inner: str, url: str) -> str:
        return f"<{url}|{inner}>"

    def code_block(self, text: str, language: str) -> str:
        return f"```\n{text}\n```"


class CardText(Markup):
    """The HTML subset of card widgets: every text escaped."""

    def text(self, text: str) -> str:
        return html.escape(text, quote=False)

    def bold(self, inner: str) -> str:
        return f"<b>{inner}</b>"

    def italic(self, inner: str) -> str:
        return f"<i>{inner}</i>"

    def strike(self, inner: str) -> str:
        return f"<s>{inner}</s>"

    def link(self, inner: str, url: str) -> str:
        return f'<a href="{html.escape(url, quote=True)}">{inner}</a>'

    def line_break(self) -> str:
        return "<br>"

    block_separator = "<br><br>"


CHAT_TEXT = ChatText()
CARD_TEXT = CardText()


def render(message: Message) -> dict[str, Any]:
    """The Chat ``Message`` body (less its place) that shows `message`."""
    text = CHAT_TEXT.render(message.text)
    if not needs_card(message):
        if message.title:
            text = f"*{message.title}*\n{text}" if text else f"*{message.title}*"
        return {"text": text}
    body: dict[str, Any] = {"text": text} if text else {}
    body["cardsV2"] = [{"cardId": CARD_ID, "card": card(message)}]
    return body


def needs_card(message: Message) -> bool:
    return bool(message.fields or message.actions or message.image_url or message.context)


def card(message: Message) -> dict[str, Any]:
    """The card of `message`: one section per part, in the Message's order."""
    sections: list[dict[str, Any]] = []
    if message.fields:
        widgets = [
            {"decoratedText": {"topLabel": _escaped(label), "text": _escaped(value), "wrapText": True}}
            for label, value in message.fields
        ]
        sections.append({"widgets": widgets})
    if message.image_url:
        image = {"imageUrl": message.image_url, "altText": message.title or "image"}
        sections.append({"widgets": [{"image": image}]})
    if message.actions:
        buttons = [
            {"text": link.label, "onClick": {"openLink": {"url": link.url}}} for link in message.actions
        ]
        sections.append({"widgets": [{"buttonList": {"buttons": buttons}}]})
    if message.context:
        sections.append({"widgets": [{"textParagraph": {"text": CARD_TEXT.render(message.context)}}]})
    result: dict[str, Any] = {"sections": sections}
    if message.title:
        result = {"header": {"title": message.title}, **result}
    return result


def message_problem(message: Message) -> str | None:
    """Why Google Chat cannot show `message` (its text, its widgets, its size), or None."""
    body = render(message)
    chars = len(body.get("text", ""))
    if chars > TEXT_CHARS:
        return f"text is {chars:,} characters in Google Chat's formatting, over Google Chat's {TEXT_CHARS:,}"
    widgets = widget_count(body)
    if widgets > WIDGETS_PER_CARD:
        return (
            f"fields, image, actions and context make {widgets:,} card widgets, "
            f"over Google Chat's {WIDGETS_PER_CARD:,} a card"
        )
    size = len(json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode())
    if size > MESSAGE_BYTES:
        return f"the message is {size:,} bytes as Google Chat's JSON, over Google Chat's {MESSAGE_BYTES:,}"
    return None


def widget_count(body: dict[str, Any]) -> int:
    """The widgets of the largest card of `body` (a buttonList is one widget)."""
    counts = [
        sum(len(section.get("widgets", ())) for section in item["card"].get("sections", ()))
        for item in body.get("cardsV2", ())
    ]
    return max(counts, default=0)


def _escaped(text: str) -> str:
    return html.escape(text, quote=False)
