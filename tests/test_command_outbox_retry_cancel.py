"""outbox_retry and outbox_cancel (and outbox_cancel --retract): select posts by ids and filters,
act on each through the Outbox."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.utils import timezone

from django_connector_outbox import Outbox
from django_connector_outbox.models import Post
from django_connector_outbox.posts import Kind

pytestmark = pytest.mark.django_db


@pytest.fixture
def outbox(clock, monkeypatch):
    monkeypatch.setattr(timezone, "now", clock)  # the commands' --older-than reads timezone.now
    return Outbox("memory", clock=clock)


def queue(outbox, post_id, container_id, source_outbox=None):
    target = source_outbox or outbox
    assert target.queue(post_id, workspace_id="T1", container_id=container_id, body={"text": post_id})


@pytest.fixture
def settled(outbox, clock):
    """At 12:00: f-old fails (C1) and u-old becomes uncertain (C2); at 13:00 f-new fails (C3),
    u-new becomes uncertain (C4) and ok is posted (C5); q1 and q2 are queued (C6, C7)."""

    def settle(states):
        for post_id, container_id in states:
            queue(outbox, post_id, container_id)
        for claim in outbox.claim():
            if claim.post_id == "ok":
                assert outbox.posted(claim, "C5:1")
            else:
                state = "failed" if claim.post_id.startswith("f") else "uncertain"
                assert outbox.settle(claim, state, f"{claim.post_id} went wrong")

    settle([("f-old", "C1"), ("u-old", "C2")])
    clock.advance(3600)
    settle([("f-new", "C3"), ("u-new", "C4"), ("ok", "C5")])
    queue(outbox, "q1", "C6")
    queue(outbox, "q2", "C7")
    clock.advance(60)


def run(command, *args):
    out = io.StringIO()
    call_command(command, *args, stdout=out)
    return out.getvalue()


def states(outbox, *post_ids):
    return {post_id: outbox.find(post_id).state for post_id in post_ids}


ALL = ("f-old", "u-old", "f-new", "u-new", "ok", "q1", "q2")


@pytest.mark.parametrize("command", ["outbox_retry", "outbox_cancel"])
def test_nothing_is_done_without_post_ids_a_filter_or_all(command, settled):
    verb = command.removeprefix("outbox_")
    with pytest.raises(CommandError) as refused:
        call_command(command)
    assert str(refused.value) == (
        f"Name the posts to {verb}: post ids, or --source, --state, --container, --older-than; or --all"
    )


def test_retry_sends_failed_posts_back_and_leaves_uncertain_ones_without_include_uncertain(outbox, settled):
    assert run("outbox_retry", "--source", "memory") == (
        "retried memory:f-old (failed, T1/C1)\n"
        "skipped memory:u-old (uncertain, T1/C2): it may be in the source already; --include-uncertain retries it anyway\n"
        "retried memory:f-new (failed, T1/C3)\n"
        "skipped memory:u-new (uncertain, T1/C4): it may be in the source already; --include-uncertain retries it anyway\n"
        "2 retried, 2 skipped\n"
    )
    assert states(outbox, *ALL) == {
        "f-old": "queued", "u-old": "uncertain", "f-new": "queued", "u-new": "uncertain", "ok": "posted",
        "q1": "queued", "q2": "queued",
    }  # fmt: skip
    # Back to the queue as Outbox.requeue puts them: due now, attempts 0, and a sender takes them.
    assert sorted(claim.post_id for claim in outbox.claim()) == ["f-new", "f-old", "q1", "q2"]


def test_retry_with_include_uncertain_retries_them_too(outbox, settled):
    assert run("outbox_retry", "--state", "uncertain", "--include-uncertain", "-v", "0") == "2 retried\n"
    assert states(outbox, "u-old", "u-new", "f-old") == {
        "u-old": "queued",
        "u-new": "queued",
        "f-old": "failed",
    }


def test_a_dry_run_says_what_would_be_retried_and_changes_nothing(outbox, settled):
    assert run("outbox_retry", "--all", "--include-uncertain", "--older-than", "30m", "--dry-run") == (
        "would retry memory:f-old (failed, T1/C1)\n"
        "would retry memory:u-old (uncertain, T1/C2)\n"
        "dry run: 2 would be retried; nothing changed\n"
    )
    assert states(outbox, "f-old", "u-old") == {"f-old": "failed", "u-old": "uncertain"}


def test_retry_by_post_ids_says_why_each_other_post_is_left_alone(outbox, settled):
    assert run("outbox_retry", "ok", "f-new", "q1", "f-new") == (
        "retried memory:f-new (failed, T1/C3)\n"
        "skipped memory:ok (posted, T1/C5): only failed and uncertain posts can be retried\n"
        "skipped memory:q1 (queued, T1/C6): only failed and uncertain posts can be retried\n"
        "1 retried, 2 skipped\n"
    )
    assert states(outbox, "f-new", "ok", "q1") == {"f-new": "queued", "ok": "posted", "q1": "queued"}


@pytest.mark.parametrize(("command", "done"), [("outbox_retry", "retried"), ("outbox_cancel", "cancelled")])
def test_a_post_id_that_matches_nothing_is_an_error_naming_it_after_the_others_are_done(
    outbox, settled, command, done
):
    out = io.StringIO()
    with pytest.raises(CommandError) as refused:
        call_command(command, "nope", "f-new", "q1", "missing", stdout=out)
    assert str(refused.value) == "no post matches missing, nope"
    assert refused.value.returncode == 1
    assert out.getvalue().splitlines()[-1] == f"1 {done}, 1 skipped"
    assert states(outbox, "f-new", "q1") == (
        {"f-new": "queued", "q1": "queued"}
        if command == "outbox_retry"
        else {"f-new": "failed", "q1": "cancelled"}
    )


def test_a_post_id_of_another_source_is_named_with_the_sources_searched(outbox, settled):
    with pytest.raises(CommandError, match="^no post of other matches f-new$"):
        run("outbox_retry", "--source", "other", "f-new", "--dry-run")


@pytest.mark.django_db(transaction=True)
def test_a_post_id_that_matches_nothing_exits_1_from_the_command_line(outbox, settled):
    from django.db import connection

    from tests.harness import manage

    done = manage(connection.settings_dict["NAME"], "outbox_retry", "f-new", "nope")
    assert (done.returncode, done.stderr.decode()) == (1, "CommandError: no post matches nope\n")
    assert done.stdout.decode() == "retried memory:f-new (failed, T1/C3)\n1 retried\n"


def test_retry_filters_by_container(outbox, settled):
    assert run("outbox_retry", "--container", "C3", "--container", "C1", "-v", "0") == "2 retried\n"
    assert states(outbox, "f-old", "f-new") == {"f-old": "queued", "f-new": "queued"}


def test_retry_is_per_source(outbox, settled, clock):
    other = Outbox("other", clock=clock)
    queue(outbox, "f-other", "C1", source_outbox=other)
    [claim] = other.claim()
    assert other.settle(claim, "failed", "nope")
    assert run("outbox_retry", "--source", "other") == "retried other:f-other (failed, T1/C1)\n1 retried\n"
    assert states(outbox, "f-old", "f-new") == {"f-old": "failed", "f-new": "failed"}


def test_cancel_cancels_queued_posts_through_the_outbox(outbox, settled):
    assert run("outbox_cancel", "--source", "memory") == (
        "cancelled memory:q1 (queued, T1/C6)\ncancelled memory:q2 (queued, T1/C7)\n2 cancelled\n"
    )
    assert states(outbox, "q1", "q2") == {"q1": "cancelled", "q2": "cancelled"}
    assert outbox.claim() == []


def test_cancel_leaves_a_post_being_sent_alone(outbox, settled):
    claims = {claim.post_id: claim for claim in outbox.claim()}
    assert outbox.hold(claims["q2"], 0)  # back to the queue; q1 is being sent
    assert run("outbox_cancel", "q1", "q2", "f-old") == (
        "skipped memory:f-old (failed, T1/C1): only queued posts can be cancelled\n"
        "skipped memory:q1 (sending, T1/C6): only queued posts can be cancelled\n"
        "cancelled memory:q2 (queued, T1/C7)\n"
        "1 cancelled, 2 skipped\n"
    )
    assert outbox.posted(claims["q1"])  # its sender's claim is still current
    assert states(outbox, "q1", "q2") == {"q1": "posted", "q2": "cancelled"}


def test_cancel_older_than_takes_only_posts_queued_before_the_cutoff(outbox, settled, clock):
    queue(outbox, "fresh", "C8")
    clock.advance(30)
    assert run("outbox_cancel", "--older-than", "45", "--dry-run") == (
        "would cancel memory:q1 (queued, T1/C6)\n"
        "would cancel memory:q2 (queued, T1/C7)\n"
        "dry run: 2 would be cancelled; nothing changed\n"
    )
    assert states(outbox, "q1", "q2", "fresh") == {"q1": "queued", "q2": "queued", "fresh": "queued"}


def test_bad_filters_are_refused(settled):
    with pytest.raises(CommandError) as refused:
        call_command("outbox_cancel", "--state", "gone")
    # argparse quotes the choices on some Python versions and not on others.
    assert str(refused.value).replace("'", "") == (
        "Error: argument --state: invalid choice: gone "
        "(choose from queued, sending, posted, failed, uncertain, cancelled)"
    )


# -- outbox_cancel --retract: posted (and sending) posts retracted through Outbox.retract ------


def deletes():
    return list(Post.objects.filter(kind=Kind.DELETE).values_list("post_id", "thread_of", "message_ref"))


def test_retract_takes_the_posted_posts_of_a_source_by_default(outbox, settled):
    assert run("outbox_cancel", "--retract", "--source", "memory") == (
        "retracted memory:ok (posted, T1/C5)\n1 retracted\n"
    )
    assert deletes() == [("ok:delete", "ok", "C5:1")]
    assert states(outbox, "q1", "f-old") == {"q1": "queued", "f-old": "failed"}  # not selected


def test_retract_skips_what_it_cannot_retract_and_a_post_retracted_before(outbox, settled):
    assert run("outbox_cancel", "--retract", "ok", "q1", "f-old") == (
        "skipped memory:f-old (failed, T1/C1): only posted posts can be retracted\n"
        "retracted memory:ok (posted, T1/C5)\n"
        "skipped memory:q1 (queued, T1/C6): only posted posts can be retracted\n"
        "1 retracted, 2 skipped\n"
    )
    assert run("outbox_cancel", "--retract", "ok") == (
        "skipped memory:ok (posted, T1/C5): not retracted: retracted already, without a message, "
        "or its source cannot delete\n0 retracted, 1 skipped\n"
    )
    assert states(outbox, "q1", "f-old") == {"q1": "queued", "f-old": "failed"}
    assert len(deletes()) == 1


def test_a_post_being_sent_is_retracted_its_delete_behind_it(outbox, settled):
    [claim] = outbox.claim(1)  # q1 or q2: each the head of its container
    assert run("outbox_cancel", "--retract", "--state", "sending") == (
        f"retracted memory:{claim.post_id} (sending, T1/{claim.container_id})\n1 retracted\n"
    )
    assert deletes() == [(f"{claim.post_id}:delete", claim.post_id, None)]


def test_a_dry_run_retracts_nothing(outbox, settled):
    assert run("outbox_cancel", "--retract", "--all", "--dry-run") == (
        "would retract memory:ok (posted, T1/C5)\ndry run: 1 would be retracted; nothing changed\n"
    )
    assert deletes() == []


def test_retract_needs_posts_named():
    with pytest.raises(CommandError, match="Name the posts to retract: post ids, or --source"):
        run("outbox_cancel", "--retract")


@override_settings(
    CONNECTOR_OUTBOX={
        "CONNECTORS": {
            "memory": {
                "BACKEND": "django_connector_outbox.connectors.memory.MemoryConnector",
                "OPTIONS": {"kinds": ["message", "status"]},
            }
        }
    }
)
def test_a_source_that_cannot_delete_has_nothing_retracted(outbox, settled):
    assert run("outbox_cancel", "--retract", "ok").endswith("0 retracted, 1 skipped\n")
    assert deletes() == []


def test_without_retract_a_posted_post_is_not_cancelled(outbox, settled):
    assert run("outbox_cancel", "ok").endswith("only queued posts can be cancelled\n0 cancelled, 1 skipped\n")
    assert deletes() == []
