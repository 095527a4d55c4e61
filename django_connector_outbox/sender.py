"""The sender loop behind ``manage.py run_outbox``: claim -> look up stale -> send -> record.

One thread (the caller's) does all database work, through the Outbox: record what finished,
claim the next heads (one transaction, one commit per turn: `Outbox.finish_and_claim`, on
PostgreSQL one round trip before the commit), housekeeping. Platform calls run as coroutines
(`adeliver`) on an engine (engine.py): one event loop in a thread of its own by default, so
thousands of sends can be in flight and a slow platform never holds a transaction open.

Invariants:
- A claim starts at once or is given back: the sender claims no more heads than it has free
  send slots (for a connector with blocking sends only, free threads), so no claim waits
  while its lease runs, and `deliver` checks before each
  platform call that the lease outlives it (else the claim is given back, a stale one staying
  stale). A claim is therefore never sent after another sender may have taken it back.
- The delivery never touches the database, and runs no receiver: `post_sent` and the outcome
  signals are sent from the sender's thread, where receivers may use the ORM.
- A send that outlives half its lease keeps its claim: the sender renews the leases of its
  claims in flight before they end (leases.py), and a delivery reads the renewed end only
  once it is committed.
- Results leave memory only once committed: if the database goes away, every result is
  recorded when it is back (the lease fences any claim taken back meanwhile).
- One turn never blocks: `turn()` says how long the loop may wait, and `run()` waits. A test
  harness drives `turn()` itself, with its own executor and clock (the seams): each delivery
  then runs to its end as one call on the executor (engine.ExecutorEngine).
- Group commit: results wait at most `group_window` (on the sender's clock) for the sends
  still in flight, so that one commit records many; they are recorded at once when nothing
  else is in flight, when a batch of them is ready, or when the sender stops. The window
  delays only the recording: no lease or lane lock is held longer, and a claim's lease
  already covers its send plus the window many times over (E009).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from itertools import groupby
from typing import NamedTuple

from django.db import (
    DatabaseError,
    InterfaceError,
    OperationalError,
    ProgrammingError,
    connections,
    transaction,
)
from django.dispatch import Signal
from django.utils import timezone

from django_connector_outbox import signals
from django_connector_outbox.conf import conf
from django_connector_outbox.connectors import CannotCheck, CheckLater, Connector, connectors
from django_connector_outbox.connectors.base import (
    Delivered,
    Hold,
    MaybeSent,
    NotStarted,
    RateLimited,
    Refused,
    RetryLater,
    blocking,
    native,
    sends_in_threads,
)
from django_connector_outbox.engine import BLOCKING_THREADS, ExecutorEngine, LoopEngine
from django_connector_outbox.health import NotMigrated, missing_tables
from django_connector_outbox.heartbeat import Pulse
from django_connector_outbox.housekeeping import Housekeeper
from django_connector_outbox.leases import Leases
from django_connector_outbox.outbox import Clock, Outbox, default_worker
from django_connector_outbox.posts import Action, ClaimedPost, Finish, Kind, Outcome, Scope, State
from django_connector_outbox.validation import id_flaw
from django_connector_outbox.wakeup import Wakeup

logger = logging.getLogger("django_connector_outbox.sender")

SUMMARY_INTERVAL = 60.0
# The pause before looking again at heads that are due but were not claimable (another
# sender's, or kept by a workspace's pace).
BUSY_PAUSE = 0.05
# How long finished sends wait for the others in flight before they are recorded together.
GROUP_WINDOW = 0.005
# Sends in flight at once. A real send takes 50-300 ms, so a sender delivers at most
# CONCURRENCY / latency posts/s: 1,000 puts 3,000-20,000 posts/s within reach of one sender,
# and a send in flight costs a task, not a thread (bench/README.md, "defaults"). A connector
# with blocking methods only is bounded by engine.BLOCKING_THREADS besides.
CONCURRENCY = 1000
# Waits between reconnection attempts while the database is away.
RECONNECT_WAITS = (0.1, 0.5, 1.0, 2.0, 5.0)
# What a connector may raise that still stops the sender: the operator's ^C and sys.exit().
# Any other BaseException out of `send` or `find_sent` (asyncio.CancelledError from an async
# SDK run with asyncio.run, a library's own) is that post's failure, like an Exception: it
# must not end the loop and leave its posts waiting for their leases.
STOPPING = (KeyboardInterrupt, SystemExit)


class Report(NamedTuple):
    """How the sender reports one outcome the outbox recorded: a summary counter and a signal."""

    # The summary counter it adds to, and the outcome its signal stands for (signals.OUTCOME_SIGNALS).
    counter: Outcome
    # The signal's keyword arguments: (argument name, Finish field).
    arguments: tuple[tuple[str, str], ...]

    @property
    def signal(self) -> Signal | None:
        return signals.OUTCOME_SIGNALS.get(self.counter)


REASON = (("reason", "reason"),)
# Keyed by Finish.recorded: a post found in the source is reported as posted.
REPORTS: dict[Outcome, Report] = {
    Outcome.POSTED: Report(Outcome.POSTED, (("message_ref", "message_ref"),)),
    Outcome.FOUND: Report(Outcome.POSTED, (("message_ref", "message_ref"),)),
    Outcome.RETRIED: Report(Outcome.RETRIED, REASON),
    Outcome.HELD: Report(Outcome.HELD, (*REASON, ("after", "wait"), ("scope", "scope"))),
    Outcome.FAILED: Report(Outcome.FAILED, REASON),
    Outcome.UNCERTAIN: Report(Outcome.UNCERTAIN, REASON),
    Outcome.LOST_REPLY: Report(Outcome.LOST_REPLY, REASON),
    Outcome.GIVEN_BACK: Report(Outcome.GIVEN_BACK, ()),
    Outcome.DROPPED: Report(Outcome.DROPPED, REASON),
}


def held_counter(scope: str) -> str:
    """The summary counter of the holds of a scope wider than a container ("held_workspace",
    "held_source"): counted within `held` too. A hold is one outcome whatever its scope."""
    return f"{Outcome.HELD.value}_{scope}"


# The summary line's counters: what the sender reported, in Outcome's order, the wider holds
# after `held`; then the sender's own troubles.
SUMMARY_COUNTERS: tuple[str, ...] = (
    Outcome.POSTED, Outcome.RETRIED, Outcome.HELD, held_counter(Scope.WORKSPACE), held_counter(Scope.SOURCE),
    Outcome.FAILED, Outcome.UNCERTAIN, Outcome.LOST_REPLY, Outcome.GIVEN_BACK, Outcome.DROPPED,
    "fenced", "unrecorded", "housekeeping_errors",
)  # fmt: skip


def finish(
    claim: ClaimedPost,
    action: Action,
    *,
    message_ref: str | None = None,
    wait: float | None = None,
    reason: str = "",
    state: str = "",
    scope: str = "",
) -> Finish:
    # A reply delivered (or found) keeps the thread it was resolved into (`in_thread`).
    delivered_reply = claim.parent is not None and action in (Action.POSTED, Action.FOUND)
    return Finish(
        claim.post_id,
        claim.lease_token,
        action,
        message_ref=message_ref,
        wait=wait,
        reason=reason,
        state=state,
        scope=scope,
        thread_id=claim.thread_id if delivered_reply else None,
    )


async def in_thread(connector: Connector, claim: ClaimedPost) -> ClaimedPost | Finish:
    """A reply (`thread_of`) with its `thread_id` resolved from its parent, or what to record
    when it cannot be: failed at once when the parent has no message to reply to (it ended
    without one, or went back behind it in the queue, or is gone), a retry when the connector's
    `reply_thread` raised or gave no thread id. Never sent without its parent's thread: a
    reply never lands outside it, nor before its parent's message exists."""
    parent = claim.parent
    assert parent is not None
    if not parent.message_ref:
        if not parent.state:
            why = "is gone (pruned before it was sent)"
        elif parent.state == State.POSTED:  # a platform that gives no id (a webhook without one)
            why = "was posted without a message id to reply to"
        elif parent.state in (State.QUEUED, State.SENDING):
            why = f"has no message yet: it went back behind it in the queue ({parent.state})"
        else:
            why = f"ended without a message ({parent.state})"
        reason = f"its thread's parent {parent.post_id} {why}"
        return finish(claim, Action.SETTLE, state=State.FAILED, reason=reason)
    try:
        if type(connector).reply_thread is Connector.reply_thread:  # no platform call
            thread = connector.reply_thread(parent)
        else:
            thread = await blocking(connector.reply_thread, parent)
    except NotStarted:
        return finish(claim, Action.GIVE_BACK, reason="given back: sender stopping")
    except STOPPING:
        raise
    except BaseException as e:  # asyncio.CancelledError too: see STOPPING
        logger.exception("reply_thread raised post_id=%s source=%s", claim.post_id, claim.source)
        return finish(claim, Action.RETRY, reason=f"reply_thread raised {e!r}")
    if flaw := id_flaw(thread):
        logger.error("reply_thread returned %r, not a thread id post_id=%s", thread, claim.post_id)
        return finish(claim, Action.RETRY, reason=f"reply_thread of {parent.post_id}: the thread id {flaw}")
    return replace(claim, thread_id=thread)


