"""The posts table partitioned by time, against the table as it is: docs/scaling.md's figures.

    .venv/bin/python bench/partitioned.py [--database-url postgres://postgres@127.0.0.1:5432/soak]
                                          [--rows 1000000] [--repeat 200]

Runs in a database that bench/soak.py filled and kept (`soak.py --sizes ... --keep`): it copies
the posts with ids up to --rows, and every queued one, into two new tables, side by side with
the soak's lanes:

- `soak_post_plain`: the posts table as it is (the model's indexes, a primary key on id, the
  unique (source, post_id));
- `soak_post_part`: PARTITION BY RANGE (queued_at), one partition a day over the rows' days
  and a default one; the primary key (id, queued_at) and the unique (source, post_id,
  queued_at), since a unique index of a partitioned table must hold its partition key; the
  model's other indexes on every partition.

Then, each --repeat times (prepared statements, median ms), the claim's two reads of posts:

- the heads of 100 due lanes by id (the CLAIM's join): on the plain table; on the partitioned
  one by id alone (every partition probed per lane); and with `queued_at >= lane.floor_queued_at`
  added (the floor bounds the head from below: the partitions before it are pruned at run time);
- the next head from a lane's floor (FINISH's seek), with `queued_at >= floor` added so that
  the partitions before the floor are pruned;

with the EXPLAIN (ANALYZE, BUFFERS) of each; then the WAL per post of inserting 1,000 posts and
of finishing 100 (posted: state, updated_at, body), and pruning the oldest day: DELETE from the
plain table (and the VACUUM that it leaves to do) against DETACH PARTITION + DROP TABLE, each
timed with its WAL (a statement's own from EXPLAIN (ANALYZE, WAL) where it can be explained,
else the server's LSN, which counts every session's writes). The copies are dropped at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

POST = "django_connector_outbox_post"
LANE = "django_connector_outbox_lane"
PLAIN = "soak_post_plain"
PART = "soak_post_part"
INDEXES = {  # the model's indexes (models.Post.Meta), by name suffix
    "order": "(lane_id, state, queued_at, id)",
    "state": "(state, updated_at)",
    "queue": "(source, state, queued_at)",
    "turn": "(source, turn_key)",
    "updated": "(updated_at, id)",
}

HEADS = """
SELECT post.id, post.post_id, post.body, post.state FROM (
    SELECT id, head_id, floor_queued_at FROM {lane} WHERE source = 'memory' AND due_at <= now()
    ORDER BY due_at, head_id LIMIT 100) lane
JOIN {post} post ON post.id = lane.head_id {extra}
"""
NEXT_HEAD = """
SELECT queued_at, id FROM {post}
WHERE lane_id = %(lane)s AND state = 'queued' AND (queued_at, id) >= (%(floor_at)s, %(floor_id)s) {extra}
ORDER BY queued_at, id LIMIT 1
"""


def run(conn: Any, statement: str, params: Any = None) -> list[tuple[Any, ...]]:
    cursor = conn.execute(statement, params)
    return cursor.fetchall() if cursor.description else []


def wal(conn: Any) -> int:
    return int(run(conn, "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")[0][0])


def wal_of(conn: Any, statement: str) -> int:
    """The WAL bytes that `statement` itself wrote (EXPLAIN (ANALYZE, WAL): this statement's
    alone, where the server's LSN would count every session's writes on a shared machine)."""
    plan = run(conn, "EXPLAIN (ANALYZE, WAL, FORMAT JSON) " + statement)[0][0]
    return int(plan[0]["Plan"]["WAL Bytes"])


def build(conn: Any, rows: int) -> list[tuple[str, str]]:
    """The two copies; the partitions' (name, first day)."""
    run(conn, f"DROP TABLE IF EXISTS {PLAIN}, {PART} CASCADE")
    wanted = f"SELECT * FROM {POST} WHERE id <= {rows} OR state = 'queued'"
    started = time.perf_counter()
    run(conn, f"CREATE TABLE {PLAIN} (LIKE {POST} INCLUDING DEFAULTS)")
    run(conn, f"INSERT INTO {PLAIN} {wanted}")
    run(conn, f"ALTER TABLE {PLAIN} ADD PRIMARY KEY (id), ADD UNIQUE (source, post_id)")
    for name, columns in INDEXES.items():
        run(conn, f"CREATE INDEX {PLAIN}_{name} ON {PLAIN} {columns}")
    plain_s = time.perf_counter() - started
    days = [
        row[0]
        for row in run(conn, f"SELECT DISTINCT date_trunc('day', queued_at)::date FROM {PLAIN} ORDER BY 1")
    ]
    started = time.perf_counter()
    run(conn, f"CREATE TABLE {PART} (LIKE {POST} INCLUDING DEFAULTS) PARTITION BY RANGE (queued_at)")
    partitions = []
    for day in days:
        name = f"{PART}_{day:%Y%m%d}"
        run(conn, f"CREATE TABLE {name} PARTITION OF {PART} FOR VALUES FROM ('{day}') TO ('{day}'::date + 1)")
        partitions.append((name, str(day)))
    run(conn, f"CREATE TABLE {PART}_default PARTITION OF {PART} DEFAULT")
    run(conn, f"INSERT INTO {PART} {wanted}")
    run(conn, f"ALTER TABLE {PART} ADD PRIMARY KEY (id, queued_at), ADD UNIQUE (source, post_id, queued_at)")
    for name, columns in INDEXES.items():
        run(conn, f"CREATE INDEX {PART}_{name} ON {PART} {columns}")
    part_s = time.perf_counter() - started
    for table in (PLAIN, PART, LANE):
        run(conn, f"VACUUM ANALYZE {table}")
    count = run(conn, f"SELECT count(*) FROM {PLAIN}")[0][0]
    print(
        f"copied {count:,} posts: plain table {plain_s:.1f} s, partitioned {part_s:.1f} s "
        f"({len(days)} daily partitions and a default one)"
    )
    for table in (PLAIN, PART):
        size = run(
            conn,
            f"""SELECT sum(pg_table_size(relid)), sum(pg_indexes_size(relid))
                FROM (SELECT relid FROM pg_partition_tree('{table}') UNION SELECT '{table}'::regclass) AS t""",
        )[0]
        print(f"  {table}: table {size[0] / 2**20:,.0f} MB, indexes {size[1] / 2**20:,.0f} MB")
    return partitions


