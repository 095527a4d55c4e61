"""Drain speed of `run_outbox` on PostgreSQL, against what the machine allows, in one run.

For each case (N posts over K containers, P senders) the program measures, one after the
other on the same database (bench/baselines.py says how the comparisons work and are timed):

1. the ordered bare loop, one job in flight per container, claim 100: the limit;
2. the unordered bare loop (any 100 queued jobs);
3. pgqueuer with P workers (asyncpg, batch 100), when it is installed;
4. run_outbox: N posts queued with `queue_many`, then P long-running `run_outbox` processes
   (with --once: P `run_outbox --once`) through a connector that delivers nowhere
   (bench/connectors.py; --send-latency makes it sleep per send). The program polls the
   table until every post is `posted`, then stops the senders with SIGTERM. Posts/s is
   (N - 1) / (last - first `updated_at` of the posts), so the senders' start-up and
   stop are left out. Then it checks that each container's posts were posted in queue
   order, and reads each sender's peak RSS when it exits.

Without --concurrency and --batch, run_outbox runs with its defaults (no flags, and
bench/settings.py sets nothing but the connector): the speed users get.

Each measurement prints one line with its ratio to the ordered bare loop of the same case;
when a case is one of issue 10's targets, a line per target follows, `met` or `missed`.

--paced (also part of --scenarios) measures a paced source where its pace never binds against
the same unpaced (issue 22): Slack's default pace, one post a second per channel, over K
channels. A backlog of several posts per channel would be held to K posts a second by the pace
itself, so the posts come in rounds: one post per channel, queued in one transaction to P
senders that wait for it, and the next round only once every channel's pace time has passed.
Unpaced ("bench") and paced through PostgreSQL's claim ("paced"), and with --paced-orm paced
through the ORM store (BENCH_STORE=orm: how paced sources claimed before; slow) take turns by
blocks of rounds, each block
with P senders of its own after a round that warms them up; posts/s is the rounds' posts over
the time they took, each from its first `updated_at` to its last.

    .venv/bin/python bench/throughput.py                  # defaults, N=20000 K=1000 P=4
    .venv/bin/python bench/throughput.py --scenarios      # the issue's targets, one case each
    .venv/bin/python bench/throughput.py --rss-check      # 200,000 posts, RSS per 50,000
    .venv/bin/python bench/throughput.py --paced          # K=1000 P=4, 10 rounds x 2 blocks
    .venv/bin/python bench/throughput.py -n 20000 -k 1000 -p 1,2,4 --concurrency 64 --batch 200
    .venv/bin/python bench/throughput.py -n 4000 -k 1000 -p 1 --send-latency 0.1 [--blocking]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from baselines import bare_loop, pgqueuer, pgqueuer_installed
from common import ROOT, drain_arguments, machine_cpu_seconds, reset_tables, setup
from connectors import SEND_LATENCY

POST_TABLE = "django_connector_outbox_post"
LANE_TABLE = "django_connector_outbox_lane"
RUN_OUTBOX = "run_outbox"
WEBHOOK = "run_outbox, webhook over HTTP"
ORDERED = "ordered bare loop (the limit)"
UNORDERED = "unordered bare loop"
PGQUEUER = "pgqueuer, asyncpg, batch 100"
RSS_EVERY = 50_000


@dataclass(frozen=True)
class Case:
    n: int
    k: int
    p: int
    send_latency: float = 0.0
    rss_every: int = 0  # print the senders' RSS every so many posts (0: never)


@dataclass
class Results:
    rates: dict[str, float] = field(default_factory=dict)  # system -> posts (jobs) per second
    cpu_ms: dict[str, float] = field(default_factory=dict)  # system -> machine CPU ms per post (job)
    peak_rss_mb: float = 0.0  # the largest of the senders' peaks
    rss_samples: list[tuple[int, float]] = field(default_factory=list)  # (posts posted, MB)
    first_last: tuple[float, float] | None = None  # seconds of the first and last 1,000 posts
    writes: dict[str, float] = field(default_factory=dict)  # what the drain wrote, per post (Activity)

    def ratio(self, system: str) -> float:
        return self.rates[system] / self.rates[ORDERED]


@dataclass(frozen=True)
class Target:
    text: str
    check: Callable[[Results], bool | None]  # None: not measured in this run


# Sending through run_outbox ---------------------------------------------------------------


# What a drain writes, from the server's counters: WAL bytes, commits of the database, and
# row updates of the post and lane tables (HOT ones apart). The senders' counters reach the
# statistics when they exit, at the latest; the polls of `watch` add a commit each.
ACTIVITY = f"""
SELECT pg_current_wal_lsn() - '0/0'::pg_lsn,
       (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()),
       (SELECT n_tup_upd FROM pg_stat_user_tables WHERE relname = '{POST_TABLE}'),
       (SELECT n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = '{POST_TABLE}'),
       (SELECT n_tup_upd FROM pg_stat_user_tables WHERE relname = '{LANE_TABLE}')
