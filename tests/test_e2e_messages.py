"""End to end: Messages queued through `Outbox` reach the fake platforms through the sender, each
in its platform's native form, and the fakes (which refuse what the platforms refuse) take them.

Every source points at its fake, in this process; `deliver_due` runs the real sender inline, on
the test's connection, and one test runs `manage.py run_outbox` itself, in its own process. The
checks: one Message with every element queued once to Slack, Teams,
Discord, Telegram, Mattermost, Google Chat and email reaches each as its renderer wrote it; and every golden
case (tests/connectors/golden_cases.py), the largest Message each platform shows included, is
posted, the request the fake received carrying the golden payload.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.core import mail
from django.db import transaction
from django.test import override_settings

from django_connector_outbox import InvalidPost, Message, Outbox
from django_connector_outbox.connectors import (
    discord_render,
    email_render,
    google_chat_render,
    mattermost_render,
    slack_render,
    teams_render,
    telegram_render,
)
from django_connector_outbox.fakes import google_chat as fg
from django_connector_outbox.fakes import teams as ft
from django_connector_outbox.installations.teams import TeamsInstallations
from django_connector_outbox.testing import deliver_due
from tests.connectors.golden_cases import CASES, just_over, largest
from tests.fakes.smtp import FakeSmtp

pytestmark = pytest.mark.django_db

SLACK_CHANNEL, DISCORD_CHANNEL, TELEGRAM_CHAT = "C0000000001", "111111111111111111", "1001"
MATTERMOST_CHANNEL, TEAMS_CHANNEL, MAILBOX = "channelchannelchannelchan1", ft.CHANNEL, "team@example.org"
PLACES = {
    "slack": ("T0000000001", SLACK_CHANNEL),
    "discord": ("guild", DISCORD_CHANNEL),
    "teams": (ft.TENANT, TEAMS_CHANNEL),
    "mattermost": ("team", MATTERMOST_CHANNEL),
    "telegram": ("outbox_bot", TELEGRAM_CHAT),
    "google_chat": ("", fg.SPACE),  # a space's name is the whole place
    "mail": ("team", MAILBOX),
}
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
        yield server


@pytest.fixture
def platforms(
    fake_slack, fake_discord, fake_teams, fake_mattermost, fake_telegram, fake_google_chat, smtp
) -> Iterator[dict]:
    """Every source, each pointing at its fake."""
    connectors = {
        # No pacing: `deliver_due` sends what is due, and a paced post is not yet.
        name: {**fake.connector_settings(), "OPTIONS": {**fake.connector_options(), "timeout": 5}, "PACE": {}}
        for name, fake in (
            ("slack", fake_slack),
            ("discord", fake_discord),
            ("teams", fake_teams),
            ("mattermost", fake_mattermost),
            ("telegram", fake_telegram),
            ("google_chat", fake_google_chat),
        )
    }
    connectors["mail"] = {
        "BACKEND": "django_connector_outbox.connectors.email.EmailConnector",
        "OPTIONS": {"from_email": "Outbox <outbox@example.com>", "timeout": 5},
    }
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": connectors, "RETRY_JITTER": 0}):
        TeamsInstallations("teams").save(ft.TENANT, service_url=fake_teams.service_url, team_name="Contoso")
        yield {
            "slack": fake_slack,
            "discord": fake_discord,
            "teams": fake_teams,
            "mattermost": fake_mattermost,
            "telegram": fake_telegram,
            "google_chat": fake_google_chat,
            "mail": smtp,
        }


def queue(source: str, post_id: str, message: Message) -> None:
    workspace, container = PLACES[source]
    assert Outbox(source).queue(post_id, workspace_id=workspace, container_id=container, body=message)


def posted(source: str, post_id: str) -> bool:
    found = Outbox(source).find(post_id)
    assert found is not None
    return found.state == "posted"


def received(source: str, fake: Any) -> list[dict[str, Any]]:
    """The bodies of the message creates that `fake` took, as the connector sent them, the
    outbox's own additions (Discord's marker embed, Mattermost's marker prop) left out."""
    if source == "slack":
        return [
            {k: v for k, v in args.items() if k in ("text", "blocks")}
            for args in fake.calls_of("chat.postMessage")
        ]
    if source == "discord":
        bodies = []
        for call in fake.calls_of("create_message"):
            body = {k: v for k, v in call.json.items() if k not in ("nonce", "enforce_nonce")}
            embeds = [
                e for e in body["embeds"] if not e.get("footer", {}).get("text", "").startswith("outbox:")
            ]
            bodies.append({**body, "embeds": embeds})
        return bodies
    if source == "teams":
        return [{k: v for k, v in c.body.items() if k != "type"} for c in fake.calls_of("create")]
    if source == "mattermost":
        return [
            {
                "message": c.json["message"],
                "props": {k: v for k, v in c.json["props"].items() if k != "outbox_id"},
            }
            for c in fake.calls_of("create_post")
        ]
    if source == "telegram":
        return [{k: v for k, v in c.args.items() if k != "chat_id"} for c in fake.calls_of("sendMessage")]
    if source == "google_chat":
        return [c.body for c in fake.calls_of("create_message")]
    raise AssertionError(source)


