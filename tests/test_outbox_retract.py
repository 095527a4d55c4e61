"""Outbox.retract (CONTRACT, "Retracting a post"), sentence by sentence, through the store of
the database in use and the sender, against the memory connector (which deletes).

"the post will not be seen: a queued post becomes cancelled (as cancel_queued); a posted one
(or a sending one, which then finishes first) gets a post of kind delete queued behind it in
its container, which the connector sends as the platform's delete of message_ref. True when one
of these was done; False when the post does not exist, is already cancelled, ended without a
message (failed, or a send that ends so drops its delete), or its source does not list "delete"
in kinds (then it is left as it is). A delete post is never queued directly. A retract is
idempotent: a second one returns False and queues nothing."
"""

from __future__ import annotations

import pytest
from django.db import transaction
from django.test import override_settings

from django_connector_outbox import InvalidPost, Outbox
from django_connector_outbox.connectors import connectors
from django_connector_outbox.models import Post, delete_ids
from django_connector_outbox.posts import Kind, Parent, State
from django_connector_outbox.sender import Sender

pytestmark = pytest.mark.django_db

LEASE = 120  # the default


@pytest.fixture
def outbox(clock):
    return Outbox("memory", clock=clock)


@pytest.fixture
def platform():
    return connectors["memory"]


def queue(outbox, post_id, container_id="C1", **fields):
    fields = {"workspace_id": "T1", "container_id": container_id, "body": {"text": post_id}} | fields
    assert outbox.queue(post_id, **fields)


def send(clock):
    """One sender run over every due post (the memory platform delivers)."""
    Sender(["memory"], once=True, clock=clock, worker="w1").run()


def texts(platform, container_id="C1"):
    return [m.body.get("text") for m in platform.messages(container_id)]


def row(post_id):
    return Post.objects.with_claim().get(source="memory", post_id=post_id)


def container_order(container_id="C1"):
    """The container's active posts in queue order (how they will be sent)."""
    posts = Post.objects.filter(source="memory", container_id=container_id).in_states(["queued", "sending"])
    return list(posts.order_by("queued_at", "id").values_list("post_id", flat=True))


# -- a queued post becomes cancelled (as cancel_queued) --------------------------------------------


def test_a_queued_post_is_cancelled_and_its_body_dropped_and_never_sent(outbox, platform, clock):
    queue(outbox, "p1")
    assert outbox.retract("p1") is True
    assert outbox.find("p1").state == State.CANCELLED
    assert row("p1").body is None
    assert not Post.objects.filter(kind=Kind.DELETE).exists()  # nothing on the platform to delete
    send(clock)
    assert platform.sent == []


def test_a_queued_reaction_is_cancelled_too(outbox, clock):
    queue(outbox, "r1", kind="reaction", body={"name": "eyes", "timestamp": "1.2"})
    assert outbox.retract("r1") is True
    assert outbox.find("r1").state == State.CANCELLED


# -- a posted one gets a delete queued behind it in its container ----------------------------------


def test_a_posted_post_gets_a_delete_that_the_sender_sends_as_the_platforms_delete(outbox, platform, clock):
    queue(outbox, "p1")
    send(clock)
    ref = outbox.find("p1").message_ref
    assert texts(platform) == ["p1"]

    assert outbox.retract("p1") is True
    delete = row("p1:delete")
    assert (delete.kind, delete.state, delete.message_ref, delete.thread_of) == (
        Kind.DELETE,
        "queued",
        ref,
        "p1",
    )
    assert (delete.workspace_id, delete.container_id, delete.thread_id) == ("T1", "C1", "")
    assert outbox.find("p1").state == State.POSTED  # the post itself stays as it ended

    send(clock)
    assert texts(platform) == []
    assert [m.ref for m in platform.deleted] == [ref]
    assert platform.sent[-1].kind == Kind.DELETE and platform.sent[-1].message_ref == ref
    assert outbox.find("p1:delete").state == State.POSTED


