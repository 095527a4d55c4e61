"""Rate limits (issue 11): real `run_outbox` senders against fake Slack and Discord servers
that enforce the platforms' limits, and whether the database's pacing keeps them inside.

Each scenario starts a fake platform of django_connector_outbox/fakes/ in a thread of this process (on
127.0.0.1), configures a source against it (its CONNECTORS entry, with its PACE, reaches the
senders as BENCH_SOURCES: bench/settings.py), empties the tables, queues the posts with
`Outbox.queue_many`, starts P long-running `run_outbox --source NAME` processes, polls the
table until every post is finished, and stops the senders with SIGTERM. The figures come from
the fake's own records: its log of accepted writes with their times, the HTTP statuses it
answered (every 429), the limit that refused each request; and from the posts' `updated_at`.

- slack: a burst of N posts (600) into K channels (10) of one workspace; the fake allows
  1 message/s per channel with a burst of 2 (`Limit(2, 2)`) and a workspace limit below the sum
  of the channels' (8/s); PACE `{"container": (1, 1.0), "workspace": (7, 0.875)}` (Slack's
  default container pace, and the fake's workspace rate with a burst one below its: see
  "Pacing" in the README). Measures the drain time (first to last accepted post) against the
  best possible at the fake's rates, and 429s as a % of sends. Targets: within 10% of the
  best time, at most 1% 429s.
- discord: N posts (1,000) into 1,000 channels; the fake's global limit 50/s (and 5 per 5 s
  per channel route); the Discord connector's default pace (47.6/s for the source). Measures
  requests/s over the drain (all requests the fake received, over the span of its accepted
  writes) and invalid requests (401/403/429) as a % of requests. Targets: 45-50 requests/s,
  under 1% invalid.
- telegram: N posts (600) into 600 private chats, so that the bot's limit binds: the fake's
  30 per 1 s fixed windows ("not more than 30 messages per second or so", and one a second
  per chat with a burst of 2); the Telegram connector's default pace (27.8/s for the source).
  Measures accepted writes/s over the drain and 429s as a % of requests. Targets: 25-30
  accepted/s, under 1% 429s.
- mattermost: N posts (300) into K channels (20) of one team; the fake limits the bot's token
  as Mattermost's rate limiting does (a GCRA: 10/s with a burst of 100, the server's defaults;
  --mattermost-burst 10 for a stricter server); the connector's default pace (10/s for the
  source, 10 at once). Measures accepted posts/s and 429s as a % of requests. Targets: at least
  90% of the fake's rate, at most 1% 429s.
- teams: two drains against the fake's documented limits (per bot per thread 7/1 s, 8/2 s,
  60/30 s, 1800/3600 s; per tenant 50/1 s) with the Teams connector's default pace: 2N/5 posts
  (240) into 3 channels, where the thread limits bind (the pace: 4 at once, then one each
  0.6 s), then N posts (600) into N channels, where the tenant's binds (40/s). Measures each
  drain's accepted writes/s (per channel, or for the tenant), the busiest 1 s, 2 s and 30 s of
  a channel, and 429s as a % of requests. Targets: 1.5-2.0/s per channel, 35-42/s for the
  tenant, under 1% 429s.
- shared: 4 senders (P) drain 200 posts of 10 channels in 2 workspaces from a fake without
  limits, under PACE `{"container": (2, 2.0), "workspace": (4, 1.0), "source": (6, 1.0)}`.
  For each scope, the fake's accepted times of every key (a channel, a workspace, the source)
  are checked with `within_pace` (each send may arrive up to --tolerance early: the network
  and thread hand-off between claim and arrival), and the worst key is reported: how far
  ahead of its pace a write arrived, and its busiest window of the pace's length against the
  most a token bucket allows in one (2 x count - 1). Target: every key within its pace.
- off: N posts (5,000) over K channels (1,000) through the no-op connector of
  bench/throughput.py three ways, R rounds (3) taken in turn: as throughput.py runs it (no
  pace); a connector class with a default pace (Slack's) under `"PACE": {}`; and a pace on
  every scope that never binds. Each drain is timed as bench/throughput.py times run_outbox:
  (N - 1) / (last - first `updated_at`); the median of the rounds is reported. Target: pacing
  off drains as fast as the no-op bench (at least 90% of it).

    .venv/bin/python bench/rate_limits.py                          # every scenario, PostgreSQL
    .venv/bin/python bench/rate_limits.py --scenario slack --slack-posts 300
    .venv/bin/python bench/rate_limits.py --database-url mysql://root@127.0.0.1:3306/outbox_bench
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from common import DEFAULT_URL, ROOT, reset_tables, setup

# Slack's and Discord's connectors, noting each claim's time in a file (OPTIONS "claims").
SLACK_BACKEND = "bench.noting_connectors.NotingSlackConnector"
DISCORD_BACKEND = "bench.noting_connectors.NotingDiscordConnector"
TELEGRAM_BACKEND = "bench.noting_connectors.NotingTelegramConnector"
TELEGRAM_TOKEN = "123456789:bench-rate-limits"
CLAIMS_FILE = "/tmp/bench-rate-limits-claims.jsonl"
SLACK_TOKEN = "xoxb-bench-rate-limits"
DISCORD_TOKEN = "bench.rate.limits"
MATTERMOST_TOKEN = "bench-mattermost-rate-limits"
TEAMS = ("T0000000001", "T0000000002")
GUILD = "900000000000000001"
SCENARIOS = ("slack", "discord", "telegram", "mattermost", "teams", "shared", "off")
TEAMS_BACKEND = "bench.noting_connectors.NotingTeamsConnector"

Entry = dict[str, Any]  # one CONNECTORS entry
Log = list[tuple[float, str]]  # (when, channel)


# Sources, posts and senders ------------------------------------------------------------------


@contextmanager
def sources(configured: dict[str, Entry]) -> Iterator[None]:
    """This process sees `configured` next to the "bench" source (the senders get BENCH_SOURCES)."""
    from django.conf import settings
    from django.test import override_settings

    connectors = {**settings.CONNECTOR_OUTBOX["CONNECTORS"], **configured}
    with override_settings(CONNECTOR_OUTBOX={**settings.CONNECTOR_OUTBOX, "CONNECTORS": connectors}):
        yield


def entry(backend: str, options: dict[str, Any], pace: dict[str, list[float]] | None) -> Entry:
    """A CONNECTORS entry; `pace` None leaves the connector class's own."""
    config: Entry = {"BACKEND": backend, "OPTIONS": options}
    if pace is not None:
        config["PACE"] = pace
    return config


