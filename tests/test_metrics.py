"""Prometheus metrics: run_outbox --metrics-port serves them; a real HTTP GET scrapes them."""

from __future__ import annotations

import json
import re
import signal
import socket
import sys
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import OperationalError
from django.db.backends.signals import connection_created
from django.utils import timezone

import django_connector_outbox
from django_connector_outbox import Outbox, signals

prometheus_client = pytest.importorskip("prometheus_client")
# Imported before any test connects a receiver: the metrics' receivers run first.
from django_connector_outbox import metrics  # noqa: E402

DASHBOARD = Path(__file__).resolve().parent.parent / "docs" / "grafana-dashboard.json"


@pytest.fixture(autouse=True)
def _signal_handlers():
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def scrape(port: int) -> dict[str, float]:
    """Every sample of the endpoint, by its name and labels (sorted: as `series` writes them)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            metric, _, labels = name.rstrip("}").partition("{")
            pairs = dict(re.findall(r'(\w+)="([^"]*)"', labels))
            samples[series(metric, **pairs)] = float(value)
    return samples


def series(metric: str, **labels: str) -> str:
    return metric + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def sample(name: str, **labels: str) -> float:
    return prometheus_client.REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.mark.django_db(transaction=True)
def test_run_outbox_serves_outcomes_send_times_and_queue_gauges_while_it_runs():
    outbox = Outbox("memory")
    assert outbox.queue("p1", workspace_id="T1", container_id="C1", body={"text": "one"})
    assert outbox.queue("p2", workspace_id="T1", container_id="C1", body={"text": "two"})
    posted = sample("connector_outbox_outcomes_total", source="memory", outcome="posted")
    sends = sample("connector_outbox_send_seconds_count", source="memory")
    port = free_port()
    scrapes = []

    def scrape_once(**kwargs):
        if not scrapes:  # p1 recorded and committed; p2 claimed in the same turn, not yet sent
            scrapes.append(scrape(port))

    signals.post_posted.connect(scrape_once)
    try:
        call_command(
            "run_outbox", "--once", "--concurrency", "1", "--metrics-port", str(port),
            "--metrics-addr", "127.0.0.1", verbosity=0,
        )  # fmt: skip
    finally:
        signals.post_posted.disconnect(scrape_once)
    [seen] = scrapes
    assert seen[series("connector_outbox_outcomes_total", source="memory", outcome="posted")] == posted + 1
    assert (
        seen[series("connector_outbox_outcomes_total", source="memory", outcome="failed")] >= 0
    )  # there from the start
    assert seen[series("connector_outbox_send_seconds_count", source="memory")] == sends + 1
    assert seen[series("connector_outbox_queue_depth", source="memory")] == 1.0
    assert seen[series("connector_outbox_posts", source="memory", state="sending")] == 1.0
    assert seen[series("connector_outbox_posts", source="memory", state="queued")] == 0.0
    assert seen[series("connector_outbox_oldest_due_age_seconds", source="memory")] == 0.0
    assert seen[series("connector_outbox_held_posts", source="memory")] == 0.0
    assert seen[series("connector_outbox_held_places", source="memory", scope="workspace")] == 0.0
    assert seen[series("connector_outbox_queue_depth", source="other")] == 0.0
    # The endpoint stops with the sender.
    with pytest.raises(OSError):
        scrape(port)


@pytest.mark.django_db(transaction=True)
def test_the_gauges_show_the_oldest_due_age_and_the_holds_at_scrape_time(clock, monkeypatch):
    monkeypatch.setattr(timezone, "now", clock)  # the collector's Outbox reads timezone.now
    outbox = Outbox("memory", clock=clock)
    for post_id, container_id in [("first", "C1"), ("second", "C1"), ("waiting", "C2")]:
        assert outbox.queue(post_id, workspace_id="T1", container_id=container_id, body={"text": "x"})
    claims = {claim.post_id: claim for claim in outbox.claim()}
    assert outbox.hold(claims["first"], 3600, "rate limited")  # "second" waits behind it
    assert outbox.hold(claims["waiting"], 0)
    clock.advance(75)
    server = metrics.serve(0, "127.0.0.1", ["memory"], cache=0)
    try:
        seen = scrape(server.port)
        outbox.cancel_queued("waiting")
        clock.advance(5)
        again = scrape(server.port)  # read at each scrape without a cache
    finally:
        server.close()
    assert seen[series("connector_outbox_posts", source="memory", state="queued")] == 3.0
    assert seen[series("connector_outbox_queue_depth", source="memory")] == 3.0
    assert seen[series("connector_outbox_oldest_due_age_seconds", source="memory")] == 75.0
    assert seen[series("connector_outbox_held_posts", source="memory")] == 1.0
    assert again[series("connector_outbox_queue_depth", source="memory")] == 2.0
    assert again[series("connector_outbox_oldest_due_age_seconds", source="memory")] == 80.0


@pytest.mark.django_db(transaction=True)
def test_the_held_places_gauge_counts_the_holds_in_force_by_source_and_scope(clock, monkeypatch):
    monkeypatch.setattr(timezone, "now", clock)
    outbox = Outbox("memory", clock=clock)
    for post_id, workspace_id in [("a", "T1"), ("b", "T2"), ("c", "T3")]:
        assert outbox.queue(post_id, workspace_id=workspace_id, container_id="C1", body={"text": "x"})
    claims = {claim.post_id: claim for claim in outbox.claim()}
    assert outbox.hold(claims["a"], 60, "429 of team T1", scope="workspace")
    assert outbox.hold(claims["b"], 30, "429 of team T2", scope="workspace")
    assert outbox.hold(claims["c"], 10, "global", scope="source")
    server = metrics.serve(0, "127.0.0.1", ["memory", "other"], cache=0)
    try:
        seen = scrape(server.port)
        clock.advance(30)
        again = scrape(server.port)
    finally:
        server.close()
    held = {k: v for k, v in seen.items() if k.startswith("connector_outbox_held_places")}
    assert held == {
        series("connector_outbox_held_places", source="memory", scope="source"): 1.0,
        series("connector_outbox_held_places", source="memory", scope="workspace"): 2.0,
        series("connector_outbox_held_places", source="memory", scope="container"): 0.0,
        series("connector_outbox_held_places", source="other", scope="source"): 0.0,
        series("connector_outbox_held_places", source="other", scope="workspace"): 0.0,
        series("connector_outbox_held_places", source="other", scope="container"): 0.0,
    }
    assert again[series("connector_outbox_held_places", source="memory", scope="source")] == 0.0
    assert again[series("connector_outbox_held_places", source="memory", scope="workspace")] == 1.0


class Sessions:
    """The database sessions opened on threads other than the test's (connection_created) and
    the statements run on them: the metrics' own."""

    def __init__(self) -> None:
        self.opened: list[str] = []
        self.statements: list[str] = []

    def __call__(self, sender: Any, connection: Any, **kwargs: Any) -> None:
        if threading.current_thread() is not threading.main_thread():
            self.opened.append(threading.current_thread().name)
            connection.execute_wrappers.append(self.count)

    def count(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        self.statements.append(sql)
        return execute(sql, params, many, context)


@pytest.fixture
def sessions():
    seen = Sessions()
    connection_created.connect(seen)
    yield seen
    connection_created.disconnect(seen)


@pytest.mark.django_db(transaction=True)
def test_thirty_scrapes_at_once_share_one_database_session(sessions):
    server = metrics.serve(0, "127.0.0.1", ["memory", "other"], cache=0)
    try:
        with ThreadPoolExecutor(max_workers=30) as scrapers:
            scraped = list(scrapers.map(lambda _: scrape(server.port), range(30)))
    finally:
        server.close()
    assert all(s[series("connector_outbox_queue_depth", source="memory")] == 0.0 for s in scraped)
    assert len(sessions.opened) == 1  # the reader thread's; on PostgreSQL, one backend
    assert sessions.opened[0].startswith("connector-outbox-metrics")
    assert sessions.statements  # every scrape read: no cache here


class Ticks:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.django_db(transaction=True)
def test_a_scrape_within_the_cache_time_runs_no_query(sessions):
    ticks = Ticks()
    collector = metrics.OutboxCollector(["memory"], cache=metrics.CACHE_SECONDS, monotonic=ticks)
    outbox = Outbox("memory")
    try:
        first = {m.name: m.samples for m in collector.collect()}
        read = len(sessions.statements)
        assert read > 0
        assert outbox.queue("p1", workspace_id="T1", container_id="C1", body={"text": "x"})
        ticks.now += metrics.CACHE_SECONDS - 0.1
        assert {m.name: m.samples for m in collector.collect()} == first
        assert len(sessions.statements) == read  # not one statement
        ticks.now += 0.1
        depth = {m.name: m.samples for m in collector.collect()}["connector_outbox_queue_depth"]
        assert [sample.value for sample in depth] == [1.0]
    finally:
        collector.close()
    assert len(sessions.opened) == 1


@pytest.mark.django_db(transaction=True)
def test_a_failed_read_leaves_the_gauges_out_and_the_next_read_reconnects(sessions, monkeypatch, caplog):
    collector = metrics.OutboxCollector(["memory"], cache=0)
    calls = []

    def failing_once(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise OperationalError("server closed the connection unexpectedly")
        return real(*args, **kwargs)

    real = metrics.source_health
    monkeypatch.setattr(metrics, "source_health", failing_once)
    try:
        assert list(collector.collect()) == []
        assert len(list(collector.collect())) == 7
    finally:
        collector.close()
    assert "metrics: could not read the outbox" in caplog.text


def test_without_prometheus_client_metrics_port_is_a_clear_error(monkeypatch):
    # As if it were not installed: importing it fails, and so does importing our module.
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    monkeypatch.delitem(sys.modules, "django_connector_outbox.metrics")
    monkeypatch.delattr(django_connector_outbox, "metrics")
    with pytest.raises(CommandError) as refused:
        call_command("run_outbox", "--once", "--metrics-port", str(free_port()))
    assert str(refused.value) == (
        "--metrics-port needs prometheus_client: pip install 'django-connector-outbox[metrics]'"
    )


def test_a_metrics_port_in_use_is_a_clear_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(CommandError) as refused:
            call_command("run_outbox", "--once", "--metrics-port", str(port), "--metrics-addr", "127.0.0.1")
    assert str(refused.value) == f"cannot serve metrics on 127.0.0.1:{port}: Address already in use"


@pytest.mark.django_db(transaction=True)
def test_the_grafana_dashboard_queries_only_metrics_the_endpoint_serves():
    server = metrics.serve(0, "127.0.0.1", ["memory"])
    try:
        served = {re.match(r"[a-z_]+", name)[0] for name in scrape(server.port)}
    finally:
        server.close()
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    used = {name for query in queries for name in re.findall(r"connector_outbox_[a-z_]+", query)}
    assert used  # the dashboard does query ours
    assert used <= served, used - served


@pytest.mark.django_db(transaction=True)  # the collector reads on its own thread
def test_each_running_sender_s_sends_in_flight_and_loop_lag_are_gauges_from_its_heartbeat():
    from django_connector_outbox.heartbeat import Pulse

    busy = Pulse("web-1:5", ["memory"], "default", interval=0)
    busy.start()
    busy.beat(3, 250, lambda: 0.012)
    without_loop = Pulse("tests:9", ["memory"], "default", interval=0)  # an executor's: no loop
    without_loop.start()
    without_loop.beat(0)
    server = metrics.serve(0, "127.0.0.1", ["memory"], cache=0)
    try:
        seen = scrape(server.port)
    finally:
        server.close()
    assert seen[series("connector_outbox_sender_sends_in_flight", worker="web-1:5")] == 250
    assert seen[series("connector_outbox_sender_sends_in_flight", worker="tests:9")] == 0
    assert seen[series("connector_outbox_sender_loop_lag_seconds", worker="web-1:5")] == 0.012
    assert series("connector_outbox_sender_loop_lag_seconds", worker="tests:9") not in seen
