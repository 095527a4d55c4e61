"""prune_finished: old finished one-off posts go; status rows, recent and active rows stay.

With a status retention (STATUS_RETENTION, which housekeeping and outbox_prune pass) finished
status posts go too; and the lanes left without posts, idle since the cutoff, go after them.
Every test runs on the database and store of the run (SQLite, PostgreSQL, OUTBOX_STORE=orm).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from django_connector_outbox import Outbox, PostState
from django_connector_outbox.models import Gate, Lane, Post
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
        "status": 0,
        "lanes": 0,
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
    post = Post._meta.db_table
    deletes = [q["sql"] for q in ctx.captured_queries if q["sql"].lstrip().upper().startswith("DELETE")]
    assert len([sql for sql in deletes if sql.split()[2].strip('"`') == post]) == 3  # 1000 + 1000 + 501


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


# -- status posts: STATUS_RETENTION --------------------------------------------------------------


@pytest.mark.parametrize("state", FINISHED)
def test_a_finished_status_post_goes_after_the_status_retention(outbox, clock, state):
    PostFactory(post_id="status", kind="status", status=state, updated_at=EPOCH)
    PostFactory(post_id="newer", kind="status", status=state, updated_at=EPOCH + timedelta(seconds=2))
    clock.advance(3600)
    assert outbox.prune_finished(status_retention=3600) == 0  # changed exactly an hour ago
    clock.advance(1)
    assert outbox.prune_finished(status_retention=timedelta(hours=1)) == 1
    assert left() == {"newer"}


@pytest.mark.parametrize("state", ["queued", "sending"])
def test_an_active_status_post_stays_whatever_the_status_retention(outbox, clock, state):
    outbox.set_status("status", workspace_id="T1", container_id="C1", body={"text": "x"})
    if state == "sending":
        assert outbox.claim()
    clock.advance(WEEK * 100)
    assert outbox.prune_finished(status_retention=1) == 0
    assert left() == {"status"}


def test_the_status_retention_is_its_own(outbox, clock):
    PostFactory(post_id="status", kind="status", posted=True)
    PostFactory(post_id="message", posted=True)
    clock.advance(3600 + 1)
    # A short retention of one-off posts leaves status posts; a status one leaves one-off posts.
    assert outbox.prune_finished(60) == 1
    assert left() == {"status"}
    PostFactory(post_id="message", posted=True)
    assert outbox.prune_finished(WEEK, status_retention=3600) == 1
    assert left() == {"message"}


def test_a_status_set_again_after_it_was_pruned_is_a_new_post(outbox, clock):
    # Pruned, a status post is forgotten: the next set_status of its id queues a new post,
    # which the connector creates (a new message) rather than edits: no message_ref.
    outbox.set_status("status", workspace_id="T1", container_id="C1", body={"text": "v1"})
    outbox.set_status("status", workspace_id="T1", container_id="C1", body={"text": "v2"})
    [claim] = outbox.claim()
    assert outbox.posted(claim, "C1:1.000")
    clock.advance(3601)
    assert outbox.prunable(status_retention=3600)["status"] == 1
    assert outbox.prune_finished(status_retention=3600) == 1
    assert outbox.find("status") is None

    outbox.set_status("status", workspace_id="T1", container_id="C1", body={"text": "v3"})

    assert outbox.find("status") == PostState("queued", None)
    [claim] = outbox.claim()
    assert (claim.body, claim.rev, claim.message_ref, claim.attempts) == ({"text": "v3"}, 0, None, 1)


def test_a_status_kept_is_edited_in_place(outbox, clock):
    # Without a status retention (the default) the same sequence edits the message it sent.
    outbox.set_status("status", workspace_id="T1", container_id="C1", body={"text": "v1"})
    [claim] = outbox.claim()
    assert outbox.posted(claim, "C1:1.000")
    clock.advance(WEEK * 100)
    assert outbox.prune_finished() == 0
    outbox.set_status("status", workspace_id="T1", container_id="C1", body={"text": "v2"})
    [claim] = outbox.claim()
    assert (claim.body, claim.rev, claim.message_ref) == ({"text": "v2"}, 1, "C1:1.000")


def test_prunable_counts_status_posts_apart(outbox, clock):
    PostFactory(post_id="s1", kind="status", posted=True)
    PostFactory(post_id="s2", kind="status", failed=True)
    PostFactory(post_id="m1", posted=True)
    clock.advance(WEEK + 1)
    counts = outbox.prunable(status_retention=3600)
    assert {k: n for k, n in counts.items() if n} == {"posted": 1, "status": 2, "lanes": 1}
    assert outbox.prunable()["status"] == 0
    assert left() == {"s1", "s2", "m1"}


# -- lanes -------------------------------------------------------------------------------------------


def lanes() -> set[str]:
    return set(Lane.objects.values_list("container_id", flat=True))


def test_a_lane_left_without_posts_goes_after_them(outbox, clock):
    outbox.queue("p1", workspace_id="T1", container_id="C1", body={})
    outbox.queue("p2", workspace_id="T1", container_id="C2", body={})
    [c1, c2] = outbox.claim()
    assert outbox.posted(c1) and outbox.posted(c2)
    clock.advance(60)
    outbox.queue("p3", workspace_id="T1", container_id="C2", body={})  # C2 has a post again
    clock.advance(WEEK)
    assert outbox.prune(WEEK) == (2, 1)
    assert lanes() == {"C2"}
    assert left() == {"p3"}


def test_a_lane_with_any_post_stays(outbox, clock):
    LaneFactory(container_id="empty")
    for state in FINISHED:
        PostFactory(post_id=state, container_id=state, status=state, updated_at=clock.now)
    PostFactory(post_id="status", kind="status", container_id="status", posted=True)
    outbox.queue("delayed", workspace_id="T1", container_id="delayed", body={}, delay=WEEK * 2)
    clock.advance(WEEK + 1)
    assert outbox.prune(2 * WEEK) == (0, 1)  # the posts are younger than that
    assert lanes() == {*FINISHED, "status", "delayed"}


def test_a_lane_paced_since_the_cutoff_stays_and_one_paced_before_goes(outbox, clock):
    LaneFactory(container_id="recent", pace_tat=clock.now + timedelta(seconds=1))
    LaneFactory(container_id="old", pace_tat=clock.now)
    clock.advance(WEEK + 0.5)
    assert outbox.prunable(WEEK)["lanes"] == 1
    assert outbox.prune(WEEK).lanes == 1
    assert lanes() == {"recent"}


def test_a_lane_with_a_head_or_a_lease_stays(outbox, clock):
    # Drifted lanes (a manual UPDATE, a restore) that name no post of theirs: repair's to fix.
    LaneFactory(container_id="leased", lease_token="t" * 32, due_at=clock.now)
    clock.advance(WEEK + 1)
    assert outbox.prune(WEEK).lanes == 0
    assert lanes() == {"leased"}


def test_lanes_are_walked_in_batches(outbox, clock):
    for n in range(5):
        LaneFactory(container_id=f"C{n}")
    theirs = LaneFactory(container_id="theirs", source="other").pk
    kept = PostFactory(post_id="keep", container_id="C2", updated_at=clock.now).lane_id
    clock.advance(1)
    ids = sorted(Lane.objects.filter(source="memory").values_list("pk", flat=True))
    assert outbox.prune_lanes(0, limit=2) == (ids[1], 2)
    assert outbox.prune_lanes(0, after=ids[1], limit=2) == (ids[3], 1)  # C2 has a post
    assert outbox.prune_lanes(0, after=ids[3], limit=2) == (None, 1)
    assert outbox.prune_lanes(0, after=ids[4]) == (None, 0)
    assert set(Lane.objects.values_list("pk", flat=True)) == {kept, theirs}


def test_the_delete_of_idle_lanes_reaches_them_by_id_alone(outbox, clock):
    # Given another lane column (head_id IS NULL), MariaDB walked that column's index and
    # locked a producer's new lane there, which deadlocked with the producer
    # (tests/test_prune_concurrency.py); only the posts are read again under the locks.
    for n in range(3):
        LaneFactory(container_id=f"C{n}")
    clock.advance(1)
    with CaptureQueriesContext(connection) as queries:
        assert outbox.prune_lanes(0) == (None, 3)
    deletes = [q["sql"] for q in queries if q["sql"].startswith("DELETE")]
    # One lane a statement on MySQL (a scan there waited for lanes it does not delete).
    assert len(deletes) == (3 if connection.vendor == "mysql" else 1)
    lane = connection.ops.quote_name(Lane._meta.db_table)
    for delete in deletes:
        where = delete.split(" WHERE ", 1)[1]
        named = {
            column
            for column in ("head_id", "lease_token", "pace_tat", "due_at")
            if f"{lane}.{connection.ops.quote_name(column)}" in where
        }
        assert named == set()
        assert f"{lane}.{connection.ops.quote_name('id')} IN" in where
    assert lanes() == set()


def test_a_lane_pruned_and_made_again_starts_with_no_pace(outbox, clock):
    with settings_with(
        CONNECTORS={
            "memory": {**settings.CONNECTOR_OUTBOX["CONNECTORS"]["memory"], "PACE": {"container": (1, 60)}}
        }
    ):
        outbox.queue("p1", workspace_id="T1", container_id="C1", body={})
        [claim] = outbox.claim()
        assert outbox.posted(claim)
        old = Lane.objects.get()
        assert old.pace_tat == clock.now + timedelta(seconds=60)
        clock.advance(61 + 3600)
        assert outbox.prune(3600) == (1, 1)

        outbox.queue("p2", workspace_id="T1", container_id="C1", body={})
        new = Lane.objects.get()
        assert (new.pk > old.pk, new.pace_tat, new.head.post_id) == (True, None, "p2")
        assert [c.post_id for c in outbox.claim()] == ["p2"]