@dataclass(frozen=True)
class Place:
    workspace: str
    container: str


def posts(n: int, places: list[Place], body: str) -> list[dict[str, Any]]:
    """`n` posts spread round-robin over `places`; `body` names the text field of the platform."""
    return [
        dict(
            post_id=f"p{i:06d}",
            workspace_id=places[i % len(places)].workspace,
            container_id=places[i % len(places)].container,
            body={body: f"post {i}"},
        )
        for i in range(n)
    ]


def queue(source: str, chosen: list[dict[str, Any]]) -> None:
    from django.db import transaction

    from django_connector_outbox import Outbox

    outbox = Outbox(source)
    with transaction.atomic():
        for first in range(0, len(chosen), 1000):
            outbox.queue_many(chosen[first : first + 1000])


def start_senders(source: str, configured: dict[str, Entry], p: int) -> list[subprocess.Popen[bytes]]:
    env = dict(
        os.environ,
        DJANGO_SETTINGS_MODULE="bench.settings",
        PYTHONPATH=str(ROOT),
        BENCH_SOURCES=json.dumps(configured),
    )
    command = [sys.executable, "-m", "django", "run_outbox", "--source", source, "-v", "0"]
    return [subprocess.Popen(command, env=env, cwd=ROOT) for _ in range(p)]


