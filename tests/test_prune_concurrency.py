"""Lanes pruned while producers queue into them, in real OS processes (PostgreSQL, MySQL/MariaDB).

Three producers queue posts into 200 containers as fast as they can; a sender delivers them
and prunes them at once (retention 0), so that the containers' lanes are left without posts
over and over; a pruner walks the lanes and deletes every idle one (tests/prune_worker.py).
A producer finds its lane by a plain read and then locks it: a lane deleted in between must be
made again, never lose the post (PostgreSQL's LOCK_PLACES and QUEUE: a post inserted only
where it joins a lane) nor fail the producer's transaction (the ORM store: a post inserted
into a lane that is gone breaks the foreign key at the commit). Then, from what each process
recorded and the rows:

- every producer's call got its answer: no error, and every new id queued;
- every post queued was delivered exactly once, or is still queued with a lane of its place
  whose head is right (`repair_lanes` finds nothing to repair), and a last drain delivers it;
- lanes were deleted during the run, many times (else the test proved nothing).
"""

from __future__ import annotations

import json
import multiprocessing
from collections import Counter

import pytest
from django.db import connection

from django_connector_outbox import Outbox
from django_connector_outbox.models import Lane, Post
from tests import prune_worker

pytestmark = [
    pytest.mark.budget,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor == "sqlite",
        reason="SQLite serializes writers with one database lock: a lane cannot be deleted between a "
        "producer's read and its lock; run with DATABASE_URL pointing at PostgreSQL or MySQL/MariaDB",
    ),
]

PRODUCERS = 3
TRANSACTIONS = 150  # per producer
RUN_SECONDS = 120  # the sender and the pruner give up after this long (the test then fails)


def run_processes(tmp_path) -> list[dict]:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PRODUCERS + 3)
    producers_done = ctx.Event()
    db_name = connection.settings_dict["NAME"]
    paths = [tmp_path / f"process-{i}.json" for i in range(PRODUCERS + 2)]
    producers = [
        ctx.Process(target=prune_worker.produce, args=(i, db_name, barrier, str(paths[i]), TRANSACTIONS))
        for i in range(PRODUCERS)
    ]
    others = [
        ctx.Process(target=target, args=(db_name, barrier, str(path), producers_done, RUN_SECONDS))
        for target, path in ((prune_worker.send, paths[-2]), (prune_worker.prune, paths[-1]))
    ]
    connection.close()  # nothing of the test's stays open while they run
    for process in producers + others:
        process.start()
    try:
        barrier.wait(timeout=120)
        for process in producers:
            process.join(RUN_SECONDS)
        producers_done.set()
        for process in others:
            process.join(RUN_SECONDS)
    finally:
        for process in producers + others:
            if process.is_alive():
                process.terminate()
                process.join(5)
    assert [p.exitcode for p in producers + others] == [0] * (PRODUCERS + 2)
    results = [json.loads(path.read_text()) for path in paths]
    for result in results:
        assert result["errors"] == [], f"{result['role']} failed:\n{result['errors'][0]}"
    return results


def test_no_post_is_lost_when_its_lane_is_pruned_while_it_is_queued(tmp_path):
    results = run_processes(tmp_path)
    *producers, sender, pruner = results
    queued = [post_id for result in producers for post_id in result["queued"]]
    print(
        f"\n{connection.vendor}: {len(queued)} posts queued by {PRODUCERS} producers, "
        f"{len(sender['delivered'])} delivered and {sender['posts_pruned']} pruned during the run, "
        f"{sender['lanes_pruned'] + pruner['lanes_pruned']} lanes pruned ({pruner['walks']} walks of the "
        f"pruner; deadlocks of the sender's and the pruner's: {sender.get('deadlocks', 0) + pruner.get('deadlocks', 0)})"
    )
    assert sender["finished"] and pruner["finished"], "the sender or the pruner ran out of time"
    assert [post_id for result in producers for post_id in result["refused"]] == []
    assert len(queued) >= PRODUCERS * TRANSACTIONS
    assert sender["lanes_pruned"] + pruner["lanes_pruned"] >= 50

    # What is left is consistent: each post in the lane of its place, each lane's head right.
    outbox = Outbox("memory")
    assert outbox.repair_lanes(limit=1000)[1] == []
    for post in Post.objects.select_related("lane"):
        assert (post.lane.workspace_id, post.lane.container_id) == (post.workspace_id, post.container_id)
    left = set(Post.objects.filter(state="queued").values_list("post_id", flat=True))

    delivered = list(sender["delivered"])
    while claims := outbox.claim():
        for claim in claims:
            assert outbox.posted(claim)
            delivered.append(claim.post_id)
    assert [post_id for post_id, n in Counter(delivered).items() if n > 1] == []
    assert sorted(delivered) == sorted(queued)
    assert left <= set(queued)
    assert Lane.objects.exclude(lease_token="").count() == 0
