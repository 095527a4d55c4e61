"""Checks of a post's fields before anything is written; failures raise InvalidPost.

What passes is stored alike on PostgreSQL, MySQL/MariaDB and SQLite: no NUL (PostgreSQL
refuses it in text and jsonb, the others store it), no lone surrogate (not UTF-8, so no
database stores it), and bodies nested no deeper than MariaDB's JSON accepts.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

from django_connector_outbox.conf import seconds
from django_connector_outbox.message import MESSAGE_KEY, Link, Message
from django_connector_outbox.models import ID_LENGTH
from django_connector_outbox.posts import InvalidPost, Kind, NewPost, State
from django_connector_outbox.wording import plain, type_of

# MariaDB's JSON_VALID (the CHECK of a JSONField there) refuses a 32nd nested object or array.
MAX_BODY_DEPTH = 31


def check_id(post_id: Any, field: str, value: Any, *, required: bool = True, nullable: bool = False) -> None:
    if value is None and nullable:
        return
    if flaw := id_flaw(value, required=required):
        raise InvalidPost(f"post {post_id!r}: {field} {flaw}")


def id_flaw(value: Any, *, required: bool = True) -> str | None:
    """What makes `value` no id (not a string, empty, too long, unstorable), or None."""
    if not isinstance(value, str):
        return f"must be a string, not {type_of(value)}"
    if required and not value:
        return "must not be empty"
    if len(value) > ID_LENGTH:
        return f"is longer than {ID_LENGTH} characters ({len(value)})"
    return text_flaw(value)


def text_flaw(value: str) -> str | None:
    """What makes `value` unstorable alike on every database (NUL, a lone surrogate), or None."""
    if "\x00" in value:
        return "contains a NUL character (\\x00), which PostgreSQL cannot store"
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError as e:
            return f"contains a lone surrogate ({value[e.start]!r}), which is not UTF-8"
    return None


def check_place(
    post_id: Any,
    workspace_id: Any,
    container_id: Any,
    thread_id: Any,
    turn_key: Any = None,
    *,
    workspace_required: bool = True,
) -> None:
    check_id(post_id, "post_id", post_id)
    check_id(post_id, "workspace_id", workspace_id, required=workspace_required)
    check_id(post_id, "container_id", container_id)
    check_id(post_id, "thread_id", thread_id, required=False)
    check_id(post_id, "turn_key", turn_key, required=False, nullable=True)


# Kinds that have no thread to reply into: no message of their own, or none that can be named
# (a retract's delete takes a message away).
THREADLESS = frozenset({Kind.REACTION, Kind.EPHEMERAL, Kind.DELETE})


def check_reply(post_id: str, thread_of: Any, thread_id: str, kind: Any) -> None:
    """A reply's own fields: `thread_of` an id, not its own, without a `thread_id` (the thread
    is its parent's, known only once the parent is sent), and not a reaction."""
    check_id(post_id, "thread_of", thread_of)
    if thread_of == post_id:
        raise InvalidPost(f"post {post_id!r}: thread_of names the post itself")
    if thread_id:
        raise InvalidPost(
            f"post {post_id!r}: thread_of and thread_id {thread_id!r} both given; "
            "a reply's thread is its parent's"
        )
    if kind == Kind.REACTION:
        raise InvalidPost(f"post {post_id!r}: thread_of is given for a reaction, which goes on a message")


def check_parent(post: NewPost, parent: tuple[str, str, str, str, str, datetime] | None) -> None:
    """A reply's parent, (post_id, workspace_id, container_id, kind, state, queued_at) or None
    where there is none: an earlier post of its container, no later in its queue."""
    where = f"post {post.post_id!r}: thread_of {post.thread_of!r}"
    if parent is None:
        raise InvalidPost(f"{where} names no post of this source queued before it")
    _, workspace_id, container_id, kind, state, queued_at = parent
    if (workspace_id, container_id) != (post.workspace_id, post.container_id):
        raise InvalidPost(f"{where} is a post of another container ({workspace_id}/{container_id})")
    if kind in THREADLESS:
        raise InvalidPost(f"{where} is a {kind}, which has no thread")
    if state == State.QUEUED and queued_at > post.due:
        raise InvalidPost(
            f"{where} is due after it ({queued_at.isoformat()}); a reply must come after its parent "
            "in the container's queue"
        )


