"""The sender loop in-process: what it does with each outcome of a send or a lookup.

`Sender(..., once=True, clock=clock).run()` claims and delivers until nothing is due, on this
test's connection, with the FakeClock: a lease runs out when the test moves the clock. A
claim that `outbox.claim()` makes in a test stands for a sender that died holding it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from datetime import timedelta
from typing import Any
from unittest import mock

import pytest
from django.conf import settings
from django.db import DataError, OperationalError, connections
from django.test import override_settings

from django_connector_outbox import Outbox, signals
from django_connector_outbox.connectors import CheckLater, connectors
from django_connector_outbox.connectors.base import Delivered, MaybeSent, Outcome
from django_connector_outbox.connectors.memory import MemoryConnector
from django_connector_outbox.fakes import webhook as fw
from django_connector_outbox.models import Post
from django_connector_outbox.posts import ClaimedPost
from django_connector_outbox.sender import BUSY_PAUSE, GROUP_WINDOW, Sender
from tests.conftest import FakeClock
from tests.harness import ManualExecutor

pytestmark = pytest.mark.django_db

LEASE = 120  # the default
MEMORY = "django_connector_outbox.connectors.memory.MemoryConnector"
WEBHOOK = "django_connector_outbox.connectors.webhook.WebhookConnector"


class LookupLaterConnector(MemoryConnector):
    """A platform whose history cannot be searched right now (rate-limited lookups)."""

    def find_sent(self, post: ClaimedPost) -> str | None:
        raise CheckLater("search.messages rate-limited")


class ExplodingConnector(MemoryConnector):
    """A connector with a bug: send raises."""

    def send(self, post: ClaimedPost) -> Outcome:
        raise RuntimeError("boom")


class BaseExceptionConnector(MemoryConnector):
    """A connector whose `send` and `find_sent` raise `raising` (a BaseException, not an Exception)."""

    raising: type[BaseException] = asyncio.CancelledError

    def send(self, post: ClaimedPost) -> Outcome:
        raise self.raising("cancelled under the connector")

    def find_sent(self, post: ClaimedPost) -> str | None:
        raise self.raising("cancelled under the lookup")


class Interrupted(BaseException):
    """A BaseException of a library's own, neither KeyboardInterrupt nor SystemExit."""


class HookedConnector(MemoryConnector):
    """Calls `hook(post)` on the worker thread before delivering."""

    hook: Any = None

    def send(self, post: ClaimedPost) -> Outcome:
        if self.hook is not None:
            self.hook(post)
        return super().send(post)


def with_backend(backend: str, **values: Any):
    """The "memory" source served by `backend`, with other outbox settings changed."""
    return override_settings(
        CONNECTOR_OUTBOX={
            **settings.CONNECTOR_OUTBOX,
            "CONNECTORS": {"memory": {"BACKEND": backend}},
            **values,
        }
    )


@pytest.fixture
def outbox(clock):
    return Outbox("memory", clock=clock)


@pytest.fixture
def platform() -> MemoryConnector:
    return connectors["memory"]  # type: ignore[return-value]


@pytest.fixture
def sent_signals():
    """(signal name, post id, extra kwargs) of every signal the sender sends, in order."""
    seen: list[tuple[str, str, dict[str, Any]]] = []
    names = ("post_posted", "post_retried", "post_held", "post_failed", "post_uncertain", "post_lost_reply")
    receivers = []
    for name in names:

        def receiver(sender: Any, *, claim: ClaimedPost, _name: str = name, **kwargs: Any) -> None:
            kwargs.pop("signal", None)
            seen.append((_name, claim.post_id, kwargs))

        getattr(signals, name).connect(receiver, weak=False)
        receivers.append((name, receiver))
    yield seen
    for name, receiver in receivers:
        getattr(signals, name).disconnect(receiver)


def run(clock, **options: Any) -> Sender:
    sender = Sender(["memory"], once=True, clock=clock, worker="w1", **options)
    sender.run()
    return sender


def queue(outbox: Outbox, post_id: str, container_id: str = "C1", **fields: Any) -> None:
    fields.setdefault("body", {"text": post_id})
    assert outbox.queue(post_id, workspace_id="T1", container_id=container_id, **fields)


def row(post_id: str) -> Post:
    """The post with its claim (`current_state`, `current_attempts`, the lease: see `with_claim`)."""
    return Post.objects.with_claim().get(post_id=post_id)


# -- delivering ------------------------------------------------------------------------------------


