"""The Outbox: queue posts in the caller's transaction; claim, and record what happened.

The Outbox decides what each call means: it validates posts, resolves a sender's finish into
what is stored (out of attempts, backoff, storable answers) and owns the clock. Writing the rows
is its store's (store/: the ORM store, or PostgreSQL's own statements), chosen once in
`__init__`; the locking order, head rule and fencing are stated there.
"""

from __future__ import annotations

import random
import socket
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from asgiref.sync import sync_to_async
from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, transaction
from django.db.models import Case, Count, Max, Value, When
from django.db.models.functions import Substr
from django.utils import timezone
from django.utils.translation import gettext

from django_connector_outbox import signals
from django_connector_outbox.answers import storable
from django_connector_outbox.conf import conf, seconds
from django_connector_outbox.message import Message, message_of
from django_connector_outbox.models import Gate, Lane, Post
from django_connector_outbox.posts import (
    FINISHED_STATES,
    Action,
    ClaimedPost,
    Finish,
    InvalidPost,
    Kind,
    NewPost,
    PostState,
    Scope,
    State,
)
from django_connector_outbox.store import LaneRepair, Store, store_for
from django_connector_outbox.validation import (
    check_kind,
    check_message,
    check_parent,
    check_place,
    check_reply,
    clean_body,
    clean_delay,
    message_in,
)
from django_connector_outbox.wording import plain

Clock = Callable[[], datetime]

# Posts deleted per statement when pruning, so that no delete holds locks for long.
PRUNE_BATCH = 1000
# The keys of a post given to queue_many (queue's keywords); the required ones.
POST_FIELDS = (
    "post_id", "workspace_id", "container_id", "thread_id", "kind", "body", "turn_key", "delay", "thread_of",
)  # fmt: skip
REQUIRED_FIELDS = ("post_id", "workspace_id", "container_id", "body")
# Lanes checked per call of repair_lanes: one short read, a seek per lane and head rule part.
REPAIR_BATCH = 500


class HeldPost(NamedTuple):
    """A queued post waiting past now after a retry or a hold (Outbox.holds)."""

    post_id: str
    workspace_id: str
    container_id: str
    next_at: datetime
    attempts: int
    last_error: str


class GateHold(NamedTuple):
    """A place held past now for every post of it (Outbox.gate_holds): the whole source or a
    workspace after a wider rate limit, or a container after a success that announced a wait."""

    scope: str  # a Scope
    workspace_id: str  # "" for the whole source
    container_id: str  # "" unless the scope is a container
    held_until: datetime
    reason: str


class Pruned(NamedTuple):
    """What one pruning deleted (Outbox.prune)."""

    posts: int  # finished posts
    lanes: int  # idle lanes


class FailureGroup(NamedTuple):
    """Failed or uncertain posts that ended for one reason (Outbox.failures)."""

    state: str  # failed or uncertain
    reason: str  # their latest error
    posts: int  # how many
    newest: datetime  # when the latest of them ended
    post_ids: list[str]  # a few of them, the latest first


class Failures(NamedTuple):
    """A source's failed and uncertain posts by reason (Outbox.failures)."""

    posts: int  # how many in all
    reasons: int  # how many groups (state, reason) in all
    groups: list[FailureGroup]  # the groups that failed most recently


# Widest first: a source hold stops every post of it, a container hold one channel.
SCOPES_WIDEST_FIRST = (Scope.SOURCE, Scope.WORKSPACE, Scope.CONTAINER)


def default_worker() -> str:
    import os

    return f"{socket.gethostname()}:{os.getpid()}"


