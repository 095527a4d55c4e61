"""The shipped HTTP connectors as coroutine connectors: run_outbox awaits their `asend` on its
event loop and never calls their blocking methods, each through one AsyncClient per loop whose
pool holds as many connections as the sender has sends in flight."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass
from typing import Any

import pytest
from django.core.management import call_command

from django_connector_outbox import Outbox
from django_connector_outbox.connectors import http as http_module
from django_connector_outbox.connectors.base import Connector, Delivered, in_flight_limit, sends_in_threads
from django_connector_outbox.connectors.discord import DiscordConnector
from django_connector_outbox.connectors.google_chat import GoogleChatConnector
from django_connector_outbox.connectors.http import DEFAULT_CONNECTIONS, HttpConnector
from django_connector_outbox.connectors.mattermost import MattermostConnector
from django_connector_outbox.connectors.teams import TeamsConnector
from django_connector_outbox.connectors.telegram import TelegramConnector
from django_connector_outbox.connectors.webhook import WebhookConnector
from django_connector_outbox.engine import LoopEngine
from django_connector_outbox.fakes import discord as fd
from django_connector_outbox.fakes import google_chat as fg
from django_connector_outbox.fakes import mattermost as fm
from django_connector_outbox.fakes import teams as fteams
from django_connector_outbox.fakes import telegram as ft
from django_connector_outbox.fakes import webhook as fw
from django_connector_outbox.installations import Installations
from django_connector_outbox.installations.destinations import Destinations
from django_connector_outbox.installations.teams import TeamsInstallations
from tests.connectors.helpers import CoroutineForm, claimed_post


def no_blocking(*args: Any) -> Any:
    raise AssertionError("run_outbox called a blocking method of a coroutine connector")


def refuse_blocking(monkeypatch: pytest.MonkeyPatch, backend: type[Connector]) -> None:
    for name in ("send", "find_sent"):
        monkeypatch.setattr(backend, name, no_blocking)


@dataclass(frozen=True)
class Platform:
    """A shipped HTTP connector, its fake, and a post it takes."""

    backend: type[HttpConnector]
    running: Callable[[], AbstractContextManager[Any]]
    place: dict[str, str]
    text: str = "text"  # the body field of a post's text
    install: Callable[[Any], None] = lambda fake: None  # what the source needs in the database


def install_teams(fake: fteams.FakeTeams) -> None:
    TeamsInstallations("src").save(fteams.TENANT, service_url=fake.service_url)


PLATFORMS = {
    "webhook": Platform(WebhookConnector, fw.running, {"workspace_id": "W1", "container_id": "C1"}),
    "mattermost": Platform(
        MattermostConnector,
        fm.running,
        {"workspace_id": "teamteamteamteamteamteam01", "container_id": "channelchannelchannelchan1"},
        "message",
    ),
    "discord": Platform(
        DiscordConnector,
        fd.running,
        {"workspace_id": "900000000000000001", "container_id": "111111111111111111"},
        "content",
    ),
    "telegram": Platform(TelegramConnector, ft.running, {"workspace_id": "bot", "container_id": "1001"}),
    "teams": Platform(
        TeamsConnector,
        fteams.running,
        {"workspace_id": fteams.TENANT, "container_id": fteams.CHANNEL},
        install=install_teams,
    ),
    "google_chat": Platform(GoogleChatConnector, fg.running, {"workspace_id": "", "container_id": fg.SPACE}),
}


@pytest.fixture(params=list(PLATFORMS))
def platform(request: pytest.FixtureRequest, settings: Any) -> Iterator[Platform]:
    platform = PLATFORMS[request.param]
    with platform.running() as fake:
        settings.CONNECTOR_OUTBOX = {"CONNECTORS": {"src": {**fake.connector_settings(), "PACE": {}}}}
        platform.install(fake)
        yield platform


def test_every_shipped_http_connector_is_a_coroutine_connector() -> None:
    for backend in (p.backend for p in PLATFORMS.values()):
        assert backend.asend is not Connector.asend and backend.afind_sent is not Connector.afind_sent
        assert backend.aclose is not Connector.aclose


def test_a_coroutine_connector_sends_on_the_loop_not_the_threads() -> None:
    assert not sends_in_threads(WebhookConnector(source="hook", url="https://hooks.example.com/h"))


@pytest.mark.django_db(transaction=True)
def test_run_outbox_delivers_through_asend_never_the_blocking_send(platform, monkeypatch) -> None:
    refuse_blocking(monkeypatch, platform.backend)
    for n in range(3):
        Outbox("src").queue(f"p{n}", **platform.place, body={platform.text: f"p{n}"})

    call_command("run_outbox", "--once", "--source", "src")

    assert [Outbox("src").find(f"p{n}").state for n in range(3)] == ["posted"] * 3


def test_the_engine_tells_each_delivery_the_senders_concurrency() -> None:
    woken = threading.Event()
    engine: LoopEngine[str, int | None] = LoopEngine(7, woken.set)

    async def job() -> int | None:
        return in_flight_limit.get()

    try:
        engine.start([("k", job)])
        assert woken.wait(10)
        assert engine.take() == [("k", 7)]
    finally:
        engine.close([], forced=False)


def pool_of(connector: HttpConnector) -> int:
    """How many connections the loop's session may keep open at once."""
    pool = connector.async_client().connector
    assert pool is not None
    return pool.limit


