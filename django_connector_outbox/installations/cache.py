"""A small thread-safe cache with a time to live and a bound (least recently used goes first).

Senders call connectors from many threads; each send reads its workspace's credentials (or a
container's destination) here, so that the database is read once per `ttl` per key, and the
memory stays bounded however many workspaces a source serves. `expired` tells a reader which
other keys to read in the same query, `late` what to use meanwhile (installations/store.py).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

V = TypeVar("V")


class TtlCache(Generic[V]):
    def __init__(self, *, ttl: float, size: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self.size = size
        self.clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, tuple[float, V]] = OrderedDict()

    def get(self, key: str) -> V | None:
        """The value cached for `key` if it is younger than `ttl`, else None."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or self.clock() - entry[0] >= self.ttl:
                return None
            self._entries.move_to_end(key)
            return entry[1]

    def put(self, key: str, value: V) -> V:
        with self._lock:
            self._entries[key] = (self.clock(), value)
            self._entries.move_to_end(key)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
        return value

    def late(self, key: str) -> V | None:
        """The value cached for `key` if it is younger than twice `ttl`, else None: what a
        reader uses while another reads it again."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or self.clock() - entry[0] >= 2 * self.ttl:
                return None
            return entry[1]

    def expired(self, limit: int) -> list[str]:
        """Up to `limit` keys whose entries expired within the last `ttl` (read again, they
        will likely be used again: the cache keeps what sends used lately), oldest first."""
        with self._lock:
            now = self.clock()
            return [key for key, (at, _) in self._entries.items() if self.ttl <= now - at < 2 * self.ttl][
                :limit
            ]

    def drop(self, key: str | None = None) -> None:
        """Forget `key`, or everything."""
        with self._lock:
            if key is None:
                self._entries.clear()
            else:
                self._entries.pop(key, None)

    def __len__(self) -> int:
        return len(self._entries)
