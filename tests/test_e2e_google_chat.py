"""End to end, in process: posts queued through `Outbox` reach the fake Google Chat through the
sender (`outbox_deliver`, the delivery of ``run_outbox --once``, on the test's clock), on every
database. What the sender does with each of the connector's answers: messages in order per
space, a thread by key and a reply by `thread_of`, a status edited in place, a lost reply
found by its client-assigned id after the lease (one message, never two), a 429 held without
spending an attempt, no secret in any row, and a Message rendered as Chat's text and card (one
over Chat's limits refused when queued). Then (slow, PostgreSQL) three `run_outbox`
processes against the fake enforcing Google's quota of a space, with lost replies and a 429."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, transaction
from django.test import override_settings

from django_connector_outbox import InvalidPost, Link, Message, Outbox
from django_connector_outbox.connectors.google_chat import message_id_for
from django_connector_outbox.fakes import google_chat as fg
from django_connector_outbox.fakes.base import Limit, within_pace
from django_connector_outbox.models import Post
from tests.delivering import deliver_all

pytestmark = pytest.mark.django_db

SPACE, OTHER = fg.SPACE, "spaces/BBBBotherSp"
LEASE = 60  # longer than a lookup (4 requests of the default 10 s) and a send
# The Workspace customer id (the connector does not send it; "" would do too).
WORKSPACE = "C01abcdef"


@pytest.fixture
def fake(settings: Any) -> Any:
    with fg.running(spaces=(SPACE, OTHER)) as server:
        # Paced by the connector's default; the test's clock moves past each wait.
        settings.CONNECTOR_OUTBOX = {
            "CONNECTORS": {"gchat": server.connector_settings()},
            "LEASE": LEASE,
            "RETRY_JITTER": 0,
        }
        yield server


def row(post_id: str) -> Post:
    return Post.objects.with_claim().get(source="gchat", post_id=post_id)


def test_a_post_without_a_workspace_reaches_its_space_as_the_contract_allows_for_google_chat(
    fake, outbox_deliver, outbox_clock
):
    assert Outbox("gchat").queue("n1", workspace_id="", container_id=SPACE, body={"text": "no workspace"})

    assert deliver_all(outbox_deliver, outbox_clock, "gchat", pace=6) == ["n1"]
    assert [m.text for m in fake.messages(SPACE)] == ["no workspace"]
    assert row("n1").current_state == "posted"


def test_messages_threads_replies_and_a_status_reach_google_chat_in_order(fake, outbox_deliver, outbox_clock):
    outbox = Outbox("gchat")
    with transaction.atomic():
        outbox.queue("m1", workspace_id=WORKSPACE, container_id=SPACE, body={"text": "one"})
        outbox.queue(
            "m2", workspace_id=WORKSPACE, container_id=SPACE, thread_id="order-42", body={"text": "two"}
        )
        outbox.queue(
            "m3", workspace_id=WORKSPACE, container_id=SPACE, thread_id="order-42", body={"text": "three"}
        )
        outbox.queue("r1", workspace_id=WORKSPACE, container_id=SPACE, thread_of="m1", body={"text": "reply"})
        outbox.set_status("s1", workspace_id=WORKSPACE, container_id=OTHER, body={"text": "v1"})

    assert sorted(deliver_all(outbox_deliver, outbox_clock, "gchat", pace=6)) == [
        "m1",
        "m2",
        "m3",
        "r1",
        "s1",
    ]

    one, two, three, reply = fake.messages(SPACE)
    assert [m.text for m in (one, two, three, reply)] == ["one", "two", "three", "reply"]
    assert two.thread == three.thread != one.thread
    assert reply.thread == one.thread  # thread_of: into the parent's own thread
    assert {p: row(p).message_ref for p in ("m1", "m2", "m3", "r1")} == {
        "m1": one.name,
        "m2": two.name,
        "m3": three.name,
        "r1": reply.name,
    }
    assert all(
        m.client_id == message_id_for("gchat", p)
        for p, m in zip(("m1", "m2", "m3", "r1"), fake.messages(SPACE), strict=True)
    )

    # The status, set twice more in one transaction: one edit, to the latest text, in place.
    with transaction.atomic():
        outbox.set_status("s1", workspace_id=WORKSPACE, container_id=OTHER, body={"text": "v2"})
        outbox.set_status("s1", workspace_id=WORKSPACE, container_id=OTHER, body={"text": "v3"})
    deliver_all(outbox_deliver, outbox_clock, "gchat", pace=6)
    [status] = fake.messages(OTHER)
    assert status.text == "v3" and row("s1").message_ref == status.name
    assert len(fake.calls_of("update_message")) == 1


def test_a_lost_reply_is_found_by_its_id_after_the_lease_and_the_space_waits_for_it(
    fake, outbox_deliver, outbox_clock
):
    outbox = Outbox("gchat")
    fake.script("create_message", fg.drop())  # stored, then the connection closes unanswered
    with transaction.atomic():
        outbox.queue("lost", workspace_id=WORKSPACE, container_id=SPACE, body={"text": "lost reply"})
        outbox.queue("next", workspace_id=WORKSPACE, container_id=SPACE, body={"text": "after it"})

    outbox_deliver("gchat")
    assert (row("lost").current_state, row("next").current_state) == ("sending", "queued")
    assert [m.text for m in fake.messages(SPACE)] == ["lost reply"]

    outbox_clock.advance(LEASE + 1)
    deliver_all(outbox_deliver, outbox_clock, "gchat", pace=6)

    first, second = fake.messages(SPACE)
    assert (first.text, second.text) == ("lost reply", "after it")
    assert row("lost").current_state == "posted" and row("lost").message_ref == first.name
    [lookup] = fake.calls_of("get_message")
    assert lookup.path.endswith(f"/messages/{message_id_for('gchat', 'lost')}")
    assert len(fake.calls_of("create_message")) == 2  # the lost one and "next": never a second copy


def test_a_429_holds_the_post_without_spending_an_attempt(fake, outbox_deliver, outbox_clock):
    fake.script("create_message", fg.ratelimit(retry_after=3))
    Outbox("gchat").queue("held", workspace_id=WORKSPACE, container_id=SPACE, body={"text": "held"})

    outbox_deliver("gchat")
    held = row("held")
    assert (held.current_state, held.current_attempts) == ("queued", 0)
    assert "429 RESOURCE_EXHAUSTED" in held.last_error

    outbox_clock.advance(4)
    outbox_deliver("gchat")
    assert row("held").current_state == "posted"
    assert [m.text for m in fake.messages(SPACE)] == ["held"]


def test_a_refused_post_fails_with_googles_reason_and_no_secret_is_in_any_row(
    fake, outbox_deliver, outbox_clock
):
    fake.add_space("spaces/CCCCnotMembr", member=False)
    outbox = Outbox("gchat")
    outbox.queue("refused", workspace_id=WORKSPACE, container_id="spaces/CCCCnotMembr", body={"text": "x"})
    outbox.queue("fine", workspace_id=WORKSPACE, container_id=SPACE, body={"text": "y"})

    deliver_all(outbox_deliver, outbox_clock, "gchat", pace=6)

    refused = row("refused")
    assert refused.current_state == "failed"
    assert (
        refused.last_error
        == "google chat 403 PERMISSION_DENIED: This Chat app is not a member of this space."
    )
    key = fake.service_account_info["private_key"]
    secrets = [*fake.tokens, key.splitlines()[1]]
    for post in Post.objects.with_claim().filter(source="gchat"):
        stored = f"{post.body} {post.last_error} {post.message_ref}"
        assert not any(secret in stored for secret in secrets)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_three_run_outbox_processes_deliver_each_post_once_within_googles_space_quota(senders):
    if connection.vendor != "postgresql":
        pytest.skip("three senders at once: PostgreSQL")
    spaces = (SPACE, OTHER)
    per_space = 8
    # Google's own quota of a space, 60 writes a minute, enforced: the default pace keeps under it.
    with fg.running(spaces=spaces, space_limit=Limit(60, 60)) as fake:
        lost = [fg.passthrough()] * 4 + [fg.drop()]
        fake.script("create_message", *lost * 2, fg.ratelimit(retry_after=1))
        config = {
            "CONNECTORS": {
                "gchat": {
                    **fake.connector_settings(),
                    "OPTIONS": {**fake.connector_options(), "timeout": 0.5},
                }
            },
            "LEASE": 3,
            "POLL_INTERVAL": 0.2,
            "RETRY_JITTER": 0,
        }
        with override_settings(CONNECTOR_OUTBOX=config):
            outbox = Outbox("gchat")
            with transaction.atomic():
                for n in range(per_space):
                    for space in spaces:
                        body = {"text": f"{space[-5:]}-{n}"}
                        outbox.queue(
                            f"{space[-5:]}-{n}", workspace_id=WORKSPACE, container_id=space, body=body
                        )
                outbox.set_status("status", workspace_id=WORKSPACE, container_id=SPACE, body={"text": "v1"})
            senders.start_many(3, config, "--concurrency", "4", prefix="gchat-sender")
            senders.wait_until_finished("the posts")
            outbox.set_status("status", workspace_id=WORKSPACE, container_id=SPACE, body={"text": "v2"})
            senders.wait_until_finished("the status edit")
            senders.stop_all()

        rows = {p.post_id: p for p in Post.objects.with_claim().filter(source="gchat")}
        assert {p.current_state for p in rows.values()} == {"posted"}, [
            (p.post_id, p.current_state, p.last_error) for p in rows.values()
        ]
        for space in spaces:
            stored = fake.messages(space)
            expected = [f"{space[-5:]}-{n}" for n in range(per_space)]
            texts = [m.text for m in stored if m.text != "v2"]
            assert texts == expected  # once each, in queue order
            for message in stored:
                post_id = message.text if message.text != "v2" else "status"
                assert rows[post_id].message_ref == message.name
            # The pace is of claims; a write may reach the fake up to a second after its claim
            # (each sender's first send fetches the token), so writes may bunch that much.
            assert within_pace(fake.accepted_times(space), 5, 5.5, tolerance=1.0)
        assert fake.statuses[429] == 1  # the scripted one: the pace kept under the quota
        assert not fake._script.get("create_message"), "a scripted lost reply or 429 was not reached"
        assert len(fake.calls_of("get_message")) >= 2  # the lost replies, looked up
        # A token per sender process at most, never one per send; a sender that claimed nothing
        # (the other two may take every head) fetched none.
        assert 1 <= fake.token_requests <= 3


def test_a_message_is_rendered_as_text_and_a_card_and_edited_as_one(fake, outbox_deliver, outbox_clock):
    outbox = Outbox("gchat")
    deploy = Message(
        "Deploy of **api** done",
        title="Deploy",
        fields=[("Env", "prod")],
        actions=[Link("Open", "https://ci.example/1")],
    )
    outbox.queue("deploy", workspace_id=WORKSPACE, container_id=SPACE, body=deploy)
    outbox.set_status("progress", workspace_id=WORKSPACE, container_id=SPACE, body=Message("_starting_"))

    deliver_all(outbox_deliver, outbox_clock, "gchat", pace=6)
    outbox.set_status(
        "progress", workspace_id=WORKSPACE, container_id=SPACE, body=Message("**done**", context="4 min")
    )
    deliver_all(outbox_deliver, outbox_clock, "gchat", pace=6)

    message, progress = fake.messages(SPACE)
    assert message.text == "Deploy of *api* done"
    assert message.cards_v2[0]["card"]["header"] == {"title": "Deploy"}
    assert progress.text == "*done*"
    assert progress.cards_v2[0]["card"]["sections"] == [{"widgets": [{"textParagraph": {"text": "4 min"}}]}]


def test_a_message_google_chat_cannot_show_is_refused_when_queued_and_nothing_is_written(fake):
    with pytest.raises(
        InvalidPost, match=r"post 'long': text is 5,000 characters .* over Google Chat's 4,096"
    ):
        Outbox("gchat").queue("long", workspace_id=WORKSPACE, container_id=SPACE, body=Message("x" * 5000))
    assert not Post.objects.filter(source="gchat").exists()
