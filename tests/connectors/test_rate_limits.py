"""Slack's and Discord's rate limits, from fakes that enforce them, to outcomes with a scope.

The fakes run on a clock the test moves (`Clock`), so a limit trips and resets exactly when
the test says; the connectors talk to them over real sockets.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from django_connector_outbox.connectors import Delivered, Hold, RateLimited, Scope
from django_connector_outbox.connectors.discord import DiscordConnector
from django_connector_outbox.connectors.slack import SlackConnector
from django_connector_outbox.fakes import discord as fd
from django_connector_outbox.fakes.base import Limit
from django_connector_outbox.fakes.slack import FakeSlack
from django_connector_outbox.posts import ClaimedPost
from tests.connectors.helpers import claimed_post

SLACK_TOKEN = "xoxb-rate-limits"
TEAM = "T0000000001"
CHANNELS = tuple(f"C{n:010d}" for n in range(1, 21))
DISCORD_TOKEN = "rate.limits.token"
GUILD = "900000000000000001"
ROOMS = ("111111111111111111", "111111111111111222", "111111111111111333")


class Clock:
    """The fakes' time: moves only when the test says."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(autouse=True)
def _no_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    # slack-sdk reads proxies from the environment; the fakes are on loopback.
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


def slack(clock: Clock, **limits: Any) -> FakeSlack:
    return FakeSlack(SLACK_TOKEN, channels=CHANNELS, team_id=TEAM, clock=clock, **limits).start()


@pytest.fixture
def make_slack(clock: Clock) -> Iterator[Any]:
    started: list[tuple[FakeSlack, SlackConnector]] = []

    def make(**limits: Any) -> tuple[FakeSlack, SlackConnector]:
        fake = slack(clock, **limits)
        started.append(
            (fake, SlackConnector(source="slack", token=SLACK_TOKEN, base_url=fake.base_url, timeout=5))
        )
        return started[-1]

    yield make
    for fake, connector in started:
        connector.close()
        fake.stop()


def message(channel: str, post_id: str = "p", *, workspace: str = TEAM, source: str = "slack") -> ClaimedPost:
    return claimed_post(source, post_id, {"text": post_id}, workspace_id=workspace, container_id=channel)


POSTED_429 = "slack error ratelimited on chat.postMessage (HTTP 429, Retry-After {})"


# -- Slack


def test_slack_a_channel_over_its_limit_is_held_for_the_fakes_retry_after(make_slack, clock) -> None:
    fake, connector = make_slack(channel_limit=Limit(1, 3))

    assert isinstance(connector.send(message(CHANNELS[0], "p1")), Delivered)
    clock.now += 1
    outcome = connector.send(message(CHANNELS[0], "p2"))

    assert outcome == RateLimited(2.0, POSTED_429.format(2), Scope.CONTAINER)
    assert (fake.limited, fake.statuses[429]) == ({"channel": 1}, 1)
    assert fake.accepted_times(CHANNELS[0]) == [clock.now - 1]


def test_slack_429s_spreading_over_two_channels_hold_the_workspace(make_slack, clock) -> None:
    fake, connector = make_slack(workspace_limit=Limit(2, 60))
    for channel in CHANNELS[:2]:
        assert isinstance(connector.send(message(channel)), Delivered)

    first = connector.send(message(CHANNELS[2]))
    second = connector.send(message(CHANNELS[3]))

    # A bucket of 2 a minute lets one more through each 30 s.
    assert first == RateLimited(30.0, POSTED_429.format(30), Scope.CONTAINER)
    assert second == RateLimited(
        30.0,
        POSTED_429.format(30) + f"; 429s in 2 channels of workspace {TEAM} within 10s",
        Scope.WORKSPACE,
    )
    assert fake.limited == {"workspace": 2}


def test_slack_429s_of_one_channel_hold_only_that_channel(make_slack) -> None:
    fake, connector = make_slack(channel_limit=Limit(1, 60))
    connector.send(message(CHANNELS[0]))

    outcomes = [connector.send(message(CHANNELS[0])) for _ in range(3)]

    assert [o.scope for o in outcomes if isinstance(o, RateLimited)] == [Scope.CONTAINER] * 3