def test_delivers_every_due_post_in_queue_order_per_container(outbox, platform, clock, sent_signals):
    for n in range(3):
        queue(outbox, f"a{n}", "C1")
        clock.advance(0.001)
        queue(outbox, f"b{n}", "C2")
        clock.advance(0.001)

    run(clock, concurrency=3)

    assert [m.post_id for m in platform.messages("C1")] == ["a0", "a1", "a2"]
    assert [m.post_id for m in platform.messages("C2")] == ["b0", "b1", "b2"]
    assert {p.post_id: (p.current_state, p.message_ref) for p in Post.objects.with_claim()} == {
        m.post_id: ("posted", m.ref) for c in ("C1", "C2") for m in platform.messages(c)
    }
    assert sorted((name, post_id) for name, post_id, _ in sent_signals) == sorted(
        ("post_posted", p) for p in ("a0", "a1", "a2", "b0", "b1", "b2")
    )
    assert all(extra["message_ref"] == row(post_id).message_ref for _, post_id, extra in sent_signals)


def test_a_status_set_twice_before_it_is_sent_goes_out_once_with_its_latest_body(outbox, platform, clock):
    for text in ("working", "still working", "done"):
        outbox.set_status("st", workspace_id="T1", container_id="C1", body={"text": text})

    run(clock)

    [message] = platform.messages("C1")
    assert (message.post_id, message.body, message.edits) == ("st", {"text": "done"}, 0)
    assert (row("st").current_state, row("st").message_ref) == ("posted", message.ref)


# -- stale claims: look before sending again ------------------------------------------------------------


def test_a_stale_claim_found_in_the_platform_is_recorded_and_not_sent_again(
    outbox, platform, clock, sent_signals
):
    queue(outbox, "p1")
    [claim] = outbox.claim()
    ref = platform.send(claim).message_ref  # type: ignore[union-attr]  # it got there, then its sender died
    clock.advance(LEASE)

    run(clock)

    assert len(platform.sent) == 1  # looked up, not sent again
    assert [m.post_id for m in platform.messages("C1")] == ["p1"]
    assert (row("p1").current_state, row("p1").message_ref, row("p1").current_attempts) == ("posted", ref, 0)
    assert sent_signals == [("post_posted", "p1", {"message_ref": ref})]


def test_a_stale_claim_not_found_in_the_platform_is_sent(outbox, platform, clock):
    queue(outbox, "p1")
    outbox.claim()  # its sender died before sending
    clock.advance(LEASE)

    run(clock)

    [send] = platform.sent
    assert send.stale and send.attempts == 2
    assert [m.post_id for m in platform.messages("C1")] == ["p1"]
    assert row("p1").current_state == "posted"


def test_a_stale_claim_that_cannot_be_looked_up_becomes_uncertain(outbox, platform, clock, sent_signals):
    queue(outbox, "e1", kind="ephemeral", body={"user": "U1", "text": "psst"})
    queue(outbox, "m2")  # behind it in the container
    outbox.claim()
    clock.advance(LEASE)

    run(clock)

    assert platform.ephemerals == []  # never sent again
    post = row("e1")
    assert post.current_state == "uncertain"
    assert "cannot check" in post.last_error and "ephemeral" in post.last_error
    assert post.body == {"user": "U1", "text": "psst"}  # kept, for an operator's retry
    assert row("m2").current_state == "posted"  # the container moved on
    assert sent_signals[0] == ("post_uncertain", "e1", {"reason": post.last_error})


def test_a_lookup_that_must_wait_leaves_the_claim_until_the_last_attempt(outbox, clock, sent_signals):
    with with_backend("tests.test_sender.LookupLaterConnector", MAX_ATTEMPTS=3):
        platform = connectors["memory"]
        outbox = Outbox("memory", clock=clock)
        queue(outbox, "p1")
        outbox.claim()  # attempt 1; its sender died
        clock.advance(LEASE)

        run(clock)  # attempt 2: the lookup must wait; the claim is left as it is

        post = row("p1")
        assert (post.current_state, post.current_attempts) == ("sending", 2)
        assert "lookup failed, will look again" in post.last_error and "rate-limited" in post.last_error
        assert post.lease_until == clock.now + timedelta(seconds=LEASE)
        assert platform.sent == []  # type: ignore[attr-defined]

        run(clock)  # its lease has not ended: nothing to do
        assert row("p1").current_attempts == 2

        clock.advance(LEASE)
        run(clock)  # attempt 3 of 3: uncertain

        post = row("p1")
        assert (post.current_state, post.current_attempts) == ("uncertain", 3)
        assert "last attempt" in post.last_error
        assert platform.sent == []  # type: ignore[attr-defined]
    assert [name for name, _, _ in sent_signals] == ["post_lost_reply", "post_uncertain"]


