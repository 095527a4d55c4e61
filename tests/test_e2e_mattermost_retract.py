"""End to end, in process: `Outbox.retract` of a post the sender posted to the fake Mattermost
queues its delete, which the sender (`outbox_deliver`, on the test's clock) sends as
``DELETE /api/v4/posts/{id}`` in its place in the channel's queue: the post is gone from the
channel, and a post deleted there first makes the delete done (a 404)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from django_connector_outbox import Outbox
from tests.delivering import deliver_all

pytestmark = pytest.mark.django_db

TEAM, CHANNEL = "team", "channelchannelchannelchan1"


@pytest.fixture
def fake(fake_mattermost: Any, settings: Any) -> Any:
    settings.CONNECTOR_OUTBOX = {
        "CONNECTORS": {"mm": fake_mattermost.connector_settings()},
        "RETRY_JITTER": 0,
    }
    return fake_mattermost


def queue(post_id: str) -> None:
    assert Outbox("mm").queue(post_id, workspace_id=TEAM, container_id=CHANNEL, body={"message": post_id})


def test_a_retracted_post_is_deleted_in_its_place_in_the_channels_queue(fake, outbox_deliver, outbox_clock):
    queue("p1")
    assert deliver_all(outbox_deliver, outbox_clock, "mm") == ["p1"]
    queue("before")
    assert Outbox("mm").retract("p1") is True
    queue("after")

    assert deliver_all(outbox_deliver, outbox_clock, "mm") == ["before", "p1:delete", "after"]

    assert [p.message for p in fake.posts(CHANNEL)] == ["before", "after"]
    assert [c.route for c in fake.calls if c.route in ("create_post", "delete_post")] == [
        "create_post",
        "create_post",
        "delete_post",
        "create_post",
    ]
    assert Outbox("mm").find("p1:delete").state == "posted"
    assert Outbox("mm").retract("p1") is False  # idempotent: nothing more queued


def test_a_post_deleted_in_mattermost_first_makes_the_delete_done(fake, outbox_deliver, outbox_clock):
    queue("p1")
    deliver_all(outbox_deliver, outbox_clock, "mm")
    ref = Outbox("mm").find("p1").message_ref
    # Deleted in Mattermost first, by the bot's own token (a person, another integration):
    headers = {"Authorization": f"Bearer {fake.token}"}
    assert httpx.delete(f"{fake.url}/api/v4/posts/{ref}", headers=headers).status_code == 200

    assert Outbox("mm").retract("p1") is True
    assert deliver_all(outbox_deliver, outbox_clock, "mm") == ["p1:delete"]  # the 404: done
    assert Outbox("mm").find("p1:delete").state == "posted"
