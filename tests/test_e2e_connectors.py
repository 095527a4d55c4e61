"""End to end, per platform: a real `python -m django run_outbox` process against a fake platform.

Each test starts the platform's fake (django_connector_outbox/fakes/) in this process, on 127.0.0.1, and one sender
process (tests/proof_connectors.Senders) whose connector points at it; the test queues posts
through the public `Outbox` API and reads what happened from the fake's recorded requests and
stored messages, and from the database. Waits are bounded polls of observable state (the
database), never sleeps standing in for an event.

What each platform test drives through the sender, phase by phase:

1. a mixed batch in two channels (messages, a status, a reaction on a person's message) and
   two failing sends: delivered in queue order per channel, each exactly once;
2. the status set twice more in one transaction: one edit, to the latest text, in place;
3. a lost reply (the fake stores the post, then drops the connection): after the LEASE the
   post is claimed back stale, found in the platform's history, and ends `posted` with the
   ref of the one copy the platform holds; the next post of the channel waits for it;
4. a 429 with Retry-After: 1: the post is held (its attempt given back) for that second, then
   delivered once; the channel's next post waits behind it;
5. secrets: the failures' reasons name the platform's error, and no token or signing secret is
   in any row, in the sender's log (at -v 2) or in the admin's page of a failed post.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from django.db import transaction
from django.test import override_settings
from django.urls import reverse

from django_connector_outbox import Outbox
from django_connector_outbox.connectors.discord import nonce_for
from django_connector_outbox.fakes import discord as fd
from django_connector_outbox.fakes import slack as fs
from django_connector_outbox.fakes import webhook as fw
from django_connector_outbox.models import Lane, Post
from tests.proof_connectors import SenderProcess, Senders

pytestmark = [pytest.mark.budget, pytest.mark.django_db(transaction=True)]

# LEASE must be longer than the connectors' longest delivery, a lookup of several pages and a
# send (system check E009: Discord's is 8 requests of 0.25 s), and short, since a lost reply is looked
# up only once the lease has run out. The fakes answer at once: a short timeout is plenty.
LEASE = 2.5
TIMEOUT = 0.25
OUTBOX = {"LEASE": LEASE, "POLL_INTERVAL": 0.2, "RETRY_JITTER": 0}
WAIT = 15.0  # seconds any one phase may take before the test gives up

SLACK_TOKEN = "xoxb-e2e-SLACK-TOKEN-4f1c9a7d"
SLACK_WRONG_TOKEN = "xoxb-e2e-WRONG-TOKEN-b83e2265"
DISCORD_TOKEN = "e2e-DISCORD-TOKEN.Gx71Qz.kd93hs0"
DISCORD_WRONG_TOKEN = "e2e-DISCORD-WRONG.Jv27Lp.aa01zz9"
HOOK_TOKEN = "e2e-HOOK-BEARER-c4a1d0e9"
HOOK_SECRET = "e2e-HOOK-SIGNING-SECRET-71be"
HOOK_WRONG_SECRET = "e2e-HOOK-WRONG-SECRET-0d5f"


# -- helpers ------------------------------------------------------------------------------------


def row(source: str, post_id: str) -> Post:
    return Post.objects.get(source=source, post_id=post_id)


def wait_until(
    condition: Callable[[], bool], what: str, sender: SenderProcess, timeout: float = WAIT
) -> None:
    """Poll the database (there is no event for "the sender recorded it") until `condition`."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            rows = list(
                Post.objects.with_claim().values_list(
                    "source", "post_id", "current_state", "current_attempts", "last_error"
                )
            )
            raise AssertionError(f"timed out waiting for {what}; posts: {rows}\n{sender.stderr}")
        assert sender.alive(), f"the sender exited while waiting for {what}\n{sender.stderr}"
        time.sleep(0.02)


def finished(source: str, post_ids: Iterable[str]) -> Callable[[], bool]:
    ids = list(post_ids)

    def check() -> bool:
        unfinished = Post.objects.filter(source=source, post_id__in=ids).in_states(("queued", "sending"))
        return not unfinished.exists()

    return check


