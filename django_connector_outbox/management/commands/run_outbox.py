"""``manage.py run_outbox``: run a sender until SIGTERM/SIGINT (or, with --once, until idle).

Under ``call_command`` (in tests) it leaves the process as it found it: the signal handlers
and any logging handler it set are removed when it returns, and the connectors it used stay
built, so a test reads what a memory connector received.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import math
import os
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, TextIO, cast

from django.core.management.base import CommandError
from django.db import DEFAULT_DB_ALIAS, connections
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from django_connector_outbox.conf import MAX_DURATION, conf
from django_connector_outbox.health import NotMigrated
from django_connector_outbox.management import reloading, running
from django_connector_outbox.management.operator import OutboxCommand, check_text
from django_connector_outbox.sender import CONCURRENCY, Sender

# The length of Lane.worker (a claim names its sender there).
WORKER_LENGTH = 200


# argparse names the type function of a value it cannot convert ("invalid positive_int
# value"): each raises ArgumentTypeError itself, with a message for people.


def positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            gettext("must be a whole number of at least 1, got %(value)r") % {"value": value}
        ) from None
    if number < 1:
        raise argparse.ArgumentTypeError(gettext("must be at least 1, got %(value)s") % {"value": number})
    return number


def port_number(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = -1
    if not 0 <= number <= 65535:  # 0: any free port
        raise argparse.ArgumentTypeError(
            gettext("must be a port number from 0 to 65535, got %(value)s") % {"value": value}
        )
    return number


def positive_seconds(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    # Written so that NaN fails too; inf would overflow the sender's deadline arithmetic.
    if not 0 < number <= MAX_DURATION:
        raise argparse.ArgumentTypeError(
            gettext("must be more than 0 and at most %(max)s seconds, got %(value)s")
            % {"max": MAX_DURATION, "value": value}
        )
    return number


class Command(OutboxCommand):
    help = _("Deliver queued posts through the configured connectors until stopped.")  # type: ignore[assignment]
    # call_command("run_outbox", clock=TestClock()): the sender's clock (testing.TestClock);
    # for tests only, so not on the command line.
    stealth_options = ("clock",)

    def run_from_argv(self, argv: list[str]) -> None:
        """`manage.py run_outbox`, a process of its own: what start-up made (Django, the app
        registry, the settings) lives as long as the process, so it is moved out of the cyclic
        collector's sight, whose full collections then scan only what the sends make (they held
        the event loop 30-60 ms with 10,000 sends in flight). Not for call_command: a test's
        process keeps its garbage collectable."""
        gc.freeze()
        super().run_from_argv(argv)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--source",
            action="append",
            dest="sources",
            metavar="NAME",
            help=gettext("serve only this source (repeatable)"),
        )
        parser.add_argument("--once", action="store_true", help=gettext("exit as soon as nothing is due"))
        parser.add_argument(
            "--concurrency",
            type=positive_int,
            default=CONCURRENCY,
            help=gettext("sends in flight at once (%(concurrency)s)") % {"concurrency": CONCURRENCY},
        )
        parser.add_argument("--batch", type=positive_int, help=gettext("posts per claim (CLAIM_BATCH)"))
        parser.add_argument(
            "--poll", type=positive_seconds, help=gettext("longest idle wait in seconds (POLL_INTERVAL)")
        )
        parser.add_argument("--worker", help=gettext("this sender's name in claims (host:pid)"))
        parser.add_argument("--database", default=DEFAULT_DB_ALIAS, help=gettext("database alias (default)"))
        parser.add_argument(
            "--max-runtime",
            type=positive_seconds,
            metavar="SECONDS",
            help=gettext("stop gracefully (as on SIGTERM) after this long, for a process manager to restart"),
        )
        parser.add_argument(
            "--max-posts",
            type=positive_int,
            metavar="N",
            help=gettext("stop gracefully once N posts were handled (those in flight still finish)"),
        )
        parser.add_argument(
            "--metrics-port",
            type=port_number,
            metavar="PORT",
            help=gettext("serve Prometheus metrics on this port"),
        )
        parser.add_argument(
            "--metrics-addr",
            default="0.0.0.0",
            metavar="ADDR",
            help=gettext("address of the metrics port (0.0.0.0)"),
        )
        parser.add_argument(
            "--autoreload",
            action="store_true",
            help=gettext("restart when a Python file changes, as runserver does (for development)"),
        )

    def handle(self, *args: Any, **options: Any) -> None:
        check_text(options, {"sources": "--source", "database": "--database", "worker": "--worker"})
        unknown = sorted(set(options["sources"] or ()) - set(conf.CONNECTORS))
        if unknown:
            configured = ", ".join(sorted(conf.CONNECTORS)) or gettext("none")
            raise CommandError(
                gettext("Unknown source %(sources)s; configured: %(configured)s")
                % {"sources": ", ".join(unknown), "configured": configured}
            )
        if options["database"] not in connections:
            raise CommandError(gettext("Unknown database alias %(alias)r") % {"alias": options["database"]})
        self._check_worker(options["worker"])
        if options["autoreload"] and options["once"]:
            raise CommandError(
                gettext("--autoreload and --once cannot be combined: --once exits when nothing is due")
            )
        if options["autoreload"]:
            self._run_with_reloader(options)
        else:
            self._run(options)

    def _run(self, options: dict[str, Any], started: Callable[[Sender], object] = lambda _: None) -> None:
        sender = Sender(
            options["sources"],
            using=options["database"],
            concurrency=options["concurrency"],
            batch=options["batch"],
            poll=options["poll"],
            worker=options["worker"],
            once=options["once"],
            clock=options.get("clock"),
            heartbeat=True,
        )
        started(sender)
        # Connectors stay built after the run (a test reads what a memory connector received);
        # a process that ends closes their connections with it.
        beside = running.extras(sender, options)  # metrics endpoint, rotation limits
        try:
            with self._logging(options["verbosity"]), self._signals(sender):
                sender.run()
        except NotMigrated as e:
            raise CommandError(str(e)) from e
        finally:
            beside.close()

    def _run_with_reloader(self, options: dict[str, Any]) -> None:
        """As runserver: a parent process runs this one again whenever a Python file changes.

        Django's reloader holds the main thread, so the sender runs beside it; when the
        process ends (a change, SIGTERM, ^C, its parent gone) the sender is stopped as on
        SIGTERM: the sends in flight finish, the claims not started are given back, its
        heartbeat row is deleted. No post waits for a lease to end after a reload.
        """
        if reloading.in_child():
            reloading.run_child(lambda started: self._run(options, started=started))
        else:
            raise SystemExit(reloading.supervise())

    @contextlib.contextmanager
    def _signals(self, sender: Sender) -> Iterator[None]:
        """SIGTERM/SIGINT stop the sender while it runs; the handlers before it are restored after."""
        if threading.current_thread() is not threading.main_thread():
            yield  # only the main thread may set handlers (a test running the command in a thread)
            return

        def on_signal(signum: int, frame: FrameType | None) -> None:
            if sender.stopping:
                # Sends in flight stay `sending`; after their lease they are looked up, never resent blind.
                logging.getLogger("django_connector_outbox.sender").warning("second signal: exiting now")
                os._exit(128 + signum)
            sender.stop()

        previous = {signum: signal.signal(signum, on_signal) for signum in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                # None: a handler not set from Python, which cannot be put back; the default is.
                signal.signal(signum, signal.SIG_DFL if handler is None else handler)

    def _check_worker(self, worker: str | None) -> None:
        """The name goes into every claim's worker column: refuse what that column cannot hold
        (text no database stores alike is refused with the other arguments, by `check_text`)."""
        if worker is None:
            return
        if not worker or len(worker) > WORKER_LENGTH:
            raise CommandError(
                gettext("--worker must be 1 to %(max)s characters, got %(length)s")
                % {"max": WORKER_LENGTH, "length": len(worker)}
            )

    @contextlib.contextmanager
    def _logging(self, verbosity: int) -> Iterator[None]:
        """Where the project configured no logging at all (no handler on the package's loggers
        nor on the root logger), log to stderr at INFO (DEBUG with -v 2+, warnings only with
        -v 0) while the command runs. Otherwise the project's LOGGING (or pytest's caplog)
        decides, and nothing is changed: no handler, no level, propagation left on.
        """
        logger = logging.getLogger("django_connector_outbox")
        if logger.hasHandlers():
            yield
            return
        # The raw stream: OutputWrapper would style every line as an error on a terminal.
        handler = logging.StreamHandler(cast(TextIO, self.stderr._out))
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        level = logger.level
        logger.addHandler(handler)
        logger.setLevel({0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG))
        try:
            yield
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)
