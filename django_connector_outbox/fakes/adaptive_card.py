"""Adaptive Cards as Teams takes them: the fake Teams refuses a card the schema refuses.

The rules are those of the Adaptive Card schema (microsoft/AdaptiveCards schemas/1.5.0/
adaptive-card.json): a card is ``{"type": "AdaptiveCard", "version": "1.x", "body": [...],
"actions": [...]}``; each element and action has a known `type` and its required properties
(TextBlock `text`, Image `url`, FactSet `facts` of Fact `title` + `value`, ActionSet `actions`,
Action.OpenUrl `url`), and enums take their documented values. Teams shows cards up to 1.5 to
bots' messages (msteams-docs task-modules-and-cards/cards/cards-reference.md). Elements this
module does not look into (Input.*, Table, RichTextBlock...) are accepted by type.
"""

from __future__ import annotations

from typing import Any

CONTENT_TYPE = "application/vnd.microsoft.card.adaptive"
#: The versions Teams renders for bots (cards-reference.md: "Teams supports ... 1.5 and earlier").
VERSIONS = frozenset({"1.0", "1.1", "1.2", "1.3", "1.4", "1.5"})

ELEMENTS = frozenset(
    {
        "TextBlock",
        "Image",
        "Media",
        "RichTextBlock",
        "Container",
        "ColumnSet",
        "FactSet",
        "ImageSet",
        "ActionSet",
        "Table",
        "Input.Text",
        "Input.Number",
        "Input.Date",
        "Input.Time",
        "Input.Toggle",
        "Input.ChoiceSet",
    }
)
ACTIONS = frozenset(
    {"Action.OpenUrl", "Action.Submit", "Action.ShowCard", "Action.ToggleVisibility", "Action.Execute"}
)
# The schema's enums for the TextBlock properties the renderers use (values compared as the
# schema does, ignoring case).
TEXT_ENUMS = {
    "spacing": {"default", "none", "small", "medium", "large", "extralarge", "padding"},
    "fontType": {"default", "monospace"},
    "size": {"default", "small", "medium", "large", "extralarge"},
    "weight": {"default", "lighter", "bolder"},
    "color": {"default", "dark", "light", "accent", "good", "warning", "attention"},
}


def card_errors(card: Any) -> list[str]:
    """What the schema refuses in `card` (an attachment's content), each as "path: rule"."""
    if not isinstance(card, dict) or card.get("type") != "AdaptiveCard":
        return ["type: must be 'AdaptiveCard'"]
    errors = []
    if card.get("version") not in VERSIONS:
        errors.append(f"version: {card.get('version')!r} is not a version Teams renders (1.0-1.5)")
    errors += _elements(card.get("body", []), "body")
    errors += _actions(card.get("actions", []), "actions")
    return errors


def attachment_errors(attachments: Any) -> list[str]:
    """What is wrong with an activity's `attachments`, looking into its Adaptive Cards."""
    if not isinstance(attachments, list):
        return ["attachments: must be an array"]
    errors = []
    for index, attachment in enumerate(attachments):
        if not isinstance(attachment, dict) or not isinstance(attachment.get("contentType"), str):
            errors.append(f"attachments[{index}].contentType: required")
        elif attachment["contentType"] == CONTENT_TYPE:
            errors += [f"attachments[{index}].content.{e}" for e in card_errors(attachment.get("content"))]
    return errors


def _elements(elements: Any, at: str) -> list[str]:
    if not isinstance(elements, list):
        return [f"{at}: must be an array"]
    errors = []
    for index, element in enumerate(elements):
        where = f"{at}[{index}]"
        kind = element.get("type") if isinstance(element, dict) else None
        if kind not in ELEMENTS:
            errors.append(f"{where}.type: unknown element type {kind!r}")
            continue
        errors += _ELEMENT_CHECKS.get(kind, _nothing)(element, where)
    return errors


def _actions(actions: Any, at: str) -> list[str]:
    if not isinstance(actions, list):
        return [f"{at}: must be an array"]
    errors = []
    for index, action in enumerate(actions):
        where = f"{at}[{index}]"
        kind = action.get("type") if isinstance(action, dict) else None
        if kind not in ACTIONS:
            errors.append(f"{where}.type: unknown action type {kind!r}")
        elif kind == "Action.OpenUrl":
            errors += _string(action, "url", where) + _string(action, "title", where, required=False)
    return errors


def _text_block(element: dict[str, Any], at: str) -> list[str]:
    errors = _string(element, "text", at)
    for name, allowed in TEXT_ENUMS.items():
        value = element.get(name)
        if value is not None and str(value).lower() not in allowed:
            errors.append(f"{at}.{name}: {value!r} is not one of {sorted(allowed)}")
    for name in ("wrap", "isSubtle"):
        if name in element and not isinstance(element[name], bool):
            errors.append(f"{at}.{name}: must be a boolean")
    return errors


def _fact_set(element: dict[str, Any], at: str) -> list[str]:
    facts = element.get("facts")
    if not isinstance(facts, list):
        return [f"{at}.facts: required array"]
    errors = []
    for index, fact in enumerate(facts):
        where = f"{at}.facts[{index}]"
        if not isinstance(fact, dict):
            errors.append(f"{where}: must be a Fact")
            continue
        errors += _string(fact, "title", where) + _string(fact, "value", where)
    return errors


def _image(element: dict[str, Any], at: str) -> list[str]:
    return _string(element, "url", at) + _string(element, "altText", at, required=False)


def _action_set(element: dict[str, Any], at: str) -> list[str]:
    if "actions" not in element:
        return [f"{at}.actions: required array"]
    return _actions(element["actions"], f"{at}.actions")


def _container(element: dict[str, Any], at: str) -> list[str]:
    return _elements(element.get("items", []), f"{at}.items")


def _nothing(element: dict[str, Any], at: str) -> list[str]:
    return []


def _string(item: dict[str, Any], name: str, at: str, *, required: bool = True) -> list[str]:
    if name not in item:
        return [f"{at}.{name}: required"] if required else []
    if not isinstance(item[name], str):
        return [f"{at}.{name}: must be a string"]
    return []


_ELEMENT_CHECKS = {
    "TextBlock": _text_block,
    "FactSet": _fact_set,
    "Image": _image,
    "ActionSet": _action_set,
    "Container": _container,
}
