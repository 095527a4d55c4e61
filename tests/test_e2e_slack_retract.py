"""End to end, in process: `Outbox.retract` of a post the sender posted to the fake Slack queues
its delete, which the sender (`outbox_deliver`, the delivery of ``run_outbox --once``, on the
test's clock, at Slack's default pace) sends as chat.delete: the message is gone from the
channel's history, and the delete went out in its place in the channel's queue, on every
database."""

from __future__ import annotations

from typing import Any

import pytest
from slack_sdk import WebClient

from django_connector_outbox import Outbox
from tests.delivering import deliver_all

pytestmark = pytest.mark.django_db

TEAM, CHANNEL = "T0000000001", "C0000000001"


@pytest.fixture
def fake(fake_slack: Any, settings: Any) -> Any:
    settings.CONNECTOR_OUTBOX = {"CONNECTORS": {"slack": fake_slack.connector_settings()}, "RETRY_JITTER": 0}
    return fake_slack


def queue(post_id: str, **fields: Any) -> None:
    assert Outbox("slack").queue(
        post_id, workspace_id=TEAM, container_id=CHANNEL, body={"text": post_id}, **fields
    )


def slack_calls(fake: Any) -> list[tuple[str, str]]:
    """The writes the fake received, in order: (method, the text posted or the ts deleted)."""
    return [
        (call.method, call.args.get("text") or call.args["ts"])
        for call in fake.calls
        if call.method in ("chat.postMessage", "chat.delete")
    ]


def test_a_retracted_post_is_deleted_from_the_channel_by_the_sender(fake, outbox_deliver, outbox_clock):
    queue("p1")
    queue("p2")
    assert deliver_all(outbox_deliver, outbox_clock, "slack") == ["p1", "p2"]
    ref = Outbox("slack").find("p1").message_ref
    assert [m.text for m in fake.messages(CHANNEL)] == ["p1", "p2"]

    assert Outbox("slack").retract("p1") is True
    assert deliver_all(outbox_deliver, outbox_clock, "slack") == ["p1:delete"]

    assert [m.text for m in fake.messages(CHANNEL)] == ["p2"]
    assert fake.calls_of("chat.delete") == [{"channel": CHANNEL, "ts": ref.split(":")[1]}]
    assert Outbox("slack").find("p1:delete").state == "posted"
    assert Outbox("slack").find("p1").state == "posted"  # the post itself stays as it ended
    assert Outbox("slack").retract("p1") is False  # idempotent: nothing more queued
    assert deliver_all(outbox_deliver, outbox_clock, "slack") == []


def test_a_retract_keeps_its_place_in_the_channels_queue(fake, outbox_deliver, outbox_clock):
    queue("p1")
    assert deliver_all(outbox_deliver, outbox_clock, "slack") == ["p1"]
    p1_ts = Outbox("slack").find("p1").message_ref.split(":")[1]
    queue("before")  # queued before the retract: sent before the delete

    assert Outbox("slack").retract("p1") is True
    queue("after")  # queued after it: sent after the delete

    assert deliver_all(outbox_deliver, outbox_clock, "slack") == ["before", "p1:delete", "after"]
    assert slack_calls(fake) == [
        ("chat.postMessage", "p1"),
        ("chat.postMessage", "before"),
        ("chat.delete", p1_ts),
        ("chat.postMessage", "after"),
    ]
    assert [m.text for m in fake.messages(CHANNEL)] == ["before", "after"]


def test_a_reply_retracted_leaves_its_thread(fake, outbox_deliver, outbox_clock):
    queue("parent")
    queue("reply", thread_of="parent")
    assert deliver_all(outbox_deliver, outbox_clock, "slack") == ["parent", "reply"]
    parent_ts = Outbox("slack").find("parent").message_ref.split(":")[1]
    assert [m.text for m in fake.messages(CHANNEL, thread_ts=parent_ts)] == ["reply"]

    assert Outbox("slack").retract("reply") is True
    assert deliver_all(outbox_deliver, outbox_clock, "slack") == ["reply:delete"]

    assert fake.messages(CHANNEL, thread_ts=parent_ts) == []
    assert [m.text for m in fake.messages(CHANNEL)] == ["parent"]


def test_a_message_deleted_by_a_person_first_makes_the_delete_done(fake, outbox_deliver, outbox_clock):
    queue("p1")
    deliver_all(outbox_deliver, outbox_clock, "slack")
    channel, _, ts = Outbox("slack").find("p1").message_ref.partition(":")
    # Deleted in Slack first (by a person, another app of the workspace's):
    WebClient(token=fake.token, base_url=fake.base_url, retry_handlers=[]).chat_delete(channel=channel, ts=ts)

    assert Outbox("slack").retract("p1") is True
    assert deliver_all(outbox_deliver, outbox_clock, "slack") == ["p1:delete"]  # message_not_found: done
    assert Outbox("slack").find("p1:delete").state == "posted"
