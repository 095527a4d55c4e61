"""End to end: one Slack source serving three workspaces through their installations, with four
`run_outbox` processes against the fake Slack (which serves many teams, django_connector_outbox/fakes/slack_teams.py).

Three workspaces, two channels each, posts to all of them in two waves. Workspace A's token is
a rotating one that comes due between the waves (the refresh point is a quarter of its lifetime
before it expires); workspace B's app is uninstalled between the waves; workspace C keeps its
token throughout. What must hold:

- every post of a live workspace is delivered once, in its channel's queue order, with a token
  of its own team (the fake refuses another team's and records it);
- exactly one refresh of A's token (four senders, one row lock), and no call made with an
  expired token after the refresh was saved (the fake records those too);
- B's second-wave posts fail with a reason naming B and saying to install the app again, its
  installation is revoked, and the other workspaces go on;
- no token, refresh token or client secret in any row or in the senders' logs.

Run with ``-s`` to see the summary line (posts, workspaces, refreshes, revocations, tokens used
per team).
"""

from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from django_connector_outbox import Outbox
from django_connector_outbox.fakes import slack as fs
from django_connector_outbox.fakes.slack_teams import CLIENT_ID, CLIENT_SECRET, EXPIRES_IN
from django_connector_outbox.installations import Installations
from django_connector_outbox.installations.store import REFRESH_TOKEN, TOKEN
from django_connector_outbox.models import Installation, Post
from tests.proof_connectors import Senders

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SOURCE = "slack-app"
SENDERS = 4
PER_CHANNEL = 5  # posts per channel per wave
# A's first token lives this long at the fake; the senders refresh it a quarter of that before.
LIFETIME = 16
TIMEOUT = 0.5
TA, TB, TC = "T0E2EAAAA1", "T0E2EBBBB2", "T0E2ECCCC3"
CHANNELS = {
    TA: ("C0E2EA0001", "C0E2EA0002"),
    TB: ("C0E2EB0001", "C0E2EB0002"),
    TC: ("C0E2EC0001", "C0E2EC0002"),
}


def config(base_url: str) -> dict[str, Any]:
    options = {
        "installations": True,
        "client_id": CLIENT_ID,
        "client_secret": CLIENT_SECRET,
        "base_url": base_url,
        "timeout": TIMEOUT,
    }
    return {
        # No pacing: the fake has no rate limits, and the waves should not take a second a post.
        "CONNECTORS": {
            SOURCE: {
                "BACKEND": "django_connector_outbox.connectors.slack.SlackConnector",
                "OPTIONS": options,
                "PACE": {},
            }
        },
        # LEASE above E009's worst delivery (a lookup and a send, each renewing its token).
        "LEASE": 10,
        "POLL_INTERVAL": 0.2,
        "RETRY_JITTER": 0,
    }


def save(answer: dict[str, Any], team: str) -> None:
    now = timezone.now()
    lifetime = answer.get("expires_in")
    Installations(SOURCE).save(
        team,
        secrets={TOKEN: answer["access_token"], REFRESH_TOKEN: answer.get("refresh_token", "")},
        token_issued_at=now,
        token_expires_at=None if lifetime is None else now + timedelta(seconds=lifetime),
        bot_user_id=answer["bot_user_id"],
    )


def queue_wave(outbox: Outbox, wave: int) -> list[str]:
    ids = []
    with transaction.atomic():
        for i in range(PER_CHANNEL):
            for team, channels in CHANNELS.items():
                for channel in channels:
                    post_id = f"w{wave}-{channel}-{i:02d}"
                    outbox.queue(post_id, workspace_id=team, container_id=channel, body={"text": post_id})
                    ids.append(post_id)
    return ids


def post_ids(fake: fs.FakeSlack, channel: str) -> list[str]:
    return [m.metadata["event_payload"]["post_id"] for m in fake.messages(channel) if m.metadata]


def test_three_workspaces_four_senders_one_expiry_one_uninstall(senders: Senders) -> None:
    with fs.running(channels=()) as fake:
        a = fake.add_team(TA, rotation=True, expires_in=LIFETIME, channels=CHANNELS[TA])
        b = fake.add_team(TB, channels=CHANNELS[TB])
        c = fake.add_team(TC, rotation=True, channels=CHANNELS[TC])  # 12 hours: never due here
        assert a and b and c
        with fake._lock:  # A's refreshed token lives Slack's 12 hours: one expiry in this run
            fake.accounts.teams[TA].expires_in = EXPIRES_IN
        for answer, team in ((a, TA), (b, TB), (c, TC)):
            save(answer, team)
        due_at = time.monotonic() + LIFETIME * 3 / 4
        settings = config(fake.base_url)
        with override_settings(CONNECTOR_OUTBOX=settings):
            run(fake, settings, senders, due_at, secrets=_secrets(a, b, c))


