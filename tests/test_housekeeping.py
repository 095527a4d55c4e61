"""Housekeeping: wrong lanes are repaired and their containers drain; work is bounded per tick.

A lane is derived state (its container's head and due time). These tests break lanes the way a
bug, a manual UPDATE or a restore from a backup would, then let the housekeeper tick. Time
between ticks is a fake monotonic clock: no test sleeps.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from django_connector_outbox import Outbox
from django_connector_outbox.connectors import connectors
from django_connector_outbox.housekeeping import (
    ADVISORY_KEY,
    ADVISORY_NAMESPACE,
    HOUSEKEEPING_INTERVAL,
    LOCK_NAME,
    RECONCILE_INTERVAL,
    Housekeeper,
    mysql_lock_name,
)
from django_connector_outbox.models import Lane, Post
from django_connector_outbox.sender import Sender
from tests.factories import LaneFactory, PostFactory

pytestmark = pytest.mark.django_db

LEASE = 120
WEEK = 7 * 24 * 3600


class Ticks:
    """A monotonic clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def outbox(clock):
    return Outbox("memory", clock=clock)


@pytest.fixture
def ticks():
    return Ticks()


def repairs(log) -> list[str]:
    """The repair lines logged, each with its level."""
    return [
        f"{r.levelname} {r.getMessage()}" for r in log.records if r.getMessage().startswith("repaired lane")
    ]


def settings_with(**values: Any) -> Any:
    return override_settings(CONNECTOR_OUTBOX={**settings.CONNECTOR_OUTBOX, **values})


def queue(outbox: Outbox, post_id: str, container_id: str = "C1") -> None:
    assert outbox.queue(post_id, workspace_id="T1", container_id=container_id, body={"text": post_id})


def lane(container_id: str = "C1", source: str = "memory") -> Lane:
    return Lane.objects.get(source=source, workspace_id="T1", container_id=container_id)


def pk(post_id: str) -> int:
    return Post.objects.get(post_id=post_id).pk


def break_lane(container_id: str = "C1", **fields: Any) -> None:
    Lane.objects.filter(source="memory", container_id=container_id).update(**fields)


def drain(clock) -> list[str]:
    """Run senders until nothing is left: the post ids the platform took, in order."""
    for _ in range(5):
        Sender(["memory"], once=True, clock=clock, worker="w1").run()
        clock.advance(LEASE + 1)  # a claim left by a "dead" sender is taken back
    assert not Post.objects.active().exists(), "the container did not drain"
    return [m.post_id for m in connectors["memory"].messages("C1")]  # type: ignore[attr-defined]


# -- stranded lanes ----------------------------------------------------------------------------------


def head_on_a_finished_post(outbox, clock):
    queue(outbox, "p1")
    queue(outbox, "p2")
    [claim] = outbox.claim()
    outbox.posted(claim, "ref")
    break_lane(head_id=pk("p1"), due_at=clock.now)  # p1 is posted: never claimed again
    return ["p2"]


def no_head_while_posts_are_queued(outbox, clock):
    queue(outbox, "p1")
    queue(outbox, "p2")
    break_lane(head_id=None, due_at=None)
    return ["p1", "p2"]


def due_in_the_far_future(outbox, clock):
    queue(outbox, "p1")
    queue(outbox, "p2")
    break_lane(due_at=clock.now + timedelta(days=3650))
    return ["p1", "p2"]


def lease_left_on_a_finished_post(outbox, clock):
    queue(outbox, "p1")
    queue(outbox, "p2")
    outbox.claim()  # p1 is sending (a sender that dies)
    Post.objects.filter(post_id="p1").update(state="cancelled")  # by hand, under the lease
    return ["p2"]  # looked up when the lease ends (it may have been in flight), then sent


STRANDINGS = [
    head_on_a_finished_post,
    no_head_while_posts_are_queued,
    due_in_the_far_future,
    lease_left_on_a_finished_post,
]


