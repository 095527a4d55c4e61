"""The interleaving explorer: actors on their own connections, one SQL statement at a time.

The schedule explorer (explorer.py) plays every transaction on one connection, so it never
sees two transactions meet on a lock. Here each actor is a thread with its own Django
connection (Django's connections are per thread), running one operation (one transaction) at
a time, and a scheduler decides whose next statement runs:

- producers: `Outbox.queue`, `queue_many` and `set_status`, one to three calls inside the
  caller's own `transaction.atomic()`;
- operators: `Outbox.cancel_queued` (what the admin's cancel action and `outbox_cancel` call)
  and `Outbox.requeue` (the admin's retry action and `outbox_retry`);
- senders: `Outbox.claim`, then for each claim a send to an in-memory platform and its
  finish (`posted`, `retry`, `give_back`, or `found` after looking a stale claim up), as
  `Sender` does, each its own transaction;
- housekeeping: `Outbox.repair_lanes`, and `Outbox.prune_some` (every finished post, status
  ones too) then `Outbox.prune_lanes` (every lane left without posts), racing the producers
  that queue into them again.

Every statement of an actor thread waits for the scheduler's grant: Django's through
`execute_wrapper`, PostgreSQL's raw psycopg cursors (store/postgres.py) through a proxy of
`postgres.cursor`; a pseudo-statement before each send lets others run between a claim and
its send. A step is one grant: the actor runs until it asks for its next statement (or ends).
A step that does not end promptly is checked: is that connection waiting for a lock
(PostgreSQL: `pg_stat_activity.wait_event_type = 'Lock'` for its backend; MariaDB:
`information_schema.innodb_trx.trx_state = 'LOCK WAIT'` for its thread; SQLite: another actor
holds its transaction open, so the database lock)? Then it is blocked, and another actor
runs; it goes on when its statement returns. Threads meet on one condition variable; the
only timing is that poll for lock waits. PostgreSQL actors set `deadlock_timeout` low so that
a deadlock is broken in milliseconds rather than a second.

A schedule is a seed and a list of choices: the seed fixes the world (`generate`: actors and
their operations, the outcome of each send); each choice names the actor granted next, or
`tN`, the clock moving N seconds. Exploring draws choices at random (seeded) and records
them; a replay takes them in order, skips a choice whose actor cannot run then, and past the
end grants the lowest-numbered actor that can. Any subset of choices or of operations is a
valid schedule, which is what lets `shrink` drop them while the failure remains.

Invariants (`Violation.invariant` names the one broken):
- after every step, read by a separate observer connection (committed rows only): each lane
  agrees with `store.head_rule` (the code's own definition of a head); each lease on a lane
  is on the post it was claimed for;
- as it happens: no error reaches a producer's or an operator's call (a deadlock or lock wait
  timeout included; inside a sender's or housekeeping's own transaction a deadlock is counted,
  and the operation given up, as `Sender` and `Housekeeper` do); a post reported cancelled
  (`cancel_queued` returned True) is never sent afterwards (unless a `set_status` of it
  committed later, which puts it back in the queue), and was not being sent when it was
  reported; at most one post of a container in flight (sent under a lease not ended,
  not finished);
- at the end, after a well-behaved sender drained everything with the clock moved past every
  due time: every post is final (nothing stuck); a post reported cancelled ended `cancelled`;
  nothing a producer committed is lost; each container's posts reached the platform in the
  order each producer's calls (and a `queue_many` list) put them ("queue order", checked
  unless `check_order` is off: posts requeued by an operator rejoin the back and are left out).

Replay a failure with the command `replay_command` prints:
`python bench/interleave.py --seed S --schedule 3,1,t31,... [--ops 0,2,5] --database-url URL`
(`--trace` prints each step granted: the clock, the actor and its statement). On MariaDB,
where lock waits are partly told by their length (SLOW), a replay may play differently.
"""

from __future__ import annotations

import itertools
import math
import random
import threading
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from unittest import mock

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connection, connections, transaction
from django.db.backends.signals import connection_created
from django.test import override_settings

from django_connector_outbox import Outbox
from django_connector_outbox.models import HEAD_FIELDS, Lane, Post, head_rule
from django_connector_outbox.posts import ACTIVE_STATES, ClaimedPost, Kind, State
from django_connector_outbox.store import postgres
from tests.conftest import FakeClock
from tests.harness import _HookedCursor
from tests.simulation.explorer import HarnessError, Violation, _fast_sqlite, database_url, reset_tables

