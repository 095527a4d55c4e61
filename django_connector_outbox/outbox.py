"""The Outbox: queue posts in the caller's transaction; claim, and record what happened.

Locking order, everywhere: a lane row first, then posts of that lane. Every write that can
change which post is a container's head (queue, set_status, cancel, every finish) locks the
lane; claimers lock lanes with SKIP LOCKED. Together that gives one head per container in
flight and no deadlock between producers, claimers and finishers.

Lanes are derived state: a lane's head and due time follow from its posts by one rule,
`_head_rule`, which the writes here apply under the lane's lock (postgres.py's single
statements follow it in SQL). `repair_lanes` applies it to lanes that drifted from it anyway
(a bug, a manual UPDATE, a restore), under their locks too; housekeeping calls it batch by
batch, so a wrong lane never strands its container for good.

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
from typing import Any, NamedTuple

from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, connections, transaction
from django.db.models import F, Min, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

from django_connector_outbox import postgres
from django_connector_outbox.answers import storable
from django_connector_outbox.conf import conf, seconds
from django_connector_outbox.connectors import connectors
from django_connector_outbox.models import Lane, Post
from django_connector_outbox.postgres import NOTIFY_CHANNEL as NOTIFY_CHANNEL  # senders LISTEN on it
from django_connector_outbox.posts import (
    FINISHED_STATES,
    RETRYABLE_STATES,
    Action,
    ClaimedPost,
    Finish,
    InvalidPost,
    Kind,
    NewPost,
    PostState,
    State,
)
from django_connector_outbox.validation import check_kind, check_place, clean_body, clean_delay

Clock = Callable[[], datetime]

# Posts deleted per statement when pruning, so that no delete holds locks for long.
PRUNE_BATCH = 1000
# Lanes checked per call of repair_lanes: one short read, a seek per lane and head rule part.
REPAIR_BATCH = 500

# Places looked up per statement: an OR of ~1,000 is "Expression tree is too large" for SQLite.
PLACES_PER_STATEMENT = 200

# The fields a claim reads from a head.
CLAIM_FIELDS = (
    "pk", "lane_id", "post_id", "workspace_id", "container_id", "thread_id", "kind", "body", "rev",
    "state", "attempts", "next_at", "lease_until", "sent_at", "message_ref", "turn_key",
)  # fmt: skip


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


class Hold(NamedTuple):
    """A queued post waiting past now after a retry or a hold (Outbox.holds)."""

    post_id: str
    workspace_id: str
    container_id: str
    next_at: datetime
    attempts: int
    last_error: str


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
        # Two rounds at most: a post created by another transaction between our read and our
        # insert is found (and checked) by the second read, a locking one (under MySQL's
        # REPEATABLE READ a plain read would repeat the transaction's snapshot).
        for locking in (False, True):
            # Checked before anything is written: an InvalidPost raised inside the block below
            # would break the caller's transaction (atomic without a savepoint).
            existing = self._existing_status(new, locking=locking)
            with transaction.atomic(using=self.using, savepoint=False):
                if existing is None:
                    if self._insert(now, [new]):
                        return
                    continue
                self._lock_lanes([existing["lane_id"]])
                # A locking read: the latest row, not a snapshot from before the lane was ours.
                row = self._posts().filter(pk=existing["pk"]).select_for_update().get()
                self._replace_status(now, row, new)
                return
        raise IntegrityError(f"post {post_id!r} could be neither inserted nor found")

    def _existing_status(self, new: NewPost, *, locking: bool = False) -> dict[str, Any] | None:
        """The existing post of this id (pk, lane_id), or None; InvalidPost if it cannot be set.

        A post's kind and place never change once it exists, so what is read here without a
        lock still holds when the row is updated. `locking`: a locking read, in a savepoint of
        its own (so that an InvalidPost leaves the caller's transaction usable).
        """
        fields = ("pk", "lane_id", "kind", "workspace_id", "container_id", "thread_id")
        posts = self._posts().filter(post_id=new.post_id)
        row: dict[str, Any] | None
        if locking:
            with transaction.atomic(using=self.using):
                row = posts.select_for_update().values(*fields).first()
        else:
            row = posts.values(*fields).first()
        if row is None:
            return None
        if row["kind"] != Kind.STATUS:
            raise InvalidPost(
                f"post {new.post_id!r}: kind is {row['kind']!r}, not a status; it cannot be set"
            )
        for field in ("workspace_id", "container_id", "thread_id"):
            if row[field] != getattr(new, field):
                raise InvalidPost(f"post {new.post_id!r}: {field} is {row[field]!r}; a status cannot move")
        return row

    def _replace_status(self, now: datetime, row: Post, new: NewPost) -> None:
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
            claim, Finish(claim.post_id, claim.lease_token, Action.POSTED, message_ref=message_ref)
        )

    def found(self, claim: ClaimedPost, message_ref: str) -> bool:
        """The post was already in the source. A status is edited once more (the copy may be old)."""
        return self._record(
            claim, Finish(claim.post_id, claim.lease_token, Action.FOUND, message_ref=message_ref)
        )

    def retry(self, claim: ClaimedPost, after: float | timedelta | None = None, reason: str = "") -> bool:
        """A failed try: back to the queue (the container waits), or failed when out of attempts."""
        wait = None if after is None else seconds(after)
        return self._record(
            claim, Finish(claim.post_id, claim.lease_token, Action.RETRY, wait=wait, reason=reason)
        )

    def hold(self, claim: ClaimedPost, after: float | timedelta, reason: str = "") -> bool:
        """The source asked to wait: back to the queue, and this attempt does not count."""
        return self._record(
            claim, Finish(claim.post_id, claim.lease_token, Action.HOLD, wait=seconds(after), reason=reason)
        )

    def settle(self, claim: ClaimedPost, state: str, reason: str = "") -> bool:
        """Finish as `failed` or `uncertain`; the body is kept so an operator can retry it."""
        return self._record(
            claim, Finish(claim.post_id, claim.lease_token, Action.SETTLE, state=state, reason=reason)
        )

    def out_of_attempts(self, claim: ClaimedPost) -> bool:
        """Whether this is the claim's last attempt (or past it): the one rule for giving up."""
        return claim.attempts >= conf.MAX_ATTEMPTS

    def may_send(self, claim: ClaimedPost) -> bool:
        """Whether `claim` may be handed to `send`: at most MAX_ATTEMPTS times in all.

        Only a stale claim can be past it: its sender died on the last attempt.
        """
        return claim.attempts <= conf.MAX_ATTEMPTS

    def leave(self, claim: ClaimedPost, reason: str) -> bool:
        """The post may be in the source, or on its way there (a lost reply, a lookup to do
        again): it stays `sending`, holding its container, until its lease ends; then it is
        claimed back stale and looked up. `reason` is noted. Even on the last attempt: the
        lookup then decides, and it is never sent again (`may_send`)."""
        return self._record(claim, Finish(claim.post_id, claim.lease_token, Action.LEAVE, reason=reason))

    def give_back(self, claim: ClaimedPost, reason: str = "given back") -> bool:
        """A claim not started (a stopping sender, a lease too short to start in) is given back.

        A fresh claim goes back to the queue as `hold(claim, 0)`. A stale one may be in the
        source already, so it stays stale: `sending`, with its lease ended now, so that the
        next claimer looks it up before anything is sent. Either way the attempt is not counted.
        """
        return self._record(claim, Finish(claim.post_id, claim.lease_token, Action.GIVE_BACK, reason=reason))

    def finish_many(self, finishes: Sequence[tuple[ClaimedPost, Finish]]) -> list[bool]:
        """Several finishes at once, each with the semantics and fencing of its method.

        For senders: a `Finish` of each `Action` (a retry's `wait` None: the backoff). On
        PostgreSQL the posted, found, retry, hold and settle finishes of a batch take two
        statements; the rest are recorded one by one. True for each claim that was still
        current.
        """
        resolved = [(claim, self.resolve(claim, f)) for claim, f in finishes]
        in_sql = connections[self.using].vendor == "postgresql"
        batch = [f for _, f in resolved if in_sql and f.action in postgres.FINISH_ACTIONS]
        changed: set[tuple[str, str]] = set()
        if batch:
            now = self.clock()
            with transaction.atomic(using=self.using, savepoint=False), postgres.cursor(self.using) as cursor:
                changed = postgres.finish(cursor, self.source, batch, now)
        return [
            (f.post_id, f.lease_token) in changed
            if in_sql and f.action in postgres.FINISH_ACTIONS
            else self._apply(claim, f)
            for claim, f in resolved
        ]

    def _record(self, claim: ClaimedPost, f: Finish) -> bool:
        return self._apply(claim, self.resolve(claim, f))

    def resolve(self, claim: ClaimedPost, f: Finish) -> Finish:
        """The plain, storable form of a finish, as it will be recorded on either path.

        Found one-offs are posted; on the last attempt a retry fails; a retry without a wait
        takes the backoff; a claim given back goes back to the queue, or stays stale; then the
        answer is made storable (answers.py: refs, reasons, MAX_HOLD).
        """
        match f.action:
            case Action.FOUND if claim.kind != Kind.STATUS:
                f = replace(f, action=Action.POSTED, claimed_rev=claim.rev)
            case Action.POSTED:
                f = replace(f, claimed_rev=claim.rev)
            case Action.RETRY if self.out_of_attempts(claim):
                f = replace(f, action=Action.SETTLE, state=State.FAILED)
            case Action.RETRY if f.wait is None:
                f = replace(f, wait=self.backoff(claim.attempts))
            case Action.GIVE_BACK:  # where it goes back to: the queue, or a stale claim still
                f = replace(f, state=State.SENDING if claim.stale else State.QUEUED)
            case Action.SETTLE if f.state not in (State.FAILED, State.UNCERTAIN):
                raise ValueError(f"settle() takes 'failed' or 'uncertain', not {f.state!r}")
            case Action.FOUND | Action.RETRY | Action.HOLD | Action.SETTLE | Action.LEAVE:
                pass
            case _:
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
            changed = fenced.update(**{"updated_at": now, "lease_until": None, **self._changes(f, row, now)})
            if changed:
                self._refresh_heads([lane])
            return bool(changed)

    def _changes(self, f: Finish, row: dict[str, Any], now: datetime) -> dict[str, Any]:
        """The fields a resolved finish sets on its post (`row`: its kind, rev and attempts)."""
        match f.action:
            case Action.POSTED:
                return self._posted_changes(row, now, f)
            case Action.FOUND:  # a status: edited once more, in the same place
                changes: dict[str, Any] = dict(state=State.QUEUED, next_at=now, attempts=0)
                if f.message_ref is not None:
                    changes["message_ref"] = f.message_ref
                return changes
            case Action.RETRY:
                return dict(
                    state=State.QUEUED, next_at=now + timedelta(seconds=f.wait or 0), last_error=f.reason
                )
            case Action.HOLD:
                return dict(
                    state=State.QUEUED, next_at=now + timedelta(seconds=f.wait or 0),
                    attempts=max(row["attempts"] - 1, 0), last_error=f.reason,
                )  # fmt: skip
            case Action.LEAVE:  # as it is, under its lease: only the reason is noted
                return dict(lease_until=F("lease_until"), last_error=f.reason)
            case Action.GIVE_BACK:  # not started: the attempt is not counted
                attempts = max(row["attempts"] - 1, 0)
                if f.state == State.QUEUED:  # a fresh claim, as hold(claim, 0)
                    return dict(state=State.QUEUED, next_at=now, attempts=attempts, last_error=f.reason)
                # A stale one may be in the source: still stale, its lease ended now.
                return dict(lease_until=now, attempts=attempts, last_error=f.reason)
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

    def next_due(self) -> datetime | None:
        """When the earliest head of this source is due (claimable), or None without heads."""
        due: datetime | None = self._lanes().filter(source=self.source).aggregate(due=Min("due_at"))["due"]
        return due

    # -- operators ------------------------------------------------------------------------

    def queue_health(self) -> tuple[int, datetime | None]:
        """How many posts are active, and since when the oldest due one has held its place."""
        oldest = self._posts().oldest_due(self.clock()).values_list("queued_at", flat=True).first()
        return self._posts().active().count(), oldest

    def state_counts(self, states: Iterable[str] = tuple(State)) -> dict[str, int]:
        """How many of this source's posts are in each of `states`.

        One count per state, each a range of the (source, state, queued_at) index: cheaper than
        a GROUP BY that reads every row, and a caller that skips `posted` skips its bulk.
        """
        return {state: self._posts().filter(state=state).count() for state in states}

    def holds(self, limit: int = 20) -> tuple[int, list[Hold]]:
        """Queued posts that wait past now after a retry or a hold (their container waits with
        them): how many, and the `limit` due last, with why (their latest error).

        A delayed post waits too, but in its place (its queue time is its due time); a post
        that was tried and sent back waits past the place it keeps.
        """
        now = self.clock()
        waiting = self._posts().filter(state=State.QUEUED, next_at__gt=now).filter(next_at__gt=F("queued_at"))
        fields = ("post_id", "workspace_id", "container_id", "next_at", "attempts", "last_error")
        rows = waiting.order_by("-next_at", "post_id").values_list(*fields)[:limit]
        return waiting.count(), [Hold(*row) for row in rows]

    # -- housekeeping ---------------------------------------------------------------------

    def prune_finished(self, retention: float | timedelta | None = None) -> int:
        """Delete finished one-off posts last changed before now - retention; how many."""
        deleted = 0
        while True:
            batch = self.prune_some(retention)
            deleted += batch
            if batch < PRUNE_BATCH:
                return deleted

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
            except IntegrityError as e:
                conflict = e
                # Read again with a locking read, which sees the id committed meanwhile: under
                # MySQL's REPEATABLE READ a plain read returns the same snapshot every time.
                known = known.select_for_update()
                continue
            self._refresh_heads(set(lanes.values()))
            return len(new)

    def _lock_places(self, places: set[tuple[str, str]]) -> dict[tuple[str, str], int]:
        """Lock the lanes of these (workspace, container) places, creating missing ones; their ids.

        Lanes are locked in pk order (the deadlock-free order of every lane lock). A few
        places are looked up and locked in one statement; more are looked up in chunks (one
        OR of them all is too deep for SQLite's expression tree), then locked by pk.
        """
        at_once = len(places) <= PLACES_PER_STATEMENT
        lanes = self._find_lanes(places, lock=at_once)
        if len(lanes) < len(places):
            self._lanes().bulk_create(
                [Lane(source=self.source, workspace_id=w, container_id=c) for w, c in places - set(lanes)],
                ignore_conflicts=True,
            )
            lanes = self._find_lanes(places, lock=at_once)
        if not at_once:
            self._lock_lanes(lanes.values())
        return lanes

    def _find_lanes(self, places: set[tuple[str, str]], *, lock: bool) -> dict[tuple[str, str], int]:
        """The ids of the existing lanes of these places (locked, in pk order, if `lock`)."""
        ordered = sorted(places)
        lanes: dict[tuple[str, str], int] = {}
        for start in range(0, len(ordered), PLACES_PER_STATEMENT):
            # One flat OR: `|=` in a loop copies the growing tree each time (quadratic).
            chunk = ordered[start : start + PLACES_PER_STATEMENT]
            match = Q(*(Q(workspace_id=w, container_id=c) for w, c in chunk), _connector=Q.OR)
            found = self._lanes().filter(match, source=self.source)
            if lock:
                found = found.select_for_update().order_by("pk")
            lanes.update({(w, c): pk for pk, w, c in found.values_list("pk", "workspace_id", "container_id")})
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
        """Point each (locked) lane at its head and the head's due time, by `_head_rule`.

        One statement however many lanes, so that queue_many stays one round trip per batch
        rather than per container.
        """
        self._lanes().filter(pk__in=list(lane_ids)).update(**self._head_rule())

    def _head_rule(self) -> dict[str, Any]:
        """What a lane's head_id and due_at must be, as expressions over the lane row.

        The one definition of a head, shared by every write and by the reconciler: the lane's
        `sending` post if it has one (one post per container is in flight, whatever was queued
        meanwhile), else its `queued` post with the smallest (queued_at, post_id); due at the
        head's lease end while sending, else at its next_at; no head, no due time. Each part
        is one seek on connector_outbox_post_lane, however long the queue behind the head.
        """

        def first(state: str, field: str) -> Subquery:
            posts = Post.objects.filter(lane_id=OuterRef("pk"), state=state).order_by("queued_at", "post_id")
            return Subquery(posts.values(field)[:1])

        return {
            "head_id": Coalesce(first(State.SENDING, "pk"), first(State.QUEUED, "pk")),
            "due_at": Coalesce(first(State.SENDING, "lease_until"), first(State.QUEUED, "next_at")),
        }

    def prune_some(self, retention: float | timedelta | None = None, limit: int = PRUNE_BATCH) -> int:
        """One short transaction of `prune_finished`: at most `limit` posts deleted; how many.

        For housekeeping, which spreads a large backlog over several turns so that no turn holds
        the sender (or the posts' locks) for long. Fewer than `limit`: nothing was left to prune,
        unless some changed state meanwhile (an operator's retry); the next run takes those.
        """
        keep = conf.RETENTION if retention is None else seconds(retention)
        cutoff = self.clock() - timedelta(seconds=keep)
        old = self._posts().finished().filter(updated_at__lt=cutoff).exclude(kind=Kind.STATUS)
        with transaction.atomic(using=self.using, savepoint=False):
            batch = list(old.values_list("pk", flat=True)[:limit])
            if not batch:
                return 0
            # The state again: a post may have been requeued since it was read.
            deleted: int = self._posts().filter(pk__in=batch, state__in=FINISHED_STATES).delete()[0]
            return deleted

    def repair_lanes(self, after: int = 0, limit: int = REPAIR_BATCH) -> tuple[int | None, list[LaneRepair]]:
        """Check this source's next `limit` lanes (by id, after `after`) against their posts.

        A lane is derived state: if its head or due time is not what `_head_rule` says (a bug,
        a manual UPDATE, a restore from a backup), its container would wait for ever. Lanes
        that differ are locked, recomputed under their lock and written; returns the last lane
        id checked (None when no lane is left after it: start again from 0) and the repairs.
        """
        want = {f"want_{name}": rule for name, rule in self._head_rule().items()}
        lanes = self._lanes().filter(source=self.source, pk__gt=after).annotate(**want).order_by("pk")
        rows = list(lanes.values_list("pk", "head_id", "due_at", *want)[:limit])
        drifted = [pk for pk, head, due, want_head, want_due in rows if (head, due) != (want_head, want_due)]
        repairs = self._repair(drifted) if drifted else []
        return (rows[-1][0] if len(rows) == limit else None), repairs

    def _repair(self, lane_ids: list[int]) -> list[LaneRepair]:
        """Recompute these lanes under their locks; the ones that really changed."""
        with transaction.atomic(using=self.using, savepoint=False):
            locked = self._lanes().select_for_update().filter(pk__in=lane_ids).order_by("pk")
            before = {pk: (head, due) for pk, head, due in locked.values_list("pk", "head_id", "due_at")}
            self._refresh_heads(before)
            after = self._lanes().filter(pk__in=before).order_by("pk")
            after = after.values_list("pk", "workspace_id", "container_id", "head_id", "due_at")
            repairs = [
                LaneRepair(self.source, pk, workspace_id, container_id, *before[pk], head, due)
                for pk, workspace_id, container_id, head, due in after
                if (head, due) != before[pk]
            ]
            if repairs:
                self._notify()  # a repaired head may be due now: idle senders should look
        return repairs