# Kind.values builds a new list on each access: once per post of a batch of thousands. A
# caller queues every kind but "delete", which only Outbox.retract queues.
QUEUED_KINDS = tuple(k for k in Kind.values if k != Kind.DELETE)
KINDS = frozenset(QUEUED_KINDS)


def check_kind(post_id: str, kind: Any, accepted: frozenset[str]) -> None:
    if kind == Kind.DELETE:
        raise InvalidPost(f"post {post_id!r}: a delete is never queued; retract the post instead")
    if not isinstance(kind, str) or kind not in KINDS:  # a list is unhashable: no set lookup
        raise InvalidPost(
            f"post {post_id!r}: kind {plain(kind)} is unknown; use one of {', '.join(QUEUED_KINDS)}"
        )
    if kind not in accepted:
        raise InvalidPost(
            f"post {post_id!r}: kind {plain(kind)} is not supported by this source's connector "
            f"(it takes {', '.join(k for k in Kind.values if k in accepted)})"
        )


# One encoder for every body (`encode` keeps no state between calls). allow_nan=False:
# PostgreSQL's jsonb refuses NaN and Infinity, so refuse them here.
BODY_ENCODER = DjangoJSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def clean_body(post_id: str, body: Any, max_bytes: int) -> str:
    """The body's compact JSON text as it will be stored, or InvalidPost (over `max_bytes`,
    MAX_BODY_BYTES, among others)."""
    if not isinstance(body, dict):
        raise InvalidPost(f"post {post_id!r}: body must be a JSON object (a dict), not {type_of(body)}")
    try:
        encoded: str = BODY_ENCODER.encode(body)
    except RecursionError as e:
        raise InvalidPost(f"post {post_id!r}: body is nested too deeply to encode as JSON") from e
    except (TypeError, ValueError) as e:
        raise InvalidPost(f"post {post_id!r}: body cannot be encoded as JSON: {e}") from e
    if encoded.isascii():  # the common case: its length is its size, and it holds no surrogate
        size = len(encoded)
    else:
        try:
            size = len(encoded.encode())
        except UnicodeEncodeError:
            size = -1  # a lone surrogate, which the walk below names
    # Cheap tests first (C speed), so that most bodies are never walked: json.dumps writes a
    # NUL as \u0000, and a body with few brackets cannot be nested deeply.
    if size < 0 or "\\u0000" in encoded or encoded.count("{") + encoded.count("[") > MAX_BODY_DEPTH:
        flaw = _body_flaw(json.loads(encoded))
        if flaw:
            raise InvalidPost(f"post {post_id!r}: {flaw}")
    if size > max_bytes:
        raise InvalidPost(
            f"post {post_id!r}: body is {size} bytes as JSON, over MAX_BODY_BYTES ({max_bytes})"
        )
    return encoded


def _body_flaw(body: dict[str, Any]) -> str | None:
    """Where and why a body (a JSON round trip) cannot be stored alike everywhere, or None."""
    stack: list[tuple[Any, str, int]] = [(body, "body", 1)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, (dict, list)) and depth > MAX_BODY_DEPTH:
            return f"{path} is nested deeper than {MAX_BODY_DEPTH} objects and arrays (MariaDB's JSON limit)"
        if isinstance(value, dict):
            for key, item in value.items():
                flaw = text_flaw(key)
                if flaw:
                    return f"the key {key!r} of {path} {flaw}"
                stack.append((item, f"{path}[{key!r}]", depth + 1))
        elif isinstance(value, list):
            stack.extend((item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value))
        elif isinstance(value, str):
            flaw = text_flaw(value)
            if flaw:
                return f"{path} {flaw}"
    return None


