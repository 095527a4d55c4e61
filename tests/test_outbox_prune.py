"""prune_finished: old finished one-off posts go; status rows, recent and active rows stay."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from django_connector_outbox import Outbox
from django_connector_outbox.models import Gate, Post
from tests.factories import EPOCH, LaneFactory, PostFactory

pytestmark = pytest.mark.django_db

WEEK = 7 * 24 * 3600
FINISHED = ["posted", "failed", "uncertain", "cancelled"]


@pytest.fixture
def outbox(clock):
    return Outbox("memory", clock=clock)


def settings_with(**values):
    return override_settings(CONNECTOR_OUTBOX={**settings.CONNECTOR_OUTBOX, **values})


def left():
    return set(Post.objects.values_list("post_id", flat=True))


@pytest.mark.parametrize("state", ["posted", "cancelled"])
def test_an_old_finished_one_off_post_is_pruned(outbox, clock, state):
    PostFactory(post_id="old", status=state)
    clock.advance(WEEK + 1)
    assert outbox.prune_finished() == 1
    assert left() == set()
    assert outbox.find("old") is None


@pytest.mark.parametrize("state", ["failed", "uncertain"])
def test_a_failed_or_uncertain_post_waits_for_a_person_for_the_attention_retention(outbox, clock, state):
    PostFactory(post_id="old", status=state)
    clock.advance(WEEK + 1)
    attention = outbox.attention_retention()  # what housekeeping and outbox_prune pass
    assert outbox.prune_finished(attention_retention=attention) == 0
    assert outbox.prunable(attention_retention=attention) == {
        "posted": 0,
        "failed": 0,
        "uncertain": 0,
        "cancelled": 0,
    }
    clock.advance(30 * 86400 - WEEK)
    assert outbox.prunable(attention_retention=attention)[state] == 1
    assert outbox.prune_finished(attention_retention=attention) == 1
    assert left() == set()


@pytest.mark.parametrize("state", ["failed", "uncertain"])
def test_the_attention_retention_is_a_setting(outbox, clock, state):
    PostFactory(post_id="old", status=state)
    clock.advance(3 * 86400)
    with settings_with(RETENTION=86400, ATTENTION_RETENTION=timedelta(days=2)):
        assert outbox.prune_finished(attention_retention=4 * 86400) == 0
        assert outbox.prune_finished(retention=4 * 86400) == 0  # never shorter than the retention
        assert outbox.prune_finished(attention_retention=outbox.attention_retention()) == 1


@pytest.mark.parametrize("kind", ["message", "reaction", "ephemeral"])
def test_every_one_off_kind_is_pruned(outbox, clock, kind):
    PostFactory(post_id="old", kind=kind, posted=True)
    clock.advance(WEEK + 1)
    assert outbox.prune_finished() == 1


@pytest.mark.parametrize("state", FINISHED)
def test_a_status_post_is_never_pruned(outbox, clock, state):
    PostFactory(post_id="status", kind="status", status=state)
    clock.advance(WEEK * 100)
    assert outbox.prune_finished() == 0
    assert left() == {"status"}


@pytest.mark.parametrize("state", ["queued", "sending"])
def test_an_active_post_is_never_pruned(outbox, clock, state):
    outbox.queue("active", workspace_id="T1", container_id="C1", body={"text": "x"})
    if state == "sending":
        assert outbox.claim()
    clock.advance(WEEK * 100)
    assert outbox.prune_finished() == 0
    assert left() == {"active"}


def test_the_default_retention_is_a_week_since_the_last_change(outbox, clock):
    PostFactory(post_id="old", posted=True, updated_at=EPOCH)
    PostFactory(post_id="newer", posted=True, updated_at=EPOCH + timedelta(seconds=1))
    clock.advance(WEEK)
    assert outbox.prune_finished() == 0  # changed exactly a week ago: not before the cutoff
    clock.advance(0.5)
    assert outbox.prune_finished() == 1
    assert left() == {"newer"}
    clock.advance(1)
    assert outbox.prune_finished() == 1
    assert left() == set()


def test_the_last_change_counts_not_the_creation(outbox, clock):
    PostFactory(post_id="p", posted=True, created_at=EPOCH - timedelta(days=30), updated_at=EPOCH)
    clock.advance(WEEK - 1)
    assert outbox.prune_finished() == 0


@pytest.mark.parametrize("retention", [3600, 3600.0, timedelta(hours=1)], ids=repr)
def test_an_explicit_retention(outbox, clock, retention):
    PostFactory(post_id="old", posted=True)
    PostFactory(post_id="recent", posted=True, updated_at=EPOCH + timedelta(minutes=30))
    PostFactory(post_id="old-failed", failed=True)
    PostFactory(post_id="recent-failed", failed=True, updated_at=EPOCH + timedelta(minutes=30))
    clock.advance(3600 + 1)
    # Given alone, a retention is every finished post's (the contract's prune_finished).
    assert outbox.prune_finished(retention) == 2
    assert left() == {"recent", "recent-failed"}


def test_an_explicit_attention_retention_keeps_failed_posts_longer(outbox, clock):
    PostFactory(post_id="old", posted=True)
    PostFactory(post_id="old-failed", failed=True)
    clock.advance(3600 + 1)
    assert outbox.prune_finished(3600, attention_retention=7200) == 1
    assert left() == {"old-failed"}


def test_a_retention_of_0_prunes_everything_finished_before_now(outbox, clock):
    PostFactory(post_id="old", cancelled=True)
    PostFactory(post_id="live")
    clock.advance(1)
    assert outbox.prune_finished(0) == 1
    assert left() == {"live"}


@pytest.mark.parametrize("retention", [60, timedelta(minutes=1)], ids=repr)
def test_the_retention_setting_is_the_default(outbox, clock, retention):
    PostFactory(post_id="old", posted=True)
    clock.advance(61)
    with settings_with(RETENTION=retention):
        assert outbox.prune_finished() == 1


def test_prune_sees_only_its_source(outbox, clock):
    PostFactory(post_id="mine", posted=True)
    PostFactory(post_id="theirs", posted=True, source="other")
    clock.advance(WEEK + 1)
    assert outbox.prune_finished() == 1
    assert left() == {"theirs"}
    assert Outbox("other", clock=clock).prune_finished() == 1


def test_prune_deletes_in_batches(outbox, clock):
    lane = LaneFactory()
    rows = PostFactory.build_batch(2501, posted=True, lane=lane)
    Post.objects.bulk_create(rows, batch_size=500)
    PostFactory(post_id="keep", failed=True, lane=lane, updated_at=clock.now + timedelta(days=1))
    clock.advance(WEEK + 1)

    with CaptureQueriesContext(connection) as ctx:
        assert outbox.prune_finished() == 2501

    assert left() == {"keep"}
    deletes = [q["sql"] for q in ctx.captured_queries if q["sql"].lstrip().upper().startswith("DELETE")]
    assert len([sql for sql in deletes if "_post" in sql]) == 3  # 1000 + 1000 + 501


def test_prune_after_delivery_through_the_outbox(outbox, clock):
    outbox.queue("p1", workspace_id="T1", container_id="C1", body={})
    outbox.set_status("s1", workspace_id="T1", container_id="C2", body={})
    outbox.queue("p2", workspace_id="T1", container_id="C1", body={})
    claims = outbox.claim()
    assert sorted(c.post_id for c in claims) == ["p1", "s1"]
    for claim in claims:
        outbox.posted(claim, "ref")
    clock.advance(WEEK + 1)
    assert outbox.prune_finished() == 1
    assert left() == {"p2", "s1"}
    # the container goes on: p2 is its head
    assert [c.post_id for c in outbox.claim()] == ["p2"]
    # and a pruned id is free again
    assert outbox.queue("p1", workspace_id="T1", container_id="C1", body={}) is True


def test_gates_that_hold_nothing_for_the_retention_go_with_the_last_batch(outbox, clock):
    then = clock.now
    Gate.objects.create(
        source="memory",
        scope="container",
        workspace_id="T1",
        container_id="C1",
        held_until=then,
        updated_at=then,
    )  # a hold long over
    Gate.objects.create(source="memory", scope="workspace", workspace_id="T1", pace_tat=then, updated_at=then)
    Gate.objects.create(
        source="memory", scope="source", held_until=then + timedelta(days=30), updated_at=then
    )
    Gate.objects.create(source="other", scope="source", updated_at=then)  # another source's
    clock.advance(WEEK + 1)
    Gate.objects.create(
        source="memory", scope="workspace", workspace_id="T2", pace_tat=clock.now, updated_at=clock.now
    )

    assert outbox.prune_finished() == 0

    kept = Gate.objects.order_by("source", "scope", "workspace_id").values_list(
        "source", "scope", "workspace_id"
    )
    assert list(kept) == [("memory", "source", ""), ("memory", "workspace", "T2"), ("other", "source", "")]
