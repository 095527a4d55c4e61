"""The interleaving explorer in CI: a fixed budget of interleavings per backend, and proof
that it finds holes 2 and 3 of issue 18 when their code is put back.

Each interleaving runs producers, operators, senders and housekeeping as threads on their own
connections, one SQL statement at a time in an order the scheduler picks, with real locks
(tests/simulation/interleave.py). A failure is shrunk and reported with its replay command:

    python bench/interleave.py --seed S --schedule 3,1,t31,0 [--ops ...] [--database-url URL]

INTERLEAVINGS and INTERLEAVE_SEED change the budget and the first seed of a run.
"""

from __future__ import annotations

import os
import time
from unittest import mock

import pytest
from django.db import connection

from django_connector_outbox.store import OrmStore
from tests.simulation import mutants
from tests.simulation.interleave import Summary, explore

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# About a minute per backend on a two-core machine shared with other work (measured:
# SQLite 0.25-0.45 interleavings/s, PostgreSQL 0.5-1.3, MariaDB 0.65), and never past
# SECONDS: whatever ran by then counts.
BUDGET = {"sqlite": 8, "postgresql": 60, "mysql": 45}
SECONDS = 100.0
INTERLEAVINGS = int(os.environ.get("INTERLEAVINGS", BUDGET[connection.vendor]))
FIRST_SEED = int(os.environ.get("INTERLEAVE_SEED", "0"))
# What hole 2 breaks, depending on the interleaving: the cancelled post is sent, or was being
# sent, or its lane is left with a head or a lease its posts do not give, or the cancel
# deadlocks (it writes the post, then its lane, which it had not locked: CHANGELOG).
HOLE_2 = {
    "a post reported cancelled is never sent",
    "a post being sent is not cancelled",
    "a lane agrees with its posts",
    "a lease stays on the post it was claimed for",
}
# A mutant must be found within this many interleavings (measured on this branch, where
# the mutants are the code: hole 2 at the 2nd to 8th with the SQL store, the 8th with the ORM
# store, once not within 40; hole 3 at the 1st to 17th on MariaDB). Lock waits are timed, so
# a seed does not always play the same interleaving: the budget is kept wide.
SMALL_BUDGET = 100


def test_a_budget_of_interleavings_keeps_every_invariant():
    reports: list[str] = []
    summary = explore(
        range(FIRST_SEED, FIRST_SEED + INTERLEAVINGS),
        deadline=time.monotonic() + SECONDS,
        report=reports.append,
        stop_at_first=True,  # shrinking it takes long enough
        shrink_budget=60,
    )

    print(summary.line())
    assert summary.interleavings >= min(INTERLEAVINGS, 10) or summary.failures
    assert summary.stats["sends"] > summary.interleavings  # the interleavings do send
    assert not summary.errors, "\n".join(reports)
    assert not summary.failures, "\n".join(reports)


def first_failure(patches: dict[str, object]) -> Summary:
    with mock.patch.multiple(OrmStore, **patches):
        return explore(
            range(SMALL_BUDGET),
            deadline=time.monotonic() + SECONDS,
            stop_at_first=True,
            shrink_budget=0,
            report=print,
        )


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="hole 2 was seen on PostgreSQL (both stores) only"
)
def test_the_explorer_finds_a_cancel_that_misses_the_head_a_sender_is_finishing():
    summary = first_failure(mutants.HOLE_2)

    print(f"hole 2 found at interleaving {summary.first_failure_at}: {summary.line()}")
    assert summary.failures, f"not found in {summary.interleavings} interleavings"
    failure = summary.failures[0].failure
    # The hole's old cancel also deadlocks with a producer (the real code does not: the budget
    # test above); PostgreSQL aborts whichever of the two its deadlock check runs in first.
    assert failure.invariant in HOLE_2 or (
        failure.invariant == "no error reaches a producer's or an operator's call"
        and ("(operator) cancel" in failure.detail or "(producer)" in failure.detail)
        and "deadlock" in failure.detail
    ), failure


@pytest.mark.skipif(connection.vendor != "mysql", reason="hole 3 is MariaDB's duplicate-key locking")
def test_the_explorer_finds_producers_deadlocked_into_their_callers_transaction():
    summary = first_failure(mutants.HOLE_3)

    print(f"hole 3 found at interleaving {summary.first_failure_at}: {summary.line()}")
    assert summary.failures, f"not found in {summary.interleavings} interleavings"
    failure = summary.failures[0].failure
    assert failure.invariant == "no error reaches a producer's or an operator's call"
    assert "Deadlock" in failure.detail or "Lock wait" in failure.detail
