"""Replies queued with `thread_of`, through the Outbox, the sender and the real Slack and Discord
connectors to their fakes: each reply lands in its parent's thread, after its parent; a reply
to a reply in the same thread; a reply whose reply was lost is looked up in that thread and is
never posted twice; a parent that failed fails its replies, and no request is made for them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings

from django_connector_outbox import Outbox
from django_connector_outbox.connectors import connectors
from django_connector_outbox.fakes import discord as fd
from django_connector_outbox.fakes import slack as fs
from django_connector_outbox.fakes import webhook as fw
from django_connector_outbox.models import Post
from django_connector_outbox.sender import Sender

pytestmark = pytest.mark.django_db

LEASE = 120
SLACK_TOKEN = "xoxb-thread-test-token"
DISCORD_TOKEN = "MTIz.thread-test-token.XyZ"
TEAM = "T0000000001"
CHANNEL = "C0000000001"
GUILD = "900000000000000001"
DISCORD_CHANNEL = "111111111111111111"


def configured(source: str, backend: str, token: str, base_url: str) -> Any:
    options = {"token": token, "base_url": base_url, "timeout": 2}
    connector = {"BACKEND": backend, "OPTIONS": options, "PACE": {}}  # the fake clock does not move
    return override_settings(
        CONNECTOR_OUTBOX={**settings.CONNECTOR_OUTBOX, "CONNECTORS": {source: connector}}
    )


def run(source: str, clock: Any) -> None:
    Sender([source], once=True, clock=clock, worker="w1").run()


def state(post_id: str) -> tuple[str, str]:
    p = Post.objects.with_claim().get(post_id=post_id)
    return p.current_state, p.last_error


# -- Slack ------------------------------------------------------------------------------------


@pytest.fixture
def slack(monkeypatch: pytest.MonkeyPatch, clock: Any) -> Iterator[fs.FakeSlack]:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    # Slack's clock is the outbox's (a lookup reads a window around the claim's time).
    server = fs.FakeSlack(
        SLACK_TOKEN, channels=(CHANNEL,), team_id=TEAM, clock=lambda: clock().timestamp()
    ).start()
    backend = "django_connector_outbox.connectors.slack.SlackConnector"
    with configured("slack", backend, SLACK_TOKEN, server.base_url):
        yield server
    server.stop()


def slack_post(post_id: str, **fields: Any) -> dict[str, Any]:
    return {
        "post_id": post_id,
        "workspace_id": TEAM,
        "container_id": CHANNEL,
        "body": {"text": post_id},
    } | fields


def slack_post_id(message: fs.Message) -> str:
    return message.metadata["event_payload"]["post_id"]  # type: ignore[index]


def test_slack_replies_go_into_the_parents_thread(slack, clock):
    outbox = Outbox("slack", clock=clock)
    outbox.queue_many([slack_post("p1"), slack_post("r1", thread_of="p1"), slack_post("r2", thread_of="r1")])

    run("slack", clock)

    [parent] = slack.messages(CHANNEL)
    assert slack_post_id(parent) == "p1"
    # The reply to the reply goes into the same thread: Slack threads are one level deep.
    assert [slack_post_id(m) for m in slack.messages(CHANNEL, thread_ts=parent.ts)] == ["r1", "r2"]
    assert [c.get("thread_ts") for c in slack.calls_of("chat.postMessage")] == [None, parent.ts, parent.ts]
    assert Post.objects.get(post_id="r2").thread_id == parent.ts


def test_a_slack_reply_whose_reply_was_lost_is_found_in_its_thread(slack, clock):
    outbox = Outbox("slack", clock=clock)
    outbox.queue_many([slack_post("p1"), slack_post("r1", thread_of="p1")])
    slack.script("chat.postMessage", fs.ok(), fs.drop())  # r1 reaches Slack; its reply is lost

    run("slack", clock)
    assert state("r1")[0] == "sending"
    clock.advance(LEASE)
    run("slack", clock)

    [parent] = slack.messages(CHANNEL)
    [reply] = slack.messages(CHANNEL, thread_ts=parent.ts)
    assert slack_post_id(reply) == "r1"
    assert [c["ts"] for c in slack.calls_of("conversations.replies")] == [parent.ts]
    assert len(slack.calls_of("chat.postMessage")) == 2  # looked up, not sent again
    p = Post.objects.get(post_id="r1")
    assert (p.state, p.message_ref, p.thread_id) == ("posted", f"{CHANNEL}:{reply.ts}", parent.ts)


def test_a_slack_parent_that_failed_fails_its_replies_without_a_request(slack, clock):
    outbox = Outbox("slack", clock=clock)
    outbox.queue_many([slack_post("p1"), slack_post("r1", thread_of="p1")])
    slack.script("chat.postMessage", fs.error("msg_too_long"))

    run("slack", clock)

    assert state("p1")[0] == "failed"
    assert state("r1") == ("failed", "its thread's parent p1 ended without a message (failed)")
    assert len(slack.calls_of("chat.postMessage")) == 1


# -- Discord ----------------------------------------------------------------------------------


@pytest.fixture
def discord() -> Iterator[fd.FakeDiscord]:
    backend = "django_connector_outbox.connectors.discord.DiscordConnector"
    with (
        fd.running(token=DISCORD_TOKEN, channels=(DISCORD_CHANNEL,)) as server,
        configured("discord", backend, DISCORD_TOKEN, server.base_url),
    ):
        yield server


def discord_post(post_id: str, **fields: Any) -> dict[str, Any]:
    body = {"content": post_id} | fields.pop("body", {})
    return {"post_id": post_id, "workspace_id": GUILD, "container_id": DISCORD_CHANNEL, "body": body} | fields


def test_discord_replies_go_into_a_thread_started_once_from_the_parent(discord, clock):
    outbox = Outbox("discord", clock=clock)
    outbox.queue_many(
        [
            discord_post("p1"),
            discord_post("r1", thread_of="p1", body={"thread_name": "Deploy 42"}),
            discord_post("r2", thread_of="r1"),
        ]
    )

    run("discord", clock)

    [parent] = discord.messages(DISCORD_CHANNEL)
    assert parent.content == "p1"
    # The thread has the parent message's id; the thread_name is the thread's, not the message's.
    assert discord.threads() == {parent.id: (DISCORD_CHANNEL, "Deploy 42")}
    assert [(m.content, "thread_name" in m.content) for m in discord.messages(parent.id)] == [
        ("r1", False),
        ("r2", False),
    ]
    assert len(discord.calls_of("start_thread_from_message")) == 1
    assert Post.objects.get(post_id="r2").thread_id == parent.id


def test_a_discord_thread_started_before_a_restart_is_found_started(discord, clock):
    outbox = Outbox("discord", clock=clock)
    outbox.queue_many([discord_post("p1"), discord_post("r1", thread_of="p1")])
    run("discord", clock)
    connectors.reset()  # a new sender process: it does not remember the thread
    outbox.queue(**discord_post("r2", thread_of="p1"))

    run("discord", clock)

    [parent] = discord.messages(DISCORD_CHANNEL)
    assert [m.content for m in discord.messages(parent.id)] == ["r1", "r2"]
    starts = discord.calls_of("start_thread_from_message")
    assert len(starts) == 2 and discord.threads() == {parent.id: (DISCORD_CHANNEL, "p1")}


def test_a_discord_reply_whose_reply_was_lost_is_found_in_its_thread(discord, clock):
    outbox = Outbox("discord", clock=clock)
    outbox.queue_many([discord_post("p1"), discord_post("r1", thread_of="p1")])
    discord.script("create_message", fd.passthrough(), fd.drop())

    run("discord", clock)
    assert state("r1")[0] == "sending"
    clock.advance(LEASE)
    run("discord", clock)

    [parent] = discord.messages(DISCORD_CHANNEL)
    [reply] = discord.messages(parent.id)
    assert reply.content == "r1"
    assert len(discord.calls_of("create_message")) == 2  # looked up in the thread, not sent again
    assert {c.path.split("/")[4] for c in discord.calls_of("get_channel_messages")} == {parent.id}
    assert (Post.objects.get(post_id="r1").state, Post.objects.get(post_id="r1").message_ref) == (
        "posted",
        reply.id,
    )


def test_a_discord_parent_that_was_deleted_fails_the_reply_naming_it(discord, clock):
    outbox = Outbox("discord", clock=clock)
    outbox.queue_many([discord_post("p1"), discord_post("r1", thread_of="p1")])
    discord.script("start_thread_from_message", fd.error(10008, "Unknown Message", 404))

    run("discord", clock)

    assert state("r1") == ("failed", "discord thread of p1: discord 10008 Unknown Message")
    assert [m.content for m in discord.messages(DISCORD_CHANNEL)] == ["p1"]


# -- reply_thread alone -----------------------------------------------------------------------


def test_slack_reply_thread_is_the_parents_thread_else_its_ts():
    from django_connector_outbox.connectors.slack import SlackConnector
    from django_connector_outbox.posts import Parent

    connector = SlackConnector(source="slack", token=SLACK_TOKEN)
    assert connector.reply_thread(Parent("p1", "posted", f"{CHANNEL}:1700000000.000100", "")) == (
        "1700000000.000100"
    )
    assert connector.reply_thread(
        Parent("r1", "posted", f"{CHANNEL}:1700000001.000200", "1700000000.000100")
    ) == ("1700000000.000100")
    with pytest.raises(ValueError, match="not a Slack message ref"):
        connector.reply_thread(Parent("p1", "posted", "garbage", ""))


# -- webhook ----------------------------------------------------------------------------------


def webhook(fake: fw.FakeWebhook) -> Any:
    backend = "django_connector_outbox.connectors.webhook.WebhookConnector"
    options = {"url": fake.url, "secret": "whsec-thread", "timeout": 2}
    return override_settings(
        CONNECTOR_OUTBOX={
            **settings.CONNECTOR_OUTBOX,
            "CONNECTORS": {"hook": {"BACKEND": backend, "OPTIONS": options}},
        }
    )


def hook_post(post_id: str, **fields: Any) -> dict[str, Any]:
    return {
        "post_id": post_id,
        "workspace_id": "W",
        "container_id": "orders",
        "body": {"n": post_id},
    } | fields


def test_a_webhook_reply_carries_its_parent_in_its_signed_json(clock):
    with fw.running(secret="whsec-thread") as fake, webhook(fake):
        Outbox("hook", clock=clock).queue_many(
            [hook_post("p1"), hook_post("r1", thread_of="p1"), hook_post("r2", thread_of="r1")]
        )
        run("hook", clock)

    p1, r1, r2 = fake.deliveries
    assert p1.body == {"n": "p1"}
    assert r1.body == {"n": "r1", "thread_of": {"post_id": "p1", "message_ref": p1.id, "thread_id": p1.id}}
    # A reply to a reply: its thread is its parent's.
    assert r2.body == {"n": "r2", "thread_of": {"post_id": "r1", "message_ref": r1.id, "thread_id": p1.id}}
    assert [c.headers.get("x-outbox-thread-of") for c in fake.calls_of("deliver")] == [None, "p1", "r1"]


def test_a_webhook_parent_without_an_id_fails_its_replies(clock):
    with fw.running(reply_with_id=False) as fake, webhook(fake):
        Outbox("hook", clock=clock).queue_many([hook_post("p1"), hook_post("r1", thread_of="p1")])
        run("hook", clock)

    assert [d.post_id for d in fake.deliveries] == ["p1"]
    assert state("r1") == ("failed", "its thread's parent p1 was posted without a message id to reply to")
