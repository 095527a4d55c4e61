"""set_status: an upsert that keeps a status post's place, or sends it to the back once finished."""

from __future__ import annotations

import pytest
from django.db import transaction

from django_connector_outbox import InvalidPost, Outbox
from django_connector_outbox.models import Post

pytestmark = pytest.mark.django_db

LEASE = 120


@pytest.fixture
def outbox(clock):
    return Outbox("memory", clock=clock)


def set_status(outbox, post_id, text, container_id="C1", **fields):
    body = {"text": text}
    return outbox.set_status(post_id, workspace_id="T1", container_id=container_id, body=body, **fields)


def queue(outbox, post_id, container_id="C1"):
    return outbox.queue(post_id, workspace_id="T1", container_id=container_id, body={"text": post_id})


def claim_one(outbox):
    [claim] = outbox.claim()
    return claim


def row(post_id):
    """The post with its claim (`current_state`, `current_attempts`, the lease: see `with_claim`)."""
    return Post.objects.with_claim().get(post_id=post_id)


def snapshot(post_id):
    return Post.objects.with_claim().values().get(post_id=post_id)


def test_a_new_status_is_queued_like_queue(outbox, clock):
    assert set_status(outbox, "s1", "v1", thread_id="t1") is None
    r = row("s1")
    assert (r.current_state, r.kind, r.rev, r.current_attempts, r.body, r.thread_id) == (
        "queued", "status", 0, 0, {"text": "v1"}, "t1",
    )  # fmt: skip
    assert r.queued_at == r.next_at == clock.now
    claim = claim_one(outbox)
    assert (claim.post_id, claim.kind, claim.rev, claim.message_ref) == ("s1", "status", 0, None)


def test_a_new_status_waits_behind_the_posts_of_its_container(outbox, clock):
    queue(outbox, "p1")
    clock.advance(1)
    set_status(outbox, "s1", "v1")
    assert claim_one(outbox).post_id == "p1"


@pytest.mark.parametrize("state", ["queued", "sending", "posted", "failed"])
def test_the_same_body_changes_nothing(outbox, clock, state):
    set_status(outbox, "s1", "v1")
    if state != "queued":
        claim = claim_one(outbox)
        if state == "posted":
            outbox.posted(claim, "C1:1")
        elif state == "failed":
            outbox.settle(claim, "failed")
    before = snapshot("s1")
    clock.advance(5)
    set_status(outbox, "s1", "v1")
    assert snapshot("s1") == before


def test_a_new_body_for_a_queued_status_keeps_its_place_and_restarts_attempts(outbox, clock):
    set_status(outbox, "s1", "v1")
    clock.advance(1)
    queue(outbox, "p2")
    outbox.retry(claim_one(outbox), after=0)
    assert row("s1").current_attempts == 1
    queued_at = row("s1").queued_at
    clock.advance(1)

    set_status(outbox, "s1", "v2")

    r = row("s1")
    assert (r.current_state, r.rev, r.current_attempts, r.body, r.queued_at) == (
        "queued", 1, 0, {"text": "v2"}, queued_at,
    )  # fmt: skip
    claim = claim_one(outbox)  # still ahead of p2
    assert (claim.post_id, claim.body, claim.rev, claim.attempts) == ("s1", {"text": "v2"}, 1, 1)


def test_a_new_body_for_a_queued_status_only_sends_the_latest(outbox):
    for n in range(5):
        set_status(outbox, "s1", f"v{n}")
    claim = claim_one(outbox)
    assert (claim.body, claim.rev) == ({"text": "v4"}, 4)


def test_a_new_body_for_a_sending_status_keeps_state_lease_and_attempts(outbox, clock):
    set_status(outbox, "s1", "v1")
    outbox.retry(claim_one(outbox), after=0)
    claim = claim_one(outbox)
    assert claim.attempts == 2
    before = snapshot("s1")
    clock.advance(1)

    set_status(outbox, "s1", "v2")

    after = snapshot("s1")
    assert (after["rev"], after["body"]) == (1, {"text": "v2"})
    kept = (
        "current_state", "current_attempts", "lease_until", "lease_token", "queued_at", "next_at", "sent_at",
        "worker",
    )  # fmt: skip
    for field in kept:
        assert after[field] == before[field], field
    assert outbox.claim() == []  # still in flight under its lease
    assert outbox.posted(claim, "C1:1") is True  # the claim is still current...
    assert row("s1").current_state == "queued"  # ...and the new body goes out in one more edit
    edit = claim_one(outbox)
    assert (edit.body, edit.rev, edit.message_ref) == ({"text": "v2"}, 1, "C1:1")


