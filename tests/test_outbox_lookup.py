"""cancel_queued, find, has_reply_for_turn, and one source never seeing another's posts."""

from __future__ import annotations

import pytest

from django_connector_outbox import Outbox, PostState
from django_connector_outbox.models import Post

pytestmark = pytest.mark.django_db

LEASE = 120


@pytest.fixture
def outbox(clock):
    return Outbox("memory", clock=clock)


@pytest.fixture
def other(clock):
    return Outbox("other", clock=clock)


def queue(outbox, post_id, container_id="C1", **fields):
    fields.setdefault("body", {"text": post_id})
    return outbox.queue(post_id, workspace_id="T1", container_id=container_id, **fields)


def claim_one(outbox):
    [claim] = outbox.claim()
    return claim


def snapshot(post_id, source="memory"):
    """The post's row with its claim (`current_state`, the lease: see `with_claim`)."""
    return Post.objects.with_claim().values().get(post_id=post_id, source=source)


# -- cancel_queued ----------------------------------------------------------------------------


def test_cancel_queued_cancels_a_queued_post_and_drops_its_body(outbox):
    queue(outbox, "p1", delay=60)
    assert outbox.cancel_queued("p1") is True
    r = Post.objects.get(post_id="p1")
    assert (r.state, r.body) == ("cancelled", None)
    assert outbox.find("p1") == PostState("cancelled", None)


def test_a_cancelled_post_is_never_claimed(outbox, clock):
    queue(outbox, "p1")
    outbox.cancel_queued("p1")
    clock.advance(3600)
    assert outbox.claim() == []


def test_a_cancelled_head_lets_the_next_post_go(outbox):
    queue(outbox, "p1")
    queue(outbox, "p2")
    outbox.cancel_queued("p1")
    assert claim_one(outbox).post_id == "p2"


def test_a_post_waiting_for_a_retry_can_be_cancelled_and_its_container_goes_on(outbox):
    queue(outbox, "p1")
    queue(outbox, "p2")
    outbox.retry(claim_one(outbox), after=3600)
    assert outbox.cancel_queued("p1") is True
    assert claim_one(outbox).post_id == "p2"


def test_cancelling_a_post_behind_the_head_leaves_the_head_alone(outbox):
    queue(outbox, "p1")
    queue(outbox, "p2")
    queue(outbox, "p3")
    assert outbox.cancel_queued("p2") is True
    order = []
    while claims := outbox.claim():
        order.append(claims[0].post_id)
        outbox.posted(claims[0])
    assert order == ["p1", "p3"]


@pytest.mark.parametrize("state", ["sending", "posted", "failed", "uncertain", "cancelled"])
def test_cancel_queued_leaves_any_other_state_alone(outbox, state):
    queue(outbox, "p1")
    if state == "cancelled":
        outbox.cancel_queued("p1")
    else:
        claim = claim_one(outbox)
        if state == "posted":
            outbox.posted(claim, "C1:1")
        elif state in ("failed", "uncertain"):
            outbox.settle(claim, state)
    before = snapshot("p1")
    assert outbox.cancel_queued("p1") is False
    assert snapshot("p1") == before


def test_cancelling_a_sending_post_leaves_its_claim_current(outbox):
    queue(outbox, "p1")
    claim = claim_one(outbox)
    assert outbox.cancel_queued("p1") is False
    assert outbox.posted(claim) is True


def test_cancel_queued_of_an_unknown_post_is_false(outbox):
    assert outbox.cancel_queued("nope") is False


# -- find -------------------------------------------------------------------------------------


def test_find_of_an_unknown_post_is_none(outbox):
    assert outbox.find("nope") is None


def test_find_follows_a_post_through_its_states(outbox):
    queue(outbox, "p1")
    assert outbox.find("p1") == PostState("queued", None)
    claim = claim_one(outbox)
    assert outbox.find("p1") == PostState("sending", None)
    outbox.posted(claim, "C1:77")
    found = outbox.find("p1")
    assert found == PostState("posted", "C1:77")
    assert (found.state, found.message_ref) == ("posted", "C1:77")


# -- has_reply_for_turn -----------------------------------------------------------------------


