"""Pruning at the same instant as producers and operators, in real transactions (tests/lockstep.py).

Pruning deletes finished posts and then the lanes left without posts; everyone else finds a
lane (or a post) by a plain read and then locks it. Each test holds a pruning transaction open
after its deletes, lets the other call reach the lock it must wait for, and then commits the
pruning: the call finds its row gone, and does what it would have done had it come later (a
lane made again, a status queued anew, a cancel that says False), never an error or a lost
post. SQLite takes one database lock per writer: these transactions cannot interleave there.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from django_connector_outbox import Outbox, PostState
from django_connector_outbox.models import Lane, Post
from tests.lockstep import STEP_TIMEOUT, Actor, wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor == "sqlite",
        reason="SQLite serializes writers with one database lock: transactions cannot interleave; run "
        "with DATABASE_URL pointing at PostgreSQL or MySQL/MariaDB",
    ),
]


def place(container="C1"):
    return {"workspace_id": "T1", "container_id": container}


def deliver(outbox):
    for claim in outbox.claim():
        assert outbox.posted(claim, f"ref-{claim.post_id}")


def pruning_held_open(outbox, **retentions):
    """An actor that prunes everything finished (retention 0), then the idle lanes, in one
    transaction that it keeps open until `commit` is set; and that event."""
    pruned, commit = threading.Event(), threading.Event()

    def prune():
        with transaction.atomic():
            posts = outbox.prune_some(0, **retentions)
            lanes = outbox.prune_lanes(0)[1]
            pruned.set()
            assert commit.wait(STEP_TIMEOUT)
        return posts, lanes

    actor = Actor("pruner", prune).start()
    wait_for(pruned.is_set, "the pruning has deleted its rows")
    return actor, commit


def test_a_producer_whose_lane_is_pruned_while_it_waits_makes_it_again(clock):
    outbox = Outbox("memory", clock=clock)
    assert outbox.queue("p0", **place(), body={})
    deliver(outbox)
    old = Lane.objects.get().pk
    clock.advance(1)
    pruner, commit = pruning_held_open(outbox)
    # It finds the lane (the pruning has not committed) and waits for its lock.
    producer = Actor("producer", lambda: outbox.queue("p1", **place(), body={})).start()
    wait_for(producer.reached, "the producer waits for the lane")
    commit.set()

    assert pruner.join() == (1, 1)
    assert producer.join() is True
    lane = Lane.objects.get()
    assert lane.pk != old and lane.head_id == Post.objects.get(post_id="p1").pk
    assert [c.post_id for c in outbox.claim()] == ["p1"]


def test_a_batch_whose_lanes_are_pruned_while_it_waits_loses_no_post(clock):
    outbox = Outbox("memory", clock=clock)
    outbox.queue_many([{"post_id": f"p{n}", **place(f"C{n}"), "body": {}} for n in range(3)])
    deliver(outbox)
    assert outbox.queue("busy", **place("C1"), body={})  # C1 keeps its lane
    clock.advance(1)
    pruner, commit = pruning_held_open(outbox)
    batch = [{"post_id": f"q{n}.{k}", **place(f"C{n}"), "body": {}} for n in range(4) for k in range(2)]
    producer = Actor("producer", lambda: outbox.queue_many(batch)).start()
    wait_for(producer.reached, "the producer waits for the lanes")
    commit.set()

    assert pruner.join() == (3, 2)
    assert producer.join() == 8
    queued = Post.objects.filter(state="queued").order_by("container_id", "queued_at", "pk")
    assert [(p.container_id, p.post_id) for p in queued] == [
        ("C0", "q0.0"), ("C0", "q0.1"), ("C1", "busy"), ("C1", "q1.0"), ("C1", "q1.1"),
        ("C2", "q2.0"), ("C2", "q2.1"), ("C3", "q3.0"), ("C3", "q3.1"),
    ]  # fmt: skip
    assert outbox.repair_lanes()[1] == []
    assert sorted(c.post_id for c in outbox.claim()) == ["busy", "q0.0", "q2.0", "q3.0"]


def test_a_status_pruned_while_set_status_waits_for_it_is_queued_anew(clock):
    outbox = Outbox("memory", clock=clock)
    outbox.set_status("s1", **place(), body={"text": "v1"})
    deliver(outbox)
    clock.advance(1)
    pruner, commit = pruning_held_open(outbox, status_retention=0)
    # It reads the post (not pruned yet for it), then waits for its lane.
    setter = Actor("setter", lambda: outbox.set_status("s1", **place(), body={"text": "v2"})).start()
    wait_for(setter.reached, "set_status waits for the lane")
    commit.set()

    assert pruner.join() == (1, 1)
    setter.join()
    assert outbox.find("s1") == PostState("queued", None)
    [claim] = outbox.claim()
    assert (claim.body, claim.rev, claim.message_ref) == ({"text": "v2"}, 0, None)


def test_cancelling_a_post_pruned_meanwhile_with_its_lane_says_false(clock):
    outbox = Outbox("memory", clock=clock)
    assert outbox.queue("p1", **place(), body={})
    deliver(outbox)
    clock.advance(1)
    pruner, commit = pruning_held_open(outbox)
    canceller = Actor("canceller", lambda: outbox.cancel_queued("p1")).start()
    wait_for(canceller.reached, "the cancel waits for the lane")
    commit.set()

    assert pruner.join() == (1, 1)
    assert canceller.join() is False
    assert not Post.objects.exists() and not Lane.objects.exists()
