"""Which senders are alive: each running sender's row, as outbox_status and the admin show it.

The rows' life with real `run_outbox` processes is in test_heartbeat_processes.py; here the
Pulse that writes them, the listing and the pruning, on a fake clock.
"""

from __future__ import annotations

import io
import json
import os
import socket
from datetime import timedelta

import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings
from django.utils import timezone

from django_connector_outbox import Outbox
from django_connector_outbox.heartbeat import PRUNE_AFTER, Pulse, prune_silent
from django_connector_outbox.housekeeping import Housekeeper
from django_connector_outbox.models import Heartbeat

pytestmark = pytest.mark.django_db


class Ticks:
    """A monotonic clock that moves when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def now(clock, monkeypatch):
    """The wall clock (timezone.now) is the test's clock."""
    monkeypatch.setattr(timezone, "now", clock)
    return clock


@pytest.fixture
def ticks():
    return Ticks()


def status(*args):
    out = io.StringIO()
    call_command("outbox_status", *args, stdout=out)
    return out.getvalue()


def test_the_row_is_made_at_the_first_beat_and_moved_at_most_once_per_interval(now, ticks):
    pulse = Pulse("w1", ["memory", "other"], "default", interval=5, monotonic=ticks)
    pulse.beat(0)
    assert not Heartbeat.objects.exists()  # not started: a test turning a Sender writes nothing
    pulse.start()
    started = now()
    pulse.beat(0)
    row = Heartbeat.objects.get()
    assert (row.worker, row.host, row.pid, row.sources) == (
        "w1",
        socket.gethostname(),
        os.getpid(),
        ["memory", "other"],
    )
    assert (row.started_at, row.last_seen, row.sent) == (started, started, 0)

    now.advance(3)
    ticks.now += 3
    pulse.beat(4)
    assert Heartbeat.objects.get().last_seen == started  # within the interval: no write
    now.advance(2)
    ticks.now += 2
    pulse.beat(7)
    row = Heartbeat.objects.get()
    assert (row.started_at, row.last_seen, row.sent) == (started, started + timedelta(seconds=5), 7)

    pulse.stop()
    assert not Heartbeat.objects.exists()


def test_the_interval_is_at_most_a_quarter_of_the_lease():
    with override_settings(CONNECTOR_OUTBOX={**settings.CONNECTOR_OUTBOX, "LEASE": 2}):
        assert Pulse("w", ["memory"], "default").interval == 0.5
    assert Pulse("w", ["memory"], "default").interval == 5.0


def test_a_row_deleted_under_a_live_sender_is_made_again(now, ticks):
    pulse = Pulse("w1", ["memory"], "default", interval=5, monotonic=ticks)
    pulse.start()
    pulse.beat(0)
    Heartbeat.objects.all().delete()
    ticks.now += 5
    pulse.beat(3)
    assert Heartbeat.objects.get().sent == 3


def test_the_status_lists_the_senders_and_flags_one_silent_for_longer_than_a_lease(now, ticks):
    for worker, sources in (("web-2:7", ["memory"]), ("web-1:5", ["memory", "other"])):
        pulse = Pulse(worker, sources, "default", interval=5, monotonic=ticks)
        pulse.start()
        pulse.beat(12)
    now.advance(100)
    ticks.now += 100
    pulse.beat(15, 1000, lambda: 0.0123)  # web-1:5 is alive; web-2:7 has been silent for 100 s
    now.advance(30)
    host = socket.gethostname()
    pid = str(os.getpid())
    width = max(len(host), 4)
    lines = status().splitlines()[3:]
    assert lines[0] == "senders: 2, 1 silent for longer than LEASE (2m00s)"
    assert lines[1:] == [
        f"  worker   {'host'.ljust(width)}  {'pid'.ljust(len(pid))}  sources       started                    "
        "last seen  posts sent  in flight  loop lag",
        f"  web-1:5  {host.ljust(width)}  {pid.ljust(3)}  memory,other  2026-01-01T12:00:00+00:00  30.0s ago  15"
        "          1000       12 ms",
        f"  web-2:7  {host.ljust(width)}  {pid.ljust(3)}  memory        2026-01-01T12:00:00+00:00  2m10s ago  12"
        "          0          -         SILENT",
    ]
    # --source: the senders serving it.
    assert [line.split()[0] for line in status("--source", "other").splitlines()[-1:]] == ["web-1:5"]


