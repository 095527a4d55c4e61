"""Ids are compared exactly on every database: "p1", "p1 " and "P1" are three ids (issue 9, hole 10).

MariaDB's default binary collation (utf8mb4_bin) is PAD SPACE, so these tests are there for it
above all; they run on every backend, since the contract holds on every backend.
"""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection

from django_connector_outbox import Outbox
from django_connector_outbox.models import Lane, Post

pytestmark = pytest.mark.django_db

# An id and another one that a PAD SPACE or case-insensitive collation would take for it.
TWINS = [("p1", "p1 "), ("p1", "p1  "), ("p1", "P1"), ("p 1", "p 1 ")]


@pytest.fixture
def outbox(clock):
    return Outbox("memory", clock=clock)


def queue(outbox, post_id, container_id="C1", workspace_id="T1", **fields):
    return outbox.queue(
        post_id, workspace_id=workspace_id, container_id=container_id, body={"id": post_id}, **fields
    )


@pytest.mark.parametrize(("first", "second"), TWINS)
def test_post_ids_that_differ_by_trailing_spaces_or_case_are_two_posts(outbox, first, second):
    assert queue(outbox, first) is True
    assert queue(outbox, second) is True
    assert sorted(Post.objects.values_list("post_id", "body")) == sorted(
        [(first, {"id": first}), (second, {"id": second})]
    )
    assert queue(outbox, second) is False  # still idempotent, exactly


@pytest.mark.parametrize(("first", "second"), TWINS)
def test_queue_many_queues_both_twins_of_one_batch(outbox, first, second):
    posts = [{"post_id": p, "workspace_id": "T1", "container_id": "C1", "body": {}} for p in (first, second)]
    assert outbox.queue_many(posts) == 2
    assert sorted(Post.objects.values_list("post_id", flat=True)) == sorted([first, second])


@pytest.mark.parametrize("field", ["container_id", "workspace_id"])
@pytest.mark.parametrize(("first", "second"), TWINS)
def test_places_that_differ_by_trailing_spaces_or_case_are_two_containers(outbox, field, first, second):
    queue(outbox, "a", **{"container_id": "C1", "workspace_id": "T1", field: first})
    queue(outbox, "b", **{"container_id": "C1", "workspace_id": "T1", field: second})
    assert Lane.objects.count() == 2
    # Two containers, so both posts are heads and are claimed together.
    assert sorted(c.post_id for c in outbox.claim()) == ["a", "b"]
    assert sorted(Post.objects.values_list(field, flat=True)) == sorted([first, second])


@pytest.mark.parametrize(("first", "second"), TWINS)
def test_set_status_never_overwrites_a_status_whose_id_differs_by_trailing_spaces_or_case(
    outbox, first, second
):
    outbox.set_status(first, workspace_id="T1", container_id="C1", body={"text": "first"})
    outbox.set_status(second, workspace_id="T1", container_id="C1", body={"text": "second"})
    assert Post.objects.get(post_id=first).body == {"text": "first"}
    assert Post.objects.get(post_id=second).body == {"text": "second"}
    assert {p.rev for p in Post.objects.all()} == {0}


@pytest.mark.parametrize(("first", "second"), TWINS)
def test_turn_keys_are_compared_exactly(outbox, first, second):
    queue(outbox, "reply:1", turn_key=first)
    assert outbox.has_reply_for_turn(first) is True
    assert outbox.has_reply_for_turn(second) is False


@pytest.mark.parametrize("post_id", ["REPLY:1", "Reply:1", "rePly:1", "reply"])
def test_the_reply_prefix_is_compared_exactly(outbox, post_id):
    # SQLite's LIKE (what `startswith` is there) ignores the case of ASCII letters.
    queue(outbox, post_id, turn_key="t")
    assert outbox.has_reply_for_turn("t") is False
    assert outbox.has_reply_for_turn("t", prefix=post_id) is True
    assert outbox.has_reply_for_turn("t", prefix=post_id + " ") is False  # no padding either


@pytest.mark.parametrize(("first", "second"), TWINS)
def test_find_and_cancel_look_ids_up_exactly(outbox, first, second):
    queue(outbox, first)
    assert outbox.find(second) is None
    assert outbox.cancel_queued(second) is False
    assert Post.objects.get(post_id=first).state == "queued"


# -- the queue never loops on an IntegrityError (issue 9, hole 10) ------------------------------

REFUSE_POST = {
    "sqlite": [
        "CREATE TRIGGER outbox_test_refuse BEFORE INSERT ON django_connector_outbox_post "
        "WHEN NEW.post_id = 'refused' BEGIN SELECT RAISE(ABORT, 'refused by a test trigger'); END"
    ],
    "mysql": [
        "CREATE TRIGGER outbox_test_refuse BEFORE INSERT ON django_connector_outbox_post FOR EACH ROW "
        "BEGIN IF NEW.post_id = 'refused' THEN "
        "SIGNAL SQLSTATE '23000' SET MESSAGE_TEXT = 'refused by a test trigger', MYSQL_ERRNO = 1062; "
        "END IF; END"
    ],
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(
    connection.vendor == "postgresql",
    reason="PostgreSQL queues in one ON CONFLICT statement, with no retry loop",
)
def test_an_integrity_error_that_is_not_a_concurrent_queue_is_raised_not_retried_for_ever(outbox):
    with connection.cursor() as cursor:
        for statement in REFUSE_POST[connection.vendor]:
            cursor.execute(statement)
    try:
        with pytest.raises(IntegrityError, match="refused by a test trigger"):
            queue(outbox, "refused")
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER outbox_test_refuse")
    assert not Post.objects.exists()
