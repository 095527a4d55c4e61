"""outbox_status --failed: the failed and uncertain posts of each source, grouped by reason."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from django_connector_outbox import Outbox

pytestmark = pytest.mark.django_db


@pytest.fixture
def outbox(clock, monkeypatch):
    monkeypatch.setattr(timezone, "now", clock)
    return Outbox("memory", clock=clock)


def end(outbox, clock, post_id, state, reason, *, source_outbox=None):
    """Queue a post alone in its container and finish it as `state` with `reason`, 10 s later
    than the previous one."""
    box = source_outbox or outbox
    assert box.queue(post_id, workspace_id="T1", container_id=f"C-{post_id}", body={"text": post_id})
    [claim] = box.claim()
    assert box.settle(claim, state, reason)
    clock.advance(10)


@pytest.fixture
def failures(outbox, clock):
    """At 12:00:00 p1 fails for channel_not_found, then every 10 s: p2 uncertain, p3 and p4
    channel_not_found, p5 is_archived (multi-line), and p6 of the other source."""
    end(outbox, clock, "p1", "failed", "channel_not_found")
    end(outbox, clock, "p2", "uncertain", "may have been sent, cannot check: ephemeral")
    end(outbox, clock, "p3", "failed", "channel_not_found")
    end(outbox, clock, "p4", "failed", "channel_not_found")
    end(outbox, clock, "p5", "failed", "is_archived\nthe channel is archived")
    end(outbox, clock, "p6", "failed", "HTTP 404", source_outbox=Outbox("other", clock=clock))
    # Not failures: a delivered post and a queued one.
    assert outbox.queue("sent", workspace_id="T1", container_id="C-sent", body={"text": "x"})
    [claim] = outbox.claim()
    assert outbox.posted(claim, "C-sent:1")
    assert outbox.queue("waiting", workspace_id="T1", container_id="C-w", body={"text": "x"}, delay=3600)


def status(*args):
    out = io.StringIO()
    call_command("outbox_status", "--failed", *args, stdout=out)
    return out.getvalue()


def test_failed_posts_are_grouped_by_reason_the_latest_first(failures):
    assert status() == (
        "failed and uncertain posts of memory: 5 (3 reasons)\n"
        "  1 failed, latest 2026-01-01T12:00:40+00:00: is_archived the channel is archived\n"
        "    p5\n"
        "  3 failed, latest 2026-01-01T12:00:30+00:00: channel_not_found\n"
        "    p4, p3, p1\n"
        "  1 uncertain, latest 2026-01-01T12:00:10+00:00: may have been sent, cannot check: ephemeral\n"
        "    p2\n"
        "failed and uncertain posts of other: 1 (1 reason)\n"
        "  1 failed, latest 2026-01-01T12:00:50+00:00: HTTP 404\n"
        "    p6\n"
    )


def test_a_limit_shows_the_latest_reasons_and_says_how_many_more(outbox, clock, failures):
    end(outbox, clock, "p7", "failed", "channel_not_found")
    end(outbox, clock, "p8", "failed", "channel_not_found")
    assert status("--source", "memory", "--limit", "1") == (
        "failed and uncertain posts of memory: 7 (3 reasons)\n"
        "  5 failed, latest 2026-01-01T12:01:10+00:00: channel_not_found\n"
        "    p8, p7, p4 and 2 more\n"
        "  ... and 2 more reasons\n"
    )


def test_a_source_without_failures_says_none(outbox):
    assert status("--source", "memory") == "failed and uncertain posts of memory: none\n"


def test_json_lists_every_group_with_its_post_ids(failures):
    document = json.loads(status("--json", "--source", "memory", "--limit", "2"))
    assert document == {
        "sources": [
            {
                "source": "memory",
                "posts": 5,
                "reasons": 3,
                "groups": [
                    {
                        "state": "failed",
                        "reason": "is_archived\nthe channel is archived",
                        "count": 1,
                        "newest": "2026-01-01T12:00:40+00:00",
                        "post_ids": ["p5"],
                    },
                    {
                        "state": "failed",
                        "reason": "channel_not_found",
                        "count": 3,
                        "newest": "2026-01-01T12:00:30+00:00",
                        "post_ids": ["p4", "p3", "p1"],
                    },
                ],
            }
        ]
    }


def test_a_retried_post_leaves_the_list(outbox, failures):
    assert outbox.requeue("p5")
    assert "is_archived" not in status("--source", "memory")


def test_failed_is_not_a_health_check(outbox):
    with pytest.raises(CommandError) as error:
        status("--fail-if-older", "60")
    assert str(error.value) == "--failed lists failures; run the health check (--fail-if-older) on its own"
