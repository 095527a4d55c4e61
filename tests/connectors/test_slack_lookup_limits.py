"""A lost reply's lookup within a non-Marketplace app's limits: conversations.history and
.replies at 15 a page and one call a minute per workspace (the fake Slack's `non_marketplace`).
A lookup reads one page, in a window tight around its claim, and the next one goes on where it
stopped; a 429 is "ask later", never "not there"."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from django_connector_outbox.connectors.base import CheckLater
from django_connector_outbox.connectors.slack import SlackConnector
from django_connector_outbox.fakes.slack import FakeSlack
from tests.connectors.helpers import claimed_post

TOKEN = "xoxb-lookup-limits"
CHANNEL = "C0000000001"
TEAM = "T0000000001"


class Clock:
    """The fake's clock (its message ts and its rate limits), moved by the test."""

    def __init__(self) -> None:
        self.now = time.time()  # the claims' sent_at is the wall clock's: the same window

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def fake(clock: Clock, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSlack]:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    server = FakeSlack(TOKEN, channels=(CHANNEL,), team_id=TEAM, non_marketplace=True, clock=clock).start()
    yield server
    server.stop()


@pytest.fixture
def connector(fake: FakeSlack) -> Iterator[SlackConnector]:
    built = SlackConnector(source="slack", token=TOKEN, base_url=fake.base_url, timeout=2)
    yield built
    built.close()


def claim(post_id: str, **more: Any) -> Any:
    return claimed_post("slack", post_id, {"text": post_id}, workspace_id=TEAM, container_id=CHANNEL, **more)


def posted_then_lost(connector: SlackConnector, post_id: str) -> tuple[Any, str]:
    """The claim of a post that reached Slack (its reply lost), and the ts Slack gave it."""
    sent = claim(post_id)
    ref = connector.send(sent).message_ref  # type: ignore[union-attr]
    return claim(post_id, stale=True, sent_at=sent.sent_at), ref


def test_a_lost_reply_in_a_quiet_channel_is_found_with_one_call_of_fifteen(connector, fake):
    fake.add_message(CHANNEL, "before")
    stale, ref = posted_then_lost(connector, "p1")

    assert connector.find_sent(stale) == ref
    [args] = fake.calls_of("conversations.history")
    assert args["limit"] == "15" and "latest" in args
    assert fake.statuses[429] == 0


def test_in_a_busy_channel_the_lookup_reads_a_page_a_minute_and_finds_it_on_the_second(
    connector, fake, clock
):
    stale, ref = posted_then_lost(connector, "p1")
    for i in range(20):  # newer than ours: history is newest first, ours is on page two
        fake.add_message(CHANNEL, f"chatter {i}")

    with pytest.raises(CheckLater, match="one a minute"):
        connector.find_sent(stale)  # page one: not there, and no second call this minute
    assert (len(fake.calls_of("conversations.history")), fake.statuses[429]) == (1, 0)
    with pytest.raises(CheckLater, match="ratelimited"):
        connector.find_sent(stale)  # too soon: Slack's 429 is "ask later", never "not there"
    clock.now += 60
    assert connector.find_sent(stale) == ref  # page two, where the first lookup stopped

    pages = fake.calls_of("conversations.history")
    assert "cursor" not in pages[0] and pages[-1]["cursor"]
    assert fake.statuses[429] == 1


def test_a_larger_limit_reads_fifteen_as_slack_does_for_such_an_app(fake):
    from slack_sdk import WebClient

    for i in range(30):
        fake.add_message(CHANNEL, f"chatter {i}")
    client = WebClient(token=TOKEN, base_url=fake.base_url, retry_handlers=[])

    assert len(client.conversations_history(channel=CHANNEL, limit=200)["messages"]) == 15
