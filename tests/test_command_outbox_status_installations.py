"""outbox_status of a source with installations: revoked workspaces (when, why), refreshes
failing, workspaces with posts waiting and no installation; under 1 s at 10,000 installations."""

from __future__ import annotations

import io
import json
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone

from django_connector_outbox import Outbox
from django_connector_outbox.connectors.memory import MemoryConnector
from django_connector_outbox.installations import Installations
from django_connector_outbox.models import Installation

pytestmark = pytest.mark.django_db


class ManyWorkspaces(MemoryConnector):
    """The memory connector, configured as a source with installations."""

    def __init__(self, source: str, *, installations: bool = False) -> None:
        super().__init__(source)


CONFIG = {
    "CONNECTORS": {
        "slack": {"BACKEND": f"{__name__}.ManyWorkspaces", "OPTIONS": {"installations": True}},
        "memory": {"BACKEND": "django_connector_outbox.connectors.memory.MemoryConnector"},
    }
}
AT = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def configured(settings):
    settings.CONNECTOR_OUTBOX = CONFIG


def status(*args: str) -> str:
    out = io.StringIO()
    call_command("outbox_status", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def troubled() -> None:
    """T1 fine; T2 failing to refresh; T3 revoked; posts wait in T1, T4 and T5 (T4, T5 have no
    installation), and in T6 served by the org-wide installation E1; the memory source (no
    installations) has posts in T9."""
    slack = Installations("slack", clock=lambda: AT)
    slack.save("T1", secrets={"bot_token": "xoxb-1"})
    slack.save("T2", secrets={"bot_token": "xoxb-2", "bot_refresh_token": "xoxe-2"})
    slack.save("T3", secrets={"bot_token": "xoxb-3"})
    slack.save("E1", secrets={"bot_token": "xoxb-e"}, is_enterprise_install=True)
    slack.set_teams("E1", ["T6"])
    Installation.objects.filter(workspace_id="T2").update(refresh_error="slack error invalid_refresh_token")
    slack.revoke("T3", "token_revoked")
    outbox = Outbox("slack")
    for n, workspace in enumerate(["T1", "T4", "T5", "T5", "T6"]):
        assert outbox.queue(f"p{n}", workspace_id=workspace, container_id="C1", body={"text": "x"})
    assert Outbox("memory").queue("m1", workspace_id="T9", container_id="C1", body={"text": "x"})


def test_the_status_lists_each_workspace_problem_of_a_source_with_installations(troubled):
    assert status().splitlines()[3:] == [
        "workspaces of slack: 1 revoked, 1 failing to refresh, 2 with posts waiting and no installation",
        "  T3 revoked at 2026-01-01T12:00:00+00:00: token_revoked; install the app again",
        "  T2 refresh failing: slack error invalid_refresh_token",
        "  T4 has posts waiting and no installation: install the app there",
        "  T5 has posts waiting and no installation: install the app there",
        "senders: none running",
    ]


def test_the_problems_are_in_the_json_of_the_source(troubled):
    document = json.loads(status("--json"))
    by_source = {entry["source"]: entry for entry in document["sources"]}
    assert "installations" not in by_source["memory"]
    assert by_source["slack"]["installations"] == {
        "revoked": 1,
        "revoked_shown": [
            {"workspace_id": "T3", "revoked_at": "2026-01-01T12:00:00+00:00", "reason": "token_revoked"}
        ],
        "refresh_failing": 1,
        "refresh_failing_shown": [{"workspace_id": "T2", "error": "slack error invalid_refresh_token"}],
        "not_installed": ["T4", "T5"],
    }


def test_a_workspace_whose_posts_failed_of_another_cause_is_not_told_to_install_the_app():
    Installations("slack").save("T1", secrets={"bot_token": "xoxb-1"})
    outbox = Outbox("slack")
    for post_id, workspace in (("gone", "T7"), ("for-want", "T8")):
        assert outbox.queue(post_id, workspace_id=workspace, container_id="C1", body={"text": "x"})
    claims = {claim.post_id: claim for claim in outbox.claim()}
    assert outbox.settle(claims["gone"], "failed", "slack error channel_not_found")
    assert outbox.settle(
        claims["for-want"], "failed", "workspace T8 has no installation of source 'slack': install the app again"
    )
    assert status().splitlines()[3:5] == [
        "workspaces of slack: 1 with posts waiting and no installation",
        "  T8 has posts waiting and no installation: install the app there",
    ]


def test_a_source_without_problems_adds_no_line():
    Installations("slack").save("T1", secrets={"bot_token": "xoxb-1"})
    assert status().splitlines()[3:] == ["senders: none running"]


def test_the_status_stays_under_a_second_with_ten_thousand_installations(capsys):
    now = timezone.now()
    rows: list[Any] = [
        Installation(
            source="slack",
            workspace_id=f"T{n:05d}",
            team_name=f"Team {n}",
            secrets="",
            revoked_at=now if n % 100 == 0 else None,
            revoked_reason="token_revoked" if n % 100 == 0 else "",
            refresh_error="invalid_refresh_token" if n % 100 == 1 else "",
        )
        for n in range(10_000)
    ]
    Installation.objects.bulk_create(rows, batch_size=1000)
    outbox = Outbox("slack")
    for n in range(200):
        assert outbox.queue(f"p{n}", workspace_id=f"T{n * 50:05d}", container_id="C1", body={"text": "x"})
        assert outbox.queue(f"q{n}", workspace_id=f"X{n:03d}", container_id="C1", body={"text": "x"})

    started = time.perf_counter()
    out = status()
    took = time.perf_counter() - started

    with capsys.disabled():
        print(f"\noutbox_status at 10,000 installations: {took * 1000:.0f} ms")
    assert "workspaces of slack: 100 revoked, 100 failing to refresh, 10 with posts waiting" in out
    assert took < 1.0