def wait_until_held(source: str, post_id: str, behind: str, sender: SenderProcess) -> None:
    """Wait until a rate-limited post is back in the queue, then check it and the post behind it.

    Both rows come from one query, so the check sees them at one moment of the one-second hold.
    """
    snapshot: dict[str, Post] = {}

    def check() -> bool:
        both = Post.objects.with_claim().filter(source=source, post_id__in=[post_id, behind])
        snapshot.update((p.post_id, p) for p in both)
        post = snapshot.get(post_id)
        return post is not None and post.current_state == "queued" and "429" in post.last_error

    wait_until(check, f"{post_id} to be held after a 429", sender)
    post, later = snapshot[post_id], snapshot[behind]
    assert post.current_attempts == 0, "a rate-limited try spent an attempt"
    waited = (post.next_at - post.updated_at).total_seconds()
    assert 0.99 <= waited <= 1.01, f"held for {waited}s, not the Retry-After of 1s"
    assert (later.current_state, later.current_attempts) == ("queued", 0), (
        "the next post did not wait behind the held one"
    )


def queue_all(outbox: Outbox, posts: list[dict[str, Any]]) -> None:
    """Queue in one transaction, so the sender sees the whole batch at once; statuses by set_status."""
    with transaction.atomic():
        for post in posts:
            if post.get("kind") == "status":
                outbox.set_status(**{k: v for k, v in post.items() if k != "kind"})
            else:
                outbox.queue(**post)


def queue_order(source: str, container: str) -> list[str]:
    return list(
        Post.objects.filter(source=source, container_id=container)
        .order_by("queued_at", "post_id")
        .values_list("post_id", flat=True)
    )


def assert_no_secrets(secrets: Iterable[str], sender: SenderProcess, admin_client: Any) -> None:
    """No secret in any row, in the sender's log, or in the admin's page of any failed post."""
    secrets = list(secrets)
    for post in Post.objects.all():
        stored = json.dumps([post.body, post.last_error, post.message_ref])
        for secret in secrets:
            assert secret not in stored, f"a secret is stored in post {post.post_id}: {stored}"
    # The claims are kept on the lanes, and their holders after them (models.py).
    for lane in Lane.objects.all():
        stored = json.dumps([lane.lease_token, lane.worker])
        for secret in secrets:
            assert secret not in stored, f"a secret is stored in lane {lane}: {stored}"
    log = "\n".join(sender.lines)
    for secret in secrets:
        assert secret not in log, f"a secret is in the sender's log\n{sender.stderr}"
    failed = Post.objects.filter(state__in=("failed", "uncertain"))
    assert failed.exists()
    for post in failed:
        response = admin_client.get(reverse("admin:django_connector_outbox_post_change", args=[post.pk]))
        assert response.status_code == 200
        page = response.content.decode()
        assert post.post_id in page
        for secret in secrets:
            assert secret not in page, f"a secret is in the admin page of {post.post_id}"
    changelist = admin_client.get(reverse("admin:django_connector_outbox_post_changelist")).content.decode()
    for secret in secrets:
        assert secret not in changelist


def one(copies: list[Any], post_id: str) -> Any:
    """The one copy of a post that the platform holds."""
    assert len(copies) == 1, f"the platform holds {len(copies)} copies of {post_id}: {copies}"
    return copies[0]


def chat_config(source: str, backend: str, base_url: str, token: str, wrong_token: str) -> dict[str, Any]:
    """CONNECTOR_OUTBOX with `source` on the fake at `base_url`, and "<source>_wrong": the same
    platform with a token it refuses."""
    options = {"base_url": base_url, "timeout": TIMEOUT}
    return {
        "CONNECTORS": {
            source: {"BACKEND": backend, "OPTIONS": {"token": token, **options}},
            f"{source}_wrong": {"BACKEND": backend, "OPTIONS": {"token": wrong_token, **options}},
        },
        **OUTBOX,
    }


def stop(sender: SenderProcess) -> None:
    assert sender.stop() == 0, sender.stderr
    assert "Traceback" not in sender.stderr, sender.stderr


# -- Slack --------------------------------------------------------------------------------------

C1, C2, MISSING = "C0E2E00001", "C0E2E00002", "C0E2ENOPE1"


