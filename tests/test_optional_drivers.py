"""The app works with only the drivers a project installs: psycopg is not needed on SQLite."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

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
