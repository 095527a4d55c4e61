"""Producers, operators and senders at the same instant, in real transactions (issue 18).

Each test sets up one interleaving of transactions on their own connections (tests/lockstep.py:
a thread each, paused before a chosen statement, or seen waiting for a lock) that broke a
promise before: a post reported cancelled was claimed afterwards (PostgreSQL, hole 2), a
producer got a deadlock (MariaDB, hole 3, and the interleaving explorer's finds after it), a
sender's finish and another's claim deadlocked on the gates of a paced source (hole 10), a
sender's batch finish and a producer deadlocked on lanes (issue 22's prune test). SQLite
takes one database lock per writer: no two of these transactions can interleave there.
"""

from __future__ import annotations

import threading

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.test import override_settings

from django_connector_outbox import Outbox
from django_connector_outbox.models import Lane, Post
from django_connector_outbox.posts import Action, Finish
from tests.lockstep import STEP_TIMEOUT, Actor, inserts, updates, wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor == "sqlite",
        reason="SQLite serializes writers with one database lock: transactions cannot interleave; run "
        "with DATABASE_URL pointing at PostgreSQL or MySQL/MariaDB",
    ),
]

POST = Post._meta.db_table
LANE = Lane._meta.db_table


def queue(outbox, post_id, container="C1", workspace="T1"):
    return outbox.queue(post_id, workspace_id=workspace, container_id=container, body={"n": post_id})


def drain(outbox):
    """Claim and post until nothing is due; every claim made."""
    claims = []
    while batch := outbox.claim():
        claims += batch
        for claim in batch:
            assert outbox.posted(claim)
    return claims


def held_open(work, ready: threading.Event, commit: threading.Event):
    """`work()` in a transaction kept open (its locks held) until `commit` is set."""

    def run():
        with transaction.atomic():
            result = work()
            ready.set()
            assert commit.wait(STEP_TIMEOUT)
        return result

    return run


# -- hole 2: a post reported cancelled is never claimed afterwards ----------------------------------


def test_a_post_cancelled_behind_a_head_being_finished_is_never_claimed(clock):
    # The sender finishes p1 (the lane's head moves to p2, not committed yet) while an operator
    # cancels p2. The cancel used to look for its lane with a locking read filtered on
    # head_id = p2, which the committed row did not match: no lock, no wait; it then wrote p2
    # cancelled after a claimer had taken p2, and p3 inherited p2's lease.
    outbox = Outbox("memory", clock=clock)
    for n in (1, 2, 3):
        queue(outbox, f"p{n}")
    [first] = outbox.claim()
    written, commit = threading.Event(), threading.Event()
    finisher = Actor("finisher", held_open(lambda: outbox.posted(first), written, commit)).start()
    wait_for(written.is_set, "the head's finish is written")

    canceller = Actor("canceller", lambda: outbox.cancel_queued("p2"), pause=updates(POST)).start()
    wait_for(canceller.reached, "the cancel waits for the lane, or is about to write")
    commit.set()
    assert finisher.join() is True
    wait_for(lambda: canceller.paused.is_set() or canceller.done.is_set(), "the cancel is about to write")
    claims = outbox.claim()  # between the cancel's decision and its write
    cancelled = canceller.join()
    claims += drain(outbox)

    assert cancelled is True
    assert [(c.post_id, c.stale) for c in claims] == [("p3", False)]
    assert dict(Post.objects.values_list("post_id", "state")) == {
        "p1": "posted", "p2": "cancelled", "p3": "posted",
    }  # fmt: skip
    assert Lane.objects.exclude(lease_token="").count() == 0


def test_a_head_cancelled_while_a_claimer_comes_is_never_claimed(clock):
    # The head is due and free: the cancel's locking read (head_id = p1 and a lease) matched no
    # row, locked nothing, and a claimer took p1 between the cancel's decision and its write.
    outbox = Outbox("memory", clock=clock)
    queue(outbox, "p1")
    canceller = Actor("canceller", lambda: outbox.cancel_queued("p1"), pause=updates(POST)).start()
    wait_for(canceller.reached, "the cancel is about to write")
    claims = outbox.claim()
    cancelled = canceller.join()
    claims += drain(outbox)

    assert cancelled is True
    assert claims == []
    assert Post.objects.get().state == "cancelled"
    assert Lane.objects.get().lease_token == ""