#: What a Message's image and buttons may open: every platform takes web links; Discord and
#: Telegram refuse a button to anything else (mailto:, a relative path).
WEB_SCHEMES = ("http://", "https://")


def message_in(post_id: str, body: Any) -> Message | None:
    """The Message a post's `body` is: a Message, a stored Message's body (``{"$message":
    ...}``, read back), or None for a platform's own body. InvalidPost for a body that uses
    the Message's key otherwise, which would be taken for a Message at send time."""
    if isinstance(body, Message):
        return body
    if not isinstance(body, dict) or MESSAGE_KEY not in body:
        return None
    if len(body) != 1:
        raise InvalidPost(
            f"post {post_id!r}: body key {MESSAGE_KEY!r} holds a Message and must be the only key"
        )
    try:
        return Message.from_json(body[MESSAGE_KEY])
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise InvalidPost(f"post {post_id!r}: body[{MESSAGE_KEY!r}] is not a Message's JSON ({e!r})") from e


#: The kinds whose body says something: a reaction's names an emoji and a message.
MESSAGE_KINDS = frozenset({Kind.MESSAGE, Kind.STATUS, Kind.EPHEMERAL})


def check_message(post_id: str, kind: str, message: Message) -> None:
    """InvalidPost, naming the field, for a Message no platform could show: as a reaction,
    parts of the wrong type, empty labels, links that are not web links, or nothing to show."""
    if kind not in MESSAGE_KINDS:
        raise InvalidPost(f"post {post_id!r}: a {kind} cannot be a Message; give its platform body")
    where = f"post {post_id!r}: Message"
    if not isinstance(message.text, str):
        raise InvalidPost(f"{where} text must be a string, not {type_of(message.text)}")
    for name in ("title", "image_url", "context"):
        value = getattr(message, name)
        if value is not None and (not isinstance(value, str) or not value):
            raise InvalidPost(f"{where} {name} must be a non-empty string or None, not {plain(value)}")
    for number, (label, _) in enumerate(message.fields):
        if not label:
            raise InvalidPost(f"{where} fields[{number}] has an empty label")
    for number, link in enumerate(message.actions):
        if not isinstance(link, Link):
            raise InvalidPost(f"{where} actions[{number}] must be a Link, not {type_of(link)}")
        if not isinstance(link.label, str) or not link.label:
            raise InvalidPost(
                f"{where} actions[{number}] label must be a non-empty string, not {plain(link.label)}"
            )
        if not _web_link(link.url):
            raise InvalidPost(f"{where} actions[{number}] url must be an http(s) URL, not {plain(link.url)}")
    if message.image_url is not None and not _web_link(message.image_url):
        raise InvalidPost(f"{where} image_url must be an http(s) URL, not {plain(message.image_url)}")
    if not (message.text.strip() or message.title or message.fields or message.image_url):
        raise InvalidPost(f"{where} has nothing to show: no text, title, fields or image")


def _web_link(url: Any) -> bool:
    if not isinstance(url, str):
        return False
    lowered = url.lower()
    return any(lowered.startswith(scheme) and len(url) > len(scheme) for scheme in WEB_SCHEMES)


def clean_delay(post_id: str, delay: Any) -> float:
    if delay is None:
        return 0.0
    try:
        value = seconds(delay)
    except TypeError as e:
        raise InvalidPost(f"post {post_id!r}: delay {e}") from e
    if not math.isfinite(value):  # NaN and infinity would fail later, as a bare ValueError
        raise InvalidPost(f"post {post_id!r}: delay must be a finite duration, not {delay!r}")
    if value < 0:
        raise InvalidPost(f"post {post_id!r}: delay must not be negative ({delay!r})")
    return value
