"""run_outbox under call_command: it leaves the process as it found it, and logs the Django way.

The package logs only to its named loggers. The command adds a handler (to stderr, at a level
from --verbosity) only where the project configured no logging at all, removes it when it
returns, and never turns propagation off, so a project's LOGGING and pytest's caplog see the
sender's lines.
"""

from __future__ import annotations

import contextlib
import gc
import io
import logging
import signal
import threading

import pytest
from django.core.management import call_command
from django.db import connections

from django_connector_outbox import Outbox, signals
from django_connector_outbox.connectors import connectors
from django_connector_outbox.sender import Sender
from django_connector_outbox.testing import TestClock

PLACE = {"workspace_id": "T1", "container_id": "C1"}
PACKAGE = logging.getLogger("django_connector_outbox")


@pytest.fixture
def during_run():
    """What the sender saw while it ran: read on its thread when a post is recorded."""
    seen = {}

    def look(**kwargs):
        seen.update(
            sigterm=signal.getsignal(signal.SIGTERM),
            sigint=signal.getsignal(signal.SIGINT),
            handlers=list(PACKAGE.handlers),
            propagate=PACKAGE.propagate,
        )

    signals.post_posted.connect(look, sender=Sender, dispatch_uid="during_run", weak=False)
    yield seen
    signals.post_posted.disconnect(sender=Sender, dispatch_uid="during_run")


@contextlib.contextmanager
def no_logging_configured():
    """A project without any logging configuration: no handler on the root logger (not even
    pytest's) nor on the package's."""
    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers = []
    try:
        yield
    finally:
        root.handlers = saved


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


# -- signal handlers and connectors ------------------------------------------------------------


def test_run_outbox_restores_the_signal_handlers_it_installed(db, during_run):
    def mine(signum, frame):
        pass

    previous = signal.signal(signal.SIGTERM, mine), signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        Outbox("memory").queue("p1", **PLACE, body={"text": "hi"})
        call_command("run_outbox", "--once", verbosity=0)
        after = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])

    assert during_run["sigterm"] is not mine and during_run["sigint"] is not signal.SIG_IGN
    assert after == (mine, signal.SIG_IGN)


@pytest.mark.django_db(transaction=True)  # the thread has a connection of its own
def test_run_outbox_runs_in_a_thread_without_touching_signal_handlers():
    failed: list[BaseException] = []

    def run():
        try:
            call_command("run_outbox", "--once", verbosity=0)
        except BaseException as e:  # signal.signal outside the main thread is a ValueError
            failed.append(e)
        finally:
            connections.close_all()

    before = signal.getsignal(signal.SIGTERM)
    thread = threading.Thread(target=run)
    thread.start()
    thread.join()

    assert failed == []
    assert signal.getsignal(signal.SIGTERM) is before


def test_the_readme_recipe_reads_what_the_memory_connector_received(db):
    Outbox("memory").queue("order-1-placed", **PLACE, body={"text": "New order #1"})

    call_command("run_outbox", "--once", verbosity=0)

    platform = connectors["memory"]
    assert [m.body["text"] for m in platform.messages("C1")] == ["New order #1"]


def test_run_outbox_delivers_on_the_clock_it_is_given(db):
    Outbox("memory").queue("later", **PLACE, body={"text": "in an hour"}, delay=3600)
    clock = TestClock()

    call_command("run_outbox", "--once", verbosity=0, clock=clock)
    assert connectors["memory"].messages("C1") == []

    clock.advance(3601)
    call_command("run_outbox", "--once", verbosity=0, clock=clock)
    assert [m.body["text"] for m in connectors["memory"].messages("C1")] == ["in an hour"]


def test_the_clock_is_not_a_command_line_option():
    with pytest.raises(Exception, match="unrecognized arguments: --clock"):
        call_command("run_outbox", "--once", "--clock", "x")


# -- logging -----------------------------------------------------------------------------------


def test_caplog_sees_the_senders_lines(db, caplog, during_run):
    caplog.set_level(logging.DEBUG, logger="django_connector_outbox")
    Outbox("memory").queue("p1", **PLACE, body={"text": "hi"})

    call_command("run_outbox", "--once")

    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("sender started worker=") for m in messages)
    assert any(m.startswith("post posted post_id=p1 place=memory:T1/C1") for m in messages)
    assert {r.name for r in caplog.records} <= {"django_connector_outbox", "django_connector_outbox.sender"}
    # pytest's handlers are on the root logger: the command added none of its own.
    assert during_run["handlers"] == [] and during_run["propagate"] is True


