"""A soak on PostgreSQL: is every path flat as the tables grow, and do they stop growing?

    .venv/bin/python bench/soak.py [--sizes 10000,1000000,10000000] [--runs 5] [--keep]
    .venv/bin/python bench/soak.py --sustain 1800 --rate 2000 [--senders 2] [--retention 60]

**Sizes** (the default). One database (`soak` unless --database-url), filled with SQL
(INSERT ... SELECT generate_series) to each size in turn, growing: a table as a long-running
product's looks. At N posts: N/10 lanes (containers), N/100 status posts (one per lane,
delivered, their bodies kept), a backlog of BACKLOG queued posts (two per lane over
BACKLOG/2 lanes, all due), N/1,000 idle gates, a few installations, destinations and
senders, and the rest history: posted (96%), cancelled (2%), failed (1%) and uncertain (1%:
at 10k rows each state's list has a full page of 50), last changed
over the week before (RETENTION's default), spread over every lane. Each lane's head, due
time and floor are set by one UPDATE from its queued posts (the head rule: the first queued
post in queue order), checked by `Outbox.repair_lanes()` on three batches of lanes (it must
repair none) and by one query over the queued posts. Then ANALYZE (and VACUUM, which the
visibility map needs; this server runs with autovacuum off), and per size the median of
--runs runs of:

- claim: `Outbox.claim(100)` in its own transaction (committed);
- finish: the same 100, posted, by `Outbox.finish_many` (committed);
- queue_many: 1,000 posts in one call, one transaction (rolled back, so the size stays);
- queue x100: 100 `queue()` calls in one transaction (rolled back);
- the WAL written per post by the claim and finish, and by the queue_many (pg_current_wal_lsn
  before and after; the server's, so other databases' writes count too);
- every admin page (Django's test Client, a superuser, as bench/admin_changelist.py): the
  posts changelist's default view and each state filter, a post's change page, and the
  changelists of gates, installations, destinations and senders. Lanes have no admin page.

It prints a table, one column per size, and per row the ratio of the largest size to the
smallest with "flat within 1.5x: met/missed". The tables use tests/settings.py (the admin),
source "memory"; nothing is sent.

**Sustained** (--sustain SECONDS). Its own database (`soak_sustain`), emptied. A producer
process queues --rate posts a second (`queue_many` each tenth of a second; --status-share of
them are `set_status` calls, one status post per conversation), into conversations that
come and go (CONVERSATIONS at a time, POSTS_PER_CONVERSATION posts each, then new ones: new
lanes all the time, as a product that posts per conversation). --senders `run_outbox`
processes (bench/connectors.py's no-op connector, as bench/throughput.py starts them, at
their defaults) drain, and their housekeeping prunes with RETENTION --retention seconds
(bench/settings.py reads BENCH_OUTBOX), and STATUS_RETENTION as well where the settings
have it. Every --every seconds it prints the rows of posts (status ones apart), lanes,
gates and attempts, the tables' sizes (pg_total_relation_size), the queue and drain rates of
the interval (drain: the senders' heartbeat counts) and the backlog (queued posts). This
server runs with autovacuum off: after each sample the program VACUUMs the four tables, as
autovacuum would (--no-vacuum to leave them). At the end: whether each count stayed within
a band after warm-up (the second half of the samples after warm-up peaks no higher than
1.2x the first half's peak: the housekeeping prunes every HOUSEKEEPING_INTERVAL, 300 s, so
the counts are a saw-tooth between about rate x RETENTION and rate x (RETENTION + 300 s)).

The database is dropped at the end unless --keep is given.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SERVER = "postgres://postgres@127.0.0.1:5432"
SOURCE = "memory"  # tests/settings.py's source (sizes)
BENCH_SOURCE = "bench"  # bench/settings.py's no-op source (sustained)
POST = "django_connector_outbox_post"
LANE = "django_connector_outbox_lane"
GATE = "django_connector_outbox_gate"
ATTEMPT = "django_connector_outbox_attempt"
BACKLOG = 1000  # queued posts at every size
CLAIM = 100
QUEUE_MANY = 1000
QUEUE_CALLS = 100
FLAT = 1.5
CONVERSATIONS = 2000
POSTS_PER_CONVERSATION = 20
HISTORY_CHUNK = 2_000_000


def admin_connection(database_url: str) -> Any:
    import psycopg

    return psycopg.connect(urlparse(database_url)._replace(path="/postgres").geturl(), autocommit=True)


def create_database(database_url: str, *, fresh: bool) -> None:
    name = urlparse(database_url).path.lstrip("/")
    with admin_connection(database_url) as conn:
        if fresh:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


def drop_database(database_url: str) -> None:
    from django.db import connections

    connections.close_all()
    name = urlparse(database_url).path.lstrip("/")
    with admin_connection(database_url) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
    print(f"dropped database {name}")


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def sql(statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def scalar(statement: str, params: Any = None) -> Any:
    return sql(statement, params)[0][0]


# Sizes: the fill ------------------------------------------------------------------------

LANES = f"""
INSERT INTO {LANE} (id, source, workspace_id, container_id, lease_token, worker, attempts)
SELECT l, %(source)s, 'W' || (l %% 1000), 'C' || l, '', '', 0 FROM generate_series(%(first)s, %(last)s) AS l
"""

# One delivered status post per lane, its body kept (kind status is never pruned by RETENTION).
STATUS = f"""
INSERT INTO {POST} (source, post_id, lane_id, workspace_id, container_id, thread_id, kind, body, rev, state,
                    attempts, delivered_attempt, queued_at, next_at, created_at, updated_at, message_ref,
                    last_error)