def timed(conn: Any, statement: str, params: Any, repeat: int) -> float:
    times = []
    for _ in range(10 + repeat):
        started = time.perf_counter()
        conn.execute(statement, params, prepare=True).fetchall()
        times.append(time.perf_counter() - started)
    return statistics.median(times[10:]) * 1000


def explain(conn: Any, statement: str, params: Any) -> str:
    return "\n".join(
        row[0] for row in run(conn, "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + statement, params)
    )


def reads(conn: Any, repeat: int) -> None:
    lane = run(
        conn,
        f"""SELECT l.id, l.floor_queued_at, l.floor_id FROM {LANE} l
            WHERE l.head_id IS NOT NULL ORDER BY l.due_at LIMIT 1""",
    )[0]
    params = {"lane": lane[0], "floor_at": lane[1], "floor_id": lane[2]}
    floor = "AND post.queued_at >= lane.floor_queued_at"
    cases = [
        ("heads of 100 lanes by id, plain", HEADS.format(lane=LANE, post=PLAIN, extra=""), None),
        ("heads of 100 lanes by id, partitioned", HEADS.format(lane=LANE, post=PART, extra=""), None),
        ("heads by id and the floor, partitioned", HEADS.format(lane=LANE, post=PART, extra=floor), None),
        ("next head from the floor, plain", NEXT_HEAD.format(post=PLAIN, extra=""), params),
        ("next head from the floor, partitioned",
            NEXT_HEAD.format(post=PART, extra="AND queued_at >= %(floor_at)s"), params),
    ]  # fmt: skip
    print(f"\nmedian of {repeat} runs (prepared), ms; load average {os.getloadavg()[0]:.2f}")
    for name, statement, p in cases:
        print(f"  {name:<44} {timed(conn, statement, p, repeat):8.3f}")
    for name, statement, p in cases:
        print(f"\n=== {name}\n{statement.strip()}\n{explain(conn, statement, p)}")


def writes(conn: Any) -> None:
    """WAL per post of a queue of 1,000 and a finish of 100, on each table (EXPLAIN's WAL)."""
    print()
    for table in (PLAIN, PART):
        inserted = wal_of(
            conn,
            f"""INSERT INTO {table} (id, source, post_id, lane_id, workspace_id, container_id, thread_id, kind,
                    body, rev, state, attempts, queued_at, next_at, created_at, updated_at, last_error)
                SELECT (SELECT max(id) FROM {table}) + g, 'memory', 'wal-' || g, 1, 'W1', 'C1', '', 'message',
                       jsonb_build_object('text', 'post ' || g), 0, 'queued', 0, now(), now(), now(), now(), ''
                FROM generate_series(1, 1000) AS g""",
        )
        finished = wal_of(
            conn,
            f"""UPDATE {table} SET state = 'posted', updated_at = now(), body = NULL, delivered_attempt = 1
                WHERE source = 'memory' AND post_id IN (SELECT 'wal-' || g FROM generate_series(1, 100) AS g)""",
        )
        print(
            f"WAL per post, {table}: queue (1,000 in one INSERT) {inserted / 1000:,.0f} B, "
            f"finish (100 in one UPDATE) {finished / 100:,.0f} B"
        )


def prune(conn: Any, partitions: list[tuple[str, str]]) -> None:
    """The oldest day of posts away: DELETE (then VACUUM) against DETACH + DROP."""
    name, day = partitions[0]
    rows = run(conn, f"SELECT count(*) FROM {name}")[0][0]
    print(f"\npruning the oldest day ({day}, {rows:,} posts):")
    started = time.perf_counter()
    deleted = wal_of(conn, f"DELETE FROM {PLAIN} WHERE queued_at < '{day}'::date + 1")
    print(
        f"  {'DELETE FROM ' + PLAIN:<40} {time.perf_counter() - started:8.2f} s   WAL {deleted / 2**20:8.1f} MB"
        " (the statement's, EXPLAIN (ANALYZE, WAL))"
    )
    for what, statements in [
        (f"VACUUM {PLAIN} (after the DELETE)", [f"VACUUM {PLAIN}"]),
        (
            "DETACH PARTITION + DROP TABLE",
            [f"ALTER TABLE {PART} DETACH PARTITION {name}", f"DROP TABLE {name}"],
        ),
    ]:
        before, started = wal(conn), time.perf_counter()
        for statement in statements:
            run(conn, statement)
        print(
            f"  {what:<40} {time.perf_counter() - started:8.2f} s   WAL {(wal(conn) - before) / 2**20:8.1f} MB"
            " (the server's: every session's)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/soak")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    import psycopg

    with psycopg.connect(args.database_url, autocommit=True) as conn:
        print(
            f"{run(conn, 'SELECT version()')[0][0].split(' on ')[0]}; load average {os.getloadavg()[0]:.2f}"
        )
        try:
            partitions = build(conn, args.rows)
            reads(conn, args.repeat)
            writes(conn)
            prune(conn, partitions)
        finally:
            run(conn, f"DROP TABLE IF EXISTS {PLAIN}, {PART} CASCADE")


if __name__ == "__main__":
    main()
