"""The code of holes 2 and 3 of issue 18, kept as mutants: the interleaving explorer must
find each again (tests/test_interleavings.py).

Verbatim copies of `store.OrmStore` methods as they were at bef7f4b, before the fixes; a test
patches them into OrmStore (PostgresStore hands `cancel` to its OrmStore) with `mock.patch.object`.

- hole 2 (PostgreSQL, both stores): `cancel` locks the lane with a `SELECT ... FOR UPDATE`
  whose WHERE (`head_id` = the post) no longer matches the committed lane when a sender has
  just finished the head before it, so it neither locks nor waits, cancels a post that is
  about to be (or is) its lane's head, and its `refresh_heads` then computes the lane from a
  snapshot older than the finish: a post reported cancelled is delivered, or the lane keeps a
  head or lease that its posts no longer give.
- hole 3 (MariaDB): `insert` and `lock_places` let three or more producers deadlock in the
  caller's transaction: a duplicate post id (`bulk_create` takes a shared lock on the
  duplicate key, then asks for an exclusive one) or a new container (`INSERT IGNORE` of its
  lane, then `_find_lanes(lock=True)`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from django.db import IntegrityError, transaction
from django.db.models import Q

from django_connector_outbox.models import Lane, Post
from django_connector_outbox.posts import NewPost, State
from django_connector_outbox.store.orm import PLACES_PER_STATEMENT, OrmStore


def insert(self: OrmStore, rows: Sequence[NewPost], now: datetime) -> int:
    unique = {row.post_id: row for row in rows}
    known = self.posts().filter(post_id__in=list(unique))
    conflict: IntegrityError | None = None
    existing: set[str] = set()
    while True:
        found = set(known.values_list("post_id", flat=True))
        if conflict is not None and found <= existing:
            # The insert failed, yet no id of ours appeared meanwhile: the conflict is not
            # a concurrent queue, and trying again would fail the same way for ever.
            raise conflict
        existing = found
        new = [row for post_id, row in unique.items() if post_id not in existing]
        if not new:
            return 0
        lanes = self.lock_places({(row.workspace_id, row.container_id) for row in new})
        try:
            # A savepoint, so that an id inserted meanwhile by another transaction (in
            # another container: this one is locked) leaves the caller's transaction usable.
            with transaction.atomic(using=self.using):
                Post.objects.using(self.using).bulk_create(
                    Post(
                        source=self.source, post_id=row.post_id, lane_id=lanes[(row.workspace_id, row.container_id)],
                        workspace_id=row.workspace_id, container_id=row.container_id, thread_id=row.thread_id,
                        kind=row.kind, body=row.body, turn_key=row.turn_key, queued_at=row.due, next_at=row.due,
                        created_at=now, updated_at=now,
                    )
                    for row in new
                )  # fmt: skip
        except IntegrityError as e:
            conflict = e
            # Read again with a locking read, which sees the id committed meanwhile: under
            # MySQL's REPEATABLE READ a plain read returns the same snapshot every time.
            known = known.select_for_update()
            continue
        self.refresh_heads(set(lanes.values()))
        self.notify()
        return len(new)


def cancel(self: OrmStore, now: datetime, post_id: str) -> bool:
    """A queued post becomes cancelled and loses its body (Outbox.cancel_queued)."""
    found = self.posts().filter(post_id=post_id, state=State.QUEUED).values("pk", "lane_id").first()
    if found is None:
        return False
    # Not while a sender holds it: its lane's lease is on it (the lane, locked, tells).
    leased = self.lanes().select_for_update().filter(pk=found["lane_id"], head_id=found["pk"])
    if leased.exclude(lease_token="").exists():
        return False
    cancelled = (
        self.posts()
        .filter(pk=found["pk"], state=State.QUEUED)
        .update(state=State.CANCELLED, body=None, updated_at=now)
    )
    if cancelled:
        self.refresh_heads([found["lane_id"]])
    return bool(cancelled)


def lock_places(self: OrmStore, places: set[tuple[str, str]]) -> dict[tuple[str, str], int]:
    """Lock the lanes of these (workspace, container) places, creating missing ones; their ids.

    Lanes are locked in pk order (the deadlock-free order of every lane lock). A few
    places are looked up and locked in one statement; more are looked up in chunks (one
    OR of them all is too deep for SQLite's expression tree), then locked by pk.
    """
    at_once = len(places) <= PLACES_PER_STATEMENT
    lanes = self._find_lanes(places, lock=at_once)
    if len(lanes) < len(places):
        self.lanes().bulk_create(
            [Lane(source=self.source, workspace_id=w, container_id=c) for w, c in places - set(lanes)],
            ignore_conflicts=True,
        )
        lanes = self._find_lanes(places, lock=at_once)
    if not at_once:
        self.lock_lanes(lanes.values())
    return lanes


def _find_lanes(self: OrmStore, places: set[tuple[str, str]], *, lock: bool) -> dict[tuple[str, str], int]:
    """The ids of the existing lanes of these places (locked, in pk order, if `lock`)."""
    ordered = sorted(places)
    lanes: dict[tuple[str, str], int] = {}
    for start in range(0, len(ordered), PLACES_PER_STATEMENT):
        # One flat OR: `|=` in a loop copies the growing tree each time (quadratic).
        chunk = ordered[start : start + PLACES_PER_STATEMENT]
        match = Q(*(Q(workspace_id=w, container_id=c) for w, c in chunk), _connector=Q.OR)
        found = self.lanes().filter(match, source=self.source)
        if lock:
            found = found.select_for_update().order_by("pk")
        lanes.update({(w, c): pk for pk, w, c in found.values_list("pk", "workspace_id", "container_id")})
    return lanes


# hole: the OrmStore methods replaced by each.
HOLE_2 = {"cancel": cancel}
HOLE_3 = {"insert": insert, "lock_places": lock_places, "_find_lanes": _find_lanes}