def test_a_lost_reply_is_left_sending_then_taken_back_and_found(
    outbox, platform, clock, sent_signals, package_log
):
    queue(outbox, "p1")
    platform.lose_next_reply()

    sender = run(clock)

    post = row("p1")
    assert (post.current_state, post.current_attempts) == ("sending", 1)
    assert post.last_error == "reply lost (scripted)"
    assert sender.stats["lost_reply"] == 1
    assert sent_signals == [("post_lost_reply", "p1", {"reason": "reply lost (scripted)"})]
    [message] = platform.messages("C1")

    run(clock)  # under its lease: left alone
    assert row("p1").current_state == "sending"

    clock.advance(LEASE)
    run(clock)  # taken back stale, looked up, found

    assert len(platform.sent) == 1
    assert (row("p1").current_state, row("p1").message_ref) == ("posted", message.ref)
    assert sent_signals[-1] == ("post_posted", "p1", {"message_ref": message.ref})
    assert "post lost_reply post_id=p1" in package_log.text


# -- outcomes of a send ----------------------------------------------------------------------------------


@pytest.mark.parametrize("raising", [asyncio.CancelledError, Interrupted], ids=lambda e: e.__name__)
def test_a_send_raising_a_base_exception_is_retried_and_the_sender_goes_on(
    outbox, clock, sent_signals, package_log, monkeypatch, raising
):
    monkeypatch.setattr(BaseExceptionConnector, "raising", raising)
    with with_backend("tests.test_sender.BaseExceptionConnector", RETRY_JITTER=0):
        outbox = Outbox("memory", clock=clock)
        queue(outbox, "p1")

        sender = run(clock)  # returns: nothing due until the backoff ends

        post = row("p1")
        assert (post.current_state, post.current_attempts) == ("queued", 1)
        assert post.last_error == f"send raised {raising.__name__}('cancelled under the connector')"
        assert sender.stats["retried"] == 1
        [record] = [r for r in package_log.records if r.getMessage().startswith("send raised")]
        assert record.exc_info is not None


@pytest.mark.parametrize("raising", [asyncio.CancelledError, Interrupted], ids=lambda e: e.__name__)
def test_a_lookup_raising_a_base_exception_is_looked_up_again_after_the_lease(
    outbox, clock, sent_signals, package_log, monkeypatch, raising
):
    monkeypatch.setattr(BaseExceptionConnector, "raising", raising)
    with with_backend("tests.test_sender.BaseExceptionConnector"):
        outbox = Outbox("memory", clock=clock)
        queue(outbox, "p1")
        outbox.claim()  # its sender died
        clock.advance(LEASE)

        run(clock)

        post = row("p1")
        assert (post.current_state, post.current_attempts) == ("sending", 2)
        assert post.last_error.startswith("lookup raised, will look again: ")
        assert raising.__name__ in post.last_error
        [record] = [r for r in package_log.records if r.getMessage().startswith("find_sent raised")]
        assert record.exc_info is not None


def test_a_webhook_token_in_the_url_never_reaches_last_error_or_any_log_line(clock, caplog):
    caplog.set_level(logging.DEBUG)  # every logger, httpx's and httpcore's too
    token, key = "hK3rT9wQ2mZ8vB5nL1pY7cD4", "q7Xv2LpR9sTw4MzK"
    with fw.running() as receiver:  # it knows no such hook, and echoes the path in its 404
        url = f"http://127.0.0.1:{receiver.port}/services/T01/B01/{token}?key={key}"
        with override_settings(
            CONNECTOR_OUTBOX={
                **settings.CONNECTOR_OUTBOX,
                "CONNECTORS": {"memory": {"BACKEND": WEBHOOK, "OPTIONS": {"url": url, "timeout": 5}}},
            }
        ):
            queue(Outbox("memory", clock=clock), "p1")
            run(clock)
    post = row("p1")
    assert (post.current_state, post.last_error) == ("failed", "webhook HTTP 404 not_found no hook at ***")
    assert "no hook at ***" in caplog.text  # the sender logged the reason
    for text in [caplog.text, *(r.getMessage() for r in caplog.records)]:
        assert token not in text and key not in text, text


