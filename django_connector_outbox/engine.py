"""Where a sender's deliveries run: one event loop in a thread of its own, or an executor.

The sender's thread does all database work; the engine runs the deliveries it starts (one
coroutine each, `sender.adeliver`) and hands their results back. `LoopEngine`, run_outbox's,
drives every delivery in flight on one event loop: a coroutine connector's sends cost a task
each, not a thread, so thousands can be in flight. `ExecutorEngine` is the seam of tests and of
deliveries in process: each delivery is submitted to the executor the caller gave, which runs
it whenever and wherever the caller decides (the caller's thread and transaction).

Invariants (LoopEngine):
- One hop per batch, not per post: a batch of claims crosses to the loop in one
  `call_soon_threadsafe`, and results come back through a deque that the sender takes in one
  go; the sender is woken at most once per loop iteration, however many deliveries finished.
- A platform call that has started is never abandoned while the sender stops gracefully:
  stopping only refuses blocking calls that have not started (`NotStarted`, which the delivery
  gives back), so a claim is given back only if nothing of it reached the platform.
- Blocking connector methods run on a pool of at most BLOCKING_THREADS threads, with the task's
  context (`blocking`), never on the loop.
- The loop's health is measured, not assumed: a probe task sleeps LAG_PROBE at a time and
  keeps how late it woke (`loop_lag`), which is how long something held the loop; the sender
  writes the worst of each heartbeat interval to its row (outbox_status, the metrics).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
from collections import deque
from collections.abc import Callable, Coroutine, Iterable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any, Generic, TypeVar

from django_connector_outbox.connectors.base import NotStarted, in_flight_limit, run_blocking

logger = logging.getLogger("django_connector_outbox.sender")

K = TypeVar("K")
R = TypeVar("R")

# Threads for connectors that define blocking methods only: each send in flight holds one. A
# coroutine connector needs none of them; a blocking one cannot have more sends in flight.
BLOCKING_THREADS = 64

# How long a forced stop waits for the connectors to close and the loop to stop.
FORCED_WAIT = 5.0

# Tasks started per loop iteration: a turn's claims (up to the concurrency: thousands) start a
# chunk at a time, so that what else is ready runs between chunks (the first steps of 10,000
# tasks started at once held the loop 118 ms; 250 hold it about 3 ms).
SPAWN_CHUNK = 250

# Seconds between two wake-ups of the lag probe: a wake-up later than this by more than the
# loop's own jitter (a millisecond) means a callback or a task held the loop that long.
LAG_PROBE = 0.05

#: What a finished delivery hands back: its key, and its result or the exception it raised.
Done = tuple[K, R | BaseException]
Job = Callable[[], Coroutine[Any, Any, R]]


class LoopEngine(Generic[K, R]):
    """Runs deliveries as tasks of one event loop, in a thread named ``outbox-loop``."""

    def __init__(self, concurrency: int, wake: Callable[[], None]) -> None:
        self._wake = wake
        self._concurrency = concurrency
        self._pool = ThreadPoolExecutor(
            max_workers=max(1, min(concurrency, BLOCKING_THREADS)), thread_name_prefix="outbox-send"
        )
        self._tasks: set[asyncio.Task[R | BaseException]] = set()
        self._done: deque[Done[K, R]] = deque()
        self._in_flight = 0  # the sender's count: started and not yet taken back
        self._waking = False
        self._refusing = False
        self._worst_lag: float | None = None  # since `loop_lag` last read it; None: no probe yet
        self._unspawned = 0  # jobs started and waiting for their chunk (on the loop only)
        self._cancelled = False
        self._probe: asyncio.Task[None] | None = None
        # Made with the first delivery: a sender made and never run leaves no loop behind.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, name="outbox-loop", daemon=True)

    def _run(self) -> None:
        assert self._loop is not None
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def _running(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._thread.start()
            self._loop.call_soon_threadsafe(self._start_probe)
        return self._loop

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def loop_lag(self) -> float | None:
        """The longest the loop was held (seconds) since the last call, or None before the
        loop runs. Read from the sender's thread."""
        worst, self._worst_lag = self._worst_lag, (0.0 if self._worst_lag is not None else None)
        return worst

    def start(self, jobs: list[tuple[K, Job[R]]]) -> None:
        """Start each job's coroutine on the loop: one crossing for them all."""
        if jobs:
            self._in_flight += len(jobs)
            self._running().call_soon_threadsafe(self._spawn, jobs)

    def take(self) -> list[Done[K, R]]:
        """The deliveries finished since the last call."""
        taken = []
        while self._done:
            taken.append(self._done.popleft())
        self._in_flight -= len(taken)
        return taken

    def refuse_unstarted(self) -> None:
        """From now on a blocking call that has not started raises NotStarted instead."""
        self._refusing = True

    def wait(self) -> None:
        """Until every delivery started has finished (the sender is stopping)."""
        if self._loop is not None and self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._all_finished(), self._loop).result()

    def close(self, closing: Iterable[Callable[[], Coroutine[Any, Any, None]]], *, forced: bool) -> None:
        """Cancel what is left when `forced`, await each of `closing` (the connectors'
        `aclose`) on the loop, then stop it and release the threads."""
        loop = self._loop
        if loop is None:  # never started
            self._pool.shutdown()
            return
        loop.call_soon_threadsafe(self._stop_probe)
        if forced:
            loop.call_soon_threadsafe(self._cancel_all)
        wait = FORCED_WAIT if forced else None
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._close_all(list(closing)), loop).result(wait)
        loop.call_soon_threadsafe(loop.stop)
        self._thread.join(wait)
        self._pool.shutdown(wait=not forced, cancel_futures=True)
        if not self._thread.is_alive():
            loop.close()

    # -- on the loop ----------------------------------------------------------------------

    def _start_probe(self) -> None:
        self._probe = asyncio.get_running_loop().create_task(self._measure_lag())

    def _stop_probe(self) -> None:
        if self._probe is not None:
            self._probe.cancel()

    async def _measure_lag(self) -> None:
        loop = asyncio.get_running_loop()
        self._worst_lag = 0.0
        while True:
            before = loop.time()
            await asyncio.sleep(LAG_PROBE)
            late = loop.time() - before - LAG_PROBE
            self._worst_lag = max(self._worst_lag or 0.0, late)

    def _spawn(self, jobs: list[tuple[K, Job[R]]], first: int = 0) -> None:
        if self._cancelled:  # a forced stop: what has not started never does
            return
        if first == 0:
            self._unspawned += len(jobs)
        loop = asyncio.get_running_loop()
        chunk = jobs[first : first + SPAWN_CHUNK]
        for key, job in chunk:
            task = loop.create_task(self._with_pool(job))
            self._tasks.add(task)
            task.add_done_callback(functools.partial(self._finished, key))
        self._unspawned -= len(chunk)
        if self._unspawned and first + SPAWN_CHUNK < len(jobs):
            loop.call_soon(self._spawn, jobs, first + SPAWN_CHUNK)

    async def _with_pool(self, job: Job[R]) -> R | BaseException:
        run_blocking.set(self._blocking)  # this task's context only
        in_flight_limit.set(self._concurrency)  # what the connectors' clients size their pools by
        try:
            return await job()
        except (KeyboardInterrupt, SystemExit) as e:
            return e  # handed back like a result: raised in a task, asyncio stops the loop with it

    async def _blocking(self, call: Callable[[], Any]) -> Any:
        def started() -> Any:
            if self._refusing:
                raise NotStarted("the sender is stopping")
            return call()

        return await asyncio.get_running_loop().run_in_executor(self._pool, started)

    def _finished(self, key: K, task: asyncio.Task[R | BaseException]) -> None:
        self._tasks.discard(task)
        result: R | BaseException = (
            asyncio.CancelledError() if task.cancelled() else task.exception() or task.result()
        )
        self._done.append((key, result))
        if not self._waking:  # once per loop iteration, after every callback ready in it
            self._waking = True
            asyncio.get_running_loop().call_soon(self._wake_sender)

    def _wake_sender(self) -> None:
        self._waking = False
        self._wake()

    async def _all_finished(self) -> None:
        while self._tasks or self._unspawned:
            if self._tasks:
                await asyncio.wait(list(self._tasks))
            else:
                await asyncio.sleep(0)  # the next chunk starts

    def _cancel_all(self) -> None:
        self._cancelled = True
        for task in self._tasks:
            task.cancel()

    async def _close_all(self, closing: list[Callable[[], Coroutine[Any, Any, None]]]) -> None:
        for close in closing:
            try:
                await close()
            except Exception:
                logger.exception("a connector's aclose raised")


