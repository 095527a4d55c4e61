"""pytest fixtures for a project's tests, loaded by the package's ``pytest11`` entry point.

pytest loads this in every run where the package is installed, Django project or not, so
it imports nothing of Django at import time; the fixtures import `testing` when used.

`fake_slack`, `fake_discord`, `fake_google_chat`, `fake_mattermost`, `fake_teams`,
`fake_telegram` and `fake_webhook` are the shipped fake platforms (django_connector_outbox.fakes), each started on
a free port of 127.0.0.1 for one test and stopped after it: what ``python -m
django_connector_outbox.fakes.NAME`` serves, in the test's process, so that the test reads what
it received (`calls`, and each platform's own records) and scripts its failures.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

if TYPE_CHECKING:
    from django_connector_outbox.connectors.memory import MemoryConnector
    from django_connector_outbox.fakes.base import FakeServer
    from django_connector_outbox.fakes.discord import FakeDiscord
    from django_connector_outbox.fakes.google_chat import FakeGoogleChat
    from django_connector_outbox.fakes.mattermost import FakeMattermost
    from django_connector_outbox.fakes.slack import FakeSlack
    from django_connector_outbox.fakes.teams import FakeTeams
    from django_connector_outbox.fakes.telegram import FakeTelegram
    from django_connector_outbox.fakes.webhook import FakeWebhook
    from django_connector_outbox.testing import Deliveries, TestClock

    FakeT = TypeVar("FakeT", bound=FakeServer[Any, Any])


@pytest.fixture(autouse=True)
def _outbox_fresh_connectors() -> Iterator[None]:
    """Each test starts with connectors built afresh (memory ones empty), as pytest-django
    empties mail.outbox; only where the registry has been imported, so a run without Django
    stays without it."""
    registry = sys.modules.get("django_connector_outbox.connectors")
    if registry is not None:
        registry.connectors.reset()
    yield


@pytest.fixture
def outbox_clock() -> TestClock:
    """A `TestClock` at now, ticking; `outbox_deliver` and ``clock=`` seams read it."""
    from django_connector_outbox.testing import TestClock

    return TestClock()


@pytest.fixture
def outbox_memory() -> Iterator[dict[str, MemoryConnector]]:
    """Every configured source delivered by a MemoryConnector: source -> its connector."""
    from django_connector_outbox.testing import memory_connectors

    with memory_connectors() as platforms:
        yield platforms


@pytest.fixture
def outbox_deliver(outbox_clock: TestClock) -> Callable[..., Deliveries]:
    """`deliver_due` on `outbox_clock`: ``outbox_deliver()["slack"]`` is what Slack received."""
    from django_connector_outbox.testing import deliver_due

    return functools.partial(deliver_due, clock=outbox_clock)


@pytest.fixture
def outbox_adeliver(outbox_clock: TestClock) -> Callable[..., Awaitable[Deliveries]]:
    """`adeliver_due` on `outbox_clock`, for async tests: ``(await outbox_adeliver())["slack"]``."""
    from django_connector_outbox.testing import adeliver_due

    return functools.partial(adeliver_due, clock=outbox_clock)


# -- the fake platforms: each yields the started fake (its `connector_settings()` are the
# CONNECTOR_OUTBOX source that it delivers), and stops it after the test.


def _serve(fake_class: type[FakeT]) -> Iterator[FakeT]:
    with fake_class.running() as fake:
        yield fake


@pytest.fixture
def fake_slack(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSlack]:
    """A fake Slack Web API: one workspace T0000000001 with channel C0000000001 and the bot
    token xoxb-fake-token; `base_url`, `messages(channel)`, `calls_of(method)`, `add_team` ..."""
    from django_connector_outbox.fakes.slack import FakeSlack

    # slack-sdk sends through a proxy named in the environment, NO_PROXY or not: never to a
    # fake on loopback.
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    yield from _serve(FakeSlack)


@pytest.fixture
def fake_discord() -> Iterator[FakeDiscord]:
    """A fake Discord REST API: channel 111111111111111111, the bot token fake-discord-bot-token;
    `base_url`, `messages(channel)`, `calls_of(route)` ..."""
    from django_connector_outbox.fakes.discord import FakeDiscord

    yield from _serve(FakeDiscord)


@pytest.fixture
def fake_google_chat() -> Iterator[FakeGoogleChat]:
    """A fake Google Chat: its token endpoint and the Chat API, space spaces/AAAAfakeSpc, a
    service account key of its own; `connector_options()`, `messages(space)`, `calls_of(route)` ..."""
    from django_connector_outbox.fakes.google_chat import FakeGoogleChat

    yield from _serve(FakeGoogleChat)


@pytest.fixture
def fake_mattermost() -> Iterator[FakeMattermost]:
    """A fake Mattermost server: channel channelchannelchannelchan1, the token
    fake-mattermost-bot-token; `url`, `posts(channel)`, `calls_of(route)` ..."""
    from django_connector_outbox.fakes.mattermost import FakeMattermost

    yield from _serve(FakeMattermost)


@pytest.fixture
def fake_teams() -> Iterator[FakeTeams]:
    """A fake Azure AD token endpoint and Bot Connector: one conversation of tenant
    11111111-2222-3333-4444-555555555555; `login_url`, `service_url` (for the tenant's
    installation), `activities(conversation)` ..."""
    from django_connector_outbox.fakes.teams import FakeTeams

    yield from _serve(FakeTeams)


@pytest.fixture
def fake_telegram() -> Iterator[FakeTelegram]:
    """A fake Telegram Bot API: chat 1001, the token 123456789:fake-telegram-bot-token;
    `base_url`, `messages(chat_id)`, `calls_of(method)` ..."""
    from django_connector_outbox.fakes.telegram import FakeTelegram

    yield from _serve(FakeTelegram)


@pytest.fixture
def fake_webhook() -> Iterator[FakeWebhook]:
    """A webhook receiver, unsigned: `url`, `lookup_url`, `deliveries`, `calls` ..."""
    from django_connector_outbox.fakes.webhook import FakeWebhook

    yield from _serve(FakeWebhook)