def slack_post_id(args: dict[str, Any]) -> str | None:
    metadata = args.get("metadata")
    if isinstance(metadata, str):
        metadata = json.loads(metadata)
    return (metadata or {}).get("event_payload", {}).get("post_id")


def slack_sequence(fake: fs.FakeSlack, channel: str, reactions: dict[tuple[str, str], str]) -> list[str]:
    """The post ids of the creates and reactions that reached `channel`, in the order they came."""
    out = []
    for call in fake.state()["calls"]:
        args = call["args"]
        if args.get("channel") != channel or not call["authorized"]:  # not the wrong token's
            continue
        if call["method"] == "chat.postMessage":
            out.append(slack_post_id(args))
        elif call["method"] == "reactions.add":
            out.append(reactions[(args["name"], args["timestamp"])])
    return out


def slack_copies(fake: fs.FakeSlack, channel: str, post_id: str) -> list[fs.Message]:
    return [
        m for m in fake.messages(channel) if m.metadata and m.metadata["event_payload"]["post_id"] == post_id
    ]


def test_slack(senders, admin_client):
    # As an app distributed outside the Marketplace: history 15 a page, one call a minute, so
    # that the lost reply below is looked up within those limits (no 429: the fake counts them).
    with fs.running(token=SLACK_TOKEN, channels=(C1, C2), non_marketplace=True) as fake:
        backend = "django_connector_outbox.connectors.slack.SlackConnector"
        config = chat_config("slack", backend, fake.base_url, SLACK_TOKEN, SLACK_WRONG_TOKEN)
        with override_settings(CONNECTOR_OUTBOX=config):
            run_slack(fake, config, senders, admin_client)