@pytest.mark.parametrize("raising", [KeyboardInterrupt, SystemExit], ids=lambda e: e.__name__)
def test_a_send_raising_keyboard_interrupt_or_system_exit_still_stops_the_sender(
    outbox, clock, monkeypatch, raising
):
    monkeypatch.setattr(BaseExceptionConnector, "raising", raising)
    with with_backend("tests.test_sender.BaseExceptionConnector"):
        outbox = Outbox("memory", clock=clock)
        queue(outbox, "p1")
        with pytest.raises(raising):
            run(clock)


def test_a_send_that_raises_is_retried_and_its_traceback_logged(outbox, clock, sent_signals, package_log):
    with with_backend("tests.test_sender.ExplodingConnector", MAX_ATTEMPTS=2, RETRY_JITTER=0):
        outbox = Outbox("memory", clock=clock)
        queue(outbox, "p1")

        run(clock)

        post = row("p1")
        assert (post.current_state, post.current_attempts) == ("queued", 1)
        assert "RuntimeError('boom')" in post.last_error
        assert post.next_at == clock.now + timedelta(seconds=2)  # RETRY_BASE, no jitter
        [record] = [r for r in package_log.records if r.getMessage().startswith("send raised")]
        assert record.exc_info is not None and "boom" in package_log.text
        assert sent_signals == [("post_retried", "p1", {"reason": post.last_error})]

        clock.advance(2)
        run(clock)  # the last attempt fails too

        post = row("p1")
        assert (post.current_state, post.current_attempts) == ("failed", 2)
        assert post.last_error == "send raised RuntimeError('boom')"  # failed with attempts == MAX_ATTEMPTS
        assert sent_signals[-1] == ("post_failed", "p1", {"reason": post.last_error})


def test_a_rate_limited_send_holds_its_container_without_spending_an_attempt(
    outbox, platform, clock, sent_signals
):
    queue(outbox, "p1")
    clock.advance(0.001)
    queue(outbox, "p2")
    platform.rate_limit_next(30)

    run(clock)

    post = row("p1")
    assert (post.current_state, post.current_attempts, post.last_error) == ("queued", 0, "rate limited")
    assert post.next_at == clock.now + timedelta(seconds=30)
    assert row("p2").current_state == "queued"  # the container waits behind its head
    assert sent_signals == [
        ("post_held", "p1", {"reason": "rate limited", "after": 30, "scope": "container"})
    ]

    clock.advance(30)
    run(clock)

    assert [m.post_id for m in platform.messages("C1")] == ["p1", "p2"]


def test_a_refused_post_fails_and_its_container_moves_on(outbox, platform, clock, sent_signals):
    queue(outbox, "p1")
    clock.advance(0.001)
    queue(outbox, "p2")
    platform.fail_next("channel_not_found", permanent=True)

    run(clock)

    post = row("p1")
    assert (post.current_state, post.last_error, post.body) == ("failed", "channel_not_found", {"text": "p1"})
    assert row("p2").current_state == "posted"
    assert sent_signals[0] == ("post_failed", "p1", {"reason": "channel_not_found"})


def test_a_transient_failure_is_retried_after_the_backoff(outbox, platform, clock, sent_signals):
    with with_backend(MEMORY, RETRY_JITTER=0, RETRY_BASE=5):
        platform = connectors["memory"]
        outbox = Outbox("memory", clock=clock)
        queue(outbox, "p1")
        platform.fail_next("503 busy")  # type: ignore[attr-defined]

        run(clock)

        post = row("p1")
        assert (post.current_state, post.current_attempts, post.last_error) == ("queued", 1, "503 busy")
        assert post.next_at == clock.now + timedelta(seconds=5)
        clock.advance(5)
        run(clock)
        assert row("p1").current_state == "posted"
    assert [name for name, _, _ in sent_signals] == ["post_retried", "post_posted"]


@pytest.mark.django_db(transaction=True)
def test_a_result_for_a_claim_taken_back_meanwhile_changes_nothing(clock, package_log):
    outbox = Outbox("memory", clock=clock)
    queue(outbox, "p1")
    taken_back: list[ClaimedPost] = []

    def slow_send(post: ClaimedPost) -> None:
        # While this send hangs, its lease ends and another sender (whose clock is past the
        # lease; this sender's clock stays put, so it cannot take the post back itself) does.
        later = FakeClock()
        later.now = clock.now + timedelta(seconds=LEASE)
        try:
            taken_back.extend(Outbox("memory", clock=later).claim())
        finally:
            connections.close_all()  # this worker thread's own connection

    with with_backend("tests.test_sender.HookedConnector"):
        HookedConnector.hook = staticmethod(slow_send)
        try:
            # One send slot: while it is busy the sender waits, so no claim of its own holds a
            # lane lock that the other sender's SKIP LOCKED would skip.
            sender = run(clock, concurrency=1)
        finally:
            HookedConnector.hook = None

    [claim] = taken_back
    assert claim.stale
    post = row("p1")
    # The other sender's claim.
    assert (post.current_state, post.lease_token) == ("sending", claim.lease_token)
    assert sender.stats == {"fenced": 1}
    assert "claim no longer current post_id=p1 action=posted" in package_log.text