@pytest.mark.parametrize("finish", ["posted", "failed", "cancelled"])
def test_a_new_body_for_a_finished_status_rejoins_the_back_of_its_queue(outbox, clock, finish):
    set_status(outbox, "s1", "v1")
    if finish == "cancelled":
        assert outbox.cancel_queued("s1")
    else:
        claim = claim_one(outbox)
        outbox.retry(claim, after=0)
        claim = claim_one(outbox)
        if finish == "posted":
            outbox.posted(claim, "C1:1")
        else:
            outbox.settle(claim, "failed", reason="boom")
    clock.advance(1)
    queue(outbox, "p2")
    clock.advance(1)

    set_status(outbox, "s1", "v2")

    r = row("s1")
    assert (r.current_state, r.rev, r.current_attempts, r.body, r.queued_at) == (
        "queued", 1, 0, {"text": "v2"}, clock.now,
    )  # fmt: skip
    first = claim_one(outbox)
    assert first.post_id == "p2"  # queued before s1 came back
    outbox.posted(first)
    edit = claim_one(outbox)
    assert (edit.post_id, edit.body, edit.rev, edit.attempts, edit.stale) == (
        "s1", {"text": "v2"}, 1, 1, False,
    )  # fmt: skip
    assert edit.message_ref == ("C1:1" if finish == "posted" else None)


def test_set_status_on_an_uncertain_status_changes_nothing(outbox, clock):
    set_status(outbox, "s1", "v1")
    outbox.settle(claim_one(outbox), "uncertain")
    before = snapshot("s1")
    clock.advance(1)
    set_status(outbox, "s1", "v2")
    assert snapshot("s1") == before
    assert outbox.claim() == []


def test_queue_refuses_a_status(outbox):
    with pytest.raises(InvalidPost, match="status"):
        outbox.queue("s1", workspace_id="T1", container_id="C1", kind="status", body={})
    assert not Post.objects.exists()


def test_set_status_validates_like_queue(outbox):
    with pytest.raises(InvalidPost, match=r"'s1'.*body"):
        outbox.set_status("s1", workspace_id="T1", container_id="C1", body=["not", "a", "dict"])
    with pytest.raises(InvalidPost, match="container_id"):
        outbox.set_status("s1", workspace_id="T1", container_id="", body={})
    assert not Post.objects.exists()


def test_a_bad_body_leaves_an_existing_status_alone(outbox):
    set_status(outbox, "s1", "v1")
    before = snapshot("s1")
    with pytest.raises(InvalidPost):
        outbox.set_status("s1", workspace_id="T1", container_id="C1", body={"x": float("nan")})
    assert snapshot("s1") == before


def test_set_status_and_queue_share_post_ids(outbox):
    queue(outbox, "p1")
    set_status(outbox, "s1", "v1")
    assert queue(outbox, "s1") is False  # idempotent: the status exists
    assert row("s1").kind == "status"


# -- a refused set_status leaves the caller's transaction usable (issue 9, hole 12) -----------


@pytest.mark.parametrize(
    ("fields", "refusal"),
    [
        ({"post_id": "m1"}, "not a status"),
        ({"container_id": "C2"}, "container_id is 'C1'; a status cannot move"),
        ({"workspace_id": "T2"}, "workspace_id is 'T1'; a status cannot move"),
        ({"thread_id": "th"}, "thread_id is ''; a status cannot move"),
    ],
    ids=["a-message", "other-container", "other-workspace", "other-thread"],
)
def test_a_refused_set_status_leaves_the_callers_transaction_usable(outbox, fields, refusal):
    queue(outbox, "m1")
    set_status(outbox, "s1", "v1")
    with transaction.atomic():
        with pytest.raises(InvalidPost, match=refusal):
            outbox.set_status(
                **{
                    "post_id": "s1",
                    "workspace_id": "T1",
                    "container_id": "C1",
                    "body": {"text": "v2"},
                    **fields,
                }
            )
        queue(outbox, "after")  # would raise TransactionManagementError if the block were broken
    assert row("after").current_state == "queued"
    assert row("s1").body == {"text": "v1"}
    assert row("m1").kind == "message"