SOURCE = "s0"
LEASE = 30.0
TIMEOUT = 5.0  # the simulated connector's timeout: no send starts closer than this to the lease end
OUTBOX_SETTINGS = {
    "LEASE": LEASE,
    "MAX_ATTEMPTS": 3,
    "RETRY_BASE": 1,
    "RETRY_MAX": 4,
    "RETRY_JITTER": 0,
    "CONNECTORS": {SOURCE: {"BACKEND": "django_connector_outbox.connectors.memory.MemoryConnector"}},
}
CONTAINERS = ("c0", "c1", "c2")
TICKS = ("t1", "t5", "t31")  # the last one outlives a lease
POLL = 0.005  # seconds a step may take before its connection is checked for a lock wait
# On SQLite, a step this long while another transaction is open is taken as blocked (SQLite
# reports no lock waits). 0.03 s took a step that a loaded CI machine merely slowed for one
# waiting, so two actors ran at once and the schedule was not the one recorded (seed 2 failed
# "x0 sent after its cancel" under load, never in replay); a real wait for SQLite's lock lasts
# until the holder commits, far longer.
SQLITE_BUSY = 0.5
# A step this long is taken for a lock wait on any backend: MariaDB's innodb_trx does not
# always show one (seen: a locking read waiting for another producer's uncommitted lane).
SLOW = 0.3
STUCK = 60.0  # seconds without any step ending: the harness gives up (HarnessError)
MAX_STEPS = 3000
DRAIN_ROUNDS = 60
# What a deadlock or a lock wait looks like from a caller, per backend (the error's text).
LOCK_ERRORS = ("deadlock", "lock wait timeout", "database is locked", "could not serialize")


class Aborted(BaseException):
    """Raised at an actor's next statement once the schedule has failed: its transaction
    rolls back and its thread ends (not an Exception, so that no `except` of the package
    takes it for a database error)."""


# -- the world: actors and their operations ---------------------------------------------------

# An operation: (actor, kind, arguments). Producers: ("txn", calls), each call ("queue",
# post_id, container) | ("queue_many", ((post_id, container), ...)) | ("set_status", post_id,
# container, version). Operators: ("cancel", post_id) | ("cancel_next", container): the post
# behind its head | ("requeue", post_id). Senders:
# ("turn", limit, outcomes). Housekeeping: ("repair",) | ("prune",).
Op = tuple[int, str, tuple[Any, ...]]


@dataclass(frozen=True)
class World:
    actors: tuple[str, ...]  # each actor's role: producer, operator, sender, housekeeper
    ops: tuple[Op, ...]


def generate(seed: int, *, reversed_batches: bool = False, mixed_transactions: bool = False) -> World:
    """The actors and operations of a seed. Post ids come from one counter, in call and list
    order, so that their order is the producers' (hole 1 of issue 18 would not show);
    `reversed_batches` numbers each queue_many list backwards, so that ids sort against it.
    A few ids (`x0`, `x1`) are queued by several producers into different containers.

    A transaction of several calls puts them all in one container (a `queue_many` may span
    several: the app orders its locks), unless `mixed_transactions`: the rows a call locks
    are the caller's until it commits, so two callers that queue into two containers in
    opposite orders, each in one transaction of two calls, can deadlock whatever the app
    does (found by this explorer; not an invariant the app can keep)."""
    rng = random.Random(seed)
    roles = (
        ["producer"] * rng.randint(2, 4) + ["operator"] * rng.randint(1, 2) + ["sender"] * rng.randint(1, 2)
    )
    if rng.random() < 0.5:
        roles.append("housekeeper")
    counter = itertools.count(1)
    ops: list[Op] = []
    for actor, role in enumerate(roles):
        for _ in range(rng.randint(2, 4) if role != "sender" else rng.randint(3, 6)):
            match role:
                case "producer":
                    container, count = rng.choice(CONTAINERS), rng.choice((1, 1, 2, 3))
                    calls = tuple(
                        _call(rng, counter, rng.choice(CONTAINERS) if mixed_transactions else container,
                              reversed_batches, spread=mixed_transactions or count == 1)
                        for _ in range(count)
                    )  # fmt: skip
                    ops.append((actor, "txn", calls))
                case "operator":
                    kind = rng.choices(("cancel", "cancel_next", "requeue"), (40, 40, 20))[0]
                    ops.append((actor, kind, (rng.choice(CONTAINERS),) if kind == "cancel_next" else ()))
                case "sender":
                    outcomes = tuple(rng.choices(("posted", "retry", "give_back"), (75, 15, 10), k=3))
                    ops.append((actor, "turn", (rng.randint(1, 3), outcomes)))
                case _:
                    ops.append((actor, rng.choice(("repair", "prune")), ()))
    # Operators name posts of the producers' (resolved now, so that a replay names the same).
    ids = [post_id for _, kind, args in ops if kind == "txn" for post_id in _ids(args)]
    ops = [(a, kind, (rng.choice(ids),) if kind in ("cancel", "requeue") else args) for a, kind, args in ops]
    return World(tuple(roles), tuple(ops))


def _call(
    rng: random.Random, counter: Iterator[int], container: str, reversed_batches: bool, *, spread: bool
) -> tuple[Any, ...]:
    """One producer call into `container` (a queue_many into others too when `spread`)."""
    match rng.choices(("queue", "contested", "queue_many", "set_status"), (45, 15, 30, 10))[0]:
        case "queue":
            return ("queue", f"m{next(counter):03d}", container)
        case "contested":  # the same id, from several producers, into their own containers
            return ("queue", f"x{rng.randint(0, 1)}", container)
        case "queue_many":
            numbers = [next(counter) for _ in range(rng.randint(2, 3))]
            if reversed_batches:
                numbers.reverse()
            others = CONTAINERS if spread else (container,)
            return (
                "queue_many",
                tuple((f"m{n:03d}", rng.choice((container, container, rng.choice(others)))) for n in numbers),
            )
        case _:
            return ("set_status", f"s{CONTAINERS.index(container)}", container, next(counter))


