"""Helpers for the tests of a project that queues posts; any test runner (pytest fixtures: pytest_plugin).

What `django.core.mail.outbox` and the locmem backend give for email: `memory_connectors()`
swaps the configured connectors for in-memory ones, `queued()` lists what is waiting,
`deliver_due()` delivers what is due in-process (through the real Sender and Outbox, on the
caller's thread and database connection, so it sees the test's transaction) and returns what
each source received (`adeliver_due()`: the same, awaited in an async test), and `TestClock`
moves time through the `clock=` seams of `Outbox`, `Sender`, `deliver_due` and
``call_command("run_outbox", clock=...)``.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar, cast

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.test import override_settings
from django.test.utils import TestContextDecorator
from django.utils import timezone

from django_connector_outbox import signals
from django_connector_outbox.conf import conf, connector_kinds, seconds, source_config
from django_connector_outbox.connectors import connectors, load_connector
from django_connector_outbox.connectors.base import native
from django_connector_outbox.connectors.memory import MemoryConnector
from django_connector_outbox.engine import loop_hidden
from django_connector_outbox.immediate import InlineExecutor
from django_connector_outbox.message import Message, message_of
from django_connector_outbox.models import QUEUE_ORDER, Post
from django_connector_outbox.outbox import Clock
from django_connector_outbox.posts import ClaimedPost, State
from django_connector_outbox.sender import Sender

__all__ = [
    "MEMORY_BACKEND",
    "DeliveredPost",
    "Deliveries",
    "QueuedPost",
    "TestClock",
    "adeliver_due",
    "deliver_due",
    "memory_connectors",
    "queued",
]

MEMORY_BACKEND = "django_connector_outbox.connectors.memory.MemoryConnector"

R = TypeVar("R")


class TestClock:
    """A clock for `clock=`: Django's time plus an offset that the test moves.

    It starts at `start` (default: now) and ticks with real time, so that posts your code
    queues on Django's own clock are due on this one too; `tick=False` freezes it between moves.
    """

    __test__ = False  # a helper, not a test class for pytest to collect

    def __init__(self, start: datetime | None = None, *, tick: bool = True) -> None:
        self.tick = tick
        self.move_to(start or timezone.now())

    def __call__(self) -> datetime:
        if not self.tick:
            return self._at
        return self._at + (timezone.now() - self._since)

    def advance(self, by: float | timedelta) -> None:
        """Move the clock forward by `by` (seconds or a timedelta)."""
        self._at += timedelta(seconds=seconds(by))

    def move_to(self, when: datetime) -> None:
        """Set the clock to `when`, an aware datetime."""
        if timezone.is_naive(when):
            raise ValueError(f"TestClock needs an aware datetime, not {when!r}")
        self._at, self._since = when, timezone.now()

    def __repr__(self) -> str:
        return f"TestClock({self()!r}, tick={self.tick})"


@dataclass(frozen=True)
class DeliveredPost:
    """A post the outbox recorded as delivered (or found already delivered), as it was sent:
    a Message's `body` is its connector's rendering, and `message` the Message queued."""

    source: str
    post_id: str
    kind: str
    workspace_id: str
    container_id: str
    thread_id: str
    body: dict[str, Any]
    message_ref: str | None
    # A reply's parent (`thread_of`); its `thread_id` is then the thread it was resolved into.
    thread_of: str | None = None
    # The Message it was queued with, or None for a platform's own body.
    message: Message | None = None


class Deliveries(dict[str, list[DeliveredPost]]):
    """source -> the posts delivered to it, in the order they were recorded; [] for the others."""

    def __missing__(self, source: str) -> list[DeliveredPost]:
        return []


@dataclass(frozen=True)
class QueuedPost:
    """A post waiting to be sent: new, delayed, or back after a failed try (`attempts`, `last_error`)."""

    source: str
    post_id: str
    kind: str
    workspace_id: str
    container_id: str
    thread_id: str
    body: dict[str, Any]
    turn_key: str | None
    due_at: datetime
    attempts: int
    last_error: str
    # The post whose thread it goes into once sent (`thread_of`): its `thread_id` is "" till then.
    thread_of: str | None = None

    @property
    def message(self) -> Message | None:
        """The Message it was queued with (its `body` holds the Message's JSON), or None."""
        return message_of(self.body)


def deliver_due(*sources: str, using: str = DEFAULT_DB_ALIAS, clock: Clock | None = None) -> Deliveries:
    """Deliver every post of `sources` (default: all) that is due, until none is; what was delivered.

    It runs the sender of ``run_outbox --once``, with its sends inline. A post that failed,
    is retried later or lost its reply is not in the result: look at `queued()` or
    `Outbox.find()`, move the clock, and deliver again.
    """
    delivered = Deliveries()
    thread = threading.get_ident()

    def record(*, claim: ClaimedPost, message_ref: str | None, **kwargs: Any) -> None:
        if threading.get_ident() == thread:  # this call's sender, not one running elsewhere
            delivered.setdefault(claim.source, []).append(
                DeliveredPost(
                    claim.source,
                    claim.post_id,
                    claim.kind,
                    claim.workspace_id,
                    claim.container_id,
                    claim.thread_id,
                    native(connectors[claim.source], claim).body,  # rendered as the send was
                    message_ref,
                    claim.parent.post_id if claim.parent else None,
                    message_of(claim.body),
                )
            )

    uid = f"deliver_due-{uuid.uuid4()}"
    signals.post_posted.connect(record, sender=Sender, weak=False, dispatch_uid=uid)
    try:
        Sender(
            sources or None,
            using=using,
            concurrency=conf.CLAIM_BATCH,
            worker="deliver_due",
            once=True,
            clock=clock,
            executor=InlineExecutor(),
        ).run()
    finally:
        signals.post_posted.disconnect(sender=Sender, dispatch_uid=uid)
    return delivered


async def adeliver_due(
    *sources: str, using: str = DEFAULT_DB_ALIAS, clock: Clock | None = None
) -> Deliveries:
    """`deliver_due` for an async test (``await adeliver_due()``), on the test's connection.

    Django's async TestCase runs the test's event loop in a thread of its own: the delivery
    then runs (sync_to_async, thread-sensitive) on the thread that holds the test's connection.
    pytest-asyncio and anyio run the loop on that thread itself, so asgiref runs sync code in
    a thread of its own, which would open a second connection: outside the test's transaction
    (the test's posts unseen) and never closed ("being accessed by other users" when the test
    database is dropped). There the delivery borrows the test's connection instead.
    """
    return await sync_to_async(_on_connection_of, thread_sensitive=True)(
        _sync_connection(using), using, lambda: deliver_due(*sources, using=using, clock=clock)
    )


def _sync_connection(using: str) -> BaseDatabaseWrapper:
    """This thread's connection as its sync code sees it (the one pytest-django's fixtures
    opened the test's transaction on). While a loop runs, Django keeps connections per task
    instead (asgiref's thread-critical Local), so the loop is hidden for the look-up."""
    with loop_hidden():
        return connections[using]


def _on_connection_of(awaiting: BaseDatabaseWrapper, using: str, call: Callable[[], R]) -> R:
    """`call()` on `awaiting` (the awaiting thread's connection, while that thread waits) when
    it is the one in use and this thread's is not in a transaction; on this thread's otherwise."""
    own = connections[using]
    in_use = awaiting.in_atomic_block or awaiting.connection is not None
    if own is awaiting or own.in_atomic_block or not in_use:
        return call()
    awaiting.inc_thread_sharing()  # as LiveServerTestCase shares SQLite's in-memory connection
    connections[using] = awaiting
    try:
        return call()
    finally:
        connections[using] = own
        awaiting.dec_thread_sharing()


def queued(*sources: str, using: str = DEFAULT_DB_ALIAS) -> list[QueuedPost]:
    """The posts of `sources` (default: all) waiting to be sent, in queue order; nothing is sent."""
    posts = Post.objects.using(using).in_state(State.QUEUED)
    if sources:
        posts = posts.filter(source__in=sources)
    return [
        QueuedPost(
            p.source,
            p.post_id,
            p.kind,
            p.workspace_id,
            p.container_id,
            p.thread_id,
            p.body or {},
            p.turn_key,
            p.next_at,
            p.attempts,
            p.last_error,
            p.thread_of,
        )
        for p in posts.order_by(*QUEUE_ORDER)
    ]


class memory_connectors(TestContextDecorator):
    """Deliver `sources` (default: every configured one) through MemoryConnectors, like
    `override_settings`: a context manager (``as platforms``: source -> MemoryConnector), or a
    decorator of a test function or TestCase class (`kwarg_name` / `attr_name` receive them).

    A named source that is not configured is added. Each use starts with empty connectors.
    """

    def __init__(self, *sources: str, attr_name: str | None = None, kwarg_name: str | None = None) -> None:
        super().__init__(attr_name=attr_name, kwarg_name=kwarg_name)
        self.sources = sources
        self._overrides: list[override_settings] = []

    def enable(self) -> dict[str, MemoryConnector]:
        # Read when entered, not when decorating: the settings of the test, not of the import.
        user: dict[str, Any] = getattr(settings, "CONNECTOR_OUTBOX", {})
        configured: dict[str, dict[str, Any]] = user.get("CONNECTORS", {})
        names = self.sources or tuple(configured)
        swapped = dict(configured)
        for name in names:
            # PACE and any other key of the source stay; the platform and its options go, but
            # for what the outbox reads of its connector (what it refuses, how it times leases).
            config = configured.get(name, {})
            kept = {k: v for k, v in config.items() if k not in ("BACKEND", "OPTIONS")}
            stand_in = _stand_in_options(name, config) if config else {}
            swapped[name] = {**kept, "BACKEND": MEMORY_BACKEND, "OPTIONS": stand_in}
        override = override_settings(CONNECTOR_OUTBOX={**user, "CONNECTORS": swapped})
        override.enable()
        self._overrides.append(override)
        return {name: cast(MemoryConnector, connectors[name]) for name in names}

    def disable(self) -> None:
        self._overrides.pop().disable()

    def __enter__(self) -> dict[str, MemoryConnector]:  # type: ignore[override]  # stubs say Apps
        return self.enable()


def _stand_in_options(source: str, config: dict[str, Any]) -> dict[str, Any]:
    """The OPTIONS of a MemoryConnector standing in for `source`'s connector: its kinds (read
    from its class, as the outbox reads them: `conf.connector_kinds`), timeout, lookup
    requests, and its entry for its Message limits. It is built to read the last two (no request is made), so a source that could
    not be built in production (ImproperlyConfigured) cannot be replaced in tests either."""
    config = source_config(source, config)
    real = load_connector(source, config)
    try:
        return {
            "kinds": sorted(connector_kinds(source, config)),
            "timeout": real.timeout,
            "lookup_requests": real.lookup_requests,
            "messages_like": {"BACKEND": config["BACKEND"], "OPTIONS": config.get("OPTIONS", {})},
        }
    finally:
        real.close()