"""
ACTIVITY_NAMES = ("WAL bytes", "commits", "post updates", "post HOT updates", "lane updates")


def activity() -> list[float]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_stat_clear_snapshot()"
        )  # the counters now, not the transaction's first read
        cursor.execute(ACTIVITY)
        return [float(value) for value in cursor.fetchone()]


@dataclass
class SenderProcess:
    popen: subprocess.Popen[bytes]
    peak_rss_mb: float = 0.0

    def reap(self, block: bool) -> bool:
        """Whether it has exited (reaped here, with its peak RSS, which Popen.poll would lose)."""
        if self.popen.returncode is not None:
            return True
        pid, status, usage = os.wait4(self.popen.pid, 0 if block else os.WNOHANG)
        if not pid:
            return False
        self.popen.returncode = os.waitstatus_to_exitcode(status)
        self.peak_rss_mb = usage.ru_maxrss / 1024
        return True

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.popen.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0


def start_senders(
    case: Case, args: argparse.Namespace, source: str = "bench", store: str = "auto", **extra_env: str
) -> list[SenderProcess]:
    env = dict(
        os.environ,
        **extra_env,
        BENCH_DATABASE_URL=args.database_url,
        BENCH_STORE=store,
        DJANGO_SETTINGS_MODULE="bench.settings",
        PYTHONPATH=str(ROOT),
        **{SEND_LATENCY: str(case.send_latency)},
        BENCH_BLOCKING="1" if args.blocking else "",
    )
    command = [sys.executable, "-m", "django", RUN_OUTBOX, "--source", source, "-v", "0"]
    command += ["--once"] if args.once else []
    command += [f"--concurrency={args.concurrency}"] if args.concurrency else []
    command += [f"--batch={args.batch}"] if args.batch else []
    return [SenderProcess(subprocess.Popen(command, env=env, cwd=ROOT)) for _ in range(case.p)]


def count_posts() -> tuple[int, int]:
    """(posted, finished otherwise: failed, uncertain or cancelled)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            f"""SELECT count(*) FILTER (WHERE state = 'posted'),
                       count(*) FILTER (WHERE state IN ('failed', 'uncertain', 'cancelled'))
                FROM {POST_TABLE}"""
        )
        posted, other = cursor.fetchone()
    return posted, other


