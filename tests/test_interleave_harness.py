"""The interleaving explorer's scheduler (tests/simulation/interleave.py) on its own: no database."""

from __future__ import annotations

import threading
import time
from unittest import mock

from tests.simulation import interleave
from tests.simulation.interleave import Run, World


def test_waiting_for_a_change_ends_when_the_blocked_actors_end():
    """Every actor left is running, taken for a lock wait (SLOW on a loaded machine, or the
    server's report), and each one's step is its last: they end (done) without asking for a
    statement again. The scheduler goes on to its end then, rather than waiting STUCK for an
    actor to ask (seed 500025 of the PostgreSQL explorer, under load)."""
    run = Run(World(("producer", "sender"), ()), [], None, None)
    for actor in run.actors:
        actor.state, actor.blocked = "running", True

    def end() -> None:
        for actor in run.actors:
            with run.cond:
                actor.state = "done"
                run.cond.notify_all()

    ender = threading.Thread(target=end)
    started = time.monotonic()
    with mock.patch.object(interleave, "STUCK", 3.0):
        ender.start()
        run.wait_for_change()
    ender.join()
    assert time.monotonic() - started < 2.0
