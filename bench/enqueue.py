"""Queueing speed: N `queue()` calls in one transaction, and the same through `queue_many()`.

    .venv/bin/python bench/enqueue.py [--database-url URL] [-n 20000] [--batch 1000]
"""  # fmt: skip # the --help text: keep the usage line indented

from __future__ import annotations

import argparse
import time

from common import DEFAULT_URL, reset_tables, setup


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

    from django.db import transaction

    from django_connector_outbox import Outbox

    outbox = Outbox("bench")

    def post(i: int) -> dict[str, object]:
        return dict(
            post_id=f"p{i}", workspace_id="W", container_id=f"C{i % args.k}", body={"text": f"post {i}"}
        )

    reset_tables()
    started = time.perf_counter()
    with transaction.atomic():
        for i in range(args.n):
            outbox.queue(**post(i))  # type: ignore[arg-type]
    single = args.n / (time.perf_counter() - started)

    reset_tables()
    started = time.perf_counter()
    with transaction.atomic():
        for first in range(0, args.n, args.batch):
            outbox.queue_many(post(i) for i in range(first, min(first + args.batch, args.n)))
    many = args.n / (time.perf_counter() - started)
    reset_tables()

    print(f"database: {args.database_url}  posts: {args.n}  containers: {args.k}")
    print(f"queue() in one transaction:          {single:10,.0f} posts/s")
    print(f"queue_many() in batches of {args.batch:<6}:  {many:10,.0f} posts/s")


if __name__ == "__main__":
    main()
