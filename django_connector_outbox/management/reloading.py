"""``run_outbox --autoreload``: Django's reloader, with a stop that reaches the sender.

Django's ``autoreload.run_with_reloader`` is made for runserver, which may die at any moment:
its parent process (which only restarts the child) answers SIGTERM with ``sys.exit`` inside
``subprocess.run``, and that SIGKILLs the child, so the sender there never stopped and its
heartbeat row stayed. Here the parent is ours:

- it passes each SIGTERM/SIGINT it gets on to the child, one byte down a pipe, waits for the
  child to stop and exits with its code; if the parent dies, the pipe's end says so too;
- the child stops its sender as the first SIGTERM does without --autoreload (the sends in
  flight finish, the row is deleted). A ^C on a terminal, a kill of the process group or of
  a cgroup reaches both processes: the child's own signal and its parent's word are one
  request, and only a second of either kind forces the exit.

Every request is handled by one thread in the child, in order, so that none is counted
twice and no sender is stopped twice (which would be the forced stop).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from types import FrameType

from django.utils import autoreload

from django_connector_outbox.sender import Sender

logger = logging.getLogger("django_connector_outbox.sender")

# The child's exit code that asks its parent for a restart (django.utils.autoreload's).
RELOAD = 3
# Names the child's end of the pipe from its parent.
STOP_FD_ENV = "DJANGO_CONNECTOR_OUTBOX_STOP_FD"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def in_child() -> bool:
    return os.environ.get(autoreload.DJANGO_AUTORELOAD_ENV) == "true"


# -- the parent ------------------------------------------------------------------------------


def supervise() -> int:
    """Run the command again in a child until it exits other than for a restart; its exit code."""
    if os.name != "posix":
        return int(autoreload.restart_with_reloader())  # no fd passing: Django's own parent
    env = {**os.environ, autoreload.DJANGO_AUTORELOAD_ENV: "true"}
    if "-u" in sys.orig_argv[1:]:
        env.setdefault("PYTHONUNBUFFERED", "1")  # as Django's parent: the child unbuffered too
    stopping = False
    told: int | None = None  # the write end of the current child's pipe

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        if told is not None:
            with contextlib.suppress(OSError):  # EPIPE: the child has just exited
                os.write(told, bytes([signum]))

    with _handlers(on_signal):
        while True:
            read, told = os.pipe()
            # Set before looking at `stopping`: a signal from here on goes down the pipe, one
            # before was seen there; bytes written before the child starts wait for it.
            if stopping:
                os.close(read)
                os.close(told)
                return 0
            os.set_inheritable(read, True)  # the write end is not: its close is the parent's end
            try:
                child = subprocess.Popen(
                    autoreload.get_child_arguments(), env={**env, STOP_FD_ENV: str(read)}, close_fds=False
                )
            finally:
                os.close(read)
            try:
                code = child.wait()
            finally:
                write, told = told, None
                os.close(write)
            if code != RELOAD:
                return code
            if stopping:
                return 0  # asked to stop during a reload: not started again


# -- the child -------------------------------------------------------------------------------


class Stop:
    """The child's stop requests, handled in order by one thread: the first stops the senders
    and the reloader, a second of the same kind (signal or parent) exits at once."""

    def __init__(self, reloader: autoreload.BaseReloader) -> None:
        self.reloader = reloader
        self.senders: list[Sender] = []
        self.stopped = False
        self.seen: Counter[str] = Counter()
        # SimpleQueue.put may be called from a signal handler (it is reentrant).
        self.requests: queue.SimpleQueue[tuple[str, object]] = queue.SimpleQueue()
        threading.Thread(target=self._handle, name="outbox-reload-stop", daemon=True).start()

    def started(self, sender: Sender) -> None:
        """A sender was made in the child: stopped at once if a stop came before it."""
        self.requests.put(("started", sender))

    def signal(self, signum: int, frame: FrameType | None = None) -> None:
        self.requests.put(("signal", signum))

    def ended(self) -> None:
        """The reloader's loop ended (a change, or the stop): stop the senders, once."""
        self.requests.put(("ended", None))

    def listen(self, fd: int) -> None:
        """Read the parent's word from `fd`: a byte per signal it got; the end, if it died."""

        def read() -> None:
            while byte := os.read(fd, 1):
                self.requests.put(("parent", byte[0]))
            self.requests.put(("parent gone", None))

        threading.Thread(target=read, name="outbox-reload-parent", daemon=True).start()

    def _handle(self) -> None:
        while True:
            what, value = self.requests.get()
            if what == "started":
                assert isinstance(value, Sender)
                self.senders.append(value)
                if self.stopped:
                    value.stop()
                continue
            if what in ("signal", "parent"):
                assert isinstance(value, int)
                self.seen[what] += 1
                if self.seen[what] > 1:
                    # Sends in flight stay `sending`; after their lease they are looked up, never resent blind.
                    logger.warning("second signal: exiting now")
                    os._exit(128 + value)
            self._stop()

    def _stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        for sender in self.senders:
            sender.stop()
        self.reloader.stop()  # its loop ends at its next look at the files


def run_child(main: Callable[[Callable[[Sender], object]], None]) -> None:
    """Run `main(started)` in a thread, watched by Django's reloader in this (main) thread, until
    a stop request ends both or a changed file ends this process for a restart (exit code 3).

    `main` calls `started(sender)` with the sender it made, before running it."""
    reloader = autoreload.get_reloader()
    stop = Stop(reloader)
    done = threading.Event()

    def target() -> None:
        try:
            main(stop.started)
        except BaseException:
            raise  # printed by the thread; the reloader watches on, a fix restarts it (as runserver)
        else:
            stop.ended()  # the sender ended by itself (--max-runtime): so does this process
        finally:
            done.set()

    logger.debug("watching for file changes with %s", type(reloader).__name__)
    with _handlers(stop.signal):
        if STOP_FD_ENV in os.environ:
            stop.listen(int(os.environ[STOP_FD_ENV]))
        try:
            autoreload.start_django(reloader, target)
        finally:
            stop.ended()
            done.wait()


@contextlib.contextmanager
def _handlers(handler: Callable[[int, FrameType | None], object]) -> Iterator[None]:
    previous = {signum: signal.signal(signum, handler) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, before in previous.items():
            signal.signal(signum, signal.SIG_DFL if before is None else before)
