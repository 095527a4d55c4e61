"""outbox_prune: pruning on demand, through Outbox.prune_finished."""

from __future__ import annotations

import io

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.utils import timezone

from django_connector_outbox import Outbox
from django_connector_outbox.models import Lane

pytestmark = pytest.mark.django_db


def prune(*args):
    out = io.StringIO()
    call_command("outbox_prune", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def outbox(clock, monkeypatch):
    monkeypatch.setattr(timezone, "now", clock)
    box = Outbox("memory", clock=clock)
    for n in range(3):
        assert box.queue(f"p{n}", workspace_id="T1", container_id=f"C{n}", body={"text": "x"})
    for claim in box.claim():
        assert box.posted(claim)
    clock.advance(2 * 86400)
    return box


def test_prune_keeps_posts_within_the_retention(outbox):
    assert prune() == (
        "memory: 0 pruned\nother: 0 pruned\n"
        "0 pruned (posted and cancelled last changed more than 7d00h ago, "
        "failed and uncertain more than 30d00h ago)\n"
    )
    assert outbox.find("p0").state == "posted"


def test_prune_with_a_shorter_retention_deletes_finished_posts(outbox):
    assert prune("--retention", "1d", "--source", "memory") == (
        "memory: 3 pruned, 3 idle lanes\n3 pruned, 3 idle lanes (posted and cancelled last changed more "
        "than 1d00h ago, failed and uncertain more than 30d00h ago)\n"
    )
    assert outbox.find("p0") is None
    assert not Lane.objects.exists()  # their containers' lanes, left without posts


@pytest.fixture
def failed(outbox, clock):
    """Besides p0..p2 (posted two days ago): f1 failed and u1 uncertain, one day ago."""
    clock.advance(-86400)
    for post_id in ("f1", "u1"):
        assert outbox.queue(post_id, workspace_id="T1", container_id=post_id, body={"text": "x"})
    for claim in outbox.claim():
        assert outbox.settle(claim, "failed" if claim.post_id == "f1" else "uncertain", "nope")
    clock.advance(86400)
    return outbox


def states(outbox):
    return {p: (s.state if (s := outbox.find(p)) else None) for p in ("p0", "p1", "p2", "f1", "u1")}


def test_a_dry_run_counts_by_state_and_deletes_nothing(failed):
    before = states(failed)
    assert prune("--dry-run", "--retention", "1h", "--attention-retention", "1h") == (
        "memory: 5 would be pruned (3 posted, 1 failed, 1 uncertain), 5 idle lanes\n"
        "other: 0 would be pruned\n"
        "dry run: 5 would be pruned, 5 idle lanes (posted and cancelled last changed more than 1h00m ago, "
        "failed and uncertain more than 1h00m ago); nothing deleted\n"
    )
    assert states(failed) == before
    assert Lane.objects.count() == 5


def test_failed_and_uncertain_posts_are_kept_for_the_attention_retention(failed, clock):
    assert prune("--retention", "1h", "--source", "memory", "-v", "0") == (
        "3 pruned, 3 idle lanes (posted and cancelled last changed more than 1h00m ago, "
        "failed and uncertain more than 30d00h ago)\n"
    )
    assert states(failed) == {"p0": None, "p1": None, "p2": None, "f1": "failed", "u1": "uncertain"}
    clock.advance(30 * 86400)
    assert prune("--source", "memory", "-v", "0").startswith("2 pruned, 2 idle lanes ")
    assert states(failed)["f1"] is None


def test_the_attention_retention_is_never_shorter_than_the_retention_given(failed):
    assert prune("--retention", "40d", "--source", "memory", "-v", "0") == (
        "0 pruned (posted and cancelled last changed more than 40d00h ago, "
        "failed and uncertain more than 40d00h ago)\n"
    )


@pytest.mark.parametrize(
    ("args", "which"),
    [
        (["--retention", "0"], "--retention 0 deletes every posted and cancelled post"),
        (["--attention-retention", "0"], "--attention-retention 0 deletes every failed and uncertain post"),
        (
            ["--retention", "0", "--attention-retention", "0s"],
            "--retention and --attention-retention 0 deletes every finished one-off post",
        ),
        (
            ["--status-retention", "0", "--retention", "0"],
            "--retention and --status-retention 0 deletes every posted and cancelled post "
            "and every finished status post",
        ),
    ],
)
def test_a_retention_of_0_is_refused_without_yes(failed, args, which):
    with pytest.raises(CommandError) as refused:
        prune(*args)
    assert str(refused.value) == f"{which} at once; add --yes to do it (--dry-run shows how many)"
    assert refused.value.returncode == 1
    assert all(states(failed).values())


def test_a_retention_of_0_with_yes_prunes_every_finished_post(failed):
    assert prune("--retention", "0", "--attention-retention", "0", "--yes", "-v", "0") == (
        "5 pruned, 5 idle lanes (posted and cancelled last changed more than 0.0s ago, failed and uncertain "
        "more than 0.0s ago)\n"
    )
    assert not any(states(failed).values())


def test_a_dry_run_of_retention_0_needs_no_yes(failed):
    assert prune("--retention", "0", "--dry-run", "-v", "0").startswith(
        "dry run: 3 would be pruned, 3 idle lanes "
    )


@pytest.mark.django_db(transaction=True)
def test_a_retention_of_0_without_yes_exits_1_from_the_command_line():
    from django.db import connection

    from tests.harness import manage

    done = manage(connection.settings_dict["NAME"], "outbox_prune", "--retention", "0")
    assert (done.returncode, done.stdout, done.stderr.decode()) == (
        1,
        b"",
        "CommandError: --retention 0 deletes every posted and cancelled post at once; "
        "add --yes to do it (--dry-run shows how many)\n",
    )


@pytest.fixture
def status(outbox, clock):
    """Besides p0..p2 (posted two days ago): the status post s1, edited and posted a day ago."""
    clock.advance(-86400)
    outbox.set_status("s1", workspace_id="T1", container_id="S1", body={"text": "v1"})
    [claim] = outbox.claim()
    assert outbox.posted(claim, "S1:1.0")
    clock.advance(86400)
    return outbox


def test_status_posts_are_kept_without_a_status_retention(status):
    assert prune("--retention", "1h", "--source", "memory", "-v", "0").startswith("3 pruned, 3 idle lanes (")
    assert status.find("s1").state == "posted"
    assert prune("--dry-run", "--retention", "1h", "--source", "memory", "-v", "0").startswith(
        "dry run: 0 would be pruned ("
    )


def test_the_status_retention_setting_prunes_finished_status_posts(status):
    with override_settings(CONNECTOR_OUTBOX={**settings.CONNECTOR_OUTBOX, "STATUS_RETENTION": 3600}):
        assert prune("--dry-run", "--source", "memory") == (
            "memory: 1 would be pruned (1 status), 1 idle lane\n"
            "dry run: 1 would be pruned, 1 idle lane (posted and cancelled last changed more than 7d00h ago, "
            "failed and uncertain more than 30d00h ago, status more than 1h00m ago); nothing deleted\n"
        )
        assert status.find("s1").state == "posted"
        assert prune("--source", "memory", "-v", "0").startswith("1 pruned, 1 idle lane (")
    assert status.find("s1") is None
    assert status.find("p0").state == "posted"


def test_a_status_retention_option_overrides_the_setting(status):
    assert prune("--status-retention", "2d", "--source", "memory", "-v", "0").startswith("0 pruned (")
    assert prune("--status-retention", "12h", "--source", "memory", "-v", "0") == (
        "1 pruned, 1 idle lane (posted and cancelled last changed more than 7d00h ago, "
        "failed and uncertain more than 30d00h ago, status more than 12h00m ago)\n"
    )
    assert status.find("s1") is None
