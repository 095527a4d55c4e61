"""The sender loop behind ``manage.py run_outbox``: claim -> look up stale -> send -> record.

One thread (the caller's) does all database work: claims, records outcomes, housekeeping.
Connector calls run on a bounded thread pool, so a slow platform never holds a transaction
open and the database sees one connection per sender process.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

from django.db import (
    DatabaseError,
    InterfaceError,
    OperationalError,
    close_old_connections,
    connections,
    transaction,
)
from django.db.models import Min
from django.dispatch import Signal
from django.utils import timezone

from django_connector_outbox import signals
from django_connector_outbox.conf import conf
from django_connector_outbox.connectors import CannotCheck, CheckLater, Connector, connectors
from django_connector_outbox.connectors.base import Delivered, MaybeSent, RateLimited, Refused, RetryLater
from django_connector_outbox.housekeeping import Housekeeper
from django_connector_outbox.models import Lane, Post
from django_connector_outbox.outbox import Clock, Outbox, default_worker
from django_connector_outbox.posts import ClaimedPost, Finish, Kind, State
from django_connector_outbox.wakeup import Wakeup

logger = logging.getLogger("django_connector_outbox.sender")

SUMMARY_INTERVAL = 60.0
# Results recorded in one finish_many call at most (PostgreSQL: one statement).
FINISH_BATCH = 100
# Results that leave the claim as it is, only noting why (Outbox.note).
NOTES = ("lost", "later")
# Waits between reconnection attempts while the database is away.
RECONNECT_WAITS = (0.1, 0.5, 1.0, 2.0, 5.0)


# A result's finish, the stats key it counts under, and the signal (with its arguments) to send;
# a note (a lost reply, a lookup to do again) has no finish: the claim stays as it is.
FinishPlan = tuple[Finish, str, Signal, dict[str, Any]]
NotePlan = tuple[None, str, Signal, dict[str, Any]]


@dataclass(frozen=True)
class Result:
    """What a worker thread did with one claim, for the database thread to record."""

    claim: ClaimedPost
    action: str  # posted, found, retry, hold, failed, uncertain, lost, later
    reason: str = ""
    message_ref: str | None = None
    after: float | None = None


def look_again(claim: ClaimedPost, what: str, detail: str) -> Result:
    """A lookup that could not tell: the claim is left to be looked up after its lease, except
    on the last attempt, where the post becomes uncertain (never sent blind)."""
    if claim.attempts >= conf.MAX_ATTEMPTS:
        return Result(claim, "uncertain", f"may have been sent, {what} on the last attempt: {detail}")
    return Result(claim, "later", f"{what}, will look again: {detail}")


def deliver(connector: Connector, claim: ClaimedPost) -> Result:
    """Look a stale claim up, then send it if needed; runs on a worker thread, never touches the database."""
    if claim.stale and not (claim.kind == Kind.STATUS and claim.message_ref):
        # It may have reached the platform before its sender died or lost the reply:
        # look before sending again.
        try:
            found = connector.find_sent(claim)
        except CannotCheck as e:
            return Result(claim, "uncertain", f"may have been sent, cannot check: {e}")
        except CheckLater as e:
            return look_again(claim, "lookup failed", str(e))
        except Exception as e:
            logger.exception("find_sent raised post_id=%s source=%s", claim.post_id, claim.source)
            return look_again(claim, "lookup raised", repr(e))
        if found is not None:
            return Result(claim, "found", message_ref=found)
    try:
        outcome = connector.send(claim)
    except Exception as e:
        logger.exception("send raised post_id=%s source=%s", claim.post_id, claim.source)
        return Result(claim, "retry", f"send raised {e!r}")
    match outcome:
        case Delivered(message_ref=ref):
            return Result(claim, "posted", message_ref=ref)
        case RetryLater(reason=reason, after=after):
            return Result(claim, "retry", reason, after=after)
        case RateLimited(after=after, reason=reason):
            return Result(claim, "hold", reason or "rate limited", after=after)
        case Refused(reason=reason):
            return Result(claim, "failed", reason)
        case MaybeSent(reason=reason):
            return Result(claim, "lost", reason or "reply lost")
    logger.error("send returned %r, not an outcome post_id=%s", outcome, claim.post_id)
    return Result(claim, "retry", f"connector returned {outcome!r}, not an outcome")


class Sender:
    """Claims due posts of its sources and delivers them until stopped."""

    def __init__(
        self,
        sources: Iterable[str] | None = None,
        *,
        using: str = "default",
        concurrency: int = 4,
        batch: int | None = None,
        poll: float | None = None,
        worker: str | None = None,
        once: bool = False,
        clock: Clock | None = None,
        summary_interval: float = SUMMARY_INTERVAL,
    ) -> None:
        names = list(sources) if sources else sorted(conf.CONNECTORS)
        self.outboxes = [Outbox(name, using=using, clock=clock) for name in names]
        self.using = using
        self.concurrency = concurrency
        self.batch = batch or conf.CLAIM_BATCH
        self.poll = conf.POLL_INTERVAL if poll is None else poll
        self.worker = worker or default_worker()
        self.once = once
        self.clock: Clock = clock or timezone.now
        self.summary_interval = summary_interval
        self.stats: Counter[str] = Counter()
        self.wakeup = Wakeup(using, self.poll)
        self.housekeeper = Housekeeper(self.outboxes, using)
        self._stopping = threading.Event()
        self._forced = threading.Event()
        self._stop_announced = False
        self._given_back = 0
        self._look = True  # whether a claim may find something due
        self._next_due_sql: tuple[str, tuple[Any, ...]] | None = None
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="outbox-send")
        self._inflight: dict[Future[Result], ClaimedPost] = {}
        self._waiting: deque[tuple[Outbox, ClaimedPost]] = deque()  # claimed, not started yet
        self._unrecorded: deque[tuple[Outbox, Result]] = deque()  # sent while the database was away
        self._by_source = {outbox.source: outbox for outbox in self.outboxes}

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

    # -- the loop -------------------------------------------------------------------------

    def run(self) -> None:
        logger.info(
            "sender started worker=%s sources=%s concurrency=%d batch=%d",
            self.worker, ",".join(self._by_source), self.concurrency, self.batch,
        )  # fmt: skip
        if not self.once:  # --once never idles: nothing to be woken from
            self.wakeup.start()
        next_summary = time.monotonic() + self.summary_interval
        failures = 0
        try:
            while not self._forced.is_set():
                try:
                    if not self._step():
                        break
                    failures = 0
                except (OperationalError, InterfaceError) as e:
                    failures += 1
                    self._database_away(e, failures)
                if time.monotonic() >= next_summary:
                    self._summary()
                    next_summary = time.monotonic() + self.summary_interval
        finally:
            self._shutdown()

    def _step(self) -> bool:
        """One turn of the loop; False when the sender should stop."""
        # Cleared before looking for work: a wake-up that comes while we look is not lost.
        self.wakeup.clear()
        self._unrecorded.extend((self._by_source[result.claim.source], result) for result in self._done())
        if self.stopping:
            self._record_unrecorded()
            # At once, not after the sends in flight: other senders need not wait for them.
            self._give_back()
        else:
            self.housekeeper.tick()
            # A claim is worth a round trip after a finish (a container's next head may be
            # due), a wake-up, or a claim that filled all the room; not after a short one.
            if self._unrecorded or self._look:
                claimed = self._record_unrecorded(claim=True)
                self._start_waiting()
                if claimed:
                    return True
        if not self._inflight:
            if self.stopping or self.once:
                return False
            self._idle()
            self._look = True
            return True
        # Something is in flight: wait for a send to finish, for a stop, or (capacity free) for
        # a queued post (NOTIFY) or the poll. Every one of them sets the wake-up event. Each
        # finished send brings a claim, so a post that falls due meanwhile waits for the next
        # finish at most a poll interval: no query for the next due time on this busy path.
        full = self.stopping or len(self._inflight) >= self.concurrency
        timeout = None if full else self.poll
        if not any(future.done() for future in self._inflight):
            self.wakeup.wait(timeout)
            self._look = True
        return True

    def _claims(self) -> list[tuple[Outbox, ClaimedPost]]:
        room = self.concurrency + self.batch - len(self._inflight) - len(self._waiting)
        claimed: list[tuple[Outbox, ClaimedPost]] = []
        for outbox in self.outboxes:
            if room <= 0:
                break
            claims = outbox.claim(min(room, self.batch), worker=self.worker)
            claimed.extend((outbox, claim) for claim in claims)
            room -= len(claims)
        self._look = room <= 0  # filled: more may be due; short: nothing else is, for now
        return claimed

    def _start_waiting(self) -> None:
        while self._waiting and len(self._inflight) < self.concurrency:
            outbox, claim = self._waiting.popleft()
            future = self._pool.submit(deliver, connectors[outbox.source], claim)
            future.add_done_callback(lambda _: self.wakeup.set())
            self._inflight[future] = claim

    def _done(self) -> list[Result]:
        """The results of the sends that have finished, taken out of flight."""
        results = []
        for future in [f for f in self._inflight if f.done()]:
            del self._inflight[future]
            results.append(future.result())
        return results

    def _idle(self) -> None:
        """Nothing due and nothing in flight: sleep until a wake-up, the next due time or the poll."""
        timeout = min(self.poll, self._until_next_due())
        if timeout > 0:
            self.wakeup.wait(timeout)

    def _until_next_due(self) -> float:
        # Asked once per turn of a busy loop: the SQL is compiled once, not by the ORM each time.
        if self._next_due_sql is None:
            lanes = Lane.objects.using(self.using).filter(
                source__in=list(self._by_source), due_at__isnull=False
            )
            self._next_due_sql = lanes.values_list(Min("due_at")).query.sql_with_params()
        with connections[self.using].cursor() as cursor:
            cursor.execute(*self._next_due_sql)
            row = cursor.fetchone()
        due = row[0] if row else None
        if due is None:
            return self.poll
        if isinstance(due, str):  # SQLite hands back text from a raw aggregate
            due = datetime.fromisoformat(due)
        if due.tzinfo is None:
            due = due.replace(tzinfo=UTC)  # MySQL and SQLite keep UTC without a zone
        return max((due - self.clock()).total_seconds(), 0.0)

    # -- recording ------------------------------------------------------------------------

    def _record(self, results: list[Result]) -> None:
        self._unrecorded.extend((self._by_source[result.claim.source], result) for result in results)
        self._record_unrecorded()

    def _record_unrecorded(self, *, claim: bool = False) -> int:
        """Record the kept results and, with `claim`, claim more: one transaction, one commit.

        Claiming in the transaction that finishes a container's head hands its next head to
        this sender at once. Results leave the queue only once committed: if the database goes
        away half-way, every one of them is recorded when it is back (the lease fences any
        that another sender took back meanwhile). Signals are sent after the commit.
        """
        pending = list(self._unrecorded)
        plans = [self._plan(result) for _, result in pending]
        # (A savepoint only where the caller holds a transaction: in tests, never in run_outbox.)
        with transaction.atomic(using=self.using):
            changed = self._write(pending, plans)
            claims = self._claims() if claim else []
        for _ in pending:
            self._unrecorded.popleft()
        self._waiting.extend(claims)
        for (_, result), plan, result_changed in zip(pending, plans, changed, strict=True):
            self._recorded(result, result_changed, *plan[1:])
        return len(claims)

    def _write(self, pending: list[tuple[Outbox, Result]], plans: list[FinishPlan | NotePlan]) -> list[bool]:
        """Each result's finish (or note), in runs of one source per finish_many call."""
        changed: list[bool] = []
        start = 0
        while start < len(pending):
            outbox, result = pending[start]
            plan = plans[start]
            if plan[0] is None:  # a note: the claim stays as it is
                changed.append(outbox.note(result.claim, result.reason))
                start += 1
                continue
            end = start + 1
            while (
                end < len(pending)
                and end - start < FINISH_BATCH
                and pending[end][0] is outbox
                and plans[end][0] is not None
            ):
                end += 1
            # The loop above took only finishes (plan[0] is not None): mypy cannot narrow by index.
            finishes = cast(list[FinishPlan], plans[start:end])
            changed += outbox.finish_many(
                [
                    (result.claim, plan[0])
                    for (_, result), plan in zip(pending[start:end], finishes, strict=True)
                ]
            )
            start = end
        return changed

    def _plan(self, result: Result) -> FinishPlan | NotePlan:
        """The fenced finish that records `result` (None: a note), its stats key, and the signal."""
        claim, reason = result.claim, result.reason
        if result.action in NOTES:
            return None, result.action, signals.post_lost_reply, {"reason": reason}

        def finish(action: str, **fields: Any) -> Finish:
            return Finish(claim.post_id, claim.lease_token, action, **fields)

        match result.action:
            case "posted":
                ref = result.message_ref
                return finish("posted", message_ref=ref), "posted", signals.post_posted, {"message_ref": ref}
            case "found":
                ref = result.message_ref or ""
                return finish("found", message_ref=ref), "found", signals.post_posted, {"message_ref": ref}
            case "retry" if claim.attempts >= conf.MAX_ATTEMPTS:
                reason = f"out of attempts ({claim.attempts}): {reason}"
                failed = finish("settle", state=State.FAILED, reason=reason)
                return failed, "failed", signals.post_failed, {"reason": reason}
            case "retry":
                retry = finish("retry", wait=result.after, reason=reason)
                return retry, "retry", signals.post_retried, {"reason": reason}
            case "hold":
                after = result.after or 0
                hold = finish("hold", wait=after, reason=reason)
                return hold, "hold", signals.post_held, {"reason": reason, "after": after}
            case "failed" | "uncertain":
                settle = finish("settle", state=result.action, reason=reason)
                signal = signals.post_failed if result.action == "failed" else signals.post_uncertain
                return settle, result.action, signal, {"reason": reason}
        raise ValueError(f"no finish for action {result.action!r}")

    def _recorded(
        self, result: Result, changed: bool, stat: str, signal: Signal, extra: dict[str, Any]
    ) -> None:
        if changed:
            self.stats[stat] += 1
            signal.send(sender=Sender, claim=result.claim, **extra)
        else:
            self.stats["fenced"] += 1
            logger.info("claim no longer current post_id=%s action=%s", result.claim.post_id, result.action)

    # -- trouble and shutdown -------------------------------------------------------------

    def _give_back(self) -> None:
        """Hand the claims not started back to the queue (as hold(claim, 0)) when stopping."""
        while self._waiting:
            outbox, claim = self._waiting[0]
            outbox.hold(claim, 0, "given back: sender stopping")
            self._waiting.popleft()
            self._given_back += 1
        if self.stopping and not self._stop_announced:
            self._stop_announced = True
            logger.info(
                "sender stopping worker=%s in_flight=%d given_back=%d",
                self.worker,
                len(self._inflight),
                self._given_back,
            )

    def _database_away(self, error: Exception, failures: int) -> None:
        pause = RECONNECT_WAITS[min(failures, len(RECONNECT_WAITS)) - 1]
        logger.warning("database unavailable, retrying in %.1fs error=%r", pause, str(error).strip())
        self._close_connection()
        # A stop or a finished send ends the pause early; the next turn reconnects. While
        # stopping, results are still to be recorded: keep trying, at least twice a second.
        self.wakeup.clear()
        self.wakeup.wait(min(pause, 0.5) if self.stopping else pause)
        close_old_connections()

    def _close_connection(self) -> None:
        # Closing a connection the server already dropped may itself fail (MySQLdb does).
        with contextlib.suppress(DatabaseError):
            connections[self.using].close()

    def _shutdown(self) -> None:
        forced = self._forced.is_set()
        if not forced:
            # Normally the loop has already given back the claims not started and waited for
            # the sends in flight; not when it stopped on an error.
            self._try_database(self._give_back)
            for future in list(self._inflight):
                future.result()
            self._try_database(lambda: self._record(self._done()))
            self._try_database(self._record_unrecorded)
        self._pool.shutdown(wait=not forced, cancel_futures=True)
        self.wakeup.close()
        self._summary()
        logger.info("sender stopped worker=%s forced=%s", self.worker, forced)

    def _try_database(self, work: Callable[[], Any]) -> None:
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
        try:
            depth, oldest = self._queue_health()
        except DatabaseError:
            depth, oldest = -1, None
        age = f"{oldest:.1f}s" if oldest is not None else "-"
        logger.info(
            "summary worker=%s posted=%d retried=%d held=%d failed=%d uncertain=%d lost_replies=%d fenced=%d "
            "queue_depth=%d oldest_due_age=%s",
            self.worker, self.stats["posted"] + self.stats["found"], self.stats["retry"],
            self.stats["hold"], self.stats["failed"], self.stats["uncertain"], self.stats["lost"],
            self.stats["fenced"], depth, age,
        )  # fmt: skip

    def _queue_health(self) -> tuple[int, float | None]:
        sources = list(self._by_source)
        depth = Post.objects.using(self.using).filter(source__in=sources).active()
        oldest = (
            Lane.objects.using(self.using)
            .filter(source__in=sources, due_at__lte=self.clock())
            .aggregate(oldest=Min("due_at"))["oldest"]
        )
        age = (self.clock() - oldest).total_seconds() if oldest else None
        return depth.count(), age
