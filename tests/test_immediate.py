"""DELIVERY "immediate": each committed post is delivered right after its transaction commits,
in process, through the sender's own claim -> deliver -> record path; never before the
commit, never for a rollback, and a failing platform leaves it to be retried as ever."""

from __future__ import annotations

import threading
import time
from unittest import mock

import pytest
from django.conf import settings
from django.db import transaction
from django.test import TestCase, TransactionTestCase, override_settings

from django_connector_outbox import Outbox, PostState, signals
from django_connector_outbox import immediate as delivery
from django_connector_outbox.connectors import connectors
from django_connector_outbox.immediate import Drain
from django_connector_outbox.sender import Sender
from django_connector_outbox.testing import queued

PLACE = {"workspace_id": "T1", "container_id": "C1"}


def immediate():
    return override_settings(CONNECTOR_OUTBOX={**settings.CONNECTOR_OUTBOX, "DELIVERY": "immediate"})


def texts(source="memory", container="C1"):
    return [m.body["text"] for m in connectors[source].messages(container)]


@immediate()
class ImmediateInTestCaseTests(TestCase):
    def test_a_post_is_delivered_when_its_transaction_commits_not_before(self):
        with self.captureOnCommitCallbacks(execute=True) as callbacks:
            Outbox("memory").queue("p1", **PLACE, body={"text": "hello"})
            assert texts() == []
            assert Outbox("memory").find("p1") == PostState("queued", None)

        assert callbacks == [Drain("memory", "default")]
        assert texts() == ["hello"]
        assert Outbox("memory").find("p1") == PostState("posted", "C1:1")

    def test_queue_many_delivers_every_post_in_queue_order(self):
        with self.captureOnCommitCallbacks(execute=True) as callbacks:
            Outbox("memory").queue_many(
                [{"post_id": f"p{i}", **PLACE, "body": {"text": str(i)}} for i in range(5)]
            )

        assert len(callbacks) == 1
        assert texts() == ["0", "1", "2", "3", "4"]

    def test_each_source_queued_to_is_drained(self):
        with self.captureOnCommitCallbacks(execute=True):
            Outbox("memory").queue("m1", **PLACE, body={"text": "mine"})
            Outbox("other").queue("o1", **PLACE, body={"text": "theirs"})

        assert (texts("memory"), texts("other")) == (["mine"], ["theirs"])

    def test_a_status_replaced_after_commit_is_edited_in_place(self):
        with self.captureOnCommitCallbacks(execute=True):
            Outbox("memory").set_status("s1", **PLACE, body={"text": "1/2"})
        with self.captureOnCommitCallbacks(execute=True) as callbacks:
            Outbox("memory").set_status("s1", **PLACE, body={"text": "2/2"})

        assert len(callbacks) == 1
        [message] = connectors["memory"].messages("C1")
        assert (message.body, message.edits) == ({"text": "2/2"}, 1)

    def test_a_failing_platform_leaves_the_post_queued_for_a_retry(self):
        connectors["memory"].fail_next("platform down")

        with self.captureOnCommitCallbacks(execute=True):
            Outbox("memory").queue("p1", **PLACE, body={"text": "hello"})

        assert texts() == []
        [waiting] = queued()
        assert (waiting.post_id, waiting.attempts, waiting.last_error) == ("p1", 1, "platform down")

    def test_a_refusal_fails_the_post_as_a_sender_would(self):
        connectors["memory"].fail_next("channel_not_found", permanent=True)

        with self.captureOnCommitCallbacks(execute=True):
            Outbox("memory").queue("p1", **PLACE, body={"text": "hello"})

        assert Outbox("memory").find("p1") == PostState("failed", None)

    def test_a_post_queued_again_schedules_nothing(self):
        Outbox("memory").queue("p1", **PLACE, body={"text": "hello"})
        with self.captureOnCommitCallbacks() as callbacks:
            assert Outbox("memory").queue("p1", **PLACE, body={"text": "hello"}) is False
        assert callbacks == []


class SenderDeliveryTests(TestCase):
    def test_by_default_nothing_is_delivered_in_process(self):
        with self.captureOnCommitCallbacks(execute=True) as callbacks:
            Outbox("memory").queue("p1", **PLACE, body={"text": "hello"})

        assert callbacks == []
        assert texts() == []


@immediate()
class ImmediateWithCommitsTests(TransactionTestCase):
    def test_an_autocommitted_post_is_delivered_at_once(self):
        Outbox("memory").queue("p1", **PLACE, body={"text": "hello"})

        assert texts() == ["hello"]
        assert Outbox("memory").find("p1").state == "posted"

    def test_a_post_is_delivered_after_the_outermost_commit(self):
        with transaction.atomic():
            with transaction.atomic():
                Outbox("memory").queue("p1", **PLACE, body={"text": "hello"})
            assert texts() == []

        assert texts() == ["hello"]

    def test_a_rolled_back_transaction_sends_nothing(self):
        with pytest.raises(ValueError), transaction.atomic():
            Outbox("memory").queue("p1", **PLACE, body={"text": "hello"})
            raise ValueError("the business write failed")

        assert texts() == []
        assert Outbox("memory").find("p1") is None

    def test_a_post_queued_by_a_receiver_during_a_drain_is_delivered_too(self):
        def answer(*, claim, **kwargs):
            if claim.source == "memory":
                Outbox("other").queue(f"ack:{claim.post_id}", **PLACE, body={"text": "ack"})

        signals.post_posted.connect(answer, sender=Sender, dispatch_uid="test-answer")
        try:
            Outbox("memory").queue("p1", **PLACE, body={"text": "hello"})
        finally:
            signals.post_posted.disconnect(sender=Sender, dispatch_uid="test-answer")

        assert (texts("memory"), texts("other")) == (["hello"], ["ack"])

    async def test_a_post_queued_by_an_async_view_is_delivered_after_its_commit(self):
        response = await self.async_client.post("/async/queue/", {"post_id": "p1", "text": "hello"})

        assert response.json() == {"queued": True, "state": "posted"}  # delivered as the queue committed
        assert texts() == ["hello"]