_local = threading.local()


@contextlib.contextmanager
def loop_hidden() -> Iterator[None]:
    """Inside a coroutine, run synchronous code as this thread's, not the loop's: Django then
    allows the ORM and gives this thread's connection (in an async context it refuses the ORM
    and keeps connections per task). Nothing else runs on the loop meanwhile: the code holds
    the thread."""
    loop = asyncio.get_running_loop()
    asyncio.events._set_running_loop(None)
    try:
        yield
    finally:
        asyncio.events._set_running_loop(loop)


async def _inline(call: Callable[[], Any]) -> Any:
    """`call()` on this thread, on the caller's connection and transaction."""
    with loop_hidden():
        return call()


async def _with_inline(job: Job[R]) -> R:
    run_blocking.set(_inline)  # this task's context only
    return await job()


class _ThreadLoop:
    """This thread's event loop, closed with the thread (when its locals go)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def __del__(self) -> None:
        self.loop.close()


def run_inline(job: Job[R]) -> R:
    """Run `job` to its end on this thread, blocking calls included (so that they see this
    thread's connection and transaction), on an event loop kept for the thread: a coroutine
    connector's client stays bound to one loop."""
    if getattr(_local, "thread_loop", None) is None:
        _local.thread_loop = _ThreadLoop()
    own: _ThreadLoop = _local.thread_loop
    return own.loop.run_until_complete(_with_inline(job))


class ExecutorEngine(Generic[K, R]):
    """Runs each delivery to its end as one call submitted to the caller's executor (a test's,
    or an in-process delivery's): the caller decides when and on which thread (`run_inline`)."""

    def __init__(self, executor: Executor, wake: Callable[[], None]) -> None:
        self._executor = executor
        self._wake = wake
        self._futures: dict[Future[R], K] = {}

    @property
    def in_flight(self) -> int:
        return len(self._futures)

    def loop_lag(self) -> float | None:
        """None: there is no loop of its own to hold (the caller's executor runs deliveries)."""
        return None

    def start(self, jobs: list[tuple[K, Job[R]]]) -> None:
        for key, job in jobs:
            future = self._executor.submit(run_inline, job)
            future.add_done_callback(lambda _: self._wake())
            self._futures[future] = key

    def take(self) -> list[Done[K, R]]:
        taken: list[Done[K, R]] = []
        for future in [f for f in self._futures if f.done()]:
            key = self._futures.pop(future)
            if future.cancelled():
                taken.append((key, NotStarted("cancelled before it started")))
            else:
                taken.append((key, future.exception() or future.result()))
        return taken

    def refuse_unstarted(self) -> None:
        for future in self._futures:
            future.cancel()

    def wait(self) -> None:
        for future in list(self._futures):
            with contextlib.suppress(BaseException):
                future.result()

    def close(self, closing: Iterable[Callable[[], Coroutine[Any, Any, None]]], *, forced: bool) -> None:
        """Nothing of its own to release: the executor is the caller's, and so are its threads'
        connectors (closed when settings change)."""
