"""Outbox.finish_many (the sender's batched finishes) against the one-by-one methods.

Each scenario runs twice on identical twin containers, once through the contract method and
once through finish_many, and the rows and lane heads that result must be the same. On
PostgreSQL finish_many is its own SQL statement, so these tests are what keeps it honest.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.test import override_settings

from django_connector_outbox import Outbox
from django_connector_outbox.models import Lane, Post
from django_connector_outbox.posts import Finish

pytestmark = pytest.mark.django_db

COMPARED = (
    "current_state",
    "current_attempts",
    "body",
    "rev",
    "message_ref",
    "last_error",
    "queued_at",
    "next_at",
    "lease_until",
)


@pytest.fixture
def outbox(clock):
    with override_settings(
        CONNECTOR_OUTBOX={**settings.CONNECTOR_OUTBOX, "RETRY_JITTER": 0, "MAX_ATTEMPTS": 3}
    ):
        yield Outbox("memory", clock=clock)


def twin_claims(outbox, clock, *, kind="message", behind=1, before_claim=None):
    """The same post in containers A and B, each with `behind` posts queued after it; the claims."""
    for container in ("A", "B"):
        if kind == "status":
            outbox.set_status(f"{container}-head", workspace_id="W", container_id=container, body={"v": 1})
        else:
            outbox.queue(f"{container}-head", workspace_id="W", container_id=container, body={"v": 1})
        for n in range(behind):
            outbox.queue(
                f"{container}-next{n}", workspace_id="W", container_id=container, body={"n": n}, delay=n
            )
    claims = {c.container_id: c for c in outbox.claim()}
    if before_claim:
        before_claim()
    return claims["A"], claims["B"]


def recorded(outbox, finishes):
    """Whether each finish of the batch was recorded (its claim still current)."""
    return [f is not None for f in outbox.finish_many(finishes)]


def state_of(container):
    rows = Post.objects.filter(container_id=container).with_claim().order_by("post_id")
    posts = list(rows.values(*COMPARED))
    lane = Lane.objects.get(container_id=container)
    head = Post.objects.get(pk=lane.head_id).post_id.split("-", 1)[1] if lane.head_id else None
    return posts, head, lane.due_at


def assert_twins(outbox, clock, one_by_one, finish, **setup):
    a, b = twin_claims(outbox, clock, **setup)
    clock.advance(5)
    assert one_by_one(a) is True
    assert recorded(outbox, [(b, finish(b))]) == [True]
    assert state_of("A") == state_of("B")


def test_posted(outbox, clock):
    assert_twins(
        outbox,
        clock,
        lambda c: outbox.posted(c, "ref"),
        lambda c: Finish(c.post_id, c.lease_token, "posted", message_ref="ref"),
    )


def test_posted_without_a_ref_keeps_the_ref_it_had(outbox, clock):
    assert_twins(
        outbox,
        clock,
        lambda c: outbox.posted(c),
        lambda c: Finish(c.post_id, c.lease_token, "posted"),
        kind="status",
    )


def test_posted_after_the_status_changed_goes_back_for_one_more_edit(outbox, clock):
    def change():
        for container in ("A", "B"):
            outbox.set_status(f"{container}-head", workspace_id="W", container_id=container, body={"v": 2})

    assert_twins(
        outbox, clock, lambda c: outbox.posted(c, "ref"), lambda c: Finish(c.post_id, c.lease_token, "posted", message_ref="ref"),
        kind="status", before_claim=change,
    )  # fmt: skip


def test_posted_status_alone_in_its_container_stays_head_when_changed(outbox, clock):
    def change():
        for container in ("A", "B"):
            outbox.set_status(f"{container}-head", workspace_id="W", container_id=container, body={"v": 2})

    assert_twins(
        outbox, clock, lambda c: outbox.posted(c, "ref"), lambda c: Finish(c.post_id, c.lease_token, "posted", message_ref="ref"),
        kind="status", behind=0, before_claim=change,
    )  # fmt: skip


@pytest.mark.parametrize("kind", ["message", "status"])
def test_found(outbox, clock, kind):
    assert_twins(
        outbox,
        clock,
        lambda c: outbox.found(c, "ref"),
        lambda c: Finish(c.post_id, c.lease_token, "found", message_ref="ref"),
        kind=kind,
    )


@pytest.mark.parametrize("after", [None, 0, 30])
def test_retry(outbox, clock, after):
    assert_twins(
        outbox, clock, lambda c: outbox.retry(c, after, "flaky"),
        lambda c: Finish(c.post_id, c.lease_token, "retry", wait=after, reason="flaky"),
    )  # fmt: skip


def test_retry_out_of_attempts_fails(outbox, clock):
    a, b = twin_claims(outbox, clock)
    for _ in range(2):  # attempts 1 and 2 retried at once, then claimed again
        outbox.retry(a, 0)
        outbox.retry(b, 0)
        claims = {c.container_id: c for c in outbox.claim()}
        a, b = claims["A"], claims["B"]
    assert a.attempts == 3
    assert outbox.retry(a, 0, "gone") is True
    assert recorded(outbox, [(b, Finish(b.post_id, b.lease_token, "retry", wait=0, reason="gone"))]) == [True]
    assert state_of("A") == state_of("B")
    assert state_of("A")[0][0]["current_state"] == "failed"


def test_hold(outbox, clock):
    assert_twins(
        outbox, clock, lambda c: outbox.hold(c, 12.5, "rate limited"),
        lambda c: Finish(c.post_id, c.lease_token, "hold", wait=12.5, reason="rate limited"),
    )  # fmt: skip


@pytest.mark.parametrize("state", ["failed", "uncertain"])
def test_settle(outbox, clock, state):
    assert_twins(
        outbox, clock, lambda c: outbox.settle(c, state, "no"),
        lambda c: Finish(c.post_id, c.lease_token, "settle", state=state, reason="no"),
    )  # fmt: skip


def test_settle_with_another_state_changes_nothing(outbox, clock):
    a, _ = twin_claims(outbox, clock)
    with pytest.raises(ValueError, match="settle\\(\\) takes 'failed' or 'uncertain', not 'posted'"):
        outbox.finish_many([(a, Finish(a.post_id, a.lease_token, "settle", state="posted"))])
    assert outbox.find("A-head").state == "sending"


def test_a_claim_taken_back_is_fenced_in_a_batch(outbox, clock):
    a, b = twin_claims(outbox, clock)
    clock.advance(timedelta(seconds=121).total_seconds())
    retaken = {c.container_id: c for c in outbox.claim()}
    assert retaken["A"].stale and retaken["A"].lease_token != a.lease_token
    b = retaken["B"]
    result = recorded(
        outbox,
        [(a, Finish(a.post_id, a.lease_token, "posted", message_ref="old")),
         (b, Finish(b.post_id, b.lease_token, "posted", message_ref="ok"))]
    )  # fmt: skip
    assert result == [False, True]
    assert outbox.find("A-head").state == "sending"
    assert outbox.find("B-head").state == "posted"


def test_a_batch_over_many_containers_moves_each_head_on(outbox, clock):
    for n in range(30):
        outbox.queue(f"p{n:02d}", workspace_id="W", container_id=f"C{n % 10}", body={"n": n})
    claims = outbox.claim(10)
    assert recorded(outbox, [(c, Finish(c.post_id, c.lease_token, "posted")) for c in claims]) == [True] * 10
    assert sorted(c.post_id for c in outbox.claim(10)) == [f"p{n}" for n in range(10, 20)]
