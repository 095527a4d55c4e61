"""Seeded schedules of senders, producers and faults on one database; invariants; shrinking.

A schedule is a seed and a list of events. The seed fixes the world (how many senders, their
sources, concurrency and batch; how many sources and containers) and generates the events;
a replay may keep only some of them (`keep`, indices into that list). Each event carries its
own numbers (which sender, which pending delivery, how the platform answers, which post), and
reads them modulo what exists when it runs, so that any subset of a schedule is a valid
schedule: that is what lets a failing one shrink by dropping events.

The kept minimal schedules (tests/test_simulation.py) are replays of seeds: changing how
`generate` draws, EVENT_WEIGHTS or the tables of platform.py changes what every seed plays,
so any such change must find those schedules again (bench/simulate.py --strict).

One process, one connection shared by every sender and producer (each sender turn is its own
transaction), a FakeClock that moves only on events (and while a simulated call "takes time").

Invariants (`Violation.invariant` names the one broken):
- during the run, after each event: at most one `sending` post per container; each lane's
  head and due time agree with its posts; no sender turn or producer call raises; and, at each
  platform call (platform.py), the claim is current, alone in flight in its container, its
  container's oldest active post, and handed to `send` at most MAX_ATTEMPTS times;
- after draining (every sender stopped, then a fresh one run with a well-behaved platform and
  the clock moved past every lease and hold): every post is final; nothing was accepted twice;
  each container's posts were created in queue order; every post the platform accepted is
  known to the outbox (posted with its ref, or uncertain); every post recorded `posted` is
  there, and stays posted; each posted status shows its latest body.
"""

from __future__ import annotations

import logging
import math
import random
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection
from django.db.backends.signals import connection_created
from django.test import override_settings

from django_connector_outbox import Outbox, signals
from django_connector_outbox.models import Lane, Post
from django_connector_outbox.posts import ACTIVE_STATES, FINISHED_STATES, ClaimedPost, Kind, State
from django_connector_outbox.sender import Sender
from tests.conftest import FakeClock
from tests.harness import Interrupted, ManualExecutor, StatementFaults
from tests.simulation.platform import COOPERATIVE, Behaviour, Message, Platform, SimConnector

LEASE = 30.0
MAX_ATTEMPTS = 3
OUTBOX_SETTINGS = {
    "LEASE": LEASE,
    "MAX_ATTEMPTS": MAX_ATTEMPTS,
    "RETRY_BASE": 1,
    "RETRY_MAX": 8,
    "RETRY_JITTER": 0,
    "POLL_INTERVAL": 1.0,
}
BACKEND = "tests.simulation.platform.SimConnector"

# Event kinds and their weights in a generated schedule.
EVENT_WEIGHTS = {
    "turn": 30,
    "run": 30,
    "clock": 10,
    "queue": 8,
    "queue_many": 3,
    "set_status": 6,
    "cancel": 3,
    "kill": 4,
    "stop": 3,
    "drop": 3,
}
PRODUCERS = ("queue", "queue_many", "set_status")
# Events that write nothing: the rows need no checking after them (a delivery's platform
# calls are checked as they happen).
QUIET = frozenset({"clock", "kill", "drop", "stop"})
PRODUCER_SKEWS = (0.0, 0.0, 3.0, 10.0)
CLOCK_STEPS = (0.001, 0.5, 1.0, 3.0, 10.0, LEASE + 1, 45.0)
DRAIN_STEPS = 300


# Defects found and reported, not fixed yet: a schedule that runs into one is not failed when
# the explorer is asked to tolerate it (so the search goes on past it); its minimal schedule is
# kept in tests/test_simulation.py as an xfail(strict=True). Each maps to how an exception
# escaping a sender's turn is recognised as it, or to None for a violation that the platform's
# checks name themselves. None open: the two found so far are fixed (see tests/test_simulation.py).
KNOWN_DEFECTS: dict[str, Callable[[BaseException], bool] | None] = {}


class HarnessError(RuntimeError):
    """A schedule could not be played to its end for a reason outside the system under test."""


class Violation(AssertionError):
    """An invariant broken by a schedule."""

    def __init__(self, invariant: str, detail: str) -> None:
        super().__init__(f"{invariant}: {detail}")
        self.invariant = invariant
        self.detail = detail


