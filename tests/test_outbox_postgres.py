"""The PostgreSQL hot paths (store/postgres.py) under what only PostgreSQL can do to them.

Two real connections race on one lane, and a connection is dropped under an Outbox. These
tests run against PostgreSQL only: elsewhere those paths are the ORM's.
"""

from __future__ import annotations

import queue as queue_module
import threading
import time

import pytest
from django.db import DatabaseError, InterfaceError, OperationalError, connection, connections, transaction

from django_connector_outbox import Outbox
from django_connector_outbox.models import HEAD_FIELDS, Lane, Post, head_rule
from django_connector_outbox.posts import Finish
from django_connector_outbox.store import PostgresStore
from tests.conftest import FakeClock
from tests.lockstep import STEP_TIMEOUT, Actor, wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql",
        reason="the raw-SQL paths run on PostgreSQL only; run with DATABASE_URL pointing at PostgreSQL",
    ),
]


@pytest.fixture
def outbox(clock):
    yield Outbox("memory", clock=clock)
    connection.close()  # it may have been dropped: the next user reconnects


def queue(outbox, post_id, container_id="C1", **fields):
    return outbox.queue(post_id, workspace_id="T1", container_id=container_id, body={"n": post_id}, **fields)


def drop_connection() -> None:
    """Terminate the server backend of this test's own connection, and wait until it is gone."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        [pid] = cursor.fetchone()
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity "
                "WHERE pid = %s AND datname = current_database()",
                [pid],
            )
            assert cursor.fetchone() == (True,)
    finally:
        other.close()


# -- a dropped connection -----------------------------------------------------------------------


def claim_then_finish(outbox):
    [claim] = outbox.claim()
    drop_connection()
    outbox.finish_many([(claim, Finish(claim.post_id, claim.lease_token, "posted"))])


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda outbox: (drop_connection(), outbox.claim()), id="claim"),
        pytest.param(lambda outbox: (drop_connection(), queue(outbox, "p2")), id="queue"),
        pytest.param(claim_then_finish, id="finish_many"),
    ],
)
def test_a_dropped_connection_raises_djangos_database_error(outbox, call):
    queue(outbox, "p1")
    with pytest.raises(DatabaseError) as raised:
        call(outbox)
    assert isinstance(raised.value, OperationalError | InterfaceError)


# -- two producers, or a producer and a claimer, on one lane ------------------------------------


def backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


class Blocked:
    """Run `work` in a thread of its own (its own connection), and wait until it waits for a lock."""

    def __init__(self, work) -> None:
        self.pid: queue_module.Queue[int] = queue_module.Queue()
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, args=(work,))
        self.thread.start()
        self._wait_for_lock(self.pid.get(timeout=10))

    def _run(self, work) -> None:
        try:
            self.pid.put(backend_pid())
            work()
        except BaseException as e:  # pragma: no cover - reported by join()
            self.errors.append(e)
        finally:
            connections.close_all()

    def _wait_for_lock(self, pid: int) -> None:
        deadline = time.monotonic() + 10
        with connection.cursor() as cursor:
            while time.monotonic() < deadline:
                cursor.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid])
                if cursor.fetchone() == ("Lock",):
                    return
                time.sleep(0.005)
        raise AssertionError("the second transaction never waited for the lane lock")

    def join(self) -> None:
        self.thread.join(timeout=10)
        assert not self.thread.is_alive()
        assert self.errors == []


def head_of(container_id: str) -> str | None:
    lane = Lane.objects.get(container_id=container_id)
    return Post.objects.get(pk=lane.head_id).post_id if lane.head_id else None


def test_a_due_post_queued_while_a_delayed_one_is_uncommitted_becomes_the_head(outbox, clock):
    queue(outbox, "before")
    assert outbox.cancel_queued("before")  # the lane exists, with no head
    with transaction.atomic():
        queue(outbox, "later", delay=3600)
        second = Blocked(lambda: queue(Outbox("memory", clock=clock), "due"))
    second.join()

    assert head_of("C1") == "due"
    assert [c.post_id for c in outbox.claim()] == ["due"]


def test_a_post_queued_behind_the_clock_during_a_claim_waits_behind_the_claimed_head(outbox, clock):
    queue(outbox, "head")
    behind = FakeClock()
    behind.advance(-5)  # a producer whose clock is 5 s behind: its post sorts before the head
    with transaction.atomic():
        [claim] = outbox.claim()
        producer = Blocked(lambda: queue(Outbox("memory", clock=behind), "early"))
    producer.join()

    assert head_of("C1") == "head"
    assert outbox.claim() == []  # never two posts of one container sending
    assert outbox.posted(claim)
    assert [c.post_id for c in outbox.claim()] == ["early"]  # nor a post stranded behind it


def lanes_off_the_head_rule() -> list[str]:
    """The containers whose lane disagrees with `store.head_rule` (committed rows)."""
    rule = head_rule()
    want = {f"want_{name}": rule[name] for name in HEAD_FIELDS}
    lanes = Lane.objects.annotate(**want).values("container_id", *HEAD_FIELDS, *want)
    return [lane["container_id"] for lane in lanes if any(lane[n] != lane[f"want_{n}"] for n in HEAD_FIELDS)]


def test_a_batch_that_waits_while_another_producer_creates_a_lane_queues_into_it_under_its_lock(
    outbox, clock
):
    # A batch into C0 (its lane locked by another transaction), C1 and C2 (no lanes yet):
    # while it waits for C0, another producer creates C1's lane, and a third C2's, which it
    # commits only later. The batch's post into C1 is queued under C1's lock all the same: a
    # finish there meanwhile waits for the batch, and leaves the lane on that post. (Found by
    # tests/simulation/interleave.py: the post was inserted into the new lane unlocked, and a
    # finish moved the lane past it, unseen: it was stranded.)
    queue(outbox, "c0", "C0")
    holding, release_holder = threading.Event(), threading.Event()
    creating, release_creator = threading.Event(), threading.Event()

    def hold_c0():
        with transaction.atomic():
            Lane.objects.select_for_update().get(container_id="C0")
            holding.set()
            release_holder.wait(STEP_TIMEOUT)

    def create_c2():
        with transaction.atomic():
            queue(Outbox("memory", clock=clock), "d", "C2")
            creating.set()
            release_creator.wait(STEP_TIMEOUT)

    def batch():
        Outbox("memory", clock=clock).queue_many(
            {"post_id": post_id, "workspace_id": "T1", "container_id": c, "body": {}}
            for post_id, c in (("a0", "C0"), ("a1", "C1"), ("a2", "C2"))
        )

    holder, creator = Actor("holder", hold_c0).start(), Actor("creator", create_c2).start()
    assert holding.wait(STEP_TIMEOUT) and creating.wait(STEP_TIMEOUT)
    producer = Actor("batch", batch).start()
    wait_for(producer.waiting, "the batch waits for C0")
    queue(outbox, "b", "C1")  # C1's lane is created, and committed
    [claim] = outbox.claim()
    assert claim.post_id == "b"
    release_holder.set()
    holder.join()
    wait_for(producer.waiting, "the batch waits for C2's creator")
    finisher = Actor("finisher", lambda: Outbox("memory", clock=clock).posted(claim)).start()
    wait_for(finisher.reached, "the finish is done, or waits for C1")
    release_creator.set()
    creator.join()
    producer.join()
    assert finisher.join()

    assert lanes_off_the_head_rule() == []
    assert head_of("C1") == "a1"
    assert sorted(c.post_id for c in outbox.claim()) == ["a1", "c0", "d"]


# -- queue(): prepared statements that probe the place index --------------------------------------


def lane_rows_read() -> int:
    """Rows of the lanes table read in this transaction so far, by scans and index scans."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) FROM pg_stat_xact_user_tables "
            "WHERE relid = %s::regclass",
            [Lane._meta.db_table],
        )
        return int(cursor.fetchone()[0])


def test_queue_prepares_its_statements_and_reads_a_few_lanes_however_many_the_source_has(outbox):
    if not isinstance(outbox.store, PostgresStore):
        pytest.skip("STORE is 'orm': these are the PostgreSQL store's statements")
    # Django leaves psycopg's prepare_threshold None, with which prepare=True prepares nothing;
    # a generic plan then must not depend on the lanes' statistics (a new or truncated table
    # has none, and a join read every lane of the source for each post).
    with transaction.atomic():
        outbox.queue_many(
            [{"post_id": f"b{n}", "workspace_id": "T1", "container_id": f"C{n}", "body": {}} for n in range(300)]
        )
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        before = lane_rows_read()
        for n in range(10):
            assert queue(outbox, f"p{n}", container_id=f"C{n * 29}") is True
        assert queue(outbox, "new", container_id="C-new") is True  # and a lane created
        assert lane_rows_read() - before < 100  # 300 a post when every lane of the source is read
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT generic_plans + custom_plans FROM pg_prepared_statements "
                "WHERE statement LIKE %s",
                ["%INSERT INTO " + Post._meta.db_table + "%"],
            )
            assert [row[0] for row in cursor.fetchall()] == [11]
    assert lanes_off_the_head_rule() == []
