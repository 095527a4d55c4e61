"""Outbox.finish_and_claim: a sender's turn, its finishes and its next claim in one transaction.

On every backend through the store that serves it (PostgreSQL's own statements, in one round
trip; the ORM store elsewhere, and with STORE "orm"); the differential tests hold the two to
the same results over drawn operations. What these tests pin down: a container finished in
the turn hands its next head to the turn's own claim, fencing holds, and a place held by a
finish is held from the claim of the same turn.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any
from unittest import mock

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.test import override_settings

from django_connector_outbox import Outbox
from django_connector_outbox.conf import conf
from django_connector_outbox.models import Gate, Post
from django_connector_outbox.posts import Action, Finish, Scope
from django_connector_outbox.sender import Sender
from django_connector_outbox.store import PostgresStore
from tests.harness import ManualExecutor

pytestmark = pytest.mark.django_db


@pytest.fixture
def outbox(clock):
    with override_settings(CONNECTOR_OUTBOX={**settings.CONNECTOR_OUTBOX, "RETRY_JITTER": 0}):
        yield Outbox("memory", clock=clock)


def queue(outbox: Outbox, post_id: str, container_id: str, workspace_id: str = "W") -> None:
    assert outbox.queue(post_id, workspace_id=workspace_id, container_id=container_id, body={"id": post_id})


def posted(claim: Any) -> tuple[Any, Finish]:
    return claim, Finish(claim.post_id, claim.lease_token, Action.POSTED, message_ref=f"ref-{claim.post_id}")


def states() -> dict[str, str]:
    return dict(Post.objects.with_claim().values_list("post_id", "current_state"))


def test_a_finished_containers_next_head_is_claimed_in_the_same_turn(outbox):
    for post_id, container in (("a1", "A"), ("a2", "A"), ("b1", "B"), ("b2", "B")):
        queue(outbox, post_id, container)
    claims = outbox.claim(10, worker="w")
    assert sorted(c.post_id for c in claims) == ["a1", "b1"]

    recorded, next_claims = outbox.finish_and_claim([posted(c) for c in claims], 10, worker="w")

    assert [f is not None and f.recorded for f in recorded] == ["posted", "posted"]
    assert sorted(c.post_id for c in next_claims) == ["a2", "b2"]
    assert states() == {"a1": "posted", "b1": "posted", "a2": "sending", "b2": "sending"}


def test_a_claim_taken_back_meanwhile_is_fenced_and_the_turn_claims_on(outbox, clock):
    queue(outbox, "a1", "A")
    queue(outbox, "a2", "A")
    [old] = outbox.claim(1, worker="w1")
    clock.advance(121)  # its lease ended: another sender takes it back, stale
    [current] = outbox.claim(1, worker="w2")
    assert (current.post_id, current.stale) == ("a1", True)

    recorded, claims = outbox.finish_and_claim([posted(old)], 10, worker="w1")

    assert recorded == [None]
    assert claims == []  # a1 is still w2's: its container has nothing else to claim
    assert states() == {"a1": "sending", "a2": "queued"}


def test_a_turn_with_no_room_records_and_claims_nothing(outbox):
    queue(outbox, "a1", "A")
    queue(outbox, "a2", "A")
    claims = outbox.claim(1, worker="w")

    recorded, next_claims = outbox.finish_and_claim([posted(c) for c in claims], 0, worker="w")

    assert [f.recorded for f in recorded if f] == ["posted"]
    assert next_claims == []
    assert states() == {"a1": "posted", "a2": "queued"}


def test_a_turn_without_results_is_a_claim(outbox):
    queue(outbox, "a1", "A")
    recorded, claims = outbox.finish_and_claim([], 5, worker="w")
    assert (recorded, [c.post_id for c in claims]) == ([], ["a1"])


def test_a_wait_announced_with_a_success_holds_the_container_from_the_same_turns_claim(outbox):
    queue(outbox, "a1", "A")
    queue(outbox, "a2", "A")
    queue(outbox, "b1", "B")
    queue(outbox, "b2", "B")
    claims = {c.container_id: c for c in outbox.claim(10, worker="w")}
    waited = Finish(
        claims["A"].post_id,
        claims["A"].lease_token,
        Action.POSTED,
        wait=30,
        reason="slow down",
        scope=Scope.CONTAINER,
    )

    recorded, next_claims = outbox.finish_and_claim(
        [(claims["A"], waited), posted(claims["B"])], 10, worker="w"
    )

    assert [f.recorded for f in recorded if f] == ["posted", "posted"]
    assert [c.post_id for c in next_claims] == ["b2"]  # A's gate is in force for this claim
    assert Gate.objects.filter(scope=Scope.CONTAINER, container_id="A").exists()


def test_a_workspace_hold_holds_its_other_containers_from_the_same_turns_claim(outbox):
    queue(outbox, "a1", "A", workspace_id="W1")
    queue(outbox, "c1", "C", workspace_id="W1")
    queue(outbox, "b1", "B", workspace_id="W2")
    [a1] = outbox.claim(1, worker="w")
    assert a1.post_id == "a1"
    hold = Finish(a1.post_id, a1.lease_token, Action.HOLD, wait=30, reason="429", scope=Scope.WORKSPACE)

    recorded, claims = outbox.finish_and_claim([(a1, hold)], 10, worker="w")

    assert [f.recorded for f in recorded if f] == ["held"]
    assert [c.post_id for c in claims] == ["b1"]


def test_a_claim_given_back_is_claimed_again_in_the_same_turn(outbox):
    queue(outbox, "a1", "A")
    [a1] = outbox.claim(1, worker="w")
    give_back = Finish(a1.post_id, a1.lease_token, Action.GIVE_BACK, reason="given back: the lease ends")

    recorded, claims = outbox.finish_and_claim([(a1, give_back)], 1, worker="w")

    assert [f.recorded for f in recorded if f] == ["given_back"]
    assert [(c.post_id, c.attempts) for c in claims] == [("a1", 1)]  # the given-back try is not counted


# -- PostgreSQL: one round trip -------------------------------------------------------------------------


@contextmanager
def round_trips():
    """The statements run through the PostgreSQL store's cursors and Django's, as a list of round
    trips: each a list of statements (several when they went in one pipeline)."""
    import psycopg

    from django_connector_outbox.store import postgres

    trips: list[list[str]] = []
    real_cursor, real_pipeline = postgres.cursor, psycopg.Connection.pipeline

    @contextmanager
    def pipeline(self: psycopg.Connection[Any]) -> Any:
        trips.append([])
        with real_pipeline(self) as p:
            yield p

    class Counted:
        def __init__(self, cursor: Any) -> None:
            self.cursor = cursor

        def execute(self, query: str, *args: Any, **kwargs: Any) -> Any:
            in_pipeline = self.cursor.connection.pgconn.pipeline_status != psycopg.pq.PipelineStatus.OFF
            if not in_pipeline:
                trips.append([])
            trips[-1].append(query.split()[0] + " " + query.split()[1])
            return self.cursor.execute(query, *args, **kwargs)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.cursor, name)

    @contextmanager
    def counted_cursor(using: str) -> Any:
        with real_cursor(using) as c:
            yield Counted(c)

    def django_statement(execute: Any, sql: str, *args: Any) -> Any:
        trips.append([sql.split()[0]])
        return execute(sql, *args)

    with (
        mock.patch.object(postgres, "cursor", counted_cursor),
        mock.patch.object(psycopg.Connection, "pipeline", pipeline),
        connection.execute_wrapper(django_statement),
    ):
        yield trips


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's store pipelines its statements")
def test_on_postgresql_a_turn_is_one_round_trip(outbox):
    if not isinstance(outbox.store, PostgresStore):
        pytest.skip("STORE is 'orm'")
    for post_id, container in (("a1", "A"), ("a2", "A"), ("b1", "B"), ("b2", "B")):
        queue(outbox, post_id, container)
    claims = outbox.claim(10, worker="w")

    with round_trips() as trips, transaction.atomic(savepoint=False):
        recorded, next_claims = outbox.finish_and_claim([posted(c) for c in claims], 10, worker="w")

    assert len(trips) == 1, trips
    [statements] = trips
    assert len(statements) == 3  # the lane locks, FINISH and CLAIM, each a statement of its own
    assert sorted(c.post_id for c in next_claims) == ["a2", "b2"]


def lane_writes() -> int:
    """Lane rows this transaction has updated so far (PostgreSQL's own count)."""
    with connection.cursor() as c:
        c.execute("SELECT n_tup_upd FROM pg_stat_xact_user_tables WHERE relname = 'django_connector_outbox_lane'")
        return c.fetchone()[0]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the PostgreSQL store's hand-off")
def test_on_postgresql_a_lane_finished_and_claimed_again_in_a_turn_is_written_once(outbox):
    if not isinstance(outbox.store, PostgresStore):
        pytest.skip("STORE is 'orm'")
    for post_id, container in (("a1", "A"), ("a2", "A"), ("b1", "B"), ("b2", "B"), ("c1", "C")):
        queue(outbox, post_id, container)
    claims = outbox.claim(2, worker="w")  # a1 and b1; c1 waits
    assert sorted(c.post_id for c in claims) == ["a1", "b1"]
    with transaction.atomic(savepoint=False):
        before = lane_writes()
        recorded, next_claims = outbox.finish_and_claim([posted(c) for c in claims], 10, worker="w")
        # A and B: released and leased again in one write each; C: leased by the claim.
        assert lane_writes() - before == 3
    assert all(recorded)
    assert [c.post_id for c in next_claims] == ["a2", "b2", "c1"]  # claim order, as the ORM's
    assert len({c.lease_token for c in next_claims}) == 1
    assert states() == {"a1": "posted", "b1": "posted", "a2": "sending", "b2": "sending", "c1": "sending"}
    # The hand-off is a claim like any: its leases are fenced and finish as the others.
    recorded, _ = outbox.finish_and_claim([posted(c) for c in next_claims], 10, worker="w")
    assert all(recorded) and set(states().values()) == {"posted"}


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the PostgreSQL store's hand-off")
def test_on_postgresql_a_turn_hands_off_no_more_heads_than_its_limit(outbox):
    for post_id, container in (("a1", "A"), ("a2", "A"), ("b1", "B"), ("b2", "B")):
        queue(outbox, post_id, container)
    claims = outbox.claim(10, worker="w")

    recorded, next_claims = outbox.finish_and_claim([posted(c) for c in claims], 1, worker="w")

    assert all(recorded) and len(next_claims) == 1
    assert sorted(states().values()) == ["posted", "posted", "queued", "sending"]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the PostgreSQL store's hand-off")
def test_on_postgresql_a_reply_whose_parent_was_posted_in_the_turn_is_claimed_with_it(outbox):
    assert outbox.queue("p", workspace_id="W", container_id="A", body={"text": "p"})
    assert outbox.queue("r", workspace_id="W", container_id="A", body={"text": "r"}, thread_of="p")
    [claim] = outbox.claim(10, worker="w")

    _, [reply] = outbox.finish_and_claim([posted(claim)], 10, worker="w")

    assert reply.post_id == "r"
    assert reply.parent is not None and reply.parent.state == "posted" and reply.parent.message_ref == "ref-p"


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's store pipelines its statements")
def test_on_postgresql_a_senders_turn_is_one_round_trip(clock):
    outbox = Outbox("memory", clock=clock)
    if not isinstance(outbox.store, PostgresStore):
        pytest.skip("STORE is 'orm'")
    for post_id, container in (("a1", "A"), ("a2", "A"), ("b1", "B"), ("b2", "B")):
        queue(outbox, post_id, container)
    executor = ManualExecutor()
    sender = Sender(["memory"], clock=clock, executor=executor, concurrency=2)
    sender.turn()  # the first claims (and the run's first housekeeping)
    executor.run_all()

    with round_trips() as trips:
        # a1 and b1 recorded, a2 and b2 claimed: every slot busy, until a send ends or a lease is renewed
        assert sender.turn() == conf.LEASE / 2

    assert [len(statements) for statements in trips] == [3]
    assert states() == {"a1": "posted", "b1": "posted", "a2": "sending", "b2": "sending"}
    executor.run_all()
    sender.close()