def _ids(calls: Sequence[tuple[Any, ...]]) -> list[str]:
    out: list[str] = []
    for call in calls:
        if call[0] == "queue_many":
            out += [post_id for post_id, _ in call[1]]
        elif call[0] == "queue":
            out.append(call[1])
    return out


# -- the record of what happened ----------------------------------------------------------------


@dataclass
class Claim:
    post_id: str
    container: str
    lease_until: Any
    claimed: int  # sequence numbers (Run.tick) of what happened to it
    sent: int | None = None
    finished: int | None = None


@dataclass
class Delivery:
    post_id: str
    container: str
    by: str  # the producer call that created the post: "p{actor}.{op}.{call}.{n}"
    seq: int


@dataclass(eq=False)
class Actor:
    number: int
    role: str
    ops: list[Op]
    state: str = "new"  # new, gate (waits for a grant), running, done
    granted: bool = False
    blocked: bool = False
    slow: bool = False  # blocked by SLOW only: its step may be past a commit it has not noted yet
    since: float = 0.0
    backend: int | None = None
    conn: Any = None
    thread: threading.Thread | None = None
    waiting_for: str = ""


@dataclass
class Result:
    seed: int
    schedule: list[str]
    ops: list[int]
    failure: Violation | None
    steps: int = 0
    lock_waits: int = 0
    stats: Counter[str] = field(default_factory=Counter)
    trace: list[str] = field(default_factory=list)


_local = threading.local()


