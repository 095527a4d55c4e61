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

    Sender(["memory"], once=True, clock=clock, worker="w1").run()

    held = Post.objects.get(post_id="p1")
    assert (held.state, held.attempts) == ("queued", 0)
    assert held.last_error == "rate limited (unknown scope 'team': held the container)"
    assert held.next_at == clock.now + timedelta(seconds=30)
    assert [m.post_id for m in platform.messages("C2")] == ["p2"]
