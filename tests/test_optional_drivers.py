"""The app works with only the drivers a project installs: psycopg is not needed on SQLite, nor
httpx for Slack; a connector whose package is missing says which extra installs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from django_connector_outbox.fakes.slack import FakeSlack

ROOT = Path(__file__).resolve().parent.parent


def test_a_sqlite_project_without_psycopg_queues_and_sends(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import sys
        sys.modules["psycopg"] = None  # as if it were not installed: importing it fails
        import django
        from django.conf import settings
        settings.configure(
            DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": sys.argv[1]}},
            INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django.contrib.admin",
                            "django.contrib.messages", "django.contrib.sessions", "rangefilter",
                            "django_connector_outbox"],
            USE_TZ=True,
            CONNECTOR_OUTBOX={"CONNECTORS": {"chat": {
                "BACKEND": "django_connector_outbox.connectors.console.ConsoleConnector"}}},
        )
        django.setup()
        from django.core.management import call_command
        call_command("migrate", verbosity=0)
        from django_connector_outbox import Outbox
        assert Outbox("chat").queue("p1", workspace_id="W", container_id="C", body={"text": "hi"})
        call_command("run_outbox", "--once", verbosity=0)
        assert Outbox("chat").find("p1").state == "posted"
        """
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "db.sqlite3")],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "[chat] message p1 -> W/C" in done.stdout


PROJECT = """
import json, sys
sys.modules["httpx"] = None  # as if it were not installed: importing it fails
import django
from django.conf import settings
settings.configure(
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": sys.argv[1],
                           "OPTIONS": {"transaction_mode": "IMMEDIATE"}}},
    INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_connector_outbox"],
    USE_TZ=True,
    CONNECTOR_OUTBOX={"CONNECTORS": json.loads(sys.argv[2])},
)
django.setup()
from django.core import checks
from django.core.management import call_command
"""


def run_project(tmp_path: Path, connectors: dict[str, object], script: str) -> str:
    """Runs `script` in a fresh SQLite project without httpx; returns its output."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run(
        [sys.executable, "-c", PROJECT + textwrap.dedent(script), str(tmp_path / "db.sqlite3"),
         json.dumps(connectors)],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_slack_only_project_without_httpx_checks_queues_and_sends(tmp_path: Path) -> None:
    with FakeSlack.running() as slack:
        slack_source = {
            "BACKEND": "django_connector_outbox.connectors.slack.SlackConnector",
            "OPTIONS": {"token": slack.token, "base_url": slack.base_url},
        }
        out = run_project(
            tmp_path,
            {"slack": slack_source},
            """
            print(checks.run_checks())
            call_command("migrate", verbosity=0)
            from django_connector_outbox import Outbox
            Outbox("slack").queue("p1", workspace_id="T1", container_id="C0000000001", body={"text": "hi"})
            call_command("run_outbox", "--once", verbosity=0)
            print(Outbox("slack").find("p1").state)
            """,
        )
        assert out.splitlines() == ["[]", "posted"]
        assert [m.text for m in slack.messages("C0000000001")] == ["hi"]


@pytest.mark.parametrize("name", ["discord", "webhook", "mattermost"])
def test_a_connector_that_needs_httpx_says_which_extra_installs_it(tmp_path: Path, name: str) -> None:
    backend = f"django_connector_outbox.connectors.{name}.{name.capitalize()}Connector"
    out = run_project(
        tmp_path,
        {"chat": {"BACKEND": backend}},
        """
        from django.core.exceptions import ImproperlyConfigured
        from django_connector_outbox.connectors import connectors
        for message in checks.run_checks():
            print(message.id, message.msg, message.hint, sep="\\n")
        try:
            connectors["chat"]
        except ImproperlyConfigured as e:
            print(e)
        """,
    )
    message = (
        f"CONNECTOR_OUTBOX['CONNECTORS']['chat']: BACKEND '{backend}' cannot be imported: "
        "import of httpx halted; None in sys.modules"
    )
    hint = f'Install what it needs: pip install "django-connector-outbox[{name}]".'
    assert out.splitlines() == ["connector_outbox.E003", message, hint, f"{message} {hint}"]


def test_the_google_chat_connector_says_which_extra_installs_it(tmp_path: Path) -> None:
    backend = "django_connector_outbox.connectors.google_chat.GoogleChatConnector"
    out = run_project(
        tmp_path,
        {"chat": {"BACKEND": backend}},
        """
        for message in checks.run_checks():
            print(message.id, message.hint, sep="\\n")
        """,
    )
    hint = 'Install what it needs: pip install "django-connector-outbox[google-chat]".'
    assert out.splitlines() == ["connector_outbox.E003", hint]
