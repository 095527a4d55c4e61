"""The sender and replies queued with `thread_of`: each goes into its parent's thread, resolved
when it is sent; a parent without a message fails its replies, naming it; a reply that lost its
reply is looked up in the thread it was resolved into."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from django_connector_outbox import Outbox
from django_connector_outbox.connectors import connectors
from django_connector_outbox.connectors.memory import MemoryConnector
from django_connector_outbox.models import Post
from django_connector_outbox.posts import ClaimedPost, Parent
from django_connector_outbox.sender import Sender
from django_connector_outbox.testing import deliver_due, queued

pytestmark = pytest.mark.django_db

LEASE = 120


class ThreadlessConnector(MemoryConnector):
    """A connector with a bug: reply_thread raises, or gives no thread id."""

    answer: Any = RuntimeError("thread lookup failed")

    def reply_thread(self, parent: Parent) -> str:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer  # type: ignore[no-any-return]


@pytest.fixture
def outbox(clock):
    return Outbox("memory", clock=clock)


@pytest.fixture
def platform() -> MemoryConnector:
    return connectors["memory"]  # type: ignore[return-value]


def run(clock) -> Sender:
    sender = Sender(["memory"], once=True, clock=clock, worker="w1")
    sender.run()
    return sender


def post(post_id: str, **fields: Any) -> dict[str, Any]:
    return {
        "post_id": post_id,
        "workspace_id": "T1",
        "container_id": "C1",
        "body": {"text": post_id},
    } | fields


def state(post_id: str) -> tuple[str, str]:
    p = Post.objects.with_claim().get(post_id=post_id)
    return p.current_state, p.last_error


def test_a_reply_goes_into_its_parents_thread_after_it(outbox, platform, clock):
    outbox.queue_many([post("p1"), post("r1", thread_of="p1"), post("r2", thread_of="p1")])

    run(clock)

    p1, r1, r2 = platform.messages("C1")
    assert [m.post_id for m in (p1, r1, r2)] == ["p1", "r1", "r2"]
    assert (p1.thread_id, r1.thread_id, r2.thread_id) == ("", p1.ref, p1.ref)
    # The thread it went into is kept on its row (the admin shows it).
    assert Post.objects.get(post_id="r1").thread_id == p1.ref


def test_a_reply_to_a_reply_goes_into_the_same_thread(outbox, platform, clock):
    outbox.queue_many([post("p1"), post("r1", thread_of="p1"), post("r2", thread_of="r1")])

    run(clock)

    p1, r1, r2 = platform.messages("C1")
    assert r2.thread_id == r1.thread_id == p1.ref


def test_a_status_reply_is_edited_in_its_thread(outbox, platform, clock):
    outbox.queue(**post("p1"))
    outbox.set_status("s1", workspace_id="T1", container_id="C1", body={"text": "working"}, thread_of="p1")
    run(clock)
    outbox.set_status("s1", workspace_id="T1", container_id="C1", body={"text": "done"}, thread_of="p1")
    run(clock)

    p1, s1 = platform.messages("C1")
    assert (s1.thread_id, s1.body, s1.edits) == (p1.ref, {"text": "done"}, 1)


@pytest.mark.parametrize(
    ("end", "reason"),
    [
        ("failed", "its thread's parent p1 ended without a message (failed)"),
        ("cancelled", "its thread's parent p1 ended without a message (cancelled)"),
        ("uncertain", "its thread's parent p1 ended without a message (uncertain)"),
        ("posted", "its thread's parent p1 was posted without a message id to reply to"),
    ],
)
def test_a_parent_without_a_message_fails_its_replies_at_once_naming_it(outbox, platform, clock, end, reason):
    outbox.queue_many([post("p1"), post("r1", thread_of="p1"), post("r2", thread_of="r1"), post("later")])
    if end == "cancelled":
        outbox.cancel_queued("p1")
    else:
        [claim] = outbox.claim()
        if end == "posted":  # a platform that gave no id (a webhook without one)
            outbox.posted(claim, None)
        else:
            outbox.settle(claim, end, "channel_not_found")

    run(clock)

    assert state("r1") == ("failed", reason)
    assert state("r2") == ("failed", "its thread's parent r1 ended without a message (failed)")
    assert [m.post_id for m in platform.messages("C1")] == ["later"]
    assert [p.post_id for p in platform.sent] == ["later"]  # no reply was ever handed to send


def test_a_parent_pruned_before_its_delayed_reply_fails_it_naming_it(outbox, platform, clock):
    outbox.queue_many([post("p1"), post("r1", thread_of="p1", delay=10 * 24 * 3600)])
    run(clock)
    clock.advance(8 * 24 * 3600)
    assert outbox.prune_finished() == 1
    clock.advance(2 * 24 * 3600)

    run(clock)

    assert state("r1") == ("failed", "its thread's parent p1 is gone (pruned before it was sent)")


def test_a_parent_requeued_behind_its_reply_fails_the_reply_rather_than_sending_it_outside(
    outbox, platform, clock
):
    outbox.set_status("s1", workspace_id="T1", container_id="C1", body={"text": "1"})
    outbox.queue(**post("r1", thread_of="s1"))
    [claim] = outbox.claim()
    outbox.settle(claim, "failed", "boom")
    clock.advance(1)
    # The failed status set again: it rejoins the back of the queue, behind its reply.
    outbox.set_status("s1", workspace_id="T1", container_id="C1", body={"text": "2"})

    run(clock)

    assert state("r1") == (
        "failed",
        "its thread's parent s1 has no message yet: it went back behind it in the queue (queued)",
    )
    assert [m.post_id for m in platform.messages("C1")] == ["s1"]


def test_a_stale_reply_is_looked_up_in_the_thread_it_was_resolved_into(outbox, platform, clock):
    outbox.queue_many([post("p1"), post("r1", thread_of="p1")])
    run(clock)  # p1 posted; r1 sent, its reply lost
    assert state("p1")[0] == "posted"
    outbox.queue(**post("r2", thread_of="p1"))
    platform.lose_next_reply()
    run(clock)
    assert state("r2")[0] == "sending"
    clock.advance(LEASE)

    run(clock)

    # Found where it was sent (the memory platform looks in the post's thread only): not twice.
    assert [m.post_id for m in platform.messages("C1")] == ["p1", "r1", "r2"]
    [lookup] = [p for p in platform.sent if p.post_id == "r2"]
    assert state("r2")[0] == "posted"
    assert Post.objects.get(post_id="r2").thread_id == platform.messages("C1")[0].ref == lookup.thread_id


def test_an_exception_from_reply_thread_is_a_retry(outbox, clock):
    with override_settings(
        CONNECTOR_OUTBOX={
            **settings.CONNECTOR_OUTBOX,
            "CONNECTORS": {"memory": {"BACKEND": f"{__name__}.ThreadlessConnector"}},
        }
    ):
        outbox.queue_many([post("p1"), post("r1", thread_of="p1")])
        run(clock)
        p = Post.objects.get(post_id="r1")
        assert (p.state, p.attempts, p.last_error) == (
            "queued",
            1,
            "reply_thread raised RuntimeError('thread lookup failed')",
        )

        ThreadlessConnector.answer = ""
        try:
            clock.advance(60)
            run(clock)
        finally:
            ThreadlessConnector.answer = RuntimeError("thread lookup failed")
        p = Post.objects.get(post_id="r1")
        assert (p.state, p.attempts, p.last_error) == (
            "queued",
            2,
            "reply_thread of p1: the thread id must not be empty",
        )
        assert [m.post_id for m in connectors["memory"].messages("C1")] == ["p1"]  # type: ignore[attr-defined]


def test_testing_shows_the_parent_of_a_queued_reply_and_the_thread_a_delivered_one_went_into(outbox, clock):
    outbox.queue_many([post("p1"), post("r1", thread_of="p1")])
    assert [(q.post_id, q.thread_of, q.thread_id) for q in queued("memory")] == [
        ("p1", None, ""),
        ("r1", "p1", ""),
    ]

    delivered = deliver_due("memory", clock=clock)["memory"]

    p1, r1 = delivered
    assert (p1.thread_of, r1.thread_of, r1.thread_id) == (None, "p1", p1.message_ref)


def test_the_posted_signal_of_a_reply_carries_its_resolved_thread(outbox, platform, clock):
    from django_connector_outbox import signals

    seen: list[ClaimedPost] = []

    def receiver(sender: Any, *, claim: ClaimedPost, **kwargs: Any) -> None:
        seen.append(claim)

    signals.post_posted.connect(receiver, weak=False)
    try:
        outbox.queue_many([post("p1"), post("r1", thread_of="p1")])
        run(clock)
    finally:
        signals.post_posted.disconnect(receiver)

    p1, r1 = platform.messages("C1")
    assert [(c.post_id, c.thread_id) for c in seen] == [("p1", ""), ("r1", p1.ref)]