# -- the database goes away while results are recorded ---------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_results_not_recorded_when_the_database_went_away_are_all_kept(clock):
    outbox = Outbox("memory", clock=clock)
    for n in range(3):
        queue(outbox, f"p{n}", f"C{n}")
    executor = ManualExecutor()
    sender = Sender(["memory"], clock=clock, executor=executor, concurrency=3)
    assert sender.turn() == LEASE / 2  # three claimed and started, every slot busy (until a renewal)
    assert executor.run_all() == 3
    real_finish_and_claim = Outbox.finish_and_claim

    def database_away(self: Outbox, finishes, *args, **kwargs):
        raise OperationalError("server closed the connection unexpectedly")

    with mock.patch.object(Outbox, "finish_and_claim", database_away):  # a turn records with it
        assert sender.turn() == 0.1  # the first reconnection pause
    assert [p.current_state for p in Post.objects.with_claim()] == ["sending"] * 3
    assert Outbox.finish_and_claim is real_finish_and_claim

    assert sender.turn() is not None  # the database is back: all three recorded
    assert {p.post_id: p.current_state for p in Post.objects.with_claim()} == {
        f"p{n}": "posted" for n in range(3)
    }
    assert sender.stats == {"posted": 3}
    sender.close()


# -- what it tells the operator ------------------------------------------------------------------------


def test_the_summary_line_counts_what_happened(outbox, platform, clock, package_log):
    queue(outbox, "p1", "C1")
    queue(outbox, "p2", "C2")
    queue(outbox, "p3", "C3")
    platform.rate_limit_next(30)

    run(clock, concurrency=1)

    [summary] = [r.getMessage() for r in package_log.records if r.getMessage().startswith("summary ")]
    assert summary == (
        "summary worker=w1 posted=2 retried=0 held=1 held_workspace=0 held_source=0 failed=0 uncertain=0 lost_reply=0 given_back=0 dropped=0 "
        "fenced=0 unrecorded=0 housekeeping_errors=0 queue_depth=1 oldest_due_age=-"
    )
    assert any(
        r.getMessage().startswith("sender started worker=w1 sources=memory") for r in package_log.records
    )
    assert any(r.getMessage() == "sender stopped worker=w1 forced=False" for r in package_log.records)


def test_a_second_stop_forces_the_loop_out_while_a_send_blocks(outbox, clock):
    queue(outbox, "p1")
    release = threading.Event()
    started = threading.Event()

    def blocking_send(post: ClaimedPost) -> None:
        started.set()
        release.wait(10)

    with with_backend("tests.test_sender.HookedConnector"):
        HookedConnector.hook = staticmethod(blocking_send)
        sender = Sender(["memory"], clock=clock, worker="w1")
        stopper = threading.Thread(target=lambda: (started.wait(10), sender.stop(), sender.stop()))
        stopper.start()
        try:
            sender.run()  # returns although the send still blocks
            assert not release.is_set()
            assert row("p1").current_state == "sending"  # left to be looked up after its lease
        finally:
            release.set()
            stopper.join(10)
            HookedConnector.hook = None


def test_delivered_without_a_ref_keeps_none(outbox, clock):
    class NoRef(MemoryConnector):
        def send(self, post: ClaimedPost) -> Outcome:
            return Delivered()

    with mock.patch.dict(connectors._connectors, {"memory": NoRef("memory")}):
        queue(outbox, "p1")
        run(clock)
    assert (row("p1").current_state, row("p1").message_ref) == ("posted", None)


def test_the_next_due_time_bounds_an_idle_wait(outbox, clock):
    sender = Sender(["memory"], clock=clock, poll=30)
    assert sender._until_next_due() == 30  # nothing queued: the poll interval
    outbox.queue("later", workspace_id="T1", container_id="C9", body={"text": "x"}, delay=7.5)
    assert sender._until_next_due() == pytest.approx(7.5)
    clock.advance(10)
    # Due, yet the claim that came before found it not claimable (another sender's lease, a
    # workspace's pace): looked at again after a short pause, not in a busy loop.
    assert sender._until_next_due() == BUSY_PAUSE


