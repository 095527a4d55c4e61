"""The per-attempt history: a row for each finish that did not deliver its post, none for a delivery.

Run on PostgreSQL it goes through the PostgreSQL store's FINISH statement (retry, hold, settle)
and the ORM's (leave); elsewhere, and with OUTBOX_STORE=orm, through the ORM store alone.
tests/test_store_differential.py holds the two stores to the same rows.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.test import override_settings

from django_connector_outbox import Outbox
from django_connector_outbox.models import Attempt, Post

pytestmark = pytest.mark.django_db


@pytest.fixture
def outbox(clock):
    return Outbox("memory", clock=clock)


def queue(outbox, post_id, container_id="C1"):
    assert outbox.queue(post_id, workspace_id="T1", container_id=container_id, body={"text": post_id})


def claim_one(outbox, worker="sender-1"):
    [claim] = outbox.claim(worker=worker)
    return claim


def history(post_id):
    """Its rows, oldest first: (attempt, outcome, reason, worker)."""
    rows = Attempt.objects.filter(post__post_id=post_id).order_by("at", "pk")
    return list(rows.values_list("attempt", "outcome", "reason", "worker"))


def test_a_delivered_post_has_no_history_and_shows_its_attempt(outbox):
    queue(outbox, "p1")
    assert outbox.posted(claim_one(outbox), "C1:1")
    assert history("p1") == []
    post = Post.objects.get(post_id="p1")
    assert (post.attempts, post.delivered_attempt) == (0, 1)  # attempts go to 0: the contract


def test_each_failed_or_held_attempt_is_a_row_with_its_reason_and_worker(outbox, clock):
    queue(outbox, "p1")
    assert outbox.retry(claim_one(outbox, "sender-1"), after=0, reason="HTTP 500")
    assert outbox.hold(claim_one(outbox, "sender-2"), after=0, reason="ratelimited (429)")
    assert outbox.leave(claim_one(outbox, "sender-1"), reason="reply lost")
    clock.advance(121)  # the lease ends: taken back stale
    stale = claim_one(outbox, "sender-3")
    assert stale.stale and stale.attempts == 3
    assert outbox.settle(stale, "uncertain", reason="may have been sent, cannot check: no history")
    assert history("p1") == [
        (1, "retried", "HTTP 500", "sender-1"),
        (2, "held", "ratelimited (429)", "sender-2"),  # not counted: the next claim is attempt 2 again
        (2, "lost_reply", "reply lost", "sender-1"),
        (3, "uncertain", "may have been sent, cannot check: no history", "sender-3"),
    ]
    [when] = Attempt.objects.filter(post__post_id="p1", outcome="uncertain").values_list("at", flat=True)
    assert when == clock()


def test_a_post_delivered_after_failures_shows_the_attempt_that_delivered_it(outbox):
    queue(outbox, "p1")
    assert outbox.retry(claim_one(outbox), after=0, reason="timeout")
    assert outbox.posted(claim_one(outbox), "C1:1")
    assert Post.objects.get(post_id="p1").delivered_attempt == 2
    assert history("p1") == [(1, "retried", "timeout", "sender-1")]


def test_a_retry_out_of_attempts_is_recorded_as_failed(outbox):
    queue(outbox, "p1")
    with override_settings(CONNECTOR_OUTBOX={**settings.CONNECTOR_OUTBOX, "MAX_ATTEMPTS": 2}):
        assert outbox.retry(claim_one(outbox), after=0, reason="HTTP 502")
        assert outbox.retry(claim_one(outbox), after=0, reason="HTTP 503")
    assert Post.objects.get(post_id="p1").state == "failed"
    assert history("p1") == [(1, "retried", "HTTP 502", "sender-1"), (2, "failed", "HTTP 503", "sender-1")]


def test_a_refusal_is_recorded_as_failed(outbox):
    queue(outbox, "p1")
    assert outbox.settle(claim_one(outbox), "failed", reason="channel_not_found")
    assert history("p1") == [(1, "failed", "channel_not_found", "sender-1")]


def test_a_claim_given_back_or_found_writes_no_row(outbox, clock):
    queue(outbox, "p1")
    assert outbox.give_back(claim_one(outbox))
    assert outbox.leave(claim_one(outbox), reason="reply lost")
    clock.advance(121)
    assert outbox.found(claim_one(outbox), "C1:1")
    assert [outcome for _, outcome, _, _ in history("p1")] == ["lost_reply"]
    assert Post.objects.get(post_id="p1").state == "posted"


def test_a_finish_whose_claim_was_taken_back_writes_no_row(outbox, clock):
    queue(outbox, "p1")
    first = claim_one(outbox, "sender-1")
    clock.advance(121)
    second = claim_one(outbox, "sender-2")
    assert outbox.retry(first, reason="late") is False
    assert history("p1") == []
    assert outbox.retry(second, after=0, reason="now") is True
    assert history("p1") == [(2, "retried", "now", "sender-2")]


def test_a_batch_of_deliveries_and_failures_writes_rows_for_the_failures_only(outbox):
    from django_connector_outbox.posts import Action, Finish

    for n in range(4):
        queue(outbox, f"p{n}", container_id=f"C{n}")
    claims = outbox.claim(worker="w")
    finishes = [
        (
            c,
            Finish(
                c.post_id, c.lease_token, Action.POSTED if n % 2 else Action.RETRY, wait=0, reason=f"r{n}"
            ),
        )
        for n, c in enumerate(sorted(claims, key=lambda c: c.post_id))
    ]
    outbox.finish_many(finishes)
    assert sorted(Attempt.objects.values_list("post__post_id", "outcome", "reason")) == [
        ("p0", "retried", "r0"),
        ("p2", "retried", "r2"),
    ]


def test_pruning_a_post_deletes_its_history_and_keeps_the_others(outbox, clock):
    queue(outbox, "old")
    assert outbox.settle(claim_one(outbox), "failed", reason="channel_not_found")
    clock.advance(10)
    queue(outbox, "kept", container_id="C2")
    assert outbox.settle(claim_one(outbox), "failed", reason="is_archived")
    clock.advance(timedelta(days=1).total_seconds())
    # the first is older than the retention given, the second is not
    assert outbox.prune_finished(timedelta(days=1) + timedelta(seconds=5)) == 1
    assert list(Attempt.objects.values_list("post__post_id", flat=True)) == ["kept"]
    assert Post.objects.filter(post_id="old").exists() is False


def test_deleting_a_post_deletes_its_history(outbox):
    queue(outbox, "p1")
    assert outbox.settle(claim_one(outbox), "failed", reason="channel_not_found")
    Post.objects.filter(post_id="p1").delete()
    assert Attempt.objects.count() == 0


def test_the_senders_outcomes_are_the_history(outbox, clock):
    from django_connector_outbox.connectors import connectors
    from django_connector_outbox.sender import Sender

    platform = connectors["memory"]
    platform.rate_limit_next(5)
    platform.fail_next("HTTP 503")
    platform.fail_next("channel_not_found", permanent=True)
    queue(outbox, "p1")
    for _ in range(3):
        Sender(["memory"], once=True, clock=clock, worker="w1").run()
        clock.advance(60)
    assert history("p1") == [
        (1, "held", "rate limited", "w1"),
        (1, "retried", "HTTP 503", "w1"),
        (2, "failed", "channel_not_found", "w1"),
    ]


def test_the_history_of_a_post_that_stays_is_pruned_by_age(outbox, clock):
    outbox.set_status("s1", workspace_id="T1", container_id="C1", body={"text": "v1"})
    assert outbox.hold(claim_one(outbox), 0, reason="429 long ago")
    assert outbox.posted(claim_one(outbox), "C1:1")
    clock.advance(timedelta(days=60).total_seconds())
    outbox.set_status("s1", workspace_id="T1", container_id="C1", body={"text": "v2"})
    assert outbox.hold(claim_one(outbox), 0, reason="429 today")
    assert outbox.prune_finished() == 0  # status posts stay
    assert [reason for _, _, reason, _ in history("s1")] == ["429 today"]
