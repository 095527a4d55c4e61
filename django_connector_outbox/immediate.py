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
- What is not due when a drain ends (a retry, a hold, a delayed post) waits for the next
  commit's drain, or for ``run_outbox``.

Never in production: ``manage.py check --deploy`` warns while it is on (W003).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.dispatch import receiver

from django_connector_outbox import signals
from django_connector_outbox.conf import conf
from django_connector_outbox.sender import Sender


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
                waiting.pop()._run()
        finally:
            _local.waiting = None

    def _run(self) -> None:
        Sender(
            [self.source],
            using=self.using,
            concurrency=conf.CLAIM_BATCH,
            worker="immediate",
            once=True,
            executor=InlineExecutor(),
        ).run()


@receiver(signals.posts_queued)
def deliver_on_commit(*, source: str, using: str, **kwargs: Any) -> None:
    """With DELIVERY "immediate", drain `source` once the transaction on `using` commits (at
    once without one)."""
    if conf.DELIVERY == "immediate":
        transaction.on_commit(Drain(source, using), using=using, robust=True)