def run_slack(fake: fs.FakeSlack, config: dict[str, Any], senders: Senders, admin_client: Any) -> None:
    outbox, wrong = Outbox("slack"), Outbox("slack_wrong")
    person_ts = fake.add_message(C1, "shall we deploy?")
    place1, place2 = (
        {"workspace_id": "T0E2E", "container_id": C1},
        {"workspace_id": "T0E2E", "container_id": C2},
    )

    # 1. A mixed batch: each container takes its posts in list order.
    batch = [
        {"post_id": "a01-m", **place1, "body": {"text": "one"}},
        {"post_id": "b01-m", **place2, "body": {"text": "uno"}},
        {"post_id": "a02-status", **place1, "kind": "status", "body": {"text": "deploy: started"}},
        {"post_id": "b02-m", **place2, "body": {"text": "dos"}},
        {"post_id": "a03-m", **place1, "body": {"text": "two", "blocks": [{"type": "divider"}]}},
        {
            "post_id": "a04-reaction",
            **place1,
            "kind": "reaction",
            "body": {"name": "eyes", "timestamp": person_ts},
        },
        {"post_id": "b03-m", **place2, "body": {"text": "tres"}},
        {"post_id": "a05-m", **place1, "body": {"text": "three"}},
        {
            "post_id": "x01-missing",
            "workspace_id": "T0E2E",
            "container_id": MISSING,
            "body": {"text": "lost"},
        },
    ]
    queue_all(outbox, batch)
    wrong.queue("w01-wrong-token", **place1, body={"text": "never"})
    expected = {
        C1: ["a01-m", "a02-status", "a03-m", "a04-reaction", "a05-m"],
        C2: ["b01-m", "b02-m", "b03-m"],
    }
    assert {c: queue_order("slack", c) for c in (C1, C2)} == expected

    sender = senders.start(config, "-v", "2", name="slack-sender")
    wait_until(finished("slack", [p["post_id"] for p in batch]), "the batch", sender)
    wait_until(finished("slack_wrong", ["w01-wrong-token"]), "the wrong token's post", sender)

    reactions = {("eyes", person_ts): "a04-reaction"}
    for channel, ids in expected.items():
        assert slack_sequence(fake, channel, reactions) == ids, f"{channel} out of queue order"
        for post_id in ids:
            post = row("slack", post_id)
            assert post.state == "posted", (post_id, post.state, post.last_error)
            if post.kind == "reaction":
                continue
            copy = one(slack_copies(fake, channel, post_id), post_id)
            assert post.message_ref == f"{channel}:{copy.ts}"
    assert fake.message(C1, person_ts).reactions == {"eyes": [fs.BOT_USER_ID]}
    assert fake.message(C1, row("slack", "a03-m").message_ref.split(":")[1]).blocks == [{"type": "divider"}]
    missing = row("slack", "x01-missing")
    assert (missing.state, missing.last_error) == (
        "failed",
        "slack error channel_not_found on chat.postMessage",
    )
    refused = row("slack_wrong", "w01-wrong-token")
    assert (refused.state, refused.last_error) == ("failed", "slack error invalid_auth on chat.postMessage")

    # 2. The status, set twice more before the sender sees it: one edit, to the latest text.
    status_copy = one(slack_copies(fake, C1, "a02-status"), "a02-status")
    with transaction.atomic():
        outbox.set_status("a02-status", **place1, body={"text": "deploy: building"})
        outbox.set_status("a02-status", **place1, body={"text": "deploy: done"})
    wait_until(lambda: row("slack", "a02-status").state == "posted", "the status edit", sender)
    status = row("slack", "a02-status")
    assert (status.rev, status.message_ref) == (2, f"{C1}:{status_copy.ts}")
    updates = fake.calls_of("chat.update")
    assert [(u["channel"], u["ts"], u["text"]) for u in updates] == [(C1, status_copy.ts, "deploy: done")]
    status_copy = one(slack_copies(fake, C1, "a02-status"), "a02-status")
    assert status_copy.text == "deploy: done"

    # 3. A lost reply: Slack stores the post, the connection drops before the answer.
    fake.script("chat.postMessage", fs.drop())
    queue_all(
        outbox,
        [
            {"post_id": "a06-lost", **place1, "body": {"text": "lost reply"}},
            {"post_id": "a07-after-lost", **place1, "body": {"text": "after it"}},
        ],
    )
    wait_until(finished("slack", ["a06-lost", "a07-after-lost"]), "the lost reply", sender, WAIT + LEASE)
    lost = row("slack", "a06-lost")
    copy = one(slack_copies(fake, C1, "a06-lost"), "a06-lost")  # exactly once on the platform
    assert (lost.state, lost.message_ref) == ("posted", f"{C1}:{copy.ts}")
    assert slack_sequence(fake, C1, reactions)[-2:] == ["a06-lost", "a07-after-lost"], (
        "sent twice or out of order"
    )
    assert any(h["channel"] == C1 for h in fake.calls_of("conversations.history")), "not looked up"
    assert {h["limit"] for h in fake.calls_of("conversations.history")} == {"15"}
    assert fake.limited["conversations.history"] == 0
    assert row("slack", "a07-after-lost").state == "posted"

    # 4. A 429 with Retry-After: 1 on the next create.
    fake.script("chat.postMessage", fs.ratelimit("1"))
    queue_all(
        outbox,
        [
            {"post_id": "b04-limited", **place2, "body": {"text": "rate limited"}},
            {"post_id": "b05-behind", **place2, "body": {"text": "behind it"}},
        ],
    )
    wait_until_held("slack", "b04-limited", behind="b05-behind", sender=sender)
    wait_until(finished("slack", ["b04-limited", "b05-behind"]), "the held post", sender)
    assert slack_sequence(fake, C2, reactions) == [*expected[C2], "b04-limited", "b04-limited", "b05-behind"]
    for post_id in ("b04-limited", "b05-behind"):
        copy = one(slack_copies(fake, C2, post_id), post_id)
        assert row("slack", post_id).message_ref == f"{C2}:{copy.ts}"

    stop(sender)
    # Every call carried the token, but for the one with the wrong token (refused, not retried).
    unauthorized = [slack_post_id(call["args"]) for call in fake.state()["calls"] if not call["authorized"]]
    assert unauthorized == ["w01-wrong-token"]
    assert_no_secrets([SLACK_TOKEN, SLACK_WRONG_TOKEN], sender, admin_client)


# -- Discord ------------------------------------------------------------------------------------

D1, D2, D_MISSING = "410000000000000001", "410000000000000002", "419999999999999999"