def watch(
    senders: list[SenderProcess], case: Case, args: argparse.Namespace, cpu: list[float]
) -> list[tuple[int, float]]:
    """Wait until every post is posted (or, with --once, every sender has exited); RSS samples.
    Appends to `cpu` the machine's busy CPU seconds per post from the first poll that saw a
    post posted to the last (the senders' start-up left out, as from the rate)."""
    interval = min(2.0, max(0.1, case.n / 100_000))
    deadline = time.monotonic() + args.timeout
    samples: list[tuple[int, float]] = []
    first: tuple[int, float] | None = None
    while True:
        time.sleep(interval)
        exited = [sender.reap(block=False) for sender in senders]
        posted, other = count_posts()
        busy = machine_cpu_seconds()
        if first is None and posted:
            first = (posted, busy)
        elif first is not None and posted > first[0] and (posted >= case.n or all(exited)):
            cpu.append((busy - first[1]) / (posted - first[0]))
        if case.rss_every and posted >= case.rss_every * (len(samples) + 1):
            samples.append((posted, max(sender.rss_mb() for sender in senders)))
            print(f"    {posted:>9,} posts posted: sender RSS {samples[-1][1]:5.1f} MB", flush=True)
        if other:
            raise SystemExit(f"run_outbox FAILED: {other} posts failed, uncertain or cancelled")
        done = all(exited) if args.once else posted >= case.n
        if done:
            return samples
        if any(exited) and not args.once:
            raise SystemExit("run_outbox FAILED: a sender exited before the posts were posted")
        if time.monotonic() > deadline:
            raise SystemExit(f"run_outbox FAILED: {posted}/{case.n} posted after {args.timeout} s")


def stop(senders: list[SenderProcess]) -> None:
    """SIGTERM, as an operator stops a sender; it finishes its sends in flight and exits 0."""
    for sender in senders:
        if sender.popen.returncode is None:
            sender.popen.send_signal(signal.SIGTERM)
    for sender in senders:
        sender.reap(block=True)
        if sender.popen.returncode != 0:
            raise SystemExit(f"run_outbox exited {sender.popen.returncode}")


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


def posted_times() -> list[float]:
    """The posts' `updated_at` (epoch seconds), in order."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT extract(epoch FROM updated_at) FROM {POST_TABLE} WHERE state = 'posted' ORDER BY updated_at"
        )
        return [float(row[0]) for row in cursor.fetchall()]


def check_order(n: int) -> None:
    """Every post posted, and within each container posted in queue order."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {POST_TABLE} WHERE state = 'posted'")
        (posted,) = cursor.fetchone()
        cursor.execute(
            f"""SELECT count(*) FROM (
                 SELECT updated_at, lag(updated_at) OVER (
                     PARTITION BY workspace_id, container_id ORDER BY queued_at, id) AS before
                 FROM {POST_TABLE}) t
               WHERE before > updated_at"""
        )
        (out_of_order,) = cursor.fetchone()
    if posted != n or out_of_order:
        raise SystemExit(f"FAILED: {posted}/{n} posted, {out_of_order} posted out of container order")


def run_outbox(
    case: Case, args: argparse.Namespace, results: Results, system: str = RUN_OUTBOX, **extra_env: str
) -> None:
    reset_tables()
    queue(case.n, case.k)
    before = activity()
    senders = start_senders(case, args, **extra_env)
    cpu: list[float] = []
    try:
        results.rss_samples = watch(senders, case, args, cpu)
    finally:
        stop(senders)
    after = activity()
    check_order(case.n)
    times = posted_times()
    results.rates[system] = (case.n - 1) / (times[-1] - times[0])
    if cpu:
        results.cpu_ms[system] = cpu[0] * 1000
    if system != RUN_OUTBOX:
        reset_tables()
        return
    results.writes = {
        name: (b - a) / case.n for name, a, b in zip(ACTIVITY_NAMES, before, after, strict=True)
    }
    results.peak_rss_mb = max(sender.peak_rss_mb for sender in senders)
    if case.n > 2000:
        results.first_last = (times[1000] - times[0], times[-1] - times[-1001])
    if args.timeline:
        print_timeline(times)
    reset_tables()


def print_timeline(times: list[float], width: float = 0.1) -> None:
    """Posts posted in each `width` seconds from the first (--timeline): where a drain waits."""
    bins: dict[int, int] = {}
    for at in times:
        slot = int((at - times[0]) / width)
        bins[slot] = bins.get(slot, 0) + 1
    line = " ".join(f"{bins.get(slot, 0)}" for slot in range(max(bins) + 1))
    print(f"  posted per {width:g} s: {line}")


