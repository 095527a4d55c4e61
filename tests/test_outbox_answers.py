"""Answers the outbox cannot store as given: recorded as what they mean, never a crash.

A platform (or a custom connector) may answer a Retry-After of 1e12, a 300-character id, an
int id, or an exception as a reason. Each is tried through the contract methods and through
finish_many (on PostgreSQL its own SQL statement), on every backend.
"""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.conf import settings
from django.test import override_settings

from django_connector_outbox import Outbox
from django_connector_outbox.models import Post
from django_connector_outbox.posts import Finish

pytestmark = pytest.mark.django_db

MAX_HOLD = 3600


@pytest.fixture
def outbox(clock):
    with override_settings(CONNECTOR_OUTBOX={**settings.CONNECTOR_OUTBOX, "RETRY_JITTER": 0}):
        yield Outbox("memory", clock=clock)


def claim_one(outbox, kind="message"):
    if kind == "status":
        outbox.set_status("p1", workspace_id="T1", container_id="C1", body={"text": "hi"})
    else:
        outbox.queue("p1", workspace_id="T1", container_id="C1", body={"text": "hi"})
    [claim] = outbox.claim()
    return claim


def finish(outbox, claim, action, via, **fields):
    """`action` recorded through its contract method (via="method") or through finish_many."""
    if via == "batch":
        [recorded] = outbox.finish_many([(claim, Finish(claim.post_id, claim.lease_token, action, **fields))])
        return recorded is not None
    match action:
        case "posted" | "found":
            return getattr(outbox, action)(claim, fields.get("message_ref"))
        case "retry" | "hold":
            return getattr(outbox, action)(claim, fields.get("wait"), fields.get("reason", ""))
    return outbox.settle(claim, fields["state"], fields.get("reason", ""))


VIA = pytest.mark.parametrize("via", ["method", "batch"])


# -- waits: MAX_HOLD ---------------------------------------------------------------------------------


@VIA
@pytest.mark.parametrize("action", ["retry", "hold"])
def test_a_wait_longer_than_max_hold_is_cut_to_it_and_the_reason_says_so(outbox, clock, action, via):
    claim = claim_one(outbox)
    assert finish(outbox, claim, action, via, wait=1e12, reason="429 Too Many Requests") is True
    post = Post.objects.with_claim().get(post_id="p1")
    assert post.current_state == "queued"
    assert post.next_at == clock.now + timedelta(seconds=MAX_HOLD)
    assert post.last_error == "429 Too Many Requests (wait cut from 1e+12s to MAX_HOLD 3600s)"


@VIA
def test_an_infinite_wait_is_cut_to_max_hold(outbox, clock, via):
    claim = claim_one(outbox)
    assert finish(outbox, claim, "hold", via, wait=float("inf"), reason="") is True
    post = Post.objects.with_claim().get(post_id="p1")
    assert post.next_at == clock.now + timedelta(seconds=MAX_HOLD)
    assert post.last_error == "(wait cut from inf to MAX_HOLD 3600s)"


@VIA
@pytest.mark.parametrize("wait", [float("nan"), -5.0, float("-inf")])
def test_a_negative_or_nan_wait_is_due_at_once(outbox, clock, via, wait):
    claim = claim_one(outbox)
    assert finish(outbox, claim, "retry", via, wait=wait, reason="odd") is True
    post = Post.objects.with_claim().get(post_id="p1")
    assert (post.state, post.next_at, post.last_error) == ("queued", clock.now, "odd")


@VIA
def test_max_hold_is_a_setting_and_bounds_the_backoff_too(outbox, clock, via):
    claim = claim_one(outbox)
    with override_settings(
        CONNECTOR_OUTBOX={
            **settings.CONNECTOR_OUTBOX,
            "RETRY_JITTER": 0,
            "RETRY_BASE": 600,
            "RETRY_MAX": 600,
            "MAX_HOLD": 60,
        }
    ):
        assert finish(outbox, claim, "retry", via, wait=None, reason="500") is True
    post = Post.objects.with_claim().get(post_id="p1")
    assert post.next_at == clock.now + timedelta(seconds=60)
    assert post.last_error == "500 (wait cut from 600s to MAX_HOLD 60s)"


@VIA
def test_a_wait_of_max_hold_or_less_is_kept_as_given(outbox, clock, via):
    claim = claim_one(outbox)
    assert finish(outbox, claim, "hold", via, wait=MAX_HOLD, reason="slow down") is True
    post = Post.objects.with_claim().get(post_id="p1")
    assert (post.next_at, post.last_error) == (clock.now + timedelta(seconds=MAX_HOLD), "slow down")


# -- refs the outbox cannot store ------------------------------------------------------------------

REFUSED_REFS = [
    pytest.param("x" * 256, id="over-255-chars"),
    pytest.param(12345, id="an-int"),
    pytest.param("ts\x00", id="NUL"),
    pytest.param("ts\udc80", id="lone-surrogate"),
]


@VIA
@pytest.mark.parametrize("ref", REFUSED_REFS)
def test_posted_with_a_ref_it_cannot_store_is_posted_without_it_and_logged(outbox, package_log, via, ref):
    claim = claim_one(outbox)
    assert finish(outbox, claim, "posted", via, message_ref=ref) is True
    post = Post.objects.with_claim().get(post_id="p1")
    assert (post.state, post.message_ref) == ("posted", None)
    [record] = [r for r in package_log.records if r.name == "django_connector_outbox"]
    assert record.levelno == logging.WARNING
    assert record.getMessage().startswith("message_ref refused: post_id=p1 problem=")


@VIA
@pytest.mark.parametrize("ref", REFUSED_REFS)
def test_found_with_a_ref_it_cannot_store_is_recorded_without_it(outbox, package_log, via, ref):
    claim = claim_one(outbox, kind="status")
    assert finish(outbox, claim, "found", via, message_ref=ref) is True
    post = Post.objects.with_claim().get(post_id="p1")
    assert (post.state, post.message_ref, post.attempts) == ("queued", None, 0)


@VIA
def test_a_ref_of_255_characters_is_kept(outbox, via):
    claim = claim_one(outbox)
    assert finish(outbox, claim, "posted", via, message_ref="é" * 255) is True
    assert Post.objects.with_claim().get(post_id="p1").message_ref == "é" * 255


# -- reasons ---------------------------------------------------------------------------------------


@VIA
@pytest.mark.parametrize("action", ["retry", "hold", "settle"])
def test_an_exception_as_reason_is_kept_as_its_text(outbox, action, via):
    claim = claim_one(outbox)
    fields = dict(state="failed") if action == "settle" else dict(wait=0)
    assert finish(outbox, claim, action, via, reason=ConnectionError("reset by peer"), **fields) is True
    assert Post.objects.with_claim().get(post_id="p1").last_error == "reset by peer"


@VIA
def test_a_reason_loses_nul_and_lone_surrogates_and_is_bounded(outbox, via):
    claim = claim_one(outbox)
    reason = "bad\x00 \udc80reply " + "x" * 5000
    assert finish(outbox, claim, "settle", via, state="failed", reason=reason) is True
    kept = Post.objects.with_claim().get(post_id="p1").last_error
    assert kept.startswith("bad reply xxx")
    assert len(kept) == 2000 and kept.endswith("…")


def test_a_post_left_to_its_lease_keeps_an_exception_as_its_reason_text(outbox):
    claim = claim_one(outbox)
    assert outbox.leave(claim, TimeoutError()) is True
    assert Post.objects.with_claim().get(post_id="p1").last_error == "TimeoutError"