SELECT %(source)s, 'status-' || l, l, 'W' || (l %% 1000), 'C' || l, '', 'status',
       jsonb_build_object('text', 'status of ' || l, 'progress', l %% 100), 3, 'posted', 0, 1, t, t,
       t - interval '1 day', t, 'C' || l || ':status', ''
FROM generate_series(%(first)s, %(last)s) AS l,
     LATERAL (SELECT now() - interval '1 hour' - ((l * 7919) %% 604800) * interval '1 second' AS t) AS v
"""

# Queued posts, two per lane over BACKLOG/2 lanes, all due, queued in the last hour.
TOP_UP = f"""
INSERT INTO {POST} (source, post_id, lane_id, workspace_id, container_id, thread_id, kind, body, rev, state,
                    attempts, queued_at, next_at, created_at, updated_at, last_error)
SELECT %(source)s, 'q-' || %(tag)s || '-' || g, l, 'W' || (l %% 1000), 'C' || l, '', 'message',
       jsonb_build_object('text', 'queued post ' || g), 0, 'queued', 0, t, t, t, t, ''
FROM generate_series(1, %(count)s) AS g,
     LATERAL (SELECT ((g - 1) %% %(lanes)s) + 1 AS l,
                     now() - interval '1 hour' + g * interval '1 millisecond' AS t) AS v
"""

# History over the week before the last hour, spread over every lane; g % 1000 picks the state.
HISTORY = f"""
INSERT INTO {POST} (source, post_id, lane_id, workspace_id, container_id, thread_id, kind, body, rev, state,
                    attempts, delivered_attempt, queued_at, next_at, created_at, updated_at, message_ref,
                    last_error)
SELECT %(source)s, 'h-' || g, l, 'W' || (l %% 1000), 'C' || l, '', 'message',
       CASE WHEN s IN ('failed', 'uncertain') THEN jsonb_build_object('text', 'history ' || g) END,
       0, s, CASE s WHEN 'failed' THEN 5 WHEN 'uncertain' THEN 1 ELSE 0 END,
       CASE WHEN s = 'posted' THEN 1 ELSE 0 END,
       t - interval '2 seconds', t - interval '2 seconds', t - interval '2 seconds', t,
       CASE WHEN s = 'posted' THEN 'C' || l || ':' || g END,
       CASE s WHEN 'failed' THEN 'channel_not_found' WHEN 'uncertain' THEN 'cannot check' ELSE '' END
