"""Real transactions interleaved at chosen points: each actor a thread with its own connection.

An `Actor` runs one function in a thread of its own (Django's connections are per thread, so
it holds its own database session and its own locks). It can stop before the first statement
that a predicate picks (`pause`: Django's `execute_wrapper`, which sees the ORM's statements,
not the raw psycopg cursors of store/postgres.py), and the test lets it go on with `resume()`.

The test orders actors by events only: an actor that has paused, has finished, or waits for a
lock another actor holds. The last has no event: `reached` asks the database (PostgreSQL's
`pg_blocking_pids`, InnoDB's list of transactions in LOCK WAIT, MySQL's sessions waiting in
GET_LOCK), and `wait_for` polls it; that poll is the only timing here. MariaDB's
INFORMATION_SCHEMA.INNODB_TRX leaves out transactions waiting inside an INSERT (10.11), so
InnoDB's status report is read instead.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import connection, connections

# How long an orchestration step may take before the test fails (a hang, not a speed limit).
STEP_TIMEOUT = 30.0


def backend_id() -> int:
    """This thread's database session, as the server names it."""
    query = "SELECT pg_backend_pid()" if connection.vendor == "postgresql" else "SELECT CONNECTION_ID()"
    with connection.cursor() as cursor:
        cursor.execute(query)
        return int(cursor.fetchone()[0])


def waits_for_a_lock(session: int) -> bool:
    """Whether the session `session` waits for a row lock (read on this thread's connection)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT cardinality(pg_blocking_pids(%s)) > 0", [session])
            return bool(cursor.fetchone()[0])
        # A named lock (store.creating) is waited for in GET_LOCK, not in InnoDB.
        cursor.execute("SELECT state FROM information_schema.processlist WHERE id = %s", [session])
        row = cursor.fetchone()
        if row and row[0] == "User lock":
            return True
        cursor.execute("SHOW ENGINE INNODB STATUS")
        status = cursor.fetchone()[2]
    for block in status.split("---TRANSACTION")[1:]:
        thread = re.search(r"thread id (\d+),", block)
        if thread and int(thread.group(1)) == session and "LOCK WAIT" in block:
            return True
    return False


def wait_for(condition: Callable[[], bool], what: str, timeout: float = STEP_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.01)  # polls the server's lock table: a lock wait has no event


class Actor:
    """One transaction (or call) on a thread and connection of its own."""

    def __init__(
        self, name: str, fn: Callable[[], Any], *, pause: Callable[[str], bool] | None = None
    ) -> None:
        self.name = name
        self.fn = fn
        self.pause = pause
        self.paused = threading.Event()
        self.done = threading.Event()
        self._resume = threading.Event()
        self._ready = threading.Event()
        self.session = 0
        self.result: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> Actor:
        self.thread.start()
        if not self._ready.wait(STEP_TIMEOUT):
            raise AssertionError(f"{self.name} did not connect")
        return self

    def _pause_point(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if self.pause is not None and not self.paused.is_set() and self.pause(sql):
            self.paused.set()
            self._resume.wait(STEP_TIMEOUT)
        return execute(sql, params, many, context)

    def _run(self) -> None:
        try:
            self.session = backend_id() if connection.vendor != "sqlite" else 0
            self._ready.set()
            with connection.execute_wrapper(self._pause_point):
                self.result = self.fn()
        except BaseException as e:  # handed to the test by join()
            self.error = e
        finally:
            self._ready.set()
            self.done.set()
            connections.close_all()

    def waiting(self) -> bool:
        return not self.done.is_set() and waits_for_a_lock(self.session)

    def reached(self) -> bool:
        """Paused, finished, or waiting for a lock: it can go no further on its own for now."""
        return self.paused.is_set() or self.done.is_set() or self.waiting()

    def resume(self) -> None:
        self._resume.set()

    def join(self) -> Any:
        """Its function's result; re-raises what it raised."""
        self.resume()
        if not self.done.wait(STEP_TIMEOUT):
            raise AssertionError(f"{self.name} did not finish")
        self.thread.join(STEP_TIMEOUT)
        if self.error is not None:
            raise self.error
        return self.result


def updates(table: str) -> Callable[[str], bool]:
    """A pause predicate: the first UPDATE of `table`."""
    return lambda sql: sql.lstrip().upper().startswith("UPDATE") and table in sql


def inserts(table: str) -> Callable[[str], bool]:
    """A pause predicate: the first INSERT into `table`."""
    return lambda sql: sql.lstrip().upper().startswith("INSERT") and table in sql
