"""What bench/throughput.py compares run_outbox with, in the same run on the same database.

- The ordered bare loop (the issue's "limit"): N jobs over K containers in one table; each of
  P processes claims up to 100 heads of distinct containers (a container's oldest unfinished
  job, claimed only while it is queued, not running) with one
  `UPDATE ... FOR UPDATE SKIP LOCKED` and commits, then marks them done with one UPDATE and
  commits. One job in flight per container, in queue order (checked afterwards), like the
  outbox; no lease, no fencing, no attempts: the least work an ordered queue can do per job.
- The unordered bare loop: the same without the head rule (any 100 queued jobs).
- pgqueuer (when installed): N jobs enqueued, drained by P `QueueManager`s on asyncpg, batch
  100, with an entrypoint that does nothing (or sleeps the send latency); unordered, unfenced.

Each is timed by the wall clock, from the moment its P processes, started and connected, are
released together, to the moment the last of them has exited with the queue empty.
"""

from __future__ import annotations

import asyncio
import importlib.util
import time
from collections.abc import Callable
from multiprocessing import get_context
from typing import Any

import psycopg
from common import machine_cpu_seconds

TABLE = "bench_jobs"
CLAIM_SIZE = 100
PGQUEUER_ENTRYPOINT = "bench"

CONTAINERS = "bench_containers"
ORDERED_INDEXES = (f"CREATE INDEX ON {TABLE} (container, id) WHERE state IN ('queued', 'running')",)
UNORDERED_INDEXES = (f"CREATE INDEX ON {TABLE} (state)",)

# Each container's head is its first job (by id) still queued or running; it is claimed when it
# is queued. Two claimers cannot both take a container: the second skips the head the first
# has locked, and then sees it queued (its snapshot) or running (after the commit), never done,
# so never takes the job after it. The containers table is only read (it lists them, so that
# finding a head is one index probe per container, whatever the depth).
ORDERED_CLAIM = f"""
UPDATE {TABLE} SET state = 'running' WHERE id IN (
    SELECT j.id FROM {TABLE} j
    WHERE j.state = 'queued' AND j.id IN (
        SELECT head.id FROM {CONTAINERS} c CROSS JOIN LATERAL (
            SELECT id, state FROM {TABLE}
            WHERE container = c.id AND state IN ('queued', 'running') ORDER BY id LIMIT 1) head
        WHERE head.state = 'queued')
    LIMIT {CLAIM_SIZE}
    FOR UPDATE OF j SKIP LOCKED)
RETURNING id
"""
UNORDERED_CLAIM = f"""
UPDATE {TABLE} SET state = 'running' WHERE id IN (
    SELECT id FROM {TABLE} WHERE state = 'queued' LIMIT {CLAIM_SIZE} FOR UPDATE SKIP LOCKED)
RETURNING id
"""
FINISH = f"UPDATE {TABLE} SET state = 'done', done_at = clock_timestamp() WHERE id = ANY(%s)"
OUT_OF_ORDER = f"""
SELECT count(*) FROM (
    SELECT done_at, lag(done_at) OVER (PARTITION BY container ORDER BY id) AS before FROM {TABLE}) t
WHERE before > done_at
"""


def released_together(
    target: Callable[..., None], args: tuple[Any, ...], processes: int, cpu: list[float] | None = None
) -> float:
    """Seconds from releasing `processes` runs of target(*args, barrier) to the last one's exit;
    the machine's busy CPU seconds over the same span appended to `cpu`, if given."""
    ctx = get_context("spawn")
    barrier = ctx.Barrier(processes + 1)
    workers = [ctx.Process(target=target, args=(*args, barrier)) for _ in range(processes)]
    for worker in workers:
        worker.start()
    barrier.wait()
    began, busy = time.perf_counter(), machine_cpu_seconds()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - began
    if cpu is not None:
        cpu.append(machine_cpu_seconds() - busy)
    if any(worker.exitcode for worker in workers):
        raise SystemExit(f"a worker of {target.__name__} failed")
    return elapsed


# The bare loops -------------------------------------------------------------------------


def fill_jobs(database_url: str, n: int, k: int, indexes: tuple[str, ...]) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {TABLE}, {CONTAINERS}")
        conn.execute(f"CREATE TABLE {CONTAINERS} AS SELECT c AS id FROM generate_series(0, %s - 1) c", [k])
        conn.execute(f"ALTER TABLE {CONTAINERS} ADD PRIMARY KEY (id)")
        conn.execute(
            f"""CREATE TABLE {TABLE} (id bigserial PRIMARY KEY, container int NOT NULL,
                state text NOT NULL, done_at timestamptz, payload jsonb)"""
        )
        for index in indexes:
            conn.execute(index)
        conn.execute(
            f"""INSERT INTO {TABLE} (container, state, payload)
                SELECT i %% %s, 'queued', jsonb_build_object('i', i) FROM generate_series(0, %s - 1) i""",
            [k, n],
        )
        conn.execute(f"ANALYZE {TABLE}")
        conn.execute(f"ANALYZE {CONTAINERS}")