Event = tuple[str, int, int]


@dataclass(frozen=True)
class World:
    """What the seed fixes besides the events."""

    sources: tuple[str, ...]
    containers: int  # per source
    serves: tuple[tuple[str, ...], ...]  # per sender: its sources
    concurrency: tuple[int, ...]
    batch: tuple[int, ...]
    events: tuple[Event, ...]
    # Seconds the producers' clock is behind the senders' (two machines' clocks).
    producer_skew: float = 0.0
    # Some posts are replies (`thread_of`) to earlier ones of their container. Off by default:
    # a world with replies plays other posts, and the kept replays must stay as they were.
    threads: bool = False


def generate(seed: int, *, threads: bool = False) -> World:
    rng = random.Random(seed)
    sources = tuple(f"s{n}" for n in range(rng.randint(1, 3)))
    senders = rng.randint(2, 4)
    serves = tuple(
        sources if rng.random() < 0.7 else tuple(s for s in sources if rng.random() < 0.6) or sources[:1]
        for _ in range(senders)
    )
    kinds, weights = zip(*EVENT_WEIGHTS.items(), strict=True)
    length = rng.randint(30, 90)
    events = [(rng.choice(PRODUCERS), rng.randrange(10**6), rng.randrange(10**6)) for _ in range(4)]
    events += [
        (rng.choices(kinds, weights)[0], rng.randrange(10**6), rng.randrange(10**6))
        for _ in range(length - 4)
    ]
    world = World(
        sources=sources,
        containers=rng.randint(1, 3),
        serves=serves,
        concurrency=tuple(rng.randint(1, 3) for _ in range(senders)),
        batch=tuple(rng.randint(1, 3) for _ in range(senders)),
        events=tuple(events),
    )
    # Drawn last, so that the draws above (and every kept replay) stay as they were.
    return replace(world, producer_skew=rng.choice(PRODUCER_SKEWS), threads=threads)


@dataclass
class Slot:
    """One sender's place in the world; a killed or finished sender is replaced in it."""

    number: int
    sender: Sender
    executor: ManualExecutor
    generation: int = 0
    fault: tuple[int, bool] | None = None  # (statement, kill) for its next turn


@dataclass
class Result:
    seed: int
    kept: list[int]
    failure: Violation | None
    events: int = 0
    posts: int = 0
    sends: int = 0
    known_hits: Counter[str] = field(default_factory=Counter)
    trace: list[str] = field(default_factory=list)
    stats: Counter[str] = field(default_factory=Counter)
    threads: bool = False  # a world with replies (World.threads)


