"""The event-loop engine of run_outbox's sender: coroutine sends in flight by the hundred on
one loop, blocking sends no more than its threads, and nothing refused once started."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections import Counter
from typing import ClassVar

import pytest
from django.conf import settings
from django.test import override_settings

from django_connector_outbox import Outbox, engine, sender
from django_connector_outbox.connectors.base import Connector, Delivered, Outcome
from django_connector_outbox.models import Post
from django_connector_outbox.posts import ClaimedPost
from django_connector_outbox.sender import Sender

pytestmark = pytest.mark.django_db


def served_by(backend: str):
    return override_settings(
        CONNECTOR_OUTBOX={**settings.CONNECTOR_OUTBOX, "CONNECTORS": {"memory": {"BACKEND": backend}}}
    )


def queue_heads(clock, count: int) -> None:
    """`count` posts, each the head of a container of its own: all may be in flight at once."""
    Outbox("memory", clock=clock).queue_many(
        dict(post_id=f"p{n}", workspace_id="T1", container_id=f"C{n}", body={"text": "hi"})
        for n in range(count)
    )


def sending() -> int:
    return Post.objects.in_states(("sending",)).count()


class HeldCoroutineConnector(Connector):
    """Coroutine sends that all wait for one release; `started` is set once `expected` wait."""

    expected: ClassVar[int] = 0
    started: ClassVar[threading.Event]
    release: ClassVar[asyncio.Event | None] = None
    loop: ClassVar[asyncio.AbstractEventLoop | None] = None
    waiting: ClassVar[int] = 0
    threads: ClassVar[set[str]] = set()

    async def asend(self, post: ClaimedPost) -> Outcome:
        cls = type(self)
        if cls.release is None:
            cls.release, cls.loop = asyncio.Event(), asyncio.get_running_loop()
        cls.threads.add(threading.current_thread().name)
        cls.waiting += 1
        if cls.waiting == cls.expected:
            cls.started.set()
        await cls.release.wait()
        return Delivered(f"m-{post.post_id}")

    @classmethod
    def reset(cls, expected: int) -> None:
        cls.expected, cls.started, cls.release, cls.loop, cls.waiting = (
            expected,
            threading.Event(),
            None,
            None,
            0,
        )
        cls.threads = set()

    @classmethod
    def let_go(cls) -> None:
        assert cls.loop is not None and cls.release is not None
        cls.loop.call_soon_threadsafe(cls.release.set)


class HeldBlockingConnector(Connector):
    """Blocking sends that wait for one release (a threading.Event); `started` is set by each."""

    release: ClassVar[threading.Event] = threading.Event()
    started: ClassVar[threading.Event] = threading.Event()

    def send(self, post: ClaimedPost) -> Outcome:
        type(self).started.set()
        assert type(self).release.wait(30)
        return Delivered(f"m-{post.post_id}")


def test_hundreds_of_coroutine_sends_are_in_flight_at_once_on_one_loop_thread(clock):
    HeldCoroutineConnector.reset(expected=300)
    with served_by("tests.test_engine.HeldCoroutineConnector"):
        queue_heads(clock, 300)
        s = Sender(["memory"], clock=clock, concurrency=1000)
        try:
            s.turn()  # claims every head and starts them: one crossing to the loop
            assert HeldCoroutineConnector.started.wait(10), HeldCoroutineConnector.waiting
            assert (s.in_flight, sending()) == (300, 300)
            assert HeldCoroutineConnector.threads == {"outbox-loop"}
            HeldCoroutineConnector.let_go()
            s.stop()
            while s.turn() is not None:
                s.wakeup.wait(1)
        finally:
            s.close()
    assert Post.objects.filter(state="posted").count() == 300


def test_a_blocking_connector_gets_no_more_claims_than_the_engine_has_threads(clock, monkeypatch):
    # A claim waiting for a thread would wait while its lease runs: it is never claimed.
    monkeypatch.setattr(sender, "BLOCKING_THREADS", 4)
    monkeypatch.setattr(engine, "BLOCKING_THREADS", 4)
    HeldBlockingConnector.release = threading.Event()
    with served_by("tests.test_engine.HeldBlockingConnector"):
        queue_heads(clock, 20)
        s = Sender(["memory"], clock=clock, concurrency=1000)
        try:
            s.turn()
            s.turn()  # nothing finished: still no room on the threads
            assert (s.in_flight, sending()) == (4, 4)
            HeldBlockingConnector.release.set()
            while sending() or Post.objects.filter(state="queued").exists():
                s.wakeup.wait(1)
                s.turn()
                assert s.in_flight <= 4
        finally:
            HeldBlockingConnector.release.set()
            s.stop()
            s.close()
    assert Post.objects.filter(state="posted").count() == 20


def test_stopping_gives_back_blocking_sends_not_started_and_lets_started_ones_finish(clock, monkeypatch):
    # One thread: the first send holds it, the second waits for it when the sender stops.
    monkeypatch.setattr(engine, "BLOCKING_THREADS", 1)
    HeldBlockingConnector.release, HeldBlockingConnector.started = threading.Event(), threading.Event()
    with served_by("tests.test_engine.HeldBlockingConnector"):
        queue_heads(clock, 2)
        s = Sender(["memory"], clock=clock, concurrency=1000)
        s._in_threads_by_source["memory"] = False  # claim both, so that one waits for the thread
        try:
            s.turn()
            assert s.in_flight == 2
            assert HeldBlockingConnector.started.wait(10)  # the first holds the thread
            s.stop()
            s.turn()  # stopping: what has not started will not start
            HeldBlockingConnector.release.set()
            while s.turn() is not None:
                s.wakeup.wait(1)
        finally:
            s.close()
    # One sent; the other given back, never sent, as if it had never been claimed.
    assert Counter(Post.objects.values_list("state", flat=True)) == Counter({"posted": 1, "queued": 1})


class CoroutineOnlyConnector(Connector):
    """`asend` and nothing blocking: complete, in a test's delivery as in run_outbox."""

    async def asend(self, post: ClaimedPost) -> Outcome:
        await asyncio.sleep(0)  # a real suspension: it needs a running loop
        return Delivered(f"m-{post.post_id}")


