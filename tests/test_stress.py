"""Producers, an operator and a sender at once, in real processes (issue 18).

A real `run_outbox` drains one busy container while another process cancels the posts right
behind its head each time the head moves on (now and then the head itself), and 6 producer processes queue at once, round
after round, each call in a transaction of theirs: a queue_many batch into shared containers
(the same ids in every producer), the first post of a new container (the same container in
every producer), one id that every producer queues into a container of its own, and posts into
the busy container. Then, from what the platform file and the processes recorded:

- no call of a producer or of the canceller raised (no deadlock, no lock wait timeout);
- no post reported cancelled reached the platform, and a post being sent was not cancelled;
- nothing was lost: each id queued by some producer is in the outbox, once, and ends posted
  (created once on the platform) or cancelled;
- every container's posts reached the platform in queue order.
"""

from __future__ import annotations

import json
import multiprocessing
import time
from collections import Counter

import pytest
from django.db import connection
from django.test import override_settings

from django_connector_outbox import Outbox
from django_connector_outbox.models import Post
from tests import stress_worker
from tests.harness import run_together
from tests.proof_connectors import file_platform, platform_lines
from tests.test_sender_processes import assert_created_in_queue_order, queue_order

pytestmark = [
    pytest.mark.budget,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor == "sqlite",
        reason="SQLite serializes writers with one database lock: nothing here runs at once there; run "
        "with DATABASE_URL pointing at PostgreSQL or MySQL/MariaDB",
    ),
]

PRODUCERS = 6
ROUNDS = 15
BUSY_BACKLOG = 300
RUN_SECONDS = 90  # a hang detector: the run takes ~10-20 s on this 2-core machine


def run_processes(config, tmp_path) -> tuple[list[dict], dict]:
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(PRODUCERS + 2)  # the producers, the canceller and this test
    rounds = ctx.Barrier(PRODUCERS)
    db_name = connection.settings_dict["NAME"]
    paths = [tmp_path / f"producer-{i}.json" for i in range(PRODUCERS)]
    cancels = tmp_path / "canceller.json"

    def producer(i):
        return ctx.Process(
            target=stress_worker.produce, args=(i, db_name, config, start, rounds, ROUNDS, str(paths[i]))
        )

    processes = [producer(i) for i in range(PRODUCERS)]
    processes.append(
        ctx.Process(target=stress_worker.cancel, args=(db_name, config, start, RUN_SECONDS, str(cancels)))
    )
    assert run_together(processes, start, RUN_SECONDS + 30) == [0] * len(processes)
    return [json.loads(path.read_text()) for path in paths], json.loads(cancels.read_text())


def test_producers_a_canceller_and_a_sender_at_once_keep_every_promise(senders, tmp_path):
    path = tmp_path / "platform.jsonl"
    config = {"CONNECTORS": {"file": file_platform(path, latency=0.005)}, "LEASE": 10, "POLL_INTERVAL": 0.2}
    with override_settings(CONNECTOR_OUTBOX=config):
        Outbox("file").queue_many(
            dict(post_id=f"busy-{n:04d}", workspace_id="W", container_id="busy", body={"seq": n})
            for n in range(BUSY_BACKLOG)
        )
    sender = senders.start(config, "--concurrency", "4")
    started = time.monotonic()
    producers, canceller = run_processes(config, tmp_path)
    deadline = time.monotonic() + RUN_SECONDS
    while Post.objects.active().exists():  # the end of a drain has no event: poll for it
        assert time.monotonic() < deadline and sender.alive(), sender.stderr
        time.sleep(0.1)
    assert sender.stop() == 0, sender.stderr
    duration = time.monotonic() - started

    lines = platform_lines(path)
    creates = Counter(line["post_id"] for line in lines if line["op"] == "create")
    cancelled = {post_id for post_id, done in canceller["calls"] if done}
    refused = [post_id for post_id, done in canceller["calls"] if not done]
    calls = [call for producer in producers for call in producer["calls"]]
    states = dict(Post.objects.values_list("post_id", "state"))
    print(
        f"\nstress on {connection.vendor}: {len(calls)} producer calls, {sum(creates.values())} sent, "
        f"{len(cancelled)} cancelled, {len(refused)} cancels refused, {duration:.1f}s"
    )

    assert [e for producer in producers for e in producer["errors"]] == []
    assert canceller["errors"] == []
    assert sorted(cancelled & set(creates)) == []
    assert [p for p, n in creates.items() if n > 1] == []
    assert {state for post_id, state in states.items() if post_id not in cancelled} <= {"posted"}
    assert {states[post_id] for post_id in cancelled} <= {"cancelled"}
    assert set(creates) | cancelled == set(states)
    # Each id that a producer queued is there, queued once (True once, whoever won).
    assert {post_id for _, post_ids, _, _ in calls for post_id in post_ids} <= set(states)
    ones = Counter(post_ids[0] for kind, post_ids, _, count in calls if kind == "one" and count)
    assert [p for p, n in ones.items() if n > 1] == []
    assert len(states) == BUSY_BACKLOG + sum(count for *_, count in calls)
    assert_created_in_queue_order(lines, queue_order())
    assert cancelled and creates