@pytest.mark.parametrize("strand", STRANDINGS, ids=lambda f: f.__name__)
def test_a_wrong_lane_is_repaired_logged_and_its_container_drains(outbox, clock, package_log, strand):
    expected = strand(outbox, clock)
    wrong = lane()
    head = Post.objects.filter(state="queued").order_by("queued_at", "post_id").first()

    Housekeeper([outbox], "default").tick()

    repaired = lane()
    assert repaired.head_id == head.pk
    # A lease is kept (the post in flight is looked up when it ends); else the head's due time.
    assert repaired.due_at == (wrong.due_at if wrong.lease_token else head.next_at)
    [line] = repairs(package_log)
    assert line.startswith("WARNING repaired lane source=memory ")
    assert f"lane={wrong.pk} workspace=T1 container=C1 old_head={wrong.head_id} " in line
    assert f"new_head={head.pk} new_due={repaired.due_at.isoformat()}" in line
    assert drain(clock) == expected


def test_a_right_lane_is_left_alone(outbox, clock, package_log):
    queue(outbox, "p1")
    queue(outbox, "p2", "C2")
    outbox.claim(1)
    before = list(Lane.objects.values_list("pk", "head_id", "due_at").order_by("pk"))
    Housekeeper([outbox], "default").tick()
    assert list(Lane.objects.values_list("pk", "head_id", "due_at").order_by("pk")) == before
    assert repairs(package_log) == []


def test_lanes_of_other_sources_are_not_this_senders_business(outbox, clock, package_log):
    other = Outbox("other", clock=clock)
    queue(other, "theirs")
    Lane.objects.filter(source="other").update(head_id=None, due_at=None)
    Housekeeper([outbox], "default").tick()
    assert lane(source="other").head_id is None
    Housekeeper([other], "default").tick()
    assert lane(source="other").head_id == pk("theirs")


def test_a_repair_under_a_live_claim_keeps_one_post_in_flight(outbox, clock):
    queue(outbox, "p1")
    queue(outbox, "p2")
    [claim] = outbox.claim()
    break_lane(head_id=None)
    Housekeeper([outbox], "default").tick()
    assert outbox.claim() == []  # p1's lease holds the container, as before the damage
    assert outbox.posted(claim, "ref") is True
    assert [c.post_id for c in outbox.claim()] == ["p2"]


# -- walking the lanes in batches --------------------------------------------------------------------


def test_the_lanes_are_walked_a_batch_per_tick_and_the_walk_wraps_around(outbox, clock, ticks, package_log):
    for n in range(25):
        queue(outbox, f"p{n}", f"C{n:02}")
    Lane.objects.update(head_id=None, due_at=None)
    housekeeper = Housekeeper([outbox], "default", reconcile_batch=10, monotonic=ticks)
    repaired = []
    for _ in range(3):
        housekeeper.tick()
        repaired.append(len(repairs(package_log)) - sum(repaired))
        ticks.advance(RECONCILE_INTERVAL)
    assert repaired == [10, 10, 5]
    assert not Lane.objects.filter(head_id=None).exists()

    # The walk starts again from the first lane.
    break_lane("C00", head_id=None, due_at=None)
    housekeeper.tick()
    assert lane("C00").head_id == pk("p0")


def test_no_housekeeping_between_its_times(outbox, clock, ticks):
    housekeeper = Housekeeper([outbox], "default", monotonic=ticks)
    housekeeper.tick()
    queue(outbox, "p1")
    break_lane(head_id=None, due_at=None)
    ticks.advance(RECONCILE_INTERVAL - 0.5)
    with CaptureQueriesContext(connection) as ctx:
        housekeeper.tick()
    assert ctx.captured_queries == []
    ticks.advance(0.5)
    housekeeper.tick()
    assert lane().head_id == pk("p1")


def test_repair_lanes_reports_where_the_walk_stopped(outbox, clock):
    for n in range(3):
        queue(outbox, f"p{n}", f"C{n}")
    ids = sorted(Lane.objects.values_list("pk", flat=True))
    assert outbox.repair_lanes(0, 2) == (ids[1], [])
    assert outbox.repair_lanes(ids[1], 2) == (None, [])  # the end: start again from 0


# -- pruning in bounded batches ----------------------------------------------------------------------