def test_a_paced_source_with_sends_in_flight_waits_for_its_next_slot_not_the_poll(clock):
    connectors_setting = dict(settings.CONNECTOR_OUTBOX["CONNECTORS"])
    connectors_setting["memory"] = {**connectors_setting["memory"], "PACE": {"source": (1, 0.5)}}
    with override_settings(CONNECTOR_OUTBOX={**settings.CONNECTOR_OUTBOX, "CONNECTORS": connectors_setting}):
        outbox = Outbox("memory", clock=clock)
        queue(outbox, "p1", "C1")
        queue(outbox, "p2", "C2")
        executor = ManualExecutor()
        sender = Sender(["memory"], clock=clock, executor=executor, poll=30)
        # p1 claimed and in flight (a platform that answers slowly); p2 waits for the pace.
        assert sender.turn() == pytest.approx(0.5)
        clock.advance(0.5)
        sender.turn()
        assert len(executor.pending) == 2  # p2 claimed in its slot, while p1 is still in flight
        executor.run_all()
        sender.close()


# -- attempts bound sends, and no claim is sent after its lease (issue 9, holes 1-3) ----------------


class LostEveryReplyConnector(MemoryConnector):
    """Every reply is lost, and the platform never has the post: the worst lost-reply loop."""

    def send(self, post: ClaimedPost) -> Outcome:
        self.sent.append(post)
        return MaybeSent("reply lost")

    def find_sent(self, post: ClaimedPost) -> str | None:
        return None


def test_a_post_whose_every_reply_is_lost_is_sent_at_most_max_attempts_times(clock):
    with with_backend("tests.test_sender.LostEveryReplyConnector", MAX_ATTEMPTS=3):
        platform = connectors["memory"]
        queue(Outbox("memory", clock=clock), "p1")
        for _ in range(6):
            run(clock)
            clock.advance(LEASE)

        assert len(platform.sent) == 3  # type: ignore[attr-defined]
        post = row("p1")
        # The lookup after the third lost reply says it is not in the source: failed, not sent.
        assert (post.current_state, post.current_attempts) == ("failed", 4)
        assert post.last_error == "out of attempts (4): not in the source, and not sent again"


def test_a_reply_lost_on_the_last_attempt_holds_the_container_until_it_is_looked_up(clock):
    with with_backend(MEMORY, MAX_ATTEMPTS=1):
        platform = connectors["memory"]
        outbox = Outbox("memory", clock=clock)
        queue(outbox, "p1")
        clock.advance(0.001)
        queue(outbox, "p2")
        platform.lose_next_reply()  # type: ignore[attr-defined]

        run(clock)  # p1 may be on its way: p2 waits behind it

        assert (row("p1").current_state, row("p2").current_state) == ("sending", "queued")
        clock.advance(LEASE)
        run(clock)  # claimed back, looked up, found; then p2
        assert (row("p1").current_state, row("p2").current_state) == ("posted", "posted")
        assert [m.post_id for m in platform.messages("C1")] == ["p1", "p2"]  # type: ignore[attr-defined]
        assert len(platform.sent) == 2  # type: ignore[attr-defined]


def test_a_stale_claim_past_its_last_attempt_is_looked_up_but_never_sent(outbox, platform, clock):
    with with_backend(MEMORY, MAX_ATTEMPTS=1):
        platform = connectors["memory"]
        queue(Outbox("memory", clock=clock), "p1")
        Outbox("memory", clock=clock).claim()  # attempt 1 of 1; its sender died before sending
        clock.advance(LEASE)

        run(clock)

        assert platform.sent == []  # type: ignore[attr-defined]
        post = row("p1")
        assert (post.current_state, post.current_attempts) == ("failed", 2)
        assert post.last_error == "out of attempts (2): not in the source, and not sent again"


class TimedMemoryConnector(MemoryConnector):
    timeout = 5.0