def test_the_delete_keeps_the_place_and_thread_of_its_post(outbox, platform, clock):
    queue(outbox, "p1", container_id="C9", workspace_id="T2", thread_id="123.4")
    send(clock)
    assert outbox.retract("p1")
    delete = row("p1:delete")
    assert (delete.workspace_id, delete.container_id, delete.thread_id) == ("T2", "C9", "123.4")
    send(clock)
    assert platform.sent[-1].thread_id == "123.4"
    assert platform.messages("C9") == []


def test_the_delete_goes_behind_what_its_container_queued_before_the_retract(outbox, platform, clock):
    queue(outbox, "p1")
    send(clock)
    queue(outbox, "p2")
    clock.advance(1)
    assert outbox.retract("p1")
    clock.advance(1)
    queue(outbox, "p3")
    assert container_order() == ["p2", "p1:delete", "p3"]
    send(clock)
    assert [p.post_id for p in platform.sent] == ["p1", "p2", "p1:delete", "p3"]
    assert texts(platform) == ["p2", "p3"]


def test_a_delete_waits_for_its_containers_head_and_other_containers_do_not_wait(outbox, platform, clock):
    queue(outbox, "p1")
    send(clock)
    queue(outbox, "p2")
    queue(outbox, "other", container_id="C2")
    platform.fail_next("down")  # p2, its container's head, is sent back; the delete waits behind it
    assert outbox.retract("p1")
    send(clock)
    assert outbox.find("p1:delete").state == State.QUEUED
    assert texts(platform) == ["p1"] and texts(platform, "C2") == ["other"]
    clock.advance(60)
    send(clock)
    assert texts(platform) == ["p2"]


def test_a_posted_status_is_deleted_and_a_queued_edit_of_it_is_cancelled(outbox, platform, clock):
    outbox.set_status("s1", workspace_id="T1", container_id="C1", body={"text": "v1"})
    send(clock)
    outbox.set_status("s1", workspace_id="T1", container_id="C1", body={"text": "v2"})  # an edit queued
    assert outbox.retract("s1") is True
    assert outbox.find("s1").state == State.CANCELLED  # the edit is never sent
    send(clock)
    assert texts(platform) == []
    assert [p.kind for p in platform.sent] == ["status", "delete"]


# -- a sending one, which then finishes first -------------------------------------------------------


def test_a_sending_post_gets_its_delete_now_and_it_goes_out_once_the_send_is_posted(outbox, platform, clock):
    queue(outbox, "p1")
    [claim] = outbox.claim()
    assert outbox.retract("p1") is True
    assert outbox.find("p1").state == State.SENDING  # the send in flight is not stopped
    assert row("p1:delete").message_ref is None  # not known yet: the send has not finished
    assert outbox.claim() == []  # one post of a container in flight

    assert outbox.posted(claim, "C1:77")
    [delete] = outbox.claim()
    assert delete.kind == Kind.DELETE and delete.parent == Parent("p1", State.POSTED, "C1:77", "")
    assert outbox.posted(delete, "C1:77")
    assert outbox.find("p1:delete") == outbox.find("p1:delete").__class__(State.POSTED, "C1:77")


def test_a_sending_post_whose_send_is_posted_through_the_sender_is_deleted(outbox, platform, clock):
    queue(outbox, "p1")
    platform.lose_next_reply()  # in the source, the reply lost: the post stays sending
    send(clock)
    assert outbox.find("p1").state == State.SENDING
    assert outbox.retract("p1") is True
    clock.advance(LEASE)  # taken back stale, found in the source, recorded posted; then its delete
    send(clock)
    assert outbox.find("p1").state == State.POSTED
    assert outbox.find("p1:delete").state == State.POSTED
    assert texts(platform) == []