def test_a_head_being_sent_is_not_cancelled_by_an_operator_waiting_for_its_lane(clock):
    # The claim holds the lane (not committed) while the cancel comes: the cancel waits for the
    # lane and then sees the lease: False, and the claim goes on.
    outbox = Outbox("memory", clock=clock)
    queue(outbox, "p1")
    claimed, commit = threading.Event(), threading.Event()
    claimer = Actor("claimer", held_open(outbox.claim, claimed, commit)).start()
    wait_for(claimed.is_set, "the claim is written")
    canceller = Actor("canceller", lambda: outbox.cancel_queued("p1")).start()
    wait_for(canceller.reached, "the cancel waits for the lane")
    commit.set()
    [claim] = claimer.join()

    assert canceller.join() is False
    assert outbox.posted(claim) is True
    assert Post.objects.get().state == "posted"


# -- hole 3: no deadlock reaches a producer ----------------------------------------------------------


def test_transactions_queueing_one_post_id_into_different_containers_each_get_an_answer():
    # InnoDB's duplicate-key check takes a shared lock on the key that the first transaction
    # inserted; the producers waiting on it used to read it again with an exclusive lock once
    # it committed: two holders of the shared lock asking for the exclusive one, a deadlock.
    outbox = Outbox("memory")
    containers = ["C1", "C2", "C3", "C4"]
    for container in containers:  # the lanes exist: only the post's key is contended
        queue(outbox, f"seed-{container}", container)
    inserted, commit = threading.Event(), threading.Event()
    first = Actor("first", held_open(lambda: queue(outbox, "p", "C1"), inserted, commit)).start()
    wait_for(inserted.is_set, "the first producer inserted the post")
    others = [Actor(f"producer-{c}", lambda c=c: queue(outbox, "p", c)).start() for c in containers[1:]]
    wait_for(lambda: all(o.reached() for o in others), "the other producers wait for the first")
    commit.set()

    assert first.join() is True
    assert [o.join() for o in others] == [False, False, False]
    assert list(Post.objects.filter(post_id="p").values_list("container_id", flat=True)) == ["C1"]


def test_producers_opening_one_new_container_at_once_each_get_an_answer():
    # Each producer found no lane and inserted it; InnoDB's INSERT IGNORE took a shared lock on
    # the lane that the first one created, and each then locked it for update: a deadlock.
    outbox = Outbox("memory")
    inserted, commit = threading.Event(), threading.Event()
    first = Actor(
        "first", held_open(lambda: queue(outbox, "a0", "new"), inserted, commit), pause=inserts(LANE)
    )
    others = [
        Actor(f"producer-{n}", lambda n=n: queue(outbox, f"a{n}", "new"), pause=inserts(LANE)) for n in (1, 2)
    ]
    # The first one goes ahead to its INSERT before the others start: on MySQL the creators of
    # a lane take turns by a named lock from their locking read to their INSERT, and one of the
    # others holding it paused would keep the first from ever reaching its own.
    first.start()
    wait_for(lambda: first.reached() or inserted.is_set(), "the first producer is about to create the lane")
    for actor in others:
        actor.start()
    # All of them looked for the lane before any created it (the SQL store's creation is not
    # seen by the pause: its producers wait for the first one's lane instead).
    wait_for(lambda: all(o.reached() for o in others), "the others are about to create it too")
    first.resume()
    wait_for(inserted.is_set, "the first producer created the lane and queued")
    for other in others:
        other.resume()
    wait_for(lambda: all(o.waiting() or o.done.is_set() for o in others), "the others wait for the lane")
    commit.set()

    assert [first.join(), *(o.join() for o in others)] == [True, True, True]
    assert Lane.objects.count() == 1
    assert [c.post_id for c in drain(outbox)] == ["a0", "a1", "a2"]


def test_a_producer_queueing_next_to_an_id_another_waits_for_gets_an_answer():
    # The first producer queued "x1" and, in the same transaction, queues "m8", whose place
    # in the index of ids is the gap just before "x1". A second producer of "x1" used to wait
    # in its INSERT, whose duplicate-key check asks for a lock on "x1" and the gap before it:
    # the first one's insert into that gap then waited for the second, a deadlock.
    outbox = Outbox("memory")
    queue(outbox, "z", "C1")  # the lanes exist, and no id sorts between "m8" and "x1"
    queue(outbox, "z2", "C2")
    inserted, go_on = threading.Event(), threading.Event()

    def queue_two():
        with transaction.atomic():
            assert queue(outbox, "x1", "C1")
            inserted.set()
            assert go_on.wait(STEP_TIMEOUT)
            return queue(outbox, "m8", "C1")

    first = Actor("first", queue_two).start()
    wait_for(inserted.is_set, "the first producer queued x1")
    second = Actor("second", lambda: queue(outbox, "x1", "C2")).start()
    wait_for(second.reached, "the second producer waits for x1")
    go_on.set()

    assert first.join() is True
    assert second.join() is False
    assert dict(Post.objects.values_list("post_id", "container_id")) == {
        "z": "C1", "z2": "C2", "x1": "C1", "m8": "C1",
    }  # fmt: skip


