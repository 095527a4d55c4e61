"""The processes of tests/test_prune_concurrency.py (started with the multiprocessing "spawn" context).

Each configures Django against the parent's test database (concurrency_worker.setup_django),
waits at a barrier so that all start at once, plays its role, and writes what it saw to a
JSON file:

- a producer queues posts with new ids into a few containers, one to three per transaction
  (`queue`, or `queue_many` for more than one), as fast as it can, and records each id it was told was queued,
  any call that said False, and any error;
- the sender claims and posts whatever is due (a transaction per post: the ORM store's
  `finish_many` locks its lanes in the order of its finishes, not by id, and a producer's
  `queue_many` can deadlock with it whether lanes are pruned or not), prunes the posts at once (retention 0) and
  then the idle lanes, recording each post it delivered;
- the pruner walks the lanes over and over (`prune_lanes`, retention 0), deleting every lane
  left without posts, while the producers queue into them again.

The sender and the pruner go on until every producer is done (`producers_done`), then until
nothing is left to send (the sender) or once more over every lane (the pruner).
"""

from __future__ import annotations

import random
import time
import traceback
from typing import Any

from tests.concurrency_worker import setup_django, write_result

CONTAINERS = 200
LEASE = 60.0  # longer than the run: no claim is taken back, so each post is sent once


def produce(index: int, db_name: str, barrier: Any, out_path: str, transactions: int) -> None:
    result: dict[str, Any] = {"role": f"producer {index}", "queued": [], "refused": [], "errors": []}
    try:
        _start(db_name, barrier)
        from django.db import transaction

        from django_connector_outbox import Outbox

        outbox = Outbox("memory")
        rng = random.Random(index)
        for n in range(transactions):
            posts = [
                dict(
                    post_id=f"p{index}-{n}-{k}",
                    workspace_id="W",
                    container_id=f"c{rng.randrange(CONTAINERS)}",
                    body={"n": n},
                )
                for k in range(rng.randint(1, 3))
            ]
            try:
                with transaction.atomic():
                    # One call per transaction: two calls that lock two containers each, in
                    # opposite orders, wait for each other as any two writers of two rows would.
                    if len(posts) == 1:
                        queued = [p["post_id"] for p in posts if outbox.queue(**p)]
                    else:
                        count = outbox.queue_many(posts)
                        queued = [p["post_id"] for p in posts][:count]
            except Exception:
                result["errors"].append(traceback.format_exc())
                continue
            result["queued"] += queued
            result["refused"] += [p["post_id"] for p in posts if p["post_id"] not in queued]
    except BaseException:
        result["errors"].append(traceback.format_exc())
    finally:
        write_result(out_path, result)


def send(db_name: str, barrier: Any, out_path: str, producers_done: Any, seconds: float) -> None:
    result: dict[str, Any] = {
        "role": "sender",
        "delivered": [],
        "posts_pruned": 0,
        "lanes_pruned": 0,
        "errors": [],
    }
    try:
        _start(db_name, barrier)
        from django_connector_outbox import Outbox

        outbox = Outbox("memory")
        deadline = time.monotonic() + seconds
        last_round = False
        while time.monotonic() < deadline:
            last_round = producers_done.is_set()
            claims = outbox.claim(limit=CONTAINERS, worker="sender")
            for claim in claims:
                if outbox.posted(claim, f"ref-{claim.post_id}"):
                    result["delivered"].append(claim.post_id)
            result["posts_pruned"] += outbox.prune_some(retention=0)
            result["lanes_pruned"] += walk(outbox, result)
            if last_round and not claims:
                break
        result["finished"] = last_round
    except BaseException:
        result["errors"].append(traceback.format_exc())
    finally:
        write_result(out_path, result)


def prune(db_name: str, barrier: Any, out_path: str, producers_done: Any, seconds: float) -> None:
    result: dict[str, Any] = {"role": "pruner", "lanes_pruned": 0, "walks": 0, "errors": []}
    try:
        _start(db_name, barrier)
        from django_connector_outbox import Outbox

        outbox = Outbox("memory")
        deadline = time.monotonic() + seconds
        last_round = False
        while time.monotonic() < deadline:
            last_round = producers_done.is_set()
            result["lanes_pruned"] += walk(outbox, result)
            result["walks"] += 1
            if last_round:
                break
        result["finished"] = last_round
    except BaseException:
        result["errors"].append(traceback.format_exc())
    finally:
        write_result(out_path, result)


def walk(outbox: Any, result: dict[str, Any]) -> int:
    """One walk over every lane, deleting the idle ones; how many."""
    from django.db import OperationalError

    pruned = 0
    after: int | None = 0
    while after is not None:
        try:
            after, deleted = outbox.prune_lanes(retention=0, after=after, limit=20)
        except OperationalError:  # a deadlock of its own: Housekeeper tries again later
            result["deadlocks"] = result.get("deadlocks", 0) + 1
            break
        pruned += deleted
    return pruned


def _start(db_name: str, barrier: Any) -> None:
    try:
        setup_django(db_name, LEASE)
    except BaseException:
        barrier.abort()  # the parent and the others stop waiting
        raise
    barrier.wait(timeout=120)