@dataclass
class Run:
    """One schedule being played."""

    world: World
    platform: Platform
    faults: StatementFaults
    slots: list[Slot] = field(default_factory=list)
    zombies: list[ManualExecutor] = field(default_factory=list)  # executors of killed senders
    posts: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))  # source -> ids
    latest_status: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    recorded_posted: set[tuple[str, str]] = field(default_factory=set)
    # (source, container) -> the posts a reply may name (messages due when queued, statuses).
    parents: dict[tuple[str, int], list[str]] = field(default_factory=lambda: defaultdict(list))
    counter: int = 0
    tolerate: frozenset[str] = frozenset()
    known_hits: Counter[str] = field(default_factory=Counter)
    stats: Counter[str] = field(default_factory=Counter)  # what the schedule exercised

    def __post_init__(self) -> None:
        self.clock = self.platform.clock
        skew = timedelta(seconds=self.world.producer_skew)
        self.outboxes = {s: Outbox(s, clock=lambda: self.clock() - skew) for s in self.world.sources}

    # -- senders --------------------------------------------------------------------------

    def start(self, number: int, generation: int = 0) -> Slot:
        executor = ManualExecutor()
        sender = Sender(
            self.world.serves[number], concurrency=self.world.concurrency[number], batch=self.world.batch[number],
            worker=f"w{number}.{generation}", clock=self.clock, executor=executor,
        )  # fmt: skip
        return Slot(number, sender, executor, generation)

    def replace(self, slot: Slot, *, killed: bool) -> None:
        if killed:
            self.zombies.append(slot.executor)
            self.stats["killed"] += 1
        self.slots[slot.number] = self.start(slot.number, slot.generation + 1)

    def turn(self, slot: Slot) -> None:
        fault, slot.fault = slot.fault, None
        fired = self.faults.fired
        if fault:
            self.faults.arm(fault[0], kill=fault[1])
        try:
            pause = slot.sender.turn()
        except Interrupted:
            # The process died, and its connection with it: whatever it had open rolls back.
            connection.close()
            self.replace(slot, killed=True)
            return
        except Exception as e:
            if not self.known(e):
                raise Violation("a sender's turn never raises", _summary(e)) from e
            # A known defect: run_outbox would exit on it and be restarted, like a killed sender.
            connection.close()
            self.replace(slot, killed=True)
            return
        finally:
            self.faults.disarm()
        self.track_claims()
        if self.platform.trace is not None:
            self.platform.note(f"  -> pause {pause}, in flight {slot.sender.in_flight}, rows {rows()}")
        if fault and not fault[1] and self.faults.fired > fired:
            self.stats["dropped connections"] += 1
        if fault and fault[1]:  # the kill came after the turn's last statement
            self.replace(slot, killed=True)
        elif pause is None:
            slot.sender.close()
            self.replace(slot, killed=False)

    def track_claims(self) -> None:
        """Note when each `sending` post's run of claims began (for the head check)."""
        sending = set(Post.objects.in_state(State.SENDING).values_list("source", "post_id"))
        since = self.platform.sending_since
        for key in set(since) - sending:
            del since[key]
        for key in sending - set(since):
            since[key] = self.platform.step

    def known(self, error: Exception) -> str | None:
        """The name of the known (reported, not yet fixed) defect `error` is, if tolerated."""
        name = next((name for name, matches in KNOWN_DEFECTS.items() if matches and matches(error)), None)
        if name is not None and name in self.tolerate:
            self.known_hits[name] += 1
            return name
        return None

    def pending(self) -> list[tuple[ManualExecutor, int]]:
        return [
            (executor, index)
            for executor in [slot.executor for slot in self.slots] + self.zombies
            for index in range(len(executor.pending))
        ]

    # -- events ---------------------------------------------------------------------------

    def play(self, event: Event) -> None:
        kind, a, b = event
        self.platform.step += 1
        slot = self.slots[a % len(self.slots)]
        self.platform.note(
            f"{kind} {a} {b} (sender w{slot.number}.{slot.generation}, t={self.clock():%M:%S.%f})"
        )
        match kind:
            case "turn":
                self.turn(slot)
            case "run":
                pending = self.pending()
                if pending:
                    executor, index = pending[a % len(pending)]
                    self.platform.behaviour = Behaviour.from_numbers(b, b // 1000)
                    future = executor.pending[index][0]
                    executor.run(index)
                    self.stats["zombie runs"] += executor in self.zombies
                    self.platform.note(
                        f"  -> {future.result() if future.done() and not future.cancelled() else 'cancelled'}"
                    )
                    self.platform.behaviour = COOPERATIVE
            case "clock":
                self.clock.advance(CLOCK_STEPS[a % len(CLOCK_STEPS)])
            case "kill":
                slot.fault = (1 + b % 12, True)
            case "drop":
                slot.fault = (1 + b % 8, False)
            case "stop":
                slot.sender.stop()
                if b % 4 == 0:  # a second SIGTERM: out at the next turn, recording nothing
                    slot.sender.stop()
                    self.stats["forced stops"] += 1
            case _:
                self.produce(kind, a, b)

    def produce(self, kind: str, a: int, b: int) -> None:
        source = self.world.sources[a % len(self.world.sources)]
        outbox = self.outboxes[source]
        try:
            match kind:
                case "queue":
                    outbox.queue(**self.new_post(source, a // 10, b))
                case "queue_many":
                    # Numbered backwards (m0007, m0006, ...): ids that sort against the list,
                    # whose order is the batch's queue order, never the ids'.
                    count, last = 1 + b % 3, self.counter + 1 + b % 3
                    outbox.queue_many(
                        [self.new_post(source, a // 10 + n, b // (n + 1), last - n) for n in range(count)]
                    )
                case "set_status":
                    self.set_status(outbox, (a // 10) % self.world.containers, (a // 100) % 2)
                case "cancel":
                    known = self.posts[source]
                    if known:
                        outbox.cancel_queued(known[(a // 10) % len(known)])
        except Exception as e:
            raise Violation("a producer call never raises", f"{kind}: {_summary(e)}") from e

    def new_post(self, source: str, container: int, b: int, number: int | None = None) -> dict[str, Any]:
        self.counter += 1
        post_id = f"m{number or self.counter:04d}"
        self.posts[source].append(post_id)
        self.platform.queued_step[(source, post_id)] = self.platform.step
        kind = (Kind.MESSAGE,) * 7 + (Kind.REACTION,) * 2 + (Kind.EPHEMERAL,)
        delay = (None,) * 8 + (3.0, 20.0)
        post = dict(
            post_id=post_id,
            **place(container % self.world.containers),
            kind=kind[b % 10],
            body={"text": post_id},
            delay=delay[(b // 10) % 10],
        )
        if self.world.threads:
            self.thread(source, container % self.world.containers, post, b)
        return post

    def thread(self, source: str, container: int, post: dict[str, Any], b: int) -> None:
        """In a world with replies: a third of the posts reply to an earlier message or status of
        their container (`b` picks which), and messages due when queued may be parents (a
        delayed one would be due after a reply queued before it: refused)."""
        parents = self.parents[(source, container)]
        if parents and post["kind"] != Kind.REACTION and (b // 100) % 3 == 0:
            post["thread_of"] = parents[(b // 300) % len(parents)]
            self.stats["replies queued"] += 1
        if post["kind"] == Kind.MESSAGE and post["delay"] is None:
            parents.append(post["post_id"])

    def set_status(self, outbox: Outbox, container: int, k: int) -> None:
        post_id = f"s{container}{k}"
        self.counter += 1
        body = {"text": f"v{self.counter}"}
        found = outbox.find(post_id)
        state = None if found is None else found.state
        if state is not None and state not in (State.SENDING, State.UNCERTAIN):
            self.platform.sends[(outbox.source, post_id)] = 0  # set_status restarts its attempts
        if state is None or state in FINISHED_STATES and state != State.UNCERTAIN:
            self.platform.queued_step[(outbox.source, post_id)] = self.platform.step  # (re)joins the queue
        outbox.set_status(post_id, **place(container), body=body)
        if state is None:
            self.posts[outbox.source].append(post_id)
            if self.world.threads:
                self.parents[(outbox.source, container)].append(post_id)
        if state != State.UNCERTAIN:
            self.latest_status[(outbox.source, post_id)] = body

    def on_posted(self, sender: Any, *, claim: ClaimedPost, **kwargs: Any) -> None:
        """A sender recorded a post as posted (or a status found, or re-queued for one more
        edit): its attempts start again at 0."""
        key = (claim.source, claim.post_id)
        self.platform.sends[key] = 0
        if claim.kind != Kind.STATUS:
            self.recorded_posted.add(key)

    # -- invariants during the run ----------------------------------------------------------

    def check_now(self) -> None:
        for invariant, detail, known in self.platform.violations:
            if known not in self.tolerate:
                raise Violation(invariant, detail)
            self.known_hits[known] += 1
        self.platform.violations.clear()
        # Two plain reads (this runs after every event): a post is sending while it is its
        # lane's head, queued in its row, and the lane holds a lease (models.py).
        lanes = list(Lane.objects.values("pk", "source", "container_id", "head_id", "due_at", "lease_token"))
        leased = {lane["head_id"] for lane in lanes if lane["lease_token"]}
        posts = list(Post.objects.values("pk", "post_id", "lane_id", "state", "queued_at", "next_at"))
        by_lane: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for post in posts:
            post["current_state"] = (
                State.SENDING if post["state"] == State.QUEUED and post["pk"] in leased else post["state"]
            )
            if post["current_state"] in ACTIVE_STATES:
                by_lane[post["lane_id"]].append(post)
        for lane in lanes:
            active = by_lane[lane["pk"]]
            sending = [p for p in active if p["current_state"] == State.SENDING]
            where = f"lane {lane['source']}/{lane['container_id']}"
            if len(sending) > 1:
                raise Violation("at most one post of a container sending", f"{where}: {_ids(sending)}")
            head = (
                sending[0]
                if sending
                else min(active, key=lambda p: (p["queued_at"], p["pk"]), default=None)  # queue order
            )
            due = None if head is None else lane["due_at"] if sending else head["next_at"]  # (the lease end)
            if (lane["head_id"], lane["due_at"]) != (head and head["pk"], due):
                actual = next((p["post_id"] for p in posts if p["pk"] == lane["head_id"]), None)
                raise Violation(
                    "a lane's head agrees with its posts",
                    f"{where}: head {actual} due {lane['due_at']}, expected {head and head['post_id']} due {due}",
                )

    # -- draining and the invariants at the end ---------------------------------------------

    def drain(self) -> None:
        """Stop every sender (their pending deliveries are given back; a killed sender's are
        never run), then run a fresh sender against a well-behaved platform, moving the clock
        to each next due time, until no post is active."""
        self.platform.behaviour = COOPERATIVE
        self.platform.phase = "drain "
        for slot in self.slots:
            slot.sender.stop()
            for _ in range(5):
                pause = slot.sender.turn()
                if pause is None:
                    break
            else:
                raise Violation(
                    "a stopped sender finishes", f"w{slot.number}.{slot.generation} still in flight"
                )
            slot.sender.close()
        executor = ManualExecutor()
        sender = Sender(
            self.world.sources, concurrency=16, batch=16, worker="drain", clock=self.clock, executor=executor
        )
        for self.drain_steps in range(DRAIN_STEPS):
            try:
                pause = sender.turn()
            except Exception as e:
                raise Violation("a sender's turn never raises", f"draining: {_summary(e)}") from e
            self.platform.step += 1
            self.track_claims()
            executor.run_all()
            self.check_now()
            if not Post.objects.filter(state__in=ACTIVE_STATES).exists():
                break
            if pause and not executor.pending:
                self.clock.advance(self.until_next_due())
        sender.stop()
        while sender.turn() is not None:
            pass
        sender.close()

    def until_next_due(self) -> float:
        dues = [d for d in Lane.objects.values_list("due_at", flat=True) if d is not None]
        return max((min(dues) - self.clock()).total_seconds(), 0.0) + 0.001 if dues else 1.0

    def check_end(self) -> None:
        rows = {(p.source, p.post_id): p for p in Post.objects.with_claim()}
        waiting = [
            f"{p.post_id}:{explain(p, self.clock())}" for p in rows.values() if p.state in ACTIVE_STATES
        ]
        if waiting:
            raise Violation("every post final after draining", ", ".join(waiting))
        for m in self.platform.messages:
            row = rows[(m.source, m.post_id)]
            ref = None if m.kind == Kind.EPHEMERAL else m.ref
            known = row.message_ref == ref and (row.state == State.POSTED or m.kind == Kind.STATUS)
            if not (known or row.state == State.UNCERTAIN):
                raise Violation(
                    "what the platform accepted is known to the outbox",
                    f"{m.source}:{m.post_id} is {m.ref} there, {row.state} ref={row.message_ref} in the outbox",
                )
        for key, row in rows.items():
            if row.state != State.POSTED:
                if key in self.recorded_posted:
                    raise Violation(
                        "nothing a sender recorded is lost", f"{key} recorded posted, now {row.state}"
                    )
                continue
            message = self.platform.message(*key)
            if message is None:
                raise Violation("a posted post is on the platform", f"{key} posted, never accepted")
            if row.kind == Kind.STATUS and not (message.body == row.body == self.latest_status[key]):
                raise Violation(
                    "the platform shows each status's latest body",
                    f"{key}: platform {message.body}, row {row.body}, latest {self.latest_status[key]}",
                )
        self.check_order(rows)

    def check_order(self, rows: dict[tuple[str, str], Post]) -> None:
        """Per container, no posted post was created before one ahead of it in queue order
        ((queued_at, id): a batch's list order too) that was already queued when its claims
        began, and was posted after it. ("Already
        queued" is by event: with a producer clock behind, a post queued later may carry an
        older queued_at, and then waits for the head in flight.)"""
        created: dict[tuple[str, tuple[str, str]], list[Message]] = defaultdict(list)
        for m in self.platform.messages:
            if rows[(m.source, m.post_id)].state == State.POSTED:
                created[(m.source, m.container)].append(m)
        for messages in created.values():
            for n, later in enumerate(messages):
                for earlier in messages[:n]:
                    if (
                        later.place < earlier.place
                        and self.platform.queued_step[(later.source, later.post_id)] < earlier.since
                    ):
                        raise Violation(
                            "each container's posts created in queue order",
                            f"{later.source}:{later.post_id} (queued {later.place}) created after "
                            f"{earlier.post_id} (queued {earlier.place})",
                        )


def rows() -> list[tuple[str, str, int]]:
    return list(
        Post.objects.with_claim()
        .order_by("post_id")
        .values_list("post_id", "current_state", "current_attempts")
    )


def place(container: int) -> dict[str, str]:
    return {"workspace_id": "T1" if container < 2 else "T2", "container_id": f"c{container}"}


def explain(post: Post, now: datetime) -> str:
    """Why an active post still waits, for the failure message."""
    if post.current_state == State.SENDING:
        return f"sending (attempt {post.current_attempts}, lease until {post.lease_until}, now {now}) {post.last_error!r}"
    return f"queued (attempt {post.attempts}, due {post.next_at}, now {now}) {post.last_error!r}"


def _ids(posts: Sequence[dict[str, Any]]) -> list[str]:
    return [p["post_id"] for p in posts]


def _summary(error: BaseException) -> str:
    frame = traceback.extract_tb(error.__traceback__)[-1]
    return f"{error!r} at {frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}"


# -- running, shrinking, replaying ----------------------------------------------------------------


@contextmanager
def simulated(world: World, platform: Platform) -> Iterator[None]:
    """The world's settings (its sources on the simulated platform), quiet logs, clean tables."""
    reset_tables()
    connection_created.connect(_fast_sqlite)
    _fast_sqlite(connection=connection)
    SimConnector.platform = platform
    logger = logging.getLogger("django_connector_outbox")
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)  # the sender logs every simulated failure
    config = {**OUTBOX_SETTINGS, "CONNECTORS": {s: {"BACKEND": BACKEND} for s in world.sources}}
    try:
        with override_settings(CONNECTOR_OUTBOX={**settings.CONNECTOR_OUTBOX, **config}):
            yield
    finally:
        logger.setLevel(level)
        SimConnector.platform = None
        connection_created.disconnect(_fast_sqlite)


def _fast_sqlite(connection: Any, **kwargs: Any) -> None:
    """No fsync per commit on SQLite: a schedule commits hundreds of times, and a crash of
    the machine is not among the faults simulated."""
    if connection.vendor == "sqlite" and connection.connection is not None:
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA synchronous = OFF")


def reset_tables() -> None:
    Lane.objects.update(head=None)
    Post.objects.all().delete()
    Lane.objects.all().delete()


def run_schedule(
    seed: int,
    keep: Sequence[int] | None = None,
    tolerate: Iterable[str] = (),
    *,
    trace: bool = False,
    threads: bool = False,
) -> Result:
    """Play the schedule of `seed` (only the events at `keep`, when given); its Result.

    A sender that runs into a known defect named in `tolerate` is treated as a crashed one
    (replaced, like a killed sender) instead of failing the schedule. `threads`: a world
    where some posts are replies (World.threads)."""
    world = generate(seed, threads=threads)
    kept = list(range(len(world.events))) if keep is None else list(keep)
    platform = Platform(FakeClock(), trace=[] if trace else None)
    result = Result(seed, kept, None, events=len(kept), threads=threads)
    with simulated(world, platform), StatementFaults() as faults:
        run = Run(world, platform, faults, tolerate=frozenset(tolerate))
        signals.post_posted.connect(run.on_posted, weak=False)
        try:
            run.slots = [run.start(n) for n in range(len(world.serves))]
            for index in kept:
                kind = world.events[index][0]
                run.play(world.events[index])
                if kind not in QUIET:
                    run.check_now()
            run.drain()
            run.check_end()
        except Violation as violation:
            result.failure = violation
        except Exception as e:
            # Not the system under test: the harness, or the database server itself (another
            # process restarting it); a fresh connection for the next schedule.
            connection.close()
            raise HarnessError(f"seed {seed}: {_summary(e)}") from e
        finally:
            signals.post_posted.disconnect(run.on_posted)
        result.sends = run.platform.total_sends
        result.known_hits = run.known_hits
        result.trace = platform.trace or []
        result.stats = run.stats + platform.stats
        states = list(Post.objects.values_list("state", flat=True))
        result.posts = len(states)
        result.stats.update(f"ended {state}" for state in states)
    return result


def shrink(result: Result, budget: int = 400, tolerate: Iterable[str] = ()) -> Result:
    """The shortest subset of a failing schedule found (ddmin over the kept events) that
    still breaks the same invariant."""
    assert result.failure is not None
    best = result
    chunks = 2
    runs = 0
    while len(best.kept) >= 2 and runs < budget:
        size = math.ceil(len(best.kept) / chunks)
        for start in range(0, len(best.kept), size):
            candidate = best.kept[:start] + best.kept[start + size :]
            trial = run_schedule(result.seed, candidate, tolerate, threads=result.threads)
            runs += 1
            if trial.failure is not None and trial.failure.invariant == result.failure.invariant:
                best = trial
                chunks = max(chunks - 1, 2)
                break
        else:
            if chunks >= len(best.kept):
                break
            chunks = min(len(best.kept), chunks * 2)
    return best


def replay_command(result: Result) -> str:
    url = f" --database-url {database_url()}" if connection.vendor != "sqlite" else ""
    threads = " --threads" if result.threads else ""
    return f"python bench/simulate.py --seed {result.seed} --events {','.join(map(str, result.kept))}{threads}{url}"


def database_url() -> str:
    s = connection.settings_dict
    scheme = {"postgresql": "postgres", "mysql": "mysql"}[connection.vendor]
    name = s["NAME"].removeprefix("test_")
    return f"{scheme}://{s['USER']}@{s['HOST']}:{s['PORT']}/{name}"


@dataclass
class Summary:
    schedules: int = 0
    events: int = 0
    posts: int = 0
    sends: int = 0
    known_hits: Counter[str] = field(default_factory=Counter)
    failures: list[Result] = field(default_factory=list)
    errors: int = 0  # schedules the harness could not play (HarnessError)
    stats: Counter[str] = field(default_factory=Counter)
    started: float = field(default_factory=time.monotonic)

    def add(self, result: Result) -> None:
        self.schedules += 1
        self.events += result.events
        self.posts += result.posts
        self.sends += result.sends
        self.known_hits += result.known_hits
        self.stats += result.stats

    def line(self) -> str:
        runtime = time.monotonic() - self.started
        return (
            f"schedules={self.schedules} events={self.events} posts={self.posts} sends={self.sends} "
            f"failures={len(self.failures)} errors={self.errors} known_defects_hit={dict(self.known_hits) or 0} runtime={runtime:.1f}s ({self.schedules / max(runtime, 1e-9):.1f}/s)"
        )


def explore(
    seeds: Iterable[int],
    *,
    deadline: float | None = None,
    tolerate: Iterable[str] = KNOWN_DEFECTS,
    report: Callable[[str], None] = print,
    threads: bool = False,
) -> Summary:
    """Run the schedules of `seeds` (until `deadline`, a time.monotonic() value); each failure
    shrunk and reported with its replay command. `threads`: worlds with replies."""
    summary = Summary()
    for seed in seeds:
        if deadline is not None and time.monotonic() >= deadline:
            break
        try:
            result = run_schedule(seed, tolerate=tolerate, threads=threads)
        except (HarnessError, DatabaseError) as e:  # DatabaseError: setting a schedule up
            connection.close()
            summary.errors += 1
            report(f"ERROR seed {seed}: {e}")
            continue
        summary.add(result)
        if result.failure is not None:
            small = shrink(result, tolerate=tolerate)
            summary.failures.append(small)
            report(f"FAIL {small.failure} ({len(small.kept)} events): {replay_command(small)}")
    return summary