def test_a_project_that_configures_the_root_logger_sees_the_senders_lines(db, during_run):
    project = Records()
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    root.handlers, root.level = [project], logging.INFO  # as LOGGING's "root" would set it
    try:
        Outbox("memory").queue("p1", **PLACE, body={"text": "hi"})
        connectors["memory"].fail_next("boom")
        stderr = io.StringIO()
        call_command("run_outbox", "--once", stderr=stderr)
    finally:
        root.handlers, root.level = saved

    messages = [r.getMessage() for r in project.records]
    assert any(m.startswith("sender started") for m in messages)
    assert "post retried post_id=p1 place=memory:T1/C1 attempts=1 reason='boom'" in messages
    assert during_run == {}  # nothing was posted: the only post was retried
    assert stderr.getvalue() == ""  # the lines went where the project sends them, not to stderr
    assert PACKAGE.handlers == [] and PACKAGE.propagate is True


def test_log_lines_carry_their_fields_for_json_formatters(db):
    project = Records()
    PACKAGE.addHandler(project)
    level = PACKAGE.level
    PACKAGE.setLevel(logging.DEBUG)
    try:
        Outbox("memory").queue("p1", **PLACE, body={"text": "hi"})
        connectors["memory"].fail_next("boom")
        call_command("run_outbox", "--once")
    finally:
        PACKAGE.removeHandler(project)
        PACKAGE.setLevel(level)

    [retried] = [r for r in project.records if r.getMessage().startswith("post retried")]
    assert (retried.post_id, retried.source, retried.container_id, retried.attempts, retried.reason) == (
        "p1", "memory", "C1", 1, "boom",
    )  # fmt: skip
    [summary] = [r for r in project.records if r.getMessage().startswith("summary")]
    assert (summary.retried, summary.queue_depth) == (1, 1)
    assert summary.oldest_due_age_seconds is None  # the retried post is not due yet


def test_the_command_configures_nothing_when_the_project_set_a_handler_on_the_package(db, during_run):
    project = Records()
    PACKAGE.addHandler(project)
    try:
        with no_logging_configured():
            Outbox("memory").queue("p1", **PLACE, body={"text": "hi"})
            call_command("run_outbox", "--once", stderr=io.StringIO())
    finally:
        PACKAGE.removeHandler(project)

    assert during_run["handlers"] == [project] and during_run["propagate"] is True


@pytest.mark.parametrize(
    ("verbosity", "started", "posted"), [(0, False, False), (1, True, False), (2, True, True)]
)
def test_without_any_logging_configured_the_command_logs_to_its_stderr(
    db, during_run, verbosity, started, posted
):
    stderr = io.StringIO()
    with no_logging_configured():
        Outbox("memory").queue("p1", **PLACE, body={"text": "hi"})
        call_command("run_outbox", "--once", verbosity=verbosity, stderr=stderr)

    assert ("INFO django_connector_outbox.sender sender started" in stderr.getvalue()) is started
    assert ("DEBUG django_connector_outbox post posted post_id=p1" in stderr.getvalue()) is posted
    assert len(during_run["handlers"]) == 1 and during_run["propagate"] is True
    # Gone when the command returns, with the level it had.
    assert PACKAGE.handlers == [] and PACKAGE.level == logging.NOTSET


def test_call_command_leaves_the_callers_garbage_collectable(db):
    # Only `manage.py run_outbox` (run_from_argv, a process of its own) freezes start-up's
    # objects out of the cyclic collector's sight; a test's or a caller's process keeps them
    # collectable, or a cycle holding a database connection would keep its locks for ever.
    frozen = gc.get_freeze_count()
    call_command("run_outbox", "--once", verbosity=0)
    assert gc.get_freeze_count() == frozen


def test_manage_py_run_outbox_freezes_what_start_up_made(monkeypatch):
    from django_connector_outbox.management.commands import run_outbox

    froze, ran = [], []
    monkeypatch.setattr(run_outbox.gc, "freeze", lambda: froze.append(1))
    monkeypatch.setattr(run_outbox.OutboxCommand, "run_from_argv", lambda self, argv: ran.append(argv))
    run_outbox.Command().run_from_argv(["manage.py", "run_outbox", "--once"])
    assert (froze, ran) == ([1], [["manage.py", "run_outbox", "--once"]])