def discord_post_id(call: dict[str, Any]) -> str | None:
    """The post id of a create, from its content ("<post id>: text")."""
    content = (call.get("json") or {}).get("content", "")
    return content.split(":", 1)[0] if content else None


def discord_sequence(fake: fd.FakeDiscord, channel: str, reactions: dict[str, str]) -> list[str | None]:
    out = []
    prefix = f"{fd.API_PREFIX}/channels/{channel}/messages"
    for call in fake.state()["calls"]:
        if not call["authorized"]:  # the wrong token's
            continue
        if call["route"] == "create_message" and call["path"] == prefix:
            out.append(discord_post_id(call))
        elif call["route"] == "create_reaction" and call["path"].startswith(prefix + "/"):
            out.append(reactions[call["path"].removeprefix(prefix + "/").split("/")[0]])
    return out


def discord_copies(fake: fd.FakeDiscord, channel: str, post_id: str) -> list[fd.Message]:
    marker = "outbox:" + nonce_for("discord", post_id)
    return [
        m
        for m in fake.messages(channel)
        if m.author_id == fake.bot_user["id"]
        and any(e.get("footer", {}).get("text") == marker for e in m.embeds)
    ]


def test_discord(senders, admin_client):
    with fd.running(token=DISCORD_TOKEN, channels=(D1, D2)) as fake:
        backend = "django_connector_outbox.connectors.discord.DiscordConnector"
        config = chat_config("discord", backend, fake.base_url, DISCORD_TOKEN, DISCORD_WRONG_TOKEN)
        with override_settings(CONNECTOR_OUTBOX=config):
            run_discord(fake, config, senders, admin_client)


