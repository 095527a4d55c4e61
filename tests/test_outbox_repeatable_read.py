"""Fencing and heads under MySQL/MariaDB's REPEATABLE READ (`OPTIONS["isolation_level"]`).

Under REPEATABLE READ a plain SELECT returns the transaction's snapshot, taken at its first
read, while UPDATEs and locking reads see the latest committed rows. A transaction whose
snapshot is older than a competing commit (it read something before waiting for a lane lock
that the competitor held, or its caller's transaction began earlier) must still decide on the
latest rows. Each test takes the snapshot first ("ours", on the `repeatable_read` alias, the
same test database), lets another connection commit ("theirs", on `default`), then acts: the
interleaving of a wait for a lane lock, without threads.
"""

from __future__ import annotations

from contextlib import contextmanager

import pytest
from django.conf import settings
from django.db import connections, transaction

from django_connector_outbox import Outbox
from django_connector_outbox.models import Lane, Post

RR = "repeatable_read"

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=["default", RR]),
    pytest.mark.skipif(
        RR not in settings.DATABASES,
        reason="REPEATABLE READ with snapshot reads is MySQL/MariaDB's; run with DATABASE_URL pointing at "
        "MySQL or MariaDB",
    ),
]

LEASE = 120


@pytest.fixture
def ours(clock):
    return Outbox("memory", using=RR, clock=clock)


@pytest.fixture
def theirs(clock):
    return Outbox("memory", clock=clock)


def queue(outbox, post_id, **fields):
    return outbox.queue(post_id, workspace_id="T1", container_id="C1", body={"n": post_id}, **fields)


@contextmanager
def old_snapshot():
    """A transaction on RR whose snapshot is taken now, before what the test lets commit next."""
    with transaction.atomic(using=RR):
        Post.objects.using(RR).exists()  # the first read fixes the snapshot
        yield


FINISHES = {
    "posted": lambda outbox, claim: outbox.posted(claim, "late-ref"),
    "found": lambda outbox, claim: outbox.found(claim, "late-ref"),
    "retry": lambda outbox, claim: outbox.retry(claim, 0, "late"),
    "hold": lambda outbox, claim: outbox.hold(claim, 0, "late"),
    "settle": lambda outbox, claim: outbox.settle(claim, "failed", "late"),
}


@pytest.mark.parametrize("finish", FINISHES.values(), ids=FINISHES.keys())
@pytest.mark.parametrize("kind", ["message", "status"])
def test_a_late_finish_of_a_claim_taken_back_changes_nothing(ours, theirs, clock, finish, kind):
    if kind == "status":
        ours.set_status("p1", workspace_id="T1", container_id="C1", body={"n": 1})
    else:
        queue(ours, "p1")
    [late] = ours.claim()
    clock.advance(LEASE)
    with old_snapshot():
        [retaken] = theirs.claim()
        assert finish(ours, late) is False

    post = Post.objects.with_claim().get(post_id="p1")
    assert (post.current_state, post.lease_token, post.message_ref, post.last_error) == (
        "sending", retaken.lease_token, None, "",
    )  # fmt: skip


def test_a_finish_under_an_old_snapshot_sees_a_status_changed_meanwhile(ours, theirs):
    ours.set_status("s1", workspace_id="T1", container_id="C1", body={"n": 1})
    [claim] = ours.claim()
    with old_snapshot():
        theirs.set_status("s1", workspace_id="T1", container_id="C1", body={"n": 2})
        assert ours.posted(claim, "ref") is True

    post = Post.objects.get(post_id="s1")
    assert (post.state, post.rev, post.body) == ("queued", 1, {"n": 2})  # edited once more


def test_a_claim_under_an_old_snapshot_takes_a_post_back_stale(ours, theirs, clock):
    queue(ours, "p1")
    with old_snapshot():
        [first] = theirs.claim()
        clock.advance(LEASE)
        [again] = ours.claim()

    assert again.stale is True  # a fresh claim would be sent without the lookup
    assert again.sent_at == first.sent_at


def test_a_post_queued_under_an_old_snapshot_waits_behind_a_head_claimed_meanwhile(ours, theirs):
    queue(ours, "head")
    with old_snapshot():
        [claim] = theirs.claim()
        queue(ours, "next")

    lane = Lane.objects.get(container_id="C1")
    assert lane.head_id == Post.objects.get(post_id="head").pk
    assert theirs.claim() == []  # never two posts of one container sending
    assert theirs.posted(claim)
    assert [c.post_id for c in theirs.claim()] == ["next"]


@contextmanager
def at_most_inserts(limit):
    """Fail, rather than hang, when the RR connection keeps trying to insert."""
    inserts = 0

    def count(execute, sql, params, many, context):
        nonlocal inserts
        inserts += sql.startswith("INSERT")
        if inserts > limit:
            raise AssertionError(f"more than {limit} INSERTs: the insert is retried for ever")
        return execute(sql, params, many, context)

    with connections[RR].execute_wrapper(count):
        yield


def test_queueing_an_id_committed_after_the_snapshot_queues_nothing(ours, theirs):
    queue(ours, "first")
    with old_snapshot(), at_most_inserts(3):
        assert queue(theirs, "p1") is True
        assert queue(ours, "p1") is False  # not a loop on IntegrityError: the snapshot never shows "p1"
    assert Post.objects.get(post_id="p1").body == {"n": "p1"}


def test_set_status_under_an_old_snapshot_edits_a_status_posted_meanwhile(ours, theirs):
    ours.set_status("s1", workspace_id="T1", container_id="C1", body={"n": 1})
    with old_snapshot():
        [claim] = theirs.claim()
        assert theirs.posted(claim, "ref")
        ours.set_status("s1", workspace_id="T1", container_id="C1", body={"n": 2})

    post = Post.objects.get(post_id="s1")
    assert (post.state, post.rev, post.body) == ("queued", 1, {"n": 2})  # the new body is sent
    assert [c.body for c in theirs.claim()] == [{"n": 2}]


def test_set_status_of_a_status_created_after_the_snapshot_updates_it(ours, theirs):
    queue(ours, "first")
    with old_snapshot(), at_most_inserts(3):
        theirs.set_status("s1", workspace_id="T1", container_id="C1", body={"n": 1})
        ours.set_status("s1", workspace_id="T1", container_id="C1", body={"n": 2})
    post = Post.objects.get(post_id="s1")
    assert (post.rev, post.body) == (1, {"n": 2})


def test_an_operators_retry_under_an_old_snapshot_takes_a_post_failed_meanwhile(ours, theirs):
    # requeue decided from a plain read (the snapshot said queued) before it locked the lane.
    queue(ours, "p1")
    [claim] = theirs.claim()
    with old_snapshot():
        assert theirs.settle(claim, "failed", "refused")
        assert ours.requeue("p1") is True
    assert theirs.find("p1").state == "queued"


def test_a_cancel_under_an_old_snapshot_leaves_a_post_claimed_meanwhile(ours, theirs):
    queue(ours, "p1")
    with old_snapshot():
        [claim] = theirs.claim()
        assert ours.cancel_queued("p1") is False
    assert theirs.posted(claim) is True
    assert theirs.find("p1").state == "posted"
