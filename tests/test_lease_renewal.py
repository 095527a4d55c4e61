"""A sender renews the leases of its claims in flight before they end (leases.py).

Driven turn by turn on a fake clock, with deliveries that run when the test says (the
executor seam): a send that outlives its first lease is still sent under the renewed one; a
lease that has ended is never renewed, and its claim is given back unsent.
"""

from __future__ import annotations

import math
from datetime import timedelta

import pytest

from django_connector_outbox import Outbox
from django_connector_outbox.connectors import connectors
from django_connector_outbox.models import Lane
from django_connector_outbox.sender import Sender
from tests.harness import ManualExecutor
from tests.test_sender import LEASE, queue, row, with_backend

pytestmark = pytest.mark.django_db


def lease_end(post_id: str):
    return Lane.objects.get(head__post_id=post_id).due_at


def test_a_send_in_flight_past_half_its_lease_is_sent_under_the_renewed_lease(clock):
    with with_backend("tests.test_sender.TimedMemoryConnector"):
        queue(Outbox("memory", clock=clock), "p1")
        executor = ManualExecutor()
        sender = Sender(["memory"], clock=clock, executor=executor)
        sender.turn()  # claimed; its delivery waits (a slow thread, a lookup before it)
        first_end = lease_end("p1")

        clock.advance(LEASE * 0.6)
        sender.turn()

        assert lease_end("p1") == clock() + timedelta(seconds=LEASE)
        clock.advance(LEASE * 0.6)  # past the first lease's end, well within the renewed one
        executor.run_all()
        sender.turn()

        assert clock() > first_end
        assert [p.post_id for p in connectors["memory"].sent] == ["p1"]  # type: ignore[attr-defined]
        assert row("p1").current_state == "posted"


def test_a_lease_with_more_than_half_left_is_not_written(clock):
    with with_backend("tests.test_sender.TimedMemoryConnector"):
        queue(Outbox("memory", clock=clock), "p1")
        sender = Sender(["memory"], clock=clock, executor=ManualExecutor())
        sender.turn()
        end = lease_end("p1")

        clock.advance(LEASE * 0.4)
        sender.turn()

        assert lease_end("p1") == end


def test_a_lease_that_has_ended_is_not_renewed_and_its_claim_is_given_back_unsent(clock):
    with with_backend("tests.test_sender.TimedMemoryConnector"):
        queue(Outbox("memory", clock=clock), "p1")
        executor = ManualExecutor()
        sender = Sender(["memory"], clock=clock, executor=executor)
        sender.turn()
        end = lease_end("p1")

        clock.advance(LEASE + 1)  # the sender was stopped in its tracks (a long GC, a paused VM)
        assert sender.leases.renew(clock()) == 0
        executor.run_all()

        assert lease_end("p1") == end
        assert connectors["memory"].sent == []  # type: ignore[attr-defined]
        assert sender.leases.until_renewal(clock()) is None  # not asked for again
        sender.turn()
        assert row("p1").last_error == "given back: the lease ends before a send could"


def test_a_lease_taken_back_by_another_sender_is_not_renewed(clock):
    with with_backend("tests.test_sender.TimedMemoryConnector"):
        queue(Outbox("memory", clock=clock), "p1")
        sender = Sender(["memory"], clock=clock, executor=ManualExecutor())
        sender.turn()
        clock.advance(LEASE + 1)
        [stale] = Outbox("memory", clock=clock).claim(worker="w2")  # taken back, under a new lease

        assert sender.leases.renew(clock()) == 0
        assert lease_end("p1") == stale.lease_until


def test_a_sender_with_every_slot_busy_wakes_for_the_renewal(clock):
    with with_backend("tests.test_sender.TimedMemoryConnector"):
        queue(Outbox("memory", clock=clock), "p1")
        sender = Sender(["memory"], clock=clock, executor=ManualExecutor(), concurrency=1)

        pause = sender.turn()

        assert pause is not None and not math.isinf(pause)
        assert pause == pytest.approx(LEASE / 2)


def test_renew_leases_extends_only_the_running_leases_of_the_tokens_given(clock):
    outbox = Outbox("memory", clock=clock)
    for post_id, container in (("a", "A"), ("b", "B")):
        queue(outbox, post_id, container)
    [a] = outbox.claim(1, worker="w")
    clock.advance(LEASE + 1)
    [b] = outbox.claim(1, worker="w")  # b's lane is due first; a's lease has ended
    assert b.post_id == "b"

    renewed, until = outbox.renew_leases([a.lease_token, b.lease_token, "no-such-token"])

    assert renewed == {b.lease_token}
    assert until == clock() + timedelta(seconds=LEASE)
    assert lease_end("b") == until and lease_end("a") == a.lease_until
