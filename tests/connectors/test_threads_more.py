"""Replies queued with `thread_of`, through the Outbox, the sender and the real Mattermost, Teams,
Telegram and email connectors to their fakes (as test_threads.py does for Slack, Discord and
webhooks): each reply goes into its parent's thread, after its parent, as each platform
addresses a thread; a reply to a reply into the same thread; a Mattermost reply whose reply was
lost is looked up in that thread and never posted twice; a parent that failed fails its
replies, and no request is made for them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.core import mail
from django.test import override_settings

from django_connector_outbox import Outbox
from django_connector_outbox.connectors.email import message_id
from django_connector_outbox.connectors.telegram import GROUP_INTERVAL
from django_connector_outbox.fakes import mattermost as fm
from django_connector_outbox.fakes import teams as ft
from django_connector_outbox.fakes import telegram as ftg
from django_connector_outbox.immediate import InlineExecutor
from django_connector_outbox.installations.teams import TeamsInstallations
from django_connector_outbox.models import Post
from django_connector_outbox.sender import Sender
from tests.fakes.smtp import FakeSmtp

pytestmark = pytest.mark.django_db

LEASE = 120


def configured(source: str, backend: str, **options: Any) -> Any:
    connector = {"BACKEND": backend, "OPTIONS": options, "PACE": {}}  # the fake clock does not move
    return override_settings(
        CONNECTOR_OUTBOX={**settings.CONNECTOR_OUTBOX, "CONNECTORS": {source: connector}}
    )


def run(source: str, clock: Any) -> None:
    # Sends inline, in the test's transaction: the Teams connector reads its installations.
    Sender([source], once=True, clock=clock, worker="w1", executor=InlineExecutor()).run()


def state(post_id: str) -> tuple[str, str]:
    p = Post.objects.with_claim().get(post_id=post_id)
    return p.current_state, p.last_error


def stored(post_id: str) -> tuple[str, str | None, str]:
    p = Post.objects.get(post_id=post_id)
    return p.state, p.message_ref, p.thread_id


def new_post(
    post_id: str, workspace: str, container: str, body: dict[str, Any], **fields: Any
) -> dict[str, Any]:
    return {"post_id": post_id, "workspace_id": workspace, "container_id": container, "body": body} | fields


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


# -- Mattermost -------------------------------------------------------------------------------

MM_TOKEN = "mm-thread-test-token-4k8s2d"
MM_TEAM = "teamteamteamteamteamteam01"
MM_CHANNEL = "channelchannelchannelchan1"


@pytest.fixture
def mattermost() -> Iterator[fm.FakeMattermost]:
    backend = "django_connector_outbox.connectors.mattermost.MattermostConnector"
    # No pending_post_id dedupe: a reply created twice would show as two posts.
    with (
        fm.running(token=MM_TOKEN, channels=(MM_CHANNEL,), dedupe_window=0) as server,
        configured("mm", backend, url=server.url, token=MM_TOKEN, timeout=2),
    ):
        yield server


def mm_post(post_id: str, **fields: Any) -> dict[str, Any]:
    return new_post(post_id, MM_TEAM, MM_CHANNEL, {"message": post_id}, **fields)


def test_mattermost_replies_name_the_parent_as_their_root(mattermost, clock):
    Outbox("mm", clock=clock).queue_many(
        [mm_post("p1"), mm_post("r1", thread_of="p1"), mm_post("r2", thread_of="r1")]
    )

    run("mm", clock)

    parent, r1, r2 = mattermost.posts(MM_CHANNEL)
    assert [p.message for p in (parent, r1, r2)] == ["p1", "r1", "r2"]
    # A reply to a reply names the thread's root: Mattermost refuses a reply as root_id.
    assert [p.root_id for p in (parent, r1, r2)] == ["", parent.id, parent.id]
    assert [c.json.get("root_id") for c in mattermost.calls_of("create_post")] == [None, parent.id, parent.id]
    assert stored("r2") == ("posted", r2.id, parent.id)


def test_a_mattermost_reply_to_a_reply_whose_reply_was_lost_is_found_in_its_thread(mattermost, clock):
    outbox = Outbox("mm", clock=clock)
    outbox.queue_many([mm_post("p1"), mm_post("r1", thread_of="p1"), mm_post("r2", thread_of="r1")])
    mattermost.script("create_post", fm.passthrough(), fm.passthrough(), fm.drop())  # r2 stored, reply lost

    run("mm", clock)
    assert state("r2")[0] == "sending"
    clock.advance(LEASE)
    run("mm", clock)

    parent, r1, r2 = mattermost.posts(MM_CHANNEL)
    assert r2.message == "r2" and r2.root_id == parent.id
    assert len(mattermost.calls_of("create_post")) == 3  # looked up, not sent again
    # Looked up in the thread it was resolved into (its parent r1's root), not the channel.
    assert [c.path for c in mattermost.calls_of("get_thread")] == [f"/api/v4/posts/{parent.id}/thread"]
    assert mattermost.calls_of("get_posts") == []
    assert stored("r2") == ("posted", r2.id, parent.id)


# -- Microsoft Teams --------------------------------------------------------------------------


@pytest.fixture
def teams() -> Iterator[ft.FakeTeams]:
    backend = "django_connector_outbox.connectors.teams.TeamsConnector"
    with ft.running() as server:
        options = {"app_id": ft.APP_ID, "app_password": ft.APP_PASSWORD, "login_url": server.login_url}
        with configured("teams", backend, **options, timeout=2):
            TeamsInstallations("teams").save(ft.TENANT, service_url=server.service_url, team_name="Contoso")
            yield server


def teams_post(post_id: str, **fields: Any) -> dict[str, Any]:
    return new_post(post_id, ft.TENANT, ft.CHANNEL, {"text": post_id}, **fields)


def test_teams_replies_are_posted_to_the_parents_reply_chain(teams, clock):
    Outbox("teams", clock=clock).queue_many(
        [teams_post("p1"), teams_post("r1", thread_of="p1"), teams_post("r2", thread_of="r1")]
    )

    run("teams", clock)

    parent, r1, r2 = teams.activities(ft.CHANNEL)
    assert [a.text for a in (parent, r1, r2)] == ["p1", "r1", "r2"]
    # A reply to a reply goes to the root's chain: a Teams channel's chains are one level deep.
    chain = f"{ft.CHANNEL};messageid={parent.id}"
    assert [c.conversation for c in teams.calls_of("create")] == [ft.CHANNEL, chain, chain]
    assert [a.reply_to for a in (parent, r1, r2)] == [None, parent.id, parent.id]
    assert stored("r2") == ("posted", r2.id, parent.id)


def test_a_teams_parent_whose_reply_was_lost_fails_its_reply_not_posted_outside_its_chain(teams, clock):
    Outbox("teams", clock=clock).queue_many([teams_post("p1"), teams_post("r1", thread_of="p1")])
    teams.script("create", ft.drop())  # p1 is posted; its activity id never comes back

    run("teams", clock)
    clock.advance(LEASE)
    run("teams", clock)

    # No lookup on Teams: p1 ends uncertain, without the id its reply chain is addressed by.
    assert state("p1")[0] == "uncertain"
    assert state("r1") == ("failed", "its thread's parent p1 ended without a message (uncertain)")
    assert [a.text for a in teams.activities(ft.CHANNEL)] == ["p1"]
    assert len(teams.calls_of("create")) == 1


# -- Telegram ---------------------------------------------------------------------------------

TG_TOKEN = "123456789:AAH-thread-test-token_Xy"
PRIVATE = 1001
FORUM = -1009009009009


@pytest.fixture
def telegram() -> Iterator[ftg.FakeTelegram]:
    backend = "django_connector_outbox.connectors.telegram.TelegramConnector"
    with (
        ftg.running(token=TG_TOKEN, chats=(str(PRIVATE),)) as server,
        configured("tg", backend, token=TG_TOKEN, base_url=server.base_url, timeout=2),
    ):
        server.add_chat(FORUM, forum=True)
        yield server


def tg_post(post_id: str, chat: int = PRIVATE, **fields: Any) -> dict[str, Any]:
    return new_post(post_id, "outbox_bot", str(chat), {"text": post_id}, **fields)


def test_telegram_replies_in_a_forum_topic_reply_to_their_parent_in_that_topic(telegram, clock):
    topic = telegram.add_topic(FORUM)
    Outbox("tg", clock=clock).queue_many(
        [
            tg_post("p1", FORUM, thread_id=str(topic)),
            tg_post("r1", FORUM, thread_of="p1"),
            tg_post("r2", FORUM, thread_of="r1"),
        ]
    )

    for _ in range(3):  # a group's messages are paced: one every GROUP_INTERVAL
        run("tg", clock)
        clock.advance(GROUP_INTERVAL)

    parent, r1, r2 = (m for m in telegram.messages(FORUM) if m.message_id != topic)
    assert [(m.text, m.thread_id) for m in (parent, r1, r2)] == [("p1", topic), ("r1", topic), ("r2", topic)]
    # Telegram replies by message: a reply to a reply answers that reply, in the same topic.
    assert [m.reply_to for m in (parent, r1, r2)] == [None, parent.message_id, r1.message_id]
    sent = [c.args for c in telegram.calls_of("sendMessage")]
    assert [a.get("reply_parameters") for a in sent] == [
        None,
        {"message_id": parent.message_id},
        {"message_id": r1.message_id},
    ]
    assert [a.get("message_thread_id") for a in sent] == [topic, topic, topic]
    assert stored("r2") == ("posted", f"{FORUM}:{r2.message_id}", str(topic))


def test_telegram_replies_outside_forums_reply_to_their_parent_without_a_topic(telegram, clock):
    Outbox("tg", clock=clock).queue_many(
        [tg_post("p1"), tg_post("r1", thread_of="p1"), tg_post("r2", thread_of="r1")]
    )

    run("tg", clock)

    parent, r1, r2 = telegram.messages(PRIVATE)
    assert [(m.text, m.thread_id) for m in (parent, r1, r2)] == [("p1", None), ("r1", None), ("r2", None)]
    assert [m.reply_to for m in (parent, r1, r2)] == [None, parent.message_id, r1.message_id]
    assert all("message_thread_id" not in c.args for c in telegram.calls_of("sendMessage"))
    # Its thread is the message its reply chain starts from.
    assert stored("r1") == ("posted", f"{PRIVATE}:{r1.message_id}", f"{PRIVATE}:{parent.message_id}")
    assert stored("r2") == ("posted", f"{PRIVATE}:{r2.message_id}", f"{PRIVATE}:{parent.message_id}")


def test_a_telegram_parent_that_failed_fails_its_replies_without_a_request(telegram, clock):
    Outbox("tg", clock=clock).queue_many(
        [tg_post("p1"), tg_post("r1", thread_of="p1"), tg_post("r2", thread_of="r1")]
    )
    telegram.script("sendMessage", ftg.error(403, "Forbidden: bot was blocked by the user"))

    run("tg", clock)

    assert state("p1") == ("failed", "telegram 403 Forbidden: bot was blocked by the user")
    assert state("r1") == ("failed", "its thread's parent p1 ended without a message (failed)")
    assert state("r2") == ("failed", "its thread's parent r1 ended without a message (failed)")
    assert len(telegram.calls_of("sendMessage")) == 1
    assert telegram.messages(PRIVATE) == []


# -- email ------------------------------------------------------------------------------------

TO = "ada@example.org"
SMTP = "django.core.mail.backends.smtp.EmailBackend"


@pytest.fixture
def smtp(settings: Any) -> Iterator[FakeSmtp]:
    with FakeSmtp() as server:
        if hasattr(mail, "mailers"):  # Django 6.1+: MAILERS (the EMAIL_* settings are deprecated)
            settings.MAILERS = {
                "default": {"BACKEND": SMTP, "OPTIONS": {"host": "127.0.0.1", "port": server.port}}
            }
        else:
            settings.EMAIL_BACKEND, settings.EMAIL_HOST, settings.EMAIL_PORT = SMTP, "127.0.0.1", server.port
        backend = "django_connector_outbox.connectors.email.EmailConnector"
        with configured("mail", backend, from_email="Outbox <outbox@example.com>", timeout=2):
            yield server


def mail_post(post_id: str, subject: str, **fields: Any) -> dict[str, Any]:
    return new_post(post_id, "W", TO, {"subject": subject, "text": post_id}, **fields)


def test_email_replies_answer_the_parents_message_id_with_re_subjects(smtp, clock):
    Outbox("mail", clock=clock).queue_many(
        [
            mail_post("p1", "Deploy 42"),
            mail_post("r1", "Deploy 42", thread_of="p1"),
            mail_post("r2", "Re: Deploy 42", thread_of="r1"),
        ]
    )

    run("mail", clock)

    p1, r1, r2 = (message_id("mail", p, "example.com") for p in ("p1", "r1", "r2"))
    parent, first, second = smtp.to(TO)
    assert [m.message_id for m in (parent, first, second)] == [p1, r1, r2]
    assert [(m.subject, m.in_reply_to, m.references) for m in (parent, first, second)] == [
        ("Deploy 42", "", ""),
        ("Re: Deploy 42", p1, p1),
        # A reply to a reply answers it, and References names the thread from its start.
        ("Re: Deploy 42", r1, f"{p1} {r1}"),
    ]
    assert stored("r2") == ("posted", r2, r1)
