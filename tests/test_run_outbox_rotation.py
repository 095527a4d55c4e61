"""run_outbox --max-runtime / --max-posts: the sender stops as on SIGTERM, for a process manager
to start a fresh one."""

from __future__ import annotations

import logging
import signal
import time

import pytest
from django.core.management import CommandError, call_command

from django_connector_outbox import Outbox, signals
from django_connector_outbox.models import Post

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _signal_handlers():
    """run_outbox installs SIGTERM/SIGINT handlers: give pytest its own back."""
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def sender_log():
    """The sender's log lines, whether or not run_outbox lets them propagate."""
    logger = logging.getLogger("django_connector_outbox")
    handler, level = Lines(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield handler.lines
    logger.removeHandler(handler)
    logger.setLevel(level)


def outcome_receivers():
    return [len(s.receivers) for s in (signals.post_posted, signals.post_retried, signals.post_failed)]


def test_max_posts_stops_the_sender_once_that_many_posts_are_handled(sender_log):
    outbox = Outbox("memory")
    for n in range(6):
        assert outbox.queue(f"p{n}", workspace_id="T1", container_id=f"C{n}", body={"text": "x"})
    receivers = outcome_receivers()
    started = time.monotonic()
    # --max-runtime only as a safety net: the run must end by --max-posts, long before it.
    call_command(
        "run_outbox", "--max-posts", "2", "--concurrency", "1", "--poll", "0.05", "--max-runtime", "60"
    )
    assert time.monotonic() - started < 30
    counts = {state: Post.objects.in_state(state).count() for state in ("posted", "queued", "sending")}
    # Stopped as on SIGTERM: the post claimed in the turn that reached 2 may still go out
    # (a send in flight finishes) or be given back; nothing is left sending.
    assert counts in ({"posted": 2, "queued": 4, "sending": 0}, {"posted": 3, "queued": 3, "sending": 0})
    rotating = [line for line in sender_log if line.startswith("sender rotating")]
    assert len(rotating) == 1
    assert rotating[0].endswith(" reason=max_posts=2")
    assert outcome_receivers() == receivers  # its counting receivers are gone with it


def test_max_runtime_stops_an_idle_sender_gracefully(sender_log):
    started = time.monotonic()
    call_command("run_outbox", "--max-runtime", "0.3", "--poll", "0.05")
    elapsed = time.monotonic() - started
    assert 0.3 <= elapsed < 10
    messages = sender_log
    assert any(m.startswith("sender rotating") and m.endswith(" reason=max_runtime=0.3s") for m in messages)
    assert any(m.startswith("sender stopped") and m.endswith(" forced=False") for m in messages)


@pytest.mark.parametrize(
    ("args", "refusal"),
    [
        (["--max-posts", "0"], "Error: argument --max-posts: must be at least 1, got 0"),
        (
            ["--max-runtime", "0"],
            "Error: argument --max-runtime: must be more than 0 and at most 315360000 seconds, got 0",
        ),
        (
            ["--metrics-port", "70000"],
            "Error: argument --metrics-port: must be a port number from 0 to 65535, got 70000",
        ),
    ],
    ids=["max-posts", "max-runtime", "metrics-port"],
)
def test_bad_rotation_and_metrics_arguments_are_refused(args, refusal):
    with pytest.raises(CommandError) as refused:
        call_command("run_outbox", "--once", *args)
    assert str(refused.value) == refusal