class Run:
    """One schedule being played."""

    def __init__(
        self,
        world: World,
        keep: Sequence[int],
        schedule: Sequence[str] | None,
        rng: random.Random | None,
        *,
        check_order: bool = True,
        trace: bool = False,
    ) -> None:
        self.trace: list[str] | None = [] if trace else None
        self.world = world
        self.keep = list(keep)
        self.replay = list(schedule) if schedule is not None else None
        self.rng = rng
        self.check_order = check_order
        self.clock = FakeClock()
        self.cond = threading.Condition()
        self.seq = itertools.count(1)
        self.lock = threading.Lock()  # the records below, written by actor threads
        self.actors = [
            Actor(n, role, [world.ops[i] for i in self.keep if world.ops[i][0] == n])
            for n, role in enumerate(world.actors)
        ]
        self.chosen: list[str] = []
        self.steps = 0
        self.lock_waits = 0
        self.stats: Counter[str] = Counter()
        self.failure: Violation | None = None
        self.aborting = False
        self.claims: dict[tuple[str, str], Claim] = {}  # (lease token, post id): a batch shares a token
        self.cancelled: dict[str, int] = {}  # post id -> when cancel_queued returned True
        self.restated: dict[str, int] = {}  # post id -> when a set_status of it last committed
        self.requeued: set[str] = set()
        self.created: dict[str, str] = {}  # post id -> the producer call that queued it
        self.order: dict[tuple[str, str], list[str]] = defaultdict(list)  # (producer, container) -> ids
        self.delivered: list[Delivery] = []
        self.seen_finished: set[str] = set()

    # -- the actors' side ------------------------------------------------------------------

    def fail(self, invariant: str, detail: str) -> None:
        with self.cond:
            if self.failure is None:
                self.failure = Violation(invariant, detail)
            self.aborting = True
            self.cond.notify_all()

    def gate(self, what: str) -> None:
        """Wait for the scheduler's grant before the next statement of this actor thread."""
        actor: Actor | None = getattr(_local, "actor", None)
        if actor is None:
            return
        with self.cond:
            actor.state, actor.blocked, actor.slow, actor.waiting_for = "gate", False, False, what
            self.cond.notify_all()
            self.cond.wait_for(lambda: actor.granted or self.aborting)
            if self.aborting:
                raise Aborted
            actor.granted, actor.state, actor.since = False, "running", time.monotonic()

    def around(self, statement: Callable[[], Any], name: str = "psycopg") -> Any:
        """postgres.cursor's executions (`_NamedCursor`) wait for the grant too."""
        self.gate(name)
        return statement()

    def _wrap(self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any) -> Any:
        self.gate(sql)
        return execute(sql, params, many, context)

    def main(self, actor: Actor) -> None:
        try:
            connection.ensure_connection()
            actor.conn = connections[DEFAULT_DB_ALIAS]  # this thread's (`connection` is a proxy)
            actor.backend = backend_id()
            _local.actor = actor
            with connection.execute_wrapper(self._wrap):
                outbox = Outbox(SOURCE, clock=self.clock)
                for index, op in enumerate(actor.ops):
                    self.gate("begin")
                    self.play(actor, index, op, outbox)
        except Aborted:
            pass
        except Exception as e:  # the harness itself
            self.fail("the harness plays the schedule", f"actor {actor.number}: {_summary(e)}")
        finally:
            _local.actor = None
            connection.close()
            with self.cond:
                actor.state = "done"
                self.cond.notify_all()

    def play(self, actor: Actor, index: int, op: Op, outbox: Outbox) -> None:
        _, kind, args = op
        try:
            match kind:
                case "txn":
                    self.produce(actor, index, args, outbox)
                case "cancel":
                    if outbox.cancel_queued(args[0]):
                        self.on_cancelled(args[0])
                case "cancel_next":
                    # As an operator who reads the queue (the admin's list) and cancels the
                    # post right behind a container's head.
                    queued = Post.objects.filter(source=SOURCE, container_id=args[0], state=State.QUEUED)
                    behind = list(queued.order_by("queued_at", "pk").values_list("post_id", flat=True)[:2])
                    if len(behind) == 2 and outbox.cancel_queued(behind[1]):
                        self.on_cancelled(behind[1])
                case "requeue":
                    if outbox.requeue(args[0]):
                        with self.lock:
                            self.requeued.add(args[0])
                case "turn":
                    self.turn(actor, outbox, *args)
                case "repair":
                    self.stats["lanes repaired"] += len(outbox.repair_lanes()[1])
                case "prune":
                    # As Housekeeper: the posts (status ones too: STATUS_RETENTION), then a
                    # walk over the lanes (the idle ones go).
                    self.stats["pruned"] += outbox.prune_some(retention=0, status_retention=0)
                    after: int | None = 0
                    while after is not None:
                        after, lanes = outbox.prune_lanes(retention=0, after=after)
                        self.stats["lanes pruned"] += lanes
        except Aborted:
            raise
        except Exception as e:
            if actor.role in ("sender", "housekeeper") and _is_lock_error(e):
                # Their own transactions: Sender and Housekeeper retry them later.
                self.stats[f"{actor.role} deadlocks"] += 1
                return
            whose = (
                "a producer's or an operator's call" if actor.role in ("producer", "operator") else "a call"
            )
            self.fail(
                f"no error reaches {whose}", f"actor {actor.number} ({actor.role}) {kind}: {_summary(e)}"
            )
            raise Aborted from e

    def produce(self, actor: Actor, index: int, calls: tuple[Any, ...], outbox: Outbox) -> None:
        mine: list[tuple[str, str, str]] = []  # (post id, container, by) of the posts this queued
        statuses: list[str] = []
        with transaction.atomic():
            for n, call in enumerate(calls):
                by = f"p{actor.number}.{index}.{n}"
                match call:
                    case ("queue", post_id, container):
                        if outbox.queue(post_id, **place(container), body={"text": post_id, "by": by}):
                            mine.append((post_id, container, by))
                    case ("queue_many", posts):
                        outbox.queue_many(
                            {"post_id": p, **place(c), "body": {"text": p, "by": f"{by}.{k}"}}
                            for k, (p, c) in enumerate(posts)
                        )
                        mine += [(p, c, f"{by}.{k}") for k, (p, c) in enumerate(posts)]
                    case ("set_status", post_id, container, version):
                        outbox.set_status(post_id, **place(container), body={"text": f"v{version}"})
                        statuses.append(post_id)
        with self.lock:
            for post_id in statuses:
                self.restated[post_id] = next(self.seq)
            for post_id, container, by in mine:
                # A queue_many id that existed already (queued by another) is not this one's.
                self.created.setdefault(post_id, by)
                self.order[(f"p{actor.number}", container)].append(post_id)

    def on_cancelled(self, post_id: str) -> None:
        now = self.clock()
        with self.lock:
            self.cancelled[post_id] = next(self.seq)
            busy = [
                c
                for c in self.claims.values()
                if c.post_id == post_id and c.finished is None and now < c.lease_until
            ]
        if busy:
            self.fail("a post being sent is not cancelled", f"{post_id} reported cancelled under a claim")

    def still_cancelled(self, post_id: str) -> bool:
        """Reported cancelled, and not set again since: a set_status that commits after the
        cancel puts a status post back in the queue (CONTRACT: a finished row rejoins). The
        two meet on the lane's lock, and the later one runs a statement (a grant) after the
        earlier one's commit, which is noted in the same step: their order here is theirs."""
        return post_id in self.cancelled and self.restated.get(post_id, -1) < self.cancelled[post_id]

    def turn(self, actor: Actor, outbox: Outbox, limit: int, outcomes: tuple[str, ...]) -> None:
        claims = outbox.claim(limit, worker=f"a{actor.number}")
        self.on_claimed(claims)
        for n, claim in enumerate(claims):
            self.gate("send")
            self.deliver(outbox, claim, outcomes[n % len(outcomes)])

    def on_claimed(self, claims: list[ClaimedPost]) -> None:
        with self.lock:
            for claim in claims:
                self.claims[(claim.lease_token, claim.post_id)] = Claim(
                    claim.post_id, claim.container_id, claim.lease_until, next(self.seq)
                )

    def deliver(self, outbox: Outbox, claim: ClaimedPost, outcome: str) -> None:
        """What Sender does with one claim: look a stale one up, give back one too close to
        its lease's end, else send it and record the answer."""
        record = self.claims[(claim.lease_token, claim.post_id)]
        if claim.stale and self.accepted(claim.post_id):
            outbox.found(claim, f"ref-{claim.post_id}")
        elif outcome == "give_back" or self.clock() + timedelta(seconds=TIMEOUT) > claim.lease_until:
            outbox.give_back(claim)
        else:
            self.send(claim, record, accepted=outcome == "posted")
            if outcome == "posted":
                outbox.posted(claim, f"ref-{claim.post_id}")
            else:
                outbox.retry(claim, after=0, reason="simulated")
        record.finished = next(self.seq)

    def send(self, claim: ClaimedPost, record: Claim, *, accepted: bool) -> None:
        """The platform's side: the promises checked as the post is handed over."""
        now = self.clock()
        with self.lock:
            record.sent = next(self.seq)
            if self.still_cancelled(claim.post_id):
                self.failure = self.failure or Violation(
                    "a post reported cancelled is never sent", f"{claim.post_id} sent after its cancel"
                )
            others = [
                c.post_id for c in self.claims.values()
                if c is not record and c.container == claim.container_id
                and c.sent is not None and c.finished is None and now < c.lease_until
            ]  # fmt: skip
            if others:
                self.failure = self.failure or Violation(
                    "at most one post of a container in flight",
                    f"{claim.post_id} sent while {others} in flight",
                )
            if accepted:
                by = claim.body.get("by", "") if claim.kind != Kind.STATUS else ""
                self.delivered.append(Delivery(claim.post_id, claim.container_id, by, record.sent))
        if self.failure is not None:
            self.fail(self.failure.invariant, self.failure.detail)

    def accepted(self, post_id: str) -> bool:
        with self.lock:
            return any(d.post_id == post_id for d in self.delivered)

    # -- the scheduler's side ------------------------------------------------------------------

    def play_all(self) -> None:
        for actor in self.actors:
            actor.thread = threading.Thread(
                target=self.main, args=(actor,), name=f"actor-{actor.number}", daemon=True
            )
            actor.thread.start()
        with self.cond:  # every actor at its first gate: the first choice is among them all
            if not self.cond.wait_for(lambda: all(a.state != "new" for a in self.actors), timeout=STUCK):
                raise HarnessError("an actor did not start")
        choices = iter(self.replay or ())
        while True:
            self.settle()
            if self.failure is not None:
                return
            try:
                self.observe()
            except Violation as violation:
                self.fail(violation.invariant, violation.detail)
                return
            ready = [a for a in self.actors if a.state == "gate"]
            if not ready:
                if all(a.state == "done" for a in self.actors):
                    return
                self.wait_for_change()
                continue
            choice = self.choose(ready, choices)
            self.chosen.append(choice)
            if choice.startswith("t"):
                self.clock.advance(float(choice[1:]))
                continue
            actor = self.actors[int(choice)]
            if self.trace is not None:
                self.trace.append(
                    f"{self.steps} {self.clock():%M:%S} a{actor.number} {actor.waiting_for[:160]}"
                )
            with self.cond:
                actor.granted = True
                actor.state, actor.since = "running", time.monotonic()
                self.cond.notify_all()
            self.steps += 1
            if self.steps > MAX_STEPS:
                raise HarnessError(f"more than {MAX_STEPS} steps")

    def choose(self, ready: list[Actor], choices: Iterator[str]) -> str:
        if self.replay is not None:
            numbers = {str(a.number) for a in ready}
            for choice in choices:
                if choice.startswith("t") or choice in numbers:
                    return choice
            return str(ready[0].number)
        assert self.rng is not None
        if self.rng.random() < 0.04:
            return self.rng.choice(TICKS)
        return str(self.rng.choice(ready).number)

    def settle(self) -> None:
        """Wait until every granted actor has asked for its next statement, ended, or is
        waiting for a lock (checked on the database after POLL)."""
        give_up = time.monotonic() + STUCK
        while True:
            with self.cond:
                self.cond.wait_for(
                    lambda: self.aborting or all(a.state != "running" or a.blocked for a in self.actors),
                    timeout=POLL,
                )
                running = [a for a in self.actors if a.state == "running"]
            if self.aborting or not running:
                return
            waiting = self.lock_waiters(running)
            with self.cond:
                for a in running:
                    if a in waiting and not a.blocked:
                        self.lock_waits += 1
                    a.blocked = a in waiting and a.state == "running"
                if all(a.blocked or a.state != "running" for a in running):
                    return
            if time.monotonic() > give_up:
                raise HarnessError(
                    f"no step ended in {STUCK}s: {[(a.number, a.waiting_for[:60]) for a in running]}"
                )

    def wait_for_change(self) -> None:
        """Every actor left waits for a lock: wait until one gets it (a deadlock among them is
        broken by the database) and asks for its next statement, or until none is left: an
        actor whose last step was taken for a lock wait ends from there (running, then done)
        without asking again, so once the last of them has ended no one ever asks (a step
        taken for one by SLOW only, on a loaded machine, is one such)."""
        give_up = time.monotonic() + STUCK
        with self.cond:
            while (
                not self.aborting
                and all(a.state in ("running", "done") for a in self.actors)
                and any(a.state == "running" for a in self.actors)
            ):
                if time.monotonic() > give_up:
                    raise HarnessError("every actor waits for a lock, and no deadlock was broken")
                self.cond.wait(timeout=POLL * 10)

    def lock_waiters(self, running: list[Actor]) -> set[Actor]:
        """The actors among `running` whose connection waits for a lock now (or whose step
        has lasted SLOW: most likely, one the server does not report)."""
        now = time.monotonic()
        reported = self._reported_waiters(running)
        for a in running:
            a.slow = a not in reported and now - a.since > SLOW
        return reported | {a for a in running if a.slow}

    def _reported_waiters(self, running: list[Actor]) -> set[Actor]:
        by_backend = {a.backend: a for a in running}
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute(
                    "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid = ANY(%s)",
                    [list(by_backend)],
                )
                return {by_backend[pid] for (pid,) in cursor.fetchall()}
            if connection.vendor == "mysql":
                cursor.execute(
                    "SELECT trx_mysql_thread_id FROM information_schema.innodb_trx WHERE trx_state = 'LOCK WAIT'"
                )
                return {by_backend[tid] for (tid,) in cursor.fetchall() if tid in by_backend}
        # SQLite: one writer. A step that lasts while another actor's transaction is open
        # waits for the database lock (SQLite's busy handler).
        now = time.monotonic()
        holders = any(a.conn is not None and a.conn.in_atomic_block for a in self.actors if a.state == "gate")
        return {a for a in running if holders and now - a.since > SQLITE_BUSY}

    def observe(self) -> None:
        """The invariants on committed rows, read by this (the scheduler's) connection.

        Not while a step is only taken for a lock wait (SLOW): it may have committed a claim
        that its thread has not noted yet; the next step's observation covers it."""
        if any(a.slow and a.state == "running" for a in self.actors):
            self.stats["observations deferred"] += 1
            return
        rule = head_rule()
        want = {f"want_{name}": rule[name] for name in HEAD_FIELDS}
        lanes = Lane.objects.annotate(**want).values("container_id", *HEAD_FIELDS, *want, "head__post_id")
        for lane in lanes:
            now = tuple(lane[n] for n in HEAD_FIELDS)
            wanted = tuple(lane[f"want_{n}"] for n in HEAD_FIELDS)
            if now != wanted:
                raise_violation("a lane agrees with its posts", f"{lane['container_id']}: {now} != {wanted}")
            token = lane["lease_token"]
            if token and (token, lane["head__post_id"]) not in self.claims:
                claimed = [post_id for t, post_id in self.claims if t == token]
                raise_violation(
                    "a lease stays on the post it was claimed for",
                    f"{lane['container_id']}: the lease of {claimed} on {lane['head__post_id']}",
                )
        self.seen_finished |= set(
            Post.objects.exclude(state__in=ACTIVE_STATES).values_list("post_id", flat=True)
        )

    # -- the end ---------------------------------------------------------------------------------

    def drain(self) -> None:
        """A well-behaved sender, on the scheduler's connection, with the clock moved past every
        lease and due time, until no post is active."""
        outbox = Outbox(SOURCE, clock=self.clock)
        for _ in range(DRAIN_ROUNDS):
            if not Post.objects.filter(state__in=ACTIVE_STATES).exists():
                return
            self.clock.advance(LEASE + 1)
            claims = outbox.claim(50, worker="drain")
            self.on_claimed(claims)
            for claim in claims:
                self.deliver(outbox, claim, "posted")
                if self.failure is not None:
                    raise self.failure

    def check_end(self) -> None:
        rows = dict(Post.objects.with_claim().values_list("post_id", "current_state"))
        stuck = sorted(p for p, state in rows.items() if state in ACTIVE_STATES)
        if stuck:
            raise_violation("every post final after draining", str(stuck))
        for post_id in self.cancelled:
            if self.still_cancelled(post_id) and rows.get(post_id, State.CANCELLED) != State.CANCELLED:
                raise_violation("a post reported cancelled is never sent", f"{post_id} ended {rows[post_id]}")
        delivered = {d.post_id for d in self.delivered}
        for post_id in self.created:
            if post_id not in rows and post_id not in delivered | set(self.cancelled) | self.seen_finished:
                raise_violation("nothing a producer committed is lost", f"{post_id} is gone")
        if self.check_order:
            self.check_queue_order()

    def check_queue_order(self) -> None:
        """Per producer and container, its posts reached the platform in its call (list) order.

        The contested ids (`x0`, `x1`) are left out: they sort after the counted ones, so
        with ties broken by post id (before issue 18's hole 1 was fixed) they would fail it
        for that reason alone."""
        first: dict[str, Delivery] = {}
        for d in self.delivered:
            first.setdefault(d.post_id, d)
        for (producer, container), post_ids in self.order.items():
            sent = [
                first[p] for p in post_ids
                if p in first and p not in self.requeued and not p.startswith("x") and self.created.get(p, "").startswith(f"{producer}.")
                and first[p].container == container
            ]  # fmt: skip
            for earlier, later in itertools.pairwise(sent):
                if later.seq < earlier.seq:
                    raise_violation(
                        "each container's posts reach the platform in queue order",
                        f"{container}: {later.post_id} ({later.by}) sent before {earlier.post_id} ({earlier.by})",
                    )