# A paced source where its pace never binds (--paced) ------------------------------------------


@dataclass(frozen=True)
class Drain:
    """One system of the paced scenario: a source, and the store its senders claim through."""

    name: str
    source: str
    store: str = "auto"


UNPACED = Drain("unpaced (source bench)", "bench")
PACED = Drain("paced, Slack's default (source paced)", "paced")
PACED_ORM = Drain("paced, through the ORM store", "paced", store="orm")
ROUND_GAP = 1.1  # seconds from a round's start to the next one's, at least: Slack's 1 a second


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"FAILED: {what} after {timeout} s")
        time.sleep(0.02)


def scalar(sql: str, params: list[object] | None = None) -> object:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        return cursor.fetchone()[0]


def listening() -> int:
    """Sessions of this database idle in LISTEN: senders that a NOTIFY wakes at once."""
    return int(scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state = 'idle'"
        " AND query ILIKE 'LISTEN%%'"
    ))  # fmt: skip


def paces_passed(source: str) -> bool:
    """Every channel's pace time has passed: its next post is claimed at once."""
    return bool(scalar(
        f"SELECT coalesce(max(pace_tat) <= now(), true) FROM {LANE_TABLE} WHERE source = %s", [source]
    ))  # fmt: skip


def drain_round(drain: Drain, k: int, number: int) -> float:
    """Queue one post per channel, wait until all are posted; the seconds from the first to the last."""
    from django.db import transaction

    from django_connector_outbox import Outbox

    prefix = f"{drain.source}-{drain.store}-{number}-"
    wait_until(lambda: paces_passed(drain.source), "the channels' paces did not pass")
    with transaction.atomic():
        Outbox(drain.source).queue_many(
            dict(post_id=f"{prefix}{c}", workspace_id="W", container_id=f"C{c}", body={"c": c})
            for c in range(k)
        )
    posted = f"FROM {POST_TABLE} WHERE source = %s AND post_id LIKE %s AND state = 'posted'"
    wait_until(lambda: scalar(f"SELECT count(*) {posted}", [drain.source, prefix + "%"]) == k, "a round")
    return float(scalar(f"SELECT extract(epoch FROM max(updated_at) - min(updated_at)) {posted}",
                        [drain.source, prefix + "%"]))  # fmt: skip


def drain_block(drain: Drain, k: int, p: int, rounds: int, args: argparse.Namespace) -> list[float]:
    """P senders of the drain's source, a round to warm them up, then `rounds` rounds; their times."""
    listeners = listening()
    senders = start_senders(Case(k, k, p), args, drain.source, drain.store)
    times = []
    try:
        wait_until(lambda: listening() >= listeners + p, "senders not listening")
        for number in range(rounds + 1):
            started = time.monotonic()
            spent = drain_round(drain, k, number)
            if number:  # the first round warms the senders up
                times.append(spent)
            time.sleep(max(0.0, ROUND_GAP - (time.monotonic() - started)))
    finally:
        stop(senders)
    return times


