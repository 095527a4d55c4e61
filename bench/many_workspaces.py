"""Many workspaces (issue 28): one Slack app installed in W workspaces (1,000), one channel each,
every answer of the fake Slack 100 ms late, Slack's default pace; how close `run_outbox` comes
to the pace's own ceiling.

The fake Slack (django_connector_outbox/fakes/slack.py) runs in a thread of this process with W
teams, each with its installation saved through `Installations` (so every send reads its own
workspace's token, as a SaaS's would) and `latency` 0.1 s on every answer. M posts (10) per
channel are queued with `queue_many`, then P long-running `run_outbox` processes (1) drain them
with the Slack connector's defaults: the pace of one post a second per channel, no other.

Paced at one a second, the m-th post of every channel is claimed no sooner than m - 1 seconds
after its first: the pace's ceiling is W posts/s, and the best drain spans M - 1 seconds at the
platform, from the first post the fake accepted to the last. The figure is that best span over
the measured one (the fraction of the ceiling reached; target at least 90%), beside posts/s
over the span. (The first sends of a sender are slower, a session to open and tokens to read,
so with a small M the figure can pass 100% by a few points: the second post of a channel is
paced from its first's claim, not from its arrival.) The fake enforces Slack's own limit of a channel
(one a second, short bursts allowed: a bucket of 2, as bench/rate_limits.py has it), and its
records are checked: no 429, every post held once, each sent with its own workspace's token,
each channel's posts in queue order.

    .venv/bin/python bench/many_workspaces.py                        # W=1000, M=10, P=1, 0.1 s
    .venv/bin/python bench/many_workspaces.py -w 200 -m 5 --latency 0.3 -p 2
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from common import DEFAULT_URL, reset_tables, setup
from rate_limits import queue, sources, start_senders, stop, wait_until_posted

SOURCE = "workspaces"
BACKEND = "django_connector_outbox.connectors.slack.SlackConnector"


def places(workspaces: int) -> list[tuple[str, str]]:
    """(team, channel) of each workspace: Slack's ids are upper-case letters and digits."""
    return [(f"TW{i:07d}", f"CW{i:07d}") for i in range(workspaces)]


def install_all(fake: Any, teams: list[tuple[str, str]]) -> None:
    """Each team added to the fake with its channel, the app installed there, and the answer of
    oauth.v2.access saved as that workspace's installation (as the "Add to Slack" view does)."""
    from django.utils import timezone

    from django_connector_outbox.installations import Installations
    from django_connector_outbox.installations.store import TOKEN

    installations = Installations(SOURCE)
    for team, channel in teams:
        answer = fake.add_team(team, name=f"Workspace {team}", channels=(channel,))
        installations.save(
            team,
            secrets={TOKEN: answer["access_token"]},
            token_issued_at=timezone.now(),
            bot_user_id=answer["bot_user_id"],
        )


def span_at_the_fake(fake: Any) -> float:
    """Seconds from the first post the fake accepted to the last."""
    times = fake.accepted_times(route="chat.postMessage")
    return times[-1] - times[0]


def check_fake(fake: Any, queued: list[dict[str, Any]]) -> list[str]:
    """What the fake's records say went wrong: a 429, posts missing or doubled, a call with
    another team's token, a channel out of order. Empty when all is well."""
    problems = []
    if fake.statuses[429]:
        problems.append(f"{fake.statuses[429]} answers 429 (a channel's limit)")
    by_channel: dict[str, list[str]] = {}
    for post in queued:
        by_channel.setdefault(post["container_id"], []).append(post["body"]["text"])
    held = {channel: [m.text for m in fake.messages(channel)] for channel in by_channel}
    if sorted(t for texts in held.values() for t in texts) != sorted(p["body"]["text"] for p in queued):
        problems.append(
            f"{sum(map(len, held.values()))} posts held for {len(queued)} queued (missing or doubled)"
        )
    if fake.wrong_team_calls:
        problems.append(f"{len(fake.wrong_team_calls)} calls with another workspace's token")
    disorder = sum(held[channel] != texts for channel, texts in by_channel.items())
    if disorder:
        problems.append(f"{disorder} channels with posts out of queue order")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", default=DEFAULT_URL)
    parser.add_argument(
        "-w", "--workspaces", type=int, default=1000, help="workspaces, one channel each (1000)"
    )
    parser.add_argument("-m", "--per-channel", type=int, default=10, help="posts per channel (10)")
    parser.add_argument("-p", "--senders", type=int, default=1, help="run_outbox processes (1)")
    parser.add_argument(
        "--latency", type=float, default=0.1, help="seconds each answer of the fake takes (0.1)"
    )
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    if args.per_channel < 2:
        parser.error("-m must be at least 2: the pace spaces a channel's posts")
    setup(args.database_url)
    from django_connector_outbox.fakes.base import Limit
    from django_connector_outbox.fakes.slack import FakeSlack

    fake = FakeSlack(channels=(), channel_limit=Limit(2, 2.0))
    fake.latency = args.latency
    fake.start()
    teams = places(args.workspaces)
    configured = {"BACKEND": BACKEND, "OPTIONS": fake.installations_options()}
    try:
        reset_tables()
        with sources({SOURCE: configured}):
            install_all(fake, teams)
            queued = [
                dict(
                    post_id=f"{channel}-{i:03d}",
                    workspace_id=team,
                    container_id=channel,
                    body={"text": f"{channel} post {i}"},
                )
                for i in range(args.per_channel)
                for team, channel in teams
            ]
            queue(SOURCE, queued)
        started = time.monotonic()
        senders = start_senders(SOURCE, {SOURCE: configured}, args.senders)
        try:
            wait_until_posted(SOURCE, len(queued), senders, args.timeout)
        finally:
            stop(senders)
        wall = time.monotonic() - started
        span, count = span_at_the_fake(fake), len(queued)
        problems = check_fake(fake, queued)
    finally:
        fake.stop()
    best = args.per_channel - 1.0
    load = os.getloadavg()[0]
    print(
        f"many workspaces: W={args.workspaces} x 1 channel, M={args.per_channel}, P={args.senders}, "
        f"answers {args.latency:g} s late, load {load:.2f} at the end"
    )
    print(
        f"  {count:,} posts in {span:.2f} s from first to last ({(count - args.workspaces) / span:,.0f}/s after the first round; "
        f"{wall:.1f} s with the senders' start); the pace's ceiling {args.workspaces:,}/s, "
        f"its best span {best:g} s"
    )
    reached = best / span
    print(f"  {reached:.1%} of the pace's ceiling: {'met' if reached >= 0.9 else 'missed'} (target 90%)")
    print("  the fake's records: " + ("no 429, every post once, in order, with its own token"
                                      if not problems else "FAILED: " + "; ".join(problems)))  # fmt: skip
    reset_tables()
    if problems:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