# A pace that keeps posts apart as Slack's one a second per channel does, five times faster.
PACED = {
    **settings.CONNECTOR_OUTBOX,
    "DELIVERY": "immediate",
    "CONNECTORS": {
        **settings.CONNECTOR_OUTBOX["CONNECTORS"],
        "memory": {**settings.CONNECTOR_OUTBOX["CONNECTORS"]["memory"], "PACE": {"container": (1, 0.2)}},
    },
}


class PostedAt:
    """When each post was recorded posted (the pace's real timing: the monotonic clock)."""

    def __init__(self):
        self.at: dict[str, float] = {}

    def __call__(self, *, claim, **kwargs):
        self.at[claim.post_id] = time.monotonic()

    def __enter__(self):
        self.began = time.monotonic()  # before the first claim: each slot is later
        signals.post_posted.connect(self, sender=Sender, dispatch_uid="test-posted-at")
        return self

    def __exit__(self, *exc):
        signals.post_posted.disconnect(sender=Sender, dispatch_uid="test-posted-at")

    def paced(self, every: float) -> bool:
        """Whether the nth post was recorded at least n slots after this block began. (Not the
        gaps between records: a record may come late, under load, and the next at its slot.)"""
        times = sorted(self.at.values())
        return all(at - self.began >= n * every - 0.005 for n, at in enumerate(times))  # stored in us


def queue_three():
    with transaction.atomic():
        for i in range(3):
            Outbox("memory").queue(f"p{i}", **PLACE, body={"text": str(i)})


@override_settings(CONNECTOR_OUTBOX=PACED)
class ImmediatePacedTests(TestCase):
    def test_paced_posts_of_one_transaction_all_go_out_in_order_at_the_pace(self):
        with PostedAt() as posted, self.captureOnCommitCallbacks(execute=True):
            queue_three()  # one commit, and no later one

        assert texts() == ["0", "1", "2"]
        assert posted.paced(0.2), posted.at  # a slot every 0.2 s

    def test_a_retry_is_not_waited_for(self):
        connectors["memory"].fail_next("platform down")

        with self.captureOnCommitCallbacks(execute=True):
            queue_three()

        # The first post waits for its retry, and its container with it: nothing to pace.
        assert texts() == []
        assert [(p.post_id, p.attempts) for p in queued()] == [("p0", 1), ("p1", 0), ("p2", 0)]
        assert delivery.later == set()


# A slot every 0.5 s: the commit's drain would have to stall a whole second (under load) to
# reach the last one, so that it did not wait for it can be told from a slow machine.
SLOW_PACED = {
    **PACED,
    "CONNECTORS": {
        **PACED["CONNECTORS"],
        "memory": {**PACED["CONNECTORS"]["memory"], "PACE": {"container": (1, 0.5)}},
    },
}


@override_settings(CONNECTOR_OUTBOX=SLOW_PACED)
class ImmediatePacedLaterTests(TransactionTestCase):
    def test_paced_posts_beyond_the_wait_go_out_from_a_timer_without_another_commit(self):
        with mock.patch.object(delivery, "PACE_WAIT", 0.0), PostedAt() as posted:
            queue_three()
            assert "2" not in texts()  # the commit's drain did not wait for the last slot
            join_timers()

        assert texts() == ["0", "1", "2"]
        assert posted.paced(0.5), posted.at
        assert [p.post_id for p in queued()] == []


def join_timers(deadline: float = 20.0) -> None:
    """Until no timer of immediate delivery is left (each may start the next one)."""
    end = time.monotonic() + deadline
    while delivery.later:
        assert time.monotonic() < end, f"timers still pending: {delivery.later}"
        for timer in list(delivery.later):
            timer.join(max(end - time.monotonic(), 0))


def test_a_drain_asked_for_while_another_thread_drains_its_source_is_that_drains_next_round(monkeypatch):
    # Two drains of one source at once raced for its head: the loser saw the winner's lease as
    # the head's due time and left a timer for the lease's end (CI's "timers still pending").
    entered, go_on, rounds = threading.Event(), threading.Event(), []

    def run(drain: delivery.Drain) -> None:
        rounds.append(threading.current_thread().name)
        if len(rounds) == 1:
            entered.set()
            assert go_on.wait(10)

    monkeypatch.setattr(delivery.Drain, "_run", run)
    drain = delivery.Drain("memory", "default")
    first = threading.Thread(target=drain, name="first")
    first.start()
    assert entered.wait(10)
    second = threading.Thread(target=drain, name="second")
    second.start()
    second.join(10)  # returns at once: the first drain takes its round

    assert rounds == ["first"]
    go_on.set()
    first.join(10)
    assert rounds == ["first", "first"]
