"""outbox_prune: pruning on demand, through Outbox.prune_finished."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.utils import timezone

from django_connector_outbox import Outbox

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
    assert prune() == "memory: 0 pruned\nother: 0 pruned\n0 pruned (last changed more than 7d00h ago)\n"
    assert outbox.find("p0").state == "posted"


def test_prune_with_a_shorter_retention_deletes_finished_posts(outbox):
    assert prune("--retention", "1d", "--source", "memory") == (
        "memory: 3 pruned\n3 pruned (last changed more than 1d00h ago)\n"
    )
    assert outbox.find("p0") is None