def to_delete(claim: ClaimedPost) -> ClaimedPost | Finish:
    """A retract's delete with the message it deletes: the `message_ref` (and thread) of its
    post (its `parent`) as that post ended, or the ref the delete was queued with when the post
    is gone; dropped (cancelled, unsent) when there is no message to delete: the send that was
    in flight when it was retracted failed, or left no ref."""
    target = claim.parent
    assert target is not None
    ref = target.message_ref or claim.message_ref
    if not ref:
        state = target.state or "pruned"
        return finish(
            claim,
            Action.DROP,
            reason=f"nothing to delete: {target.post_id} ended without a message ({state})",
        )
    return replace(claim, message_ref=ref, thread_id=target.thread_id if target.state else claim.thread_id)


def look_again(outbox: Outbox, claim: ClaimedPost, what: str, detail: str) -> Finish:
    """A lookup that could not tell: left to be looked up after its lease, except on the last
    attempt, where the post becomes uncertain (never sent blind). Nothing of it is in flight:
    its last send ended with the lease that was taken back."""
    if outbox.out_of_attempts(claim):
        reason = f"may have been sent, {what} on the last attempt: {detail}"
        return finish(claim, Action.SETTLE, state=State.UNCERTAIN, reason=reason)
    return finish(claim, Action.LEAVE, reason=f"{what}, will look again: {detail}")


