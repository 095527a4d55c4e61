"""Migrations that move data, both ways.

0007 moves the claims of posts in flight to their lanes, and back when unapplied. A sender may
be sending when the migration runs: its claim must survive it (the post stays `sending` under
the same lease, at the same attempt), or its result would be fenced out and the post sent again.

0008 orders a container by (queued_at, id): the lanes' floors, which named posts by post id,
become unknown (null), and each lane keeps its head.

0015 spells the history's lost replies "lost_reply" (posts.Outcome), "lost" again when unapplied.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from django_connector_outbox import Outbox

pytestmark = pytest.mark.django_db(transaction=True)

APP = "django_connector_outbox"
BEFORE = [(APP, "0006_lane_due_head")]
AFTER = [(APP, "0007_lease_on_lane")]
QUEUE_ORDER = [(APP, "0008_queue_order_by_id")]
BEFORE_OUTCOMES = [(APP, "0014_verbose_names")]
OUTCOMES = [(APP, "0015_outcome_lost_reply")]
NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
LEASE_END = NOW + timedelta(seconds=120)


def migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


def latest():
    """The app's latest migration as the graph now stands: the squashed one on a database that
    applied every migration it replaces, else the last replaced one."""
    return MigrationExecutor(connection).loader.graph.leaf_nodes(APP)


@pytest.fixture
def old_schema():
    yield migrate(BEFORE)
    migrate(latest())  # asked after the test: the graph changes with what is applied


def old_rows(apps):
    """Under 0006: p1 sending (its second attempt), p2 queued behind it, in one lane."""
    Lane = apps.get_model(APP, "Lane")
    Post = apps.get_model(APP, "Post")
    lane = Lane.objects.create(source="memory", workspace_id="T1", container_id="C1")
    common = dict(source="memory", lane=lane, workspace_id="T1", container_id="C1", body={"text": "x"},
                  created_at=NOW, updated_at=NOW)  # fmt: skip
    p1 = Post.objects.create(
        post_id="p1", state="sending", attempts=2, queued_at=NOW, next_at=NOW, lease_token="t" * 32,
        lease_until=LEASE_END, worker="host:1", sent_at=NOW, **common,
    )  # fmt: skip
    Post.objects.create(post_id="p2", queued_at=NOW + timedelta(seconds=1), next_at=NOW, **common)
    Lane.objects.filter(pk=lane.pk).update(head=p1, due_at=LEASE_END)


def test_a_claim_in_flight_moves_to_its_lane_and_stays_current(old_schema):
    old_rows(old_schema)
    migrate(latest())

    from django_connector_outbox.models import Lane, Post

    p1 = Post.objects.with_claim().get(post_id="p1")
    assert (p1.state, p1.current_state, p1.attempts, p1.current_attempts) == ("queued", "sending", 1, 2)
    assert (p1.lease_token, p1.lease_until, p1.worker, p1.sent_at) == ("t" * 32, LEASE_END, "host:1", NOW)
    assert Lane.objects.get().head_id == p1.pk
    assert Outbox("memory").find("p2").state == "queued"


def test_unapplied_the_claim_goes_back_to_its_post(old_schema):
    old_rows(old_schema)
    migrate(AFTER)
    apps = migrate(BEFORE)

    Post = apps.get_model(APP, "Post")
    p1 = Post.objects.get(post_id="p1")
    assert (p1.state, p1.attempts, p1.lease_token, p1.lease_until, p1.worker) == (
        "sending", 2, "t" * 32, LEASE_END, "host:1",
    )  # fmt: skip
    assert Post.objects.get(post_id="p2").state == "queued"


@pytest.fixture
def schema_before_queue_order():
    yield migrate(AFTER)
    migrate(latest())


def rows_with_a_floor(apps):
    """Under 0007: a lane whose floor names its head, p1, by post id; p2 queued behind it."""
    Lane = apps.get_model(APP, "Lane")
    Post = apps.get_model(APP, "Post")
    lane = Lane.objects.create(source="memory", workspace_id="T1", container_id="C1")
    common = dict(source="memory", lane=lane, workspace_id="T1", container_id="C1", body={"text": "x"},
                  queued_at=NOW, next_at=NOW, created_at=NOW, updated_at=NOW)  # fmt: skip
    p1 = Post.objects.create(post_id="p1", **common)
    Post.objects.create(post_id="p2", **common)
    Lane.objects.filter(pk=lane.pk).update(head=p1, due_at=NOW, floor_queued_at=NOW, floor_post_id="p1")


def test_queue_order_by_id_forgets_the_floors_and_keeps_the_heads(schema_before_queue_order):
    rows_with_a_floor(schema_before_queue_order)
    migrate(QUEUE_ORDER)
    migrate(latest())  # the models of today: later migrations add columns they read

    from django_connector_outbox.models import Lane

    lane = Lane.objects.get()
    assert (lane.floor_queued_at, lane.floor_id) == (None, None)
    assert lane.head.post_id == "p1"
    outbox = Outbox("memory", clock=lambda: NOW)
    [claim] = outbox.claim()
    assert claim.post_id == "p1"
    assert outbox.posted(claim)
    assert Lane.objects.get().head.post_id == "p2"


def test_the_lane_foreign_key_keeps_one_index_that_starts_with_it(schema_before_queue_order):
    # MySQL needs an index that starts with the foreign key at every moment: removed before its
    # replacement exists, Django would have added one that a fresh install does not have.
    migrate(QUEUE_ORDER)
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, "django_connector_outbox_post")
    starting_with_lane = sorted(
        name
        for name, info in constraints.items()
        if info["index"] and not info["primary_key"] and info["columns"][:1] == ["lane_id"]
    )
    assert starting_with_lane == ["connector_outbox_post_order"]
    assert constraints["connector_outbox_post_order"]["columns"] == ["lane_id", "state", "queued_at", "id"]


def test_unapplied_queue_order_leaves_the_floors_unknown(schema_before_queue_order):
    rows_with_a_floor(schema_before_queue_order)
    migrate(QUEUE_ORDER)
    apps = migrate(AFTER)

    Lane = apps.get_model(APP, "Lane")
    lane = Lane.objects.get()
    # The head through the historical Post (lane.head may resolve to the current model, whose
    # columns added since, thread_of, this schema does not have).
    head = apps.get_model(APP, "Post").objects.get(pk=lane.head_id)
    assert (lane.floor_queued_at, lane.floor_post_id, head.post_id) == (None, None, "p1")


@pytest.fixture
def schema_before_outcomes():
    yield migrate(BEFORE_OUTCOMES)
    migrate(latest())


def history(apps):
    """(post id, outcome) of every history row, in order."""
    Attempt = apps.get_model(APP, "Attempt")
    return list(Attempt.objects.order_by("pk").values_list("post__post_id", "outcome"))


def test_the_history_spells_a_lost_reply_one_way_and_unapplied_the_old_way(schema_before_outcomes):
    apps = schema_before_outcomes
    Lane, Post, Attempt = (apps.get_model(APP, name) for name in ("Lane", "Post", "Attempt"))
    lane = Lane.objects.create(source="memory", workspace_id="T1", container_id="C1")
    post = Post.objects.create(
        source="memory", post_id="p1", lane=lane, workspace_id="T1", container_id="C1", body={"text": "x"},
        queued_at=NOW, next_at=NOW, created_at=NOW, updated_at=NOW,
    )  # fmt: skip
    for attempt, outcome in enumerate(["held", "lost", "retried", "lost"], start=1):
        Attempt.objects.create(post=post, at=NOW, attempt=attempt, outcome=outcome)

    after = migrate(OUTCOMES)
    assert history(after) == [("p1", "held"), ("p1", "lost_reply"), ("p1", "retried"), ("p1", "lost_reply")]
    before = migrate(BEFORE_OUTCOMES)
    assert history(before) == [("p1", "held"), ("p1", "lost"), ("p1", "retried"), ("p1", "lost")]
