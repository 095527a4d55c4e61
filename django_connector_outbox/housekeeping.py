"""Housekeeping, done by one sender at a time: reconciling lanes and pruning finished posts.

Invariants:
- Only the sender holding the housekeeping lock in a tick does housekeeping in it. The lock is
  taken without waiting and given back at the end of the tick: a session advisory lock on
  PostgreSQL (the two-key form, under this app's namespace key, so that it never collides with
  a project's own one-key locks), GET_LOCK on MySQL/MariaDB (named after this app and the
  database, since those names are server-wide). If the holder dies its session ends and the
  database frees the lock. SQLite is one machine's file and serializes writers itself.
- A tick's work is bounded, so that it never holds the sender's database thread for more than
  a small fraction of a lease: at most one batch of lanes checked and one batch of posts
  deleted per source. Counting rows rather than measuring time bounds each statement itself
  (a time budget could only be checked between statements) and keeps a tick's cost the same
  under a fake clock.
- Lanes are derived state (each container's head and due time). Every RECONCILE_INTERVAL a
  batch of each source's lanes is checked against its posts, resuming where the last batch
  stopped and wrapping around at the end, so that a wrong lane is repaired within one walk
  of the table. Each repair is logged. The Outbox does the row work (under the lane locks);
  this module only schedules it.
- A prune run takes at most half of its sender's time: after a tick's prune batches, the run
  waits as long as they took (PRUNE_PAUSE) before its next batch, on the housekeeper's clock.
  Back-to-back batches, one per turn, held a sender that pruned a run of 700,000 posts (5
  minutes at 2,000 posts/s) to a few hundred deliveries a second for two minutes (bench/soak.py
  --sustain).
- Pruning starts every HOUSEKEEPING_INTERVAL and goes on, per source and tick, with one batch
  of finished posts (one-off ones after RETENTION, failed and uncertain ones after
  ATTENTION_RETENTION, status ones after STATUS_RETENTION when it is set) until a batch comes
  back short, and then one batch of a walk over the source's lanes by id that deletes the
  lanes idle for RETENTION (models: no post, no pace since), until the walk reaches the end. Its first tick
  also deletes the heartbeat rows of senders silent for longer than heartbeat.PRUNE_AFTER (one
  short DELETE).
- No housekeeping error stops a sender. Each step (one source's reconcile batch, one source's
  prune batch) runs in its own transaction (a savepoint inside a caller's); an error is logged
  with its traceback and counted (`housekeeping_errors` in the sender's summary), the step's
  work is rolled back, and the other steps and the sender go on. A failed prune ends that
  source's run until the next interval, so that a step that fails every time is logged once per
  interval, not once per turn. Only the database going away (OperationalError, InterfaceError)
  is left to the sender, which reconnects.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from hashlib import sha256
from typing import TYPE_CHECKING, TypeVar

from django.db import InterfaceError, OperationalError, connections, transaction

from django_connector_outbox.conf import conf
from django_connector_outbox.heartbeat import prune_silent
from django_connector_outbox.outbox import PRUNE_BATCH, REPAIR_BATCH

if TYPE_CHECKING:
    from django_connector_outbox.outbox import Outbox

logger = logging.getLogger("django_connector_outbox.sender")

HOUSEKEEPING_INTERVAL = 300.0
# After a tick's prune batches, a prune run waits this many times as long as they took.
PRUNE_PAUSE = 1.0
# How often a batch of lanes is checked: a 500-lane batch every 5 s walks 100 lanes a second.
RECONCILE_INTERVAL = 5.0
LOCK_NAME = "django_connector_outbox.housekeeping"
# PostgreSQL's two-key advisory locks take two int4: this app's namespace, then the lock's key.
# Both are stable numbers derived from names, kept positive so pg_locks shows them as they are.
ADVISORY_NAMESPACE = zlib.crc32(b"django_connector_outbox") & 0x7FFFFFFF
ADVISORY_KEY = zlib.crc32(LOCK_NAME.encode()) & 0x7FFFFFFF
# MySQL's lock names are at most 64 characters.
MYSQL_LOCK_NAME_LENGTH = 64

T = TypeVar("T")


class Housekeeper:
    """Schedules one sender's housekeeping; `tick()` is called on every turn of its loop."""

    def __init__(
        self,
        outboxes: Sequence[Outbox],
        using: str,
        interval: float = HOUSEKEEPING_INTERVAL,
        *,
        reconcile_interval: float = RECONCILE_INTERVAL,
        reconcile_batch: int = REPAIR_BATCH,
        prune_batch: int = PRUNE_BATCH,
        monotonic: Callable[[], float] = time.monotonic,
        stats: Counter[str] | None = None,
    ) -> None:
        self.outboxes = outboxes
        # Counts `housekeeping_errors` (the sender passes its own counters).
        self.stats: Counter[str] = Counter() if stats is None else stats
        self.using = using
        self.interval = interval
        self.reconcile_interval = reconcile_interval
        self.reconcile_batch = reconcile_batch
        self.prune_batch = prune_batch
        self.monotonic = monotonic
        self._next_prune = self._next_reconcile = monotonic()
        self._pruning: list[Outbox] = []  # the outboxes whose prune run is not finished
        self._prune_resumes = self._next_prune  # a run's next batch not before (PRUNE_PAUSE)
        self._lanes_after: dict[str, int] = {}  # source -> the last lane id its prune walk checked
        self._heartbeats_due = False  # the silent senders' rows are pruned at a run's first turn
        self._walked_to = {outbox.source: 0 for outbox in outboxes}  # the last lane id checked

    def tick(self) -> None:
        """Do the housekeeping that is due, if no other sender is doing some right now."""
        now = self.monotonic()
        if now >= self._next_prune and not self._pruning:
            self._pruning = list(self.outboxes)
            self._heartbeats_due = True
            self._next_prune = now + self.interval
        reconcile = now >= self._next_reconcile
        prune = bool(self._pruning) and now >= self._prune_resumes
        if not (reconcile or prune):
            return
        if reconcile:
            self._next_reconcile = now + self.reconcile_interval
        with self.turn() as mine:
            if not mine:  # another sender's turn: ours comes at the next tick that has work
                return
            if reconcile:
                self._reconcile()
            if prune:
                started = self.monotonic()
                if self._heartbeats_due:  # once per run
                    self._heartbeats_due = False
                    self._prune_heartbeats()
                self._prune()
                ended = self.monotonic()
                self._prune_resumes = ended + (ended - started) * PRUNE_PAUSE

    def _reconcile(self) -> None:
        """Check the next batch of each source's lanes, and log every repair."""
        for outbox in self.outboxes:
            after = self._walked_to[outbox.source]
            walked = self._step("repair_lanes", outbox, outbox.repair_lanes, after, self.reconcile_batch)
            if walked is None:
                continue  # the same batch is checked again at the next reconcile
            last, repairs = walked
            self._walked_to[outbox.source] = last or 0
            for r in repairs:
                logger.warning(
                    "repaired lane source=%s lane=%d workspace=%s container=%s "
                    "old_head=%s old_due=%s new_head=%s new_due=%s",
                    r.source, r.lane, r.workspace_id, r.container_id, r.old_head,
                    r.old_due and r.old_due.isoformat(), r.new_head, r.new_due and r.new_due.isoformat(),
                )  # fmt: skip

    def _prune(self) -> None:
        """One batch for each source whose prune run goes on: of its posts until a batch comes
        back short, then of its lanes until the walk reaches the last one."""
        for outbox in list(self._pruning):
            if outbox.source in self._lanes_after:
                self._prune_lanes(outbox)
                continue
            prune = partial(
                outbox.prune_some,
                attention_retention=outbox.attention_retention(),
                status_retention=conf.STATUS_RETENTION,
            )
            pruned = self._step("prune_some", outbox, prune, None, self.prune_batch)
            if pruned is None:
                self._pruning.remove(outbox)  # tried again at the next interval
                continue
            if pruned:
                logger.info("pruned finished posts source=%s count=%d", outbox.source, pruned)
            if pruned < self.prune_batch:  # the posts are done: the lanes' walk starts
                self._lanes_after[outbox.source] = 0
                self._prune_lanes(outbox)

    def _prune_lanes(self, outbox: Outbox) -> None:
        """The next batch of the source's walk over its lanes; the walk's end ends its run."""
        after = self._lanes_after.pop(outbox.source)
        walked = self._step("prune_lanes", outbox, outbox.prune_lanes, None, after, self.prune_batch)
        if walked is None:  # tried again at the next interval
            self._pruning.remove(outbox)
            return
        last, pruned = walked
        if pruned:
            logger.info("pruned idle lanes source=%s count=%d", outbox.source, pruned)
        if last is None:
            self._pruning.remove(outbox)
        else:
            self._lanes_after[outbox.source] = last

    def _prune_heartbeats(self) -> None:
        """Delete the rows of senders silent for a long while (heartbeat.PRUNE_AFTER)."""
        try:
            with transaction.atomic(using=self.using):
                pruned = prune_silent(self.using)
        except (OperationalError, InterfaceError):
            raise
        except Exception:
            self.stats["housekeeping_errors"] += 1
            logger.exception("housekeeping step failed step=prune_heartbeats")
            return
        if pruned:
            logger.info("pruned the rows of silent senders count=%d", pruned)

    def _step(self, name: str, outbox: Outbox, work: Callable[..., T], *args: object) -> T | None:
        """`work(*args)` in its own transaction; None if it failed (logged and counted)."""
        try:
            with transaction.atomic(using=self.using):
                return work(*args)
        except (OperationalError, InterfaceError):
            raise  # the database is away: the sender reconnects and housekeeps later
        except Exception:
            self.stats["housekeeping_errors"] += 1
            logger.exception("housekeeping step failed step=%s source=%s", name, outbox.source)
            return None

    @contextmanager
    def turn(self) -> Iterator[bool]:
        """Whether this sender holds the housekeeping lock, for the duration of the block."""
        connection = connections[self.using]
        if connection.vendor == "postgresql":
            take = "SELECT pg_try_advisory_lock(%s::int4, %s::int4)"
            give = "SELECT pg_advisory_unlock(%s::int4, %s::int4)"
            key: list[int | str] = [ADVISORY_NAMESPACE, ADVISORY_KEY]
        elif connection.vendor == "mysql":
            take, give = "SELECT GET_LOCK(%s, 0)", "SELECT RELEASE_LOCK(%s)"
            key = [mysql_lock_name(connection.settings_dict["NAME"])]
        else:
            yield True
            return
        with connection.cursor() as cursor:
            cursor.execute(take, key)
            mine = bool(cursor.fetchone()[0])
        try:
            yield mine
        finally:
            if mine:
                with connection.cursor() as cursor:
                    cursor.execute(give, key)


def mysql_lock_name(database: str) -> str:
    """The lock's name on a MySQL server, where names are shared by all of its databases."""
    name = f"{LOCK_NAME}:{database}"
    if len(name) > MYSQL_LOCK_NAME_LENGTH:
        name = f"{LOCK_NAME}:{sha256(database.encode()).hexdigest()[:16]}"
    return name