FROM generate_series(%(first)s, %(last)s) AS g,
     LATERAL (SELECT ((g * 2654435761) %% %(lanes)s) + 1 AS l,
                     CASE WHEN g %% 1000 < 960 THEN 'posted' WHEN g %% 1000 < 980 THEN 'cancelled'
                          WHEN g %% 1000 < 990 THEN 'failed' ELSE 'uncertain' END AS s,
                     now() - interval '169 hours' + (g %% 604800) * interval '1 second'
                         + (g / 604800) * interval '1 millisecond' AS t) AS v
"""

# The head rule, in one UPDATE: each lane's head is its first queued post in queue order, due
# at its next_at, and the floor is that post (no queued post sorts before it); a lane without
# a queued post has none of them. No lease is held between runs.
HEADS = f"""
UPDATE {LANE} lane SET head_id = h.id, due_at = h.next_at, floor_queued_at = h.queued_at, floor_id = h.id
FROM (SELECT DISTINCT ON (lane_id) lane_id, id, queued_at, next_at FROM {POST}
      WHERE state = 'queued' ORDER BY lane_id, queued_at, id) h
WHERE lane.id = h.lane_id AND lane.head_id IS DISTINCT FROM h.id
"""

# Every queued post whose lane's head is missing or comes after it in queue order: none.
HEAD_RULE_BROKEN = f"""
SELECT count(*) FROM {POST} p JOIN {LANE} lane ON lane.id = p.lane_id LEFT JOIN {POST} h ON h.id = lane.head_id
WHERE p.state = 'queued' AND (h.id IS NULL OR (h.queued_at, h.id) > (p.queued_at, p.id)
                              OR lane.due_at IS DISTINCT FROM h.next_at OR lane.lease_token <> '')
"""

GATES = f"""
INSERT INTO {GATE} (source, scope, workspace_id, container_id, held_until, hold_reason, pace_tat, updated_at)
SELECT %(source)s, 'container', 'W' || (g %% 1000), 'G' || g, now() - interval '1 hour', 'ratelimited',
       now() - interval '1 hour', now() - interval '1 hour'