@pytest.mark.parametrize("ending", ["refused", "out_of_attempts"])
def test_a_send_that_ends_without_a_message_drops_its_delete(outbox, platform, clock, ending, settings):
    queue(outbox, "p1")
    if ending == "refused":
        platform.fail_next("channel_not_found", permanent=True)
    else:
        settings.CONNECTOR_OUTBOX = settings.CONNECTOR_OUTBOX | {"MAX_ATTEMPTS": 1}
        platform.fail_next("down")
    [claim] = outbox.claim()
    assert outbox.retract("p1") is True
    outbox.retry(claim, reason="down") if ending == "out_of_attempts" else outbox.settle(claim, "failed")
    assert outbox.find("p1").state == State.FAILED

    platform.reset()
    send(clock)
    delete = row("p1:delete")
    assert delete.state == State.CANCELLED and delete.body is None
    assert delete.last_error == "nothing to delete: p1 ended without a message (failed)"
    assert platform.sent == []  # the delete was never handed to the connector
    assert outbox.retract("p1") is False  # failed: it ended without a message


def test_a_dropped_delete_is_counted_and_logged_as_dropped(outbox, platform, clock, package_log):
    queue(outbox, "p1")
    [claim] = outbox.claim()
    assert outbox.retract("p1")
    outbox.settle(claim, "uncertain", reason="could not check")
    sender = Sender(["memory"], once=True, clock=clock, worker="w1")
    sender.run()
    assert sender.stats["dropped"] == 1
    assert "dropped=1" in [r.getMessage() for r in package_log.records if "summary" in r.getMessage()][-1]


def test_a_stale_delete_is_sent_again_without_a_lookup(outbox, platform, clock):
    queue(outbox, "p1")
    send(clock)
    assert outbox.retract("p1")
    platform.lose_next_reply()  # the delete reached the platform, its reply was lost
    send(clock)
    assert outbox.find("p1:delete").state == State.SENDING
    clock.advance(LEASE)

    def no_lookup(post):
        raise AssertionError("a delete is not looked up")

    platform.find_sent = no_lookup
    send(clock)
    assert outbox.find("p1:delete").state == State.POSTED
    assert [p.post_id for p in platform.sent] == ["p1", "p1:delete", "p1:delete"]


def test_a_status_whose_edit_fails_while_retracted_is_deleted_all_the_same(outbox, platform, clock):
    # Its message is on the platform whatever became of the edit: the delete has its ref.
    outbox.set_status("s1", workspace_id="T1", container_id="C1", body={"text": "v1"})
    send(clock)
    outbox.set_status("s1", workspace_id="T1", container_id="C1", body={"text": "v2"})
    [edit] = outbox.claim()
    assert outbox.retract("s1") is True
    assert outbox.settle(edit, "failed", reason="msg_too_long")
    send(clock)
    assert outbox.find("s1:delete").state == State.POSTED
    assert texts(platform) == []


# -- False, and nothing changed ---------------------------------------------------------------------


def test_false_for_a_post_that_does_not_exist(outbox):
    assert outbox.retract("nope") is False
    assert Post.objects.count() == 0


def test_false_for_a_cancelled_post(outbox):
    queue(outbox, "p1")
    assert outbox.cancel_queued("p1")
    assert outbox.retract("p1") is False
    assert not Post.objects.filter(kind=Kind.DELETE).exists()


@pytest.mark.parametrize("state", ["failed", "uncertain"])
def test_false_for_a_post_that_ended_without_a_message(outbox, state):
    queue(outbox, "p1")
    [claim] = outbox.claim()
    outbox.settle(claim, state, reason="gone")
    assert outbox.retract("p1") is False
    assert outbox.find("p1").state == state
    assert Post.objects.count() == 1


