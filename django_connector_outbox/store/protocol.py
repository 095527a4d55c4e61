"""The store interface, and what every store returns the same way.

A store is one source's rows on one database; the Outbox decides what a call means and a store
writes it (see the package). Nothing here imports a store: both import this.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple, Protocol

from django_connector_outbox.posts import ClaimedPost, Finish, NewPost, Parent, Scope


class LaneRepair(NamedTuple):
    """A lane that did not match its posts, what it said and what it says now (ids of posts)."""

    source: str
    lane: int
    workspace_id: str
    container_id: str
    old_head: int | None
    old_due: datetime | None
    new_head: int | None
    new_due: datetime | None


class Store(Protocol):
    """The hot paths of one source's rows on one database; each runs in the caller's transaction."""

    def insert(self, rows: Sequence[NewPost], now: datetime) -> int:
        """Insert the posts whose ids are new (ids unique within `rows`); how many were new."""

    def claim(
        self, limit: int, now: datetime, lease_until: datetime, token: str, worker: str
    ) -> list[ClaimedPost]:
        """Lease up to `limit` due heads, oldest due first (limit > 0)."""

    def finish(self, finishes: Sequence[Finish], now: datetime) -> list[bool]:
        """Apply resolved finishes (Outbox.resolve) whose claims are current; which were."""

    def finish_and_claim(
        self,
        finishes: Sequence[Finish],
        clock: Callable[[], datetime],
        limit: int,
        lease: timedelta,
        token: str,
        worker: str,
    ) -> tuple[list[bool], list[ClaimedPost]]:
        """`finish` at `clock()`, then `claim` up to `limit` heads (none at 0) leased for `lease`
        from when the claim is made: a sender's turn.

        A lane finished here is locked by the caller's transaction, so its next head may be
        claimed in the same call. No finish may hold a place (Finish.holds_place): its gate is
        written after `finish`, and a claim must see it (Outbox.finish_and_claim)."""

    def notify(self) -> None:
        """Wake idle senders of this source when the caller's transaction commits."""

    def hold_places(self, holds: Sequence[tuple[Scope, str, str, datetime, str]], now: datetime) -> None:
        """Hold (scope, workspace, container) places until the given instants, with reasons."""

    def next_due(self, now: datetime) -> datetime | None:
        """When the earliest head may be claimable (Outbox.next_due)."""

    def replace_status(self, now: datetime, pk: int, lane_id: int, body: dict[str, Any]) -> bool:
        """False if the post is gone (pruned since it was read)."""

    # The rare writes: one implementation (the ORM store's) serves every store.

    def renew(self, now: datetime, tokens: Sequence[str], until: datetime) -> set[str]: ...

    def requeue(self, now: datetime, post_id: str) -> bool: ...

    def cancel(self, now: datetime, post_id: str) -> bool: ...

    def retract(self, now: datetime, post_id: str) -> bool: ...

    def prune(
        self, cutoff: datetime, attention_cutoff: datetime, status_cutoff: datetime | None, limit: int
    ) -> int: ...

    def prunable(
        self, cutoff: datetime, attention_cutoff: datetime, status_cutoff: datetime | None
    ) -> Any: ...

    def prune_lanes(self, cutoff: datetime, after: int, limit: int) -> tuple[int | None, int]: ...

    def prunable_lanes(
        self, cutoff: datetime, attention_cutoff: datetime, status_cutoff: datetime | None
    ) -> Any: ...

    def prune_gates(self, cutoff: datetime) -> int: ...

    def prune_history(self, cutoff: datetime, limit: int) -> int: ...

    def repair(self, after: int, limit: int) -> tuple[int | None, list[LaneRepair]]: ...


def claimed_post(
    source: str, row: dict[str, Any], *, stale: bool, sent_at: datetime, lease_until: datetime, token: str
) -> ClaimedPost:
    """The claim of a head read as `row` (its attempts already counting this claim; a reply's
    parent as `parent_state`, `parent_ref` and `parent_thread`, None where it is gone)."""
    parent = None
    if row["thread_of"] is not None:
        parent = Parent(
            row["thread_of"], row["parent_state"] or "", row["parent_ref"], row["parent_thread"] or ""
        )
    return ClaimedPost(
        source=source, post_id=row["post_id"], workspace_id=row["workspace_id"],
        container_id=row["container_id"], thread_id=row["thread_id"], kind=row["kind"],
        body=row["body"] or {}, rev=row["rev"], attempts=row["attempts"], message_ref=row["message_ref"],
        turn_key=row["turn_key"], stale=stale, sent_at=sent_at, lease_until=lease_until, lease_token=token,
        parent=parent,
    )  # fmt: skip
