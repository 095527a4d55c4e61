"""Block Kit as Slack checks it: the fake Slack refuses the blocks Slack refuses, the same way.

Slack answers a bad `blocks` argument with ``{"ok": false, "error": "invalid_blocks",
"errors": [...], "response_metadata": {"messages": ["[ERROR] ..."]}}``, each message naming the
rule and the place as a JSON pointer, e.g. ``must be less than 3001 characters
[json-pointer:/blocks/0/text/text]`` (the wording Slack's answers show, quoted in many bug
reports, e.g. grafana/oncall#5121). The limits are python-slack-sdk's
(slack_sdk/models/blocks/blocks.py, block_elements.py) and docs.slack.dev's block reference. Block types this module does not look into
(rich_text, input, video...) are accepted as they are; a type Slack does not know is refused.
"""

from __future__ import annotations

from typing import Any

from django_connector_outbox.fakes.slack_teams import SlackError

# docs.slack.dev/reference/block-kit/blocks: "up to 50 blocks in each message".
MAX_BLOCKS = 50
BLOCK_ID_CHARS = 255  # blocks.py Block.block_id_max_length
SECTION_TEXT_CHARS = 3000  # blocks.py SectionBlock.text_max_length
SECTION_FIELDS = 10  # blocks.py SectionBlock.fields_max_length
FIELD_TEXT_CHARS = 2000  # section-block reference: fields "max 2000 characters each"
HEADER_TEXT_CHARS = 150  # blocks.py HeaderBlock.text_max_length
ACTIONS_ELEMENTS = 25  # blocks.py ActionsBlock.elements_max_length
CONTEXT_ELEMENTS = 10  # blocks.py ContextBlock.elements_max_length
MARKDOWN_TEXT_CHARS = 12000  # blocks.py MarkdownBlock.text_max_length
IMAGE_URL_CHARS = 3000  # blocks.py ImageBlock.image_url_max_length
ALT_TEXT_CHARS = 2000  # blocks.py ImageBlock.alt_text_max_length
BUTTON_TEXT_CHARS = 75  # block_elements.py ButtonElement.text_max_length
BUTTON_URL_CHARS = 3000  # block_elements.py ButtonElement.url_max_length
BUTTON_VALUE_CHARS = 2000  # block_elements.py ButtonElement.value_max_length
ACTION_ID_CHARS = 255  # block_elements.py InteractiveElement.action_id_max_length

#: Every block type of docs.slack.dev/reference/block-kit/blocks that a message may hold.
BLOCK_TYPES = frozenset(
    {
        "actions",
        "context",
        "divider",
        "file",
        "header",
        "image",
        "input",
        "markdown",
        "rich_text",
        "section",
        "video",
    }
)


