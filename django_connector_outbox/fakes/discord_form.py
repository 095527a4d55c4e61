"""A message body as Discord checks it: the fake Discord refuses what Discord refuses, the same way.

Discord answers a body it cannot take with HTTP 400 and ``{"code": 50035, "message": "Invalid
Form Body", "errors": {...}}``, where `errors` mirrors the body down to each bad value and ends
in ``{"_errors": [{"code": "BASE_TYPE_MAX_LENGTH", "message": "Must be 2000 or fewer in
length."}]}`` (discord-api-docs developers/reference.mdx, "Error Messages", whose example this
follows). The limits are those of developers/resources/message.mdx (Create Message, Embed
Limits) and developers/components/reference.mdx (Action Row, Button).
"""

from __future__ import annotations

from typing import Any

CONTENT_CHARS = 2000  # message.mdx Create Message: "up to 2000 characters"
EMBEDS = 10  # message.mdx Create Message: "Up to 10 rich embeds (up to 6000 characters)"
EMBED_TOTAL_CHARS = 6000  # message.mdx Embed Limits: the sum over every embed of a message
EMBED_TITLE_CHARS = 256  # Embed Limits
EMBED_DESCRIPTION_CHARS = 4096  # Embed Limits
EMBED_FIELDS = 25  # Embed Limits
FIELD_NAME_CHARS = 256  # Embed Limits
FIELD_VALUE_CHARS = 1024  # Embed Limits
FOOTER_TEXT_CHARS = 2048  # Embed Limits
AUTHOR_NAME_CHARS = 256  # Embed Limits
ACTION_ROWS = 5  # components/reference.mdx: a message holds up to 5 action rows (without IS_COMPONENTS_V2)
ROW_BUTTONS = 5  # components/reference.mdx Action Row: "up to 5 contextually grouped buttons"
BUTTON_LABEL_CHARS = 80  # components/reference.mdx Button: label "max 80 characters"
CUSTOM_ID_CHARS = 100  # components/reference.mdx: custom_id "1-100 characters"
ACTION_ROW, BUTTON = 1, 2  # component types
LINK_STYLE = 5  # Button styles: "Link 5 ... url"; Premium 6 has a sku_id instead
BUTTON_STYLES = (1, 2, 3, 4, 5, 6)

Errors = dict[str, Any]


def form_errors(body: dict[str, Any]) -> Errors:
    """Discord's `errors` tree for `body` (a Create or Edit Message body); empty if it is fine."""
    errors: Errors = {}
    _put(errors, ["content"], _max_length(body.get("content"), CONTENT_CHARS))
    embeds = body.get("embeds")
    if embeds is not None:
        _embeds(embeds, errors)
    components = body.get("components")
    if components is not None:
        _components(components, errors)
    return errors


def _embeds(embeds: Any, errors: Errors) -> None:
    if not isinstance(embeds, list):
        _put(errors, ["embeds"], _error("BASE_TYPE_ARRAY", "Must be an array."))
        return
    if len(embeds) > EMBEDS:
        _put(errors, ["embeds"], _too_many(EMBEDS))
    total = 0
    for index, embed in enumerate(embeds):
        at = ["embeds", str(index)]
        if not isinstance(embed, dict):
            _put(errors, at, _error("DICT_TYPE_CONVERT", "Only dictionaries may be used in a DictType"))
            continue
        for name, limit in (("title", EMBED_TITLE_CHARS), ("description", EMBED_DESCRIPTION_CHARS)):
            _put(errors, [*at, name], _max_length(embed.get(name), limit))
        footer, author = embed.get("footer") or {}, embed.get("author") or {}
        _put(errors, [*at, "footer", "text"], _max_length(footer.get("text"), FOOTER_TEXT_CHARS))
        _put(errors, [*at, "author", "name"], _max_length(author.get("name"), AUTHOR_NAME_CHARS))
        for part in ("image", "thumbnail"):
            if part in embed and not isinstance((embed[part] or {}).get("url"), str):
                _put(errors, [*at, part, "url"], _required())
        fields = [item for item in embed.get("fields") or [] if isinstance(item, dict)]
        if len(embed.get("fields") or []) > EMBED_FIELDS:
            _put(errors, [*at, "fields"], _too_many(EMBED_FIELDS))
        for number, item in enumerate(fields):
            for name, limit in (("name", FIELD_NAME_CHARS), ("value", FIELD_VALUE_CHARS)):
                value = item.get(name)
                found = _required() if not value else _max_length(value, limit)
                _put(errors, [*at, "fields", str(number), name], found)
        # Embed Limits: the characters of title, description, field.name, field.value,
        # footer.text and author.name, across all embeds of the message, up to 6000.
        counted = [embed.get("title"), embed.get("description"), footer.get("text"), author.get("name")]
        counted += [part for item in fields for part in (item.get("name"), item.get("value"))]
        total += sum(len(str(text)) for text in counted if text)
    if total > EMBED_TOTAL_CHARS:
        message = f"Embed size exceeds maximum size of {EMBED_TOTAL_CHARS}"
        _put(errors, ["embeds"], _error("MAX_EMBED_SIZE_EXCEEDED", message))