def finished(source: str) -> tuple[int, int]:
    """(posted, finished otherwise: failed, uncertain or cancelled) of `source`, in one query."""
    from django.db.models import Count, Q

    from django_connector_outbox.models import Post
    from django_connector_outbox.posts import FINISHED_STATES, State

    others = [state for state in FINISHED_STATES if state != State.POSTED]
    counts = Post.objects.filter(source=source).aggregate(
        posted=Count("pk", filter=Q(state=State.POSTED)), other=Count("pk", filter=Q(state__in=others))
    )
    return counts["posted"], counts["other"]


def wait_until_posted(source: str, n: int, senders: list[subprocess.Popen[bytes]], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        time.sleep(0.2)
        posted, other = finished(source)
        if other:
            raise SystemExit(f"FAILED: {other} posts of {source} failed, uncertain or cancelled")
        if posted >= n:
            return
        if any(sender.poll() is not None for sender in senders):
            raise SystemExit("FAILED: a sender exited before the posts were posted")
        if time.monotonic() > deadline:
            raise SystemExit(f"FAILED: {posted}/{n} posts of {source} posted after {timeout:g} s")


def stop(senders: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM, as an operator stops a sender; it finishes its sends in flight and exits 0."""
    for sender in senders:
        if sender.poll() is None:
            sender.send_signal(signal.SIGTERM)
    for sender in senders:
        if sender.wait() != 0:
            raise SystemExit(f"FAILED: run_outbox exited {sender.returncode}")


@dataclass(frozen=True)
class Drained:
    rate: float  # posts/s of run_outbox, as throughput.py measures it: (N - 1) / (last - first updated_at)
    claims: Log  # (when its last claim was taken: `sent_at`, container) of each post, if noted


def drained(source: str) -> Drained:
    from django_connector_outbox.models import Post
    from django_connector_outbox.posts import State
    from tests.proof_connectors import claimed_at

    rows = Post.objects.filter(source=source, state=State.POSTED)
    finishes = sorted(at.timestamp() for at in rows.values_list("updated_at", flat=True))
    claimed = claimed_at(CLAIMS_FILE) if os.path.exists(CLAIMS_FILE) else {}
    claims = [
        (claimed[post_id].timestamp(), container)
        for post_id, container in rows.values_list("post_id", "container_id")
        if post_id in claimed
    ]
    return Drained((len(finishes) - 1) / (finishes[-1] - finishes[0]), claims)


def drain(
    source: str,
    configured: Entry,
    chosen: list[dict[str, Any]],
    args: argparse.Namespace,
    before: Callable[[], object] | None = None,
) -> Drained:
    """Queue `chosen` and drain them with P senders (after `before`: an installation to save)."""
    reset_tables()
    if before is not None:
        before()
    if os.path.exists(CLAIMS_FILE):
        os.remove(CLAIMS_FILE)
    with sources({source: configured}):
        queue(source, chosen)
    senders = start_senders(source, {source: configured}, args.senders)
    try:
        wait_until_posted(source, len(chosen), senders, args.timeout)
    finally:
        stop(senders)
    result = drained(source)
    reset_tables()
    return result


# Figures from the fakes' logs ----------------------------------------------------------------


def best_span(loads: Iterable[tuple[int, int, float]]) -> float:
    """The shortest time from the first to the last of the writes, each load being `n` writes
    through a token bucket of `count` per `seconds` (a burst of `count`, then one per interval)."""
    return max(max(n - count, 0) * seconds / count for n, count, seconds in loads)


def ahead(times: list[float], count: int, seconds: float) -> float:
    """How many seconds the earliest write came before the pace allowed it (<= 0: never):
    `within_pace(times, count, seconds, tolerance=t)` holds exactly when this is <= t."""
    interval = seconds / count
    tat, worst = -math.inf, -math.inf
    for at in sorted(times):
        worst = max(worst, tat - (seconds - interval) - at)
        tat = max(tat, at) + interval
    return worst


def busiest(times: list[float], seconds: float) -> int:
    """The most writes in any window [t, t + seconds)."""
    ordered, most, first = sorted(times), 0, 0
    for last, at in enumerate(ordered):
        while ordered[first] <= at - seconds:
            first += 1
        most = max(most, last - first + 1)
    return most


def pct(part: int, whole: int) -> str:
    return f"{part / whole:.1%}" if whole else "n/a"


def target(text: str, met: bool) -> None:
    print(f"  target: {text}: {'met' if met else 'missed'}", flush=True)


# The scenarios -------------------------------------------------------------------------------


def slack_places(channels: int, teams: tuple[str, ...] = TEAMS[:1]) -> list[Place]:
    return [Place(teams[n % len(teams)], f"C{n:010d}") for n in range(1, channels + 1)]


def slack_entry(fake: Any, pace: dict[str, list[float]] | None) -> Entry:
    return entry(
        SLACK_BACKEND, {"token": SLACK_TOKEN, "base_url": fake.base_url, "claims": CLAIMS_FILE}, pace
    )


def check_paces(
    pace: dict[str, list[float]], places: list[Place], claims: Log, accepted: Log, tolerance: float
) -> dict[str, bool]:
    """Print, for each scope of `pace`, its worst key by the claims' times (`sent_at`, the
    database's doing) and by the fake's accepted times (what the platform saw); return whether
    every key's accepted times are `within_pace` (each allowed `tolerance` early), by scope."""
    from django_connector_outbox.fakes.base import within_pace

    workspace_of = {p.container: p.workspace for p in places}
    key_of: dict[str, Callable[[str], str]] = {
        "container": lambda channel: channel,
        "workspace": lambda channel: workspace_of[channel],
        "source": lambda channel: "the source",
    }
    conforming = {}
    for scope, (count, seconds) in pace.items():
        count = int(count)
        print(f"  {scope} pace {count} per {seconds:g} s (at most {2 * count - 1} in any {seconds:g} s):")
        for name, log in (("claimed (sent_at)", claims), ("accepted by the fake", accepted)):
            by_key = grouped(log, key_of[scope])
            key = max(by_key, key=lambda k: ahead(by_key[k], count, seconds))
            print(f"    {name:<20} worst of {len(by_key)}, {key}: {max(ahead(by_key[key], count, seconds), 0):.3f} s "
                  f"ahead of its pace; busiest {seconds:g} s window {busiest(by_key[key], seconds)}")  # fmt: skip
        by_key = grouped(accepted, key_of[scope])
        conforming[scope] = all(within_pace(t, count, seconds, tolerance=tolerance) for t in by_key.values())
    return conforming


def grouped(log: Log, key_of: Callable[[str], str]) -> dict[str, list[float]]:
    """The times of a log of (time, channel), by the key of each channel."""
    by_key: dict[str, list[float]] = {}
    for at, channel in log:
        by_key.setdefault(key_of(channel), []).append(at)
    return by_key


def by_limit(limited: dict[str, int]) -> str:
    return ", ".join(f"{name} {count}" for name, count in sorted(limited.items())) or "none"


def slack(args: argparse.Namespace) -> None:
    from django_connector_outbox.fakes.base import Limit
    from django_connector_outbox.fakes.slack import FakeSlack

    n, k, rate = args.slack_posts, args.slack_channels, args.slack_workspace_rate
    places = slack_places(k)
    pace = {"container": [1, 1.0], "workspace": [rate - 1, (rate - 1) / rate]}
    print(f"slack: {n} posts into {k} channels of one workspace, {args.senders} senders; fake limits "
          f"2 per 2 s per channel, {rate} per 1 s per workspace; PACE {pace}")  # fmt: skip
    fake = FakeSlack(
        SLACK_TOKEN,
        channels=tuple(p.container for p in places),
        team_id=TEAMS[0],
        channel_limit=Limit(2, 2.0),
        workspace_limit=Limit(rate, 1.0),
    ).start()
    try:
        claims = drain("slack", slack_entry(fake, pace), posts(n, places, "text"), args).claims
        accepted = [(a.at, a.channel) for a in fake.accepted]
        sends, limited = len(fake.calls_of("chat.postMessage")), fake.statuses[429]
        limits = by_limit(fake.limited)
    finally:
        fake.stop()
    span = max(at for at, _ in accepted) - min(at for at, _ in accepted)
    best = best_span([(math.ceil(n / k), 2, 2.0), (n, rate, 1.0)])
    print(f"  drained in {span:.1f} s (first to last accepted post); best possible at the fake's rates "
          f"{best:.1f} s: {span / best:.2f}x")  # fmt: skip
    print(f"  {sends} sends: {len(accepted)} accepted, {limited} answered 429 ({pct(limited, sends)}; "
          f"by limit: {limits})")  # fmt: skip
    check_paces(pace, places, claims, accepted, args.tolerance)
    target("drained within 10% of the best possible time", span <= 1.1 * best)
    target("at most 1% of sends answered 429", limited <= 0.01 * sends)


def discord(args: argparse.Namespace) -> None:
    from django_connector_outbox.connectors.discord import DiscordConnector
    from django_connector_outbox.fakes.base import Limit
    from django_connector_outbox.fakes.discord import FakeDiscord

    n, k, rate = args.discord_posts, args.discord_channels, args.discord_global
    places = [Place(GUILD, str(100_000_000_000_000_000 + c)) for c in range(k)]
    pace = {str(scope): [count, seconds] for scope, (count, seconds) in DiscordConnector.pace.items()}
    print(f"discord: {n} posts into {k} channels, {args.senders} senders; fake limits {rate} per 1 s "
          f"global, 5 per 5 s per channel route; the connector's default pace {pace}")  # fmt: skip
    fake = FakeDiscord(
        DISCORD_TOKEN,
        channels=tuple(p.container for p in places),
        route_limit=Limit(5, 5.0),
        global_limit=Limit(rate, 1.0),
    ).start()
    try:
        options = {"token": DISCORD_TOKEN, "base_url": fake.base_url, "claims": CLAIMS_FILE}
        configured = entry(DISCORD_BACKEND, options, None)
        claims = drain("discord", configured, posts(n, places, "content"), args).claims
        accepted = [(a.at, a.channel) for a in fake.accepted]
        requests, invalid, limits = len(fake.calls), fake.invalid_requests, by_limit(fake.limited)
    finally:
        fake.stop()
    times = sorted(at for at, _ in accepted)
    span = times[-1] - times[0]
    per_second = (requests - 1) / span
    print(f"  drained in {span:.1f} s: {per_second:.1f} requests/s ({requests} requests), "
          f"{(len(times) - 1) / span:.1f} accepted/s; busiest 1 s: {busiest(times, 1.0)} accepted")  # fmt: skip
    print(f"  invalid requests (401/403/429): {invalid} ({pct(invalid, requests)}; 429s by limit: {limits})")
    check_paces(pace, places, claims, accepted, args.tolerance)
    target(f"45-50 requests/s (fake global limit {rate}/s)", 45 <= per_second <= 50)
    target("invalid requests under 1% of requests", invalid < 0.01 * requests)


def telegram(args: argparse.Namespace) -> None:
    from django_connector_outbox.connectors.telegram import TelegramConnector
    from django_connector_outbox.fakes.base import Limit
    from django_connector_outbox.fakes.telegram import FakeTelegram

    n = args.telegram_posts
    places = [Place("outbox_bot", str(1_000_000 + c)) for c in range(n)]
    pace = {str(scope): [count, seconds] for scope, (count, seconds) in TelegramConnector.pace.items()}
    print(f"telegram: {n} posts into {n} private chats, {args.senders} senders; fake limits 30 per 1 s "
          f"for the bot, 1 per 1 s (burst 2) per chat; the connector's default pace {pace}")  # fmt: skip
    fake = FakeTelegram(
        TELEGRAM_TOKEN,
        chats=tuple(p.container for p in places),
        chat_limit=Limit(2, 2.0),
        bot_limit=Limit(30, 1.0),
    ).start()
    try:
        options = {"token": TELEGRAM_TOKEN, "base_url": fake.base_url, "claims": CLAIMS_FILE}
        claims = drain("telegram", entry(TELEGRAM_BACKEND, options, None), posts(n, places, "text"), args).claims
        accepted = [(a.at, a.channel) for a in fake.accepted]
        requests, limited, limits = len(fake.calls), fake.statuses[429], by_limit(fake.limited)
    finally:
        fake.stop()
    times = sorted(at for at, _ in accepted)
    span = times[-1] - times[0]
    per_second = (len(times) - 1) / span
    print(f"  drained in {span:.1f} s: {per_second:.1f} accepted/s ({requests} requests); "
          f"busiest 1 s: {busiest(times, 1.0)} accepted")  # fmt: skip
    print(f"  429s: {limited} ({pct(limited, requests)} of requests; by limit: {limits})")
    check_paces(pace, places, claims, accepted, args.tolerance)
    target("25-30 accepted/s (fake bot limit 30/s)", 25 <= per_second <= 30)
    target("429s under 1% of requests", limited < 0.01 * requests)
def mattermost(args: argparse.Namespace) -> None:
    from django_connector_outbox.connectors.mattermost import MattermostConnector
    from django_connector_outbox.fakes.mattermost import FakeMattermost, mattermost_limit

    n, k, rate, burst = args.mattermost_posts, args.mattermost_channels, args.mattermost_rate, args.mattermost_burst
    places = [Place("team0000000000000000000001", f"channel{c:019d}") for c in range(k)]
    pace = {str(scope): [count, seconds] for scope, (count, seconds) in MattermostConnector.pace.items()}
    print(f"mattermost: {n} posts into {k} channels, {args.senders} senders; fake limit {rate}/s with a "
          f"burst of {burst} per token (Mattermost's GCRA); the connector's default pace {pace}")  # fmt: skip
    fake = FakeMattermost(
        MATTERMOST_TOKEN, channels=tuple(p.container for p in places), limit=mattermost_limit(rate, burst)
    ).start()
    try:
        options = {"url": fake.url, "token": MATTERMOST_TOKEN}
        configured = entry("django_connector_outbox.connectors.mattermost.MattermostConnector", options, None)
        drain("mattermost", configured, posts(n, places, "message"), args)
        requests, limited = len(fake.calls), fake.statuses[429]
        times = sorted(a.at for a in fake.accepted)
    finally:
        fake.stop()
    span = times[-1] - times[0]
    print(f"  drained in {span:.1f} s: {(len(times) - 1) / span:.1f} accepted/s, {(requests - 1) / span:.1f} "
          f"requests/s ({requests} requests); busiest 1 s: {busiest(times, 1.0)} accepted")  # fmt: skip
    print(f"  429s: {limited} ({pct(limited, requests)} of requests)")
    target(f"at least 90% of the fake's {rate}/s", (len(times) - 1) / span >= 0.9 * rate)
    target("at most 1% of requests answered 429", limited <= 0.01 * requests)


def teams(args: argparse.Namespace) -> None:
    from django_connector_outbox.connectors.teams import TeamsConnector
    from django_connector_outbox.fakes import teams as ft
    from django_connector_outbox.fakes.base import Limit
    from django_connector_outbox.installations.teams import TeamsInstallations

    pace = {str(scope): [count, seconds] for scope, (count, seconds) in TeamsConnector.pace.items()}
    k, n = args.teams_channels, args.teams_posts
    for label, posts_n, channels in (("threads", n * 2 // 5, k), ("tenant", n, n)):
        places = [Place(ft.TENANT, f"19:bench{c:06d}@thread.tacv2") for c in range(channels)]
        print(f"teams ({label}): {posts_n} posts into {channels} channels of one tenant, {args.senders} "
              f"senders; fake limits per thread 7/1 s, 8/2 s, 60/30 s, 1800/3600 s, per tenant 50/1 s; "
              f"the connector's default pace {pace}")  # fmt: skip
        fake = ft.FakeTeams(
            conversations=tuple(p.container for p in places),
            thread_limits=ft.THREAD_LIMITS,
            tenant_limit=Limit(50, 1.0),
        ).start()
        try:
            options = {
                "app_id": ft.APP_ID, "app_password": ft.APP_PASSWORD, "login_url": fake.login_url,
                "claims": CLAIMS_FILE,
            }  # fmt: skip
            install = lambda: TeamsInstallations("teams").save(ft.TENANT, service_url=fake.service_url)  # noqa: E731, B023
            chosen = posts(posts_n, places, "text")
            claims = drain("teams", entry(TEAMS_BACKEND, options, None), chosen, args, install).claims
            accepted = [(a.at, a.channel) for a in fake.accepted]
            requests, limited, limits = len(fake.calls_of("create")), fake.statuses[429], by_limit(fake.limited)
        finally:
            fake.stop()
        times = sorted(at for at, _ in accepted)
        span = times[-1] - times[0]
        print(f"  drained in {span:.1f} s: {(len(times) - 1) / span:.1f} accepted/s ({requests} requests)")
        print(f"  429s: {limited} ({pct(limited, requests)} of requests; by limit: {limits})")
        check_paces(pace, places, claims, accepted, args.tolerance)
        if label == "threads":
            per_channel = [sorted(at for at, c in accepted if c == p.container) for p in places]
            rate = statistics.median((len(t) - 1) / (t[-1] - t[0]) for t in per_channel)
            worst = {s: max(busiest(t, s) for t in per_channel) for s in (1.0, 2.0, 30.0)}
            print(f"  a channel: {rate:.2f} accepted/s; its busiest 1 s/2 s/30 s: "
                  f"{worst[1.0]}/{worst[2.0]}/{worst[30.0]} (limits 7/8/60)")  # fmt: skip
            target("1.5-2.0 accepted/s per channel (fake 60 per 30 s)", 1.5 <= rate <= 2.0)
        else:
            target("35-42 accepted/s (fake tenant limit 50/s)", 35 <= (len(times) - 1) / span <= 42)
        target("429s under 1% of requests", limited < 0.01 * requests)


def shared(args: argparse.Namespace) -> None:
    from django_connector_outbox.fakes.slack import FakeSlack

    n, places = args.shared_posts, slack_places(10, TEAMS)
    pace = {"container": [2, 2.0], "workspace": [4, 1.0], "source": [6, 1.0]}
    print(f"shared: {n} posts into 10 channels of 2 workspaces, {args.senders} senders; fake without "
          f"limits; PACE {pace}; tolerance {args.tolerance:g} s")  # fmt: skip
    fake = FakeSlack(SLACK_TOKEN, channels=tuple(p.container for p in places)).start()
    try:
        claims = drain("shared", slack_entry(fake, pace), posts(n, places, "text"), args).claims
        accepted = [(a.at, a.channel) for a in fake.accepted]
    finally:
        fake.stop()
    span = max(at for at, _ in accepted) - min(at for at, _ in accepted)
    best = best_span([(math.ceil(n / 10), 2, 2.0), (math.ceil(n / 2), 4, 1.0), (n, 6, 1.0)])
    print(f"  drained in {span:.1f} s (best possible at these paces {best:.1f} s); "
          f"{len(accepted)} posts accepted")  # fmt: skip
    for scope, conforming in check_paces(pace, places, claims, accepted, args.tolerance).items():
        target(f"every {scope}'s accepted writes within its pace", conforming)


def off(args: argparse.Namespace) -> None:
    n, k, rounds = args.off_posts, args.off_channels, args.off_rounds
    chosen = posts(n, slack_places(k), "text")
    # The same no-op connector three ways, so that only pacing differs: as bench/throughput.py
    # runs it (no pace anywhere); a class with a default pace (a shipped connector's) turned off
    # by PACE {}; and a pace on every scope that never binds (what pacing costs when on).
    ways = {
        "no-op bench": ("bench", {"BACKEND": "bench.connectors.NullConnector"}),
        "class pace, PACE {}": ("off", {"BACKEND": "bench.connectors.PacedNullConnector", "PACE": {}}),
        "a pace that never binds": (
            "unbound",
            {"BACKEND": "bench.connectors.NullConnector", "PACE": UNBOUND},
        ),
    }
    print(f"off: {n} posts over {k} channels, {args.senders} senders, the no-op connector three ways, "
          f"{rounds} rounds taken in turn (median posts/s)")  # fmt: skip
    rates: dict[str, list[float]] = {way: [] for way in ways}
    for _ in range(rounds):
        for way, (source, configured) in ways.items():
            rates[way].append(drain(source, configured, chosen, args).rate)
    median = {way: statistics.median(r) for way, r in rates.items()}
    noop = median["no-op bench"]
    for way, rate in median.items():
        every = ", ".join(f"{r:,.0f}" for r in rates[way])
        print(f"  {way:<24} {rate:8,.0f} posts/s  ({rate / noop:.0%} of the no-op bench; rounds: {every})")
    target(
        "pacing off drains as fast as the no-op bench (at least 90%)",
        median["class pace, PACE {}"] >= 0.9 * noop,
    )


# Every scope paced, far above what the senders can claim: the pacing code runs, never waits.
UNBOUND = {"container": [1_000, 1.0], "workspace": [1_000_000, 1.0], "source": [1_000_000, 1.0]}


RUN = {
    "slack": slack,
    "discord": discord,
    "telegram": telegram,
    "mattermost": mattermost,
    "teams": teams,
    "shared": shared,
    "off": off,
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument("--scenario", choices=(*SCENARIOS, "all"), default="all")
    parser.add_argument("--senders", type=int, default=4, help="run_outbox processes (4)")
    parser.add_argument("--slack-posts", type=int, default=600)
    parser.add_argument("--slack-channels", type=int, default=10)
    parser.add_argument("--slack-workspace-rate", type=int, default=8, help="per second (8)")
    parser.add_argument("--discord-posts", type=int, default=1000)
    parser.add_argument("--discord-channels", type=int, default=1000)
    parser.add_argument("--discord-global", type=int, default=50, help="per second (50)")
    parser.add_argument("--telegram-posts", type=int, default=600)
    parser.add_argument("--mattermost-posts", type=int, default=300)
    parser.add_argument("--mattermost-channels", type=int, default=20)
    parser.add_argument("--mattermost-rate", type=float, default=10, help="per second (10, the server's default)")
    parser.add_argument("--mattermost-burst", type=int, default=100, help="(100, the server's default)")
    parser.add_argument("--teams-posts", type=int, default=600)
    parser.add_argument("--teams-channels", type=int, default=3, help="of the thread-limit drain (3)")
    parser.add_argument("--shared-posts", type=int, default=200)
    parser.add_argument("--tolerance", type=float, default=0.1, help="seconds a write may arrive early (0.1)")
    parser.add_argument("--off-posts", type=int, default=5000)
    parser.add_argument("--off-channels", type=int, default=1000)
    parser.add_argument("--off-rounds", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=900, help="longest drain in seconds (900)")
    args = parser.parse_args()
    setup(args.database_url)
    print(f"database: {args.database_url}; load average {os.getloadavg()[0]:.2f}\n", flush=True)
    for name in SCENARIOS if args.scenario == "all" else (args.scenario,):
        RUN[name](args)
        print(flush=True)
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
