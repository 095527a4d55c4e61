"""What `run_outbox` runs beside its sender: rotation limits and the metrics endpoint.

Rotation (--max-runtime, --max-posts) stops the sender as the first SIGTERM does: it stops
claiming, finishes the sends in flight and gives back the rest; a process manager then
starts a fresh process.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

from django.core.management.base import CommandError
from django.utils.translation import gettext

from django_connector_outbox import signals
from django_connector_outbox.sender import Sender

logger = logging.getLogger("django_connector_outbox.sender")

# The sender's counters of posts it handled (a send or a lookup recorded), by outcome:
# --max-posts counts these, checked as each one's signal is sent.
HANDLED = tuple(signals.OUTCOME_SIGNALS)


def extras(sender: Sender, options: dict[str, Any]) -> contextlib.ExitStack:
    """Start what the options ask for beside the sender; closing the stack stops it all.

    CommandError (before anything runs) if the metrics endpoint cannot be served.
    """
    stack = contextlib.ExitStack()
    try:
        if options.get("metrics_port") is not None:
            stack.enter_context(metrics_endpoint(sender, options["metrics_port"], options["metrics_addr"]))
        stack.enter_context(rotation(sender, options.get("max_runtime"), options.get("max_posts")))
    except BaseException:
        stack.close()
        raise
    return stack


def stop(sender: Sender, why: str) -> None:
    """Stop gracefully, once: a second stop() would be the forced one."""
    if not sender.stopping:
        logger.info("sender rotating worker=%s reason=%s", sender.worker, why)
        sender.stop()


@contextlib.contextmanager
def rotation(sender: Sender, max_runtime: float | None, max_posts: int | None) -> Iterator[None]:
    timer = None
    if max_runtime is not None:
        timer = threading.Timer(max_runtime, stop, (sender, f"max_runtime={max_runtime:g}s"))
        timer.daemon = True
        timer.start()

    def count(**kwargs: Any) -> None:
        # The sender's own counters: other senders in this process send the same signals.
        if max_posts is not None and sum(sender.stats[name] for name in HANDLED) >= max_posts:
            stop(sender, f"max_posts={max_posts}")

    if max_posts is not None:
        for signal in signals.OUTCOME_SIGNALS.values():
            signal.connect(count, weak=False)
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()
        for signal in signals.OUTCOME_SIGNALS.values():
            signal.disconnect(count)


@contextlib.contextmanager
def metrics_endpoint(sender: Sender, port: int, addr: str) -> Iterator[None]:
    try:
        from django_connector_outbox import metrics
    except ImportError as e:
        raise CommandError(
            gettext("--metrics-port needs prometheus_client: %(install)s")
            % {"install": "pip install 'django-connector-outbox[metrics]'"}
        ) from e
    sources = [outbox.source for outbox in sender.outboxes]
    try:
        server = metrics.serve(port, addr, sources, using=sender.using)
    except OSError as e:
        raise CommandError(
            gettext("cannot serve metrics on %(where)s: %(error)s")
            % {"where": f"{addr}:{port}", "error": e.strerror or e}
        ) from e
    try:
        yield
    finally:
        server.close()
