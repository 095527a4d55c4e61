"""How fast is the Post changelist with a million rows on PostgreSQL?

    python bench/admin_changelist.py [--rows 1000000] [--refill] [--runs 7]
        [--database-url postgres://postgres@127.0.0.1:5432/outbox_admin_bench]

Fills a dedicated database (created if missing; never the test database) with bulk SQL
(generate_series): 2,000 containers over the two sources of tests/settings.py, and a mix of
states like an outbox a week into its retention: 94% posted, 2% cancelled, 2% queued, 0.1%
sending, 1.5% failed, 0.4% uncertain (a sending post is its lane's leased head, each in a
container of its own, as a claim leaves it: its row says `queued`, the lease is the lane's). Then it GETs changelist URLs with Django's test Client
as a superuser and prints the median server time of several runs, the number of queries,
the slowest query of each page, and whether it is under issue 10's 300 ms target (met or
MISSED). The pages: the default view (needs attention), every state choice and "all
states", the source and kind filters, the queued_at and updated_at ranges, the search, a
far page and a detail page. Rows are kept between runs (--refill starts over).

The fill is SQL on the current tables' columns (a million rows through the Outbox would take
far longer): when the tables change, FILL_POSTS and SET_HEADS change with them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/outbox_admin_bench"
CONTAINERS = 2000
TARGET_MS = 300  # issue 10: the default view and every filter, "all states" included

FILL_LANES = """
INSERT INTO django_connector_outbox_lane (
    source, workspace_id, container_id, head_id, due_at, lease_token, worker, attempts
)
SELECT CASE WHEN c %% 2 = 0 THEN 'memory' ELSE 'other' END, 'T1', 'C' || c, NULL, NULL, '', '', 0
FROM generate_series(1, %(containers)s) AS c
"""

# i % 1000 picks the state; updated_at spreads the rows over the last week, oldest first.
# `sending` marks the posts to lease (LEASE_HEADS), each in a container of its own (a lane
# leases one post at a time): it is never stored, and LEASE_HEADS turns it back to `queued`.
FILL_POSTS = """
WITH r AS (
    SELECT i,
        CASE
            WHEN i %% 1000 < 940 THEN 'posted'
            WHEN i %% 1000 < 960 THEN 'cancelled'
            WHEN i %% 1000 < 980 THEN 'queued'
            WHEN i %% 1000 < 981 THEN 'sending'
            WHEN i %% 1000 < 996 THEN 'failed'
            ELSE 'uncertain'
        END AS state,
        now() - (%(rows)s - i) * interval '600 milliseconds' AS t
    FROM generate_series(1, %(rows)s) AS i
), s AS (
    SELECT r.*, (SELECT min(id) FROM django_connector_outbox_lane)
        + CASE WHEN r.state = 'sending' THEN r.i / 1000 ELSE r.i END %% %(containers)s AS lane_id
    FROM r
)
INSERT INTO django_connector_outbox_post (
    source, post_id, lane_id, workspace_id, container_id, thread_id, kind, body, rev, turn_key, state,
    attempts, queued_at, next_at, created_at, updated_at, message_ref, last_error
)
SELECT l.source, 'post-' || s.i, s.lane_id, 'T1', l.container_id, '', 'message',
    CASE WHEN s.state IN ('posted', 'cancelled') THEN NULL
         ELSE jsonb_build_object('text', 'bench post ' || s.i) END,
    0, NULL, s.state,
    CASE s.state WHEN 'failed' THEN 5 WHEN 'uncertain' THEN 1 ELSE 0 END,
    s.t - interval '2 seconds', s.t - interval '2 seconds', s.t - interval '2 seconds', s.t,
    CASE WHEN s.state = 'posted' THEN l.container_id || ':' || s.i END,
    CASE s.state WHEN 'failed' THEN 'channel_not_found' WHEN 'uncertain' THEN 'cannot check' ELSE '' END