@pytest.mark.parametrize(
    ("kind", "body"),
    [("reaction", {"name": "eyes", "timestamp": "1.2"}), ("ephemeral", {"user": "U1", "text": "x"})],
)
def test_false_for_a_reaction_or_an_ephemeral_once_sent(outbox, clock, kind, body):
    # A reaction goes on a person's message, an ephemeral leaves no id: no message of theirs to delete.
    queue(outbox, "p1", kind=kind, body=body)
    send(clock)
    assert outbox.retract("p1") is False
    assert Post.objects.count() == 1


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
@pytest.mark.parametrize("sent", [False, True])
def test_false_and_left_as_it_is_when_the_source_does_not_list_delete(clock, sent):
    outbox = Outbox("memory", clock=clock)
    queue(outbox, "p1")
    if sent:
        send(clock)
    before = outbox.find("p1")
    assert outbox.retract("p1") is False
    assert outbox.find("p1") == before
    assert Post.objects.count() == 1


def test_a_delete_is_never_queued_directly(outbox):
    with pytest.raises(InvalidPost, match="a delete is never queued; retract the post instead"):
        outbox.queue("d1", workspace_id="T1", container_id="C1", kind="delete", body={})


def test_a_delete_is_retracted_never(outbox, clock):
    queue(outbox, "p1")
    send(clock)
    assert outbox.retract("p1")
    assert outbox.retract("p1:delete") is False


def test_a_delete_is_no_parent_for_a_reply(outbox, clock):
    queue(outbox, "p1")
    send(clock)
    assert outbox.retract("p1")
    with pytest.raises(InvalidPost, match="thread_of 'p1:delete' is a delete, which has no thread"):
        outbox.queue("r1", workspace_id="T1", container_id="C1", body={"text": "r"}, thread_of="p1:delete")


# -- idempotent ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("before", ["posted", "sending", "delete_posted", "queued_status_edit"])
def test_a_second_retract_returns_false_and_queues_nothing(outbox, clock, before):
    if before == "queued_status_edit":
        outbox.set_status("p1", workspace_id="T1", container_id="C1", body={"text": "v1"})
        send(clock)
        outbox.set_status("p1", workspace_id="T1", container_id="C1", body={"text": "v2"})
    else:
        queue(outbox, "p1")
        if before == "sending":
            outbox.claim()
        else:
            send(clock)
    assert outbox.retract("p1") is True
    if before == "delete_posted":
        send(clock)
    rows = list(Post.objects.order_by("pk").values_list("post_id", "state", "kind"))
    assert outbox.retract("p1") is False
    assert list(Post.objects.order_by("pk").values_list("post_id", "state", "kind")) == rows


def test_a_callers_own_post_of_the_delete_id_is_left_alone(outbox, platform, clock):
    queue(outbox, "p1")
    queue(outbox, "p1:delete")  # a caller's own message, under the id a delete would take
    send(clock)
    assert outbox.retract("p1") is True
    assert row("p1:delete").kind == Kind.MESSAGE
    assert row("p1:delete:2").kind == Kind.DELETE
    send(clock)
    assert texts(platform) == ["p1:delete"]


def test_the_delete_id_of_a_long_post_id_fits_and_differs_from_another_of_the_same_start():
    a, b = "x" * 250 + "a", "x" * 250 + "b"
    assert all(len(i) <= 255 for i in delete_ids(a) + delete_ids(b))
    assert set(delete_ids(a)).isdisjoint(delete_ids(b))
    assert delete_ids("p1")[:2] == ["p1:delete", "p1:delete:2"]


def test_a_long_post_id_is_retracted(outbox, platform, clock):
    long_id = "x" * 255
    queue(outbox, long_id)
    send(clock)
    assert outbox.retract(long_id) is True
    send(clock)
    assert texts(platform) == []


# -- in the caller's transaction (aretract: tests/test_outbox_async.py) -------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_retract_rolled_back_with_its_transaction_leaves_nothing(outbox, clock):
    queue(outbox, "p1")
    send(clock)
    with pytest.raises(RuntimeError), transaction.atomic():
        assert outbox.retract("p1")
        raise RuntimeError("the caller's business failed")
    assert list(Post.objects.values_list("post_id", flat=True)) == ["p1"]
    assert outbox.retract("p1") is True