def test_a_claim_whose_lease_ends_within_the_timeout_is_given_back_unsent(clock):
    with with_backend("tests.test_sender.TimedMemoryConnector"):
        platform = connectors["memory"]
        queue(Outbox("memory", clock=clock), "p1")
        executor = ManualExecutor()
        sender = Sender(["memory"], clock=clock, executor=executor)
        sender.turn()  # claimed and handed to the executor, which has not run it yet
        clock.advance(LEASE - 4)  # 4 s of lease left, and a send may take 5

        executor.run_all()
        sender.turn()  # given back, and claimed again at once, under a new lease

        assert platform.sent == []  # type: ignore[attr-defined]
        post = row("p1")
        assert (post.current_state, post.current_attempts, post.last_error) == (
            "sending", 1, "given back: the lease ends before a send could",
        )  # fmt: skip
        assert post.lease_until == clock.now + timedelta(seconds=LEASE)
        assert sender.stats["given_back"] == 1
        executor.run_all()
        sender.turn()
        assert [m.post_id for m in platform.messages("C1")] == ["p1"]  # type: ignore[attr-defined]


def test_a_stale_claim_whose_lookup_would_outlast_the_lease_stays_stale(clock):
    with with_backend("tests.test_sender.TimedMemoryConnector"):
        outbox = Outbox("memory", clock=clock)
        queue(outbox, "p1")
        outbox.claim()  # its sender died
        clock.advance(LEASE)
        executor = ManualExecutor()
        sender = Sender(["memory"], clock=clock, executor=executor)
        sender.turn()
        clock.advance(LEASE - 1)

        executor.run_all()
        sender.turn()  # given back still stale, and claimed back (stale) at once

        post = row("p1")
        assert (post.current_state, post.current_attempts) == ("sending", 2)
        assert post.last_error == "given back: the lease ends before a lookup could"
        executor.run_all()  # looked up (not there), then sent
        sender.turn()
        [sent] = connectors["memory"].sent  # type: ignore[attr-defined]
        assert sent.stale and sent.attempts == 2


def test_a_stale_claim_given_back_by_a_stopping_sender_stays_stale(outbox, platform, clock):
    queue(outbox, "p1")
    [first] = outbox.claim()  # its sender died
    clock.advance(LEASE)
    executor = ManualExecutor()
    sender = Sender(["memory"], clock=clock, executor=executor)
    sender.turn()  # claimed back stale, not started yet
    sender.stop()

    assert sender.turn() is None  # the delivery is cancelled and given back
    sender.close()

    assert executor.run() is False  # cancelled: never ran
    post = row("p1")
    assert (post.current_state, post.current_attempts, post.lease_until) == ("sending", 1, clock.now)
    [again] = outbox.claim()
    assert again.stale and again.sent_at == first.sent_at  # it will be looked up before a send
    assert platform.sent == []


def test_a_fresh_claim_given_back_by_a_stopping_sender_is_queued_again(outbox, platform, clock):
    queue(outbox, "p1")
    executor = ManualExecutor()
    sender = Sender(["memory"], clock=clock, executor=executor)
    sender.turn()
    sender.stop()

    assert sender.turn() is None
    sender.close()

    post = row("p1")
    assert (post.current_state, post.current_attempts, post.last_error) == (
        "queued", 0, "given back: sender stopping",
    )  # fmt: skip
    assert sender.stats["given_back"] == 1


def test_a_sender_claims_no_more_than_its_free_send_slots(outbox, clock):
    for n in range(10):
        queue(outbox, f"p{n}", f"C{n}")
    executor = ManualExecutor()
    sender = Sender(["memory"], clock=clock, executor=executor, concurrency=3, batch=20)

    assert sender.turn() == LEASE / 2  # every slot busy: until a send ends, or a lease is renewed
    assert Post.objects.in_state("sending").count() == 3
    executor.run(0)
    assert sender.turn() == GROUP_WINDOW  # one finished: it waits for the others a moment
    clock.advance(GROUP_WINDOW)
    sender.turn()  # then it is recorded, and one more claimed
    assert Post.objects.in_state("sending").count() == 3
    assert Post.objects.filter(state="posted").count() == 1


# -- group commit ---------------------------------------------------------------------------------------


def test_finished_sends_wait_for_the_others_in_flight_to_be_recorded_together(outbox, clock):
    for n in range(4):
        queue(outbox, f"p{n}", f"C{n}")
    executor = ManualExecutor()
    sender = Sender(["memory"], clock=clock, executor=executor, concurrency=4)
    sender.turn()
    executor.run(0)
    assert sender.turn() == GROUP_WINDOW
    clock.advance(GROUP_WINDOW / 2)
    executor.run(0)
    assert sender.turn() == pytest.approx(GROUP_WINDOW / 2)  # the window runs from the first result
    assert Post.objects.filter(state="posted").count() == 0
    executor.run_all()
    sender.turn()  # nothing left in flight: all four recorded at once
    assert Post.objects.filter(state="posted").count() == 4