def test_slack_429s_further_apart_than_the_window_hold_their_channels(make_slack) -> None:
    fake, connector = make_slack(workspace_limit=Limit(1, 600))
    connector.send(message(CHANNELS[0]))
    seconds = iter([100.0, 110.0])
    connector.recent_429s.clock = lambda: next(seconds)

    outcomes = [connector.send(message(channel)) for channel in CHANNELS[1:3]]

    assert [o.scope for o in outcomes if isinstance(o, RateLimited)] == [Scope.CONTAINER] * 2


def test_slack_429s_of_two_workspaces_do_not_add_up(make_slack) -> None:
    fake, connector = make_slack(workspace_limit=Limit(1, 600))
    connector.send(message(CHANNELS[0]))

    outcomes = [
        connector.send(message(CHANNELS[1], workspace="T1")),
        connector.send(message(CHANNELS[2], workspace="T2")),
    ]

    assert [o.scope for o in outcomes if isinstance(o, RateLimited)] == [Scope.CONTAINER] * 2


def test_slack_threads_hitting_a_workspace_limit_at_once_agree_that_it_is_the_workspaces(make_slack) -> None:
    fake, connector = make_slack(workspace_limit=Limit(1, 600))
    connector.send(message(CHANNELS[0]))

    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(lambda c: connector.send(message(c)), CHANNELS[1:]))

    scopes = [o.scope for o in outcomes if isinstance(o, RateLimited)]
    # The first 429 noted holds its channel; every later one sees the spread.
    assert sorted(scopes) == [Scope.CONTAINER] + [Scope.WORKSPACE] * (len(CHANNELS) - 2)
    assert fake.statuses[429] == len(CHANNELS) - 1


def test_slack_a_tiered_methods_429_holds_the_workspace(make_slack) -> None:
    fake, connector = make_slack(method_limits={"reactions.add": Limit(1, 60)})
    ts = connector.send(message(CHANNELS[0])).message_ref.split(":")[1]
    react = {"name": "eyes", "timestamp": ts}

    assert connector.send(
        claimed_post("slack", "r1", react, kind="reaction", workspace_id=TEAM, container_id=CHANNELS[0])
    ) == Delivered(None)
    outcome = connector.send(
        claimed_post(
            "slack",
            "r2",
            {**react, "name": "tada"},
            kind="reaction",
            workspace_id=TEAM,
            container_id=CHANNELS[1],
        )
    )

    assert outcome == RateLimited(
        60.0, "slack error ratelimited on reactions.add (HTTP 429, Retry-After 60)", Scope.WORKSPACE
    )
    assert fake.limited == {"reactions.add": 1}


def test_slack_the_channel_limit_allows_its_burst_then_one_per_interval(make_slack, clock) -> None:
    fake, connector = make_slack(channel_limit=Limit(2, 2))

    sends = [connector.send(message(CHANNELS[0], f"p{n}")) for n in range(3)]
    clock.now += 1
    sends.append(connector.send(message(CHANNELS[0], "p3")))

    assert [type(o).__name__ for o in sends] == ["Delivered", "Delivered", "RateLimited", "Delivered"]


# -- Discord


@pytest.fixture
def make_discord(clock: Clock) -> Iterator[Any]:
    started: list[tuple[fd.FakeDiscord, DiscordConnector]] = []

    def make(**limits: Any) -> tuple[fd.FakeDiscord, DiscordConnector]:
        fake = fd.FakeDiscord(DISCORD_TOKEN, channels=ROOMS, clock=clock, **limits).start()
        connector = DiscordConnector(source="discord", token=DISCORD_TOKEN, base_url=fake.base_url, timeout=5)
        started.append((fake, connector))
        return fake, connector

    yield make
    for fake, connector in started:
        connector.close()
        fake.stop()


