"""End to end: a real `run_outbox --once` process against a fake Discord that enforces its limits.

A global 429 (per bot) must hold the whole source: the sender's other channels wait for the
same Retry-After instead of each collecting a 429 of their own (on Discord, 10,000 invalid
requests in 10 minutes get the bot banned). And a pace keeps a container under its limit.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

from django_connector_outbox import Outbox
from django_connector_outbox.connectors.discord import DiscordConnector
from django_connector_outbox.fakes import discord as fd
from django_connector_outbox.fakes.base import Limit
from django_connector_outbox.models import Gate, Post
from tests.proof_connectors import NotesClaims, claimed_at

pytestmark = [pytest.mark.budget, pytest.mark.django_db(transaction=True)]

TOKEN = "e2e-DISCORD-TOKEN.Gx71Qz.kd93hs0"
CHANNELS = tuple(f"4100000000000000{n:02d}" for n in range(1, 6))


class ClaimsNotingDiscordConnector(NotesClaims, DiscordConnector):
    """Discord, noting when each post it is handed was claimed (`NotesClaims`)."""


def config(fake: fd.FakeDiscord, pace: dict, claims: str | None = None) -> dict:
    """The discord source against `fake`; `claims`: a file where each claim's time is noted."""
    backend = "django_connector_outbox.connectors.discord.DiscordConnector"
    options: dict[str, Any] = {"token": TOKEN, "base_url": fake.base_url, "timeout": 0.25}
    if claims is not None:
        backend = f"{__name__}.ClaimsNotingDiscordConnector"
        options["claims"] = claims
    return {
        "CONNECTORS": {"discord": {"BACKEND": backend, "OPTIONS": options, "PACE": pace}},
        "LEASE": 2.5,  # more than Discord's longest delivery (E009): 8 requests of 0.25 s
        "POLL_INTERVAL": 0.2,
    }


def test_a_global_429_holds_every_channel_of_the_bot_and_draws_no_other_429(senders):
    # One request a minute for the bot: the first post goes out, the second draws a global 429.
    with fd.running(token=TOKEN, channels=CHANNELS, global_limit=Limit(1, 60)) as fake:
        outbox_settings = config(fake, pace={})
        with override_settings(CONNECTOR_OUTBOX=outbox_settings):
            outbox = Outbox("discord")
            for n, channel in enumerate(CHANNELS):
                outbox.queue(f"p{n}", workspace_id="G1", container_id=channel, body={"content": f"p{n}"})
            sender = senders.start(outbox_settings, "--once", "--concurrency", "1")
            assert sender.wait() == 0, sender.stderr

            assert fake.limited["global"] == 1  # one 429 for the bot, not one per channel
            assert len(fake.accepted) == 1
            states = dict(Post.objects.with_claim().values_list("post_id", "current_state"))
            assert sorted(states.values()) == ["posted"] + ["queued"] * 4
            assert set(Post.objects.in_state("queued").values_list("attempts", flat=True)) == {0}
            hold = Gate.objects.get(source="discord", scope="source")
            assert hold.held_until is not None and "global" in hold.hold_reason


def test_a_container_pace_keeps_one_channel_under_its_limit(senders, tmp_path):
    with fd.running(token=TOKEN, channels=CHANNELS[:1]) as fake:
        noted = tmp_path / "claims.jsonl"
        outbox_settings = config(fake, pace={"container": (2, 1.0)}, claims=str(noted))
        with override_settings(CONNECTOR_OUTBOX=outbox_settings):
            outbox = Outbox("discord")
            for n in range(6):
                outbox.queue(f"p{n}", workspace_id="G1", container_id=CHANNELS[0], body={"content": f"p{n}"})
            sender = senders.start(outbox_settings, "--once")
            assert sender.wait() == 0, sender.stderr
            # --once exits when nothing is claimable: the pace let two through at once, then
            # one more each half second at most; the rest wait, due, in their place. The pace
            # counts claims (the database's clock): requests reach the platform a send's
            # latency later, so the fake's log is checked for 429s only.
            # When each post was claimed: the sent_at of its latest send (what its row kept
            # before the claim moved to its lane).
            claims = sorted(claimed_at(noted).values())
            assert 2 <= len(claims) <= 6
            spans = [(b - a).total_seconds() for a, b in zip(claims, claims[2:], strict=False)]
            assert all(span >= 0.5 - 1e-3 for span in spans), spans  # never 3 within half a second
            assert len(fake.accepted_times(CHANNELS[0])) == len(claims)
            assert fake.limited["route"] == 0
