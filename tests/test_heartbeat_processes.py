"""A running `run_outbox` process has a row that it keeps moving, deletes when stopped with
SIGTERM, and leaves when killed, where outbox_status then flags it silent."""

from __future__ import annotations

import io
import signal
from datetime import timedelta

import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings
from django.utils import timezone

from django_connector_outbox import Outbox
from django_connector_outbox.models import Heartbeat
from tests.harness import heartbeat_row_where

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# LEASE 2: the sender's row moves every 0.5 s (a quarter of it).
CONFIG = {
    "CONNECTORS": {"memory": {"BACKEND": "django_connector_outbox.connectors.memory.MemoryConnector"}},
    "LEASE": 2,
}


def test_a_running_sender_has_a_row_that_moves_and_goes_on_sigterm(senders):
    with override_settings(CONNECTOR_OUTBOX=CONFIG):
        for n in range(3):
            assert Outbox("memory").queue(f"p{n}", workspace_id="T1", container_id=f"C{n}", body={"n": n})
    sender = senders.start(CONFIG, "--worker", "proof-1", "--poll", "0.2")

    first = heartbeat_row_where(lambda row: row.sent == 3)
    assert (first.worker, first.pid, first.sources) == ("proof-1", sender.pid, ["memory"])
    moved = heartbeat_row_where(lambda row: row.last_seen > first.last_seen)
    assert moved.started_at == first.started_at

    sender.signal(signal.SIGTERM)
    assert sender.wait(20) == 0, sender.stderr
    assert not Heartbeat.objects.exists()


def test_a_killed_senders_row_stays_and_is_flagged_silent_after_a_lease(senders, monkeypatch):
    sender = senders.start(CONFIG, "--worker", "proof-2", "--poll", "0.2")
    row = heartbeat_row_where(lambda row: row.worker == "proof-2")
    sender.kill()
    assert Heartbeat.objects.filter(worker="proof-2").exists()

    # Past the last beat by more than LEASE: the operator's clock, not a sleep.
    later = Heartbeat.objects.get().last_seen + timedelta(seconds=2.5)
    monkeypatch.setattr(timezone, "now", lambda: later)
    out = io.StringIO()
    with override_settings(CONNECTOR_OUTBOX={**settings.CONNECTOR_OUTBOX, **CONFIG}):
        call_command("outbox_status", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[-3] == "senders: 1, 1 silent for longer than LEASE (2.0s)"
    assert lines[-1].startswith(f"  proof-2  {row.host}") and lines[-1].endswith("  SILENT")