def deletes(ctx, model=Post) -> int:
    """DELETEs from the table of `model` (the last batch of a run also deletes idle gates and
    lanes)."""
    sql = [q["sql"].split() for q in ctx.captured_queries]
    return sum(1 for q in sql if q[0].upper() == "DELETE" and q[2].strip('"`') == model._meta.db_table)


def test_a_large_prune_is_spread_over_ticks(outbox, clock, ticks, package_log):
    home = LaneFactory()
    Post.objects.bulk_create(PostFactory.build_batch(2500, posted=True, lane=home), batch_size=500)
    clock.advance(WEEK + 1)
    housekeeper = Housekeeper([outbox], "default", monotonic=ticks)

    left = []
    for _ in range(4):
        with CaptureQueriesContext(connection) as ctx:
            housekeeper.tick()
        assert deletes(ctx) <= 1
        left.append(Post.objects.count())
    assert left == [1500, 500, 0, 0]
    counts = [r.getMessage() for r in package_log.records if r.getMessage().startswith("pruned")]
    assert counts == ["pruned finished posts source=memory count=1000"] * 2 + [
        "pruned finished posts source=memory count=500",
        "pruned idle lanes source=memory count=1",  # the lane of those posts, in the same tick
    ]


def test_a_prune_run_leaves_its_sender_half_of_its_time(outbox, clock, ticks, monkeypatch):
    home = LaneFactory()
    Post.objects.bulk_create(PostFactory.build_batch(2500, posted=True, lane=home), batch_size=500)
    clock.advance(WEEK + 1)
    prune_some = outbox.prune_some

    def slow_prune_some(*args, **kwargs):  # a batch that takes 2 s on the housekeeper's clock
        ticks.advance(2)
        return prune_some(*args, **kwargs)

    monkeypatch.setattr(outbox, "prune_some", slow_prune_some)
    housekeeper = Housekeeper([outbox], "default", monotonic=ticks)
    left = []
    for step in (0, 0, 1.9, 0.1, 1, 1):
        ticks.advance(step)
        housekeeper.tick()
        left.append(Post.objects.count())
    # a batch, then 2 s for the sender alone (the reconcile goes on: not the prune run's time)
    assert left == [1500, 1500, 1500, 500, 500, 0]


def test_housekeeping_keeps_failed_and_uncertain_posts_for_the_attention_retention(outbox, clock, ticks):
    for state in ("posted", "cancelled", "failed", "uncertain"):
        PostFactory(post_id=state, status=state)
    clock.advance(WEEK + 1)
    Housekeeper([outbox], "default", monotonic=ticks).tick()
    assert sorted(Post.objects.values_list("post_id", flat=True)) == ["failed", "uncertain"]
    clock.advance(30 * 86400 - WEEK)
    Housekeeper([outbox], "default", monotonic=ticks).tick()
    assert not Post.objects.exists()


def test_pruning_starts_again_after_the_housekeeping_interval(outbox, clock, ticks):
    housekeeper = Housekeeper([outbox], "default", monotonic=ticks)
    housekeeper.tick()
    PostFactory(post_id="old", posted=True)
    clock.advance(WEEK + 1)
    ticks.advance(HOUSEKEEPING_INTERVAL - 1)
    housekeeper.tick()
    assert Post.objects.filter(post_id="old").exists()
    ticks.advance(1)
    housekeeper.tick()
    assert not Post.objects.filter(post_id="old").exists()


def test_prune_some_deletes_at_most_its_limit(outbox, clock):
    for n in range(5):
        PostFactory(post_id=f"old{n}", posted=True)
    clock.advance(WEEK + 1)
    assert outbox.prune_some(limit=2) == 2
    assert outbox.prune_some(limit=2) == 2
    assert outbox.prune_some(limit=2) == 1
    assert Post.objects.count() == 0


