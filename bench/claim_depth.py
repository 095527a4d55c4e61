"""How long `Outbox.claim(20)` takes as the backlog grows, on PostgreSQL.

    .venv/bin/python bench/claim_depth.py [--database-url URL] [--depths 1000,10000,100000,1000000]
                                          [--containers 10,100000] [--repeat 200] [--keep]

For each depth and each container count (capped at the depth), the tables are emptied and
filled with bulk SQL (generate_series), not through queue(): `depth` queued posts, all due,
spread round-robin over the containers, one lane per container whose head is its oldest
queued post and whose due_at is that post's next_at (the model's invariants). Then
`claim(20)` is timed `--repeat` times, each inside a transaction that is rolled back, so the
depth stays the same. The issue asks that the 1M figure stay within 2x of the 1k one.

At the largest depth, the statements of one claim are captured and shown with
EXPLAIN (ANALYZE, BUFFERS) (inside a transaction that is rolled back).

The database (default `outbox_bench_claim` on the local server) is created if missing and
dropped at the end unless --keep is given.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import unquote, urlparse

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/outbox_bench_claim"
SOURCE = "bench"
LIMIT = 20


def configure(database_url: str) -> None:
    """Create the database if needed, configure Django on it and migrate."""
    url = urlparse(database_url)
    if not url.scheme.startswith("postgres"):
        sys.exit("claim_depth.py fills its tables with PostgreSQL SQL (generate_series): give a postgres:// URL")
    name = url.path.lstrip("/")
    import psycopg

    with psycopg.connect(url._replace(path="/postgres").geturl(), autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')

    sys.path.insert(0, str(ROOT))
    from django.conf import settings

    settings.configure(
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": name,
                "USER": unquote(url.username or ""),
                "PASSWORD": unquote(url.password or ""),
                "HOST": url.hostname or "",
                "PORT": str(url.port or ""),
            }
        },
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_connector_outbox"],
        CONNECTOR_OUTBOX={"CONNECTORS": {SOURCE: {"BACKEND": "django_connector_outbox.connectors.memory.MemoryConnector"}}},
        USE_TZ=True,
        TIME_ZONE="UTC",
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
        SECRET_KEY="bench-only",
    )
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def drop_database(database_url: str) -> None:
    import psycopg
    from django.db import connections

    connections.close_all()
    url = urlparse(database_url)
    with psycopg.connect(url._replace(path="/postgres").geturl(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{url.path.lstrip("/")}"')


def fill(depth: int, containers: int) -> float:
    """`depth` queued, due posts over `containers` lanes, heads and due times set; seconds taken."""
    from django.db import DatabaseError, connection

    from django_connector_outbox.models import Lane, Post

    post, lane = Post._meta.db_table, Lane._meta.db_table
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {post}, {lane} RESTART IDENTITY")
        cursor.execute(
            f"""INSERT INTO {lane} (id, source, workspace_id, container_id, head_id, due_at)
                SELECT c, %s, 'W', 'C' || c, NULL, NULL FROM generate_series(1, %s) AS c""",
            [SOURCE, containers],
        )
        # Post g goes to lane ((g - 1) % containers) + 1 and was queued g microseconds after
        # an instant a day ago: all due, in queue order by id.
        cursor.execute(
            f"""INSERT INTO {post} (
                    id, source, post_id, lane_id, workspace_id, container_id, thread_id, kind, body,
                    rev, turn_key, state, attempts, queued_at, next_at, created_at, updated_at,
                    message_ref, last_error, worker, lease_token, lease_until, sent_at)
                SELECT g, %s, 'p' || g, l, 'W', 'C' || l, '', 'message',
                       jsonb_build_object('text', 'post ' || g), 0, NULL, 'queued', 0, t, t, t, t,
                       NULL, '', '', '', NULL, NULL
                FROM generate_series(1, %s) AS g,
                     LATERAL (SELECT ((g - 1) %% %s) + 1 AS l,
                                     now() - interval '1 day' + g * interval '1 microsecond' AS t) AS v""",
            [SOURCE, depth, containers],
        )
        # Each lane's head: its queued post with the smallest (queued_at, post_id).
        cursor.execute(
            f"""UPDATE {lane} AS lane SET head_id = head.id, due_at = head.next_at
                FROM (SELECT DISTINCT ON (lane_id) lane_id, id, next_at FROM {post}
                      WHERE state = 'queued' ORDER BY lane_id, queued_at, post_id) AS head
                WHERE lane.id = head.lane_id"""
        )
        for table in (post, lane):
            cursor.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))")
            cursor.execute(f"VACUUM ANALYZE {table}")
        # Write the filled pages out now, so that no checkpoint runs during the timing
        # (needs a superuser or pg_checkpoint; skipped otherwise).
        try:
            cursor.execute("CHECKPOINT")
        except DatabaseError:
            pass
    return time.perf_counter() - started


def check_invariants(depth: int, containers: int) -> None:
    from django.db.models import F

    from django_connector_outbox.models import Lane, Post

    assert Post.objects.filter(state="queued").count() == depth
    assert Lane.objects.count() == containers
    assert not Lane.objects.filter(head__isnull=True).exists()
    assert not Lane.objects.exclude(due_at=F("head__next_at")).exists()
    assert not Lane.objects.exclude(head__lane=F("pk")).exists()


def time_claims(repeat: int) -> list[float]:
    """Seconds per claim(LIMIT), each in a transaction rolled back; a few warm-up claims first."""
    from django.db import transaction

    from django_connector_outbox import Outbox

    outbox = Outbox(SOURCE)
    times = []
    for i in range(repeat + 5):
        with transaction.atomic():
            started = time.perf_counter()
            claimed = outbox.claim(LIMIT)
            elapsed = time.perf_counter() - started
            transaction.set_rollback(True)
        assert claimed, "nothing was claimed"
        if i >= 5:
            times.append(elapsed)
    return times


def explain_claim() -> list[tuple[str, str]]:
    """(statement, EXPLAIN (ANALYZE, BUFFERS) output) for each statement of one claim."""
    from django.db import connection, transaction

    from django_connector_outbox import Outbox

    statements: list[tuple[str, tuple]] = []

    def capture(execute, sql, params, many, context):
        statements.append((sql, params))
        return execute(sql, params, many, context)

    with transaction.atomic():
        with connection.execute_wrapper(capture):
            Outbox(SOURCE).claim(LIMIT)
        transaction.set_rollback(True)
    explained = []
    with transaction.atomic(), connection.cursor() as cursor:
        # Replayed in order in one transaction, so each sees what the claim's statement saw.
        for sql, params in statements:
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
            plan = "\n".join(row[0] for row in cursor.fetchall())
            explained.append((cursor.mogrify(sql, params) if hasattr(cursor, "mogrify") else sql, plan))
        transaction.set_rollback(True)
    return explained


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("--depths", default="1000,10000,100000,1000000", help="queued posts, comma-separated")
    parser.add_argument(
        "--containers", default="10,100000", help="container counts, comma-separated (capped at the depth)"
    )
    parser.add_argument("--repeat", type=int, default=200, help="timed claims per depth (200)")
    parser.add_argument("--keep", action="store_true", help="keep the database (default: drop it at the end)")
    args = parser.parse_args()
    depths = [int(d) for d in args.depths.split(",")]
    container_counts = [int(c) for c in args.containers.split(",")]

    configure(args.database_url)
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT version()")
        version = cursor.fetchone()[0]
    print(f"{version}\nclaim({LIMIT}), median of {args.repeat} claims, each rolled back\n")
    print(f"{'queued posts':>12}  {'containers':>10}  {'fill s':>7}  {'median ms':>9}  {'p90 ms':>7}  {'load':>5}")
    medians: dict[tuple[int, int], float] = {}
    explained: dict[int, list[tuple[str, str]]] = {}
    try:
        for containers in container_counts:
            for depth in depths:
                lanes = min(depth, containers)
                filled = fill(depth, lanes)
                check_invariants(depth, lanes)
                times = sorted(time_claims(args.repeat))
                medians[(containers, depth)] = statistics.median(times)
                p90 = times[int(len(times) * 0.9)]
                print(
                    f"{depth:>12,}  {lanes:>10,}  {filled:>7.1f}  "
                    f"{medians[(containers, depth)] * 1000:>9.2f}  {p90 * 1000:>7.2f}  {os.getloadavg()[0]:>5.2f}",
                    flush=True,
                )
                if depth == max(depths):
                    explained[lanes] = explain_claim()
        print()
        lo, hi = min(depths), max(depths)
        for containers in container_counts:
            ratio = medians[(containers, hi)] / medians[(containers, lo)]
            verdict = "ok" if ratio <= 2 else "OVER the 2x budget"
            print(f"{containers:>7,} containers (capped at the depth): {hi:,} / {lo:,} = {ratio:.2f}x  {verdict}")
        for lanes, statements in explained.items():
            print(f"\n=== EXPLAIN (ANALYZE, BUFFERS) at {hi:,} queued posts in {lanes:,} containers ===")
            for sql, plan in statements:
                print(f"\n{sql}\n{plan}")
    finally:
        if not args.keep:
            drop_database(args.database_url)


if __name__ == "__main__":
    main()
