"""End to end, in process: `Outbox.retract` of a post the sender posted to the fake Telegram
queues its delete, which the sender (`outbox_deliver`, on the test's clock) sends as
``deleteMessage`` in its place in the chat's queue: the message is gone from the chat, a
message deleted there first makes the delete done ("message to delete not found"), and one
too old to delete fails the delete with Telegram's reason."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from django_connector_outbox import Outbox
from django_connector_outbox.models import Post
from tests.delivering import deliver_all

pytestmark = pytest.mark.django_db

BOT, CHAT = "outbox_bot", "1001"


@pytest.fixture
def fake(fake_telegram: Any, settings: Any) -> Any:
    settings.CONNECTOR_OUTBOX = {
        "CONNECTORS": {"telegram": fake_telegram.connector_settings()},
        "RETRY_JITTER": 0,
    }
    return fake_telegram


def queue(post_id: str) -> None:
    assert Outbox("telegram").queue(post_id, workspace_id=BOT, container_id=CHAT, body={"text": post_id})


def texts(fake: Any) -> list[str]:
    return [m.text for m in fake.messages(int(CHAT))]


def test_a_retracted_post_is_deleted_in_its_place_in_the_chats_queue(fake, outbox_deliver, outbox_clock):
    queue("p1")
    assert deliver_all(outbox_deliver, outbox_clock, "telegram") == ["p1"]
    queue("before")
    assert Outbox("telegram").retract("p1") is True
    queue("after")

    assert deliver_all(outbox_deliver, outbox_clock, "telegram") == ["before", "p1:delete", "after"]

    assert texts(fake) == ["before", "after"]
    writes = ("sendMessage", "deleteMessage")
    assert [c.method for c in fake.calls if c.method in writes] == [
        "sendMessage",
        "sendMessage",
        "deleteMessage",
        "sendMessage",
    ]
    assert fake.calls_of("deleteMessage")[0].args == {"chat_id": int(CHAT), "message_id": 1}
    assert Outbox("telegram").find("p1:delete").state == "posted"
    assert Outbox("telegram").retract("p1") is False  # idempotent: nothing more queued


def test_a_message_deleted_in_telegram_first_makes_the_delete_done(fake, outbox_deliver, outbox_clock):
    queue("p1")
    deliver_all(outbox_deliver, outbox_clock, "telegram")
    chat, _, message_id = Outbox("telegram").find("p1").message_ref.partition(":")
    # Deleted in Telegram first (by a person, another client of the bot's):
    url = f"{fake.base_url}/bot{fake.token}/deleteMessage"
    assert (
        httpx.post(url, json={"chat_id": int(chat), "message_id": int(message_id)}).json()["result"] is True
    )

    assert Outbox("telegram").retract("p1") is True
    assert deliver_all(outbox_deliver, outbox_clock, "telegram") == ["p1:delete"]  # "not found": done
    assert Outbox("telegram").find("p1:delete").state == "posted"


def test_a_message_too_old_to_delete_fails_its_delete_with_telegrams_reason(
    fake, outbox_deliver, outbox_clock
):
    queue("p1")
    deliver_all(outbox_deliver, outbox_clock, "telegram")
    now = fake.clock()
    fake.clock = lambda: now + 49 * 3600  # two days later, by Telegram's clock

    assert Outbox("telegram").retract("p1") is True
    assert deliver_all(outbox_deliver, outbox_clock, "telegram") == []

    [delete] = Post.objects.filter(source="telegram", post_id="p1:delete")
    assert delete.state == "failed"
    assert "message can't be deleted" in delete.last_error
    assert texts(fake) == ["p1"]
