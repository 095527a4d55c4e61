"""An executor that runs nothing until the test says so: sends are events a test schedules.

`Sender(executor=ManualExecutor())` hands every delivery to it; the test then runs them one
by one (in any order, after moving the clock, or never: a sender killed mid-send).
`StatementFaults` interrupts a chosen database statement: a sender killed between two
statements, or a dropped connection.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from pathlib import Path
from typing import Any
from unittest import mock


class ManualExecutor(Executor):
    def __init__(self) -> None:
        self.pending: list[tuple[Future[Any], Callable[[], Any]]] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self.pending.append((future, lambda: fn(*args, **kwargs)))
        return future

    def run(self, index: int = 0) -> bool:
        """Run the pending call at `index`; False if it had been cancelled meanwhile."""
        future, call = self.pending.pop(index)
        if not future.set_running_or_notify_cancel():
            return False
        try:
            future.set_result(call())
        except BaseException as e:
            future.set_exception(e)
        return True

    def run_all(self) -> int:
        ran = 0
        while self.pending:
            ran += self.run()
        return ran


class Interrupted(BaseException):
    """A sender killed between two statements: not an Exception, so no `except` of the
    package catches it, as none would catch the process dying."""


class StatementFaults:
    """Interrupts the Nth database statement from when it is armed, on every backend.

    As a context manager it sees each statement of the connection: Django's through
    `execute_wrapper`, and PostgreSQL's hot paths (raw psycopg cursors, which execute_wrapper
    does not see) through a proxy of `postgres.cursor`. `arm(n, kill=True)` raises
    `Interrupted` right after the nth statement (the transaction around it rolls back);
    `arm(n, kill=False)` raises Django's OperationalError instead of running it (a dropped
    connection). Either fires once, then disarms.
    """

    def __init__(self, using: str = "default") -> None:
        self.using = using
        self.statements = 0  # since armed
        self.fired = 0
        self._at: int | None = None
        self._kill = False
        self._stack = contextlib.ExitStack()

    def arm(self, at: int, *, kill: bool) -> None:
        self.statements, self._at, self._kill = 0, at, kill

    def disarm(self) -> None:
        self._at = None

    @property
    def armed(self) -> bool:
        return self._at is not None

    def __enter__(self) -> StatementFaults:
        from django.db import connections

        from django_connector_outbox.store import postgres

        real_cursor = postgres.cursor
        self._stack.enter_context(connections[self.using].execute_wrapper(self._wrap))
        self._stack.enter_context(
            mock.patch.object(postgres, "cursor", lambda using: _HookedCursor(real_cursor(using), self))
        )
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def _wrap(self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        return self.around(lambda: execute(sql, params, many, context))

    def around(self, statement: Callable[[], Any]) -> Any:
        if self._at is None:
            return statement()
        self.statements += 1
        if self.statements < self._at:
            return statement()
        kill, self._at = self._kill, None
        self.fired += 1
        if not kill:
            from django.db import OperationalError

            raise OperationalError("server closed the connection unexpectedly (simulated)")
        statement()
        raise Interrupted(f"killed after statement {self.statements}")


class _HookedCursor:
    """`postgres.cursor(using)`, whose psycopg cursor's executions go through StatementFaults.around."""

    def __init__(self, opened: Any, faults: StatementFaults) -> None:
        self._opened = opened  # the context manager that postgres.cursor returns
        self._faults = faults
        self._cursor: Any = None

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        return self._faults.around(lambda: self._cursor.execute(*args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)

    def __enter__(self) -> _HookedCursor:
        self._cursor = self._opened.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self._opened.__exit__(*exc)


ROOT = Path(__file__).resolve().parent.parent


def manage(database: str, *args: str | bytes) -> subprocess.CompletedProcess[bytes]:
    """`python -m django ARGS` in a process of its own, on `database` (TEST_DATABASE_NAME),
    with the arguments as given (bytes: what a shell passes when they are not UTF-8)."""
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="tests.settings",
        TEST_DATABASE_NAME=database,
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
    )
    return subprocess.run(
        [sys.executable, "-m", "django", *args], capture_output=True, env=env, timeout=60, check=False
    )


def heartbeat_row_where(check: Callable[[Any], bool], deadline: float = 20.0) -> Any:
    """Poll the senders' table until a row passes `check`; that row (a row written by another
    process has no event to await)."""
    from django_connector_outbox.models import Heartbeat

    end = time.monotonic() + deadline
    while time.monotonic() < end:
        for row in Heartbeat.objects.all():
            if check(row):
                return row
        time.sleep(0.05)
    raise AssertionError(
        f"no heartbeat row as expected within {deadline}s: {list(Heartbeat.objects.values())}"
    )


def run_together(processes: list[Any], start: Any, timeout: float) -> list[int | None]:
    """Start `processes` (multiprocessing), release them at once through the `start` barrier
    (this test is its last party: a broken barrier means one failed to start, and its own
    report says why), wait up to `timeout` seconds each, end any left; their exit codes."""
    from django.db import connection

    connection.close()  # nothing of the test's stays open while they run
    for process in processes:
        process.start()
    try:
        with contextlib.suppress(threading.BrokenBarrierError):
            start.wait(timeout=120)
        for process in processes:
            process.join(timeout=timeout)
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
                process.join(5)
    return [process.exitcode for process in processes]
