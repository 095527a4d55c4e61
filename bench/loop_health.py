"""Event-loop health with 10,000 sends in flight (issue 32, item 4), as an operator sees it.

N posts (10,000), each the head of a container of its own, are queued for the no-op coroutine
connector (bench/connectors.py) with a send latency of L seconds (12), so that one `run_outbox
--concurrency N` has them all in flight at once. The program reads what the sender writes to
its heartbeat row (what `outbox_status` and the metrics show: sends in flight, and the longest
its event loop was held between two beats) and the sender's RSS from /proc (once idle, then while
the posts are queued and sent) until every post is posted, then stops it with SIGTERM. The sender
beats every 5 s (heartbeat.INTERVAL), so L is longer than two beats. Targets: the loop never held longer than 50 ms; RSS at most
300 MB with 10,000 in flight (and what 1,000 sends in flight cost, over the RSS before any).

    .venv/bin/python bench/loop_health.py                     # N=10000, L=12 s, PostgreSQL
    .venv/bin/python bench/loop_health.py -n 2000 --latency 8
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from common import DEFAULT_URL, ROOT, reset_tables, setup
from connectors import SEND_LATENCY


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("-n", type=int, default=10_000, help="posts, all in flight at once (10000)")
    parser.add_argument("--latency", type=float, default=12.0, help="seconds each send waits (12)")
    args = parser.parse_args()
    setup(args.database_url)
    from django.db import transaction

    from django_connector_outbox import Outbox
    from django_connector_outbox.models import Heartbeat, Post

    reset_tables()
    env = dict(
        os.environ,
        BENCH_DATABASE_URL=args.database_url,
        DJANGO_SETTINGS_MODULE="bench.settings",
        PYTHONPATH=str(ROOT),
        **{SEND_LATENCY: str(args.latency)},
    )
    command = [sys.executable, "-m", "django", "run_outbox", "--source", "bench", f"--concurrency={args.n}"]
    sender = subprocess.Popen([*command, "-v", "0"], env=env, cwd=ROOT)
    beats: dict[object, tuple[int, float | None]] = {}  # last_seen -> (in flight, loop lag)
    deadline = time.monotonic() + args.latency * 3 + 60
    try:
        while not Heartbeat.objects.exists():  # started, and idle: what it costs with nothing in flight
            if sender.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"FAILED: the sender exited ({sender.returncode}) or took too long")
            time.sleep(0.1)
        idle_rss = peak_rss = rss_mb(sender.pid)
        with transaction.atomic():
            Outbox("bench").queue_many(
                dict(post_id=f"p{i}", workspace_id="T1", container_id=f"C{i}", body={"text": "hi"})
                for i in range(args.n)
            )
        while Post.objects.filter(state="posted").count() < args.n:
            if sender.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"FAILED: the sender exited ({sender.returncode}) or took too long")
            peak_rss = max(peak_rss, rss_mb(sender.pid))
            for seen, in_flight, lag in Heartbeat.objects.values_list("last_seen", "in_flight", "loop_lag"):
                beats[seen] = (in_flight, lag)
            time.sleep(0.25)
    finally:
        sender.send_signal(signal.SIGTERM)
        sender.wait()
    reset_tables()
    lags = [lag for _, lag in beats.values() if lag is not None]
    most = max((in_flight for in_flight, _ in beats.values()), default=0)
    worst = max(lags, default=float("nan"))
    per_1000 = (peak_rss - idle_rss) / (args.n / 1000)
    print(
        f"loop health: N={args.n:,} sends of {args.latency:g} s in flight at once, load {os.getloadavg()[0]:.2f}"
    )
    print(f"  heartbeats read: {len(beats)}; most sends in flight at a beat: {most:,}")
    print(
        f"  worst loop lag between two beats: {worst * 1000:.1f} ms: {'met' if worst <= 0.05 else 'missed'} (50 ms)"
    )
    print(
        f"  RSS {idle_rss:.0f} MB at the start, {peak_rss:.0f} MB at the peak ({per_1000:.1f} MB per 1,000 in "
        f"flight): {'met' if peak_rss <= 300 else 'missed'} (300 MB)"
    )


if __name__ == "__main__":
    main()
