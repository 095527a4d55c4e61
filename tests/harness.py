"""An executor that runs nothing until the test says so: sends are events a test schedules.

`Sender(executor=ManualExecutor())` hands every delivery to it; the test then runs them one
by one (in any order, after moving the clock, or never: a sender killed mid-send).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any


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
