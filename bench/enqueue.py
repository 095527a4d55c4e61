"""Queueing speed: N `queue()` calls in one transaction, and the same N posts through `queue_many()`.

Each is timed by the wall clock around one transaction (`transaction.atomic()`, its commit
included) on an emptied table: N posts over K containers, a small JSON body each, the
`queue_many()` ones in batches of --batch. Prints posts/s and issue 22's targets (`queue` in a
loop at least 2,000/s, `queue_many` at least 40,000 posts/s), met or missed. Then `queue()` with
a Message of the same text against the dict body, --rounds times each in turn (the best of
each kept, so that a noisy neighbour on a shared machine weighs less), and issue 30's target:
a Message queues within 10% of a dict body (it is rendered at send time, not here); a Message
with a title, fields and a button is shown beside it. Each line gives the CPU time
a post took in this process and, where the database server runs on this machine and its
process can be read (PostgreSQL on loopback), in the server's: on a shared machine these move
less with the load than the wall clock does. PostgreSQL by default; another database by
--database-url (mysql://..., sqlite:////path; created if missing).

    .venv/bin/python bench/enqueue.py [--database-url URL] [-n 20000] [-k 1000] [--batch 1000] [--rounds 3]
"""  # fmt: skip # the --help text: keep the usage line indented

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import NamedTuple

from common import drain_arguments, reset_tables, setup

QUEUE_TARGET = 2_000
QUEUE_MANY_TARGET = 40_000
MESSAGE_SLOWDOWN = 0.10  # issue 30: queue() with a Message within 10% of a dict body
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class Timing(NamedTuple):
    rate: float  # posts/s, by the wall clock
    client_cpu: float  # microseconds of this process's CPU a post
    server_cpu: float | None  # microseconds of the server process's CPU a post, where readable


def server_cpu() -> Callable[[], float | None]:
    """A reader of the CPU seconds used by this connection's PostgreSQL backend, from
    /proc/PID/stat (a server on this machine); it reads None elsewhere."""
    from django.db import connection

    if connection.vendor != "postgresql":
        return lambda: None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]

    def read() -> float | None:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime

    return read


def timed(n: int, run: Callable[[], None]) -> Timing:
    """Time `run` (N posts) by the wall clock and by the CPU of both ends."""
    read_server = server_cpu()
    server_before, cpu_before, started = read_server(), time.process_time(), time.perf_counter()
    run()
    elapsed, cpu, server_after = (
        time.perf_counter() - started,
        time.process_time() - cpu_before,
        read_server(),
    )
    server = (
        None if server_before is None or server_after is None else (server_after - server_before) / n * 1e6
    )
    return Timing(n / elapsed, cpu / n * 1e6, server)


def post(i: int, k: int) -> dict[str, object]:
    return dict(post_id=f"p{i}", workspace_id="W", container_id=f"C{i % k}", body={"text": f"post {i}"})


def message_post(i: int, k: int) -> dict[str, object]:
    """`post(i, k)` with its text as a Message."""
    from django_connector_outbox import Message

    return {**post(i, k), "body": Message(f"post {i}")}


def full_message_post(i: int, k: int) -> dict[str, object]:
    """A Message with every common part: Markdown text, a title, two fields, a button."""
    from django_connector_outbox import Link, Message

    body = Message(
        f"**Deploy** of `api` number {i} _finished_",
        title="Deploy finished",
        fields=[("Environment", "production"), ("Took", "3 min")],
        actions=[Link("Logs", f"https://ci.example.com/builds/{i}")],
    )
    return {**post(i, k), "body": body}


def batches(n: int, k: int, size: int) -> Iterator[list[dict[str, object]]]:
    for first in range(0, n, size):
        yield [post(i, k) for i in range(first, min(first + size, n))]


def time_queue(n: int, k: int, make: Callable[[int, int], dict[str, object]] = post) -> Timing:
    """`queue()` called N times in one transaction, with the posts `make` makes."""
    from django.db import transaction

    from django_connector_outbox import Outbox

    outbox = Outbox("bench")
    posts = [make(i, k) for i in range(n)]
    reset_tables()

    def run() -> None:
        with transaction.atomic():
            for one in posts:
                outbox.queue(**one)  # type: ignore[arg-type]

    return timed(n, run)


def time_queue_many(n: int, k: int, size: int) -> Timing:
    """`queue_many()` in batches of `size`, in one transaction."""
    from django.db import transaction

    from django_connector_outbox import Outbox

    outbox = Outbox("bench")
    posts = list(batches(n, k, size))
    reset_tables()

    def run() -> None:
        with transaction.atomic():
            for batch in posts:
                outbox.queue_many(batch)

    return timed(n, run)


def verdict(rate: float, target: int) -> str:
    return f"target {target:,}/s: {'met' if rate >= target else 'missed'}"


def best_of(
    rounds: int, n: int, k: int, makers: list[Callable[[int, int], dict[str, object]]]
) -> list[Timing]:
    """For each maker, its fastest of `rounds` runs of `time_queue`; the makers take turns."""
    runs: list[list[Timing]] = [[] for _ in makers]
    for _ in range(rounds):
        for timings, make in zip(runs, makers, strict=True):
            timings.append(time_queue(n, k, make))
    return [max(timings, key=lambda t: t.rate) for timings in runs]


def line(name: str, timing: Timing, judged: str) -> str:
    server = "" if timing.server_cpu is None else f", server {timing.server_cpu:,.0f} us"
    return f"{name}  {timing.rate:10,.0f} posts/s   {judged}   CPU a post: client {timing.client_cpu:,.0f} us{server}"


def main() -> None:
    parser = drain_arguments(__doc__)
    parser.add_argument("--batch", type=int, default=1_000, help="posts per queue_many() call (1000)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each body kind, the best kept (3)")
    args = parser.parse_args()
    setup(args.database_url)

    single = time_queue(args.n, args.k)
    many = time_queue_many(args.n, args.k, args.batch)
    dict_body, message, full = best_of(args.rounds, args.n, args.k, [post, message_post, full_message_post])
    reset_tables()
    print(
        f"database: {args.database_url}  posts: {args.n}  containers: {args.k}  "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    print(line("queue() in one transaction:        ", single, verdict(single.rate, QUEUE_TARGET)))
    print(line(f"queue_many() in batches of {args.batch:<6}:", many, verdict(many.rate, QUEUE_MANY_TARGET)))
    print(f"queue() by body, the best of {args.rounds} runs each:")
    slower = dict_body.rate / message.rate - 1  # the extra time a post takes
    cpu = message.client_cpu / dict_body.client_cpu - 1
    judged = (
        f"{slower:+.1%} time ({cpu:+.1%} CPU): {'met' if slower <= MESSAGE_SLOWDOWN else 'missed'} (<= +10%)"
    )
    print(line("  a dict body {'text': ...}        ", dict_body, "(the reference)"))
    print(line("  a Message of the same text       ", message, judged))
    print(line("  a Message, title, fields, button ", full, f"{dict_body.rate / full.rate - 1:+.1%} time"))


if __name__ == "__main__":
    main()
