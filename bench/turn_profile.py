"""Where a sender's database time goes, statement by statement, against the ordered bare loop's.

One process, no threads and no sends: N no-op posts over K containers drained by the
PostgreSQL store's statements as a sender's turn issues them (PostgresStore.finish_and_claim,
each a round trip of its own here, so that each is timed): LOCK_LANES_OF_POSTS and FINISH
for the last turn's claims, CLAIM for the next `--batch`, and the commit, which runs the deferred
foreign-key checks of the lanes whose head moved. Then the ordered bare loop of
bench/baselines.py in the same process, its claim, finish and two commits timed alike. Each
time is the client's (a loopback round trip included), in microseconds per post (job), and
the WAL each writes per post.

What it shows is the server's share of bench/throughput.py's gap: with no Python around the
statements, the outbox's database work per post against the bare loop's whole loop per job.

    .venv/bin/python bench/turn_profile.py                 # N=20000 K=1000, batch 64
    .venv/bin/python bench/turn_profile.py --batch 100
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import timedelta

import psycopg
from baselines import CONTAINERS, FINISH, ORDERED_CLAIM, ORDERED_INDEXES, TABLE, fill_jobs
from common import drain_arguments, reset_tables, setup
from sender_profile import queue


def wal(cursor) -> int:  # type: ignore[no-untyped-def]
    cursor.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")
    return int(cursor.fetchone()[0])


class Timer:
    """Client time and WAL bytes per step, summed over the drain."""

    def __init__(self, cursor) -> None:  # type: ignore[no-untyped-def]
        self.cursor = cursor
        self.seconds: Counter[str] = Counter()
        self.wal: Counter[str] = Counter()

    def step(self, name: str, run) -> object:  # type: ignore[no-untyped-def]
        before = wal(self.cursor)
        started = time.perf_counter()
        result = run()
        self.seconds[name] += time.perf_counter() - started
        self.wal[name] += wal(self.cursor) - before
        return result

    def print(self, title: str, n: int) -> None:
        total = sum(self.seconds.values())
        print(
            f"{title}: {total * 1e6 / n:,.1f} µs per post, {sum(self.wal.values()) / n:,.0f} WAL bytes per post"
        )
        for name, seconds in self.seconds.items():
            print(f"  {name:<28} {seconds * 1e6 / n:8.1f} µs   {self.wal[name] / n:7.0f} WAL bytes")


def outbox_drain(n: int, k: int, batch: int) -> Timer:
    from django.db import connection, transaction
    from django.utils import timezone

    from django_connector_outbox.posts import Action, Finish
    from django_connector_outbox.store import postgres

    reset_tables()
    queue(n, k)
    store = postgres.PostgresStore("bench", "default")
    with connection.cursor() as django_cursor:
        timer = Timer(django_cursor)
        claims: list = []
        turn = drained = 0
        while True:
            atomic = transaction.atomic()
            atomic.__enter__()
            now = timezone.now()
            if claims:
                finishes = [Finish(c.post_id, c.lease_token, Action.POSTED, message_ref="m", claimed_rev=c.rev)
                            for c in claims]  # fmt: skip
                with postgres.cursor("default") as lock, postgres.cursor("default") as finish:
                    timer.step(
                        "LOCK_LANES_OF_POSTS, FINISH",
                        lambda f=finishes, at=now: (
                            store._lock_and_finish(lock, finish, f, at),
                            finish.fetchall(),
                        ),
                    )
            turn += 1
            claims = timer.step(
                "CLAIM",
                lambda at=now, t=f"t{turn}": store.claim(batch, at, at + timedelta(minutes=5), t, "w"),
            )  # type: ignore[assignment]
            drained += len(claims)
            timer.step("commit", lambda a=atomic: a.__exit__(None, None, None))
            if not claims:
                break
    assert drained == n, f"{drained}/{n} drained"
    return timer


def bare_drain(database_url: str, n: int, k: int) -> Timer:
    fill_jobs(database_url, n, k, ORDERED_INDEXES)
    with psycopg.connect(database_url) as conn, conn.cursor() as cursor:
        timer = Timer(cursor)
        while True:
            ids = timer.step("claim", lambda: [row[0] for row in cursor.execute(ORDERED_CLAIM)])
            timer.step("commit of the claim", conn.commit)
            if not ids:
                break
            timer.step("finish", lambda done=ids: cursor.execute(FINISH, [done]))
            timer.step("commit of the finish", conn.commit)
        conn.commit()
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE {TABLE}, {CONTAINERS}")
    return timer


def main() -> None:
    parser = drain_arguments(__doc__)
    parser.add_argument(
        "--batch", type=int, default=64, help="claims per turn (64: the sender's default room)"
    )
    args = parser.parse_args()
    setup(args.database_url)
    print(f"N={args.n:,} K={args.k:,}, {args.batch} claims a turn, one process, each statement timed alone\n")
    outbox_drain(args.n, args.k, args.batch).print("the outbox's statements", args.n)
    reset_tables()
    print()
    bare_drain(args.database_url, args.n, args.k).print(
        "the ordered bare loop (claim 100, its commits inside)", args.n
    )


if __name__ == "__main__":
    main()
