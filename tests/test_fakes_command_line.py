"""``python -m django_connector_outbox.fakes.NAME``: each fake in a process of its own prints its
URL and the settings to paste, and those settings, pasted, deliver to it."""

from __future__ import annotations

import ast
import json
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any
from urllib.parse import urlsplit

import pytest
from django.utils.module_loading import import_string

from django_connector_outbox.connectors.base import Connector, Delivered
from django_connector_outbox.fakes import discord, google_chat, mattermost, slack, teams, telegram, webhook
from django_connector_outbox.fakes.base import SERVING, FakeServer, python_literal, usage
from tests.connectors.helpers import claimed_post

DEADLINE = 20.0  # seconds for a fake to print all it prints: it imports little but the standard library


@dataclass(frozen=True)
class Printed:
    """What a fake's process printed before serving."""

    url: str
    text: str

    def settings(self) -> list[dict[str, Any]]:
        """Every ``CONNECTOR_OUTBOX = {...}`` block printed, evaluated as settings.py would."""
        blocks = re.findall(r"^CONNECTOR_OUTBOX = (\{.*?^\})$", self.text, re.M | re.S)
        return [ast.literal_eval(block) for block in blocks]


@contextmanager
def fake_process(module: str, *args: str) -> Iterator[Printed]:
    """`module` run as ``python -m`` on a free port; what it printed up to `SERVING`, read within
    `DEADLINE`; SIGTERM at the end, which it must exit 0 on."""
    process = subprocess.Popen(
        [sys.executable, "-m", f"django_connector_outbox.fakes.{module}", "--port", "0", *args],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=read_lines, args=(process.stdout, lines), daemon=True)
    reader.start()
    try:
        printed: list[str] = []
        deadline = time.monotonic() + DEADLINE
        while not printed or printed[-1].strip() != SERVING:
            try:
                printed.append(lines.get(timeout=max(deadline - time.monotonic(), 0.001)))
            except queue.Empty:
                pytest.fail(f"{module} printed no {SERVING!r} within {DEADLINE} s: {''.join(printed)!r}")
        yield Printed(printed[0].strip(), "".join(printed[1:]))
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
        reader.join(timeout=10)
        process.stdout.close()


def read_lines(stream: IO[str], lines: queue.Queue[str]) -> None:
    for line in stream:
        lines.put(line)


def origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def build(settings: dict[str, Any], source: str) -> Connector:
    spec = settings["CONNECTORS"][source]
    connector: Connector = import_string(spec["BACKEND"])(source=source, **spec["OPTIONS"])
    return connector


