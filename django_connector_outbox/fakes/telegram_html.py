"""Telegram's `parse_mode: "HTML"` and inline keyboards as the Bot API checks them.

core.telegram.org/bots/api, "HTML style": only the tags b/strong, i/em, u/ins, s/strike/del,
span class="tg-spoiler", tg-spoiler, a href, tg-emoji emoji-id, code, pre (with an inner code
class="language-..."), blockquote (expandable) are supported; `<`, `>` and `&` that are not
part of a tag or an entity must be escaped; the named entities are &lt; &gt; &amp; &quot;,
every numerical one works. Text limits count the text "after entities parsing": the tags are
gone and the entities decoded. The refusals are worded as the Bot API's answers are (TDLib's
parse_html: "Bad Request: can't parse entities: Unsupported start tag "div" at byte offset 0").
"""

from __future__ import annotations

import html
import re
from typing import Any

#: sendMessage.text: "1-4096 characters after entities parsing" (Bot API 10.1).
TEXT_CHARS = 4096

#: Each supported tag -> the attributes it may have.
TAGS: dict[str, frozenset[str]] = {
    **dict.fromkeys(("b", "strong", "i", "em", "u", "ins", "s", "strike", "del", "tg-spoiler"), frozenset()),
    "span": frozenset({"class"}),
    "a": frozenset({"href"}),
    "tg-emoji": frozenset({"emoji-id"}),
    "code": frozenset({"class"}),
    "pre": frozenset(),
    "blockquote": frozenset({"expandable"}),
}
_TAG = re.compile(
    r"<(/?)([a-zA-Z][a-zA-Z0-9-]*)((?:\s+[a-zA-Z-]+(?:\s*=\s*(?:\"[^\"]*\"|'[^']*'|[^\s>]+))?)*)\s*>"
)
_ATTRIBUTE = re.compile(r"([a-zA-Z-]+)(?:\s*=\s*(\"[^\"]*\"|'[^']*'|[^\s>]+))?")
_ENTITY = re.compile(r"&(lt|gt|amp|quot|#\d+|#x[0-9a-fA-F]+);")


class EntitiesError(ValueError):
    """A text the Bot API cannot parse; `str()` is the answer's description."""


def visible_text(text: str) -> str:
    """The text of `text` (HTML of the Bot API's subset) as Telegram counts it, or raise
    `EntitiesError` worded as the Bot API refuses it."""
    out: list[str] = []
    open_tags: list[str] = []
    position = 0
    while position < len(text):
        char = text[position]
        if char == "<":
            match = _TAG.match(text, position)
            offset = len(text[:position].encode())
            if match is None:
                raise _cannot_parse(f"Unsupported start tag at byte offset {offset}")
            closing, name, attributes = match.group(1), match.group(2).lower(), match.group(3)
            if closing:
                if not open_tags:
                    raise _cannot_parse(f"Unexpected end tag at byte offset {offset}")
                if open_tags[-1] != name:
                    raise _cannot_parse(
                        f'Unmatched end tag at byte offset {offset}, expected "</{open_tags[-1]}>", found "</{name}>"'
                    )
                open_tags.pop()
            else:
                _check_start_tag(name, attributes, offset, open_tags)
                open_tags.append(name)
            position = match.end()
        elif char == "&" and (entity := _ENTITY.match(text, position)):
            out.append(html.unescape(entity.group(0)))
            position = entity.end()
        else:
            out.append(char)
            position += 1
    if open_tags:
        raise _cannot_parse(f'Can\'t find end tag corresponding to start tag "{open_tags[-1]}"')
    return "".join(out)


def _check_start_tag(name: str, attributes: str, offset: int, open_tags: list[str]) -> None:
    allowed = TAGS.get(name)
    if allowed is None:
        raise _cannot_parse(f'Unsupported start tag "{name}" at byte offset {offset}')
    found = {m.group(1).lower(): (m.group(2) or "").strip("\"'") for m in _ATTRIBUTE.finditer(attributes)}
    if name == "a" and "href" not in found:
        raise _cannot_parse(f'Unsupported start tag "a" at byte offset {offset}: no href')
    if name == "span" and found.get("class") != "tg-spoiler":
        raise _cannot_parse(f'Tag "span" must have class "tg-spoiler" at byte offset {offset}')
    if name == "code" and "class" in found and (not open_tags or open_tags[-1] != "pre"):
        # A language is a code block's: <pre><code class="language-python">.
        raise _cannot_parse(f'Unsupported start tag "code" at byte offset {offset}')
    if open_tags and open_tags[-1] in ("pre", "code") and name != "code":
        # "pre" and "code" entities "can't contain other entities" (Bot API formatting options).
        raise _cannot_parse(f'Unsupported start tag "{name}" inside code at byte offset {offset}')


def _cannot_parse(reason: str) -> EntitiesError:
    return EntitiesError(f"Bad Request: can't parse entities: {reason}")


def keyboard_problem(markup: Any) -> str | None:
    """Why the Bot API refuses `markup` (a reply_markup of inline url buttons), or None."""
    if markup is None:
        return None
    rows = markup.get("inline_keyboard") if isinstance(markup, dict) else None
    if not isinstance(rows, list) or not all(isinstance(row, list) for row in rows):
        return 'Bad Request: field "inline_keyboard" of the InlineKeyboardMarkup must be an Array of Arrays'
    for row in rows:
        for button in row:
            if not isinstance(button, dict) or not isinstance(button.get("text"), str):
                return 'Bad Request: can\'t parse inline keyboard button: Field "text" must be of type String'
            # InlineKeyboardButton: "You must use exactly one of the optional fields".
            kinds = set(button) - {"text"}
            if not kinds:
                return "Bad Request: can't parse inline keyboard button: Text buttons are unallowed in the inline keyboard"
            url = button.get("url")
            if url is not None and not (
                isinstance(url, str) and url.startswith(("http://", "https://", "tg://"))
            ):
                return f"Bad Request: inline keyboard button URL '{url}' is invalid: Unsupported URL protocol"
    return None