class _NamedCursor(_HookedCursor):
    """`postgres.cursor(using)`, whose executions wait for the grant under the name of their
    statement in store/postgres.py (QUEUE, FINISH, ...), as --trace prints them."""

    def execute(self, query: Any, *args: Any, **kwargs: Any) -> Any:
        name = STATEMENT_NAMES.get(query, "psycopg: " + " ".join(str(query).split()))
        return self._faults.around(lambda: self._cursor.execute(query, *args, **kwargs), name)  # type: ignore[call-arg]


STATEMENT_NAMES = {
    getattr(postgres, name): f"psycopg {name}"
    for name in ("LOCK_PLACES", "QUEUE", "LOCK_PLACE", "QUEUE_ONE", "CLAIM", "LOCK_LANES_OF_POSTS", "FINISH")
}


def raise_violation(invariant: str, detail: str) -> None:
    raise Violation(invariant, detail)


def place(container: str) -> dict[str, str]:
    return {"workspace_id": "T1", "container_id": container}


def backend_id() -> int | None:
    """This thread's connection's id on the server (None on SQLite); PostgreSQL's deadlocks
    are looked for after 20 ms rather than a second."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET deadlock_timeout = '20ms'")
            cursor.execute("SELECT pg_backend_pid()")
            return int(cursor.fetchone()[0])
    if connection.vendor == "mysql":
        with connection.cursor() as cursor:
            cursor.execute("SET SESSION innodb_lock_wait_timeout = 20")
            cursor.execute("SELECT CONNECTION_ID()")
            return int(cursor.fetchone()[0])
    return None


def _is_lock_error(error: BaseException) -> bool:
    return isinstance(error, DatabaseError) and any(text in str(error).lower() for text in LOCK_ERRORS)


def _summary(error: BaseException) -> str:
    frame = traceback.extract_tb(error.__traceback__)[-1] if error.__traceback__ else None
    return f"{error!r}" + (f" at {frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}" if frame else "")


# -- running, shrinking, replaying --------------------------------------------------------------


def fresh_tables() -> None:
    """No posts and no lanes. On MySQL by TRUNCATE: deleted rows leave their keys in InnoDB's
    indexes, delete-marked, until purge, and the INSERT of a lane whose key was deleted scans
    them and locks the gaps after them; the package never deletes a lane, so no interleaving
    should start among deleted ones (a deadlock of two producers opening containers was found
    there, and nowhere else)."""
    if connection.vendor != "mysql":
        reset_tables()
        return
    with connection.cursor() as cursor:
        cursor.execute("SET FOREIGN_KEY_CHECKS = 0")
        try:
            for model in (Post, Lane):
                cursor.execute(f"TRUNCATE TABLE {connection.ops.quote_name(model._meta.db_table)}")
        finally:
            cursor.execute("SET FOREIGN_KEY_CHECKS = 1")


@contextmanager
def interleaving() -> Iterator[None]:
    """Clean tables and the simulated source (its settings, SQLite without fsync)."""
    fresh_tables()
    _fast_sqlite(connection=connection)
    connection_created.connect(_fast_sqlite)
    try:
        with override_settings(CONNECTOR_OUTBOX={**settings.CONNECTOR_OUTBOX, **OUTBOX_SETTINGS}):
            yield
    finally:
        connection_created.disconnect(_fast_sqlite)


def run_interleaving(
    seed: int,
    schedule: Sequence[str] | None = None,
    ops: Sequence[int] | None = None,
    *,
    check_order: bool = True,
    reversed_batches: bool = False,
    mixed_transactions: bool = False,
    trace: bool = False,
) -> Result:
    """Play the world of `seed`: with `schedule`, that list of choices (a replay); without,
    choices drawn at random from the seed (recorded in the result). `ops`: only the
    operations at these indices of the world."""
    world = generate(seed, reversed_batches=reversed_batches, mixed_transactions=mixed_transactions)
    keep = list(range(len(world.ops))) if ops is None else list(ops)
    rng = None if schedule is not None else random.Random(f"schedule {seed}")
    with interleaving():
        run = Run(world, keep, schedule, rng, check_order=check_order, trace=trace)
        real_cursor = postgres.cursor
        with mock.patch.object(postgres, "cursor", lambda using: _NamedCursor(real_cursor(using), run)):  # type: ignore[arg-type]
            try:
                run.play_all()
            except HarnessError:
                run.aborting = True
                raise
            finally:
                with run.cond:
                    run.aborting = run.aborting or run.failure is not None
                    run.cond.notify_all()
                for actor in run.actors:
                    if actor.thread is not None:
                        actor.thread.join(STUCK)
                        if actor.thread.is_alive():
                            raise HarnessError(f"actor {actor.number} did not end")
        failure = run.failure
        if failure is None:
            try:
                run.drain()
                run.check_end()
            except Violation as violation:
                failure = violation
        run.stats["claims"] += len(run.claims)
        run.stats["sends"] += sum(c.sent is not None for c in run.claims.values())
        run.stats["cancelled"] += len(run.cancelled)
        return Result(seed, run.chosen, keep, failure, run.steps, run.lock_waits, run.stats, run.trace or [])


def shrink(result: Result, budget: int = 150, **options: Any) -> Result:
    """A smaller schedule that still breaks the same invariant: ddmin over the choices, then
    over the operations (each trial a replay)."""
    assert result.failure is not None
    best = result
    runs = 0

    def fails(schedule: list[str], ops: list[int]) -> Result | None:
        nonlocal runs
        runs += 1
        trial = run_interleaving(result.seed, schedule, ops, **options)
        same = trial.failure is not None and trial.failure.invariant == result.failure.invariant  # type: ignore[union-attr]
        return trial if same else None

    for part in ("schedule", "ops"):
        chunks = 2
        while runs < budget:
            items = best.schedule if part == "schedule" else best.ops
            if len(items) < 2:
                break
            size = math.ceil(len(items) / chunks)
            for start in range(0, len(items), size):
                fewer = items[:start] + items[start + size :]
                trial = fails(fewer, best.ops) if part == "schedule" else fails(best.schedule, fewer)
                if trial is not None:
                    # Keep the choices the trial made (a replay's tail is filled in by default).
                    best = Result(best.seed, fewer if part == "schedule" else best.schedule,
                                  best.ops if part == "schedule" else fewer, trial.failure, trial.steps,
                                  trial.lock_waits, trial.stats)  # fmt: skip
                    chunks = max(chunks - 1, 2)
                    break
                if runs >= budget:
                    break
            else:
                if chunks >= len(items):
                    break
                chunks = min(len(items), chunks * 2)
    return best


def replay_command(result: Result, **options: Any) -> str:
    """The command that replays `result` (options: those of run_interleaving)."""
    world = generate(result.seed, **{k: v for k, v in options.items() if k != "check_order"})
    ops = "" if len(result.ops) == len(world.ops) else f" --ops {','.join(map(str, result.ops))}"
    url = f" --database-url {database_url()}" if connection.vendor != "sqlite" else ""
    store = " --store orm" if connection.vendor == "postgresql" and _store() == "orm" else ""
    flags = "".join(
        f" --{name.replace('_', '-')}"
        for name in ("reversed_batches", "mixed_transactions")
        if options.get(name)
    ) + (" --no-order" if options.get("check_order") is False else "")
    return f"python bench/interleave.py --seed {result.seed} --schedule {','.join(result.schedule)}{ops}{url}{store}{flags}"


def _store() -> str:
    return str(settings.CONNECTOR_OUTBOX.get("STORE", "auto"))


@dataclass
class Summary:
    interleavings: int = 0
    steps: int = 0
    lock_waits: int = 0
    errors: int = 0
    failures: list[Result] = field(default_factory=list)
    stats: Counter[str] = field(default_factory=Counter)
    started: float = field(default_factory=time.monotonic)
    first_failure_at: int | None = None  # how many interleavings it took to find the first

    def line(self) -> str:
        runtime = time.monotonic() - self.started
        invariants = Counter(f.failure.invariant for f in self.failures if f.failure)
        return (
            f"interleavings={self.interleavings} steps={self.steps} lock_waits={self.lock_waits} "
            f"failures={len(self.failures)}{' ' + str(dict(invariants)) if invariants else ''} "
            f"errors={self.errors} runtime={runtime:.1f}s ({self.interleavings / max(runtime, 1e-9):.2f}/s)"
        )


def explore(
    seeds: Sequence[int] | range,
    *,
    deadline: float | None = None,
    report: Callable[[str], None] = print,
    stop_at_first: bool = False,
    shrink_budget: int = 150,
    **options: Any,
) -> Summary:
    """Play the interleavings of `seeds` (until `deadline`, a time.monotonic() value); each
    failure shrunk and reported with its replay command."""
    summary = Summary()
    for seed in seeds:
        if deadline is not None and time.monotonic() >= deadline:
            break
        try:
            result = run_interleaving(seed, **options)
        except (HarnessError, DatabaseError) as e:
            connection.close()
            summary.errors += 1
            report(f"ERROR seed {seed}: {e}")
            continue
        summary.interleavings += 1
        summary.steps += result.steps
        summary.lock_waits += result.lock_waits
        summary.stats += result.stats
        if result.failure is not None:
            if summary.first_failure_at is None:
                summary.first_failure_at = summary.interleavings
            small = shrink(result, shrink_budget, **options) if shrink_budget else result
            summary.failures.append(small)
            report(
                f"FAIL {small.failure} ({len(small.schedule)} choices, {len(small.ops)} ops): "
                f"{replay_command(small, **options)}"
            )
            if stop_at_first:
                break
    return summary
