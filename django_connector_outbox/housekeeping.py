"""Housekeeping (pruning finished posts), done by one sender at a time.

Each period every sender tries a database lock without waiting: a session advisory lock on
PostgreSQL, GET_LOCK on MySQL/MariaDB. The one that gets it prunes and lets go; if it dies
mid-way its session ends, the database frees the lock, and another sender takes the next turn.
SQLite is one machine's file and serializes writers itself.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from django.db import connections

if TYPE_CHECKING:
    from django_connector_outbox.outbox import Outbox

logger = logging.getLogger("django_connector_outbox.sender")

HOUSEKEEPING_INTERVAL = 300.0
LOCK_NAME = "django_connector_outbox.housekeeping"
# PostgreSQL advisory locks take a bigint key: a stable number derived from the name.
ADVISORY_KEY = zlib.crc32(LOCK_NAME.encode())


class Housekeeper:
    def __init__(
        self, outboxes: Sequence[Outbox], using: str, interval: float = HOUSEKEEPING_INTERVAL
    ) -> None:
        self.outboxes = outboxes
        self.using = using
        self.interval = interval
        self._next = time.monotonic()

    def tick(self) -> None:
        """Prune if a period has passed and no other sender is pruning now."""
        if time.monotonic() < self._next:
            return
        self._next = time.monotonic() + self.interval
        with self.turn() as mine:
            if not mine:
                return
            for outbox in self.outboxes:
                pruned = outbox.prune_finished()
                if pruned:
                    logger.info("pruned finished posts source=%s count=%d", outbox.source, pruned)

    @contextmanager
    def turn(self) -> Iterator[bool]:
        """Whether this sender holds the housekeeping lock, for the duration of the block."""
        connection = connections[self.using]
        if connection.vendor == "postgresql":
            take, give = "SELECT pg_try_advisory_lock(%s)", "SELECT pg_advisory_unlock(%s)"
            key: int | str = ADVISORY_KEY
        elif connection.vendor == "mysql":
            take, give = "SELECT GET_LOCK(%s, 0)", "SELECT RELEASE_LOCK(%s)"
            key = LOCK_NAME
        else:
            yield True
            return
        with connection.cursor() as cursor:
            cursor.execute(take, [key])
            mine = bool(cursor.fetchone()[0])
        try:
            yield mine
        finally:
            if mine:
                with connection.cursor() as cursor:
                    cursor.execute(give, [key])