def _secrets(*answers: dict[str, Any]) -> set[str]:
    return {CLIENT_SECRET} | {a[k] for a in answers for k in ("access_token", "refresh_token") if a.get(k)}


def run(
    fake: fs.FakeSlack, settings: dict[str, Any], senders: Senders, due_at: float, secrets: set[str]
) -> None:
    outbox = Outbox(SOURCE)
    started = time.monotonic()
    wave1 = queue_wave(outbox, 1)
    senders.start_many(SENDERS, settings, "--concurrency", "4", "-v", "2")
    senders.wait_until_finished("the first wave", source=SOURCE, post_ids=wave1)
    assert fake.refreshes[TA] == 0, (
        "A's token was refreshed before it came due: the senders started too slowly"
    )

    # Between the waves: B's app is uninstalled (its tokens answer token_revoked), and A's
    # token comes due. Waiting for a time is the event here: nothing else makes a token due.
    fake.uninstall(TB)
    time.sleep(max(0.0, due_at - time.monotonic()))
    wave2 = queue_wave(outbox, 2)
    senders.wait_until_finished("the second wave", source=SOURCE, post_ids=wave2)
    senders.stop_all()

    # Every post of a live workspace once, in order, with its own team's token.
    for team, channels in CHANNELS.items():
        for channel in channels:
            queued = [p for p in wave1 + wave2 if f"-{channel}-" in p]
            expected = queued if team != TB else [p for p in queued if p.startswith("w1-")]
            assert post_ids(fake, channel) == expected, f"{channel}: not each post once in queue order"
    assert fake.wrong_team_calls == []
    delivered = Post.objects.filter(source=SOURCE, state="posted")
    assert delivered.count() == len(wave1) + len(wave2) - PER_CHANNEL * 2
    # B's second wave: failed, with the reason; revoked once.
    failed = list(
        Post.objects.filter(source=SOURCE)
        .exclude(state="posted")
        .values_list("post_id", "state", "last_error")
    )
    assert {p for p, _, _ in failed} == {p for p in wave2 if any(f"-{ch}-" in p for ch in CHANNELS[TB])}
    for post_id, state, reason in failed:
        assert state == "failed", (post_id, state, reason)
        assert f"workspace {TB}" in reason and reason.endswith("install the app again"), reason
    # ... so they are what waits for B's installation (the admin's "posts waiting").
    waiting = Post.objects.filter(source=SOURCE, workspace_id=TB).waiting_for_installation()
    assert set(waiting.values_list("post_id", flat=True)) == {p for p, _, _ in failed}
    revoked = Installation.objects.filter(source=SOURCE, revoked_at__isnull=False)
    assert [i.workspace_id for i in revoked] == [TB]
    calls_after_uninstall = [
        call for call in fake.state()["calls"] if call["method"] == "chat.postMessage" and call["team"] == TB
    ][PER_CHANNEL * 2 :]
    # One refresh for the one expiry, and no expired token used once it was saved.
    assert dict(fake.refreshes) == {TA: 1}
    assert fake.expired_token_calls == []
    used = fake.tokens_used("chat.postMessage")
    assert used == {TA: {f"{TA}/1", f"{TA}/2"}, TB: {f"{TB}/1"}, TC: {f"{TC}/1"}}
    # Secrets: the refreshed token too.
    secrets |= {
        Installations(SOURCE).credentials(TA).token,
        Installations(SOURCE).credentials(TA).refresh_token,
    }
    stored = json.dumps(list(Post.objects.values_list("body", "last_error", "message_ref")))
    stored += json.dumps(list(Installation.objects.values("extra", "revoked_reason", "refresh_error")))
    logs = "\n".join(line for sender in senders.started for line in sender.lines)
    assert not [s for s in secrets if s in stored or s in logs]

    print(
        f"\ne2e installations: posts={len(wave1) + len(wave2)} (delivered {delivered.count()}, "
        f"failed {len(failed)}) workspaces={len(CHANNELS)} senders={SENDERS} "
        f"refreshes={dict(fake.refreshes)} revocations={revoked.count()} "
        f"tokens used per team={ {team: sorted(ids) for team, ids in sorted(used.items())} } "
        f"calls with B's revoked token={len(calls_after_uninstall)} "
        f"stale-token calls={len(fake.stale_token_calls)} expired-token calls={len(fake.expired_token_calls)} "
        f"seconds={time.monotonic() - started:.1f}"
    )