def run_discord(fake: fd.FakeDiscord, config: dict[str, Any], senders: Senders, admin_client: Any) -> None:
    outbox, wrong = Outbox("discord"), Outbox("discord_wrong")
    person_message = fake.add_message(D1, "shall we deploy?")
    place1, place2 = (
        {"workspace_id": "G0E2E", "container_id": D1},
        {"workspace_id": "G0E2E", "container_id": D2},
    )

    def body(post_id: str, text: str) -> dict[str, Any]:
        return {"content": f"{post_id}: {text}"}

    batch = [
        {"post_id": "a01-m", **place1, "body": body("a01-m", "one")},
        {"post_id": "b01-m", **place2, "body": body("b01-m", "uno")},
        {"post_id": "a02-status", **place1, "kind": "status", "body": body("a02-status", "deploy: started")},
        {"post_id": "b02-m", **place2, "body": body("b02-m", "dos")},
        {"post_id": "a03-m", **place1, "body": {**body("a03-m", "two"), "embeds": [{"title": "Build 7"}]}},
        {
            "post_id": "a04-reaction",
            **place1,
            "kind": "reaction",
            "body": {"emoji": "\N{EYES}", "message_id": person_message},
        },
        {"post_id": "b03-m", **place2, "body": body("b03-m", "tres")},
        {"post_id": "a05-m", **place1, "body": body("a05-m", "three")},
        {
            "post_id": "x01-missing",
            "workspace_id": "G0E2E",
            "container_id": D_MISSING,
            "body": body("x01", "no"),
        },
    ]
    queue_all(outbox, batch)
    wrong.queue("w01-wrong-token", **place1, body=body("w01", "never"))
    expected = {
        D1: ["a01-m", "a02-status", "a03-m", "a04-reaction", "a05-m"],
        D2: ["b01-m", "b02-m", "b03-m"],
    }
    assert {c: queue_order("discord", c) for c in (D1, D2)} == expected

    sender = senders.start(config, "-v", "2", name="discord-sender")
    wait_until(finished("discord", [p["post_id"] for p in batch]), "the batch", sender)
    wait_until(finished("discord_wrong", ["w01-wrong-token"]), "the wrong token's post", sender)

    reactions = {person_message: "a04-reaction"}
    for channel, ids in expected.items():
        assert discord_sequence(fake, channel, reactions) == ids, f"{channel} out of queue order"
        for post_id in ids:
            post = row("discord", post_id)
            assert post.state == "posted", (post_id, post.state, post.last_error)
            if post.kind == "reaction":
                continue
            copy = one(discord_copies(fake, channel, post_id), post_id)
            assert post.message_ref == copy.id
    assert fake.message(D1, person_message).reactions == {"\N{EYES}": [fake.bot_user["id"]]}
    [embed, _marker] = fake.message(D1, row("discord", "a03-m").message_ref).embeds
    assert embed["title"] == "Build 7"
    missing = row("discord", "x01-missing")
    assert (missing.state, missing.last_error) == ("failed", "discord 10003 Unknown Channel")
    refused = row("discord_wrong", "w01-wrong-token")
    assert refused.state == "failed" and "401" in refused.last_error, refused.last_error

    # 2. The status, set twice more: one edit (PATCH), to the latest text, marker kept.
    status_copy = one(discord_copies(fake, D1, "a02-status"), "a02-status")
    with transaction.atomic():
        outbox.set_status("a02-status", **place1, body=body("a02-status", "deploy: building"))
        outbox.set_status("a02-status", **place1, body=body("a02-status", "deploy: done"))
    wait_until(lambda: row("discord", "a02-status").state == "posted", "the status edit", sender)
    status = row("discord", "a02-status")
    assert (status.rev, status.message_ref) == (2, status_copy.id)
    edits = fake.calls_of("edit_message")
    assert [(e.path.rsplit("/", 1)[1], e.json["content"]) for e in edits] == [
        (status_copy.id, "a02-status: deploy: done")
    ]
    status_copy = one(discord_copies(fake, D1, "a02-status"), "a02-status")
    assert status_copy.content == "a02-status: deploy: done"

    # 3. A lost reply: Discord stores the message, the connection drops before the answer.
    fake.script("create_message", fd.drop())
    queue_all(
        outbox,
        [
            {"post_id": "a06-lost", **place1, "body": body("a06-lost", "lost reply")},
            {"post_id": "a07-after-lost", **place1, "body": body("a07-after-lost", "after it")},
        ],
    )
    wait_until(finished("discord", ["a06-lost", "a07-after-lost"]), "the lost reply", sender, WAIT + LEASE)
    lost = row("discord", "a06-lost")
    copy = one(discord_copies(fake, D1, "a06-lost"), "a06-lost")  # exactly once on the platform
    assert (lost.state, lost.message_ref) == ("posted", copy.id)
    # Sent once, found in history: not re-sent (where enforce_nonce would have hidden a repeat).
    assert discord_sequence(fake, D1, reactions)[-2:] == ["a06-lost", "a07-after-lost"], (
        "sent twice or out of order"
    )
    assert any(c.path.endswith(f"/channels/{D1}/messages") for c in fake.calls_of("get_channel_messages"))
    assert row("discord", "a07-after-lost").state == "posted"

    # 4. A 429 with Retry-After: 1 on the next create.
    fake.script("create_message", fd.ratelimit(1.0))
    queue_all(
        outbox,
        [
            {"post_id": "b04-limited", **place2, "body": body("b04-limited", "rate limited")},
            {"post_id": "b05-behind", **place2, "body": body("b05-behind", "behind it")},
        ],
    )
    wait_until_held("discord", "b04-limited", behind="b05-behind", sender=sender)
    wait_until(finished("discord", ["b04-limited", "b05-behind"]), "the held post", sender)
    assert discord_sequence(fake, D2, reactions) == [
        *expected[D2],
        "b04-limited",
        "b04-limited",
        "b05-behind",
    ]
    for post_id in ("b04-limited", "b05-behind"):
        copy = one(discord_copies(fake, D2, post_id), post_id)
        assert row("discord", post_id).message_ref == copy.id

    stop(sender)
    assert_no_secrets([DISCORD_TOKEN, DISCORD_WRONG_TOKEN], sender, admin_client)


# -- webhook ------------------------------------------------------------------------------------


def hook_sequence(fake: fw.FakeWebhook, post_ids: Iterable[str]) -> list[str]:
    """The post ids of the deliveries tried for `post_ids`, in the order they came."""
    wanted = set(post_ids)
    ids = [
        call["headers"].get("x-outbox-post-id")
        for call in fake.state()["calls"]
        if call["route"] == "deliver"
    ]
    return [post_id for post_id in ids if post_id in wanted]