def test_a_connector_with_only_coroutines_is_delivered_by_the_testing_helper(clock):
    from django_connector_outbox.testing import deliver_due

    with served_by("tests.test_engine.CoroutineOnlyConnector"):
        queue_heads(clock, 3)
        deliver_due("memory", clock=clock)
    assert sorted(Post.objects.filter(state="posted").values_list("message_ref", flat=True)) == [
        "m-p0", "m-p1", "m-p2",
    ]  # fmt: skip


def test_the_loop_lag_is_how_long_something_held_the_loop_and_is_read_once():
    finished = threading.Event()
    loop_engine: engine.LoopEngine[str, str] = engine.LoopEngine(10, finished.set)

    async def holds_the_loop() -> str:
        import time

        time.sleep(0.2)  # a connector that blocks the loop (the defect the probe shows)
        await asyncio.sleep(engine.LAG_PROBE * 3)  # the probe wakes, late, and notes it
        return "done"

    try:
        assert loop_engine.loop_lag() is None  # no loop yet
        loop_engine.start([("held", holds_the_loop)])
        assert finished.wait(10)
        assert loop_engine.take() == [("held", "done")]
        lag = loop_engine.loop_lag()
        assert lag is not None and 0.15 <= lag < 1.0
        assert (loop_engine.loop_lag() or 0.0) < 0.15  # read once: the next interval's own
    finally:
        loop_engine.close([], forced=False)


def test_thousands_of_sends_started_at_once_start_a_chunk_per_loop_iteration_and_all_finish():
    finished = threading.Event()
    loop_engine: engine.LoopEngine[int, int] = engine.LoopEngine(10_000, finished.set)
    iteration = 0
    first_steps: Counter[int] = Counter()  # loop iteration -> sends that took their first step

    def count_iterations() -> None:
        nonlocal iteration
        iteration += 1
        asyncio.get_running_loop().call_soon(count_iterations)

    async def job(n: int) -> int:
        first_steps[iteration] += 1
        await asyncio.sleep(0)
        return n

    loop = loop_engine._running()
    loop.call_soon_threadsafe(count_iterations)
    taken: list[tuple[int, int | BaseException]] = []
    try:
        loop_engine.start([(n, functools.partial(job, n)) for n in range(10_000)])
        while len(taken) < 10_000:
            assert finished.wait(10)
            finished.clear()
            taken += loop_engine.take()
        loop_engine.wait()
    finally:
        loop_engine.close([], forced=False)
    assert sorted(result for _, result in taken) == list(range(10_000))
    assert max(first_steps.values()) <= engine.SPAWN_CHUNK  # the loop ran its other work between
    assert len(first_steps) >= 10_000 // engine.SPAWN_CHUNK


def test_a_sender_with_every_slot_busy_still_wakes_for_its_heartbeat(clock):
    HeldCoroutineConnector.reset(expected=2)
    with served_by("tests.test_engine.HeldCoroutineConnector"):
        queue_heads(clock, 2)
        s = Sender(["memory"], clock=clock, concurrency=2, heartbeat=True)
        try:
            s.turn()
            assert HeldCoroutineConnector.started.wait(10)
            pause = s.turn()  # both slots busy, nothing finished
            assert pause == s.pulse.interval  # not "until a send finishes": a beat is due then
            HeldCoroutineConnector.let_go()
            s.stop()
            while s.turn() is not None:
                s.wakeup.wait(1)
        finally:
            s.close()
    assert Post.objects.filter(state="posted").count() == 2
