"""Queueing speed: N `queue()` calls in one transaction, and the same N posts through `queue_many()`.

Each is timed by the wall clock around one transaction (`transaction.atomic()`, its commit
included) on an emptied table: N posts over K containers, a small JSON body each, the
`queue_many()` ones in batches of --batch. Prints posts/s and issue 10's targets (`queue_many`
at least 50,000 posts/s, `queue` in a loop at least 5,000/s), met or missed. PostgreSQL by
default; another database by --database-url (mysql://..., sqlite:////path; created if missing).

    .venv/bin/python bench/enqueue.py [--database-url URL] [-n 20000] [-k 1000] [--batch 1000]
"""  # fmt: skip # the --help text: keep the usage line indented

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Iterator

from common import DEFAULT_URL, reset_tables, setup

QUEUE_TARGET = 5_000
QUEUE_MANY_TARGET = 50_000


def post(i: int, k: int) -> dict[str, object]:
    return dict(post_id=f"p{i}", workspace_id="W", container_id=f"C{i % k}", body={"text": f"post {i}"})


def batches(n: int, k: int, size: int) -> Iterator[list[dict[str, object]]]:
    for first in range(0, n, size):
        yield [post(i, k) for i in range(first, min(first + size, n))]


def time_queue(n: int, k: int) -> float:
    """Posts/s of `queue()` called N times in one transaction."""
    from django.db import transaction

    from django_connector_outbox import Outbox

    outbox = Outbox("bench")
    posts = [post(i, k) for i in range(n)]
    reset_tables()
    started = time.perf_counter()
    with transaction.atomic():
        for one in posts:
            outbox.queue(**one)  # type: ignore[arg-type]
    return n / (time.perf_counter() - started)


def time_queue_many(n: int, k: int, size: int) -> float:
    """Posts/s of `queue_many()` in batches of `size`, in one transaction."""
    from django.db import transaction

    from django_connector_outbox import Outbox

    outbox = Outbox("bench")
    posts = list(batches(n, k, size))
    reset_tables()
    started = time.perf_counter()
    with transaction.atomic():
        for batch in posts:
            outbox.queue_many(batch)
    return n / (time.perf_counter() - started)


def verdict(rate: float, target: int) -> str:
    return f"target {target:,}/s: {'met' if rate >= target else 'missed'}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("-n", type=int, default=20_000, help="posts (20000)")
    parser.add_argument("-k", type=int, default=1_000, help="containers (1000)")
    parser.add_argument("--batch", type=int, default=1_000, help="posts per queue_many() call (1000)")
    args = parser.parse_args()
    setup(args.database_url)

    single = time_queue(args.n, args.k)
    many = time_queue_many(args.n, args.k, args.batch)
    reset_tables()
    print(
        f"database: {args.database_url}  posts: {args.n}  containers: {args.k}  "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    print(f"queue() in one transaction:          {single:10,.0f} posts/s   {verdict(single, QUEUE_TARGET)}")
    print(
        f"queue_many() in batches of {args.batch:<6}:  {many:10,.0f} posts/s   "
        f"{verdict(many, QUEUE_MANY_TARGET)}"
    )


if __name__ == "__main__":
    main()
