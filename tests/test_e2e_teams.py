"""End to end: four `run_outbox` processes on PostgreSQL against a fake Teams (Azure AD and the
Bot Connector) that enforces the documented limits (per bot per thread 7/1 s, 8/2 s, 60/30 s,
1800/3600 s; 50 a second per tenant) with the connector's default pace.

Posts in three channels and a personal chat of one tenant (its installation in the database),
a status edited twice (the app's tokens revoked before the edits: renewed once each, no
attempt spent), two scripted 429s and a lost reply. Teams has no lookup for a bot, so the post
whose reply was lost ends `uncertain` (never sent twice) and its conversation goes on after it.
Every other post is posted exactly once, in queue order per conversation. With ``-s`` it prints
one summary line.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

import pytest
from django.db import connection, transaction
from django.test import override_settings

from django_connector_outbox import Outbox
from django_connector_outbox.fakes import teams as ft
from django_connector_outbox.fakes.base import Limit
from django_connector_outbox.installations.teams import TeamsInstallations
from django_connector_outbox.models import Post
from tests.proof_connectors import Senders

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

TENANT = ft.TENANT
CHANNELS = tuple(f"19:channel{n}000000000000000000000@thread.tacv2" for n in range(3))
PERSONAL = "a:1personal-chat"
PER_CONVERSATION = 6
# A reply slower than `timeout` would be a lost reply, and with no lookup an `uncertain` post:
# room enough that a loaded machine does not make more than the one scripted.
OUTBOX = {"LEASE": 6, "POLL_INTERVAL": 0.2, "RETRY_JITTER": 0}
WAIT = 90.0


def most_in_any(times: Iterable[float], seconds: float) -> int:
    """The most writes within any `seconds` (a sliding window, as the fake counts)."""
    times = sorted(times)
    return max((sum(1 for t in times[i:] if t < start + seconds) for i, start in enumerate(times)), default=0)


def test_four_senders_deliver_to_teams_once_each_in_order_within_its_limits(senders):
    if connection.vendor != "postgresql":
        pytest.skip("the end-to-end run is on PostgreSQL")
    with ft.running(
        conversations=(*CHANNELS, PERSONAL), thread_limits=ft.THREAD_LIMITS, tenant_limit=Limit(50, 1.0)
    ) as fake:
        TeamsInstallations("teams").save(TENANT, service_url=fake.service_url, team_name="Contoso")
        fake.script("create", ft.drop())  # the first create's reply is lost
        fake.script("create", ft.ratelimit(1), times=2)
        settings: dict[str, Any] = {
            "CONNECTORS": {
                "teams": {
                    "BACKEND": "django_connector_outbox.connectors.teams.TeamsConnector",
                    "OPTIONS": {
                        "app_id": ft.APP_ID,
                        "app_password": ft.APP_PASSWORD,
                        "login_url": fake.login_url,
                        "timeout": 2.0,
                    },
                }
            },
            **OUTBOX,
        }
        with override_settings(CONNECTOR_OUTBOX=settings):
            run(fake, settings, senders)


def run(fake: ft.FakeTeams, settings: dict[str, Any], senders: Senders) -> None:
    outbox = Outbox("teams")
    conversations = (*CHANNELS, PERSONAL)
    with transaction.atomic():
        for conversation in conversations:
            for n in range(PER_CONVERSATION):
                place = {"workspace_id": TENANT, "container_id": conversation}
                outbox.queue(f"{conversation}-{n}", **place, body={"text": f"post {conversation}-{n}"})
        outbox.set_status("status", workspace_id=TENANT, container_id=CHANNELS[0], body={"text": "v1"})
    started = time.monotonic()
    senders.start_many(4, settings, "--concurrency", "2")
    senders.wait_until_finished("the first batch", timeout=WAIT)
    tokens_before = len(fake.calls_of("token"))
    for text in ("v2", "v3"):
        fake.expire_tokens()  # each sender's token is refused once: renewed within the send
        outbox.set_status("status", workspace_id=TENANT, container_id=CHANNELS[0], body={"text": text})
        senders.wait_until_finished(f"the edit to {text}", timeout=WAIT)
    elapsed = time.monotonic() - started
    senders.stop_all()

    states = Counter(Post.objects.filter(source="teams").values_list("state", flat=True))
    [lost] = Post.objects.filter(source="teams", state="uncertain")
    assert "only Microsoft Graph can" in lost.last_error
    assert states == {"posted": len(conversations) * PER_CONVERSATION + 1 - 1, "uncertain": 1}

    copies: Counter[str] = Counter()
    for conversation in conversations:
        texts = [a.text for a in fake.activities(conversation) if a.text.startswith("post ")]
        copies.update(texts)
        assert texts == [f"post {conversation}-{n}" for n in range(PER_CONVERSATION)], texts  # in order
        writes = fake.accepted_times(conversation)
        assert most_in_any(writes, 1.0) <= 7 and most_in_any(writes, 2.0) <= 8, conversation
    duplicates = sum(n - 1 for n in copies.values())
    assert duplicates == 0
    [status] = [a for a in fake.activities(CHANNELS[0]) if not a.text.startswith("post ")]
    assert (status.text, status.edits) == ("v3", 2)
    edits = sum(1 for c in fake.calls_of("update") if c.authorized)
    assert edits == 2
    renewals = len(fake.calls_of("token")) - tokens_before
    assert 1 <= renewals <= 2 * 4  # at most one per sender and edit
    assert fake.statuses[429] >= 2
    print(
        f"\nteams e2e: {states['posted']} posted, {fake.statuses[429]} 429s "
        f"({dict(fake.limited)} enforced), 1 lost reply -> {states['uncertain']} uncertain, "
        f"{edits} edits ({renewals} token renewals after revocation), {duplicates} duplicates, "
        f"4 senders, {elapsed:.1f}s"
    )
