"""What the sender does with a connector's rate limit whatever its scope says."""

from __future__ import annotations

from datetime import timedelta

import pytest

from django_connector_outbox import Outbox
from django_connector_outbox.connectors import connectors
from django_connector_outbox.connectors.memory import MemoryConnector
from django_connector_outbox.models import Post
from django_connector_outbox.sender import Sender

pytestmark = pytest.mark.django_db


def test_a_rate_limit_of_an_unknown_scope_holds_the_container_and_the_sender_goes_on(clock) -> None:
    outbox = Outbox("memory", clock=clock)
    assert outbox.queue("p1", workspace_id="T1", container_id="C1", body={"text": "p1"})
    clock.advance(0.001)
    assert outbox.queue("p2", workspace_id="T1", container_id="C2", body={"text": "p2"})
    platform: MemoryConnector = connectors["memory"]  # type: ignore[assignment]
    platform.rate_limit_next(30, scope="team")  # a third-party connector's mistake

    # One send at a time: the next send is p1's (two threads could let p2's go first).
    Sender(["memory"], once=True, clock=clock, worker="w1", concurrency=1).run()

    held = Post.objects.with_claim().get(post_id="p1")
    assert (held.current_state, held.current_attempts) == ("queued", 0)
    assert held.last_error == "rate limited (unknown scope 'team': held the container)"
    assert held.next_at == clock.now + timedelta(seconds=30)
    assert [m.post_id for m in platform.messages("C2")] == ["p2"]


def test_a_workspace_rate_limit_holds_its_other_channels_for_every_sender(clock) -> None:
    outbox = Outbox("memory", clock=clock)
    for post_id, workspace, container in (("p1", "T1", "C1"), ("p2", "T1", "C2"), ("p3", "T2", "C3")):
        outbox.queue(post_id, workspace_id=workspace, container_id=container, body={"text": post_id})
        clock.advance(0.001)
    platform: MemoryConnector = connectors["memory"]  # type: ignore[assignment]
    platform.rate_limit_next(30, scope="workspace")

    sender = Sender(["memory"], once=True, clock=clock, worker="w1", concurrency=1)
    sender.run()

    # p1 drew the 429; p2 of the same workspace was never tried; p3 of another one went out.
    assert [p.post_id for p in platform.sent] == ["p1", "p3"]
    assert {p.post_id: p.current_state for p in Post.objects.with_claim()} == {
        "p1": "queued", "p2": "queued", "p3": "posted",
    }  # fmt: skip
    assert sender.stats["held_workspace"] == 1
    Sender(["memory"], once=True, clock=clock, worker="w2").run()  # another sender waits too
    assert len(platform.sent) == 2

    clock.advance(30)
    Sender(["memory"], once=True, clock=clock, worker="w3").run()
    assert sorted(p.post_id for p in platform.sent[2:]) == ["p1", "p2"]


def test_a_success_that_empties_the_bucket_holds_the_channel_until_it_refills(clock) -> None:
    from django_connector_outbox.connectors.base import Delivered, Hold

    outbox = Outbox("memory", clock=clock)
    for n in range(2):
        outbox.queue(f"p{n}", workspace_id="T1", container_id="C1", body={"text": "x"})
        clock.advance(0.001)
    platform: MemoryConnector = connectors["memory"]  # type: ignore[assignment]
    send = platform.send
    platform.send = lambda post: Delivered(send(post).message_ref, Hold(5, "bucket empty"))  # type: ignore[method-assign]

    Sender(["memory"], once=True, clock=clock, worker="w1").run()
    assert [p.post_id for p in platform.sent] == ["p0"]
    clock.advance(5)
    Sender(["memory"], once=True, clock=clock, worker="w1").run()
    assert [p.post_id for p in platform.sent] == ["p0", "p1"]
