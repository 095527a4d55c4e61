"""posted, found, retry, hold and settle: what each records, and fencing."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.test import override_settings

from django_connector_outbox import Outbox, PostState
from django_connector_outbox.models import Post

pytestmark = pytest.mark.django_db

LEASE = 120


@pytest.fixture
def outbox(clock):
    return Outbox("memory", clock=clock)


def settings_with(**values):
    return override_settings(CONNECTOR_OUTBOX={**settings.CONNECTOR_OUTBOX, **values})


def queue(outbox, post_id, container_id="C1", **fields):
    fields.setdefault("body", {"text": post_id})
    return outbox.queue(post_id, workspace_id="T1", container_id=container_id, **fields)


def set_status(outbox, post_id, text, container_id="C1"):
    outbox.set_status(post_id, workspace_id="T1", container_id=container_id, body={"text": text})


def claim_one(outbox):
    [claim] = outbox.claim()
    return claim


def row(post_id):
    """The post as a user sees it: `current_state` and `current_attempts` count its claim."""
    return Post.objects.with_claim().get(post_id=post_id)


def snapshot(post_id):
    return Post.objects.with_claim().values().get(post_id=post_id)


# -- posted -----------------------------------------------------------------------------------


def test_posted_records_the_post_drops_its_body_and_resets_attempts(outbox):
    queue(outbox, "p1")
    claim = claim_one(outbox)
    assert outbox.posted(claim, "C1:1") is True
    r = row("p1")
    assert (r.state, r.message_ref, r.body, r.attempts) == ("posted", "C1:1", None, 0)
    assert outbox.find("p1") == PostState("posted", "C1:1")


def test_posted_without_a_ref_is_posted_with_none(outbox):
    queue(outbox, "p1", kind="reaction")
    assert outbox.posted(claim_one(outbox)) is True
    assert outbox.find("p1") == PostState("posted", None)


def test_posted_of_a_status_keeps_its_body(outbox):
    set_status(outbox, "s1", "v1")
    outbox.posted(claim_one(outbox), "C1:1")
    r = row("s1")
    assert (r.state, r.body, r.message_ref) == ("posted", {"text": "v1"}, "C1:1")


def test_posted_without_a_ref_keeps_the_ref_it_had(outbox):
    set_status(outbox, "s1", "v1")
    outbox.posted(claim_one(outbox), "C1:1")
    set_status(outbox, "s1", "v2")
    claim = claim_one(outbox)
    assert claim.message_ref == "C1:1"
    assert outbox.posted(claim) is True
    assert outbox.find("s1") == PostState("posted", "C1:1")


def test_posted_with_a_changed_rev_goes_back_to_the_back_of_its_container(outbox, clock):
    set_status(outbox, "s1", "v1")
    claim = claim_one(outbox)
    clock.advance(1)
    queue(outbox, "p2")
    clock.advance(1)
    set_status(outbox, "s1", "v2")  # while v1 is being sent
    clock.advance(1)

    assert outbox.posted(claim, "C1:1") is True

    r = row("s1")
    assert (r.current_state, r.current_attempts, r.rev, r.message_ref, r.body) == (
        "queued",
        0,
        1,
        "C1:1",
        {"text": "v2"},
    )
    assert r.queued_at == clock.now
    nxt = claim_one(outbox)
    assert nxt.post_id == "p2"  # s1 went behind the post queued meanwhile
    outbox.posted(nxt)
    edit = claim_one(outbox)
    assert (edit.post_id, edit.body, edit.rev, edit.message_ref, edit.attempts) == (
        "s1", {"text": "v2"}, 1, "C1:1", 1,
    )  # fmt: skip


def test_posted_resets_attempts_after_retries(outbox):
    queue(outbox, "p1")
    outbox.retry(claim_one(outbox), after=0)
    claim = claim_one(outbox)
    assert claim.attempts == 2
    outbox.posted(claim)
    assert row("p1").attempts == 0


# -- found ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["message", "reaction"])
def test_found_of_a_one_off_post_is_posted(outbox, clock, kind):
    queue(outbox, "p1", kind=kind)
    outbox.claim()
    clock.advance(LEASE)
    stale = claim_one(outbox)
    assert outbox.found(stale, "C1:7") is True
    r = row("p1")
    assert (r.state, r.message_ref, r.body, r.attempts) == ("posted", "C1:7", None, 0)


def test_found_of_a_status_queues_it_again_in_the_same_place_with_the_ref(outbox, clock):
    set_status(outbox, "s1", "v1")
    clock.advance(1)
    queue(outbox, "p2")
    outbox.claim()
    clock.advance(LEASE)
    stale = claim_one(outbox)
    assert (stale.post_id, stale.stale) == ("s1", True)

    assert outbox.found(stale, "C1:5") is True

    r = row("s1")
    assert (r.current_state, r.current_attempts, r.message_ref, r.body, r.rev) == (
        "queued",
        0,
        "C1:5",
        {"text": "v1"},
        0,
    )
    edit = claim_one(outbox)  # still ahead of p2, due at once
    assert (edit.post_id, edit.message_ref, edit.stale, edit.attempts) == ("s1", "C1:5", False, 1)


# -- retry ------------------------------------------------------------------------------------


def test_retry_queues_the_post_again_and_keeps_the_attempt(outbox, clock):
    queue(outbox, "p1")
    with settings_with(RETRY_JITTER=0):
        assert outbox.retry(claim_one(outbox), reason="timeout") is True
    r = row("p1")
    assert (r.current_state, r.current_attempts, r.last_error, r.body) == (
        "queued",
        1,
        "timeout",
        {"text": "p1"},
    )
    assert r.next_at == clock.now + timedelta(seconds=2)


@pytest.mark.parametrize(
    ("base", "maximum", "expected"),
    [
        (2, 60, [2, 4, 8, 16, 32, 60, 60, 60]),
        (3, 20, [3, 6, 12, 20, 20, 20, 20, 20]),
        (timedelta(seconds=1), timedelta(seconds=5), [1, 2, 4, 5, 5, 5, 5, 5]),
        (0.5, 100, [0.5, 1, 2, 4, 8, 16, 32, 64]),
    ],
)
def test_retry_backs_off_exactly_without_jitter(outbox, clock, base, maximum, expected):
    queue(outbox, "p1")
    waits = []
    with settings_with(RETRY_BASE=base, RETRY_MAX=maximum, RETRY_JITTER=0, MAX_ATTEMPTS=100):
        for attempt in range(1, len(expected) + 1):
            claim = claim_one(outbox)
            assert claim.attempts == attempt
            outbox.retry(claim)
            waits.append((row("p1").next_at - clock.now).total_seconds())
            clock.advance(waits[-1])
    assert waits == expected


@pytest.mark.parametrize("jitter", [0.2, 0.5])
def test_retry_backoff_is_jittered_down_within_its_range(outbox, clock, jitter):
    waits: dict[int, list[float]] = {attempt: [] for attempt in range(1, 8)}
    with settings_with(RETRY_BASE=2, RETRY_MAX=60, RETRY_JITTER=jitter, MAX_ATTEMPTS=100):
        for n in range(30):
            queue(outbox, f"p{n}")
            for attempt in range(1, 8):
                claim = claim_one(outbox)
                assert claim.attempts == attempt
                outbox.retry(claim)
                wait = (row(f"p{n}").next_at - clock.now).total_seconds()
                waits[attempt].append(wait)
                clock.advance(wait)
            outbox.settle(claim_one(outbox), "failed")
    for attempt, seen in waits.items():
        full = min(2 * 2 ** (attempt - 1), 60)
        assert all(full * (1 - jitter) - 1e-6 <= w <= full + 1e-6 for w in seen), (attempt, full, seen)
        assert len(set(seen)) > 1, (attempt, seen)  # it is random
        assert min(seen) < full * (1 - jitter / 2) < max(seen), (attempt, seen)  # across the range


def test_retry_after_0_is_due_at_once(outbox):
    queue(outbox, "p1")
    assert outbox.retry(claim_one(outbox), after=0) is True
    claim = claim_one(outbox)
    assert (claim.post_id, claim.attempts, claim.stale) == ("p1", 2, False)


@pytest.mark.parametrize("after", [5, 5.0, timedelta(seconds=5)])
def test_retry_after_is_due_after_it(outbox, clock, after):
    queue(outbox, "p1")
    outbox.retry(claim_one(outbox), after=after)
    assert row("p1").next_at == clock.now + timedelta(seconds=5)
    clock.advance(4.999)
    assert outbox.claim() == []
    clock.advance(0.001)
    assert claim_one(outbox).post_id == "p1"


def test_a_retried_post_stays_the_head_and_its_container_waits(outbox, clock):
    queue(outbox, "p1")
    queue(outbox, "p2")
    queue(outbox, "other", "C2")
    claims = outbox.claim()
    assert sorted(c.post_id for c in claims) == ["other", "p1"]
    outbox.retry(next(c for c in claims if c.post_id == "p1"), after=30)
    clock.advance(29)
    assert outbox.claim() == []
    clock.advance(1)
    assert claim_one(outbox).post_id == "p1"


def test_retry_out_of_attempts_fails_the_post_and_keeps_its_body(outbox):
    queue(outbox, "p1")
    with settings_with(MAX_ATTEMPTS=3):
        for _ in range(2):
            assert outbox.retry(claim_one(outbox), after=0, reason="try again") is True
            assert outbox.find("p1").state == "queued"
        claim = claim_one(outbox)
        assert claim.attempts == 3
        assert outbox.retry(claim, after=0, reason="still down") is True
    r = row("p1")
    assert (r.state, r.last_error, r.body) == ("failed", "still down", {"text": "p1"})
    assert outbox.claim() == []


def test_a_failed_head_lets_the_next_post_of_its_container_go(outbox):
    queue(outbox, "p1")
    queue(outbox, "p2")
    with settings_with(MAX_ATTEMPTS=1):
        outbox.retry(claim_one(outbox))
    assert claim_one(outbox).post_id == "p2"


# -- hold -------------------------------------------------------------------------------------


def test_hold_queues_the_post_after_a_wait_and_does_not_count_the_attempt(outbox, clock):
    queue(outbox, "p1")
    claim = claim_one(outbox)
    assert outbox.hold(claim, 30, reason="ratelimited") is True
    r = row("p1")
    assert (r.current_state, r.current_attempts, r.last_error) == ("queued", 0, "ratelimited")
    assert r.next_at == clock.now + timedelta(seconds=30)  # what the admin shows: until when
    clock.advance(30)
    assert claim_one(outbox).attempts == 1


def test_hold_after_a_timedelta(outbox, clock):
    queue(outbox, "p1")
    outbox.hold(claim_one(outbox), timedelta(minutes=1))
    assert row("p1").next_at == clock.now + timedelta(minutes=1)


def test_hold_keeps_the_container_waiting(outbox, clock):
    queue(outbox, "p1")
    queue(outbox, "p2")
    outbox.hold(claim_one(outbox), 30)
    clock.advance(29.999)
    assert outbox.claim() == []
    clock.advance(0.001)
    assert claim_one(outbox).post_id == "p1"


def test_a_post_never_fails_for_being_rate_limited(outbox):
    queue(outbox, "p1")
    with settings_with(MAX_ATTEMPTS=2):
        for _ in range(10):
            claim = claim_one(outbox)
            assert claim.attempts == 1
            assert outbox.hold(claim, 0) is True
        assert outbox.retry(claim_one(outbox), after=0) is True
        assert outbox.find("p1").state == "queued"
        for _ in range(5):
            claim = claim_one(outbox)
            assert claim.attempts == 2
            outbox.hold(claim, 0)
        claim = claim_one(outbox)
        assert claim.attempts == 2
        outbox.retry(claim)
    assert outbox.find("p1").state == "failed"


# -- settle -----------------------------------------------------------------------------------


@pytest.mark.parametrize("state", ["failed", "uncertain"])
def test_settle_finishes_the_post_and_keeps_its_body_and_reason(outbox, state):
    queue(outbox, "p1")
    assert outbox.settle(claim_one(outbox), state, reason="channel_not_found") is True
    r = row("p1")
    assert (r.state, r.body, r.last_error) == (state, {"text": "p1"}, "channel_not_found")
    assert outbox.find("p1") == PostState(state, None)


@pytest.mark.parametrize("state", ["posted", "queued", "sending", "cancelled", "FAILED", "", None])
def test_settle_with_another_state_is_a_value_error_and_changes_nothing(outbox, state):
    queue(outbox, "p1")
    claim = claim_one(outbox)
    before = snapshot("p1")
    with pytest.raises(ValueError):
        outbox.settle(claim, state, reason="nope")
    assert snapshot("p1") == before
    assert outbox.posted(claim) is True  # the claim is still current


def test_settled_head_lets_the_next_post_go(outbox):
    queue(outbox, "p1")
    queue(outbox, "p2")
    outbox.settle(claim_one(outbox), "uncertain")
    assert claim_one(outbox).post_id == "p2"


def test_uncertain_stays_final(outbox, clock):
    set_status(outbox, "s1", "v1")
    outbox.settle(claim_one(outbox), "uncertain")
    before = snapshot("s1")

    set_status(outbox, "s1", "v2")
    assert outbox.queue("s1", workspace_id="T1", container_id="C1", body={}) is False
    assert outbox.cancel_queued("s1") is False
    clock.advance(LEASE * 100)
    assert outbox.claim() == []
    assert snapshot("s1") == before


# -- the latest error -------------------------------------------------------------------------


def test_the_latest_reason_is_kept(outbox):
    queue(outbox, "p1")
    outbox.retry(claim_one(outbox), after=0, reason="first")
    assert row("p1").last_error == "first"
    outbox.hold(claim_one(outbox), 0, reason="second")
    assert row("p1").last_error == "second"
    outbox.settle(claim_one(outbox), "failed", reason="third")
    assert row("p1").last_error == "third"


# -- fencing ----------------------------------------------------------------------------------

FINISHES = {
    "posted": lambda outbox, claim: outbox.posted(claim, "C1:1"),
    "found": lambda outbox, claim: outbox.found(claim, "C1:1"),
    "retry": lambda outbox, claim: outbox.retry(claim, after=0, reason="late"),
    "hold": lambda outbox, claim: outbox.hold(claim, 0, reason="late"),
    "settle failed": lambda outbox, claim: outbox.settle(claim, "failed", reason="late"),
    "settle uncertain": lambda outbox, claim: outbox.settle(claim, "uncertain", reason="late"),
}


@pytest.mark.parametrize("kind", ["message", "status"])
@pytest.mark.parametrize("finish", FINISHES)
def test_a_claim_taken_back_changes_nothing(outbox, clock, finish, kind):
    if kind == "status":
        set_status(outbox, "p1", "v1")
    else:
        queue(outbox, "p1")
    old = claim_one(outbox)
    clock.advance(LEASE)
    new = claim_one(outbox)
    assert new.stale
    before = snapshot("p1")

    assert FINISHES[finish](outbox, old) is False

    assert snapshot("p1") == before
    assert outbox.posted(new, "C1:2") is True  # the new claim is untouched


@pytest.mark.parametrize("finish", FINISHES)
def test_a_claim_whose_lease_ended_but_was_not_taken_back_is_still_current(outbox, clock, finish):
    queue(outbox, "p1")
    claim = claim_one(outbox)
    clock.advance(LEASE * 3)
    assert FINISHES[finish](outbox, claim) is True
    assert outbox.find("p1").state != "sending"


@pytest.mark.parametrize("finish", FINISHES)
def test_a_claim_is_finished_once(outbox, finish):
    queue(outbox, "p1")
    claim = claim_one(outbox)
    assert outbox.posted(claim) is True
    before = snapshot("p1")
    assert FINISHES[finish](outbox, claim) is False
    assert snapshot("p1") == before


@pytest.mark.parametrize("finish", FINISHES)
def test_an_old_claim_cannot_finish_a_later_claim_of_the_same_post(outbox, finish):
    queue(outbox, "p1")
    old = claim_one(outbox)
    outbox.retry(old, after=0)
    new = claim_one(outbox)
    before = snapshot("p1")
    assert FINISHES[finish](outbox, old) is False
    assert snapshot("p1") == before
    assert outbox.posted(new) is True


def test_a_claim_from_another_source_is_not_current_here(outbox, clock):
    queue(outbox, "p1")
    other = Outbox("other", clock=clock)
    other.queue("p1", workspace_id="T1", container_id="C1", body={})
    claim = claim_one(outbox)
    [other_claim] = other.claim()
    assert outbox.posted(other_claim) is False
    assert outbox.find("p1").state == "sending"
    assert other.posted(other_claim) is True
    assert outbox.posted(claim) is True
