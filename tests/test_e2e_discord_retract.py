"""End to end, in process: `Outbox.retract` of a post the sender posted to the fake Discord
queues its delete, which the sender (`outbox_deliver`, on the test's clock) sends as
``DELETE /channels/{channel}/messages/{id}`` in its place in the channel's queue: the message is
gone from the channel (a reply's from its thread), and a message deleted there first makes the
delete done (a 10008 Unknown Message)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from django_connector_outbox import Outbox
from tests.delivering import deliver_all

pytestmark = pytest.mark.django_db

GUILD, CHANNEL = "900000000000000001", "111111111111111111"


@pytest.fixture
def fake(fake_discord: Any, settings: Any) -> Any:
    settings.CONNECTOR_OUTBOX = {
        "CONNECTORS": {"discord": fake_discord.connector_settings()},
        "RETRY_JITTER": 0,
    }
    return fake_discord


def queue(post_id: str, **fields: Any) -> None:
    assert Outbox("discord").queue(
        post_id, workspace_id=GUILD, container_id=CHANNEL, body={"content": post_id}, **fields
    )


def test_a_retracted_post_is_deleted_in_its_place_in_the_channels_queue(fake, outbox_deliver, outbox_clock):
    queue("p1")
    assert deliver_all(outbox_deliver, outbox_clock, "discord") == ["p1"]
    ref = Outbox("discord").find("p1").message_ref
    queue("before")
    assert Outbox("discord").retract("p1") is True
    queue("after")

    assert deliver_all(outbox_deliver, outbox_clock, "discord") == ["before", "p1:delete", "after"]

    assert [m.content for m in fake.messages(CHANNEL)] == ["before", "after"]
    assert [c.route for c in fake.calls if c.route in ("create_message", "delete_message")] == [
        "create_message",
        "create_message",
        "delete_message",
        "create_message",
    ]
    assert fake.calls_of("delete_message")[0].path.endswith(f"/channels/{CHANNEL}/messages/{ref}")
    assert Outbox("discord").find("p1:delete").state == "posted"
    assert Outbox("discord").retract("p1") is False  # idempotent: nothing more queued


def test_a_reply_retracted_is_deleted_from_its_thread(fake, outbox_deliver, outbox_clock):
    queue("parent")
    queue("reply", thread_of="parent")
    assert deliver_all(outbox_deliver, outbox_clock, "discord") == ["parent", "reply"]
    thread = Outbox("discord").find("parent").message_ref  # the thread started from it has its id
    assert [m.content for m in fake.messages(thread)] == ["reply"]

    assert Outbox("discord").retract("reply") is True
    assert deliver_all(outbox_deliver, outbox_clock, "discord") == ["reply:delete"]

    assert fake.messages(thread) == []
    assert [m.content for m in fake.messages(CHANNEL)] == ["parent"]
    assert fake.calls_of("delete_message")[0].path.startswith(f"/api/v10/channels/{thread}/messages/")


def test_a_message_deleted_in_discord_first_makes_the_delete_done(fake, outbox_deliver, outbox_clock):
    queue("p1")
    deliver_all(outbox_deliver, outbox_clock, "discord")
    ref = Outbox("discord").find("p1").message_ref
    # Deleted in Discord first, by the bot's own token (a person, another integration):
    headers = {"Authorization": f"Bot {fake.token}"}
    url = f"{fake.base_url}/channels/{CHANNEL}/messages/{ref}"
    assert httpx.delete(url, headers=headers).status_code == 204

    assert Outbox("discord").retract("p1") is True
    assert deliver_all(outbox_deliver, outbox_clock, "discord") == ["p1:delete"]  # the 10008: done
    assert Outbox("discord").find("p1:delete").state == "posted"
    assert fake.messages(CHANNEL) == []