def test_a_loops_client_keeps_as_many_connections_as_the_sender_has_sends_in_flight() -> None:
    connector = WebhookConnector(source="hook", url="https://hooks.example.com/h")

    async def sized(limit: int | None) -> tuple[int, bool]:
        in_flight_limit.set(limit)
        try:
            return pool_of(connector), connector.async_client() is connector.async_client()
        finally:
            await connector.aclose()

    assert asyncio.run(sized(1000)) == (1000, True)
    assert asyncio.run(sized(None)) == (DEFAULT_CONNECTIONS, True)


def test_each_loop_has_its_own_client_and_aclose_closes_only_its_own() -> None:
    connector = WebhookConnector(source="hook", url="https://hooks.example.com/h")
    other = asyncio.new_event_loop()

    async def client() -> Any:
        return connector.async_client()

    try:
        theirs = other.run_until_complete(client())

        async def mine_then_closed() -> tuple[bool, bool]:
            mine = connector.async_client()
            await connector.aclose()
            return mine is not theirs, mine.closed

        assert asyncio.run(mine_then_closed()) == (True, True)
        assert not theirs.closed
        connector.close()  # the other loop is idle: its client is closed too
        assert theirs.closed
    finally:
        other.close()


def test_sends_at_once_on_one_loop_share_its_client_and_each_is_delivered_once() -> None:
    with fw.running() as fake:
        connector = WebhookConnector(source="hook", **fake.connector_options())

        async def fifty() -> list[Any]:
            in_flight_limit.set(50)
            try:
                outcomes = await asyncio.gather(
                    *(
                        connector.asend(claimed_post("hook", f"p{n}", {"n": n}, container_id="C1"))
                        for n in range(50)
                    )
                )
                return [outcomes, len(connector._aclients)]
            finally:
                await connector.aclose()

        outcomes, clients = asyncio.run(fifty())

    assert all(isinstance(o, Delivered) for o in outcomes) and clients == 1
    assert sorted(d.key for d in fake.deliveries) == sorted(f"p{n}" for n in range(50))


# -- credentials read once per cache period, not once a send ---------------------------------


def handed_to_threads(monkeypatch: pytest.MonkeyPatch) -> list[Callable[[], Any]]:
    """The work that the coroutine forms hand to a thread, each time they do."""
    handed: list[Callable[[], Any]] = []
    blocking = http_module.blocking

    async def counted(call: Callable[..., Any], /, *args: Any) -> Any:
        handed.append(call)
        return await blocking(call, *args)

    monkeypatch.setattr(http_module, "blocking", counted)
    return handed


def webhook_with_destinations(stack: ExitStack) -> tuple[HttpConnector, dict[str, str]]:
    fake = stack.enter_context(fw.running(hooks={"/hooks/alerts": None}))
    Destinations("src").set("C1", fake.hook_url("/hooks/alerts"), workspace_id="W1")
    return WebhookConnector(source="src", installations=True, timeout=1), {
        "workspace_id": "W1",
        "container_id": "C1",
    }


def mattermost_with_installations(stack: ExitStack) -> tuple[HttpConnector, dict[str, str]]:
    token, channel = "mm-bot-token-8f2k4q9x7w3e5r1t", "channelchannelchannelchan1"
    fake = stack.enter_context(fm.running(token=token, channels=(channel,)))
    Installations("src").save("team-one", secrets={"bot_token": token}, extra={"url": fake.url})
    return MattermostConnector(source="src", installations=True, timeout=1), {
        "workspace_id": "team-one",
        "container_id": channel,
    }


def teams_installed(stack: ExitStack) -> tuple[HttpConnector, dict[str, str]]:
    fake = stack.enter_context(fteams.running())
    install_teams(fake)
    return TeamsConnector(source="src", **fake.connector_options()), {
        "workspace_id": fteams.TENANT,
        "container_id": fteams.CHANNEL,
    }


@pytest.mark.django_db
@pytest.mark.parametrize("setup", [webhook_with_destinations, mattermost_with_installations, teams_installed])
def test_a_send_whose_credentials_are_cached_takes_no_thread(setup, monkeypatch) -> None:
    handed = handed_to_threads(monkeypatch)
    with ExitStack() as stack:
        connector, place = setup(stack)
        form = CoroutineForm(connector)
        first = form.send(claimed_post("src", "p1", {"text": "p1", "message": "p1"}, **place))
        read = len(handed)
        second = form.send(claimed_post("src", "p2", {"text": "p2", "message": "p2"}, **place))
        form.close()

    assert isinstance(first, Delivered) and isinstance(second, Delivered)
    assert read >= 1  # the first send read the database, off the loop
    assert len(handed) == read  # the second used the cache: no thread