def bare_worker(database_url: str, claim: str, barrier: Any) -> None:
    with psycopg.connect(database_url) as conn:
        barrier.wait()
        while True:
            with conn.transaction():
                ids = [row[0] for row in conn.execute(claim)]
            if not ids:
                return
            with conn.transaction():
                conn.execute(FINISH, [ids])


def bare_loop(database_url: str, n: int, k: int, processes: int, *, ordered: bool) -> float:
    """Jobs per second of the ordered (or the unordered) bare loop; checks that all are done."""
    indexes, claim = (ORDERED_INDEXES, ORDERED_CLAIM) if ordered else (UNORDERED_INDEXES, UNORDERED_CLAIM)
    fill_jobs(database_url, n, k, indexes)
    seconds = released_together(bare_worker, (database_url, claim), processes)
    with psycopg.connect(database_url, autocommit=True) as conn:
        (done,) = conn.execute(f"SELECT count(*) FROM {TABLE} WHERE state = 'done'").fetchone()  # type: ignore[misc]
        (out_of_order,) = conn.execute(OUT_OF_ORDER).fetchone()  # type: ignore[misc]
        conn.execute(f"DROP TABLE {TABLE}, {CONTAINERS}")
    if done != n or (ordered and out_of_order):
        raise SystemExit(f"bare loop FAILED: {done}/{n} done, {out_of_order} out of container order")
    return n / seconds


# pgqueuer -------------------------------------------------------------------------------


def pgqueuer_installed() -> bool:
    return all(importlib.util.find_spec(name) for name in ("pgqueuer", "asyncpg"))


async def pgqueuer_fill(database_url: str, n: int) -> None:
    """A fresh pgqueuer schema (its own tables, beside the outbox's) holding n jobs."""
    import asyncpg
    from pgqueuer import Queries

    connection = await asyncpg.connect(database_url)
    queries = Queries.from_asyncpg_connection(connection)
    if await queries.schema_is_installed():
        await queries.uninstall()
    await queries.install()
    for first in range(0, n, 1000):
        size = min(1000, n - first)
        await queries.enqueue([PGQUEUER_ENTRYPOINT] * size, [None] * size, [0] * size)
    await connection.close()


async def pgqueuer_drain(database_url: str, send_latency: float, barrier: Any) -> None:
    import asyncpg
    from pgqueuer import Queries, QueueManager
    from pgqueuer.models import Job
    from pgqueuer.types import QueueExecutionMode

    connection = await asyncpg.connect(database_url)
    manager = QueueManager(Queries.from_asyncpg_connection(connection))

    @manager.entrypoint(PGQUEUER_ENTRYPOINT)
    async def deliver(job: Job) -> None:
        if send_latency:
            await asyncio.sleep(send_latency)

    await asyncio.to_thread(barrier.wait)
    await manager.run(batch_size=CLAIM_SIZE, mode=QueueExecutionMode.drain)
    await connection.close()


def pgqueuer_worker(database_url: str, send_latency: float, barrier: Any) -> None:
    asyncio.run(pgqueuer_drain(database_url, send_latency, barrier))


async def pgqueuer_left_and_uninstall(database_url: str) -> int:
    import asyncpg
    from pgqueuer import Queries

    connection = await asyncpg.connect(database_url)
    queries = Queries.from_asyncpg_connection(connection)
    left = sum(row.count for row in await queries.queue_size())
    await queries.uninstall()
    await connection.close()
    return left


def pgqueuer(
    database_url: str, n: int, processes: int, send_latency: float, cpu: list[float] | None = None
) -> float:
    """Jobs per second of pgqueuer with `processes` workers; checks that the queue is empty.
    The machine's busy CPU seconds per job appended to `cpu`, if given."""
    asyncio.run(pgqueuer_fill(database_url, n))
    spent: list[float] = []
    seconds = released_together(pgqueuer_worker, (database_url, send_latency), processes, spent)
    if cpu is not None:
        cpu.append(spent[0] / n)
    left = asyncio.run(pgqueuer_left_and_uninstall(database_url))
    if left:
        raise SystemExit(f"pgqueuer FAILED: {left} jobs left")
    return n / seconds
