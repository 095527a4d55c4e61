"""The Outbox: queue posts in the caller's transaction; claim, and record what happened.

Locking order, everywhere: a lane row first, then posts of that lane. Every write that can
change which post is a container's head (queue, set_status, cancel, every finish) locks the
lane; claimers lock lanes with SKIP LOCKED. Together that gives one head per container in
flight and no deadlock between producers, claimers and finishers.

Fencing: a claim carries a lease token. A finish reads the post under its lane's lock and
changes it only while it is still `sending` under that token; a sender whose lease was taken
back finds a different token (or state) and changes nothing.

What a write changes is decided by a locking read or by a condition of the write itself;
plain reads only find which lane to lock (a post's lane never changes). Under MySQL's
REPEATABLE READ a plain read returns the transaction's snapshot, which may be older than the
lane lock it then waited for; locking reads and UPDATEs see the latest committed rows.
"""

from __future__ import annotations

import random
import socket
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, connections, transaction
from django.db.models import Exists, F, OuterRef, Q, Subquery
from django.utils import timezone

from django_connector_outbox import postgres
from django_connector_outbox.answers import reason_text, storable
from django_connector_outbox.conf import conf, seconds
from django_connector_outbox.connectors import connectors
from django_connector_outbox.models import Lane, Post
from django_connector_outbox.posts import (
    FINISHED_STATES,
    RETRYABLE_STATES,
    ClaimedPost,
    Finish,
    InvalidPost,
    Kind,
    NewPost,
    PostState,
    State,
)
from django_connector_outbox.validation import check_kind, check_place, clean_body, clean_delay
from django_connector_outbox.wakeup import NOTIFY_CHANNEL

Clock = Callable[[], datetime]

# Posts deleted per statement when pruning, so that no delete holds locks for long.
PRUNE_BATCH = 1000

# The fields a claim reads from a head.
CLAIM_FIELDS = (
    "pk", "lane_id", "post_id", "workspace_id", "container_id", "thread_id", "kind", "body", "rev",
    "state", "attempts", "next_at", "lease_until", "sent_at", "message_ref", "turn_key",
)  # fmt: skip


def default_worker() -> str:
    import os

    return f"{socket.gethostname()}:{os.getpid()}"


