"""queue/queue_many/set_status with `thread_of`: what is refused, what is stored, and what a
claim of a reply carries (its parent as it is now), through the store of the database in use."""

from __future__ import annotations

import pytest
from django.db import transaction

from django_connector_outbox import InvalidPost, Outbox
from django_connector_outbox.models import Post
from django_connector_outbox.posts import Action, Finish, Parent

pytestmark = pytest.mark.django_db


@pytest.fixture
def outbox(clock):
    return Outbox("memory", clock=clock)


def post(post_id, container_id="C1", **fields):
    return {
        "post_id": post_id,
        "workspace_id": "T1",
        "container_id": container_id,
        "body": {"text": post_id},
    } | fields


def deliver_head(outbox, ref=None):
    """Claim the one due head and record it posted (with `ref`); its claim."""
    [claim] = outbox.claim()
    assert outbox.posted(claim, ref)
    return claim


# -- what is refused, before anything is written ----------------------------------------------


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (post("r1", thread_of="nope"), "thread_of 'nope' names no post of this source queued before it"),
        (post("r1", "C2", thread_of="p1"), "thread_of 'p1' is a post of another container (T1/C1)"),
        (post("r1", thread_of="p1", thread_id="123.4"), "thread_of and thread_id '123.4' both given"),
        (post("r1", thread_of="r1"), "thread_of names the post itself"),
        (post("r1", thread_of=""), "thread_of must not be empty"),
        (post("r1", thread_of="x" * 256), "thread_of is longer than 255"),
        (post("r1", thread_of="p1", kind="reaction"), "thread_of is given for a reaction"),
        (post("r1", thread_of="react"), "thread_of 'react' is a reaction, which has no thread"),
    ],
)
def test_a_reply_without_an_earlier_parent_of_its_container_is_refused_and_nothing_is_written(
    outbox, reply, message
):
    outbox.queue(**post("p1"))
    outbox.queue(**post("react", kind="reaction", body={"name": "eyes", "timestamp": "1.2"}))

    with pytest.raises(InvalidPost, match="post 'r1': " + message.replace("(", r"\(").replace(")", r"\)")):
        outbox.queue_many([post("ok"), reply])
    assert outbox.find("ok") is None and outbox.find("r1") is None


def test_a_parent_later_in_the_same_batch_is_refused(outbox):
    with pytest.raises(
        InvalidPost, match="post 'r1': thread_of 'p1' names no post of this source queued before it"
    ):
        outbox.queue_many([post("r1", thread_of="p1"), post("p1")])
    assert Post.objects.count() == 0


def test_a_delayed_parent_due_after_its_reply_is_refused(outbox):
    # The reply would be its container's head, waiting for a parent queued behind it.
    outbox.queue(**post("p1", delay=60))
    with pytest.raises(InvalidPost, match="post 'r1': thread_of 'p1' is due after it"):
        outbox.queue(**post("r1", thread_of="p1"))
    with pytest.raises(InvalidPost, match="post 'r2': thread_of 'p2' is due after it"):
        outbox.queue_many([post("p2", delay=60), post("r2", thread_of="p2", delay=59)])


def test_a_reply_due_with_or_after_its_delayed_parent_is_queued(outbox):
    outbox.queue(**post("p1", delay=60))
    assert outbox.queue(**post("r1", thread_of="p1", delay=60))
    assert outbox.queue_many([post("p2", "C2", delay=5), post("r2", "C2", thread_of="p2", delay=5)]) == 2


def test_an_invalid_reply_leaves_the_callers_transaction_usable(outbox):
    with transaction.atomic():
        outbox.queue(**post("p1"))
        with pytest.raises(InvalidPost):
            outbox.queue(**post("r1", thread_of="nope"))
        assert outbox.queue(**post("r2", thread_of="p1"))
    assert Post.objects.get(post_id="r2").thread_of == "p1"


def test_a_reply_whose_id_exists_is_not_queued_again_even_if_its_parent_is_gone(outbox, clock):
    outbox.queue(**post("p1"))
    deliver_head(outbox, "C1:1")
    outbox.queue(**post("r1", thread_of="p1", delay=60))
    Post.objects.filter(post_id="p1").delete()  # as pruning would, long after

    assert outbox.queue(**post("r1", thread_of="p1")) is False


def test_a_parent_finished_long_ago_still_takes_replies(outbox, clock):
    outbox.queue(**post("p1"))
    deliver_head(outbox, "C1:1")
    clock.advance(3600)

    assert outbox.queue(**post("r1", thread_of="p1"))


# -- what is stored and claimed ---------------------------------------------------------------