class InvalidBlocks(SlackError):
    """Slack's `invalid_blocks` answer, with the rules broken as Slack lists them."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("invalid_blocks")
        self.details = {
            "errors": errors,
            "response_metadata": {"messages": [f"[ERROR] {e}" for e in errors]},
        }


def check_blocks(blocks: Any) -> None:
    """Raise `InvalidBlocks` listing every rule `blocks` (a message's) breaks."""
    errors = block_errors(blocks)
    if errors:
        raise InvalidBlocks(errors)


def block_errors(blocks: Any) -> list[str]:
    """The rules `blocks` breaks, each as Slack words it."""
    if not isinstance(blocks, list):
        return [_at("must be an array", "/blocks")]
    errors: list[str] = []
    if len(blocks) > MAX_BLOCKS:
        errors.append(_at(f"no more than {MAX_BLOCKS} items allowed", "/blocks"))
    for index, block in enumerate(blocks):
        errors += _block(block, f"/blocks/{index}")
    return errors


def _block(block: Any, at: str) -> list[str]:
    if not isinstance(block, dict) or block.get("type") not in BLOCK_TYPES:
        return [_at("failed to match all allowed schemas", at)]
    errors = _length(block.get("block_id"), BLOCK_ID_CHARS, f"{at}/block_id", required=False)
    check = _CHECKS.get(block["type"])
    return errors + (check(block, at) if check else [])


def _section(block: dict[str, Any], at: str) -> list[str]:
    if "text" not in block and "fields" not in block:
        return [_at("must provide text or fields", at)]
    errors: list[str] = []
    if "text" in block:
        errors += _text_object(block["text"], f"{at}/text", SECTION_TEXT_CHARS)
    if "fields" in block:
        fields = block["fields"]
        if not isinstance(fields, list) or not fields:
            return [*errors, _at("must provide a non-empty array", f"{at}/fields")]
        if len(fields) > SECTION_FIELDS:
            errors.append(_at(f"no more than {SECTION_FIELDS} items allowed", f"{at}/fields"))
        for index, item in enumerate(fields):
            errors += _text_object(item, f"{at}/fields/{index}", FIELD_TEXT_CHARS)
    if "accessory" in block:
        errors += _element(block["accessory"], f"{at}/accessory")
    return errors


def _header(block: dict[str, Any], at: str) -> list[str]:
    return _text_object(block.get("text"), f"{at}/text", HEADER_TEXT_CHARS, types=("plain_text",))


def _image(block: dict[str, Any], at: str) -> list[str]:
    errors = _image_parts(block, at)
    if "title" in block:
        errors += _text_object(block["title"], f"{at}/title", ALT_TEXT_CHARS, types=("plain_text",))
    return errors


def _image_parts(item: dict[str, Any], at: str) -> list[str]:
    errors = _length(item.get("alt_text"), ALT_TEXT_CHARS, f"{at}/alt_text")
    if "slack_file" not in item:
        errors += _url(item.get("image_url"), IMAGE_URL_CHARS, f"{at}/image_url")
    return errors


def _actions(block: dict[str, Any], at: str) -> list[str]:
    elements = block.get("elements")
    if not isinstance(elements, list) or not elements:
        return [_at("must provide a non-empty array", f"{at}/elements")]
    errors = []
    if len(elements) > ACTIONS_ELEMENTS:
        errors.append(_at(f"no more than {ACTIONS_ELEMENTS} items allowed", f"{at}/elements"))
    for index, element in enumerate(elements):
        errors += _element(element, f"{at}/elements/{index}")
    return errors


def _context(block: dict[str, Any], at: str) -> list[str]:
    elements = block.get("elements")
    if not isinstance(elements, list) or not elements:
        return [_at("must provide a non-empty array", f"{at}/elements")]
    errors = []
    if len(elements) > CONTEXT_ELEMENTS:
        errors.append(_at(f"no more than {CONTEXT_ELEMENTS} items allowed", f"{at}/elements"))
    for index, element in enumerate(elements):
        where = f"{at}/elements/{index}"
        if isinstance(element, dict) and element.get("type") == "image":
            errors += _image_parts(element, where)
        else:  # "text": no documented limit of its own beyond a text object's shape
            errors += _text_object(element, where, None)
    return errors


def _markdown(block: dict[str, Any], at: str) -> list[str]:
    return _length(block.get("text"), MARKDOWN_TEXT_CHARS, f"{at}/text")


def _element(element: Any, at: str) -> list[str]:
    """A block element; only buttons are looked into (the renderers send no other)."""
    if not isinstance(element, dict) or not isinstance(element.get("type"), str):
        return [_at("failed to match all allowed schemas", at)]
    if element["type"] != "button":
        return []
    errors = _text_object(element.get("text"), f"{at}/text", BUTTON_TEXT_CHARS, types=("plain_text",))
    if "url" in element:
        errors += _url(element["url"], BUTTON_URL_CHARS, f"{at}/url")
    errors += _length(element.get("value"), BUTTON_VALUE_CHARS, f"{at}/value", required=False)
    errors += _length(element.get("action_id"), ACTION_ID_CHARS, f"{at}/action_id", required=False)
    if "style" in element and element["style"] not in ("primary", "danger"):
        errors.append(_at("must be a valid enum value", f"{at}/style"))
    return errors


def _text_object(
    value: Any, at: str, limit: int | None, *, types: tuple[str, ...] = ("plain_text", "mrkdwn")
) -> list[str]:
    """A composition text object: ``{"type": "plain_text" | "mrkdwn", "text": ...}``."""
    if not isinstance(value, dict):
        return [_at("must be an object", at)]
    if value.get("type") not in types:
        return [_at("must be a valid enum value", f"{at}/type")]
    # `emoji` belongs to plain_text, `verbatim` to mrkdwn (text-object reference).
    extra = set(value) - {"type", "text", "emoji" if value["type"] == "plain_text" else "verbatim"}
    errors = [_at(f"invalid additional property: {name}", at) for name in sorted(extra)]
    return errors + _length(value.get("text"), limit, f"{at}/text")


def _length(value: Any, limit: int | None, at: str, *, required: bool = True) -> list[str]:
    if value is None and not required:
        return []
    if not isinstance(value, str):
        return [_at("must be a string", at)]
    if not value:
        return [_at("must be more than 0 characters", at)]
    if limit is not None and len(value) > limit:
        return [_at(f"must be less than {limit + 1} characters", at)]
    return []


def _url(value: Any, limit: int, at: str) -> list[str]:
    errors = _length(value, limit, at)
    if not errors and not str(value).startswith(("http://", "https://")):
        errors.append(_at("must be a valid URL", at))
    return errors


def _at(rule: str, pointer: str) -> str:
    return f"{rule} [json-pointer:{pointer}]"


_CHECKS = {
    "section": _section,
    "header": _header,
    "image": _image,
    "actions": _actions,
    "context": _context,
    "markdown": _markdown,
}