def paced_scenario(args: argparse.Namespace) -> None:
    from django_connector_outbox.conf import conf

    k, p = args.k, int(args.p.split(",")[0])
    print(f"paced: K={k:,} channels, P={p}, {args.rounds} rounds of one post per channel x "
          f"{args.blocks} blocks per system; pace of source paced: {conf.pace(PACED.source)}", flush=True)  # fmt: skip
    reset_tables()
    drains = (UNPACED, PACED, PACED_ORM) if args.paced_orm else (UNPACED, PACED)
    times: dict[Drain, list[float]] = {drain: [] for drain in drains}
    for _ in range(args.blocks):
        for drain in times:
            times[drain] += drain_block(drain, k, p, args.rounds, args)
    unpaced_lanes = scalar(f"SELECT count(*) FROM {LANE_TABLE} WHERE source = 'bench' AND pace_tat IS NOT NULL")
    paced_lanes = scalar(f"SELECT count(*) FROM {LANE_TABLE} WHERE source = 'paced' AND pace_tat IS NOT NULL")
    reset_tables()
    rates = {drain: len(spans) * (k - 1) / sum(spans) for drain, spans in times.items()}
    for drain, rate in rates.items():
        spans = sorted(times[drain])
        print(f"  {drain.name:<38} {rate:9,.0f} /s  {rate / rates[UNPACED]:7.1%}   round "
              f"{spans[0] * 1000:4.0f}-{spans[-1] * 1000:4.0f} ms (median {statistics.median(spans) * 1000:.0f})")  # fmt: skip
    print(f"  channels with a pace time: paced {paced_lanes:,} of {k:,}, unpaced {unpaced_lanes:,}; "
          "the pace never bound (one post per channel per round, queued once every pace time had passed)")
    verdict = "met" if rates[PACED] >= 0.9 * rates[UNPACED] else "missed"
    print(f"  target: a paced source whose pace never binds at least 90% of the unpaced drain: {verdict}\n",
          flush=True)


# Cases, targets and the report -------------------------------------------------------------


def measure(case: Case, args: argparse.Namespace) -> Results:
    results = Results()
    url = args.database_url
    results.rates[ORDERED] = bare_loop(url, case.n, case.k, case.p, ordered=True)
    results.rates[UNORDERED] = bare_loop(url, case.n, case.k, case.p, ordered=False)
    if pgqueuer_installed():
        cpu: list[float] = []
        results.rates[PGQUEUER] = pgqueuer(url, case.n, case.p, case.send_latency, cpu)
        results.cpu_ms[PGQUEUER] = cpu[0] * 1000
    run_outbox(case, args, results)
    if args.webhook:
        over_http(case, args, results)
    return results


def over_http(case: Case, args: argparse.Namespace, results: Results) -> None:
    """run_outbox through the shipped WebhookConnector to bench/webhook_receiver.py (--webhook):
    the same drain over real HTTP connections to an asyncio server that answers as late."""
    with socket.socket() as probe:  # a free port
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    receiver = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "webhook_receiver.py"), "--port", str(port),
         "--latency", str(case.send_latency)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert receiver.stdout is not None and receiver.stdout.readline().strip() == "ready"
        webhook = {
            "BACKEND": "django_connector_outbox.connectors.webhook.WebhookConnector",
            "OPTIONS": {"url": f"http://127.0.0.1:{port}/hook"},
        }
        run_outbox(case, args, results, WEBHOOK, BENCH_SOURCES=json.dumps({"bench": webhook}))
    finally:
        receiver.send_signal(signal.SIGTERM)
        answered = receiver.communicate(timeout=30)[0].strip()
    print(f"  webhook receiver: {answered} requests")


def ahead_of_pgqueuer(results: Results) -> bool | None:
    if PGQUEUER not in results.rates:
        return None
    return results.rates[RUN_OUTBOX] > results.rates[PGQUEUER]


def cpu_within_pgqueuer(results: Results) -> bool | None:
    if PGQUEUER not in results.cpu_ms or RUN_OUTBOX not in results.cpu_ms:
        return None
    return results.cpu_ms[RUN_OUTBOX] <= results.cpu_ms[PGQUEUER]


def at_ceiling(results: Results, case: Case, share: float) -> bool:
    """At least `share` of what K containers allow when each send takes the latency."""
    return results.rates[RUN_OUTBOX] >= share * case.k / case.send_latency


def rss_flat(results: Results) -> bool | None:
    """Flat: the last sample at most 5% above the first (taken once the caches are warm)."""
    samples = [mb for _, mb in results.rss_samples]
    return samples[-1] <= samples[0] * 1.05 if len(samples) >= 2 else None