def test_a_producer_opening_a_container_next_to_one_another_waits_for_gets_an_answer():
    # The second producer found no lane "C2" and was about to create it when the first one
    # created it (not committed). Its INSERT ... ON DUPLICATE KEY UPDATE then waited for the
    # lane with a lock that covers the gap before "C2" too, where the first producer, in the
    # same transaction, then opened "C1": each waited for the other, a deadlock. Now the
    # creators of a lane take turns, and a lane created meanwhile is waited for on its row.
    outbox = Outbox("memory")
    opened, go_on = threading.Event(), threading.Event()

    def open_two():
        with transaction.atomic():
            assert queue(outbox, "a0", "C2")
            opened.set()
            assert go_on.wait(STEP_TIMEOUT)
            return queue(outbox, "a1", "C1")

    second = Actor("second", lambda: queue(outbox, "b0", "C2"), pause=inserts(LANE)).start()
    # (The SQL store's statements are not seen by the pause: its producer just goes on.)
    wait_for(
        lambda: second.paused.is_set() or second.done.is_set(),
        "the second producer is about to create the lane",
    )
    first = Actor("first", open_two).start()
    wait_for(lambda: opened.is_set() or first.waiting(), "the first producer created the lane, or waits")
    second.resume()
    wait_for(lambda: second.waiting() or second.done.is_set(), "the second producer created it, or waits")
    go_on.set()

    assert first.join() is True
    assert second.join() is True
    assert sorted(Lane.objects.values_list("container_id", flat=True)) == ["C1", "C2"]


# -- hole 10: gates are locked in one order -----------------------------------------------------------


def paced(pace):
    connectors = dict(settings.CONNECTOR_OUTBOX["CONNECTORS"])
    connectors["memory"] = {**connectors["memory"], "PACE": pace}
    return override_settings(CONNECTOR_OUTBOX={**settings.CONNECTOR_OUTBOX, "CONNECTORS": connectors})


@pytest.mark.parametrize(
    "pace", [{"workspace": (100, 1)}, {"workspace": (100, 1), "source": (100, 1)}], ids=["workspace", "both"]
)
def test_a_workspace_hold_then_a_claim_does_not_deadlock_with_another_senders_claim(clock, pace):
    # A sender records a workspace-scoped 429 (its finish locks that workspace's gate) and claims
    # in the same transaction, as run_outbox does; another sender's claim has locked the gates
    # of its heads meanwhile, in another order: each waited for the other's gate.
    with paced(pace):
        outbox = Outbox("memory", clock=clock)
        # Both workspaces' gates exist (a claim made them): the other sender locks them both.
        queue(outbox, "held", "C0", "W2")
        queue(outbox, "seen", "C9", "W1")
        held, seen = outbox.claim()
        assert outbox.posted(seen)
        # Due in this order: one lane of each workspace for the other sender, then one of W1.
        for post_id, container, workspace in [("b1", "C1", "W1"), ("b2", "C2", "W2"), ("a1", "C3", "W1")]:
            clock.advance(1)
            queue(outbox, post_id, container, workspace)
        clock.advance(1)

        finished, go_on = threading.Event(), threading.Event()

        def finish_then_claim():
            with transaction.atomic():
                assert outbox.hold(held, 60, "429", scope="workspace")
                finished.set()
                assert go_on.wait(STEP_TIMEOUT)
                return outbox.claim(limit=2)

        first = Actor("finisher", finish_then_claim).start()
        wait_for(finished.is_set, "the first sender held its workspace")
        second = Actor("claimer", lambda: outbox.claim(limit=2)).start()
        wait_for(second.reached, "the second sender's claim waits for a gate")
        go_on.set()

        mine, theirs = first.join(), second.join()
        assert [c.post_id for c in mine] == ["a1"]
        assert [c.post_id for c in theirs] == ["b1", "b2"]