def hook_copies(fake: fw.FakeWebhook, post_id: str) -> list[fw.Delivery]:
    with fake._lock:
        return [d for d in fake.deliveries if d.post_id == post_id]


def test_webhook(senders, admin_client):
    with (
        fw.running(secret=HOOK_SECRET) as fake,
        fw.running(secret=HOOK_SECRET) as looked_up,
    ):
        backend = "django_connector_outbox.connectors.webhook.WebhookConnector"
        auth = {"Authorization": f"Bearer {HOOK_TOKEN}"}
        common = {"secret": HOOK_SECRET, "headers": auth, "timeout": TIMEOUT}
        config = {
            "CONNECTORS": {
                "hook": {"BACKEND": backend, "OPTIONS": {"url": fake.url, **common}},
                "hook_lookup": {
                    "BACKEND": backend,
                    "OPTIONS": {"url": looked_up.url, "lookup_url": looked_up.lookup_url, **common},
                },
                "hook_wrong": {
                    "BACKEND": backend,
                    "OPTIONS": {"url": fake.url, **common, "secret": HOOK_WRONG_SECRET},
                },
            },
            **OUTBOX,
        }
        with override_settings(CONNECTOR_OUTBOX=config):
            run_webhook(fake, looked_up, config, senders, admin_client)