def targets(case: Case, args: argparse.Namespace) -> list[Target]:
    """Issue 10's targets that this case is the measure of (none with tuned flags or --once)."""
    if args.concurrency or args.batch or args.once:
        return []
    found: list[Target] = []
    shape = (case.k, case.p, case.send_latency)
    if shape == (1000, 4, 0):
        found.append(Target("at least 50% of the ordered bare loop", lambda r: r.ratio(RUN_OUTBOX) >= 0.5))
        found.append(Target(f"ahead of pgqueuer with {case.p} workers", ahead_of_pgqueuer))
    if shape == (1000, 1, 0) and not case.rss_every:
        found.append(Target("ahead of pgqueuer with 1 worker", ahead_of_pgqueuer))
    if case.k == 1000 and case.send_latency == 0 and not case.rss_every:
        found.append(Target("machine CPU per post at most pgqueuer's", cpu_within_pgqueuer))
    if case.k == 1000 and case.send_latency > 0 and not args.blocking:
        found.append(Target("at least 70% of the ceiling (containers / latency)", lambda r: at_ceiling(r, case, 0.7)))
        found.append(Target(f"ahead of pgqueuer with {case.p} worker(s)", ahead_of_pgqueuer))
    if shape == (1, 1, 0):
        found.append(Target("at least 1,000 posts/s", lambda r: r.rates[RUN_OUTBOX] >= 1000))
        found.append(
            Target(
                "last 1,000 posts within 1.5x the time of the first 1,000",
                lambda r: r.first_last[1] <= 1.5 * r.first_last[0] if r.first_last else None,
            )
        )
    if shape == (1000, 1, 0.1):
        found.append(Target("at least 300 posts/s", lambda r: r.rates[RUN_OUTBOX] >= 300))
    if args.webhook:
        found.append(
            Target(
                "through the webhook over HTTP at least 60% of the in-process figure",
                lambda r: r.rates[WEBHOOK] >= 0.6 * r.rates[RUN_OUTBOX],
            )
        )
    if case.rss_every:
        found.append(Target("sender peak RSS under 80 MB", lambda r: r.peak_rss_mb < 80))
        found.append(Target("sender RSS flat (last sample within 5% of the first)", rss_flat))
    return found


def report(case: Case, results: Results, args: argparse.Namespace) -> None:
    for system, rate in results.rates.items():
        extra = ""
        if system == RUN_OUTBOX:
            system = f"{RUN_OUTBOX} ({flags(args)})"
            extra = f"   sender peak RSS {results.peak_rss_mb:5.1f} MB"
        print(f"  {system:<36} {rate:9,.0f} /s  {rate / results.rates[ORDERED]:7.1%}{extra}")
    if results.writes:
        w = results.writes
        print(f"  run_outbox per post: WAL {w['WAL bytes'] / 1024:.2f} kB, {w['commits']:.3f} commits, "
              f"{w['post updates']:.2f} post row updates ({w['post HOT updates']:.2f} HOT), "
              f"{w['lane updates']:.2f} lane row updates")  # fmt: skip
    if results.cpu_ms:
        spent = ", ".join(f"{system} {ms:.3f} ms" for system, ms in results.cpu_ms.items())
        print(f"  machine CPU per post (job), while draining: {spent}")
    if results.first_last and case.k == 1:
        first, last = results.first_last
        print(f"  first 1,000 posts {first:6.2f} s, last 1,000 {last:6.2f} s: ratio {last / first:.2f}")
    if not pgqueuer_installed():
        print("  pgqueuer: not installed, skipped (pip install pgqueuer asyncpg)")
    for target in targets(case, args):
        verdict = target.check(results)
        word = "not measured" if verdict is None else "met" if verdict else "missed"
        print(f"  target: run_outbox {target.text}: {word}")
    print(flush=True)


