"""Migration 0007 moves the claims of posts in flight to their lanes, and back when unapplied.

A sender may be sending when the migration runs: its claim must survive it (the post stays
`sending` under the same lease, at the same attempt), or its result would be fenced out and the
post sent again.
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
NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
LEASE_END = NOW + timedelta(seconds=120)


def migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


@pytest.fixture
def old_schema():
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes(APP)
    yield migrate(BEFORE)
    migrate(latest)


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
    migrate(AFTER)

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
