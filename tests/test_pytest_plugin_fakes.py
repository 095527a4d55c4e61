"""The fake platforms' fixtures of the package's pytest plugin, as a project's tests use them."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.request
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest

from django_connector_outbox import Outbox
from django_connector_outbox.fakes.base import FakeServer

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = [
    "fake_slack",
    "fake_discord",
    "fake_google_chat",
    "fake_mattermost",
    "fake_teams",
    "fake_telegram",
    "fake_webhook",
]


def state(fake: FakeServer[Any, Any]) -> dict[str, Any]:
    with urllib.request.urlopen(f"{fake.origin}/_fake/state", timeout=5) as reply:
        data: dict[str, Any] = json.load(reply)
        return data


@pytest.mark.parametrize("name", FIXTURES)
def test_each_fixture_is_a_fake_started_on_loopback_that_received_nothing_yet(
    name: str, request: pytest.FixtureRequest
) -> None:
    fake: FakeServer[Any, Any] = request.getfixturevalue(name)

    assert fake.origin == f"http://127.0.0.1:{fake.port}"
    assert fake.calls == [] and state(fake)["calls"] == []
    assert fake.connector_settings()["OPTIONS"]  # what a source delivered to it is given


def test_a_post_queued_by_the_code_reaches_the_fake_slack(db, fake_slack, settings, outbox_deliver) -> None:
    settings.CONNECTOR_OUTBOX = {"CONNECTORS": {"slack": fake_slack.connector_settings()}}
    Outbox("slack").queue("p1", workspace_id="T0000000001", container_id="C0000000001", body={"text": "hi"})

    assert [p.post_id for p in outbox_deliver()["slack"]] == ["p1"]
    assert [m.text for m in fake_slack.messages("C0000000001")] == ["hi"]


def test_a_post_queued_by_the_code_reaches_the_fake_webhook(
    db, fake_webhook, settings, outbox_deliver
) -> None:
    settings.CONNECTOR_OUTBOX = {"CONNECTORS": {"hooks": fake_webhook.connector_settings()}}
    Outbox("hooks").queue("p1", workspace_id="w", container_id="c", body={"text": "hi"})

    assert [p.post_id for p in outbox_deliver()["hooks"]] == ["p1"]
    assert [(d.post_id, d.body) for d in fake_webhook.deliveries] == [("p1", {"text": "hi"})]


PROJECT_TESTS = """
from pathlib import Path

from django_connector_outbox import Outbox

PORTS = Path(__file__).with_name("ports.txt")


def test_a_post_reaches_the_fake_slack(db, fake_slack, settings, outbox_deliver):
    settings.CONNECTOR_OUTBOX = {"CONNECTORS": {"slack": fake_slack.connector_settings()}}
    Outbox("slack").queue("p1", workspace_id="T0000000001", container_id="C0000000001", body={"text": "hi"})
    outbox_deliver()
    assert [m.text for m in fake_slack.messages("C0000000001")] == ["hi"]
    with PORTS.open("a") as ports:
        ports.write(f"{fake_slack.port}\\n")


def test_every_fake_at_once_each_on_a_port_of_its_own(
    fake_slack, fake_discord, fake_google_chat, fake_mattermost, fake_teams, fake_telegram, fake_webhook
):
    fakes = [fake_slack, fake_discord, fake_google_chat, fake_mattermost, fake_teams, fake_telegram, fake_webhook]
    assert len({fake.port for fake in fakes}) == 7
    with PORTS.open("a") as ports:
        ports.writelines(f"{fake.port}\\n" for fake in fakes)
"""


def test_a_project_gets_the_fixtures_and_each_fake_is_stopped_after_its_test(tmp_path: Path) -> None:
    (tmp_path / "test_project.py").write_text(PROJECT_TESTS)
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        # A database of its own, beside this run's.
        "DATABASE_URL": f"sqlite:///{tmp_path / 'project.sqlite3'}",
        "SQLITE_TEST_NAME": str(tmp_path / "test-project.sqlite3"),
    }
    # Installed (tox), the plugin comes through its entry point; from a checkout, with -p.
    installed = bool(entry_points(group="pytest11", name="django_connector_outbox"))
    plugin = [] if installed else ["-p", "django_connector_outbox.pytest_plugin"]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", *plugin, "-p", "no:cacheprovider", "-q", "test_project.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "2 passed" in run.stdout

    ports = [int(line) for line in (tmp_path / "ports.txt").read_text().split()]
    assert len(ports) == 8
    for port in ports:  # stopped: nothing listens there any more
        with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
