"""Prometheus metrics of a sender (the optional extra ``metrics``: prometheus_client).

- Counters and the send-time histogram are fed by the sender's signals, in the process that
  sends; importing this module connects them. The installations' counters (token refreshes,
  revocations) count what this process did: sum() them across senders.
- Gauges (posts by state, queue depth, oldest due age, held posts and held places, and each
  running sender's sends in flight and loop lag from its heartbeat row) are read from the
  database when Prometheus scrapes, through the Outbox: nothing to refresh, and a read costs a
  few indexed counts per source. They read the shared database, so every sender exports the
  same values: aggregate them with max(), not sum().
- Scrapes cannot exhaust the database's connections: every read runs on the collector's one
  reader thread, whose one connection serves every scrape for the collector's life (closed by
  `close()`, and after an error, to be opened again by the next read), whatever thread the
  HTTP server gives each scrape. A read is reused for CACHE_SECONDS: scrapes at the same
  moment (two Prometheus servers, a dashboard refreshing) wait for one read rather than each
  reading.

``run_outbox --metrics-port`` calls `serve`; a project with its own exporter can register
`OutboxCollector` on its registry instead.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple
from wsgiref.simple_server import WSGIServer

from django.db import DatabaseError, connections
from django.dispatch import receiver
from django.utils import timezone
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from django_connector_outbox import heartbeat, signals
from django_connector_outbox.conf import conf
from django_connector_outbox.health import SourceHealth, source_health
from django_connector_outbox.outbox import Outbox
from django_connector_outbox.posts import ACTIVE_STATES, ATTENTION_STATES, ClaimedPost, Outcome

logger = logging.getLogger("django_connector_outbox.metrics")

# The values of the `outcome` label: the outcomes the sender reports (found ones as posted).
OUTCOMES = tuple(signals.OUTCOME_SIGNALS)
# How long the gauges of one read serve the scrapes that follow: well under Prometheus' usual
# scrape interval (15 s and more), so that one server's scrapes each read afresh.
CACHE_SECONDS = 5.0

outcomes = Counter(
    "connector_outbox_outcomes",
    "Outcomes this sender recorded, by source (posted includes posts found after a lost reply).",
    ["source", "outcome"],
)
send_seconds = Histogram(
    "connector_outbox_send_seconds",
    "How long each connector.send call took, by source.",
    ["source"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
)

installation_refreshes = Counter(
    "connector_outbox_installation_refreshes",
    "Workspace tokens this process refreshed (and saved), by source.",
    ["source"],
)
installation_revocations = Counter(
    "connector_outbox_installation_revocations",
    "Installations this process marked revoked (an answer, a refused refresh, an uninstall), by source.",
    ["source"],
)


def _counter(outcome: Outcome) -> Any:
    def count(*, claim: ClaimedPost, **kwargs: Any) -> None:
        outcomes.labels(claim.source, outcome.value).inc()

    return count


# Strong references: the receivers live as long as the module.
_RECEIVERS = [(signal, _counter(outcome)) for outcome, signal in signals.OUTCOME_SIGNALS.items()]
for _signal, _receiver in _RECEIVERS:
    _signal.connect(_receiver, weak=False)


@receiver(signals.installation_refreshed, dispatch_uid="connector_outbox_metrics_refreshes")
def count_refresh(*, source: str, **kwargs: Any) -> None:
    installation_refreshes.labels(source).inc()


@receiver(signals.installation_revoked, dispatch_uid="connector_outbox_metrics_revocations")
def count_revocation(*, source: str, **kwargs: Any) -> None:
    installation_revocations.labels(source).inc()


@receiver(signals.post_sent, dispatch_uid="connector_outbox_metrics_send_seconds")
def observe_send(*, claim: ClaimedPost, duration: float, **kwargs: Any) -> None:
    send_seconds.labels(claim.source).observe(duration)


class _Found(NamedTuple):
    """What one read of the database found: each source's health, and the running senders."""

    health: list[SourceHealth]
    senders: list[heartbeat.SenderSeen]