class Outbox:
    """One source's outbox on one database."""

    def __init__(self, source: str, *, using: str = "default", clock: Clock | None = None) -> None:
        if source not in conf.CONNECTORS:
            raise ImproperlyConfigured(
                gettext("Unknown connector outbox source %(source)r; configured: %(configured)s.")
                % {"source": source, "configured": ", ".join(sorted(conf.CONNECTORS)) or gettext("none")}
            )
        self.source = source
        self.using = using
        self.clock: Clock = clock or timezone.now
        self.store: Store = store_for(source, using)

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
        body: dict[str, Any] | Message,
        turn_key: str | None = None,
        delay: float | timedelta | None = None,
        thread_of: str | None = None,
    ) -> bool:
        """Queue a post unless its id exists already (in any state); True when queued.

        `body`: the platform's own body, or a `Message`, stored as its JSON and rendered by
        the connector at send time (refused here if the source cannot show it).
        `thread_of`: the post_id of an earlier post of this container, whose thread it goes
        into once that post is sent (`check_parents`)."""
        now = self.clock()
        row = self._new_post(
            now, conf.kinds(self.source), conf.MAX_BODY_BYTES, post_id=post_id, workspace_id=workspace_id,
            container_id=container_id, thread_id=thread_id, kind=kind, body=body, turn_key=turn_key, delay=delay,
            thread_of=thread_of,
        )  # fmt: skip
        return self._queue([row], now) == 1

    def queue_many(self, posts: Iterable[Mapping[str, Any]]) -> int:
        """`queue(**p)` for each p, all validated before anything is written; how many were queued."""
        now = self.clock()
        kinds, max_bytes = conf.kinds(self.source), conf.MAX_BODY_BYTES  # once, not per post
        rows = [self._new_post(now, kinds, max_bytes, **self._fields(p)) for p in posts]
        if not rows:
            return 0
        return self._queue(rows, now)

    def _queue(self, rows: list[NewPost], now: datetime) -> int:
        self.check_parents(rows)
        with transaction.atomic(using=self.using, savepoint=False):
            return self._insert(now, rows)

    def set_status(
        self,
        post_id: str,
        *,
        workspace_id: str,
        container_id: str,
        thread_id: str = "",
        body: dict[str, Any] | Message,
        thread_of: str | None = None,
    ) -> None:
        """Create or replace a status post; only its latest body is ever sent."""
        now = self.clock()
        new = self._new_post(
            now, conf.kinds(self.source), conf.MAX_BODY_BYTES, post_id=post_id, workspace_id=workspace_id,
            container_id=container_id, thread_id=thread_id, kind=Kind.STATUS, body=body, thread_of=thread_of,
            status=True,
        )  # fmt: skip
        self.check_parents([new])
        # Two rounds at most: a post created by another transaction between our read and our
        # insert, or pruned (STATUS_RETENTION) between our read and our lock, is found (or not)
        # by the second read, a locking one (under MySQL's REPEATABLE READ a plain read would
        # repeat the transaction's snapshot).
        for locking in (False, True):
            # Checked before anything is written: an InvalidPost raised inside the block below
            # would break the caller's transaction (atomic without a savepoint).
            existing = self._existing_status(new, locking=locking)
            with transaction.atomic(using=self.using, savepoint=False):
                if existing is None:
                    if self._insert(now, [new]):
                        return
                    continue
                if not self.store.replace_status(now, existing["pk"], existing["lane_id"], new.body):
                    continue
                self._announce_queued()
                return
        raise IntegrityError(f"post {post_id!r} could be neither inserted nor found")

    def _existing_status(self, new: NewPost, *, locking: bool = False) -> dict[str, Any] | None:
        """The existing post of this id (pk, lane_id), or None; InvalidPost if it cannot be set.

        A post's kind and place never change once it exists, so what is read here without a
        lock still holds when the row is updated. `locking`: a locking read, in a savepoint of
        its own (so that an InvalidPost leaves the caller's transaction usable).
        """
        fields = ("pk", "lane_id", "kind", "workspace_id", "container_id", "thread_id", "thread_of")
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
        place = ["workspace_id", "container_id", "thread_of"]
        if row["thread_of"] is None:  # a reply's thread_id is its parent's thread once delivered
            place.append("thread_id")
        for field in place:
            if row[field] != getattr(new, field):
                raise InvalidPost(f"post {new.post_id!r}: {field} is {row[field]!r}; a status cannot move")
        return row

    def requeue(self, post_id: str) -> bool:
        """Send a `failed` or `uncertain` post back to its container's queue (for operators).

        It joins the back of the queue, due now, with attempts 0; its `last_error`,
        `message_ref` and `rev` are kept (a status with a ref is edited, not re-created).
        False, changing nothing, in any other state (a `sending` post is never touched) or
        when it has no body left. An uncertain post may be in the source already: asking
        whether to risk a duplicate is the caller's job (the admin asks).
        """
        with transaction.atomic(using=self.using, savepoint=False):
            return self.store.requeue(self.clock(), post_id)

    def has_reply_for_turn(self, turn_key: str, *, prefix: str = "reply:") -> bool:
        """Whether a post of this turn has an id starting with `prefix`, compared exactly: not
        `startswith`, whose LIKE ignores the case of ASCII letters on SQLite."""
        replies = self._posts().filter(turn_key=turn_key)
        if prefix:
            replies = replies.annotate(id_start=Substr("post_id", 1, len(prefix))).filter(id_start=prefix)
        found: bool = replies.exists()
        return found

    def cancel_queued(self, post_id: str) -> bool:
        """Cancel a post that is still queued (and drop its body); False in any other state."""
        with transaction.atomic(using=self.using, savepoint=False):
            return self.store.cancel(self.clock(), post_id)

    def retract(self, post_id: str) -> bool:
        """Take a post back so that it is not seen: a queued one is cancelled (as
        `cancel_queued`); one posted, or being sent, gets a delete of its message queued behind
        it in its container (sent once the send in flight has finished, dropped if that send
        ends without a message). A status whose edit is queued has both: the edit cancelled,
        its message deleted. True when one of these was done; False, changing nothing, for a
        post that does not exist, is cancelled, ended without a message (or is a reaction or
        an ephemeral that was sent), was retracted before, or whose source does not list
        "delete" in its kinds. The rule is `models.retraction`."""
        if Kind.DELETE not in conf.kinds(self.source):
            return False
        with transaction.atomic(using=self.using, savepoint=False):
            retracted = self.store.retract(self.clock(), post_id)
        if retracted:
            self._announce_queued()
        return retracted

    def find(self, post_id: str) -> PostState | None:
        """The post's state (a sending one's too), its message ref, and the Message it holds (if
        queued with one); None when no post has this id."""
        row = (
            self._posts()
            .filter(post_id=post_id)
            .with_claim()
            .values("current_state", "message_ref", "body")
            .first()
        )
        if row is None:
            return None
        return PostState(row["current_state"], row["message_ref"], message_of(row["body"] or {}))

    # -- producers, from async code -------------------------------------------------------
    # As Django's own a-methods: the sync method in the thread that holds the request's
    # connection (thread_sensitive), so it joins a transaction that a `sync_to_async`
    # function opened there. Arguments pass through, with the sync method's semantics.

    async def aqueue(self, *args: Any, **kwargs: Any) -> bool:
        """`queue` for async code."""
        return await sync_to_async(self.queue, thread_sensitive=True)(*args, **kwargs)

    async def aqueue_many(self, *args: Any, **kwargs: Any) -> int:
        """`queue_many` for async code."""
        return await sync_to_async(self.queue_many, thread_sensitive=True)(*args, **kwargs)

    async def aset_status(self, *args: Any, **kwargs: Any) -> None:
        """`set_status` for async code."""
        await sync_to_async(self.set_status, thread_sensitive=True)(*args, **kwargs)

    async def acancel_queued(self, *args: Any, **kwargs: Any) -> bool:
        """`cancel_queued` for async code."""
        return await sync_to_async(self.cancel_queued, thread_sensitive=True)(*args, **kwargs)

    async def aretract(self, *args: Any, **kwargs: Any) -> bool:
        """`retract` for async code."""
        return await sync_to_async(self.retract, thread_sensitive=True)(*args, **kwargs)

    async def afind(self, *args: Any, **kwargs: Any) -> PostState | None:
        """`find` for async code."""
        return await sync_to_async(self.find, thread_sensitive=True)(*args, **kwargs)

    async def ahas_reply_for_turn(self, *args: Any, **kwargs: Any) -> bool:
        """`has_reply_for_turn` for async code."""
        return await sync_to_async(self.has_reply_for_turn, thread_sensitive=True)(*args, **kwargs)

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
        with transaction.atomic(using=self.using, savepoint=False):
            return self.store.claim(limit, now, lease_until, token, worker)

    def renew_leases(self, tokens: Sequence[str]) -> tuple[set[str], datetime]:
        """Extend the leases of these claims (by lease token) that have not ended to a full
        LEASE from now: which tokens were renewed, and until when. A lease that has ended is
        left as it is: another sender may be taking its head back (leases.py)."""
        now = self.clock()
        until = now + timedelta(seconds=conf.LEASE)
        with transaction.atomic(using=self.using, savepoint=False):
            return self.store.renew(now, tokens, until), until

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

    def hold(
        self, claim: ClaimedPost, after: float | timedelta, reason: str = "", *, scope: str = Scope.CONTAINER
    ) -> bool:
        """The source asked to wait: back to the queue, and this attempt does not count.

        A wider `scope` ("workspace", "source") also holds every other container of the post's
        workspace (of the source) until the same instant, for all senders: none of their posts
        is claimed before then; they keep their place and attempts.
        """
        finish = Finish(
            claim.post_id, claim.lease_token, Action.HOLD, wait=seconds(after), reason=reason, scope=scope
        )
        return self._record(claim, finish)

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

    def finish_many(self, finishes: Sequence[tuple[ClaimedPost, Finish]]) -> list[Finish | None]:
        """Several finishes at once, each with the semantics and fencing of its method.

        For senders: a `Finish` of each `Action` (a retry's `wait` None: the backoff), in one
        transaction (on PostgreSQL, one statement for most). Each as it was recorded
        (`resolve`d), or None where the claim was no longer current.
        """
        resolved = [self.resolve(claim, f) for claim, f in finishes]
        now = self.clock()
        with transaction.atomic(using=self.using, savepoint=False):
            return self._finish_resolved(finishes, resolved, now)

    def finish_and_claim(
        self, finishes: Sequence[tuple[ClaimedPost, Finish]], limit: int, *, worker: str | None = None
    ) -> tuple[list[Finish | None], list[ClaimedPost]]:
        """`finish_many(finishes)`, then `claim(limit)` (none at 0), in one transaction: a
        sender's turn. On PostgreSQL one round trip (the store's `finish_and_claim`).

        A container finished here hands its next head to this claim. A finish that holds a
        place (a gate: a wider hold, a wait announced with a success) is recorded with its gate
        before the claim, which must see it: that turn takes a round trip more.
        """
        resolved = [self.resolve(claim, f) for claim, f in finishes]
        lease = timedelta(seconds=conf.LEASE)
        token = uuid.uuid4().hex
        worker = worker or default_worker()
        limit = max(limit, 0)
        with transaction.atomic(using=self.using, savepoint=False):
            if any(f.holds_place for f in resolved):
                recorded = self._finish_resolved(finishes, resolved, self.clock())
                if not limit:
                    return recorded, []
                now = self.clock()  # a lease runs from its claim
                return recorded, self.store.claim(limit, now, now + lease, token, worker)
            changed, claims = self.store.finish_and_claim(resolved, self.clock, limit, lease, token, worker)
        return [f if ok else None for f, ok in zip(resolved, changed, strict=True)], claims

    def _finish_resolved(
        self, finishes: Sequence[tuple[ClaimedPost, Finish]], resolved: list[Finish], now: datetime
    ) -> list[Finish | None]:
        """Record resolved finishes, and the places they hold (in the caller's transaction)."""
        changed = self.store.finish(resolved, now)
        gates = [
            (
                Scope(f.scope),
                claim.workspace_id,
                claim.container_id,
                now + timedelta(seconds=f.wait or 0),
                f.reason,
            )
            for (claim, _), f, ok in zip(finishes, resolved, changed, strict=True)
            if ok and f.holds_place
        ]
        if gates:
            self.store.hold_places(gates, now)
        return [f if ok else None for f, ok in zip(resolved, changed, strict=True)]

    def _record(self, claim: ClaimedPost, f: Finish) -> bool:
        [recorded] = self.finish_many([(claim, f)])
        return recorded is not None

    def resolve(self, claim: ClaimedPost, f: Finish) -> Finish:
        """The plain, storable form of a finish, as it will be recorded on either path.

        Found one-offs are posted; on the last attempt a retry fails; a retry without a wait
        takes the backoff; a claim given back goes back to the queue, or stays stale; then the
        answer is made storable (answers.py: refs, reasons, MAX_HOLD).
        """
        if f.scope and f.scope not in Scope.values:
            raise ValueError(f"a hold's scope is one of {', '.join(Scope.values)}, not {plain(f.scope)}")
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
                raise ValueError(f"settle() takes 'failed' or 'uncertain', not {plain(f.state)}")
            case Action.DROP if claim.kind != Kind.DELETE:
                raise ValueError(f"only a delete is dropped, not a {claim.kind}")
            case Action.FOUND | Action.RETRY | Action.HOLD | Action.SETTLE | Action.LEAVE | Action.DROP:
                pass
            case _:
                raise ValueError(f"unknown finish action {f.action!r}")
        return storable(f)

    def backoff(self, attempts: int) -> float:
        """Seconds to wait after the `attempts`-th failed try, jittered down by up to RETRY_JITTER."""
        delay: float = min(conf.RETRY_BASE * 2 ** max(attempts - 1, 0), conf.RETRY_MAX)
        jitter = conf.RETRY_JITTER
        return delay * random.uniform(1 - jitter, 1) if jitter else delay

    def next_due(self) -> datetime | None:
        """When the earliest head of this source may be claimable (its due time, past the holds
        and paces that keep it), or None without heads."""
        return self.store.next_due(self.clock())

    def kept_by_pace(self) -> bool:
        """Whether a head of this source is due now and no hold reaches it: asked after a claim
        that took nothing, only a pace can keep it (DELIVERY "immediate" waits for its slot)."""
        now = self.clock()
        return bool(Lane.objects.using(self.using).of_source(self.source).due(now).unheld(now).exists())

    # -- operators ------------------------------------------------------------------------

    def queue_health(self) -> tuple[int, datetime | None]:
        """How many posts are active, and since when the oldest due one has held its place."""
        oldest = self.oldest_due()
        return self._posts().active().count(), oldest[1] if oldest else None

    def oldest_due(self) -> tuple[str, datetime] | None:
        """The due queued post that has held its place longest: (post_id, queued_at)."""
        row: tuple[str, datetime] | None = (
            self._posts().oldest_due(self.clock()).values_list("post_id", "queued_at").first()
        )
        return row

    def state_counts(self, states: Iterable[str] = tuple(State)) -> dict[str, int]:
        """How many of this source's posts are in each of `states`.

        One count per state, each a range of the (source, state, queued_at) index (`sending`:
        the lanes that hold a lease): cheaper than a GROUP BY that reads every row, and a caller
        that skips `posted` skips its bulk.
        """
        return {state: self._posts().in_state(state).count() for state in states}

    def holds(self, limit: int = 20) -> tuple[int, list[HeldPost]]:
        """Queued posts that wait past now after a retry or a hold (their container waits with
        them): how many, and the `limit` due last, with why (their latest error).

        A delayed post waits too, but in its place (its queue time is its due time); a post
        that was tried and sent back waits past the place it keeps.
        """
        now = self.clock()
        waiting = self._posts().sent_back(now)
        fields = ("post_id", "workspace_id", "container_id", "next_at", "attempts", "last_error")
        rows = waiting.order_by("-next_at", "post_id").values_list(*fields)[:limit]
        return waiting.count(), [HeldPost(*row) for row in rows]

    def gate_holds(self, limit: int = 20) -> tuple[dict[str, int], list[GateHold]]:
        """The places of this source held past now (`hold(scope=...)`, a wait announced with a
        success): how many of each scope ("source", "workspace", "container", widest first), and
        the `limit` widest, each scope's ending last first, with until when and why.

        Their posts are not listed by `holds`: they keep their own due time and place, and only
        their claim waits for the place. Two short reads of the gates in force, by the rule the
        claim reads them by (GateQuerySet.holding); the list is left out when `limit` is 0.
        """
        held = Gate.objects.using(self.using).of_source(self.source).holding(self.clock())
        found = dict(held.order_by().values("scope").annotate(n=Count("pk")).values_list("scope", "n"))
        counts = {scope.value: found.get(scope, 0) for scope in SCOPES_WIDEST_FIRST}
        if limit <= 0 or not any(counts.values()):
            return counts, []
        width = Case(*(When(scope=scope, then=Value(i)) for i, scope in enumerate(SCOPES_WIDEST_FIRST)))
        fields = ("scope", "workspace_id", "container_id", "held_until", "hold_reason")
        rows = held.order_by(width, "-held_until", "workspace_id", "container_id").values_list(*fields)
        return counts, [GateHold(*row) for row in rows[:limit]]

    def failures(self, limit: int = 10, examples: int = 3) -> Failures:
        """Failed and uncertain posts grouped by state and reason (their latest error): how
        many posts and groups in all, and the `limit` groups that failed most recently, each
        with its count, when its latest post ended and `examples` of its post ids, the latest first.

        One GROUP BY over this source's failed and uncertain posts (the index by source and
        state: they are few, and pruned after ATTENTION_RETENTION), then a short read per group.
        """
        failed = self._posts().retryable()
        groups = (
            failed.order_by()
            .values("state", "last_error")
            .annotate(n=Count("pk"), newest=Max("updated_at"))
            .order_by("-newest", "state", "last_error")
        )
        rows = list(groups.values_list("state", "last_error", "n", "newest"))
        found = []
        for state, reason, n, newest in rows[: max(limit, 0)]:
            ids = failed.filter(state=state, last_error=reason).order_by("-updated_at", "-pk")
            post_ids = list(ids.values_list("post_id", flat=True)[:examples])
            found.append(FailureGroup(state, reason, n, newest, post_ids))
        return Failures(sum(row[2] for row in rows), len(rows), found)

    # -- housekeeping ---------------------------------------------------------------------

    def prune_finished(
        self,
        retention: float | timedelta | None = None,
        *,
        attention_retention: float | timedelta | None = None,
        status_retention: float | timedelta | None = None,
    ) -> int:
        """Delete finished one-off posts last changed before now - retention; how many.

        Failed and uncertain posts are kept for `attention_retention` if given (housekeeping
        and `outbox_prune` give `attention_retention()`), else like the others (the contract).
        Finished status posts go after `status_retention` if given (housekeeping and
        `outbox_prune` give STATUS_RETENTION), else never (the contract). The lanes left
        idle go too (`prune`).
        """
        return self.prune(
            retention, attention_retention=attention_retention, status_retention=status_retention
        ).posts

    def prune(
        self,
        retention: float | timedelta | None = None,
        *,
        attention_retention: float | timedelta | None = None,
        status_retention: float | timedelta | None = None,
    ) -> Pruned:
        """`prune_finished`, then every lane idle for `retention` (`prune_lanes`): how many of each."""
        posts = 0
        while True:
            batch = self.prune_some(
                retention, attention_retention=attention_retention, status_retention=status_retention
            )
            posts += batch
            if batch < PRUNE_BATCH:
                break
        lanes = 0
        after: int | None = 0
        while after is not None:
            after, deleted = self.prune_lanes(retention, after)
            lanes += deleted
        return Pruned(posts, lanes)

    # -- rows -------------------------------------------------------------------------------

    def _posts(self) -> Any:
        return Post.objects.using(self.using).filter(source=self.source)

    @staticmethod
    def _fields(post: Mapping[str, Any]) -> dict[str, Any]:
        """A post given to queue_many as queue's keywords; InvalidPost for unknown or missing
        keys (first: a typo, "workspace", would otherwise be reported as the field it
        misspells being None)."""
        fields = dict(post)
        named = repr(fields.get("post_id"))
        unknown = sorted(map(str, set(fields) - set(POST_FIELDS)))
        if unknown:
            plural = "s" if len(unknown) > 1 else ""
            raise InvalidPost(
                f"post {named}: unknown field{plural} {', '.join(unknown)}; known: {', '.join(POST_FIELDS)}"
            )
        missing = [name for name in REQUIRED_FIELDS if name not in fields]
        if missing:
            verb = "is" if len(missing) == 1 else "are"
            raise InvalidPost(f"post {named}: {', '.join(missing)} {verb} required")
        return fields

    def _new_post(
        self,
        now: datetime,
        accepted: frozenset[str],
        max_bytes: int,
        *,
        post_id: Any,
        workspace_id: Any,
        container_id: Any,
        body: Any,
        thread_id: Any = "",
        kind: Any = Kind.MESSAGE,
        turn_key: Any = None,
        delay: Any = None,
        thread_of: Any = None,
        status: bool = False,
    ) -> NewPost:
        """A validated post; InvalidPost names the post id and the field. `accepted`: the
        kinds of the source (conf.kinds), `max_bytes`: MAX_BODY_BYTES, read once per call."""
        check_place(
            post_id, workspace_id, container_id, thread_id, turn_key,
            workspace_required=conf.workspace_required(self.source),
        )  # fmt: skip
        if kind == Kind.STATUS and not status:
            raise InvalidPost(f"post {post_id!r}: kind 'status' is queued with set_status(), not queue()")
        check_kind(post_id, kind, accepted)
        if (message := message_in(post_id, body)) is not None:
            body = self._message_body(post_id, kind, message)
        body_json = clean_body(post_id, body, max_bytes)
        if delay is None:
            due = now
        else:
            seconds = clean_delay(post_id, delay)
            try:
                due = now + timedelta(seconds=seconds)
            except OverflowError as e:
                raise InvalidPost(f"post {post_id!r}: delay {seconds!r} is too long") from e
        if thread_of is not None:
            check_reply(post_id, thread_of, thread_id, kind)
        return NewPost(
            post_id, workspace_id, container_id, thread_id, str(kind), body_json, turn_key, due, thread_of
        )

    def _message_body(self, post_id: str, kind: str, message: Message) -> dict[str, Any]:
        """The body that stores `message`, once this source can show it: InvalidPost names
        the field and the limit of its platform otherwise (its connector's `message_problem`)."""
        check_message(post_id, kind, message)
        if problem := conf.message_check(self.source)(message):
            raise InvalidPost(f"post {post_id!r}: {problem}")
        return message.as_body()

    def check_parents(self, rows: Sequence[NewPost]) -> None:
        """InvalidPost for a reply (`thread_of`) whose parent is not an earlier post of its
        container that comes before it in the container's order: queued before it (and, while
        it waits, due no later: a delayed parent due after its reply would leave the reply its
        container's head, waiting for a parent queued behind it), or earlier in this batch (no
        later in queue order: due no later). A parent that is a reaction or an ephemeral has no
        thread. A reply whose own id exists already is not checked: it is not queued again.

        One read, of the parents and the replies' ids, before anything is written. A parent
        that moves to the back of its queue after this check (a status set again, an
        operator's retry) is met by the sender, which never sends a reply before its parent's
        message exists (it fails it, naming the parent)."""
        replies = [row for row in rows if row.thread_of is not None]
        if not replies:
            return
        wanted = {row.thread_of for row in replies} | {row.post_id for row in replies}
        fields = ("post_id", "workspace_id", "container_id", "kind", "state", "queued_at")
        stored = {row[0]: row for row in self._posts().filter(post_id__in=wanted).values_list(*fields)}
        earlier: dict[str, tuple[str, str, str, str, str, datetime]] = {}
        for row in rows:
            if row.thread_of is not None and row.post_id not in stored:
                parent = earlier.get(row.thread_of) or stored.get(row.thread_of)
                check_parent(row, parent)
            if row.post_id not in stored:  # the first of two equal ids wins, as in _insert
                earlier.setdefault(
                    row.post_id,
                    (row.post_id, row.workspace_id, row.container_id, row.kind, State.QUEUED, row.due),
                )

    def _insert(self, now: datetime, rows: list[NewPost]) -> int:
        """Insert the posts whose ids are new and make them heads where they come first."""
        if len(rows) > 1:
            unique: dict[str, NewPost] = {}
            for row in rows:
                unique.setdefault(row.post_id, row)  # the first of two equal ids wins, as with queue()
            rows = list(unique.values())
        inserted = self.store.insert(rows, now)
        if inserted:
            self._announce_queued()
        return inserted

    def _announce_queued(self) -> None:
        """Say that posts were queued: with DELIVERY "immediate" (development), immediate.py
        drains this source once the caller's transaction commits."""
        signals.posts_queued.send(sender=Outbox, source=self.source, using=self.using)

    def prune_some(
        self,
        retention: float | timedelta | None = None,
        limit: int = PRUNE_BATCH,
        *,
        attention_retention: float | timedelta | None = None,
        status_retention: float | timedelta | None = None,
    ) -> int:
        """One short transaction of `prune_finished`'s posts: at most `limit` deleted; how many.

        For housekeeping, which spreads a large backlog over several turns so that no turn holds
        the sender (or the posts' locks) for long. Fewer than `limit`: nothing was left to prune,
        unless some changed state meanwhile (an operator's retry); the next run takes those.
        """
        cutoff, attention_cutoff, status_cutoff = self._prune_cutoffs(
            retention, attention_retention, status_retention
        )
        with transaction.atomic(using=self.using, savepoint=False):
            deleted = self.store.prune(cutoff, attention_cutoff, status_cutoff, limit)
            if deleted < limit:  # the run's last batch: the gates idle since the cutoff go too,
                self.store.prune_gates(cutoff)
                # and the history of posts that stay, kept as long as failed posts are
                self.store.prune_history(min(cutoff, attention_cutoff), limit)
            return deleted

    def prune_lanes(
        self, retention: float | timedelta | None = None, after: int = 0, limit: int = PRUNE_BATCH
    ) -> tuple[int | None, int]:
        """One short transaction of `prune`'s lanes: check this source's next `limit` lanes (by
        id, after `after`) and delete those idle for `retention` (default RETENTION; see
        models: no post, and no pace since); the last lane id checked (None when no lane is
        left after it: the walk is over) and how many were deleted.

        Run after the posts' pruning, which is what leaves lanes without posts. A container
        whose lane is gone gets a new one with its next post, with no pace state.
        """
        cutoff, _, _ = self._prune_cutoffs(retention, None, None)
        with transaction.atomic(using=self.using, savepoint=False):
            return self.store.prune_lanes(cutoff, after, limit)

    def prunable(
        self,
        retention: float | timedelta | None = None,
        *,
        attention_retention: float | timedelta | None = None,
        status_retention: float | timedelta | None = None,
    ) -> dict[str, int]:
        """What `prune` would delete now, changing nothing: how many one-off posts of each
        finished state, how many finished status posts ("status"), and how many lanes
        ("lanes": those idle now or once these posts are gone)."""
        cutoffs = self._prune_cutoffs(retention, attention_retention, status_retention)
        rows = (
            self.store.prunable(*cutoffs)
            .order_by()
            .values("kind", "state")
            .annotate(n=Count("pk"))
            .values_list("kind", "state", "n")
        )
        counts = dict.fromkeys([*FINISHED_STATES, "status"], 0)
        for kind, state, n in rows:
            counts["status" if kind == Kind.STATUS else state] += n
        counts["lanes"] = self.store.prunable_lanes(*cutoffs).count()
        return counts

    @staticmethod
    def attention_retention() -> float:
        """How long failed and uncertain posts wait for a person: ATTENTION_RETENTION, never
        less than RETENTION."""
        return max(conf.ATTENTION_RETENTION, conf.RETENTION)

    def _prune_cutoffs(
        self,
        retention: float | timedelta | None,
        attention_retention: float | timedelta | None,
        status_retention: float | timedelta | None,
    ) -> tuple[datetime, datetime, datetime | None]:
        """The cutoffs of posted and cancelled posts (and of idle lanes), of failed and
        uncertain ones, and of finished status posts (None: kept). A `retention` given alone
        applies to every finished one-off post (the contract's `prune_finished(retention)`),
        as does the default; housekeeping and `outbox_prune` pass ATTENTION_RETENTION
        (`attention_retention()`) for failed and uncertain posts and STATUS_RETENTION."""
        keep = conf.RETENTION if retention is None else seconds(retention)
        attention = keep if attention_retention is None else seconds(attention_retention)
        now = self.clock()
        status = None if status_retention is None else now - timedelta(seconds=seconds(status_retention))
        return now - timedelta(seconds=keep), now - timedelta(seconds=attention), status

    def repair_lanes(self, after: int = 0, limit: int = REPAIR_BATCH) -> tuple[int | None, list[LaneRepair]]:
        """Check this source's next `limit` lanes (by id, after `after`) against their posts.

        A lane is derived state: if its head or due time is not what `models.head_rule` says (a bug,
        a manual UPDATE, a restore from a backup), its container would wait for ever. Lanes
        that differ are locked, recomputed under their lock and written; returns the last lane
        id checked (None when no lane is left after it: start again from 0) and the repairs.
        """
        return self.store.repair(after, limit)
