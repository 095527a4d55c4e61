"""Outbox.claim: heads only, in next_at order, one in flight per container, stale take-backs."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connections
from django.test import override_settings

from django_connector_outbox import ClaimedPost, Outbox
from django_connector_outbox.models import Post

pytestmark = pytest.mark.django_db

LEASE = 120  # the default


@pytest.fixture
def outbox(clock):
    return Outbox("memory", clock=clock)


def queue(outbox, post_id, container_id="C1", **fields):
    fields.setdefault("body", {"text": post_id})
    return outbox.queue(post_id, workspace_id="T1", container_id=container_id, **fields)


def claimed_ids(outbox, limit=None):
    return [c.post_id for c in outbox.claim(limit)]


def settings_with(**values):
    from django.conf import settings

    return override_settings(CONNECTOR_OUTBOX={**settings.CONNECTOR_OUTBOX, **values})


# -- what a claim is --------------------------------------------------------------------------


def test_a_claim_is_a_frozen_claimed_post_with_the_posts_fields(outbox, clock):
    queue(outbox, "p1", thread_id="t", turn_key="k")
    [claim] = outbox.claim()
    assert isinstance(claim, ClaimedPost)
    assert (claim.source, claim.post_id, claim.workspace_id, claim.container_id, claim.thread_id) == (
        "memory", "p1", "T1", "C1", "t",
    )  # fmt: skip
    assert (claim.kind, claim.body, claim.rev, claim.attempts, claim.message_ref, claim.turn_key) == (
        "message", {"text": "p1"}, 0, 1, None, "k",
    )  # fmt: skip
    assert claim.stale is False
    assert claim.sent_at == clock.now
    assert claim.lease_until == clock.now + timedelta(seconds=LEASE)
    with pytest.raises(AttributeError):
        claim.attempts = 2  # type: ignore[misc]


def test_a_claimed_post_is_sending_and_not_claimed_again_under_its_lease(outbox, clock):
    queue(outbox, "p1")
    outbox.claim()
    assert outbox.find("p1").state == "sending"
    assert Post.objects.with_claim().get(post_id="p1").current_attempts == 1
    clock.advance(LEASE - 1)
    assert outbox.claim() == []


def test_nothing_to_claim_is_an_empty_list(outbox):
    assert outbox.claim() == []


@override_settings(
    CONNECTOR_OUTBOX={
        "CONNECTORS": {"memory": {"BACKEND": "django_connector_outbox.connectors.memory.MemoryConnector"}},
        "LEASE": timedelta(minutes=5),
    }
)
def test_lease_may_be_set_as_a_timedelta(outbox, clock):
    queue(outbox, "p1")
    assert outbox.claim()[0].lease_until == clock.now + timedelta(minutes=5)


@pytest.mark.parametrize("lease", [30, 30.5])
def test_lease_in_seconds(outbox, clock, lease):
    with settings_with(LEASE=lease):
        queue(outbox, "p1")
        assert outbox.claim()[0].lease_until == clock.now + timedelta(seconds=lease)


# -- heads only, in order ---------------------------------------------------------------------


def test_only_the_head_of_a_container_is_claimed(outbox):
    for post_id in ("p1", "p2", "p3"):
        queue(outbox, post_id)
    queue(outbox, "q1", "C2")
    assert sorted(claimed_ids(outbox, 10)) == ["p1", "q1"]


def test_a_container_sends_in_queued_at_order(outbox, clock):
    queue(outbox, "z-first")
    clock.advance(1)
    queue(outbox, "a-second")
    order = []
    while claims := outbox.claim():
        order.append(claims[0].post_id)
        outbox.posted(claims[0])
    assert order == ["z-first", "a-second"]


def test_queue_order_not_the_post_id_breaks_a_tie_of_queued_at(outbox):
    queue(outbox, "b")  # the clock does not move between them
    queue(outbox, "c")
    queue(outbox, "a")
    order = []
    while claims := outbox.claim():
        order.append(claims[0].post_id)
        outbox.posted(claims[0])
    assert order == ["b", "c", "a"]


def test_containers_are_told_apart_by_workspace_too(outbox):
    outbox.queue("p1", workspace_id="T1", container_id="C1", body={})
    outbox.queue("p2", workspace_id="T2", container_id="C1", body={})
    assert sorted(claimed_ids(outbox)) == ["p1", "p2"]


def test_threads_of_a_container_share_its_queue(outbox):
    queue(outbox, "p1", thread_id="t1")
    queue(outbox, "p2", thread_id="t2")
    assert claimed_ids(outbox) == ["p1"]


def test_oldest_next_at_is_claimed_first(outbox, clock):
    queue(outbox, "c1", "C1", delay=30)
    queue(outbox, "c2", "C2", delay=10)
    clock.advance(20)
    queue(outbox, "c3", "C3")  # due at +20
    clock.advance(20)
    assert claimed_ids(outbox, 1) == ["c2"]
    assert claimed_ids(outbox, 1) == ["c3"]
    assert claimed_ids(outbox, 1) == ["c1"]


def test_a_batch_comes_back_oldest_next_at_first(outbox, clock):
    queue(outbox, "c1", "C1", delay=30)
    queue(outbox, "c2", "C2", delay=10)
    queue(outbox, "c3", "C3", delay=20)
    clock.advance(30)
    assert claimed_ids(outbox) == ["c2", "c3", "c1"]


def test_containers_due_at_the_same_instant_take_turns_in_queue_order(outbox):
    # One queue_many: every post has the same queue time, so every lane is due at the same
    # instant; the heads queued first go first, and the channels of the burst take turns.
    outbox.queue_many(
        [
            dict(post_id=f"{c}{n}", workspace_id="T1", container_id=c, body={"text": f"{c}{n}"})
            for n in range(3)
            for c in ("C1", "C2", "C3")
        ]
    )
    order = []
    for _ in range(9):
        [claim] = outbox.claim(1)
        order.append(claim.post_id)
        outbox.posted(claim)
    assert order == ["C10", "C20", "C30", "C11", "C21", "C31", "C12", "C22", "C32"]


def test_a_stale_post_takes_its_turn_by_when_its_lease_ended(outbox, clock):
    queue(outbox, "early", "C1")
    outbox.claim()  # lease ends at +LEASE
    queue(outbox, "late", "C2", delay=LEASE + 10)
    queue(outbox, "soon", "C3", delay=LEASE - 10)
    clock.advance(LEASE + 20)
    claims = outbox.claim()
    assert [(c.post_id, c.stale) for c in claims] == [("soon", False), ("early", True), ("late", False)]


def test_a_post_that_is_not_due_is_not_claimed(outbox, clock):
    queue(outbox, "p1", delay=5)
    assert outbox.claim() == []


# -- limit ------------------------------------------------------------------------------------


def test_claim_takes_at_most_limit(outbox):
    for i in range(5):
        queue(outbox, f"p{i}", f"C{i}")
    assert len(outbox.claim(2)) == 2
    assert len(outbox.claim(2)) == 2
    assert len(outbox.claim(2)) == 1
    assert outbox.claim(2) == []


def test_claim_of_0_claims_nothing(outbox):
    queue(outbox, "p1")
    assert outbox.claim(0) == []
    assert outbox.find("p1").state == "queued"


def test_claim_takes_claim_batch_by_default(outbox):
    for i in range(105):
        queue(outbox, f"p{i}", f"C{i}")
    assert len(outbox.claim()) == 100
    assert len(outbox.claim()) == 5


def test_claim_batch_setting_sets_the_default_limit(outbox):
    for i in range(5):
        queue(outbox, f"p{i}", f"C{i}")
    with settings_with(CLAIM_BATCH=3):
        assert len(outbox.claim()) == 3


def test_worker_is_recorded(outbox):
    queue(outbox, "p1")
    outbox.claim(worker="host-1:42")
    assert Post.objects.with_claim().get(post_id="p1").worker == "host-1:42"


# -- one in flight per container --------------------------------------------------------------


def test_a_container_never_has_two_posts_sending(outbox, clock):
    queue(outbox, "p1")
    queue(outbox, "p2")
    outbox.claim()
    clock.advance(1)
    queue(outbox, "p3")
    assert outbox.claim() == []
    clock.advance(LEASE)  # the lease ended: the head is taken back, not the next post
    assert [(c.post_id, c.stale) for c in outbox.claim()] == [("p1", True)]
    assert Post.objects.in_state("sending").count() == 1


def test_the_next_post_goes_once_the_head_is_finished(outbox):
    queue(outbox, "p1")
    queue(outbox, "p2")
    [claim] = outbox.claim()
    outbox.posted(claim)
    assert claimed_ids(outbox) == ["p2"]


# -- stale take-backs -------------------------------------------------------------------------


def test_a_sending_post_whose_lease_ended_is_claimed_back_stale(outbox, clock):
    queue(outbox, "p1")
    first = outbox.claim()[0]
    clock.advance(LEASE)
    [again] = outbox.claim()
    assert again.post_id == "p1"
    assert again.stale is True
    assert again.attempts == 2
    assert again.sent_at == first.sent_at
    assert again.lease_until == clock.now + timedelta(seconds=LEASE)


def test_the_lease_ends_at_lease_until_exactly(outbox, clock):
    queue(outbox, "p1")
    outbox.claim()
    clock.advance(LEASE - 0.001)
    assert outbox.claim() == []
    clock.advance(0.001)
    assert claimed_ids(outbox) == ["p1"]


def test_sent_at_of_a_stale_claim_is_the_first_claims_however_many_take_backs(outbox, clock):
    queue(outbox, "p1")
    first = outbox.claim()[0]
    for attempt in range(2, 6):
        clock.advance(LEASE + 7)
        [again] = outbox.claim()
        assert (again.stale, again.attempts, again.sent_at) == (True, attempt, first.sent_at)


def test_a_claim_after_a_retry_is_fresh_with_a_new_sent_at(outbox, clock):
    queue(outbox, "p1")
    [claim] = outbox.claim()
    clock.advance(LEASE)
    [stale] = outbox.claim()
    outbox.retry(stale, after=0)
    clock.advance(3)
    [fresh] = outbox.claim()
    assert (fresh.stale, fresh.sent_at, fresh.attempts) == (False, clock.now, 3)


def test_a_stale_claim_keeps_the_body_ref_and_rev(outbox, clock):
    outbox.set_status("s1", workspace_id="T1", container_id="C1", body={"text": "v1"})
    outbox.posted(outbox.claim()[0], "C1:9")
    outbox.set_status("s1", workspace_id="T1", container_id="C1", body={"text": "v2"})
    outbox.claim()
    clock.advance(LEASE)
    [stale] = outbox.claim()
    assert (stale.stale, stale.body, stale.rev, stale.message_ref, stale.kind) == (
        True, {"text": "v2"}, 1, "C1:9", "status",
    )  # fmt: skip


def test_uncertain_is_never_claimed(outbox, clock):
    queue(outbox, "p1")
    outbox.settle(outbox.claim()[0], "uncertain")
    for _ in range(3):
        clock.advance(LEASE * 10)
        assert outbox.claim() == []


# -- concurrent claimers ----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_concurrent_claimers_never_claim_a_post_twice_nor_two_of_a_container(clock):
    outbox = Outbox("memory", clock=clock)
    for c in range(12):
        outbox.queue_many(
            [dict(post_id=f"c{c}-p{i}", workspace_id="T1", container_id=f"C{c}", body={}) for i in range(3)]
        )
    claims: list[ClaimedPost] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    start = threading.Barrier(6)

    def claimer():
        try:
            mine = Outbox("memory", clock=clock)
            start.wait()
            for _ in range(4):
                got = mine.claim(3)
                with lock:
                    claims.extend(got)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claimer) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert errors == []
    ids = [c.post_id for c in claims]
    assert len(ids) == len(set(ids))
    containers = [c.container_id for c in claims]
    assert len(containers) == len(set(containers))  # one head per container, once
    assert sorted(containers) == sorted(f"C{c}" for c in range(12))
    assert all(c.post_id.endswith("-p0") for c in claims)
