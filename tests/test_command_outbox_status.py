"""outbox_status: counts by state, the oldest due post and the holds, per source; a health check."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from django_connector_outbox import Outbox
from django_connector_outbox.posts import Action, Finish

pytestmark = pytest.mark.django_db


@pytest.fixture
def outbox(clock, monkeypatch):
    # The commands read the time from timezone.now: the test clock stands in for it.
    monkeypatch.setattr(timezone, "now", clock)
    return Outbox("memory", clock=clock)


def queue(outbox, post_id, container_id):
    assert outbox.queue(post_id, workspace_id="T1", container_id=container_id, body={"text": post_id})


@pytest.fixture
def busy(outbox, clock):
    """At 12:00 four posts are tried: one held by a Retry-After, one sent back after a 503, one
    refused, one posted; another is being sent; two more queue behind. Then 75 s pass."""
    for post_id, container_id in [("held", "C1"), ("retried", "C2"), ("refused", "C3"), ("sent", "C5")]:
        queue(outbox, post_id, container_id)
    claims = {claim.post_id: claim for claim in outbox.claim()}
    assert outbox.hold(claims["held"], 300, "rate limited (429), Retry-After 300")
    assert outbox.retry(claims["retried"], 120, "HTTP 503\nService Unavailable")
    assert outbox.settle(claims["refused"], "failed", "channel_not_found")
    assert outbox.posted(claims["sent"], "C5:1")
    queue(outbox, "inflight", "C6")
    assert [claim.post_id for claim in outbox.claim()] == ["inflight"]
    queue(outbox, "behind", "C1")
    queue(outbox, "waiting", "C4")
    clock.advance(75)


def status(*args):
    out = io.StringIO()
    call_command("outbox_status", *args, stdout=out)
    return out.getvalue()


def test_the_status_shows_counts_the_oldest_due_post_and_the_holds_of_each_source(busy):
    assert status() == (
        "source  queued  sending  posted  failed  uncertain  cancelled  oldest due\n"
        "memory       4        1       1       1          0          0  1m15s (behind)\n"
        "other        0        0       0       0          0          0  -\n"
        "holds of memory: 2 posts wait after a retry or a Retry-After\n"
        "  held in T1/C1 until 2026-01-01T12:05:00+00:00 (in 3m45s), attempts 0: rate limited (429), Retry-After 300\n"
        "  retried in T1/C2 until 2026-01-01T12:02:00+00:00 (in 45.0s), attempts 1: HTTP 503 Service Unavailable\n"
        "senders: none running\n"
    )


def test_the_status_lists_at_most_the_holds_asked_for_and_says_how_many_more(busy):
    assert status("--source", "memory", "--holds", "1").splitlines()[2:] == [
        "holds of memory: 2 posts wait after a retry or a Retry-After",
        "  held in T1/C1 until 2026-01-01T12:05:00+00:00 (in 3m45s), attempts 0: rate limited (429), Retry-After 300",
        "  ... and 1 more",
        "senders: none running",
    ]


def test_a_delayed_post_waits_in_its_place_and_is_no_hold(outbox):
    assert outbox.queue("later", workspace_id="T1", container_id="C1", body={"text": "x"}, delay=600)
    assert status("--source", "memory") == (
        "source  queued  sending  posted  failed  uncertain  cancelled  oldest due\n"
        "memory       1        0       0       0          0          0  -\n"
        "senders: none running\n"
    )


def test_the_status_as_json(busy):
    assert json.loads(status("--json", "--source", "memory", "--fail-if-older", "2m")) == {
        "sources": [
            {
                "source": "memory",
                "at": "2026-01-01T12:01:15+00:00",
                "counts": {"queued": 4, "sending": 1, "posted": 1, "failed": 1, "uncertain": 0, "cancelled": 0},
                "depth": 5,
                "oldest_due": {"post_id": "behind", "queued_at": "2026-01-01T12:00:00+00:00", "age": 75.0},
                "held": 2,
                "held_places": {"source": 0, "workspace": 0, "container": 0},
                "place_holds": [],
                "holds": [
                    {
                        "post_id": "held", "workspace_id": "T1", "container_id": "C1",
                        "next_at": "2026-01-01T12:05:00+00:00", "attempts": 0,
                        "last_error": "rate limited (429), Retry-After 300",
                    },
                    {
                        "post_id": "retried", "workspace_id": "T1", "container_id": "C2",
                        "next_at": "2026-01-01T12:02:00+00:00", "attempts": 1,
                        "last_error": "HTTP 503\nService Unavailable",
                    },
                ],
            }
        ],
        "fail_if_older": 120.0,
        "too_old": [],
        "senders": [],
    }  # fmt: skip


@pytest.fixture
def held_places(outbox, clock):
    """At 12:00 a 429 of team T1 holds the workspace for 10 minutes, one of team T2 for 5, a
    global one the whole source for 2, and a success that announced a wait channel C4 for 30 s.
    Then 15 s pass."""
    for post_id, workspace_id, container_id in [
        ("t1", "T1", "C1"), ("t2", "T2", "C2"), ("global", "T3", "C3"), ("waited", "T3", "C4"),
    ]:  # fmt: skip
        assert outbox.queue(post_id, workspace_id=workspace_id, container_id=container_id, body={"text": "x"})
    claims = {claim.post_id: claim for claim in outbox.claim()}
    assert outbox.hold(
        claims["t1"], 600, "slack error ratelimited (HTTP 429, Retry-After 600)", scope="workspace"
    )
    assert outbox.hold(claims["t2"], 300, "slack error ratelimited\n(HTTP 429)", scope="workspace")
    assert outbox.hold(claims["global"], 120, "discord global rate limit", scope="source")
    waited = claims["waited"]
    announced = Finish(
        waited.post_id, waited.lease_token, Action.POSTED, wait=30, reason="bucket empty", scope="container"
    )
    assert outbox.finish_many([(waited, announced)]) != [None]
    clock.advance(15)


def test_the_status_lists_the_held_places_widest_first_with_until_when_and_why(held_places):
    assert status("--source", "memory").splitlines() == [
        "source  queued  sending  posted  failed  uncertain  cancelled  oldest due",
        "memory       3        0       1       0          0          0  -",
        # The held posts themselves wait after their own Retry-After, as any held post does.
        "holds of memory: 3 posts wait after a retry or a Retry-After",
        "  t1 in T1/C1 until 2026-01-01T12:10:00+00:00 (in 9m45s), attempts 0: slack error ratelimited (HTTP 429, Retry-After 600)",
        "  t2 in T2/C2 until 2026-01-01T12:05:00+00:00 (in 4m45s), attempts 0: slack error ratelimited (HTTP 429)",
        "  global in T3/C3 until 2026-01-01T12:02:00+00:00 (in 1m45s), attempts 0: discord global rate limit",
        "held places of memory: the whole source, 2 workspaces, 1 container",
        "  the whole source until 2026-01-01T12:02:00+00:00 (in 1m45s): discord global rate limit",
        "  workspace T1 until 2026-01-01T12:10:00+00:00 (in 9m45s): slack error ratelimited (HTTP 429, Retry-After 600)",
        "  workspace T2 until 2026-01-01T12:05:00+00:00 (in 4m45s): slack error ratelimited (HTTP 429)",
        "  container T3/C4 until 2026-01-01T12:00:30+00:00 (in 15.0s): bucket empty",
        "senders: none running",
    ]


def test_the_status_lists_at_most_the_held_places_asked_for_and_says_how_many_more(held_places):
    assert status("--source", "memory", "--holds", "2").splitlines()[-4:-1] == [
        "  the whole source until 2026-01-01T12:02:00+00:00 (in 1m45s): discord global rate limit",
        "  workspace T1 until 2026-01-01T12:10:00+00:00 (in 9m45s): slack error ratelimited (HTTP 429, Retry-After 600)",
        "  ... and 2 more",
    ]


def test_a_hold_that_ended_is_no_longer_listed(held_places, clock):
    clock.advance(15)  # the container's wait ends at 12:00:30
    [places] = [line for line in status("--source", "memory").splitlines() if line.startswith("held places")]
    assert places == "held places of memory: the whole source, 2 workspaces"


def test_the_held_places_as_json(held_places):
    [memory] = json.loads(status("--json", "--source", "memory"))["sources"]
    assert memory["held_places"] == {"source": 1, "workspace": 2, "container": 1}
    assert memory["place_holds"] == [
        {"scope": "source", "workspace_id": "", "container_id": "", "held_until": "2026-01-01T12:02:00+00:00",
         "reason": "discord global rate limit"},
        {"scope": "workspace", "workspace_id": "T1", "container_id": "", "held_until": "2026-01-01T12:10:00+00:00",
         "reason": "slack error ratelimited (HTTP 429, Retry-After 600)"},
        {"scope": "workspace", "workspace_id": "T2", "container_id": "", "held_until": "2026-01-01T12:05:00+00:00",
         "reason": "slack error ratelimited\n(HTTP 429)"},
        {"scope": "container", "workspace_id": "T3", "container_id": "C4", "held_until": "2026-01-01T12:00:30+00:00",
         "reason": "bucket empty"},
    ]  # fmt: skip


def test_fail_if_older_exits_with_status_3_when_a_due_post_waits_longer(busy):
    out = io.StringIO()
    with pytest.raises(CommandError) as failed:
        call_command("outbox_status", "--fail-if-older", "60", stdout=out)
    assert failed.value.returncode == 3
    assert str(failed.value) == "oldest due post waits longer than 1m00s: memory 1m15s (behind)"
    assert out.getvalue().startswith("source  queued")  # the status is printed all the same


def test_fail_if_older_passes_while_the_oldest_due_post_is_younger(busy):
    assert status("--fail-if-older", "75").splitlines()[1].endswith("1m15s (behind)")


def test_fail_if_older_passes_with_nothing_due(outbox):
    assert status("--fail-if-older", "0") == (
        "source  queued  sending  posted  failed  uncertain  cancelled  oldest due\n"
        "memory       0        0       0       0          0          0  -\n"
        "other        0        0       0       0          0          0  -\n"
        "senders: none running\n"
    )


@pytest.mark.parametrize(
    ("args", "refusal"),
    [
        (["--source", "nope"], "Unknown source nope; configured: memory, other"),
        (["--database", "nope"], "Unknown database alias 'nope'"),
        (
            ["--fail-if-older", "5x"],
            "Error: argument --fail-if-older: must be seconds, or a number with s, m, h or d, got '5x'",
        ),
        (
            ["--fail-if-older", "11000d"],
            "Error: argument --fail-if-older: must be at most 315360000 seconds, got '11000d'",
        ),
    ],
    ids=["source", "database", "age", "too-long"],
)
def test_bad_arguments_are_refused(args, refusal):
    with pytest.raises(CommandError) as refused:
        call_command("outbox_status", *args)
    assert str(refused.value) == refusal