class OutboxCollector(Collector):
    """The gauges, read through the Outbox on the collector's reader thread (see the module).

    If the database cannot be read, the gauges are left out of the scrapes of that read (and
    the error logged): absent series are what Prometheus alerts on, where a stale number would
    hide the outage. `close()` when done with it (MetricsServer.close does).
    """

    def __init__(
        self,
        sources: Sequence[str],
        using: str = "default",
        *,
        cache: float = CACHE_SECONDS,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sources = list(sources)
        self.using = using
        self.cache = cache
        self.monotonic = monotonic
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="connector-outbox-metrics")
        self._reading = threading.Lock()
        # When the latest read was made, and what it found (None: the database failed).
        self._read_at: float | None = None
        self._found: _Found | None = None

    def describe(self) -> Iterable[Any]:
        # Described without reading the database (the registry calls this on register).
        return list(self._families())

    def collect(self) -> Iterable[Any]:
        found = self._latest()
        if found is None:
            return []
        by_state, depth, oldest, held, places, in_flight, lag = self._families()
        for h in found.health:
            for state in ATTENTION_STATES:
                by_state.add_metric([h.source, state], h.counts[state])
            depth.add_metric([h.source], sum(h.counts[state] for state in ACTIVE_STATES))
            oldest.add_metric([h.source], h.oldest_due.age if h.oldest_due else 0.0)
            held.add_metric([h.source], h.held)
            for scope, count in h.held_places.items():
                places.add_metric([h.source, scope], count)
        for seen in found.senders:
            in_flight.add_metric([seen.worker], seen.in_flight)
            if seen.loop_lag is not None:
                lag.add_metric([seen.worker], seen.loop_lag)
        return [by_state, depth, oldest, held, places, in_flight, lag]

    def close(self) -> None:
        """Close the reader's connection and end its thread."""
        with self._reading:
            self._reader.submit(self._close_connection).result()
            self._reader.shutdown()

    def _latest(self) -> _Found | None:
        """The latest read, made now unless one was made within `cache` seconds."""
        with self._reading:  # scrapes at the same moment wait for one read
            if self._read_at is None or self.monotonic() - self._read_at >= self.cache:
                self._found = self._reader.submit(self._read).result()
                self._read_at = self.monotonic()
            return self._found

    def _read(self) -> _Found | None:
        """On the reader thread: its connection (thread-local in Django) stays open between reads."""
        try:
            return _Found(
                [
                    source_health(Outbox(source, using=self.using), states=ATTENTION_STATES, holds=0)
                    for source in self.sources
                ],
                heartbeat.senders(self.using, timezone.now(), conf.LEASE, self.sources),
            )
        except DatabaseError as e:
            logger.warning("metrics: could not read the outbox error=%r", str(e).strip())
            # The connection may be broken (a database restart): the next read opens a new one.
            self._close_connection()
            return None

    def _close_connection(self) -> None:
        """On the reader thread: close its connection (`connections` is per thread)."""
        connections[self.using].close()

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, ...]:
        return (
            GaugeMetricFamily(
                "connector_outbox_posts",
                "Posts in each state that needs watching (queued, sending, failed, uncertain).",
                labels=["source", "state"],
            ),
            GaugeMetricFamily(
                "connector_outbox_queue_depth",
                "Posts not yet finished (queued and sending).",
                labels=["source"],
            ),
            GaugeMetricFamily(
                "connector_outbox_oldest_due_age_seconds",
                "How long the oldest due queued post has held its place (0: none due).",
                labels=["source"],
            ),
            GaugeMetricFamily(
                "connector_outbox_held_posts",
                "Queued posts waiting past now after a retry or a Retry-After (their containers wait).",
                labels=["source"],
            ),
            GaugeMetricFamily(
                "connector_outbox_held_places",
                "Places held past now for all their posts, by scope: the whole source or workspaces "
                "(a wider rate limit), containers (a wait announced with a success).",
                labels=["source", "scope"],
            ),
            GaugeMetricFamily(
                "connector_outbox_sender_sends_in_flight",
                "Sends and lookups a running sender has started and not yet recorded, at its last heartbeat.",
                labels=["worker"],
            ),
            GaugeMetricFamily(
                "connector_outbox_sender_loop_lag_seconds",
                "The longest a sender's event loop was held between its last two heartbeats.",
                labels=["worker"],
            ),
        )


class MetricsServer:
    """The HTTP endpoint of `serve`: `close()` stops it and unregisters its collector."""

    def __init__(self, server: WSGIServer, collector: OutboxCollector, registry: CollectorRegistry) -> None:
        self.server = server
        self.collector = collector
        self.registry = registry

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.registry.unregister(self.collector)
        self.collector.close()


def serve(
    port: int,
    addr: str,
    sources: Sequence[str],
    using: str = "default",
    registry: CollectorRegistry = REGISTRY,
    *,
    cache: float = CACHE_SECONDS,
) -> MetricsServer:
    """Serve the registry on http://addr:port/ (any path); OSError if the port is taken.
    `cache`: how long one read of the gauges serves the scrapes that follow (seconds)."""
    for source in sources:  # every series from the first scrape on, at 0
        send_seconds.labels(source)
        installation_refreshes.labels(source)
        installation_revocations.labels(source)
        for outcome in OUTCOMES:
            outcomes.labels(source, outcome.value)
    collector = OutboxCollector(sources, using, cache=cache)
    registry.register(collector)
    try:
        server, _ = start_http_server(port, addr, registry=registry)
    except BaseException:
        registry.unregister(collector)
        collector.close()
        raise
    logger.info("metrics served addr=%s port=%d", addr, server.server_address[1])
    return MetricsServer(server, collector, registry)
