"""``run_outbox --autoreload``: a process of its own, restarted on a change, as runserver is.

Django's reloader runs the command in a child process and starts it again whenever a loaded
Python file changes; the sender in it is stopped as on SIGTERM before each restart, so no
post it claimed waits for a lease to end.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest
from django.db import connection
from django.test import override_settings

from django_connector_outbox import Outbox
from tests.proof_connectors import SenderProcess, Senders, file_platform, platform_lines

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the reloaded child in /proc"),
]
WATCHED = Path(__file__).resolve().parent / "proof_connectors.py"  # loaded by the sender: watched


def wait_for_post(platform: Path, post_id: str, process: SenderProcess, timeout: float = 20.0) -> None:
    """Until the platform file holds `post_id` (a file written by another process: polled)."""
    deadline = time.monotonic() + timeout
    while not any(line["post_id"] == post_id for line in platform_lines(platform)):
        assert time.monotonic() < deadline, f"{post_id} never delivered\n{process.stderr}"
        time.sleep(0.05)


def child_of(pid: int) -> int:
    """The process the reloader runs the command in (the only child of `pid`)."""
    [child] = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return int(child)


def test_autoreload_restarts_the_sender_on_a_change_and_stops_it_gracefully(tmp_path):
    platform = tmp_path / "platform.jsonl"
    config = {"CONNECTORS": {"files": file_platform(platform)}}
    place = {"workspace_id": "T1", "container_id": "C1"}
    with override_settings(CONNECTOR_OUTBOX=config):
        Outbox("files").queue("before", **place, body={"seq": 1})
    process = SenderProcess(
        ["--autoreload", "--poll", "0.1"], Senders(connection.settings_dict["NAME"]).env(config), "autoreload"
    )
    mtime = WATCHED.stat().st_mtime
    try:
        process.wait_for_line(r"sender started")
        wait_for_post(platform, "before", process)
        first_child = child_of(process.pid)

        # A change to a loaded module: the reloader's next scan (every second) restarts the child.
        for step in range(1, 40):
            os.utime(WATCHED, (mtime + step, mtime + step))
            try:
                process.wait_for_line(r"sender stopped .*forced=False", timeout=1.0)
                break
            except AssertionError:
                continue
        else:
            pytest.fail(f"no reload after 40 changes\n{process.stderr}")
        stopped = next(i for i, line in enumerate(process.lines) if "sender stopped" in line)
        process.wait_for_line(r"sender started", start=stopped)
        assert child_of(process.pid) != first_child

        with override_settings(CONNECTOR_OUTBOX=config):
            Outbox("files").queue("after", **place, body={"seq": 2})
        wait_for_post(platform, "after", process)

        os.kill(child_of(process.pid), signal.SIGTERM)  # as a terminal's ^C or a supervisor would
        assert process.wait(20) == 0, process.stderr
    finally:
        os.utime(WATCHED, (mtime, mtime))
        process.close()
    assert sum("sender stopped" in line and "forced=False" in line for line in process.lines) == 2
    assert [line["post_id"] for line in platform_lines(platform)] == ["before", "after"]
