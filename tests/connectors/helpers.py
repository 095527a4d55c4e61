"""What the connector tests share."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django_connector_outbox.posts import ClaimedPost

LEASE = timedelta(seconds=120)


def claimed_post(
    source: str,
    post_id: str,
    body: dict[str, Any],
    *,
    kind: str = "message",
    workspace_id: str = "",
    container_id: str = "",
    thread_id: str = "",
    rev: int = 0,
    message_ref: str | None = None,
    stale: bool = False,
    sent_at: datetime | None = None,
    lease_until: datetime | None = None,
) -> ClaimedPost:
    """A post as a sender holds it on its first attempt: `sent_at` now unless given, leased
    for `LEASE` from now unless `lease_until` is given."""
    now = datetime.now(UTC)
    return ClaimedPost(
        source=source,
        post_id=post_id,
        workspace_id=workspace_id,
        container_id=container_id,
        thread_id=thread_id,
        kind=kind,
        body=body,
        rev=rev,
        attempts=1,
        message_ref=message_ref,
        turn_key=None,
        stale=stale,
        sent_at=sent_at or now,
        lease_until=lease_until or now + LEASE,
    )