def test_the_status_as_json_lists_the_senders(now, ticks):
    pulse = Pulse("web-1:5", ["memory"], "default", interval=5, monotonic=ticks)
    pulse.start()
    pulse.beat(2, 7, lambda: 0.25)
    now.advance(121)
    assert json.loads(status("--json"))["senders"] == [
        {
            "worker": "web-1:5",
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "sources": ["memory"],
            "started_at": "2026-01-01T12:00:00+00:00",
            "last_seen": "2026-01-01T12:00:00+00:00",
            "posts_sent": 2,
            "sends_in_flight": 7,
            "loop_lag_seconds": 0.25,
            "silent": True,
        }
    ]


def test_without_senders_the_status_says_none_runs(now):
    assert status().splitlines()[-1] == "senders: none running"
    assert json.loads(status("--json"))["senders"] == []


def test_housekeeping_prunes_the_rows_of_senders_silent_for_a_day(now, ticks):
    for worker, after in (("old", PRUNE_AFTER), ("recent", 10)):
        pulse = Pulse(worker, ["memory"], "default", interval=5, monotonic=ticks)
        pulse.start()
        pulse.beat(0)
        now.advance(after)
    # "old" silent for a day and 10 s, "recent" for 10 s
    Housekeeper([Outbox("memory")], "default", monotonic=ticks).tick()
    assert list(Heartbeat.objects.values_list("worker", flat=True)) == ["recent"]
    assert prune_silent("default") == 0


def test_the_admin_lists_the_senders_read_only(admin_client, now, ticks):
    pulse = Pulse("web-1:5", ["memory", "other"], "default", interval=5, monotonic=ticks)
    pulse.start()
    pulse.beat(4)
    page = admin_client.get("/admin/django_connector_outbox/heartbeat/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "web-1:5" in html and "memory, other" in html
    assert 'alt="True"' in html  # heard from within LEASE
    assert "/admin/django_connector_outbox/heartbeat/add/" not in html
    pk = Heartbeat.objects.get().pk
    assert admin_client.post(f"/admin/django_connector_outbox/heartbeat/{pk}/delete/").status_code == 403
    now.advance(121)
    assert 'alt="False"' in admin_client.get("/admin/django_connector_outbox/heartbeat/").content.decode()


def heartbeat_statements(run) -> list[str]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as ctx:
        run()
    return [q["sql"].split()[0] for q in ctx.captured_queries if Heartbeat._meta.db_table in q["sql"]]


def test_run_outbox_writes_its_row_and_deletes_it_when_done():
    assert Outbox("memory").queue("p1", workspace_id="T1", container_id="C1", body={"text": "hi"})
    # The row's INSERT and DELETE; housekeeping's pruning of silent rows, a DELETE, between them.
    assert heartbeat_statements(lambda: call_command("run_outbox", "--once", verbosity=0)) == [
        "INSERT",
        "DELETE",
        "DELETE",
    ]
    assert not Heartbeat.objects.exists()


def test_a_delivery_in_process_writes_no_row():
    from django_connector_outbox.sender import Sender

    assert Outbox("memory").queue("p1", workspace_id="T1", container_id="C1", body={"text": "hi"})
    # Only housekeeping's pruning of silent rows.
    assert heartbeat_statements(lambda: Sender(once=True).run()) == ["DELETE"]
    assert Outbox("memory").find("p1").state == "posted"