def test_has_reply_for_turn_looks_for_the_turn_key_and_the_reply_prefix(outbox):
    assert outbox.has_reply_for_turn("turn-1") is False
    queue(outbox, "ack:turn-1", turn_key="turn-1")
    assert outbox.has_reply_for_turn("turn-1") is False  # not a reply
    queue(outbox, "reply:turn-2", turn_key="turn-2")
    assert outbox.has_reply_for_turn("turn-1") is False  # another turn
    queue(outbox, "reply:turn-1:a", turn_key="turn-1")
    assert outbox.has_reply_for_turn("turn-1") is True


def test_has_reply_for_turn_with_another_prefix(outbox):
    queue(outbox, "ack:turn-1", turn_key="turn-1")
    assert outbox.has_reply_for_turn("turn-1", prefix="ack:") is True
    assert outbox.has_reply_for_turn("turn-1", prefix="ack:x") is False
    assert outbox.has_reply_for_turn("turn-1", prefix="") is True


def test_the_prefix_is_a_literal_prefix(outbox):
    queue(outbox, "reply_x", turn_key="t")
    queue(outbox, "re%ly", turn_key="t")
    assert outbox.has_reply_for_turn("t", prefix="reply:") is False
    assert outbox.has_reply_for_turn("t", prefix="re%") is True
    assert outbox.has_reply_for_turn("t", prefix="reply_") is True
    assert outbox.has_reply_for_turn("t", prefix="rep_y") is False


@pytest.mark.parametrize("state", ["sending", "posted", "failed", "cancelled"])
def test_has_reply_for_turn_counts_a_reply_in_any_state(outbox, state):
    queue(outbox, "reply:1", turn_key="t")
    if state == "cancelled":
        outbox.cancel_queued("reply:1")
    else:
        claim = claim_one(outbox)
        if state == "posted":
            outbox.posted(claim)
        elif state == "failed":
            outbox.settle(claim, "failed")
    assert outbox.has_reply_for_turn("t") is True


def test_a_post_without_a_turn_key_is_no_reply(outbox):
    queue(outbox, "reply:1")
    assert outbox.has_reply_for_turn("") is False


# -- one source sees only its own posts -------------------------------------------------------


def test_has_reply_for_turn_sees_only_its_source(outbox, other):
    queue(other, "reply:1", turn_key="t")
    assert outbox.has_reply_for_turn("t") is False
    assert other.has_reply_for_turn("t") is True


def test_find_and_cancel_see_only_their_source(outbox, other):
    queue(other, "p1")
    assert outbox.find("p1") is None
    assert outbox.cancel_queued("p1") is False
    assert other.find("p1") == PostState("queued", None)


def test_claim_sees_only_its_source(outbox, other):
    queue(other, "p1")
    assert outbox.claim() == []
    [claim] = other.claim()
    assert claim.source == "other"


def test_the_same_container_in_two_sources_is_two_queues(outbox, other):
    queue(outbox, "m1")
    queue(other, "o1")
    assert claim_one(outbox).post_id == "m1"
    assert claim_one(other).post_id == "o1"  # not held up by memory's post in flight


def test_set_status_sees_only_its_source(outbox, other):
    other.set_status("s1", workspace_id="T1", container_id="C1", body={"v": 1})
    outbox.set_status("s1", workspace_id="T1", container_id="C1", body={"v": 2})
    assert snapshot("s1", "other")["body"] == {"v": 1}
    assert snapshot("s1", "memory")["body"] == {"v": 2}
    assert snapshot("s1", "other")["rev"] == snapshot("s1", "memory")["rev"] == 0


def test_finishes_see_only_their_source(outbox, other):
    queue(outbox, "p1")
    queue(other, "p1")
    mine, theirs = claim_one(outbox), claim_one(other)
    for finish in (
        lambda c: other.posted(c),
        lambda c: other.found(c, "x"),
        lambda c: other.retry(c),
        lambda c: other.hold(c, 0),
        lambda c: other.settle(c, "failed"),
    ):
        assert finish(mine) is False
    assert snapshot("p1", "memory")["current_state"] == "sending"
    assert outbox.posted(mine) is True
    assert other.posted(theirs) is True


def test_prune_sees_only_its_source(outbox, other, clock):
    queue(outbox, "p1")
    queue(other, "p1")
    outbox.posted(claim_one(outbox))
    other.posted(claim_one(other))
    clock.advance(8 * 24 * 3600)
    assert outbox.prune_finished() == 1
    assert other.find("p1") == PostState("posted", None)
