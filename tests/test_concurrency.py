"""Concurrent claimers in real OS processes, against PostgreSQL and MySQL/MariaDB.

2,000 posts in 40 containers are queued; 4 processes (tests/concurrency_worker.py, started
with the "spawn" context, each configuring Django against this test database) claim and
finish them all at once, with a lease of a few tenths of a second so that abandoned claims
are taken back stale during the run. Then, from what each process recorded:

- no post was claimed twice under one lease: every (post, lease token) pair is unique, and a
  post's next claim is made no earlier than the end of the one before (its finish, or its
  lease end when it was not finished or was taken back);
- no container ever had two posts in flight: per container, the intervals between "claim()
  returned" and "finish called" (or the lease end) never overlap, across processes; and every
  process checked, right after each claim, that no container shows two `sending` rows;
- every post ends `posted`, by exactly one successful `posted()`;
- per container, posts were posted in queue order.

Times are wall-clock microseconds; the checks only compare a mark taken before a commit
with one taken after the commit it waited for, so they hold whatever the scheduling.
"""

from __future__ import annotations

import json
import multiprocessing
import time
from collections import Counter, defaultdict

import pytest
from django.db import connection

from django_connector_outbox import Outbox
from django_connector_outbox.models import Lane, Post
from tests import concurrency_worker
from tests.harness import run_together

pytestmark = [
    pytest.mark.budget,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor == "sqlite",
        reason="SQLite has no row locks nor SKIP LOCKED: its writers are serialized by the "
        "database lock, so there is no claim concurrency to test; run with DATABASE_URL "
        "pointing at PostgreSQL or MySQL/MariaDB",
    ),
]

WORKERS = 4
CONTAINERS = 40
PER_CONTAINER = 50
LEASE = 0.3  # seconds; short, so that abandoned claims are taken back during the run
RUN_SECONDS = 120  # a worker gives up after this long (the test then fails); ~15 s on an idle machine


def queue_posts() -> None:
    """2,000 posts, queued in 10 rounds across all containers (so queued_at varies too)."""
    outbox = Outbox("memory")
    for round_ in range(PER_CONTAINER // 5):
        outbox.queue_many(
            dict(post_id=f"c{c:02d}-{seq:03d}", workspace_id="W", container_id=f"c{c:02d}", body={"seq": seq})
            for c in range(CONTAINERS)
            for seq in range(round_ * 5, round_ * 5 + 5)
        )
    assert Post.objects.filter(state="queued").count() == CONTAINERS * PER_CONTAINER


def run_workers(tmp_path) -> list[dict]:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(WORKERS + 1)
    db_name = connection.settings_dict["NAME"]
    paths = [tmp_path / f"worker-{i}.json" for i in range(WORKERS)]
    processes = [
        ctx.Process(
            target=concurrency_worker.run,
            args=(i, db_name, LEASE, barrier, str(paths[i]), RUN_SECONDS),
            name=f"claimer-{i}",
        )
        for i in range(WORKERS)
    ]
    # Every worker has set Django up: all start together.
    exit_codes = run_together(processes, barrier, RUN_SECONDS + 30)
    results = [json.loads(path.read_text()) for path in paths if path.exists()]
    for result in results:
        assert result["error"] is None, f"worker {result['worker']} failed:\n{result['error']}"
    assert exit_codes == [0] * WORKERS
    assert len(results) == WORKERS
    return results


def test_concurrent_claimers_in_processes(tmp_path):
    queue_posts()
    started = time.monotonic()
    results = run_workers(tmp_path)
    elapsed = time.monotonic() - started
    claims = [dict(record, worker=result["worker"]) for result in results for record in result["claims"]]
    actions = Counter(c["action"] for c in claims)
    late_wins = sum(1 for c in claims if c["action"] == "late-posted" and c["result"])
    print(
        f"\n{connection.vendor}: {len(claims)} claims by {WORKERS} processes in {elapsed:.1f}s; "
        f"{dict(actions)}; stale {sum(c['stale'] for c in claims)}; "
        f"late finishes that changed something: {late_wins}"
    )
    assert all(result["finished"] for result in results), "a worker ran out of time with posts left"

    # Right after every claim, no container showed two sending posts.
    violations = [v for result in results for v in result["violations"]]
    assert violations == []

    # No post claimed twice under one lease.
    pairs = Counter((c["post"], c["token"]) for c in claims)
    assert [pair for pair, n in pairs.items() if n > 1] == []
    by_post = defaultdict(list)
    for c in claims:
        by_post[c["post"]].append(c)
    for post_id, post_claims in by_post.items():
        post_claims.sort(key=lambda c: c["claim_now"])
        for before, after in zip(post_claims, post_claims[1:], strict=False):
            held_until = before["called"] if before["result"] else before["lease_until"]
            assert after["claim_now"] >= held_until, (
                f"{post_id} claimed again by worker {after['worker']} "
                f"{(held_until - after['claim_now']) / 1000:.1f} ms before worker {before['worker']}'s "
                f"claim of it ended: {before} then {after}"
            )
            if not before["result"]:
                assert after["stale"], f"{post_id}: taken back but not stale: {before} then {after}"

    # No container ever had two posts in flight, across processes: [claim() returned, finish
    # called] lies inside the time the claim really held its container (from its commit to
    # the finish's commit), and when the claim was not finished, or was taken back, it held
    # the container at least until its lease ended.
    by_container = defaultdict(list)
    for c in claims:
        end = c["called"] if c["result"] else max(c["lease_until"], c["returned"])
        by_container[c["container"]].append((c["returned"], end, c))
    for container, spans in by_container.items():
        spans.sort(key=lambda span: span[0])
        held_until, holder = spans[0][1], spans[0][2]
        for start, end, c in spans[1:]:
            assert start >= held_until, (
                f"container {container}: {c['post']} claimed by worker {c['worker']} "
                f"{(held_until - start) / 1000:.1f} ms before {holder['post']} (worker {holder['worker']}) "
                f"was finished: {holder} then {c}"
            )
            if end > held_until:
                held_until, holder = end, c

    # Every post ends posted, by exactly one successful posted().
    delivered = [c for c in claims if c["action"] in ("posted", "late-posted") and c["result"]]
    successes = Counter(c["post"] for c in delivered)
    assert set(successes.values()) == {1}
    assert len(successes) == CONTAINERS * PER_CONTAINER
    assert Post.objects.exclude(state="posted").count() == 0
    assert Lane.objects.exclude(lease_token="").count() == 0
    assert Lane.objects.filter(head__isnull=False).count() == 0

    # Per container, posted in queue order.
    posted_at = {c["post"]: c["called"] for c in delivered}
    for container in {c["container"] for c in claims}:
        queue = Post.objects.filter(container_id=container).order_by("queued_at", "post_id")
        in_queue_order = list(queue.values_list("post_id", flat=True))
        assert sorted(in_queue_order, key=posted_at.__getitem__) == in_queue_order, container

    # The run did exercise every path.
    assert actions["retry"] and actions["hold"] and actions["abandon"] + actions["late-posted"]
    assert any(c["stale"] for c in claims)