def posted(claim):
    return Finish(claim.post_id, claim.lease_token, Action.POSTED)


def test_a_senders_batch_finish_and_a_producer_locking_the_same_lanes_do_not_deadlock(clock):
    # A producer holds lane A (it queued there, its transaction open) and will queue into B; a
    # sender finishes its claims of B and A in that order. Finishing one by one, the sender
    # locked B, then waited for A, and the producer then waited for B: a deadlock, the
    # producer's transaction (the user's) aborted. The batch's lanes are now locked at once in
    # id order, as every lane lock is: the sender waits for A holding nothing.
    outbox = Outbox("memory", clock=clock)
    queue(outbox, "a1", "CA")
    queue(outbox, "b1", "CB")
    claims = {claim.post_id: claim for claim in outbox.claim()}
    queued_a, go_on = threading.Event(), threading.Event()

    def produce():
        with transaction.atomic():
            queue(outbox, "a2", "CA")
            queued_a.set()
            assert go_on.wait(STEP_TIMEOUT)
            queue(outbox, "b2", "CB")

    producer = Actor("producer", produce).start()
    wait_for(queued_a.is_set, "the producer holds lane A")
    sender = Actor(
        "sender", lambda: outbox.finish_many([(claims[p], posted(claims[p])) for p in ("b1", "a1")])
    ).start()
    wait_for(sender.reached, "the sender waits for lane A")
    go_on.set()
    producer.join()
    sender.join()

    assert dict(Post.objects.values_list("post_id", "state")) == {
        "a1": "posted", "b1": "posted", "a2": "queued", "b2": "queued",
    }  # fmt: skip


# -- a retract against claims and finishes: the post is cancelled, or its delete goes behind it ------


def test_a_head_retracted_while_a_claimer_comes_is_cancelled_and_never_claimed(clock):
    # As cancel: the retract decides under the lane's lock, so a claimer that comes between its
    # decision and its write skips the lane, and the post reported retracted is never sent.
    outbox = Outbox("memory", clock=clock)
    queue(outbox, "p1")
    retracter = Actor("retracter", lambda: outbox.retract("p1"), pause=updates(POST)).start()
    wait_for(retracter.reached, "the retract is about to write")
    claims = outbox.claim()
    retracted = retracter.join()
    claims += drain(outbox)

    assert retracted is True
    assert claims == []
    assert list(Post.objects.values_list("post_id", "state")) == [("p1", "cancelled")]
    assert Lane.objects.get().lease_token == ""


def test_a_head_being_claimed_is_retracted_by_a_delete_that_goes_out_after_it(clock):
    # The claim holds the lane (not committed) while the retract comes: the retract waits for
    # the lane, then sees the post sending: its delete is queued, and claimed once it is posted.
    outbox = Outbox("memory", clock=clock)
    queue(outbox, "p1")
    claimed, commit = threading.Event(), threading.Event()
    claimer = Actor("claimer", held_open(outbox.claim, claimed, commit)).start()
    wait_for(claimed.is_set, "the claim is written")
    retracter = Actor("retracter", lambda: outbox.retract("p1")).start()
    wait_for(retracter.reached, "the retract waits for the lane")
    commit.set()
    [claim] = claimer.join()

    assert retracter.join() is True
    assert outbox.claim() == []  # the delete waits behind the post in flight
    assert outbox.posted(claim, "C1:1") is True
    [delete] = outbox.claim()
    assert (delete.post_id, delete.kind, delete.parent.message_ref) == ("p1:delete", "delete", "C1:1")


def test_a_post_retracted_while_its_send_is_recorded_gets_the_ref_of_that_send(clock):
    # The finish holds the lane (posted, not committed): the retract waits, then reads the post
    # posted with its ref, which its delete carries.
    outbox = Outbox("memory", clock=clock)
    queue(outbox, "p1")
    [claim] = outbox.claim()
    written, commit = threading.Event(), threading.Event()
    finisher = Actor("finisher", held_open(lambda: outbox.posted(claim, "C1:9"), written, commit)).start()
    wait_for(written.is_set, "the finish is written")
    retracter = Actor("retracter", lambda: outbox.retract("p1")).start()
    wait_for(retracter.reached, "the retract waits for the lane")
    commit.set()
    assert finisher.join() is True

    assert retracter.join() is True
    delete = Post.objects.get(post_id="p1:delete")
    assert (delete.state, delete.message_ref) == ("queued", "C1:9")
