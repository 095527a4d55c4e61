"""post_sent: the duration of each send call, for timing only; a receiver's error changes nothing."""

from __future__ import annotations

from typing import Any

import pytest

from django_connector_outbox import Outbox, signals
from django_connector_outbox.connectors import connectors
from django_connector_outbox.sender import Sender

pytestmark = pytest.mark.django_db


@pytest.fixture
def outbox(clock):
    assert Outbox("memory", clock=clock).queue(
        "p1", workspace_id="T1", container_id="C1", body={"text": "hi"}
    )
    return Outbox("memory", clock=clock)


def test_each_send_call_is_announced_with_its_duration(outbox, clock):
    seen: list[tuple[Any, str, float]] = []

    def timed(sender: Any, *, claim: Any, duration: float, **kwargs: Any) -> None:
        seen.append((sender, claim.post_id, duration))

    signals.post_sent.connect(timed)
    try:
        Sender(["memory"], once=True, clock=clock).run()
    finally:
        signals.post_sent.disconnect(timed)
    [(sender, post_id, duration)] = seen
    assert (sender, post_id) == (Sender, "p1")
    assert 0 <= duration < 10


def test_a_post_sent_receiver_that_raises_is_logged_and_the_post_is_still_posted(outbox, clock, package_log):
    def broken(**kwargs: Any) -> None:
        raise RuntimeError("receiver bug")

    signals.post_sent.connect(broken)
    try:
        Sender(["memory"], once=True, clock=clock).run()
    finally:
        signals.post_sent.disconnect(broken)
    assert outbox.find("p1").state == "posted"
    assert len(connectors["memory"].sent) == 1  # sent once, not retried
    assert "post_sent receiver raised post_id=p1 error=RuntimeError('receiver bug')" in package_log.messages