def test_the_claim_of_a_reply_carries_its_parent_as_it_ended(outbox):
    assert outbox.queue_many([post("p1"), post("r1", thread_of="p1"), post("r2", thread_of="r1")]) == 3
    parent = deliver_head(outbox, "C1:1")
    assert parent.parent is None

    [reply] = outbox.claim()
    assert reply.post_id == "r1" and reply.thread_id == ""
    assert reply.parent == Parent("p1", "posted", "C1:1", "")
    # Recorded with the thread it went into: a reply of the reply sees the parent's thread.
    finish = Finish(reply.post_id, reply.lease_token, Action.POSTED, message_ref="C1:2", thread_id="C1:1")
    assert outbox.finish_many([(reply, finish)])[0] is not None
    assert Post.objects.get(post_id="r1").thread_id == "C1:1"

    [second] = outbox.claim()
    assert second.parent == Parent("r1", "posted", "C1:2", "C1:1")


@pytest.mark.parametrize("ended", ["failed", "cancelled"])
def test_a_parent_that_ended_without_a_message_is_claimed_so(outbox, ended):
    outbox.queue_many([post("p1"), post("r1", thread_of="p1")])
    if ended == "cancelled":
        assert outbox.cancel_queued("p1")
    else:
        [claim] = outbox.claim()
        outbox.settle(claim, "failed", "channel_not_found")

    [reply] = outbox.claim()
    assert reply.parent == Parent("p1", ended, None, "")


def test_a_parent_pruned_before_its_reply_is_claimed_as_gone(outbox, clock):
    outbox.queue_many([post("p1"), post("r1", thread_of="p1", delay=10 * 24 * 3600)])
    deliver_head(outbox, "C1:1")
    clock.advance(8 * 24 * 3600)
    assert outbox.prune_finished() == 1
    clock.advance(2 * 24 * 3600)

    [reply] = outbox.claim()
    assert reply.parent == Parent("p1", "", None, "")


def test_a_claim_of_replies_in_many_containers_carries_each_parent(outbox):
    outbox.queue_many([post(f"p{n}", f"C{n}") for n in range(3)])
    for claim in outbox.claim():
        outbox.posted(claim, f"ref-{claim.post_id}")
    outbox.queue_many([post(f"r{n}", f"C{n}", thread_of=f"p{n}") for n in range(3)] + [post("plain", "C9")])

    claims = {c.post_id: c.parent for c in outbox.claim()}
    assert claims == {
        "r0": Parent("p0", "posted", "ref-p0", ""),
        "r1": Parent("p1", "posted", "ref-p1", ""),
        "r2": Parent("p2", "posted", "ref-p2", ""),
        "plain": None,
    }


# -- set_status -------------------------------------------------------------------------------


def test_a_status_reply_is_set_again_in_its_thread_and_cannot_move(outbox):
    outbox.queue(**post("p1"))
    outbox.set_status("s1", workspace_id="T1", container_id="C1", body={"text": "1"}, thread_of="p1")
    deliver_head(outbox, "C1:1")
    [status] = outbox.claim()
    assert status.parent == Parent("p1", "posted", "C1:1", "")
    finish = Finish("s1", status.lease_token, Action.POSTED, message_ref="C1:2", thread_id="C1:1")
    outbox.finish_many([(status, finish)])

    # Its row's thread_id is now the resolved one; setting it again names its thread_of.
    outbox.set_status("s1", workspace_id="T1", container_id="C1", body={"text": "2"}, thread_of="p1")
    [edit] = outbox.claim()
    assert (edit.message_ref, edit.thread_id, edit.body) == ("C1:2", "C1:1", {"text": "2"})
    with pytest.raises(InvalidPost, match="post 's1': thread_of is 'p1'; a status cannot move"):
        outbox.set_status("s1", workspace_id="T1", container_id="C1", body={"text": "3"})
    with pytest.raises(InvalidPost, match="post 's1': thread_of is 'p1'; a status cannot move"):
        outbox.set_status("s1", workspace_id="T1", container_id="C1", body={"text": "3"}, thread_of="p2")


def test_a_status_without_a_parent_cannot_become_a_reply(outbox):
    outbox.queue(**post("p1"))
    outbox.set_status("s1", workspace_id="T1", container_id="C1", body={"text": "1"})
    with pytest.raises(InvalidPost, match="post 's1': thread_of is None; a status cannot move"):
        outbox.set_status("s1", workspace_id="T1", container_id="C1", body={"text": "2"}, thread_of="p1")


def test_set_status_refuses_an_unknown_parent(outbox):
    with pytest.raises(InvalidPost, match="post 's1': thread_of 'p1' names no post"):
        outbox.set_status("s1", workspace_id="T1", container_id="C1", body={"text": "1"}, thread_of="p1")
    assert outbox.find("s1") is None
