"""Drain speed of `run_outbox` on PostgreSQL, against a bare psycopg queue loop in the same run.

Queues N posts over K containers, drains them with P `run_outbox --once` processes through
a no-op connector (bench/connectors.py), checks that every post is `posted` in per-container order, and
prints posts/s per P and the senders' peak RSS. Then the same N rows are drained by a bare
psycopg loop (claim 100 rows per `UPDATE ... FOR UPDATE SKIP LOCKED`, finish them with one
UPDATE; no order, no lease, no fencing): the physical limit of this machine.

    .venv/bin/python bench/throughput.py [-n 20000] [-k 1000] [-p 1,2,4] [--database-url URL]
    .venv/bin/python bench/throughput.py --scenarios      # K=1000 for P=1,2,4, then K=1 and K=N
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from multiprocessing import get_context

from common import DEFAULT_URL, ROOT, reset_tables, setup


def queue(n: int, k: int) -> None:
    from django.db import transaction

    from django_connector_outbox import Outbox

    outbox = Outbox("bench")
    with transaction.atomic():
        for first in range(0, n, 1000):
            outbox.queue_many(
                dict(post_id=f"p{i:07d}", workspace_id="W", container_id=f"C{i % k}", body={"i": i})
                for i in range(first, min(first + 1000, n))
            )


def drain(processes: int, database_url: str, concurrency: int, batch: int) -> tuple[float, float]:
    """Seconds from the first claim to the last post recorded, and the senders' peak RSS in MB."""
    from django.db import connection

    env = dict(
        os.environ,
        BENCH_DATABASE_URL=database_url,
        DJANGO_SETTINGS_MODULE="bench.settings",
        PYTHONPATH=str(ROOT),
    )
    command = [sys.executable, "-m", "django", "run_outbox", "--once", "--source", "bench",
               f"--concurrency={concurrency}", f"--batch={batch}", "-v", "0"]  # fmt: skip
    senders = [subprocess.Popen(command, env=env, cwd=ROOT) for _ in range(processes)]
    for sender in senders:
        if sender.wait() != 0:
            raise SystemExit(f"run_outbox exited {sender.returncode}")
    rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT extract(epoch FROM max(updated_at) - min(sent_at)) FROM django_connector_outbox_post"
        )
        (seconds,) = cursor.fetchone()
    return float(seconds), rss_mb


def check_order(n: int) -> None:
    """Every post posted, and within each container posted in queue order."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM django_connector_outbox_post WHERE state = 'posted'")
        (posted,) = cursor.fetchone()
        cursor.execute(
            """SELECT count(*) FROM (
                 SELECT updated_at, lag(updated_at) OVER (PARTITION BY lane_id ORDER BY queued_at, post_id) AS before
                 FROM django_connector_outbox_post) t
               WHERE before IS NOT NULL AND before > updated_at"""
        )
        (out_of_order,) = cursor.fetchone()
    if posted != n or out_of_order:
        raise SystemExit(f"FAILED: {posted}/{n} posted, {out_of_order} posted out of container order")


def bare_worker(database_url: str, start: object) -> None:
    import psycopg

    start.wait()  # type: ignore[attr-defined]
    with psycopg.connect(database_url) as conn:
        while True:
            with conn.transaction():
                ids = [row[0] for row in conn.execute(
                    """UPDATE bench_jobs SET state = 'running' WHERE id IN (
                         SELECT id FROM bench_jobs WHERE state = 'queued' LIMIT 100 FOR UPDATE SKIP LOCKED)
                       RETURNING id""")]  # fmt: skip
                if not ids:
                    return
                conn.execute("UPDATE bench_jobs SET state = 'done' WHERE id = ANY(%s)", [ids])


def bare_loop(n: int, processes: int, database_url: str) -> float:
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_jobs")
        conn.execute("CREATE TABLE bench_jobs (id bigserial PRIMARY KEY, state text NOT NULL, payload jsonb)")
        conn.execute("CREATE INDEX ON bench_jobs (state)")
        conn.execute(
            "INSERT INTO bench_jobs (state, payload) SELECT 'queued', jsonb_build_object('i', i) FROM generate_series(1, %s) i",
            [n],
        )
        conn.execute("ANALYZE bench_jobs")
    ctx = get_context("spawn")
    start = ctx.Event()
    workers = [ctx.Process(target=bare_worker, args=(database_url, start)) for _ in range(processes)]
    for worker in workers:
        worker.start()
    began = time.perf_counter()
    start.set()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - began
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("DROP TABLE bench_jobs")
    return elapsed


def run(n: int, k: int, processes: list[int], args: argparse.Namespace) -> None:
    for p in processes:
        reset_tables()
        queue(n, k)
        seconds, rss = drain(p, args.database_url, args.concurrency, args.batch)
        check_order(n)
        bare = bare_loop(n, p, args.database_url)
        print(
            f"N={n:<7} K={k:<7} P={p}  run_outbox {n / seconds:9,.0f} posts/s   bare loop {n / bare:9,.0f} jobs/s"
            f"   ratio {bare / seconds:5.1%}   sender peak RSS {rss:5.1f} MB",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("-n", type=int, default=20_000, help="posts (20000)")
    parser.add_argument("-k", type=int, default=1_000, help="containers (1000)")
    parser.add_argument("-p", default="1,2,4", help="sender processes, comma-separated (1,2,4)")
    parser.add_argument("--concurrency", type=int, default=4, help="run_outbox --concurrency (4)")
    parser.add_argument("--batch", type=int, default=100, help="run_outbox --batch (100)")
    parser.add_argument(
        "--scenarios", action="store_true", help="K=1000 for P=1,2,4, then K=1 (P=1) and K=N (P=4)"
    )
    args = parser.parse_args()
    setup(args.database_url)
    print(f"database: {args.database_url}; concurrency {args.concurrency}, batch {args.batch}", flush=True)
    if args.scenarios:
        run(args.n, 1_000, [1, 2, 4], args)
        run(args.n, 1, [1], args)
        run(args.n, args.n, [4], args)
    else:
        run(args.n, args.k, [int(p) for p in args.p.split(",")], args)
    reset_tables()


if __name__ == "__main__":
    main()