def test_a_batch_of_results_is_recorded_without_waiting_for_the_window(outbox, clock):
    for n in range(6):
        queue(outbox, f"p{n}", f"C{n}")
    executor = ManualExecutor()
    sender = Sender(["memory"], clock=clock, executor=executor, concurrency=6, batch=3)
    sender.turn()
    sender.turn()
    for _ in range(3):
        executor.run(0)
    sender.turn()  # three results: a batch, recorded at once
    assert Post.objects.filter(state="posted").count() == 3


def test_a_sender_without_a_group_window_records_each_result_at_once(outbox, clock):
    for n in range(2):
        queue(outbox, f"p{n}", f"C{n}")
    executor = ManualExecutor()
    sender = Sender(["memory"], clock=clock, executor=executor, concurrency=2, group_window=0)
    sender.turn()
    executor.run(0)
    sender.turn()
    assert Post.objects.filter(state="posted").count() == 1


# -- several sources share a sender (issue 9, hole 9) ------------------------------------------------


@override_settings(
    CONNECTOR_OUTBOX={
        "CONNECTORS": {
            "memory": {"BACKEND": MEMORY},
            "other": {"BACKEND": MEMORY},
        }
    }
)
def test_a_due_post_of_a_second_source_never_waits_behind_the_first_sources_backlog(clock):
    busy, quiet = Outbox("memory", clock=clock), Outbox("other", clock=clock)
    for n in range(40):
        queue(busy, f"b{n}", f"C{n}")
    queue(quiet, "q1")
    executor = ManualExecutor()
    sender = Sender(["memory", "other"], clock=clock, executor=executor, concurrency=4)

    sender.turn()

    assert row("q1").current_state == "sending"
    assert Post.objects.filter(source="memory").in_state("sending").count() == 3


@override_settings(
    CONNECTOR_OUTBOX={
        "CONNECTORS": {
            "memory": {"BACKEND": MEMORY},
            "other": {"BACKEND": MEMORY},
        }
    }
)
def test_one_free_slot_goes_to_each_source_in_turn(clock):
    outboxes = [Outbox("memory", clock=clock), Outbox("other", clock=clock)]
    for n in range(10):
        for outbox in outboxes:
            queue(outbox, f"{outbox.source}-{n}", f"C{n}")
    executor = ManualExecutor()
    sender = Sender(["memory", "other"], clock=clock, executor=executor, concurrency=1)

    claimed = []
    for _ in range(6):
        sender.turn()
        claimed.append(Post.objects.in_state("sending").get().source)
        executor.run_all()
    assert claimed == ["memory", "other"] * 3


@pytest.mark.django_db(transaction=True)
def test_a_result_the_database_refuses_is_left_to_its_lease_and_the_others_are_recorded(clock, package_log):
    outbox = Outbox("memory", clock=clock)
    for n in range(3):
        queue(outbox, f"p{n}", f"C{n}")
    executor = ManualExecutor()
    sender = Sender(["memory"], clock=clock, executor=executor, concurrency=3)
    sender.turn()
    executor.run_all()
    real_finish_many, real_finish_and_claim = Outbox.finish_many, Outbox.finish_and_claim

    def refuses_p1(real):
        def write(self: Outbox, finishes, *args, **kwargs):
            if any(claim.post_id == "p1" for claim, _ in finishes):
                raise DataError("value too long for type character varying(255)")
            return real(self, finishes, *args, **kwargs)

        return write

    # A turn records with its claim (finish_and_claim); once refused, one by one (finish_many).
    with (
        mock.patch.object(Outbox, "finish_and_claim", refuses_p1(real_finish_and_claim)),
        mock.patch.object(Outbox, "finish_many", refuses_p1(real_finish_many)),
    ):
        assert sender.turn() is not None  # the sender goes on

    assert {p.post_id: p.current_state for p in Post.objects.with_claim()} == {
        "p0": "posted",
        "p1": "sending",
        "p2": "posted",
    }
    assert sender.stats == {"posted": 2, "unrecorded": 1}
    assert "could not record post_id=p1 action=posted" in package_log.text
    clock.advance(LEASE)  # claimed back stale, looked up in the platform, found
    sender.turn()
    executor.run_all()
    sender.turn()
    assert row("p1").current_state == "posted"
    assert len(connectors["memory"].messages("C1")) == 1  # type: ignore[attr-defined]
    sender.close()