class Outbox:
    """One source's outbox on one database."""

    def __init__(self, source: str, *, using: str = "default", clock: Clock | None = None) -> None:
        if source not in conf.CONNECTORS:
            raise ImproperlyConfigured(
                f"Unknown connector outbox source {source!r}; "
                f"configured: {', '.join(sorted(conf.CONNECTORS)) or 'none'}."
            )
        self.source = source
        self.using = using
        self.clock: Clock = clock or timezone.now

    def __repr__(self) -> str:
        return f"<Outbox {self.source!r} using={self.using!r}>"

    # -- producers ------------------------------------------------------------------------

    def queue(
        self,
        post_id: str,
        *,
        workspace_id: str,
        container_id: str,
        thread_id: str = "",
        kind: str = "message",
        body: dict[str, Any],
        turn_key: str | None = None,
        delay: float | timedelta | None = None,
    ) -> bool:
        """Queue a post unless its id exists already (in any state); True when queued."""
        return self.queue_many(
            [
                dict(
                    post_id=post_id, workspace_id=workspace_id, container_id=container_id,
                    thread_id=thread_id, kind=kind, body=body, turn_key=turn_key, delay=delay,
                )
            ]
        ) == 1  # fmt: skip

    def queue_many(self, posts: Iterable[Mapping[str, Any]]) -> int:
        """`queue(**p)` for each p, all validated before anything is written; how many were queued."""
        now = self.clock()
        rows = [self._new_post(now, p) for p in posts]
        if not rows:
            return 0
        with transaction.atomic(using=self.using, savepoint=False):
            return self._insert(now, rows)

    def set_status(
        self, post_id: str, *, workspace_id: str, container_id: str, thread_id: str = "", body: dict[str, Any]
    ) -> None:
        """Create or replace a status post; only its latest body is ever sent."""
        now = self.clock()
        new = self._new_post(
            now,
            dict(post_id=post_id, workspace_id=workspace_id, container_id=container_id,
                 thread_id=thread_id, kind=Kind.STATUS, body=body),
            status=True,
        )  # fmt: skip
        known = self._posts().filter(post_id=post_id)
        with transaction.atomic(using=self.using, savepoint=False):
            while True:
                existing = known.values("pk", "lane_id").first()
                if existing is None:
                    if self._insert(now, [new]):
                        return
                    # Created concurrently by another transaction: update it instead, found by a
                    # locking read (under REPEATABLE READ a plain one repeats the snapshot).
                    known = known.select_for_update()
                    continue
                self._lock_lanes([existing["lane_id"]])
                # A locking read: the latest row, not a snapshot from before the lane was ours.
                row = self._posts().filter(pk=existing["pk"]).select_for_update().get()
                self._replace_status(now, row, new)
                return

    def _replace_status(self, now: datetime, row: Post, new: NewPost) -> None:
        if row.kind != Kind.STATUS:
            raise InvalidPost(f"post {row.post_id!r}: kind is {row.kind!r}, not a status; it cannot be set")
        for field in ("workspace_id", "container_id", "thread_id"):
            if getattr(row, field) != getattr(new, field):
                raise InvalidPost(
                    f"post {row.post_id!r}: {field} is {getattr(row, field)!r}; a status cannot move"
                )
        if row.state == State.UNCERTAIN or row.body == new.body:
            return
        changes: dict[str, Any] = {"body": new.body, "rev": row.rev + 1}
        if row.state in FINISHED_STATES:
            self._rejoin(now, row.lane_id, self._posts().filter(pk=row.pk), **changes)
            return
        if row.state == State.QUEUED:
            changes["attempts"] = 0
        self._posts().filter(pk=row.pk).update(updated_at=now, **changes)

    def requeue(self, post_id: str) -> bool:
        """Send a `failed` or `uncertain` post back to its container's queue (for operators).

        It joins the back of the queue, due now, with attempts 0; its `last_error`,
        `message_ref` and `rev` are kept (a status with a ref is edited, not re-created).
        False, changing nothing, in any other state (a `sending` post is never touched) or
        when it has no body left. An uncertain post may be in the source already: asking
        whether to risk a duplicate is the caller's job (the admin asks).
        """
        movable = self._posts().filter(post_id=post_id, state__in=RETRYABLE_STATES, body__isnull=False)
        with transaction.atomic(using=self.using, savepoint=False):
            found = movable.values("lane_id").first()
            if found is None:
                return False
            self._lock_lanes([found["lane_id"]])
            # Conditional on the state again: it may have changed while we waited for the lane.
            return self._rejoin(self.clock(), found["lane_id"], movable)

    def _rejoin(self, now: datetime, lane_id: int, post: Any, **changes: Any) -> bool:
        """Put a finished post (`post`: a queryset of it) back at the back of its locked lane."""
        moved = post.update(
            state=State.QUEUED, attempts=0, queued_at=now, next_at=now, updated_at=now, lease_until=None,
            sent_at=None, **changes,
        )  # fmt: skip
        if moved:
            self._refresh_heads([lane_id])
            self._notify()
        return bool(moved)

    def has_reply_for_turn(self, turn_key: str, *, prefix: str = "reply:") -> bool:
        found: bool = self._posts().filter(turn_key=turn_key, post_id__startswith=prefix).exists()
        return found

    def cancel_queued(self, post_id: str) -> bool:
        """Cancel a post that is still queued (and drop its body); False in any other state."""
        with transaction.atomic(using=self.using, savepoint=False):
            found = self._posts().filter(post_id=post_id, state=State.QUEUED).values("pk", "lane_id").first()
            if found is None:
                return False
            self._lock_lanes([found["lane_id"]])
            cancelled = (
                self._posts()
                .filter(pk=found["pk"], state=State.QUEUED)
                .update(state=State.CANCELLED, body=None, updated_at=self.clock())
            )
            if cancelled:
                self._refresh_heads([found["lane_id"]])
            return bool(cancelled)

    def find(self, post_id: str) -> PostState | None:
        row = self._posts().filter(post_id=post_id).values("state", "message_ref").first()
        return PostState(row["state"], row["message_ref"]) if row else None

    # -- senders --------------------------------------------------------------------------

    def claim(self, limit: int | None = None, *, worker: str | None = None) -> list[ClaimedPost]:
        """Lease up to `limit` due heads: queued ones that are due, and sending ones whose lease ended."""
        limit = conf.CLAIM_BATCH if limit is None else limit
        if limit <= 0:  # "up to 0" is none (a sender with no free slot), not the default batch
            return []
        now = self.clock()
        lease_until = now + timedelta(seconds=conf.LEASE)
        token = uuid.uuid4().hex
        worker = worker or default_worker()
        if connections[self.using].vendor == "postgresql":
            with transaction.atomic(using=self.using, savepoint=False), postgres.cursor(self.using) as cursor:
                rows = postgres.claim(cursor, self.source, limit, now, lease_until, token, worker)
            return [
                self._claimed(row, row["stale"], row["sent_at"], lease_until, token, counted=True)
                for row in rows
            ]
        with transaction.atomic(using=self.using, savepoint=False):
            # The lane index gives the due heads directly, however deep the queues behind
            # them are; SKIP LOCKED lets concurrent claimers take different lanes.
            lanes = self._lanes().filter(source=self.source, due_at__lte=now).order_by("due_at")
            if connections[self.using].features.has_select_for_update_skip_locked:
                lanes = lanes.select_for_update(skip_locked=True)
            head_ids = [head for head in lanes.values_list("head_id", flat=True)[:limit] if head]
            # A locking read: under MySQL's REPEATABLE READ a plain one returns the transaction's
            # snapshot, where a head claimed since may still look queued (and be claimed fresh).
            heads = self._posts().filter(pk__in=head_ids).select_for_update().values(*CLAIM_FIELDS)
            heads = {row["pk"]: row for row in heads}
            fresh, stale = [], []
            for pk in head_ids:
                row = heads.get(pk)
                if row is None:
                    continue
                if row["state"] == State.QUEUED and row["next_at"] <= now:
                    fresh.append(row)
                elif row["state"] == State.SENDING and row["lease_until"] <= now:
                    stale.append(row)
            if not fresh and not stale:
                return []
            claimed = dict(
                state=State.SENDING, attempts=F("attempts") + 1, worker=worker, lease_token=token,
                lease_until=lease_until, updated_at=now,
            )  # fmt: skip
            if fresh:
                self._posts().filter(pk__in=[r["pk"] for r in fresh]).update(sent_at=now, **claimed)
            if stale:
                self._posts().filter(pk__in=[r["pk"] for r in stale]).update(**claimed)
            self._lanes().filter(pk__in=[r["lane_id"] for r in fresh + stale]).update(due_at=lease_until)
        claims = [
            (r["next_at"], r["post_id"], self._claimed(r, False, now, lease_until, token)) for r in fresh
        ]
        claims += [
            (r["lease_until"], r["post_id"], self._claimed(r, True, r["sent_at"] or now, lease_until, token))
            for r in stale
        ]
        return [claim for *_, claim in sorted(claims, key=lambda item: item[:2])]

    def _claimed(
        self,
        row: dict[str, Any],
        stale: bool,
        sent_at: datetime,
        lease_until: datetime,
        token: str,
        *,
        counted: bool = False,
    ) -> ClaimedPost:
        return ClaimedPost(
            source=self.source, post_id=row["post_id"], workspace_id=row["workspace_id"],
            container_id=row["container_id"], thread_id=row["thread_id"], kind=row["kind"],
            body=row["body"] or {}, rev=row["rev"], attempts=row["attempts"] + (0 if counted else 1),
            message_ref=row["message_ref"], turn_key=row["turn_key"], stale=stale, sent_at=sent_at,
            lease_until=lease_until, lease_token=token,
        )  # fmt: skip

    def posted(self, claim: ClaimedPost, message_ref: str | None = None) -> bool:
        """Delivered. If the status changed while it was sent, it goes back for one more edit."""
        return self._record(
            claim, Finish(claim.post_id, claim.lease_token, "posted", message_ref=message_ref)
        )

    def found(self, claim: ClaimedPost, message_ref: str) -> bool:
        """The post was already in the source. A status is edited once more (the copy may be old)."""
        return self._record(claim, Finish(claim.post_id, claim.lease_token, "found", message_ref=message_ref))

    def retry(self, claim: ClaimedPost, after: float | timedelta | None = None, reason: str = "") -> bool:
        """A failed try: back to the queue (the container waits), or failed when out of attempts."""
        wait = None if after is None else seconds(after)
        return self._record(
            claim, Finish(claim.post_id, claim.lease_token, "retry", wait=wait, reason=reason)
        )

    def hold(self, claim: ClaimedPost, after: float | timedelta, reason: str = "") -> bool:
        """The source asked to wait: back to the queue, and this attempt does not count."""
        return self._record(
            claim, Finish(claim.post_id, claim.lease_token, "hold", wait=seconds(after), reason=reason)
        )

    def settle(self, claim: ClaimedPost, state: str, reason: str = "") -> bool:
        """Finish as `failed` or `uncertain`; the body is kept so an operator can retry it."""
        return self._record(
            claim, Finish(claim.post_id, claim.lease_token, "settle", state=state, reason=reason)
        )

    def note(self, claim: ClaimedPost, reason: str) -> bool:
        """Keep `reason` as the latest error of a claim that stays as it is (a lost reply)."""
        fence = dict(post_id=claim.post_id, state=State.SENDING, lease_token=claim.lease_token)
        changes = dict(last_error=reason_text(reason), updated_at=self.clock())
        return bool(self._posts().filter(**fence).update(**changes))

    def finish_many(self, finishes: Sequence[tuple[ClaimedPost, Finish]]) -> list[bool]:
        """Several finishes at once, each with the semantics and fencing of its method.

        For senders: `Finish(action=...)` is posted, found, retry (`wait` None: the backoff),
        hold or settle. On PostgreSQL it takes two statements for the whole batch; elsewhere it
        records them one by one. True for each claim that was still current.
        """
        resolved = [(claim, self._resolve(claim, f)) for claim, f in finishes]
        if connections[self.using].vendor != "postgresql":
            return [self._apply(claim, f) for claim, f in resolved]
        now = self.clock()
        with transaction.atomic(using=self.using, savepoint=False), postgres.cursor(self.using) as cursor:
            changed = postgres.finish(cursor, self.source, [f for _, f in resolved], now)
        return [(claim.post_id, claim.lease_token) in changed for claim, _ in resolved]

    def _record(self, claim: ClaimedPost, f: Finish) -> bool:
        return self._apply(claim, self._resolve(claim, f))

    def _resolve(self, claim: ClaimedPost, f: Finish) -> Finish:
        """The plain, storable form of a finish, as both paths record it.

        Found one-offs are posted; out of attempts, a retry fails; a retry without a wait takes
        the backoff; then the answer is made storable (answers.py: refs, reasons, MAX_HOLD).
        """
        if f.action == "found" and claim.kind != Kind.STATUS:
            f = replace(f, action="posted")
        if f.action == "posted":
            f = replace(f, claimed_rev=claim.rev)
        elif f.action == "retry" and claim.attempts >= conf.MAX_ATTEMPTS:
            f = replace(f, action="settle", state=State.FAILED)
        elif f.action == "retry" and f.wait is None:
            f = replace(f, wait=self.backoff(claim.attempts))
        elif f.action == "settle" and f.state not in (State.FAILED, State.UNCERTAIN):
            raise ValueError(f"settle() takes 'failed' or 'uncertain', not {f.state!r}")
        elif f.action not in ("found", "retry", "hold", "settle"):
            raise ValueError(f"unknown finish action {f.action!r}")
        return storable(f)

    def backoff(self, attempts: int) -> float:
        """Seconds to wait after the `attempts`-th failed try, jittered down by up to RETRY_JITTER."""
        delay: float = min(conf.RETRY_BASE * 2 ** max(attempts - 1, 0), conf.RETRY_MAX)
        jitter = conf.RETRY_JITTER
        return delay * random.uniform(1 - jitter, 1) if jitter else delay

    def _apply(self, claim: ClaimedPost, f: Finish) -> bool:
        """Record a resolved finish (the ORM path) if the claim is still current.

        The post is read with a locking read, and the UPDATE carries the fence itself: under
        MySQL's REPEATABLE READ a plain read returns the transaction's snapshot, which may be
        from before another sender took the post back (or set_status changed its rev), while
        locking reads and UPDATEs see the latest committed row.
        """
        with transaction.atomic(using=self.using, savepoint=False):
            lane = self._posts().filter(post_id=claim.post_id).values_list("lane_id", flat=True).first()
            if lane is None:
                return False
            self._lock_lanes([lane])
            fenced = self._posts().filter(
                post_id=claim.post_id, state=State.SENDING, lease_token=claim.lease_token
            )
            row = fenced.select_for_update().values("kind", "rev", "attempts").first()
            if row is None:  # taken back, or finished already
                return False
            now = self.clock()
            changed = fenced.update(updated_at=now, lease_until=None, **self._changes(f, row, now))
            if changed:
                self._refresh_heads([lane])
            return bool(changed)

    def _changes(self, f: Finish, row: dict[str, Any], now: datetime) -> dict[str, Any]:
        """The fields a resolved finish sets on its post (`row`: its kind, rev and attempts)."""
        match f.action:
            case "posted":
                return self._posted_changes(row, now, f)
            case "found":  # a status: edited once more, in the same place
                changes: dict[str, Any] = dict(state=State.QUEUED, next_at=now, attempts=0)
                if f.message_ref is not None:
                    changes["message_ref"] = f.message_ref
                return changes
            case "retry":
                return dict(
                    state=State.QUEUED, next_at=now + timedelta(seconds=f.wait or 0), last_error=f.reason
                )
            case "hold":
                return dict(
                    state=State.QUEUED, next_at=now + timedelta(seconds=f.wait or 0),
                    attempts=max(row["attempts"] - 1, 0), last_error=f.reason,
                )  # fmt: skip
        return dict(state=f.state, last_error=f.reason)  # settle

    def _posted_changes(self, row: dict[str, Any], now: datetime, f: Finish) -> dict[str, Any]:
        changes: dict[str, Any] = {"attempts": 0}
        if f.message_ref is not None:
            changes["message_ref"] = f.message_ref
        if row["kind"] != Kind.STATUS:
            changes["body"] = None
        if row["rev"] == f.claimed_rev:
            changes["state"] = State.POSTED
        else:  # set_status replaced the body while it was being sent: edit once more
            changes.update(state=State.QUEUED, queued_at=now, next_at=now)
        return changes

    # -- housekeeping ---------------------------------------------------------------------

    def prune_finished(self, retention: float | timedelta | None = None) -> int:
        """Delete finished one-off posts last changed before now - retention; how many."""
        keep = conf.RETENTION if retention is None else seconds(retention)
        cutoff = self.clock() - timedelta(seconds=keep)
        old = self._posts().finished().filter(updated_at__lt=cutoff).exclude(kind=Kind.STATUS)
        deleted = 0
        while True:
            with transaction.atomic(using=self.using, savepoint=False):
                batch = list(old.values_list("pk", flat=True)[:PRUNE_BATCH])
                if not batch:
                    return deleted
                deleted += self._posts().filter(pk__in=batch, state__in=FINISHED_STATES).delete()[0]

    # -- rows and lanes -------------------------------------------------------------------

    def _posts(self) -> Any:
        return Post.objects.using(self.using).filter(source=self.source)

    def _lanes(self) -> Any:
        return Lane.objects.using(self.using)

    def _new_post(self, now: datetime, fields: Mapping[str, Any], *, status: bool = False) -> NewPost:
        """A validated post; InvalidPost names the post id and the field."""
        fields = dict(fields)
        post_id = fields.pop("post_id", None)
        check_place(
            post_id, fields.get("workspace_id"), fields.get("container_id"), fields.get("thread_id", ""),
            fields.get("turn_key"),
        )  # fmt: skip
        kind = fields.get("kind", Kind.MESSAGE)
        if kind == Kind.STATUS and not status:
            raise InvalidPost(f"post {post_id!r}: kind 'status' is queued with set_status(), not queue()")
        check_kind(post_id, kind, connectors[self.source].kinds)
        if "body" not in fields:
            raise InvalidPost(f"post {post_id!r}: body is required")
        body, body_json = clean_body(post_id, fields["body"])
        delay = clean_delay(post_id, fields.get("delay"))
        try:
            due = now + timedelta(seconds=delay)
        except OverflowError as e:
            raise InvalidPost(f"post {post_id!r}: delay {delay!r} is too long") from e
        unknown = set(fields) - {
            "workspace_id",
            "container_id",
            "thread_id",
            "kind",
            "body",
            "turn_key",
            "delay",
        }
        if unknown:
            raise InvalidPost(f"post {post_id!r}: unknown field {sorted(unknown)[0]}")
        return NewPost(
            post_id, fields["workspace_id"], fields["container_id"], fields.get("thread_id", ""), str(kind), body,
            body_json, fields.get("turn_key"), due,
        )  # fmt: skip

    def _insert(self, now: datetime, rows: list[NewPost]) -> int:
        """Insert the posts whose ids are new and make them heads where they come first."""
        unique: dict[str, NewPost] = {}
        for row in rows:
            unique.setdefault(row.post_id, row)  # the first of two equal ids wins, as with queue()
        if connections[self.using].vendor == "postgresql":
            with postgres.cursor(self.using) as cursor:
                return postgres.queue(cursor, self.source, list(unique.values()), now)
        known = self._posts().filter(post_id__in=list(unique))
        while True:
            existing = set(known.values_list("post_id", flat=True))
            new = [row for post_id, row in unique.items() if post_id not in existing]
            if not new:
                return 0
            lanes = self._lock_places({(row.workspace_id, row.container_id) for row in new})
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
            except IntegrityError:
                # Read again with a locking read, which sees the id committed meanwhile: under
                # MySQL's REPEATABLE READ a plain read returns the same snapshot every time.
                known = known.select_for_update()
                continue
            self._refresh_heads(set(lanes.values()))
            return len(new)

    def _lock_places(self, places: set[tuple[str, str]]) -> dict[tuple[str, str], int]:
        """Lock the lanes of these (workspace, container) places, creating missing ones; their ids."""

        def lock() -> dict[tuple[str, str], int]:
            match = Q()
            for workspace_id, container_id in places:
                match |= Q(workspace_id=workspace_id, container_id=container_id)
            found = self._lanes().select_for_update().filter(match, source=self.source).order_by("pk")
            return {(ws, c): pk for pk, ws, c in found.values_list("pk", "workspace_id", "container_id")}

        lanes = lock()
        if len(lanes) < len(places):
            self._lanes().bulk_create(
                [Lane(source=self.source, workspace_id=w, container_id=c) for w, c in places - set(lanes)],
                ignore_conflicts=True,
            )
            lanes = lock()
        return lanes

    def _notify(self) -> None:
        """Wake idle senders (PostgreSQL NOTIFY, delivered when the caller's transaction commits)."""
        connection = connections[self.using]
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, self.source])

    def _lock_lanes(self, lane_ids: Iterable[int]) -> None:
        list(self._lanes().select_for_update().filter(pk__in=list(lane_ids)).order_by("pk").values_list("pk"))

    def _refresh_heads(self, lane_ids: Iterable[int]) -> None:
        """Point each (locked) lane at its head and the head's due time.

        A lane with a sending post keeps it as its head whatever was queued meanwhile: one post
        per container is in flight. Otherwise the head is the queued post with the smallest
        (queued_at, post_id). One UPDATE however many lanes, so that queue_many stays one round
        trip per batch rather than per container; and it decides in its own subqueries, which
        read the latest committed rows even under MySQL's REPEATABLE READ (a separate plain read
        would return the transaction's snapshot, where a head claimed since may look queued).
        """
        sending = Exists(self._posts().filter(lane_id=OuterRef("pk"), state=State.SENDING))
        heads = (
            self._posts().filter(lane_id=OuterRef("pk"), state=State.QUEUED).order_by("queued_at", "post_id")
        )
        self._lanes().filter(~sending, pk__in=list(lane_ids)).update(
            head_id=Subquery(heads.values("pk")[:1]), due_at=Subquery(heads.values("next_at")[:1])
        )
