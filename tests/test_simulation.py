"""The schedule explorer in CI: a fixed budget of seeded schedules per backend, and the
minimal schedule of every defect it found, kept as a regression test.

Each schedule runs real Senders (ManualExecutor, FakeClock) on this test database against a
simulated platform, with kills between statements, dropped connections, stops, lost replies,
rate limits and producers, then drains and checks the invariants (tests/simulation/explorer.py).
A failure is shrunk and reported with its replay command:

    python bench/simulate.py --seed S --events 3,7,12 --trace [--database-url URL]

SIM_SCHEDULES and SIM_SEED change the budget and the first seed of a run.
"""

from __future__ import annotations

import os

import pytest
from django.db import connection

from tests.simulation.explorer import KNOWN_DEFECTS, explore, replay_command, run_schedule

pytestmark = pytest.mark.django_db(transaction=True)

# About a minute per backend on a two-core machine (measured: SQLite 1.2-2.9 schedules/s,
# PostgreSQL 1.6-2, MariaDB 1.0-1.2, the lower figures on a busy machine).
BUDGET = {"sqlite": 150, "postgresql": 120, "mysql": 80}
SCHEDULES = int(os.environ.get("SIM_SCHEDULES", BUDGET[connection.vendor]))
FIRST_SEED = int(os.environ.get("SIM_SEED", "0"))


@pytest.mark.budget
def test_a_budget_of_seeded_schedules_keeps_every_invariant():
    reports: list[str] = []
    summary = explore(range(FIRST_SEED, FIRST_SEED + SCHEDULES), report=reports.append)

    print(summary.line())
    assert summary.schedules == SCHEDULES
    assert summary.sends > SCHEDULES  # the schedules do send
    assert not summary.failures, "\n".join(reports)


# Worlds where a third of the posts reply (`thread_of`) to an earlier message or status of their
# container: a reply never lands outside its parent's thread, nor before its parent, whatever
# the kills, lost replies and lookups (platform.py checks each reply as it is created; a lookup
# in the wrong thread would send it twice). About a minute per backend too.
THREAD_BUDGET = {"sqlite": 40, "postgresql": 40, "mysql": 25}


@pytest.mark.budget
def test_a_budget_of_schedules_with_replies_keeps_every_invariant():
    reports: list[str] = []
    schedules = int(os.environ.get("SIM_SCHEDULES", THREAD_BUDGET[connection.vendor]))
    seeds = range(FIRST_SEED, FIRST_SEED + schedules)
    summary = explore(seeds, report=reports.append, threads=True)

    print(summary.line())
    assert summary.stats["reply created"] + summary.stats["drain reply created"] > schedules
    assert not summary.failures, "\n".join(reports)


def test_a_schedule_with_replies_lands_each_in_its_thread_after_its_parent():
    result = run_schedule(0, threads=True)

    assert result.failure is None, f"{result.failure}\n{replay_command(result)}"
    assert result.stats["replies queued"] > 0
    assert result.stats["reply created"] + result.stats["drain reply created"] > 0


# -- defects found by the explorer: each one's minimal schedule, kept as a regression test --------
# (A defect not fixed yet gets xfail(strict=True) here and an entry in KNOWN_DEFECTS.)


def replays_clean(seed: int, events: list[int]) -> None:
    result = run_schedule(seed, events)  # no known defect tolerated
    assert result.failure is None, f"{result.failure}\n{replay_command(result)}"


def test_a_connection_dropped_while_the_sender_asks_the_next_due_time_is_survived():
    # A connection drop armed for a sender's next turn, at its 7th statement: with nothing
    # queued, that is the idle next-due query (after housekeeping and an empty claim). It used
    # to escape turn(), and run_outbox exited.
    replays_clean(12, [16, 25])


def test_a_reply_lost_on_the_last_attempt_holds_its_container_until_the_lease_ends():
    # Status s01's first send raises (retried); its second claim's lease runs out before the
    # send starts, another sender takes it back stale (attempt 3 of 3), looks it up (not
    # there), sends it and loses the reply. It used to be uncertain at once, and m0003 of its
    # container went out while s01's request could still be in flight; now the container waits
    # for s01's lease to end and its lookup.
    replays_clean(7, [1, 2, 4, 5, 6, 7, 19, 27, 28, 30, 34, 35, 51, 52])


def test_a_send_after_its_first_leases_end_under_a_renewed_lease_is_its_own():
    # A sender claims s11 at t=0 (lease until t=30); its thread has not started the delivery
    # when the sender's turn at t=20 renews the lease (to t=50), and the send starts at t=30,
    # where the first lease ended. The platform checked a claim against the lease it was made
    # with (a false report); it checks the row's lease now, the one that fences.
    replays_clean(69, [3, 7, 8, 22, 23, 24, 28])


def test_every_known_defect_has_a_regression_test_here():
    assert set(KNOWN_DEFECTS) == set()  # none open; each found one's schedule is kept above
