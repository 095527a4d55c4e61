"""Waking an idle sender: PostgreSQL LISTEN/NOTIFY where there is one, else the poll timer.

`Outbox` sends a NOTIFY on this channel in the queueing transaction; PostgreSQL delivers it
at commit, so a sender wakes as soon as a post can be seen, and never for a rolled-back one.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from django.db import connections

from django_connector_outbox.conf import NOTIFY_CHANNEL

logger = logging.getLogger("django_connector_outbox.sender")


class Wakeup:
    """An event set by finished sends, by NOTIFY (on PostgreSQL) and by `stop()`."""

    def __init__(self, using: str, poll: float) -> None:
        self.using = using
        self.poll = poll
        self._event = threading.Event()
        self._closed = threading.Event()
        self._listener: threading.Thread | None = None

    def start(self) -> None:
        if connections[self.using].vendor == "postgresql":
            self._listener = threading.Thread(target=self._listen, name="outbox-listen", daemon=True)
            self._listener.start()

    def set(self) -> None:
        self._event.set()

    def clear(self) -> None:
        self._event.clear()

    def wait(self, timeout: float | None) -> bool:
        return self._event.wait(timeout)

    def close(self) -> None:
        self._closed.set()
        if self._listener is not None:
            self._listener.join(timeout=5)

    def _listen(self) -> None:
        import psycopg

        params = self._connection_params()
        while not self._closed.is_set():
            try:
                with psycopg.connect(**params, autocommit=True) as conn:
                    conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    logger.info("listening for wake-ups channel=%s", NOTIFY_CHANNEL)
                    self._event.set()  # (re)connected: anything queued meanwhile is due now
                    while not self._closed.is_set():
                        for _ in conn.notifies(timeout=0.5, stop_after=1):
                            self._event.set()
            except psycopg.Error as e:
                logger.warning("listen connection lost, reconnecting error=%r", str(e).strip())
                self._closed.wait(min(self.poll, 1.0))

    def _connection_params(self) -> dict[str, Any]:
        params = dict(connections[self.using].get_connection_params())
        for django_only in ("cursor_factory", "context", "server_side_binding", "prepare_threshold"):
            params.pop(django_only, None)
        return params
