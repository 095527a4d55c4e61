"""Checks of a post's fields before anything is written; failures raise InvalidPost."""

from __future__ import annotations

import json
import math
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder

from django_connector_outbox.conf import conf, seconds
from django_connector_outbox.models import ID_LENGTH
from django_connector_outbox.posts import InvalidPost, Kind


def check_id(post_id: Any, field: str, value: Any, *, required: bool = True, nullable: bool = False) -> None:
    if value is None and nullable:
        return
    if not isinstance(value, str):
        raise InvalidPost(f"post {post_id!r}: {field} must be a string, not {type(value).__name__}")
    if required and not value:
        raise InvalidPost(f"post {post_id!r}: {field} must not be empty")
    if len(value) > ID_LENGTH:
        raise InvalidPost(f"post {post_id!r}: {field} is longer than {ID_LENGTH} characters ({len(value)})")


def check_place(
    post_id: Any, workspace_id: Any, container_id: Any, thread_id: Any, turn_key: Any = None
) -> None:
    check_id(post_id, "post_id", post_id)
    check_id(post_id, "workspace_id", workspace_id)
    check_id(post_id, "container_id", container_id)
    check_id(post_id, "thread_id", thread_id, required=False)
    check_id(post_id, "turn_key", turn_key, required=False, nullable=True)


def check_kind(post_id: str, kind: Any, accepted: frozenset[str]) -> None:
    if kind not in Kind.values:
        raise InvalidPost(f"post {post_id!r}: kind {kind!r} is unknown; use one of {', '.join(Kind.values)}")
    if kind not in accepted:
        raise InvalidPost(f"post {post_id!r}: kind {kind!r} is not supported by this source's connector")


def clean_body(post_id: str, body: Any) -> tuple[dict[str, Any], str]:
    """The body as it will be stored (a JSON round trip) and its JSON text, or InvalidPost."""
    if not isinstance(body, dict):
        raise InvalidPost(f"post {post_id!r}: body must be a JSON object (a dict), not {type(body).__name__}")
    try:
        # allow_nan=False: PostgreSQL's jsonb refuses NaN and Infinity, so refuse them here.
        encoded = json.dumps(
            body, cls=DjangoJSONEncoder, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except (TypeError, ValueError) as e:
        raise InvalidPost(f"post {post_id!r}: body cannot be encoded as JSON: {e}") from e
    size = len(encoded.encode())
    if size > conf.MAX_BODY_BYTES:
        raise InvalidPost(
            f"post {post_id!r}: body is {size} bytes as JSON, over MAX_BODY_BYTES ({conf.MAX_BODY_BYTES})"
        )
    cleaned: dict[str, Any] = json.loads(encoded)
    return cleaned, encoded


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