def flags(args: argparse.Namespace) -> str:
    given = [
        f"--concurrency {args.concurrency}" if args.concurrency else "",
        f"--batch {args.batch}" if args.batch else "",
    ]
    given += ["--once"] if args.once else []
    given += ["blocking connector"] if args.blocking else []
    return " ".join(flag for flag in given if flag) or "defaults"


def run(case: Case, args: argparse.Namespace) -> None:
    latency = f", send latency {case.send_latency:g} s" if case.send_latency else ""
    print(f"N={case.n:,} K={case.k:,} P={case.p}{latency}", flush=True)
    report(case, measure(case, args), args)


def commit_ms(database_url: str) -> float:
    """Median time of a one-row autocommit INSERT: the disk flush every commit waits for."""
    import psycopg

    times = []
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS bench_commit_logged (x int)")
        for _ in range(100):
            started = time.perf_counter()
            conn.execute("INSERT INTO bench_commit_logged VALUES (1)")
            times.append(time.perf_counter() - started)
        conn.execute("DROP TABLE bench_commit_logged")
    return statistics.median(times) * 1000


def cases(args: argparse.Namespace) -> list[Case]:
    n = args.n
    chosen = []
    if args.scenarios:
        latency_n = min(n, 2_000)  # 100 ms sends: 2,000 posts take 50 s at 40 posts/s
        chosen += [
            Case(n, 1000, 4),
            Case(n, 1000, 1),
            Case(n, 1, 1),
            Case(latency_n, 1000, 1, send_latency=0.1),
        ]
    if args.rss_check:
        chosen.append(Case(200_000, 1000, 1, rss_every=RSS_EVERY))
    if not chosen and not args.paced:
        chosen = [Case(n, args.k, int(p), args.send_latency) for p in args.p.split(",")]
    return chosen


def main() -> None:
    parser = drain_arguments(__doc__)
    parser.add_argument("-p", default="4", help="sender processes, comma-separated (4)")
    parser.add_argument("--concurrency", type=int, help="run_outbox --concurrency (default: not passed)")
    parser.add_argument("--batch", type=int, help="run_outbox --batch (default: not passed)")
    parser.add_argument("--once", action="store_true", help="run_outbox --once instead of SIGTERM")
    parser.add_argument("--send-latency", type=float, default=0.0, help="seconds each send waits (0)")
    parser.add_argument("--blocking", action="store_true", help="a connector with a blocking send (threads)")
    parser.add_argument("--scenarios", action="store_true", help="one case per target of issue 10")
    parser.add_argument("--rss-check", action="store_true", help="200,000 posts, 1 sender, RSS per 50,000")
    parser.add_argument("--paced", action="store_true", help="Slack's default pace, never binding, vs unpaced")
    parser.add_argument("--rounds", type=int, default=10, help="--paced: rounds per block (10)")
    parser.add_argument("--blocks", type=int, default=2, help="--paced: blocks per system (2)")
    parser.add_argument("--paced-orm", action="store_true", help="--paced: also through the ORM store")
    parser.add_argument("--webhook", action="store_true", help="also through the shipped webhook, over HTTP")
    parser.add_argument("--timeline", action="store_true", help="print run_outbox's posts per 0.1 s")
    parser.add_argument("--timeout", type=float, default=1800, help="longest drain in seconds (1800)")
    args = parser.parse_args()
    setup(args.database_url)
    import psycopg

    print(
        # The psycopg implementation (PSYCOPG_IMPL chooses): the pure-Python one loads each value
        # through ctypes, several times the senders' CPU per post of "binary" or "c".
        f"database: {args.database_url}; psycopg {psycopg.pq.__impl__}; run_outbox {flags(args)}; load average "
        f"{os.getloadavg()[0]:.2f}; one-row commit {commit_ms(args.database_url):.2f} ms (median)\n",
        flush=True,
    )
    for case in cases(args):
        run(case, args)
    if args.paced or args.scenarios:
        paced_scenario(args)
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