def run_webhook(
    fake: fw.FakeWebhook,
    looked_up: fw.FakeWebhook,
    config: dict[str, Any],
    senders: Senders,
    admin_client: Any,
) -> None:
    outbox = Outbox("hook")
    place1, place2 = (
        {"workspace_id": "W", "container_id": "orders"},
        {"workspace_id": "W", "container_id": "ops"},
    )
    batch = [
        {"post_id": "a01-m", **place1, "body": {"text": "one"}},
        {"post_id": "b01-m", **place2, "body": {"text": "uno"}},
        {"post_id": "a02-status", **place1, "kind": "status", "body": {"text": "deploy: started"}},
        {"post_id": "b02-m", **place2, "body": {"text": "dos"}},
        {"post_id": "a03-m", **place1, "body": {"text": "two", "items": [1, 2]}},
        {"post_id": "b03-m", **place2, "body": {"text": "tres"}},
        {"post_id": "a04-m", **place1, "body": {"text": "three"}},
    ]
    queue_all(outbox, batch)
    Outbox("hook_wrong").queue("w01-wrong-secret", **place1, body={"text": "never"})
    expected = {"orders": ["a01-m", "a02-status", "a03-m", "a04-m"], "ops": ["b01-m", "b02-m", "b03-m"]}
    assert {c: queue_order("hook", c) for c in expected} == expected

    sender = senders.start(config, "-v", "2", name="webhook-sender")
    wait_until(finished("hook", [p["post_id"] for p in batch]), "the batch", sender)
    wait_until(finished("hook_wrong", ["w01-wrong-secret"]), "the wrong secret's post", sender)

    for ids in expected.values():
        assert hook_sequence(fake, ids) == ids, "out of queue order"
        for post_id in ids:
            post = row("hook", post_id)
            copy = one(hook_copies(fake, post_id), post_id)
            assert (post.state, post.message_ref) == ("posted", copy.id)
    assert hook_copies(fake, "a03-m")[0].body == {"text": "two", "items": [1, 2]}
    refused = row("hook_wrong", "w01-wrong-secret")
    assert refused.state == "failed"
    assert refused.last_error == "webhook HTTP 401 invalid_signature webhook signature does not match"

    # 2. The status, set twice more: one more delivery, of the latest body, naming the first
    # delivery's id (a receiver upserts by post id; the newest rev wins).
    first = one(hook_copies(fake, "a02-status"), "a02-status")
    with transaction.atomic():
        outbox.set_status("a02-status", **place1, body={"text": "deploy: building"})
        outbox.set_status("a02-status", **place1, body={"text": "deploy: done"})
    wait_until(lambda: row("hook", "a02-status").state == "posted", "the status edit", sender)
    assert row("hook", "a02-status").rev == 2
    copies = hook_copies(fake, "a02-status")
    assert [(d.kind, d.rev, d.body) for d in copies] == [
        ("status", "0", {"text": "deploy: started"}),
        ("status", "2", {"text": "deploy: done"}),
    ]
    [edit] = [c for c in fake.calls_of("deliver") if c.headers.get("x-outbox-rev") == "2"]
    assert edit.headers["x-outbox-message-ref"] == first.id

    # 3. Lost replies. Without lookup_url the post cannot be checked: `uncertain`, never resent.
    # With it (the other receiver), it is found: `posted` once.
    fake.script("deliver", fw.drop())
    looked_up.script("deliver", fw.drop())
    lost_batch = [
        {"post_id": "a05-lost", **place1, "body": {"text": "lost reply"}},
        {"post_id": "a06-after-lost", **place1, "body": {"text": "after it"}},
    ]
    queue_all(outbox, lost_batch)
    queue_all(Outbox("hook_lookup"), lost_batch)
    ids = [p["post_id"] for p in lost_batch]
    wait_until(finished("hook", ids), "the lost reply (no lookup)", sender, WAIT + LEASE)
    wait_until(finished("hook_lookup", ids), "the lost reply (lookup)", sender, WAIT + LEASE)

    uncertain = row("hook", "a05-lost")
    assert uncertain.state == "uncertain"
    assert "cannot check" in uncertain.last_error and "lookup_url" in uncertain.last_error
    assert len(hook_copies(fake, "a05-lost")) == 1
    assert hook_sequence(fake, ids) == ids, "resent, or the channel did not wait for it"
    assert not fake.calls_of("lookup")

    found = row("hook_lookup", "a05-lost")
    copy = one(hook_copies(looked_up, "a05-lost"), "a05-lost")
    assert (found.state, found.message_ref) == ("posted", copy.id)
    assert hook_sequence(looked_up, ids) == ids, "resent, or the channel did not wait for it"
    assert [c.path for c in looked_up.calls_of("lookup")] == ["/lookup/a05-lost"]
    for source, hook in (("hook", fake), ("hook_lookup", looked_up)):
        after, copy = (
            row(source, "a06-after-lost"),
            one(hook_copies(hook, "a06-after-lost"), "a06-after-lost"),
        )
        assert (after.state, after.message_ref) == ("posted", copy.id)

    # 4. A 429 with Retry-After: 1.
    fake.script("deliver", fw.respond(429, {"error": "slow_down"}, Retry_After="1"))
    queue_all(
        outbox,
        [
            {"post_id": "b04-limited", **place2, "body": {"text": "rate limited"}},
            {"post_id": "b05-behind", **place2, "body": {"text": "behind it"}},
        ],
    )
    wait_until_held("hook", "b04-limited", behind="b05-behind", sender=sender)
    wait_until(finished("hook", ["b04-limited", "b05-behind"]), "the held post", sender)
    order = [*expected["ops"], "b04-limited", "b05-behind"]
    assert hook_sequence(fake, order) == [*expected["ops"], "b04-limited", "b04-limited", "b05-behind"]
    for post_id in ("b04-limited", "b05-behind"):
        copy = one(hook_copies(fake, post_id), post_id)
        assert row("hook", post_id).message_ref == copy.id

    # 5. A receiver that echoes the credentials it was given in its error: the reason keeps the
    # error code and drops the secrets.
    fake.script(
        "deliver",
        fw.respond(401, {"error": "token_revoked", "message": f"token {HOOK_TOKEN} revoked ({HOOK_SECRET})"}),
    )
    outbox.queue("c01-revoked", workspace_id="W", container_id="audit", body={"text": "refused"})
    wait_until(finished("hook", ["c01-revoked"]), "the refused post", sender)
    revoked = row("hook", "c01-revoked")
    assert revoked.state == "failed"
    assert revoked.last_error == "webhook HTTP 401 token_revoked token *** revoked (***)"

    stop(sender)
    assert_no_secrets([HOOK_TOKEN, HOOK_SECRET, HOOK_WRONG_SECRET], sender, admin_client)