def _components(rows: Any, errors: Errors) -> None:
    if not isinstance(rows, list):
        _put(errors, ["components"], _error("BASE_TYPE_ARRAY", "Must be an array."))
        return
    if len(rows) > ACTION_ROWS:
        _put(errors, ["components"], _too_many(ACTION_ROWS))
    for index, row in enumerate(rows):
        at = ["components", str(index)]
        if not isinstance(row, dict) or row.get("type") != ACTION_ROW:
            _put(errors, [*at, "type"], _error("BASE_TYPE_CHOICES", "Value must be one of {1}."))
            continue
        buttons = row.get("components")
        if not isinstance(buttons, list) or not 1 <= len(buttons) <= ROW_BUTTONS:
            message = f"Must be between 1 and {ROW_BUTTONS} in length."
            _put(errors, [*at, "components"], _error("BASE_TYPE_BAD_LENGTH", message))
            continue
        for number, button in enumerate(buttons):
            _button(button, errors, [*at, "components", str(number)])


def _button(button: Any, errors: Errors, at: list[str]) -> None:
    if not isinstance(button, dict) or button.get("type") != BUTTON:
        # The renderers send buttons only; other row members are not looked into.
        return
    style = button.get("style")
    if style not in BUTTON_STYLES:
        _put(errors, [*at, "style"], _error("BASE_TYPE_CHOICES", "Value must be one of {1, 2, 3, 4, 5, 6}."))
    _put(errors, [*at, "label"], _max_length(button.get("label"), BUTTON_LABEL_CHARS))
    # "Link buttons must have a url, and cannot have a custom_id"; the others need a
    # custom_id and "cannot have a url" (components/reference.mdx, Button).
    if style == LINK_STYLE:
        url = button.get("url")
        if not isinstance(url, str) or not url:
            _put(errors, [*at, "url"], _required())
        elif not url.startswith(("http://", "https://", "discord://")):
            _put(errors, [*at, "url"], _error("URL_TYPE_INVALID_URL", "Not a well formed URL."))
    elif style != 6:
        custom_id = button.get("custom_id")
        found = _required() if not custom_id else _max_length(custom_id, CUSTOM_ID_CHARS)
        _put(errors, [*at, "custom_id"], found)


def _max_length(value: Any, limit: int) -> dict[str, str] | None:
    if value is not None and len(str(value)) > limit:
        return _error("BASE_TYPE_MAX_LENGTH", f"Must be {limit} or fewer in length.")
    return None


def _too_many(limit: int) -> dict[str, str]:
    return _error("BASE_TYPE_MAX_LENGTH", f"Must be {limit} or fewer in length.")


def _required() -> dict[str, str]:
    return _error("BASE_TYPE_REQUIRED", "This field is required")


def _error(code: str, message: str) -> dict[str, str]:
    return {"code": code, "message": message}


def _put(errors: Errors, path: list[str], error: dict[str, str] | None) -> None:
    """Add `error` at `path` of the tree, as Discord nests them (each leaf an `_errors` list)."""
    if error is None:
        return
    node = errors
    for key in path:
        node = node.setdefault(key, {})
    node.setdefault("_errors", []).append(error)