def repeatable(claim: ClaimedPost) -> bool:
    """Whether sending the claim twice shows the same as once, so that a stale one is sent
    again without a lookup: an edit of a status's message (a ref), or a delete (deleting a
    message deleted already changes nothing; a lookup could not see a delete, and a source
    that cannot check would make it uncertain for nothing)."""
    return claim.kind == Kind.DELETE or (claim.kind == Kind.STATUS and bool(claim.message_ref))


@dataclass(eq=False)
class Sending:
    """A claim in flight, and what its delivery tells the sender besides its result: the
    claim as sent and the send's seconds (for `post_sent`), once a send was made. Its lease
    ends at `lease_until`, which the sender moves on when it renews the lease (leases.py)."""

    outbox: Outbox
    claim: ClaimedPost
    sent: tuple[ClaimedPost, float] | None = None
    lease_until: datetime = field(init=False)

    def __post_init__(self) -> None:
        self.lease_until = self.claim.lease_until


async def adeliver(sending: Sending, connector: Connector, clock: Clock) -> Finish:
    """Look a stale claim up, then send it if it may be sent: what the outbox is to record.

    Runs on the engine and never touches the database. A platform call starts only while
    the lease outlives it (a lookup may take `lookup_requests` requests of up to `timeout`).
    """
    outbox, claim = sending.outbox, sending.claim
    timeout = timedelta(seconds=connector.timeout or 0)

    def lease_too_short(calls: int) -> bool:
        return clock() + timeout * calls >= sending.lease_until

    if claim.kind == Kind.DELETE:  # its parent is the post whose message it deletes
        deleting = to_delete(claim)
        if isinstance(deleting, Finish):
            return deleting
        claim = deleting
    elif claim.parent is not None:  # a reply: into its parent's thread, for the lookup and the send
        if lease_too_short(1):  # resolving may ask the platform (Discord starts the thread)
            return finish(
                claim, Action.GIVE_BACK, reason="given back: the lease ends before its thread is found"
            )
        resolved = await in_thread(connector, claim)
        if isinstance(resolved, Finish):
            return resolved
        claim = resolved
    try:  # a Message becomes the platform's body here, once, for the lookup and the send
        claim = native(connector, claim)
    except STOPPING:
        raise
    except Exception as e:
        logger.exception("render raised post_id=%s source=%s", claim.post_id, claim.source)
        if claim.stale:  # it may be in the source (rendered by an older release): never resent blind
            return look_again(outbox, claim, "render raised", repr(e))
        return finish(claim, Action.RETRY, reason=f"render raised {e!r}")
    if claim.stale and not repeatable(claim):
        # It may have reached the platform before its sender died or lost the reply:
        # look before sending again.
        if lease_too_short(connector.lookup_requests):
            return finish(claim, Action.GIVE_BACK, reason="given back: the lease ends before a lookup could")
        try:
            found = await connector.afind_sent(claim)
        except NotStarted:
            return finish(claim, Action.GIVE_BACK, reason="given back: sender stopping")
        except CannotCheck as e:
            return finish(
                claim, Action.SETTLE, state=State.UNCERTAIN, reason=f"may have been sent, cannot check: {e}"
            )
        except CheckLater as e:
            return look_again(outbox, claim, "lookup failed", str(e))
        except STOPPING:
            raise
        except BaseException as e:  # asyncio.CancelledError too: see STOPPING
            logger.exception("find_sent raised post_id=%s source=%s", claim.post_id, claim.source)
            return look_again(outbox, claim, "lookup raised", repr(e))
        if found is not None:
            return finish(claim, Action.FOUND, message_ref=found)
    if not outbox.may_send(claim):
        reason = f"out of attempts ({claim.attempts}): not in the source, and not sent again"
        return finish(claim, Action.SETTLE, state=State.FAILED, reason=reason)
    if lease_too_short(1):
        return finish(claim, Action.GIVE_BACK, reason="given back: the lease ends before a send could")
    started = time.perf_counter()
    try:
        outcome = await connector.asend(claim)
    except NotStarted:  # refused before it started: nothing was sent
        return finish(claim, Action.GIVE_BACK, reason="given back: sender stopping")
    except STOPPING:
        raise
    except BaseException as e:  # asyncio.CancelledError too: see STOPPING
        logger.exception("send raised post_id=%s source=%s", claim.post_id, claim.source)
        sending.sent = (claim, time.perf_counter() - started)
        return finish(claim, Action.RETRY, reason=f"send raised {e!r}")
    sending.sent = (claim, time.perf_counter() - started)
    match outcome:
        case Delivered(message_ref=ref, hold=None):
            return finish(claim, Action.POSTED, message_ref=ref)
        case Delivered(message_ref=ref, hold=Hold() as hold):  # posted; wait before the next
            return finish(
                claim, Action.POSTED, message_ref=ref, wait=hold.after, reason=hold.reason, scope=hold.scope
            )
        case RetryLater(reason=reason, after=after):
            return finish(claim, Action.RETRY, reason=reason, wait=after)
        case RateLimited(after=after, reason=reason, scope=scope):
            return finish(claim, Action.HOLD, reason=reason or "rate limited", wait=after, scope=scope)
        case Refused(reason=reason):
            return finish(claim, Action.SETTLE, state=State.FAILED, reason=reason)
        case MaybeSent(reason=reason):
            return finish(claim, Action.LEAVE, reason=reason or "reply lost")
    logger.error("send returned %r, not an outcome post_id=%s", outcome, claim.post_id)
    return finish(claim, Action.RETRY, reason=f"connector returned {outcome!r}, not an outcome")