# -- a failing step ----------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)  # the foreign key is checked at commit on SQLite and PostgreSQL
def test_prune_keeps_a_finished_post_that_a_lane_still_names(outbox, clock, ticks):
    queue(outbox, "p1")
    queue(outbox, "p2")
    for _ in range(2):
        [claim] = outbox.claim()
        outbox.posted(claim, f"ref-{claim.post_id}")
    break_lane(head_id=pk("p1"), due_at=clock.now)  # drift (a manual UPDATE, a restore): p1 is posted
    clock.advance(WEEK + 1)

    assert outbox.prune_finished() == 1

    assert list(Post.objects.values_list("post_id", flat=True)) == ["p1"]
    Housekeeper([outbox], "default", monotonic=ticks).tick()  # repaired, then pruned in the same tick
    assert not Post.objects.exists()
    assert not Lane.objects.exists()  # and the lane, left without posts


def duplicate_lane(*args: Any, **kwargs: Any) -> Any:
    """A step that the database refuses: a unique key (a real IntegrityError, mid-transaction)."""
    Lane.objects.create(source="memory", workspace_id="T1", container_id="C1")


def broken(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("a bug in a housekeeping step")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("failure", [duplicate_lane, broken], ids=lambda f: f.__name__)
@pytest.mark.parametrize("step", ["repair_lanes", "prune_some"])
def test_a_failing_housekeeping_step_is_logged_and_counted_and_the_sender_goes_on(
    monkeypatch, package_log, step, failure
):
    outbox = Outbox("memory")
    queue(outbox, "p1")
    queue(outbox, "p2", "C2")
    monkeypatch.setattr(Outbox, step, failure)

    call_command("run_outbox", "--once", "--source", "memory", verbosity=0)

    assert sorted(Post.objects.filter(state="posted").values_list("post_id", flat=True)) == ["p1", "p2"]
    [record] = [r for r in package_log.records if r.getMessage().startswith("housekeeping step failed")]
    assert record.levelname == "ERROR" and record.exc_info is not None
    assert record.getMessage() == f"housekeeping step failed step={step} source=memory"
    [summary] = [r.getMessage() for r in package_log.records if r.getMessage().startswith("summary ")]
    assert " posted=2 " in summary and " housekeeping_errors=1 " in summary


def test_a_failed_prune_ends_its_run_until_the_next_interval(outbox, ticks, monkeypatch, package_log):
    calls = []

    def failing_prune(*args: Any, **kwargs: Any) -> int:
        calls.append(ticks())
        raise RuntimeError("a bug in prune")

    monkeypatch.setattr(outbox, "prune_some", failing_prune)
    housekeeper = Housekeeper([outbox], "default", monotonic=ticks)
    for _ in range(3):
        housekeeper.tick()
        ticks.advance(RECONCILE_INTERVAL)
    ticks.advance(HOUSEKEEPING_INTERVAL)
    housekeeper.tick()
    assert len(calls) == 2  # once per run, not once per tick
    assert housekeeper.stats["housekeeping_errors"] == 2


# -- the lock ----------------------------------------------------------------------------------------


postgresql_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="needs PostgreSQL (DATABASE_URL=postgres://...)"
)
mysql_only = pytest.mark.skipif(
    connection.vendor != "mysql", reason="needs MySQL/MariaDB (DATABASE_URL=mysql://...)"
)


def other_connection():
    """A second session on the test database: another process, as far as locks go."""
    return connection.copy()


@postgresql_only
def test_the_postgresql_lock_is_the_two_key_form_under_the_apps_namespace(outbox):
    with Housekeeper([outbox], "default").turn() as mine, connection.cursor() as cursor:
        assert mine is True
        cursor.execute(
            "SELECT classid::bigint, objid::bigint, objsubid FROM pg_locks "
            "WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
        )
        assert cursor.fetchall() == [(ADVISORY_NAMESPACE, ADVISORY_KEY, 2)]


@postgresql_only
@pytest.mark.parametrize("number", [ADVISORY_KEY, ADVISORY_NAMESPACE], ids=["key", "namespace"])
def test_a_projects_one_key_lock_with_the_same_number_does_not_block_housekeeping(outbox, number):
    project = other_connection()
    try:
        with project.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s)", [number])
        with Housekeeper([outbox], "default").turn() as mine:
            assert mine is True
    finally:
        project.close()  # ends the session, and its lock


