"""One message for every platform: `Message` and `Link`, and how a Message is stored.

A Message is what a post says, not how a platform wants it said: each connector renders it
at send time into its platform's native body (Block Kit, an Adaptive Card, Telegram HTML...),
so the same Message queued to Slack, Teams and email reads natively in each. It is stored as
its own JSON under one key, `MESSAGE_KEY`, of the post's body, so the stores, the admin and
`find` keep handling bodies as JSON objects; no platform body uses that key.

Kept free of models and of Django, like posts.py, so that connectors can import it anywhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: The one key of a stored Message's body: ``{"$message": {...the Message's JSON...}}``.
MESSAGE_KEY = "$message"


@dataclass(frozen=True, slots=True)
class Link:
    """A button that opens `url`, labelled `label`."""

    label: str
    url: str


@dataclass(frozen=True, slots=True)
class Message:
    """What a post says, rendered natively by each connector at send time.

    `text` and `context` are Markdown of a small subset: ``**bold**``, ``_italic_``,
    ``~~strike~~``, ``` `code` ```, fenced code blocks, ``[label](url)`` links and line breaks.
    `fields` are (label, value) pairs; `actions` link buttons; `context` a small line under
    the rest.
    """

    text: str
    title: str | None = None
    fields: Sequence[tuple[str, str]] = field(default=())
    actions: Sequence[Link] = field(default=())
    image_url: str | None = None
    context: str | None = None

    def __post_init__(self) -> None:
        # Tuples, so that a Message is hashable and equal to its own JSON round trip.
        object.__setattr__(self, "fields", tuple((str(k), str(v)) for k, v in self.fields))
        object.__setattr__(self, "actions", tuple(self.actions))

    def to_json(self) -> dict[str, Any]:
        """The Message as JSON, without the parts it does not have."""
        data: dict[str, Any] = {"text": self.text}
        if self.title is not None:
            data["title"] = self.title
        if self.fields:
            data["fields"] = [[label, value] for label, value in self.fields]
        if self.actions:
            data["actions"] = [{"label": a.label, "url": a.url} for a in self.actions]
        if self.image_url is not None:
            data["image_url"] = self.image_url
        if self.context is not None:
            data["context"] = self.context
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Message:
        """The Message that `to_json` wrote."""
        return cls(
            text=data["text"],
            title=data.get("title"),
            fields=[(label, value) for label, value in data.get("fields", ())],
            actions=[Link(a["label"], a["url"]) for a in data.get("actions", ())],
            image_url=data.get("image_url"),
            context=data.get("context"),
        )

    def as_body(self) -> dict[str, Any]:
        """The post body that stores this Message."""
        return {MESSAGE_KEY: self.to_json()}


def message_of(body: Mapping[str, Any]) -> Message | None:
    """The Message a stored body holds, or None for a platform's own body."""
    data = body.get(MESSAGE_KEY)
    if data is None or len(body) != 1:
        return None
    return Message.from_json(data)
