"""End to end: four `run_outbox` processes deliver through the Mattermost connector to a fake
Mattermost server (django_connector_outbox/fakes/mattermost.py) that enforces a rate limit, loses replies and
answers 429s; then the status posts are edited in place. PostgreSQL only (four senders on
SKIP LOCKED), marked slow.

The fake's pending_post_id dedupe is off (window 0), so that a post sent twice would show as
two posts: each lost reply must be recovered by the lookup, never by a second create.
Printed with -s: one summary line (posts, 429s, lost replies, edits, duplicates).
"""

from __future__ import annotations

from collections import Counter

import pytest
from django.db import connection, transaction
from django.test import override_settings

from django_connector_outbox import Outbox
from django_connector_outbox.connectors.mattermost import marker_for
from django_connector_outbox.fakes import mattermost as fm
from django_connector_outbox.models import Post

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

TOKEN = "e2e-MATTERMOST-TOKEN-6h2j9k4l"
TEAMS = ("teamoneteamoneteamoneteam1", "teamtwoteamtwoteamtwoteam2")
CHANNELS = {f"channel{n:02d}channel{n:02d}channel": TEAMS[n % 2] for n in range(6)}
MESSAGES = 120
STATUSES = 6
REPLIES = 12


def test_four_senders_deliver_each_post_once_through_429s_and_lost_replies_and_edit_statuses(senders):
    if connection.vendor != "postgresql":
        pytest.skip("four senders at once: PostgreSQL")
    # A server that allows Mattermost's default 10 requests a second but a burst of 5, below
    # the default pace's 10 at once (and lookups count too): some requests draw its 429s,
    # each holding the source.
    limit = fm.mattermost_limit(per_sec=10, burst=5)
    with fm.running(token=TOKEN, channels=tuple(CHANNELS), dedupe_window=0, limit=limit) as fake:
        roots = {channel: fake.add_post(channel, "a person's thread") for channel in CHANNELS}
        # Every 25th create is stored and its reply dropped; two more 429s are scripted.
        script = [fm.passthrough()] * 24 + [fm.drop()]
        fake.script("create_post", *script * 4, fm.ratelimit(1), *[fm.passthrough()] * 10, fm.ratelimit(1))
        config = {
            "CONNECTORS": {
                "mattermost": {
                    "BACKEND": "django_connector_outbox.connectors.mattermost.MattermostConnector",
                    "OPTIONS": {"url": fake.url, "token": TOKEN, "timeout": 0.25},
                }
            },
            "LEASE": 2,
            "POLL_INTERVAL": 0.2,
            "RETRY_JITTER": 0,
        }
        with override_settings(CONNECTOR_OUTBOX=config):
            outbox = Outbox("mattermost")
            channels = list(CHANNELS)
            with transaction.atomic():
                for n in range(MESSAGES):
                    channel = channels[n % len(channels)]
                    place = {"workspace_id": CHANNELS[channel], "container_id": channel}
                    outbox.queue(f"m{n:03d}", **place, body={"message": f"m{n:03d}"})
                    if n < REPLIES:
                        thread = {**place, "thread_id": roots[channel]}
                        outbox.queue(f"r{n:03d}", **thread, body={"message": f"r{n:03d}"})
                    if n < STATUSES:
                        outbox.set_status(f"s{n:03d}", **place, body={"message": f"s{n:03d} v0"})
            senders.start_many(4, config, "--concurrency", "4", prefix="mm-sender")
            senders.wait_until_finished("the first batch")

            # The statuses, each set twice more: one patch each, to the latest text.
            with transaction.atomic():
                for n in range(STATUSES):
                    channel = channels[n % len(channels)]
                    place = {"workspace_id": CHANNELS[channel], "container_id": channel}
                    outbox.set_status(f"s{n:03d}", **place, body={"message": f"s{n:03d} v1"})
                    outbox.set_status(f"s{n:03d}", **place, body={"message": f"s{n:03d} v2"})
            senders.wait_until_finished("the edits")
            senders.stop_all()

        rows = {p.post_id: p for p in Post.objects.filter(source="mattermost")}
        assert len(rows) == MESSAGES + REPLIES + STATUSES
        assert {p.state for p in rows.values()} == {"posted"}, [
            (p.post_id, p.state, p.last_error) for p in rows.values() if p.state != "posted"
        ]
        copies: Counter[str] = Counter()
        by_marker = {marker_for("mattermost", post_id): post_id for post_id in rows}
        for channel in CHANNELS:
            for stored in fake.posts(channel):
                if stored.user_id == fake.bot_user["id"]:
                    post_id = by_marker[stored.props["outbox_id"]]
                    copies[post_id] += 1
                    assert rows[post_id].message_ref == stored.id
                    expected = f"{post_id} v2" if post_id.startswith("s") else post_id
                    assert stored.message == expected
                    assert stored.root_id == (roots[channel] if post_id.startswith("r") else "")
        duplicates = sum(n - 1 for n in copies.values())
        assert set(copies) == set(rows) and duplicates == 0
        assert not fake._script.get("create_post"), "a scripted lost reply or 429 was not reached"
        lost = script.count(fm.drop()) * 4
        elapsed = max(a.at for a in fake.accepted) - min(a.at for a in fake.accepted)
        lookups = len(fake.calls_of("get_posts")) + len(fake.calls_of("get_thread"))
        # One patch per status, and one more for a status whose create was a lost reply: the
        # copy found may be older than the latest body (Outbox.found).
        edits = len(fake.accepted_times(route="patch_post"))
        limited = fake.statuses[429]
        assert STATUSES <= edits <= STATUSES + lost
        assert lookups >= 4 and limited >= 2
        print(
            f"\nmattermost e2e: {len(rows)} posts by 4 senders, {limited} 429s, {lost} lost replies "
            f"({lookups} lookups), {edits} edits, {duplicates} duplicates, {elapsed:.1f} s"
        )
