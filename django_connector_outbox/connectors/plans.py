"""Plans: a send or a lookup written once for a connector's blocking and coroutine forms.

A plan is a generator that yields its steps (a platform call, or `Offload`: work that may block,
such as the database or a token refresh), is sent each step's answer or has the step's
exception thrown in, and returns the result. `Driven` carries one out a step at a time for a
driver that makes each call its own way: in place for `send`, awaited (and the blocking work
off the event loop) for `asend` (`HttpConnector._run`/`_arun`, `SlackConnector._run`/`_arun`).
So a platform's request building, answer mapping and retries exist once, whichever form runs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

S = TypeVar("S")
T = TypeVar("T")


@dataclass(frozen=True)
class Offload:
    """Work of a plan that may block (the database, a token fetch): done in place by the
    blocking driver, in a thread by the coroutine one. Its exception goes back into the plan."""

    call: Callable[[], Any]


def offload(call: Callable[..., T], /, *args: Any) -> Generator[Offload, Any, T]:
    """``result = yield from offload(f, x)`` in a plan: ``f(x)``, off the event loop in the
    coroutine form; its exception raised in the plan."""
    result: T = yield Offload(functools.partial(call, *args))
    return result


def cached_or(known: T | None, call: Callable[..., T], /, *args: Any) -> Generator[Offload, Any, T]:
    """``result = yield from cached_or(store.cached(x), store.read, x)`` in a plan: what a
    cache already holds at once, else ``read(x)`` as `offload` does. The coroutine form then
    takes no thread per send whose workspace's credentials (or container's destination) are
    cached: only a miss or an expired entry reads the database, off the loop."""
    if known is not None:
        return known
    return (yield from offload(call, *args))


class Driven(Generic[S, T]):
    """A plan being carried out: the answer (or failure) of its last step, then its result."""

    def __init__(self, plan: Generator[S, Any, T]) -> None:
        self.plan = plan
        self.answer: Any = None
        self.failure: Exception | None = None
        self.result: T

    def next_step(self) -> S | None:
        """The plan's next step, given the last one's answer; None once it returned."""
        try:
            step = self.plan.send(self.answer) if self.failure is None else self.plan.throw(self.failure)
        except StopIteration as done:
            self.result = done.value
            return None
        self.answer, self.failure = None, None
        return step
