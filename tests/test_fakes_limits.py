"""The fakes' rate-limit machinery: buckets, windows, the pace check and the records."""

from __future__ import annotations

import argparse
import json
import urllib.request

import pytest

from django_connector_outbox.fakes import discord as fd
from django_connector_outbox.fakes import mattermost as fm
from django_connector_outbox.fakes import slack as fs
from django_connector_outbox.fakes.base import (
    Bucket,
    Limit,
    Window,
    add_chat_arguments,
    chat_limits,
    within_pace,
)


def test_a_bucket_lets_its_count_through_at_once_then_refills_at_its_rate() -> None:
    bucket = Bucket(Limit(3, 3))
    waits = []
    for _ in range(4):
        waits.append(bucket.wait(0))
        if waits[-1] == 0:
            bucket.take(0)

    assert waits == [0, 0, 0, 1.0]
    assert bucket.wait(1.0) == 0


def test_a_window_resets_all_at_once_when_its_time_is_up() -> None:
    window = Window(Limit(2, 5))
    window.take(10)
    window.take(11)

    assert (window.remaining(), window.wait(12)) == (0, 3)
    assert window.wait(15) == 0
    window.take(15)
    assert window.remaining() == 1


@pytest.mark.parametrize(
    ("times", "expected"),
    [
        ([0, 0, 1, 2, 3], True),  # a burst of two, then one a second
        ([0, 0, 0], False),  # three at once
        ([0, 1, 1.2, 1.4], False),  # faster than one a second, its burst spent
        ([], True),
        ([5, 0, 0, 1], True),  # order does not matter
    ],
)
def test_within_pace_checks_a_token_bucket(times: list[float], expected: bool) -> None:
    assert within_pace(times, 2, 2) is expected


def test_within_pace_tolerates_the_given_jitter() -> None:
    assert not within_pace([0, 0.99], 1, 1)
    assert within_pace([0, 0.99], 1, 1, tolerance=0.02)


def test_the_limit_option_names_each_fakes_limits() -> None:
    parser = argparse.ArgumentParser()
    add_chat_arguments(parser, token="t", channel="C1")
    options = parser.parse_args(["--limit", "channel=1/1", "--limit", "chat.update=50/60"])

    assert chat_limits(options) == {"channel": Limit(1, 1.0), "chat.update": Limit(50, 60.0)}


def test_a_scripted_429_is_counted_and_the_state_shows_the_records() -> None:
    with fs.running(token="xoxb-t", channels=("C1",)) as fake:
        fake.script("chat.postMessage", fs.ratelimit("2"))
        for _ in range(2):
            request = urllib.request.Request(
                fake.base_url + "chat.postMessage",
                data=json.dumps({"channel": "C1", "text": "hi"}).encode(),
                headers={"Authorization": "Bearer xoxb-t", "Content-Type": "application/json"},
            )
            try:
                urllib.request.urlopen(request, timeout=5).close()
            except urllib.error.HTTPError as error:
                assert error.code == 429
        with urllib.request.urlopen(f"http://127.0.0.1:{fake.port}/_fake/state", timeout=5) as reply:
            state = json.load(reply)

    assert state["statuses"] == {"429": 1, "200": 1}
    assert [route for _, route, _ in state["accepted"]] == ["chat.postMessage"]
    # A scripted 429 is the fake's answer, not a limit it enforces.
    assert fake.limited == {}


def test_discord_shared_429s_are_not_invalid_requests() -> None:
    with fd.running(token="tok", channels=("1",)) as fake:
        fake.script("create_message", fd.ratelimit(1.0, scope="shared"), fd.ratelimit(1.0))
        for _ in range(2):
            request = urllib.request.Request(
                fake.base_url + "/channels/1/messages",
                data=b'{"content": "hi"}',
                headers={"Authorization": "Bot tok", "Content-Type": "application/json"},
            )
            with pytest.raises(urllib.error.HTTPError):
                urllib.request.urlopen(request, timeout=5)

    assert (fake.statuses[429], fake.invalid_requests) == (2, 1)


def test_mattermost_limits_the_token_with_its_burst_then_its_rate_and_says_so_in_headers() -> None:
    now = [1000.0]
    limit = fm.mattermost_limit(per_sec=10, burst=2)  # three at once, then one each 0.1 s
    with fm.running(token="tok", channels=("c1",), limit=limit, clock=lambda: now[0]) as fake:

        def create() -> tuple[int, dict[str, str], bytes]:
            request = urllib.request.Request(
                fake.url + "/api/v4/posts",
                data=b'{"channel_id": "c1", "message": "hi"}',
                headers={"Authorization": "Bearer tok", "Content-Type": "application/json"},
            )
            try:
                with urllib.request.urlopen(request, timeout=5) as reply:
                    return reply.status, dict(reply.headers), reply.read()
            except urllib.error.HTTPError as error:
                return error.code, dict(error.headers), error.read()

        answers = [create() for _ in range(4)]
        now[0] += 0.1
        after_refill = create()

    assert [status for status, _, _ in answers] == [201, 201, 201, 429]
    assert [h["X-Ratelimit-Remaining"] for _, h, _ in answers] == ["2", "1", "0", "0"]
    status, headers, body = answers[3]
    assert (headers["Retry-After"], headers["X-Ratelimit-Limit"], body) == ("1", "3", b"limit exceeded\n")
    assert headers["Content-Type"].startswith("text/plain")
    assert after_refill[0] == 201
    assert fake.statuses == {201: 4, 429: 1}
