"""``run_outbox --autoreload``: a process of its own, restarted on a change, as runserver is.

Django's reloader runs the command in a child process and starts it again whenever a loaded
Python file changes; the sender in it is stopped as on SIGTERM before each restart, so no
post it claimed waits for a lease to end. A SIGTERM to the process started (the parent, as a
supervisor or `kill` sends it) stops that sender as it does without --autoreload; so does a
^C, which a terminal sends to both processes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from django.db import connection
from django.test import override_settings

from django_connector_outbox import Outbox
from django_connector_outbox.models import Heartbeat, Post
from tests.harness import heartbeat_row_where
from tests.proof_connectors import Gate, SenderProcess, Senders, file_platform, gate, platform_lines

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the reloaded child in /proc"),
]
WATCHED = Path(__file__).resolve().parent / "proof_connectors.py"  # loaded by the sender: watched


@pytest.fixture
def the_gate(tmp_path):
    opened = Gate(tmp_path / "gate.sock")
    yield opened
    opened.close()


def state(post_id: str) -> str:
    return Post.objects.with_claim().values_list("current_state", flat=True).get(post_id=post_id)


def sending_under_reloader(senders, the_gate, worker: str):
    """A --autoreload sender whose send of post "p1" blocks on the gate; (process, its child,
    the send's socket), once the child's heartbeat row is there."""
    config = {"CONNECTORS": {"gate": gate(the_gate.address)}, "LEASE": 60}
    with override_settings(CONNECTOR_OUTBOX=config):
        Outbox("gate").queue("p1", workspace_id="T1", container_id="C1", body={"text": "hi"})
    process = senders.start(config, "--autoreload", "--poll", "0.1", "--worker", worker, name=worker)
    post_id, conn, _ = the_gate.accept(timeout=30)
    assert post_id == "p1"
    child = child_of(process.pid)
    row = heartbeat_row_where(lambda row: row.worker == worker)
    assert row.pid == child  # the sender runs in the reloader's child, not in the process started
    return process, child, conn


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


def test_sigterm_to_the_process_started_stops_its_sender_gracefully(senders, the_gate):
    process, _, conn = sending_under_reloader(senders, the_gate, "reload-term")

    process.signal(signal.SIGTERM)
    assert process.wait_for_line(r"sender stopping ").endswith("in_flight=1 given_back=0")
    the_gate.answer(conn, b"D")  # the send in flight finishes after the signal

    assert process.wait(20) == 0, process.stderr
    assert state("p1") == "posted"
    assert not Heartbeat.objects.exists()
    assert "forced=False" in process.stderr


def test_ctrl_c_reaching_both_processes_is_one_graceful_stop(senders, the_gate):
    process, child, conn = sending_under_reloader(senders, the_gate, "reload-int")

    # A terminal's ^C goes to its foreground process group: the parent and the child alike.
    os.kill(process.pid, signal.SIGINT)
    os.kill(child, signal.SIGINT)
    process.wait_for_line(r"sender stopping ")
    the_gate.answer(conn, b"D")

    assert process.wait(20) == 0, process.stderr
    assert state("p1") == "posted"
    assert not Heartbeat.objects.exists()
    assert "second signal" not in process.stderr


def test_a_second_sigterm_to_the_process_started_exits_at_once(senders, the_gate):
    process, _, conn = sending_under_reloader(senders, the_gate, "reload-twice")

    process.signal(signal.SIGTERM)
    process.wait_for_line(r"sender stopping ")
    process.signal(signal.SIGTERM)
    assert process.wait(5) == 128 + signal.SIGTERM, process.stderr  # while the send still blocks
    assert "second signal: exiting now" in process.stderr
    assert state("p1") == "sending"  # looked up after its lease, never resent blind
    conn.close()


def test_the_sender_stops_gracefully_when_the_process_started_is_killed(senders, the_gate):
    process, child, conn = sending_under_reloader(senders, the_gate, "reload-orphan")

    process.kill()  # SIGKILL: the parent cannot pass anything on; its end of the pipe closes
    try:
        process.wait_for_line(r"sender stopping ")
        the_gate.answer(conn, b"D")
        process.wait_for_line(r"sender stopped .*forced=False")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)  # not the test's child: the senders fixture cannot

    assert state("p1") == "posted"
    assert not Heartbeat.objects.exists()


def test_a_sender_that_ends_by_itself_ends_the_process(senders):
    config = {
        "CONNECTORS": {"memory": {"BACKEND": "django_connector_outbox.connectors.memory.MemoryConnector"}}
    }
    process = senders.start(
        config, "--autoreload", "--poll", "0.1", "--max-runtime", "1", name="reload-rotate"
    )

    # Rotation stops the sender as SIGTERM does; the reloader does not keep an empty process.
    assert process.wait(30) == 0, process.stderr
    assert "reason=max_runtime=1s" in process.stderr and "forced=False" in process.stderr
    assert not Heartbeat.objects.exists()