FROM s JOIN django_connector_outbox_lane l ON l.id = s.lane_id
"""

SET_HEADS = """
UPDATE django_connector_outbox_lane l SET head_id = h.id, due_at = h.next_at
FROM (
    SELECT DISTINCT ON (lane_id) lane_id, id, next_at
    FROM django_connector_outbox_post WHERE state IN ('queued', 'sending')
    ORDER BY lane_id, (state = 'sending') DESC, queued_at, id
) h WHERE l.id = h.lane_id
"""

# A claim's lease on each lane whose head is marked `sending`: the post stays `queued`.
LEASE_HEADS = [
    """
    UPDATE django_connector_outbox_lane l SET lease_token = md5(p.id::text), worker = 'bench-host:1',
        due_at = now() + interval '2 minutes', attempts = 1, sent_at = p.updated_at - interval '1 second'
    FROM django_connector_outbox_post p WHERE p.id = l.head_id AND p.state = 'sending'
    """,
    "UPDATE django_connector_outbox_post SET state = 'queued' WHERE state = 'sending'",
]


# Indexes proposed to the lead (not in models.py yet): --proposed-indexes adds them to the
# bench database, --no-proposed-indexes drops them, so both figures can be compared.
# (connector_outbox_post_updated, proposed here first, is the model's since migration 0005.)
PROPOSED_INDEXES = {
    # The default list (the states that need attention), newest first, whatever the mix of
    # states: a partial index holds only those rows (PostgreSQL and SQLite; MariaDB has none).
    "connector_outbox_post_attention": (
        "(updated_at, id) WHERE state IN ('queued', 'sending', 'failed', 'uncertain')"
    ),
}


def proposed_indexes(create: bool) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        for name, columns in PROPOSED_INDEXES.items():
            if create:
                cursor.execute(f"CREATE INDEX IF NOT EXISTS {name} ON django_connector_outbox_post {columns}")
            else:
                cursor.execute(f"DROP INDEX IF EXISTS {name}")
        cursor.execute("ANALYZE django_connector_outbox_post")


def ensure_database(url: str) -> None:
    import psycopg

    parsed = urlparse(url)
    name = parsed.path.lstrip("/")
    admin_url = parsed._replace(path="/postgres").geturl()
    with psycopg.connect(admin_url, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')
            print(f"created database {name}")


def fill(rows: int, refill: bool) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM (SELECT 1 FROM django_connector_outbox_post LIMIT %s) s", [rows])
        present = cursor.fetchone()[0]
        if present == rows and not refill:
            print(f"{rows:,} posts already there (--refill to start over)")
            return
        started = time.perf_counter()
        cursor.execute(
            "TRUNCATE django_connector_outbox_lane, django_connector_outbox_post RESTART IDENTITY CASCADE"
        )
        cursor.execute(FILL_LANES, {"containers": CONTAINERS})
        cursor.execute(FILL_POSTS, {"rows": rows, "containers": CONTAINERS})
        cursor.execute(SET_HEADS)
        for sql in LEASE_HEADS:
            cursor.execute(sql)
        # Index-only scans need the visibility map, and the planner needs statistics.
        cursor.execute("VACUUM ANALYZE django_connector_outbox_post")
        cursor.execute("VACUUM ANALYZE django_connector_outbox_lane")
        print(f"filled {rows:,} posts in {time.perf_counter() - started:.1f} s")


def measure(client, url: str, runs: int) -> tuple[float, int, float, str]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    response = client.get(url)  # warm-up (and a check)
    assert response.status_code == 200, (url, response.status_code)
    times = []
    for _ in range(runs):
        with CaptureQueriesContext(connection) as queries:
            started = time.perf_counter()
            response = client.get(url)
            times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200
    slowest = max(queries.captured_queries, key=lambda q: float(q["time"]))
    return (
        statistics.median(times),
        len(queries.captured_queries),
        float(slowest["time"]) * 1000,
        slowest["sql"],
    )


def pages_to_time(changelist: str, some_post: tuple[int, str], rows: int) -> list[tuple[str, str]]:
    """The default view and every filter of the changelist, each state and "all states" included."""
    from django_connector_outbox.posts import Kind, State

    day = 86400
    yesterday = time.strftime("%Y-%m-%d", time.gmtime(time.time() - day))
    week_ago = time.strftime("%Y-%m-%d", time.gmtime(time.time() - 7 * day))
    far = min(100, max(1, rows // 2000))  # a page that exists (4% of the rows need attention)
    pages = [("default (needs attention)", changelist), (f"default, page {far}", f"{changelist}?p={far}")]
    pages += [(f"state={state}", f"{changelist}?state={state}") for state in [*State.values, "all"]]
    pages += [
        (f"state=all, page {far}", f"{changelist}?state=all&p={far}"),
        ("source=memory", f"{changelist}?source=memory"),
        ("state=failed&source=memory", f"{changelist}?state=failed&source=memory"),
        ("state=all&source=memory", f"{changelist}?state=all&source=memory"),
    ]
    pages += [(f"kind={kind}", f"{changelist}?kind__exact={kind}") for kind in Kind.values]
    pages += [
        ("state=all&kind=message", f"{changelist}?state=all&kind__exact=message"),
        ("queued_at range (1 day)", f"{changelist}?queued_at__range__gte={yesterday}"),
        ("state=all, queued_at range (1 day)", f"{changelist}?state=all&queued_at__range__gte={yesterday}"),
        ("state=all, queued_at range (6 days ago)",
            f"{changelist}?state=all&queued_at__range__gte={week_ago}&queued_at__range__lte={week_ago}"),
        ("updated_at range (1 day)", f"{changelist}?updated_at__range__gte_0={yesterday}"
            "&updated_at__range__gte_1=00:00:00"),
        ("state=all, updated_at range (1 day)", f"{changelist}?state=all&updated_at__range__gte_0={yesterday}"
            "&updated_at__range__gte_1=00:00:00"),
        ("search post id", f"{changelist}?q={some_post[1]}"),
        ("state=all, search post id", f"{changelist}?state=all&q={some_post[1]}"),
        ("state=all, search container", f"{changelist}?state=all&q=C17"),
    ]  # fmt: skip
    return pages


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--refill", action="store_true")
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument(
        "--proposed-indexes",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="add (or, with --no-, drop) the indexes proposed in PROPOSED_INDEXES",
    )
    parser.add_argument("--show-sql", action="store_true", help="print the slowest query of each page")
    args = parser.parse_args()

    ensure_database(args.database_url)
    os.environ["DATABASE_URL"] = args.database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.test import Client
    from django.test.utils import setup_test_environment
    from django.urls import reverse

    settings.DEBUG = False
    setup_test_environment()  # lets the test Client in (ALLOWED_HOSTS) and keeps query times
    call_command("migrate", verbosity=0)
    fill(args.rows, args.refill)
    if args.proposed_indexes is not None:
        proposed_indexes(args.proposed_indexes)

    from django_connector_outbox.models import Post

    user, _ = get_user_model().objects.get_or_create(
        username="bench-admin", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client()
    client.force_login(user)
    changelist = reverse("admin:django_connector_outbox_post_changelist")
    some_post = (
        Post.objects.filter(state="failed").order_by("-updated_at").values_list("pk", "post_id").first()
    )
    assert some_post, "no failed post: fill first"
    pages = pages_to_time(changelist, some_post, args.rows)
    pages.append(("detail page", reverse("admin:django_connector_outbox_post_change", args=[some_post[0]])))
    total = Post.objects.count()
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'django_connector_outbox_post'")
        extra = sorted(set(PROPOSED_INDEXES) & {row[0] for row in cursor.fetchall()})
    print(f"\nPostgreSQL, {total:,} posts; proposed indexes: {', '.join(extra) or 'none'}")
    print(
        f"median of {args.runs} GETs (server time via the test Client); load average {os.getloadavg()[0]:.2f}"
    )
    print(f"target: each page under {TARGET_MS} ms\n")
    print(f"{'page':<40} {'median ms':>10} {'queries':>8} {'slowest q ms':>13}  target")
    missed = 0
    for name, url in pages:
        median, count, slowest, sql = measure(client, url, args.runs)
        met = median < TARGET_MS
        missed += not met
        print(f"{name:<40} {median:>10.1f} {count:>8} {slowest:>13.1f}  {'met' if met else 'MISSED'}")
        if args.show_sql:
            print(f"    {sql}")
    print(
        f"\n{len(pages) - missed} of {len(pages)} pages under {TARGET_MS} ms; load average {os.getloadavg()[0]:.2f}"
    )


if __name__ == "__main__":
    main()
