"""Delivery right after commit, in process: ``CONNECTOR_OUTBOX["DELIVERY"] = "immediate"``.

For development without a second process (django-tasks' ImmediateBackend, Celery's eager
mode): a transaction that queues posts of a source has that source drained once it commits,
in the committing thread, by the sender of ``run_outbox --once`` with its sends inline. Every
post goes through the one path a sender uses (claim -> deliver -> record), so retries, holds,
lookups and fencing are the same; a rolled-back transaction delivers nothing.

Invariants:
- A drain runs after the commit, never inside the caller's transaction (on_commit), and an
  error in it is logged, not raised into the code that committed (robust): that commit stood.
- Drains do not nest: a post queued while a drain runs (a signal receiver's) is delivered by
  that drain's thread when the running one is done.
- A post kept only by its source's pace (Slack's one a second per channel) is not left for a
  later commit: the drain waits for the pace's next slot, up to PACE_WAIT seconds in all, and
  hands what is still paced after that to a timer thread, which drains again at the next slot
  (and so on). So every post of a transaction goes out, in order, as fast as its pace allows.
- What is not due when a drain ends for another reason (a retry, a hold, a delayed post)
  waits for the next commit's drain, or for ``run_outbox``.

Never in production: ``manage.py check --deploy`` warns while it is on (W003).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any

from django.db import connections, transaction
from django.dispatch import receiver

from django_connector_outbox import signals
from django_connector_outbox.conf import conf
from django_connector_outbox.outbox import Outbox
from django_connector_outbox.sender import BUSY_PAUSE, Sender

logger = logging.getLogger("django_connector_outbox.sender")

# The most seconds one drain waits, in the committing thread, for paced posts: a few posts to
# one Slack channel (one a second) go out before the request returns; a longer paced backlog
# does not hold the request, it goes on in a timer thread.
PACE_WAIT = 5.0
# The timer threads that deliver paced posts later (tests join them).
later: set[threading.Timer] = set()


class InlineExecutor(Executor):
    """Runs each send as it is submitted, on the caller's thread: one order, one connection."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_running_or_notify_cancel()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as e:
            future.set_exception(e)
        return future


# The (source, using) pairs waiting for this thread's running drain; None when none runs.
_local = threading.local()
# The drains running in this process, each with whether another thread asked for it meanwhile
# (a later commit, a pace's timer): one drain of a source at a time, which goes round once more
# for those, so that two never race for one lane's head. (When they raced, the loser saw the
# winner's lease as the head's due time and left a timer for the lease's end.)
_running: dict[Drain, bool] = {}
_running_lock = threading.Lock()


@dataclass(frozen=True)
class Drain:
    """Deliver what is due of one source, as ``run_outbox --once --source SOURCE`` would."""

    source: str
    using: str

    def __call__(self) -> None:
        waiting: set[Drain] | None = getattr(_local, "waiting", None)
        if waiting is not None:  # inside a drain: it takes this one when it is done
            waiting.add(self)
            return
        _local.waiting = waiting = {self}
        try:
            while waiting:
                waiting.pop()._run_alone()
        finally:
            _local.waiting = None

    def _run_alone(self) -> None:
        """`_run`, unless another thread of this process drains the same source: that one then
        runs once more when it is done (see `_running`)."""
        with _running_lock:
            if self in _running:
                _running[self] = True
                return
            _running[self] = False
        try:
            again = True
            while again:
                self._run()
                with _running_lock:
                    again, _running[self] = _running[self], False
        finally:
            with _running_lock:
                del _running[self]

    def _run(self) -> None:
        """Drain as --once does; while what is left is kept only by the pace, again at its next
        slot: here up to PACE_WAIT seconds, then from a timer thread."""
        waited = 0.0
        while True:
            Sender(
                [self.source],
                using=self.using,
                concurrency=conf.CLAIM_BATCH,
                worker="immediate",
                once=True,
                executor=InlineExecutor(),
            ).run()
            outbox = Outbox(self.source, using=self.using)
            if not outbox.kept_by_pace():
                return
            due = outbox.next_due()
            wait = BUSY_PAUSE if due is None else max((due - outbox.clock()).total_seconds(), BUSY_PAUSE)
            if waited + wait > PACE_WAIT:
                self._later(wait)
                return
            time.sleep(wait)  # the pace's next slot: a time, not an event
            waited += wait

    def _later(self, wait: float) -> None:
        def run() -> None:
            try:
                self()
            except Exception:
                logger.exception("immediate delivery failed source=%s", self.source)
            finally:
                connections[self.using].close()  # this thread's own connection
                later.discard(timer)

        timer = threading.Timer(wait, run)
        timer.daemon = True  # a paced backlog does not keep a development server from exiting
        timer.name = f"outbox-immediate-{self.source}"
        later.add(timer)
        logger.info("paced posts left to a timer source=%s in=%.2fs", self.source, wait)
        timer.start()


@receiver(signals.posts_queued)
def deliver_on_commit(*, source: str, using: str, **kwargs: Any) -> None:
    """With DELIVERY "immediate", drain `source` once the transaction on `using` commits (at
    once without one)."""
    if conf.DELIVERY == "immediate":
        transaction.on_commit(Drain(source, using), using=using, robust=True)