def state(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/_fake/state", timeout=5) as reply:
        data: dict[str, Any] = json.load(reply)
        return data


CHATS = [
    # module, its URL printed first, the place of a post to it, the post's body
    pytest.param(
        "slack", r"http://127\.0\.0\.1:\d+/api/", ("T0000000001", "C0000000001"), "text", id="slack"
    ),
    pytest.param(
        "discord", r"http://127\.0\.0\.1:\d+/api/v10", ("", "111111111111111111"), "content", id="discord"
    ),
    pytest.param(
        "mattermost",
        r"http://127\.0\.0\.1:\d+",
        ("", "channelchannelchannelchan1"),
        "message",
        id="mattermost",
    ),
    pytest.param("telegram", r"http://127\.0\.0\.1:\d+", ("", "1001"), "text", id="telegram"),
    pytest.param("webhook", r"http://127\.0\.0\.1:\d+/hook", ("", "anywhere"), "text", id="webhook"),
]


@pytest.mark.parametrize(("module", "url", "place", "field"), CHATS)
def test_the_printed_settings_deliver_a_post_to_the_fake_in_its_own_process(
    module: str, url: str, place: tuple[str, str], field: str
) -> None:
    with fake_process(module) as printed:
        assert re.fullmatch(url, printed.url)
        [settings, *_] = printed.settings()
        connector = build(settings, module)
        try:
            post = claimed_post(module, "p1", {field: "hello"}, workspace_id=place[0], container_id=place[1])
            outcome = connector.send(post)
        finally:
            connector.close()
        assert isinstance(outcome, Delivered), outcome
        assert "hello" in json.dumps(state(origin(printed.url)))


def test_the_printed_teams_settings_and_installation_deliver_a_post_to_the_fake(db) -> None:
    with fake_process("teams", "--app-password", "pw-from-the-flag") as printed:
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", printed.url)
        [settings] = printed.settings()
        assert settings["CONNECTORS"]["teams"]["OPTIONS"]["app_password"] == "pw-from-the-flag"
        # The installation to record, as printed for manage.py shell.
        shell = re.search(
            r"^from django_connector_outbox.installations.teams import .*?\n\n", printed.text, re.M | re.S
        )
        assert shell is not None and f'service_url="{printed.url}/teams/"' in shell.group()
        exec(shell.group(), {})
        connector = build(settings, "teams")
        try:
            post = claimed_post(
                "teams", "p1", {"text": "hello"}, workspace_id=teams.TENANT, container_id=teams.CHANNEL
            )
            outcome = connector.send(post)
        finally:
            connector.close()
        assert isinstance(outcome, Delivered), outcome
        assert [a["text"] for a in state(printed.url)["conversations"][teams.CHANNEL]] == ["hello"]


def test_the_fake_slack_prints_add_to_slack_with_its_client_id_and_secret_and_how_to_add_a_workspace() -> (
    None
):
    with fake_process("slack", "--client-id", "42.42", "--team", "T0000000007") as printed:
        [with_token, installations] = printed.settings()
        options = installations["CONNECTORS"]["slack"]["OPTIONS"]
        assert options == {
            "installations": True,
            "client_id": "42.42",
            "client_secret": slack.CLIENT_SECRET,
            "scopes": slack.DEFAULT_SCOPES.split(","),
            "base_url": printed.url,
        }
        assert with_token["CONNECTORS"]["slack"]["OPTIONS"] == {
            "token": "xoxb-fake-token",
            "base_url": printed.url,
        }
        assert 'workspace_id="T0000000007"' in printed.text
        assert f"curl -X POST {origin(printed.url)}/_fake/teams" in printed.text
        assert f"curl -X POST {origin(printed.url)}/_fake/authorize" in printed.text
        assert "&team=" in printed.text and "/slack/install/slack/" in printed.text


def test_source_names_the_source_of_the_printed_settings() -> None:
    with fake_process("webhook", "--source", "hooks", "--secret", "s3cret") as printed:
        [settings] = printed.settings()
    assert settings["CONNECTORS"]["hooks"]["OPTIONS"]["secret"] == "s3cret"
    assert "signature" in printed.text


def test_host_is_where_the_fake_listens_and_what_its_urls_name() -> None:
    with fake_process("discord", "--host", "localhost") as printed:
        assert re.fullmatch(r"http://localhost:\d+/api/v10", printed.url)
        assert state(origin(printed.url))["calls"] == []


FAKES = [
    slack.FakeSlack,
    discord.FakeDiscord,
    google_chat.FakeGoogleChat,
    mattermost.FakeMattermost,
    teams.FakeTeams,
    telegram.FakeTelegram,
]


@pytest.mark.parametrize("fake_class", [*FAKES, webhook.FakeWebhook], ids=lambda c: c.__name__)
def test_help_lists_the_shared_options_and_the_fakes_own(
    fake_class: type[FakeServer[Any, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    module = sys.modules[fake_class.__module__]
    with pytest.raises(SystemExit) as exited:
        module.main(["--help"])

    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: python -m {fake_class.__module__} ")
    own = {
        "FakeSlack": "--client-secret",
        "FakeDiscord": "--token",
        "FakeGoogleChat": "--space",
        "FakeMattermost": "--token",
        "FakeTeams": "--app-password",
        "FakeTelegram": "--token",
        "FakeWebhook": "--secret",
    }
    assert all(flag in out for flag in ("--host", "--port", "--source", "--latency", own[fake_class.__name__]))


def test_latency_holds_each_answer_as_a_platforms_round_trip() -> None:
    with fake_process("discord", "--latency", "0.3") as printed:
        started = time.monotonic()
        assert state(origin(printed.url))["calls"] == []  # _fake/state answers at once...
        at_once = time.monotonic() - started
        bot = {"Authorization": "Bot fake-discord-bot-token"}
        started = time.monotonic()
        with urllib.request.urlopen(urllib.request.Request(f"{printed.url}/users/@me", headers=bot)) as answer:
            assert json.load(answer)["bot"] is True
        held = time.monotonic() - started

    assert held >= 0.3 > at_once  # ...and the platform's own answers after the latency


@pytest.mark.parametrize("fake_class", [*FAKES, webhook.FakeWebhook], ids=lambda c: c.__name__)
def test_the_printed_settings_are_the_fakes_connector_settings(
    fake_class: type[FakeServer[Any, Any]],
) -> None:
    with fake_class.running() as fake:
        text = usage(fake, "mine")
        expected = {"CONNECTORS": {"mine": fake.connector_settings()}}
    settings = re.search(r"^CONNECTOR_OUTBOX = (\{.*?^\})$", text, re.M | re.S)
    assert settings is not None
    assert ast.literal_eval(settings.group(1)) == expected
    assert text.endswith(SERVING)


def test_a_fake_listening_on_every_address_is_reached_on_loopback() -> None:
    with webhook.FakeWebhook(host="0.0.0.0") as fake:
        assert fake.url == f"http://127.0.0.1:{fake.port}/hook"
        assert state(fake.origin) == {"calls": [], "deliveries": []}


def test_python_literal_writes_settings_that_evaluate_to_the_same_values() -> None:
    value = {"a": {"b": [1, "two", None], "c": True, "d": 'quote " and \\ and é'}, "e": {}, "f": 2.5}

    text = python_literal(value)

    assert ast.literal_eval(text) == value
    assert text.splitlines()[:3] == ["{", '    "a": {', '        "b": [1, "two", None],']


def test_a_fake_listens_on_ipv6_loopback_when_told_to() -> None:
    try:
        fake = webhook.FakeWebhook(host="::1").start()
    except OSError as err:  # a machine without IPv6
        pytest.skip(f"no IPv6 loopback here: {err}")
    try:
        assert fake.url == f"http://[::1]:{fake.port}/hook"
        assert state(fake.origin)["deliveries"] == []
    finally:
        fake.stop()
