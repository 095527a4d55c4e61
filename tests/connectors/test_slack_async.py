"""The Slack connector's two doors: the coroutine one (`asend`, `afind_sent`, AsyncWebClient over
aiohttp) that run_outbox's event loop awaits, and the blocking one (`send`, `find_sent`,
WebClient). The same plan of calls serves both, so each outcome is checked through each."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.core.management import call_command

from django_connector_outbox import Outbox
from django_connector_outbox.connectors.base import (
    CheckLater,
    Connector,
    Delivered,
    MaybeSent,
    RateLimited,
    Refused,
    RetryLater,
    sends_in_threads,
)
from django_connector_outbox.connectors.slack import SlackConnector
from django_connector_outbox.fakes.slack import FakeSlack, drop, error, html, ratelimit, reset
from django_connector_outbox.posts import ClaimedPost
from tests.connectors.test_slack import CHANNEL, TEAM, TOKEN, claim

Door = Callable[[SlackConnector, ClaimedPost], Any]


def blocking_send(connector: SlackConnector, post: ClaimedPost) -> Any:
    return connector.send(post)


def coroutine_send(connector: SlackConnector, post: ClaimedPost) -> Any:
    async def run() -> Any:
        try:
            return await connector.asend(post)
        finally:
            await connector.aclose()

    return asyncio.run(run())


def coroutine_find(connector: SlackConnector, post: ClaimedPost) -> Any:
    async def run() -> Any:
        try:
            return await connector.afind_sent(post)
        finally:
            await connector.aclose()

    return asyncio.run(run())


DOORS = {"blocking": (blocking_send, SlackConnector.find_sent), "coroutine": (coroutine_send, coroutine_find)}


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSlack]:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    with FakeSlack.running(token=TOKEN, channels=(CHANNEL,), team_id=TEAM) as server:
        yield server


@pytest.fixture
def connector(fake: FakeSlack) -> SlackConnector:
    return SlackConnector(source="slack", token=TOKEN, base_url=fake.base_url, timeout=0.5)


@pytest.fixture(params=list(DOORS))
def door(request: pytest.FixtureRequest) -> tuple[Door, Door]:
    return DOORS[request.param]


def test_the_sender_awaits_the_coroutine_door_not_a_thread() -> None:
    # run_outbox's loop runs a connector's blocking send on a thread only when it has no asend.
    assert SlackConnector.asend is not Connector.asend
    assert not sends_in_threads(SlackConnector(source="slack", token=TOKEN))


@pytest.mark.django_db(transaction=True)
def test_run_outbox_delivers_through_asend_never_the_blocking_send(fake, settings, monkeypatch) -> None:
    settings.CONNECTOR_OUTBOX = {"CONNECTORS": {"slack": {**fake.connector_settings(), "PACE": {}}}}

    def no_blocking(*args: Any) -> Any:
        raise AssertionError("run_outbox called the blocking door")

    monkeypatch.setattr(SlackConnector, "send", no_blocking)
    monkeypatch.setattr(SlackConnector, "find_sent", no_blocking)
    for n in range(3):
        Outbox("slack").queue(f"p{n}", workspace_id=TEAM, container_id=CHANNEL, body={"text": f"p{n}"})

    call_command("run_outbox", "--once", "--source", "slack")

    assert [Outbox("slack").find(f"p{n}").state for n in range(3)] == ["posted"] * 3
    assert [m.text for m in fake.messages(CHANNEL)] == ["p0", "p1", "p2"]


def test_a_message_is_posted_with_its_metadata_and_found_again(connector, fake, door) -> None:
    send, find = door
    outcome = send(connector, claim("p1"))

    assert isinstance(outcome, Delivered)
    assert [m.text for m in fake.messages(CHANNEL)] == ["hello from p1"]
    assert fake.calls[-1].token_id  # the call carried the bot token
    assert find(connector, claim("p1", stale=True)) == outcome.message_ref
    assert find(connector, claim("p2", stale=True)) is None


def test_a_status_is_edited_and_a_delete_deletes(connector, fake, door) -> None:
    send, _ = door
    ref = send(connector, claim("s1", kind="status")).message_ref
    assert send(connector, claim("s1", kind="status", body={"text": "v2"}, message_ref=ref)) == Delivered(ref)
    assert [m.text for m in fake.messages(CHANNEL)] == ["v2"]
    assert send(connector, claim("s1:delete", kind="delete", body={}, message_ref=ref)) == Delivered(ref)
    assert send(connector, claim("s1:delete", kind="delete", body={}, message_ref=ref)) == Delivered(ref)
    assert fake.messages(CHANNEL) == []


@pytest.mark.parametrize(
    ("action", "expected"),
    [
        (error("channel_not_found"), Refused("slack error channel_not_found on chat.postMessage")),
        (error("service_unavailable"), RetryLater("slack error service_unavailable on chat.postMessage")),
        (error("internal_error"), MaybeSent("slack error internal_error on chat.postMessage")),
        (
            ratelimit("3"),
            RateLimited(3.0, "slack error ratelimited on chat.postMessage (HTTP 429, Retry-After 3)"),
        ),
        (html(503), RetryLater("chat.postMessage: HTTP 503 without a Slack answer")),
        (html(502), MaybeSent("chat.postMessage: HTTP 502 without a Slack answer")),
    ],
    ids=["refused", "transient", "ambiguous", "429", "html-503", "html-502"],
)
def test_slacks_answers_map_to_the_same_outcome_through_both_doors(
    connector, fake, door, action, expected
) -> None:
    send, _ = door
    fake.script("chat.postMessage", action)
    assert send(connector, claim("p1")) == expected


@pytest.mark.parametrize("action", [drop(), reset()], ids=["dropped", "reset"])
def test_a_lost_reply_on_a_create_may_have_posted_through_both_doors(connector, fake, door, action) -> None:
    send, _ = door
    fake.script("chat.postMessage", action)

    outcome = send(connector, claim("p1"))

    assert isinstance(outcome, MaybeSent) and outcome.reason.startswith("chat.postMessage: reply lost (")
    assert TOKEN not in outcome.reason


def test_a_refused_connection_was_not_sent_through_both_doors(door) -> None:
    send, find = door
    connector = SlackConnector(source="slack", token=TOKEN, base_url="http://127.0.0.1:9/api/", timeout=1)

    outcome = send(connector, claim("p1"))

    assert isinstance(outcome, RetryLater) and outcome.reason.startswith(
        "chat.postMessage: request not sent ("
    )
    with pytest.raises(CheckLater):
        find(connector, claim("p1", stale=True))


def test_one_aiohttp_session_per_loop_closed_by_aclose(connector, fake) -> None:
    async def two_sends() -> tuple[int, bool]:
        await connector.asend(claim("a"))
        await connector.asend(claim("b"))
        ((session, _),) = connector._sessions.values()
        opened = len(connector._sessions)
        await connector.aclose()
        return opened, session.closed

    assert asyncio.run(two_sends()) == (1, True)
    assert len(connector._sessions) == 0