def discord_post(channel: str, post_id: str = "p", **fields: Any) -> ClaimedPost:
    return claimed_post(
        "discord", post_id, {"content": post_id}, workspace_id=GUILD, container_id=channel, **fields
    )


def test_discord_the_send_that_empties_a_bucket_holds_the_channel_until_it_resets(
    make_discord, clock
) -> None:
    fake, connector = make_discord(route_limit=Limit(2, 5))

    first = connector.send(discord_post(ROOMS[0], "p1"))
    clock.now += 1.5
    second = connector.send(discord_post(ROOMS[0], "p2"))

    assert isinstance(first, Delivered) and first.hold is None
    assert isinstance(second, Delivered) and second.message_ref
    assert second.hold == Hold(
        3.5,
        "discord bucket fake-create_message empty (X-RateLimit-Remaining 0, Reset-After 3.5)",
        Scope.CONTAINER,
    )


def test_discord_a_channel_past_its_bucket_is_held_and_counted_as_an_invalid_request(
    make_discord, clock
) -> None:
    fake, connector = make_discord(route_limit=Limit(1, 5))
    connector.send(discord_post(ROOMS[0], "p1"))
    clock.now += 2

    outcome = connector.send(discord_post(ROOMS[0], "p2"))

    assert outcome == RateLimited(
        3.0, "discord HTTP 429 You are being rate limited. (rate limited, scope user)"
    )
    assert (fake.limited, fake.invalid_requests) == ({"route": 1}, 1)
    # Another channel has a bucket of its own.
    assert isinstance(connector.send(discord_post(ROOMS[1], "p3")), Delivered)


def test_discord_a_bucket_resets_after_its_window(make_discord, clock) -> None:
    fake, connector = make_discord(route_limit=Limit(1, 5))
    connector.send(discord_post(ROOMS[0], "p1"))
    clock.now += 5

    outcome = connector.send(discord_post(ROOMS[0], "p2"))

    assert isinstance(outcome, Delivered) and outcome.hold == Hold(
        5.0, "discord bucket fake-create_message empty (X-RateLimit-Remaining 0, Reset-After 5)"
    )
    assert fake.accepted_times(ROOMS[0], route="create_message") == [clock.now - 5, clock.now]


def test_discord_the_global_limit_holds_the_source(make_discord, clock) -> None:
    fake, connector = make_discord(global_limit=Limit(2, 1))
    for room in ROOMS[:2]:
        assert isinstance(connector.send(discord_post(room)), Delivered)
    clock.now += 0.25

    outcome = connector.send(discord_post(ROOMS[2]))

    assert outcome == RateLimited(
        0.75, "discord HTTP 429 You are being rate limited. (rate limited, scope global)", Scope.SOURCE
    )
    assert fake.limited == {"global": 1}


def test_discord_an_edit_or_reaction_that_empties_its_bucket_holds_too(make_discord) -> None:
    fake, connector = make_discord(route_limit=Limit(1, 2))
    ref = connector.send(discord_post(ROOMS[0], "s", kind="status")).message_ref

    edited = connector.send(discord_post(ROOMS[0], "s", kind="status", message_ref=ref))
    reacted = connector.send(
        claimed_post(
            "discord",
            "r",
            {"message_id": ref, "emoji": "👍"},
            kind="reaction",
            workspace_id=GUILD,
            container_id=ROOMS[0],
        )
    )

    assert edited == Delivered(
        ref, Hold(2.0, "discord bucket fake-edit_message empty (X-RateLimit-Remaining 0, Reset-After 2)")
    )
    assert reacted == Delivered(
        None, Hold(2.0, "discord bucket fake-create_reaction empty (X-RateLimit-Remaining 0, Reset-After 2)")
    )


def test_discord_without_limits_nothing_is_held(make_discord) -> None:
    fake, connector = make_discord()

    outcome = connector.send(discord_post(ROOMS[0]))

    assert isinstance(outcome, Delivered) and outcome.hold is None
    assert fake.statuses == {200: 1}