@postgresql_only
def test_a_tick_while_another_sender_holds_the_lock_does_nothing(outbox, ticks):
    queue(outbox, "p1")
    break_lane(head_id=None, due_at=None)
    housekeeper = Housekeeper([outbox], "default", monotonic=ticks)
    other = other_connection()
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s, %s)", [ADVISORY_NAMESPACE, ADVISORY_KEY])
            housekeeper.tick()
            assert lane().head_id is None
            cursor.execute("SELECT pg_advisory_unlock(%s, %s)", [ADVISORY_NAMESPACE, ADVISORY_KEY])
    finally:
        other.close()
    ticks.advance(RECONCILE_INTERVAL)
    housekeeper.tick()
    assert lane().head_id == pk("p1")


@mysql_only
def test_the_mysql_lock_is_named_after_the_app_and_the_database(outbox):
    name = mysql_lock_name(connection.settings_dict["NAME"])
    assert name.startswith(LOCK_NAME + ":")
    assert len(mysql_lock_name("d" * 64)) <= 64
    with Housekeeper([outbox], "default").turn() as mine, connection.cursor() as cursor:
        assert mine is True
        cursor.execute("SELECT IS_USED_LOCK(%s) = CONNECTION_ID(), IS_USED_LOCK(%s)", [name, LOCK_NAME])
        assert cursor.fetchone() == (1, None)


@mysql_only
def test_another_databases_housekeeping_does_not_block_this_ones(outbox):
    # GET_LOCK names are shared by every database on the server.
    other = other_connection()
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT GET_LOCK(%s, 0)", [mysql_lock_name("another_project")])
        with Housekeeper([outbox], "default").turn() as mine:
            assert mine is True
    finally:
        other.close()


@pytest.mark.parametrize("state", ["posted", "failed", "uncertain", "cancelled"])
def test_housekeeping_prunes_finished_status_posts_after_the_status_retention_only(
    outbox, clock, ticks, state
):
    PostFactory(post_id="status", kind="status", status=state)
    clock.advance(WEEK * 100)
    Housekeeper([outbox], "default", monotonic=ticks).tick()
    assert Post.objects.filter(post_id="status").exists()  # STATUS_RETENTION None: kept

    with settings_with(STATUS_RETENTION=WEEK * 100 - 1):
        Housekeeper([outbox], "default", monotonic=ticks).tick()
    assert not Post.objects.exists()


def test_housekeeping_walks_the_lanes_a_batch_per_tick_once_the_posts_are_done(
    outbox, clock, ticks, package_log
):
    for n in range(5):
        LaneFactory(container_id=f"C{n}")
    PostFactory(post_id="old", container_id="C4", posted=True)
    PostFactory(post_id="recent", container_id="C2", posted=True, updated_at=clock.now + timedelta(days=6))
    clock.advance(WEEK + 1)
    housekeeper = Housekeeper([outbox], "default", monotonic=ticks, prune_batch=2)

    lanes, removed = [], []
    for _ in range(4):
        with CaptureQueriesContext(connection) as ctx:
            housekeeper.tick()
        removed.append(deletes(ctx, Lane))
        lanes.append(sorted(Lane.objects.values_list("container_id", flat=True)))
    # The posts' batch came back short at once: C0, C1 go in the same tick; then C2 (a post)
    # and C3; then C4, whose post went in the first tick; then the run is over.
    assert lanes == [["C2", "C3", "C4"], ["C2", "C4"], ["C2"], ["C2"]]
    # A DELETE a batch; on MySQL a DELETE a lane (OrmStore.prune_lanes).
    assert removed == ([2, 1, 1, 0] if connection.vendor == "mysql" else [1, 1, 1, 0])
    logged = [r.getMessage() for r in package_log.records if r.getMessage().startswith("pruned")]
    assert logged == [
        "pruned finished posts source=memory count=1",
        "pruned idle lanes source=memory count=2",
        "pruned idle lanes source=memory count=1",
        "pruned idle lanes source=memory count=1",
    ]
    ticks.advance(HOUSEKEEPING_INTERVAL)
    clock.advance(WEEK)
    housekeeper.tick()  # the next run: C2's post is old enough now
    assert not Lane.objects.exists()
