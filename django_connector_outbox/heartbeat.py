"""Which senders are alive: one `Heartbeat` row per running `run_outbox`.

Invariants:
- The row is written from the sender's own loop (its database thread), at most once per
  INTERVAL (or a quarter of LEASE, if shorter): one UPDATE of one row by primary key, so a busy sender pays next to nothing.
- A sender whose loop stops turning (killed, hung, its database away) stops moving its
  `last_seen`; a row silent for longer than LEASE is shown as such (`silent`). A clean stop
  deletes the row; rows silent for longer than PRUNE_AFTER are deleted by housekeeping.
- Times are the wall clock's (`timezone.now`), never a test's sender clock: they are
  compared with the operator's now.
- A row deleted under a live sender (pruned while its database was away a day) is made again
  at its next beat.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import NamedTuple

from django.db import DatabaseError
from django.utils import timezone

from django_connector_outbox.conf import conf
from django_connector_outbox.models import Heartbeat

logger = logging.getLogger("django_connector_outbox.sender")

# The most seconds between two writes of a sender's row; never more than a quarter of LEASE,
# so that a live sender is never shown silent.
INTERVAL = 5.0
# A row silent this long is deleted by housekeeping: long enough for an operator to see that a
# sender died, short enough that a fleet's restarts do not pile up.
PRUNE_AFTER = 24 * 3600.0


class Pulse:
    """One sender's heartbeat row: `start()` before the loop, `beat()` on each turn, `stop()` after."""

    def __init__(
        self,
        worker: str,
        sources: Sequence[str],
        using: str,
        *,
        interval: float | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.worker = worker
        self.sources = list(sources)
        self.using = using
        self.interval = min(INTERVAL, conf.LEASE / 4) if interval is None else interval
        self.monotonic = monotonic
        self.started_at: datetime | None = None
        self.pk: int | None = None
        self._next = 0.0

    def start(self) -> None:
        """From now on `beat()` writes; the row itself is made at the first beat (in the loop,
        where a database that is away is waited for)."""
        self.started_at = timezone.now()
        self._next = self.monotonic()

    def beat(
        self, sent: int, in_flight: int = 0, loop_lag: Callable[[], float | None] = lambda: None
    ) -> None:
        """Say this sender is alive, with how many posts it delivered, how many sends it has
        in flight and the longest its loop was held since the last beat (`loop_lag`, asked
        only when the row is written), unless it did so less than `interval` ago (or it was
        not started)."""
        if self.started_at is None or self.monotonic() < self._next:
            return
        now = timezone.now()
        rows = Heartbeat.objects.using(self.using)
        state = dict(last_seen=now, sent=sent, in_flight=in_flight, loop_lag=loop_lag())
        if self.pk is None or not rows.filter(pk=self.pk).update(**state):
            self.pk = rows.create(
                worker=self.worker, host=socket.gethostname(), pid=os.getpid(), sources=self.sources,
                started_at=self.started_at, **state,
            ).pk  # fmt: skip
        self._next = self.monotonic() + self.interval

    def stop(self) -> None:
        """Delete the row (a clean stop); a database that is away leaves it, shown silent later."""
        if self.pk is None:
            return
        try:
            Heartbeat.objects.using(self.using).filter(pk=self.pk).delete()
        except DatabaseError as e:
            logger.warning(
                "could not delete the heartbeat row worker=%s error=%r", self.worker, str(e).strip()
            )
        self.pk = None
        self.started_at = None


def silent(last_seen: datetime, now: datetime, lease: float) -> bool:
    """Whether a sender last seen at `last_seen` has been silent for longer than a lease."""
    return now - last_seen > timedelta(seconds=lease)


def prune_silent(using: str, now: datetime | None = None, after: float = PRUNE_AFTER) -> int:
    """Delete the rows of senders silent for longer than `after`; how many."""
    cutoff = (now or timezone.now()) - timedelta(seconds=after)
    deleted: int = Heartbeat.objects.using(using).filter(last_seen__lt=cutoff).delete()[0]
    return deleted


class SenderSeen(NamedTuple):
    """A sender's row as operators read it (outbox_status)."""

    worker: str
    host: str
    pid: int
    sources: list[str]
    started_at: datetime
    last_seen: datetime
    sent: int
    in_flight: int
    loop_lag: float | None  # seconds
    silent: bool


def senders(
    using: str, now: datetime, lease: float, sources: Sequence[str] | None = None
) -> list[SenderSeen]:
    """The senders with a row (those serving any of `sources`, if given), by worker name."""
    fields = ("worker", "host", "pid", "sources", "started_at", "last_seen", "sent", "in_flight", "loop_lag")
    rows = Heartbeat.objects.using(using).order_by("worker", "started_at", "pk").values_list(*fields)
    wanted = None if sources is None else set(sources)
    return [
        SenderSeen(worker, host, pid, served, started, seen, sent, in_flight, lag, silent(seen, now, lease))
        for worker, host, pid, served, started, seen, sent, in_flight, lag in rows
        if wanted is None or wanted & set(served)
    ]