FROM generate_series(%(first)s, %(last)s) AS g
"""


def fill_to(size: int) -> dict[str, float]:
    """Grow the tables to `size` posts (see the module); seconds per step."""
    steps: dict[str, float] = {}
    lanes_wanted, status_wanted, gates_wanted = size // 10, size // 100, max(size // 1000, 1)

    def step(name: str, statement: str, params: dict[str, Any]) -> None:
        started = time.perf_counter()
        sql(statement, {"source": SOURCE, **params})
        steps[name] = steps.get(name, 0.0) + time.perf_counter() - started

    lanes = scalar(f"SELECT coalesce(max(id), 0) FROM {LANE}")
    if lanes < lanes_wanted:
        step("lanes", LANES, {"first": lanes + 1, "last": lanes_wanted})
        sql(f"SELECT setval(pg_get_serial_sequence('{LANE}', 'id'), %s)", [lanes_wanted])
    status = scalar(f"SELECT count(*) FROM {POST} WHERE kind = 'status'")
    if status < status_wanted:
        step("status posts", STATUS, {"first": status + 1, "last": status_wanted})
    queued = scalar(f"SELECT count(*) FROM {POST} WHERE state = 'queued'")
    if queued < BACKLOG:
        step("backlog", TOP_UP, {"tag": size, "count": BACKLOG - queued, "lanes": BACKLOG // 2})
    gates = scalar(f"SELECT count(*) FROM {GATE}")
    if gates < gates_wanted:
        step("gates", GATES, {"first": gates + 1, "last": gates_wanted})
    history = scalar(f"SELECT count(*) FROM {POST} WHERE post_id LIKE 'h-%%'")
    missing = size - scalar(f"SELECT count(*) FROM {POST}")
    for first in range(history + 1, history + missing + 1, HISTORY_CHUNK):
        last = min(first + HISTORY_CHUNK - 1, history + missing)
        step("history", HISTORY, {"first": first, "last": last, "lanes": lanes_wanted})
        print(f"  history rows: {last:,} after {steps['history']:.0f} s", flush=True)
    step("heads", HEADS, {})
    for table in (POST, LANE, GATE, ATTEMPT):
        step("vacuum analyze", f"VACUUM ANALYZE {table}", {})
    step("checkpoint", "CHECKPOINT", {})
    return steps


def check_lanes(lanes: int) -> None:
    """The lanes as the store keeps them: repair_lanes finds nothing to repair, and no queued
    post comes before its lane's head."""
    from django_connector_outbox import Outbox

    outbox = Outbox(SOURCE)
    for after in sorted({0, max(lanes // 2 - 250, 0), max(lanes - 500, 0)}):
        _, repairs = outbox.repair_lanes(after, 500)
        assert not repairs, f"repair_lanes after lane {after} repaired {repairs[:3]}"
    broken = scalar(HEAD_RULE_BROKEN)
    assert broken == 0, f"{broken} queued posts break the head rule"


def fixed_rows() -> None:
    """A few installations, destinations and senders (their tables do not grow with posts)."""
    from django.utils import timezone

    from django_connector_outbox.models import Destination, Heartbeat, Installation

    now = timezone.now()
    if not Installation.objects.exists():
        Installation.objects.bulk_create(
            Installation(source=SOURCE, workspace_id=f"W{i}", team_name=f"team {i}") for i in range(20)
        )
        Destination.objects.bulk_create(
            Destination(source=SOURCE, container_id=f"D{i}", secrets="sealed") for i in range(20)
        )
        Heartbeat.objects.bulk_create(
            Heartbeat(worker=f"host:{i}", host="host", pid=i, sources=[SOURCE], started_at=now, last_seen=now)
            for i in range(4)
        )


# Sizes: the measurements ------------------------------------------------------------------


def timed(work: Any) -> float:
    started = time.perf_counter()
    work()
    return (time.perf_counter() - started) * 1000


def wal() -> int:
    """The server's WAL position, in bytes (every session's writes: the machine is shared)."""
    return int(scalar("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn"))


def claim_and_finish() -> tuple[float, float]:
    """ms of claim(CLAIM) and of finishing the same batch posted, each its own transaction."""
    from django.db import transaction

    from django_connector_outbox import Outbox
    from django_connector_outbox.posts import Action, Finish

    outbox = Outbox(SOURCE)
    claimed: list[Any] = []

    def claim() -> None:
        with transaction.atomic():
            claimed.extend(outbox.claim(CLAIM))

    def finish() -> None:
        done = outbox.finish_many(
            [
                (c, Finish(c.post_id, c.lease_token, Action.POSTED, message_ref=f"ref-{c.post_id}"))
                for c in claimed
            ]
        )
        assert all(done), "a finish of the soak's own claim was refused"

    claim_ms = timed(claim)
    assert len(claimed) == CLAIM, f"claimed {len(claimed)} of {CLAIM}"
    return claim_ms, timed(finish)


def queue_rolled_back(calls: bool) -> float:
    """ms of QUEUE_MANY posts by one queue_many (or QUEUE_CALLS queue() calls), one transaction,
    rolled back: into existing containers over the whole table, some of them with a backlog."""
    from django.db import transaction

    from django_connector_outbox import Outbox

    outbox = Outbox(SOURCE)
    lanes = scalar(f"SELECT max(id) FROM {LANE}")
    tag = uuid.uuid4().hex[:8]
    count = QUEUE_CALLS if calls else QUEUE_MANY
    posts = [
        dict(
            post_id=f"new-{tag}-{i}",
            workspace_id=f"W{lane % 1000}",
            container_id=f"C{lane}",
            body={"text": "x"},
        )
        for i in range(count)
        for lane in [(i * 7919) % lanes + 1]
    ]

    def queue() -> None:
        with transaction.atomic():
            if calls:
                for post in posts:
                    outbox.queue(**post)
            else:
                outbox.queue_many(posts)
            transaction.set_rollback(True)

    return timed(queue)


def admin_pages() -> list[tuple[str, str]]:
    from django.urls import reverse

    from django_connector_outbox.models import Post
    from django_connector_outbox.posts import State

    posts = reverse("admin:django_connector_outbox_post_changelist")
    pages = [("posts: default (needs attention)", posts)]
    pages += [(f"posts: state={state}", f"{posts}?state={state}") for state in [*State.values, "all"]]
    some = Post.objects.filter(state="failed").order_by("-updated_at").values_list("pk", flat=True).first()
    pages.append(("post change page", reverse("admin:django_connector_outbox_post_change", args=[some])))
    for model in ("gate", "installation", "destination", "heartbeat"):
        pages.append((f"{model}s changelist", reverse(f"admin:django_connector_outbox_{model}_changelist")))
    return pages


def get_page(client: Any, url: str) -> float:
    started = time.perf_counter()
    response = client.get(url)
    elapsed = (time.perf_counter() - started) * 1000
    assert response.status_code == 200, (url, response.status_code)
    return elapsed


def measure(runs: int) -> dict[str, float]:
    """The median ms of each measurement (see the module)."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    user, _ = get_user_model().objects.get_or_create(
        username="soak-admin", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client()
    client.force_login(user)
    samples: dict[str, list[float]] = {}
    claim_and_finish()  # warm-up: plans prepared, caches read
    queue_rolled_back(False)
    for _ in range(runs):
        before = wal()
        claim_ms, finish_ms = claim_and_finish()
        samples.setdefault(f"claim({CLAIM})", []).append(claim_ms)
        samples.setdefault(f"finish {CLAIM} posted", []).append(finish_ms)
        samples.setdefault("  WAL bytes/post, claim + finish", []).append((wal() - before) / CLAIM)
        before = wal()
        samples.setdefault(f"queue_many {QUEUE_MANY:,}", []).append(queue_rolled_back(False))
        samples.setdefault("  WAL bytes/post, queue_many", []).append((wal() - before) / QUEUE_MANY)
        samples.setdefault(f"queue() x{QUEUE_CALLS}", []).append(queue_rolled_back(True))
    for name, url in admin_pages():
        get_page(client, url)  # warm-up
        samples[name] = [get_page(client, url) for _ in range(runs)]
    return {name: statistics.median(values) for name, values in samples.items()}


def sizes_mode(args: argparse.Namespace) -> None:
    sizes = sorted(int(s) for s in args.sizes.split(","))
    database_url = args.database_url or f"{SERVER}/soak"
    create_database(database_url, fresh=not args.reuse)
    os.environ["DATABASE_URL"] = database_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.test.utils import setup_test_environment

    settings.DEBUG = False
    setup_test_environment()  # lets the test Client in (ALLOWED_HOSTS)
    call_command("migrate", verbosity=0)
    fixed_rows()
    print(f"database {database_url}; {scalar('SELECT version()').split(' on ')[0]}; load average {load()}")
    results: dict[int, dict[str, float]] = {}
    try:
        for size in sizes:
            started = time.perf_counter()
            steps = fill_to(size)
            total = time.perf_counter() - started
            check_lanes(size // 10)
            counts = sql(
                f"""SELECT count(*), count(*) FILTER (WHERE kind = 'status'), count(*) FILTER (WHERE state = 'queued'),
                           (SELECT count(*) FROM {LANE}), (SELECT count(*) FROM {GATE}),
                           pg_total_relation_size('{POST}'), pg_total_relation_size('{LANE}')
                    FROM {POST}"""
            )[0]
            print(
                f"\n{size:,}: filled in {total:.1f} s ({', '.join(f'{k} {v:.1f} s' for k, v in steps.items())}); "
                f"{counts[0]:,} posts ({counts[1]:,} status, {counts[2]:,} queued), {counts[3]:,} lanes, "
                f"{counts[4]:,} gates; posts {counts[5] / 2**20:,.0f} MB, lanes {counts[6] / 2**20:,.0f} MB "
                f"(with indexes); lanes checked; load average {load()}",
                flush=True,
            )
            started = time.perf_counter()
            results[size] = measure(args.runs)
            print(f"  measured in {time.perf_counter() - started:.0f} s; load average {load()}", flush=True)
        report(sizes, results)
        if args.explain:
            explain_slowest(sizes[-1])
    finally:
        if not args.keep:
            drop_database(database_url)


def report(sizes: list[int], results: dict[int, dict[str, float]]) -> None:
    lo, hi = sizes[0], sizes[-1]
    head = f"{'median ms (WAL: bytes)':<36}" + "".join(f"{size:>12,}" for size in sizes)
    print(f"\nmedian of the runs, ms; load average {load()}\n{head}   {hi // lo:,}x rows: ratio")
    missed = 0
    for name in results[lo]:
        ratio = results[hi][name] / results[lo][name]
        verdict = "met" if ratio <= FLAT else "MISSED"
        missed += verdict != "met"
        values = "".join(f"{results[size][name]:>12.1f}" for size in sizes)
        print(f"{name:<36}{values}   {ratio:5.2f}  flat within {FLAT}x: {verdict}")
    print(f"\n{len(results[lo]) - missed} of {len(results[lo])} flat within {FLAT}x ({hi:,} rows / {lo:,})")


def explain_slowest(size: int) -> None:
    """The plans of the admin's posts pages at the largest size, for whatever is not flat."""
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client()
    from django.contrib.auth import get_user_model

    client.force_login(get_user_model().objects.get(username="soak-admin"))
    for name, url in admin_pages():
        with CaptureQueriesContext(connection) as queries:
            client.get(url)
        slowest = max(queries.captured_queries, key=lambda q: float(q["time"]))
        print(
            f"\n=== {name} at {size:,}: slowest query {float(slowest['time']) * 1000:.1f} ms\n{slowest['sql']}"
        )
        if slowest["sql"].lstrip().upper().startswith("SELECT") and float(slowest["time"]) > 0.01:
            for (line,) in sql("EXPLAIN (ANALYZE, BUFFERS) " + slowest["sql"]):
                print("  " + line)


# Sustained ----------------------------------------------------------------------------------


def produce(args: argparse.Namespace) -> None:
    """The producer process: --rate posts a second for --seconds, progress in --progress."""
    from django.db import transaction

    from django_connector_outbox import Outbox

    outbox = Outbox(BENCH_SOURCE)
    progress = Path(args.progress)
    started = time.monotonic()
    queued = status = 0
    end = started + args.seconds
    while (now := time.monotonic()) < end:
        # At most half a second's posts per round, so that the progress stays current when
        # the producer falls behind (it then reports the rate it achieved).
        wanted = min(int(args.rate * (now - started)) - queued - status, args.rate // 2)
        if wanted > 0:
            n_status = int((queued + status + wanted) * args.status_share) - status
            n_status = max(0, min(n_status, wanted))
            first = queued + status
            seqs = range(first, first + wanted)
            # Each call its own transaction: one transaction over calls into several containers
            # can deadlock with a sender's finish (bench/README.md, interleave --mixed-transactions).
            messages = [message(seq) for seq in seqs[n_status:]]
            for chunk in range(0, len(messages), 1000):
                with transaction.atomic():
                    outbox.queue_many(messages[chunk : chunk + 1000])
            for seq in seqs[:n_status]:
                c = conversation(seq)
                with transaction.atomic():
                    outbox.set_status(
                        f"status-{c}",
                        workspace_id=f"W{c % 100}",
                        container_id=f"C{c}",
                        body={"text": f"at {seq}"},
                    )
            queued += len(messages)
            status += n_status
            tmp = progress.with_suffix(".tmp")
            tmp.write_text(json.dumps({"queued": queued, "status": status}))
            os.replace(tmp, progress)
        time.sleep(0.1)


def conversation(seq: int) -> int:
    """CONVERSATIONS at a time, each POSTS_PER_CONVERSATION posts, then the next ones."""
    return seq % CONVERSATIONS + CONVERSATIONS * (seq // (CONVERSATIONS * POSTS_PER_CONVERSATION))


def message(seq: int) -> dict[str, Any]:
    c = conversation(seq)
    return dict(
        post_id=f"m{seq}", workspace_id=f"W{c % 100}", container_id=f"C{c}", body={"text": f"post {seq}"}
    )


SAMPLE = f"""
SELECT (SELECT count(*) FROM {POST} WHERE kind <> 'status'), (SELECT count(*) FROM {POST} WHERE kind = 'status'),
       (SELECT count(*) FROM {LANE}), (SELECT count(*) FROM {GATE}), (SELECT count(*) FROM {ATTEMPT}),
       (SELECT count(*) FROM {POST} WHERE state = 'queued'),
       pg_total_relation_size('{POST}'), pg_total_relation_size('{LANE}'),
       pg_total_relation_size('{GATE}'), pg_total_relation_size('{ATTEMPT}'),
       (SELECT coalesce(sum(sent), 0) FROM django_connector_outbox_heartbeat)
"""


def sustain_mode(args: argparse.Namespace) -> None:
    database_url = args.database_url or f"{SERVER}/soak_sustain"
    create_database(database_url, fresh=True)
    overrides: dict[str, Any] = {"RETENTION": args.retention}
    from django_connector_outbox.conf import DEFAULTS

    if "STATUS_RETENTION" in DEFAULTS:
        overrides["STATUS_RETENTION"] = args.retention
    os.environ["BENCH_OUTBOX"] = json.dumps(overrides)
    sys.path.insert(0, str(ROOT / "bench"))
    from common import reset_tables, setup

    setup(database_url)
    reset_tables()
    env = dict(os.environ, BENCH_DATABASE_URL=database_url, DJANGO_SETTINGS_MODULE="bench.settings",
               PYTHONPATH=str(ROOT))  # fmt: skip
    senders = [
        subprocess.Popen(
            [sys.executable, "-m", "django", "run_outbox", "--source", BENCH_SOURCE, "-v", "0"],
            env=env,
            cwd=ROOT,
        )  # fmt: skip
        for _ in range(args.senders)
    ]
    progress = Path(f"/tmp/soak-progress-{os.getpid()}.json")
    producer = subprocess.Popen(
        [sys.executable, __file__, "--produce", "--rate", str(args.rate), "--seconds", str(args.sustain),
         "--status-share", str(args.status_share), "--progress", str(progress), "--database-url", database_url],
        env=env, cwd=ROOT,
    )  # fmt: skip
    print(
        f"database {database_url}; {args.senders} run_outbox senders (defaults), 1 producer at {args.rate:,}/s "
        f"({args.status_share:.0%} set_status), {CONVERSATIONS:,} conversations at a time, "
        f"{POSTS_PER_CONVERSATION} posts each; CONNECTOR_OUTBOX overrides {overrides}; "
        f"vacuum after each sample: {'yes' if args.vacuum else 'no'}; load average {load()}\n"
    )
    print(
        f"{'t s':>5} {'posts':>9} {'status':>7} {'lanes':>8} {'gates':>6} {'attempts':>8} {'backlog':>8} "
        f"{'posts MB':>9} {'lanes MB':>8} {'gates MB':>8} {'att MB':>6} {'queued/s':>8} {'drained/s':>9} "
        f"{'vacuum s':>8}  load",
        flush=True,
    )
    samples: list[tuple[float, tuple[Any, ...]]] = []
    started = time.monotonic()
    last_t, last_in, last_out = 0.0, 0, 0
    vacuum_s = 0.0
    try:
        while producer.poll() is None or time.monotonic() - started < args.sustain:
            time.sleep(max(0.0, args.every - (time.monotonic() - started - last_t)))
            if any(s.poll() is not None for s in senders):
                raise SystemExit("a sender exited")
            t = time.monotonic() - started
            row = tuple(int(value) for value in sql(SAMPLE)[0])
            made = json.loads(progress.read_text()) if progress.exists() else {"queued": 0, "status": 0}
            into = made["queued"] + made["status"]
            print(
                f"{t:>5.0f} {row[0]:>9,} {row[1]:>7,} {row[2]:>8,} {row[3]:>6,} {row[4]:>8,} {row[5]:>8,} "
                f"{row[6] / 2**20:>9.1f} {row[7] / 2**20:>8.1f} {row[8] / 2**20:>8.2f} {row[9] / 2**20:>6.2f} "
                f"{(into - last_in) / (t - last_t):>8,.0f} {(row[10] - last_out) / (t - last_t):>9,.0f} "
                f"{vacuum_s:>8.1f}  {load()}",
                flush=True,
            )
            samples.append((t, row))
            last_t, last_in, last_out = t, into, row[10]
            if args.vacuum:
                vacuum_started = time.monotonic()
                for table in (POST, LANE, GATE, ATTEMPT):
                    sql(f"VACUUM ANALYZE {table}")
                vacuum_s = time.monotonic() - vacuum_started
            if t >= args.sustain:
                break
        made = json.loads(progress.read_text())
        print(
            f"\nqueued {made['queued']:,} posts and {made['status']:,} set_status calls in {args.sustain} s"
        )
        band(samples, args)
    finally:
        for process in [producer, *senders]:
            if process.poll() is None:
                process.terminate()
        for process in [producer, *senders]:
            process.wait()
        progress.unlink(missing_ok=True)
        if not args.keep:
            drop_database(database_url)


def band(samples: list[tuple[float, tuple[Any, ...]]], args: argparse.Namespace) -> None:
    """Whether each count stopped growing after warm-up (see the module)."""
    warm = [row for t, row in samples if t >= args.warm_up]
    if len(warm) < 4:
        print(f"too few samples after the warm-up of {args.warm_up} s to judge")
        return
    half = len(warm) // 2
    for i, name in [(0, "posts (not status)"), (1, "status posts"), (2, "lanes"), (3, "gates"), (4, "attempts"),
                    (6, "posts table bytes"), (7, "lanes table bytes")]:  # fmt: skip
        first, second = max(r[i] for r in warm[:half]), max(r[i] for r in warm[half:])
        low, high = min(r[i] for r in warm), max(r[i] for r in warm)
        steady = second <= 1.2 * first or high < 100
        print(
            f"{name:<20} after warm-up {low:>12,}-{high:>12,}; peak of 1st half {first:>12,}, 2nd half {second:>12,}: "
            f"{'steady' if steady else 'GROWING'}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--database-url", help=f"default {SERVER}/soak (sizes), {SERVER}/soak_sustain (sustained)"
    )
    parser.add_argument(
        "--sizes", default="10000,1000000,10000000", help="post rows, comma-separated, growing"
    )
    parser.add_argument("--runs", type=int, default=5, help="runs per measurement, the median is printed (5)")
    parser.add_argument("--keep", action="store_true", help="keep the database (default: drop it)")
    parser.add_argument("--reuse", action="store_true", help="grow a kept database instead of starting empty")
    parser.add_argument(
        "--explain", action="store_true", help="EXPLAIN the admin pages' slowest query at the top"
    )
    parser.add_argument("--sustain", type=int, help="sustained mode: seconds")
    parser.add_argument("--rate", type=int, default=2000, help="posts queued a second (2,000)")
    parser.add_argument("--senders", type=int, default=2, help="run_outbox processes (2)")
    parser.add_argument(
        "--retention", type=int, default=60, help="RETENTION (and STATUS_RETENTION), seconds (60)"
    )
    parser.add_argument("--status-share", type=float, default=0.05, help="share of set_status calls (0.05)")
    parser.add_argument("--every", type=float, default=60, help="seconds between samples (60)")
    parser.add_argument("--warm-up", type=float, default=600, help="seconds before the band is judged (600)")
    parser.add_argument("--vacuum", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--produce", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--progress", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.produce:
        sys.path.insert(0, str(ROOT / "bench"))
        from common import setup

        setup(args.database_url)
        produce(args)
    elif args.sustain:
        sustain_mode(args)
    else:
        sizes_mode(args)


if __name__ == "__main__":
    main()