class Sender:
    """Claims due posts of its sources and delivers them until stopped."""

    def __init__(
        self,
        sources: Iterable[str] | None = None,
        *,
        using: str = "default",
        concurrency: int = CONCURRENCY,
        batch: int | None = None,
        poll: float | None = None,
        worker: str | None = None,
        once: bool = False,
        clock: Clock | None = None,
        executor: Executor | None = None,
        summary_interval: float = SUMMARY_INTERVAL,
        group_window: float = GROUP_WINDOW,
        heartbeat: bool = False,
    ) -> None:
        names = list(sources) if sources else sorted(conf.CONNECTORS)
        self.outboxes = [Outbox(name, using=using, clock=clock) for name in names]
        self._paced = any(conf.pace(name) for name in names)
        self.using = using
        self.concurrency = concurrency
        self.batch = batch or conf.CLAIM_BATCH
        self.poll = conf.POLL_INTERVAL if poll is None else poll
        self.worker = worker or default_worker()
        self.once = once
        self.clock: Clock = clock or timezone.now
        self.summary_interval = summary_interval
        self.group_window = timedelta(seconds=group_window)
        self.stats: Counter[str] = Counter()
        self.wakeup = Wakeup(using, self.poll)
        # Housekeeping runs on the sender's clock when it is given one (a simulation's), so that
        # its periods pass in that time; on the monotonic clock otherwise.
        ticks = (lambda: self.clock().timestamp()) if clock else time.monotonic
        self.housekeeper = Housekeeper(self.outboxes, using, monotonic=ticks, stats=self.stats)
        # Its row in the senders' table (`heartbeat`: run_outbox's senders), written while
        # `run()` runs; not for a delivery in process (DELIVERY "immediate", testing helpers).
        self.pulse = Pulse(self.worker, names, using) if heartbeat else None
        self.engine: LoopEngine[Sending, Finish] | ExecutorEngine[Sending, Finish] = (
            ExecutorEngine(executor, self.wakeup.set)
            if executor
            else LoopEngine(concurrency, self.wakeup.set)
        )
        self._stopping = threading.Event()
        self._forced = threading.Event()
        self._stop_announced = False
        self._turns = 0
        self._failures = 0
        # Results not yet committed (sent while the database was away, or in the turn to come),
        # and when the first of them was kept (the group window runs from then).
        self._unrecorded: deque[tuple[Sending, Finish]] = deque()
        self._gathering_since: datetime | None = None
        self._claimed_all_due = False
        # Sends in flight on the engine's threads, and which sources send there (_sends_in_threads).
        self._in_threads = 0
        self._in_threads_by_source: dict[str, bool] = {}
        self.leases = Leases()

    # -- control --------------------------------------------------------------------------

    def stop(self) -> None:
        """First call: stop claiming and finish what is in flight. Second call: stop now."""
        if self._stopping.is_set():
            self._forced.set()
        self._stopping.set()
        self.wakeup.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    @property
    def in_flight(self) -> int:
        return self.engine.in_flight

    # -- the loop -------------------------------------------------------------------------

    def run(self) -> None:
        """Turn until done; NotMigrated (before anything is claimed) on a database without the
        outbox's tables."""
        self._check_migrated()
        logger.info(
            "sender started worker=%s sources=%s concurrency=%d batch=%d",
            self.worker, ",".join(o.source for o in self.outboxes), self.concurrency, self.batch,
        )  # fmt: skip
        if not self.once:  # --once never idles: nothing to be woken from
            self.wakeup.start()
        if self.pulse:
            self.pulse.start()
        next_summary = time.monotonic() + self.summary_interval
        try:
            while (pause := self.turn()) is not None:
                if pause > 0:
                    self.wakeup.wait(None if math.isinf(pause) else pause)
                if time.monotonic() >= next_summary:
                    self._summary()
                    next_summary = time.monotonic() + self.summary_interval
        finally:
            self.close()

    def turn(self) -> float | None:
        """One turn, never blocking: record the sends that finished, claim heads for the free
        send slots and start them.

        Returns None when the sender is done (stopped with nothing in flight, or `once` with
        nothing due); otherwise the longest the loop may wait before the next turn (0: at once;
        inf: until woken). A finished send, a NOTIFY and `stop()` wake it earlier.
        """
        if self._forced.is_set():
            return None
        # Cleared before looking for work: a wake-up that comes while we look is not lost.
        self.wakeup.clear()
        self._collect()
        if (gather := self._gather()) is not None:
            return gather
        try:
            if self.pulse:
                self.pulse.beat(self.stats[Outcome.POSTED], self.engine.in_flight, self.engine.loop_lag)
            if not self.stopping:
                self.housekeeper.tick()
            self.leases.renew(self.clock())
            claimed = self._record(claim=not self.stopping)
            pause = self._pause(claimed)
        except (OperationalError, InterfaceError) as e:
            self._check_migrated()  # SQLite's "no such table" is an OperationalError too
            return self._database_away(e)
        except ProgrammingError:
            self._check_migrated()  # PostgreSQL's and MySQL's "no such table" (an idle read)
            raise
        self._failures = 0
        return pause

    def _gather(self) -> float | None:
        """How long to wait for more results before recording these (None: record now)."""
        if not self._unrecorded or self.stopping or self._failures:
            return None
        if not self.in_flight or len(self._unrecorded) >= self.batch:
            return None
        if self._gathering_since is None:
            self._gathering_since = self.clock()
        left = (self._gathering_since + self.group_window - self.clock()).total_seconds()
        return min(left, self.group_window.total_seconds()) if left > 0 else None

    def _pause(self, claimed: int) -> float | None:
        """What `turn` returns after its work (a database read when idle)."""
        if self.stopping:
            self._announce_stop()
            return self._until_renewal() if self.in_flight or self._unrecorded else None
        if self.in_flight >= self.concurrency:
            # Every slot busy: the next finished send wakes the loop, or the next heartbeat, so
            # that a sender whose sends are all long in flight is still seen alive.
            return min(self.pulse.interval if self.pulse else math.inf, self._until_renewal())
        if claimed and not self._claimed_all_due:
            return 0  # room left after a claim that took all it asked for: look again at once
        if self.in_flight:
            # Room, nothing due: a NOTIFY, a finished send or the poll; or a pace's next slot,
            # which comes sooner than a send to a real platform returns (Discord's: every 21 ms).
            return self._until_next_due() if self._paced else self.poll
        if self.once:
            return None
        return self._until_next_due()

    def close(self) -> None:
        """After the loop: give back what did not start, wait for the sends in flight and
        record them (unless forced), then close the connectors and the engine."""
        forced = self._forced.is_set()
        if not forced:
            # Normally the loop has done this already; not when it ended on an error.
            self.engine.refuse_unstarted()
            self.engine.wait()
            self._collect()
            self._try_database(self._record)
        self.engine.close([connectors[outbox.source].aclose for outbox in self.outboxes], forced=forced)
        self.wakeup.close()
        if self.pulse:
            self.pulse.stop()
        self._summary()
        logger.info("sender stopped worker=%s forced=%s", self.worker, forced)

    # -- claiming and sending -------------------------------------------------------------

    def _claim_order(self) -> list[Outbox]:
        """The sources in the order they claim this turn: the first changes every turn."""
        start = self._turns % len(self.outboxes)
        self._turns += 1
        return self.outboxes[start:] + self.outboxes[:start]

    def _claim(
        self, order: list[Outbox], finishing: list[tuple[ClaimedPost, Finish]]
    ) -> tuple[list[Finish | None], list[Sending]]:
        """Record `finishing` (results of the first source in `order`) with that source's first
        claim, and claim heads for the free send slots, shared among the sources: what
        `finishing` recorded (Outbox.finish_and_claim) and the claims.

        Each source may first take an equal share of the room, the first source changing every
        turn, so a due post of one source never waits behind another's backlog; room a source
        leaves goes to those that filled their share.
        """
        room = self.concurrency - self.in_flight
        threads = BLOCKING_THREADS - self._in_threads  # blocking sends that can start at once
        wanting = list(order)
        claimed: list[Sending] = []
        recorded: list[Finish | None] = []
        first = True
        # Whether every source had fewer due heads than asked: then looking again at once would
        # find none (a busy container's next head is leased to us already).
        self._claimed_all_due = False
        while first or (room > 0 and wanting):
            share = max(1, room // len(wanting))
            for outbox in list(wanting):
                in_threads = self._sends_in_threads(outbox)
                # The first claim may take as many heads as it finishes, beyond its share and
                # the batch: the slots are those its finishes free, and the lanes it releases
                # are leased again in the same write (the PostgreSQL store's hand-off).
                kept = len(finishing) if first else 0
                ask = max(
                    min(max(share, kept), room, threads if in_threads else room, max(self.batch, kept)), 0
                )
                if first:  # its finishes and its claim: one round trip on PostgreSQL
                    recorded, claims = outbox.finish_and_claim(finishing, ask, worker=self.worker)
                    first = False
                else:
                    claims = outbox.claim(ask, worker=self.worker) if ask else []
                claimed += [Sending(outbox, claim) for claim in claims]
                room -= len(claims)
                if in_threads:
                    threads -= len(claims)
                    self._in_threads += len(claims)
                if not ask:  # no thread left for its sends
                    wanting.remove(outbox)
                elif len(claims) < ask:
                    wanting.remove(outbox)
                    self._claimed_all_due = not wanting
                if room <= 0:
                    break
        return recorded, claimed

    def _sends_in_threads(self, outbox: Outbox) -> bool:
        """Whether this source's sends each hold one of the engine's threads (a connector with
        a blocking `send` only): then no more of them are claimed than there are threads, so
        that no claim waits for a thread while its lease runs. Not with an executor's engine,
        where the executor decides."""
        if outbox.source not in self._in_threads_by_source:
            connector = connectors[outbox.source]
            self._in_threads_by_source[outbox.source] = isinstance(
                self.engine, LoopEngine
            ) and sends_in_threads(connector)
        return self._in_threads_by_source[outbox.source]

    def _start(self, sendings: list[Sending]) -> None:
        self.leases.add(sendings)
        self.engine.start(
            [
                (sending, functools.partial(adeliver, sending, connectors[sending.outbox.source], self.clock))
                for sending in sendings
            ]
        )

    def _collect(self) -> None:
        """Move what the finished deliveries returned to the results to record, and send
        `post_sent` for each send they made (here, where receivers may use the ORM)."""
        if self.stopping:
            self.engine.refuse_unstarted()  # what has not started is given back
        stop: BaseException | None = None
        for sending, result in self.engine.take():
            self.leases.discard(sending)
            if self._sends_in_threads(sending.outbox):
                self._in_threads -= 1
            if sending.sent is not None:
                signals.announce_sent(Sender, *sending.sent)
            if isinstance(result, STOPPING):  # the operator's ^C or sys.exit() out of a connector
                stop = result  # raised once the others are kept; this claim waits for its lease
                continue
            if isinstance(result, (NotStarted, asyncio.CancelledError)):
                result = finish(sending.claim, Action.GIVE_BACK, reason="given back: sender stopping")
            elif isinstance(result, BaseException):  # adeliver catches the connector's: a bug
                logger.error("deliver raised post_id=%s", sending.claim.post_id, exc_info=result)
                result = finish(sending.claim, Action.RETRY, reason=f"sender error {result!r}")
            self._unrecorded.append((sending, result))
        if stop is not None:
            raise stop

    # -- recording ------------------------------------------------------------------------

    def _record(self, *, claim: bool = False) -> int:
        """Record the kept results and, with `claim`, claim more: one transaction, one commit.

        Claiming in the transaction that finishes a container's head hands its next head to
        this sender at once. Signals are sent, and claims started, after the commit.
        """
        pending = list(self._unrecorded)
        try:
            # (A savepoint only where the caller holds a transaction: in tests, never in run_outbox.)
            with transaction.atomic(using=self.using):
                if claim:
                    recorded, claimed = self._write_and_claim(pending)
                else:
                    recorded, claimed = list(self._write(pending)), []
        except (OperationalError, InterfaceError):
            raise  # the database is away: everything is kept for the next turn
        except Exception:
            self._check_migrated()  # but a database without the tables refuses them all
            # A result the database refuses (an answer nobody foresaw, a bug) must neither stop
            # the sender nor hold the others back: each is recorded on its own.
            logger.exception("could not record a turn's results; recording them one by one")
            recorded, claimed = [self._write_alone(item) for item in pending], []
        for _ in pending:
            self._unrecorded.popleft()
        self._gathering_since = None
        for (sending, result), done in zip(pending, recorded, strict=True):
            self._report(sending.claim, result, done)
        self._start(claimed)
        return len(claimed)

    def _write_and_claim(
        self, pending: list[tuple[Sending, Finish]]
    ) -> tuple[list[Finish | None | Exception], list[Sending]]:
        """Record the results and claim: those of the source that claims first with its claim
        (one round trip on PostgreSQL), the other sources' before, so that every lane lock
        the turn waits for is taken before any claim (claims skip locked lanes, and wait for
        none). Each result as recorded, in the order of `pending`, and the claims."""
        order = self._claim_order()
        first = order[0]
        others = [item for item in pending if item[0].outbox is not first]
        written = iter(self._write(others))
        recorded_first, claimed = self._claim(
            order, [(sending.claim, result) for sending, result in pending if sending.outbox is first]
        )
        with_claim = iter(recorded_first)
        recorded: list[Finish | None | Exception] = [
            next(with_claim) if sending.outbox is first else next(written) for sending, _ in pending
        ]
        return recorded, claimed

    def _write_alone(self, item: tuple[Sending, Finish]) -> Finish | None | Exception:
        """One result in its own transaction; the error, if the database still refuses it."""
        try:
            with transaction.atomic(using=self.using):
                [recorded] = self._write([item])
                return recorded
        except (OperationalError, InterfaceError):
            raise
        except Exception as e:
            return e

    def _write(self, pending: list[tuple[Sending, Finish]]) -> list[Finish | None]:
        """Each result as recorded (resolved by its Outbox), None where the claim was no longer
        current; one finish_many call per run of one source."""
        recorded: list[Finish | None] = []
        for outbox, run in groupby(pending, key=lambda item: item[0].outbox):
            recorded += outbox.finish_many([(sending.claim, result) for sending, result in run])
        return recorded

    def _report(self, claim: ClaimedPost, result: Finish, recorded: Finish | None | Exception) -> None:
        if isinstance(recorded, Exception):
            # Left as it is: after its lease it is claimed back stale and looked up.
            self.stats["unrecorded"] += 1
            logger.error(
                "could not record post_id=%s action=%s error=%r: left to be looked up after its lease",
                claim.post_id, result.action, str(recorded),
            )  # fmt: skip
            return
        if recorded is None:
            self.stats["fenced"] += 1
            logger.info("claim no longer current post_id=%s action=%s", claim.post_id, result.action)
            return
        if recorded.thread_id is not None:  # a reply: the signals see the thread it went into
            claim = replace(claim, thread_id=recorded.thread_id)
        report = REPORTS[recorded.recorded]
        self.stats[report.counter] += 1
        if recorded.holds_place and recorded.action == Action.HOLD:  # `held` counts them all
            self.stats[held_counter(recorded.scope)] += 1
        if report.signal is not None:
            arguments = {name: getattr(recorded, field) for name, field in report.arguments}
            report.signal.send(sender=Sender, claim=claim, **arguments)

    # -- idle, trouble and shutdown -------------------------------------------------------

    def _until_renewal(self) -> float:
        """Seconds until a lease in flight is to be renewed (inf: none in flight)."""
        renewal = self.leases.until_renewal(self.clock())
        return math.inf if renewal is None else renewal

    def _until_next_due(self) -> float:
        """Seconds until the earliest head of these sources is due, at most the poll interval.

        Called after a claim that found nothing: a head that is "due" then is kept by another
        sender's lease or by a workspace's pace, so it is looked at again after a short pause
        rather than at once.
        """
        dues = [due for outbox in self.outboxes if (due := outbox.next_due()) is not None]
        if not dues:
            return self.poll
        left = (min(dues) - self.clock()).total_seconds()
        # Due later (a retry, a hold's end, a pace's next slot): exactly then. Due already,
        # yet the claim found nothing: after a short pause.
        return min(left if left > 0 else BUSY_PAUSE, self.poll)

    def _announce_stop(self) -> None:
        if not self._stop_announced:
            self._stop_announced = True
            logger.info(
                "sender stopping worker=%s in_flight=%d given_back=%d",
                self.worker, self.in_flight, self.stats[Outcome.GIVEN_BACK],
            )  # fmt: skip

    def _check_migrated(self) -> None:
        """NotMigrated if the database answers without the outbox's tables: a deployment error,
        which no retry mends. Nothing if it does not answer (away: the loop reconnects)."""
        try:
            missing = missing_tables(self.using)
        except DatabaseError:
            return
        if missing:
            raise NotMigrated(self.using, missing)

    def _database_away(self, error: Exception) -> float:
        """Close the broken connection; the pause before the next turn tries again."""
        self._failures += 1
        pause = RECONNECT_WAITS[min(self._failures, len(RECONNECT_WAITS)) - 1]
        logger.warning("database unavailable, retrying in %.1fs error=%r", pause, str(error).strip())
        self._close_connection()
        # While stopping, results are still to be recorded: keep trying, at least twice a second.
        return min(pause, 0.5) if self.stopping else pause

    def _close_connection(self) -> None:
        # Closing a connection the server already dropped may itself fail (MySQLdb does).
        with contextlib.suppress(DatabaseError):
            connections[self.using].close()

    def _try_database(self, work: Callable[[], object]) -> None:
        for pause in (*RECONNECT_WAITS, None):
            try:
                work()
                return
            except (OperationalError, InterfaceError) as e:
                if pause is None or self._forced.is_set():
                    logger.error("could not record while stopping error=%r", str(e).strip())
                    return
                self._close_connection()
                time.sleep(pause)

    def _summary(self) -> None:
        age: float | None = None
        try:
            health = [outbox.queue_health() for outbox in self.outboxes]
        except DatabaseError:
            depth = -1
        else:
            depth = sum(count for count, _ in health)
            oldest = min((since for _, since in health if since is not None), default=None)
            age = (self.clock() - oldest).total_seconds() if oldest else None
        counters = " ".join(f"{name}={self.stats[name]}" for name in SUMMARY_COUNTERS)
        # The same fields as record attributes (extra=), for JSON formatters.
        fields = {str(name): self.stats[name] for name in SUMMARY_COUNTERS}
        logger.info(
            "summary worker=%s %s queue_depth=%d oldest_due_age=%s",
            self.worker, counters, depth, "-" if age is None else f"{age:.1f}s",
            extra={"worker": self.worker, **fields, "queue_depth": depth, "oldest_due_age_seconds": age},
        )  # fmt: skip