RENDERERS = {
    "slack": slack_render,
    "discord": discord_render,
    "teams": teams_render,
    "mattermost": mattermost_render,
    "telegram": telegram_render,
    "google_chat": google_chat_render,
}


def test_one_message_reaches_every_platform_in_its_native_form(platforms):
    message = CASES["every_element"]
    for source in PLACES:
        queue(source, "deploy-4521", message)

    deliver_due()

    assert_native_everywhere(platforms, message)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_one_message_queued_once_per_platform_reaches_each_through_run_outbox(
    platforms, senders, smtp, monkeypatch
):
    message = CASES["every_element"]
    monkeypatch.setenv("OUTBOX_PROOF_SMTP_PORT", str(smtp.port))  # the sender's mail settings
    with transaction.atomic():
        for source in PLACES:
            queue(source, "deploy-4521", message)

    senders.start(settings.CONNECTOR_OUTBOX)
    senders.wait_until_finished("the message on every platform")
    senders.stop_all()

    assert_native_everywhere(platforms, message)


def assert_native_everywhere(platforms: dict[str, Any], message: Message) -> None:
    """`message` was posted once to every source, each fake taking its renderer's payload."""
    assert [source for source in PLACES if not posted(source, "deploy-4521")] == []
    for source, renderer in RENDERERS.items():
        assert received(source, platforms[source]) == [renderer.render(message)], source
    [email] = platforms["mail"].to(MAILBOX)
    native = email_render.render_email(message)

    def lines(text: str | None) -> str:  # as SMTP carries it: CRLF line ends
        return (text or "").replace("\r\n", "\n").strip()

    assert (email.subject, lines(email.text), lines(email.html)) == (
        "Deploy finished",
        lines(native["text"]),
        lines(native["html"]),
    )


@pytest.mark.parametrize("source", RENDERERS)
def test_every_golden_case_and_the_largest_message_are_taken_by_the_platforms_fake(platforms, source):
    messages = {**CASES, "largest": largest(source)}
    for name, message in messages.items():
        queue(source, name, message)

    deliver_due(source)

    refused = {name: Outbox(source).find(name) for name in messages if not posted(source, name)}
    assert refused == {}
    assert received(source, platforms[source]) == [RENDERERS[source].render(m) for m in messages.values()]


def stored(source: str, fake: Any) -> dict[str, Any]:
    """What the platform shows of the one message in the container now (after its edits)."""
    if source == "slack":
        [message] = fake.messages(SLACK_CHANNEL)
        return {"text": message.text, "blocks": message.blocks}
    if source == "discord":
        [message] = fake.messages(DISCORD_CHANNEL)
        embeds = [
            {k: v for k, v in e.items() if k != "type"}
            for e in message.embeds
            if not e.get("footer", {}).get("text", "").startswith("outbox:")
        ]
        return {"content": message.content, "embeds": embeds, "components": message.components}
    if source == "teams":
        [activity] = fake.activities(TEAMS_CHANNEL)
        return {k: v for k, v in activity.body.items() if k not in ("type", "id")}  # the connector's
    if source == "telegram":
        [message] = fake.messages(int(TELEGRAM_CHAT))
        return {"text": message.text, "reply_markup": message.reply_markup}
    if source == "google_chat":
        [message] = fake.messages(fg.SPACE)
        return {"text": message.text, "cardsV2": message.cards_v2}
    [post] = fake.posts(MATTERMOST_CHANNEL)
    return {"message": post.message, "props": {k: v for k, v in post.props.items() if k != "outbox_id"}}


@pytest.mark.parametrize("source", RENDERERS)
def test_a_status_edited_with_messages_shows_the_latest_in_place(platforms, source):
    first, latest = Message("Deploy **started**"), CASES["every_element"]
    workspace, container = PLACES[source]
    Outbox(source).set_status("deploy", workspace_id=workspace, container_id=container, body=first)
    deliver_due(source)
    Outbox(source).set_status("deploy", workspace_id=workspace, container_id=container, body=latest)

    deliver_due(source)

    assert posted(source, "deploy")
    native = RENDERERS[source].render(latest)
    shown = stored(source, platforms[source])
    assert shown == {key: native.get(key) for key in shown}


@pytest.mark.parametrize("source", RENDERERS)
def test_a_message_just_over_a_platforms_limit_is_refused_at_queue_time_and_nothing_is_written(
    platforms, source
):
    workspace, container = PLACES[source]
    with pytest.raises(InvalidPost, match=r"^post 'big': .* over "):
        Outbox(source).queue("big", workspace_id=workspace, container_id=container, body=just_over(source))

    assert Outbox(source).find("big") is None
