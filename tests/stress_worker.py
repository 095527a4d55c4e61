"""Producer and canceller processes for tests/test_stress.py (started with the "spawn" context).

Each configures Django itself against the parent's test database and outbox settings, and
writes what it did to a JSON file: every call, its answer, and the traceback of every exception
a call raised (the test wants none). Producers start each round together (a barrier), so that
their transactions meet: the same post ids, the same new container, the same shared containers.
"""

from __future__ import annotations

import os
import random
import time
import traceback
from typing import Any

from tests.concurrency_worker import write_result

SOURCE = "file"
BUSY = "busy"  # the container the sender drains while the canceller works behind its head
SHARED = 3  # containers every producer queues into


def setup_django(db_name: str, outbox_settings: dict[str, Any]) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    from django.conf import settings

    settings.DATABASES["default"]["NAME"] = db_name  # the test database pytest-django made
    settings.CONNECTOR_OUTBOX = outbox_settings

    import django

    django.setup()


def produce(
    index: int,
    db_name: str,
    outbox_settings: dict[str, Any],
    start: Any,
    together: Any,
    rounds: int,
    out_path: str,
) -> None:
    """Rounds of: a queue_many batch into a shared container (the same ids as every other
    producer), the first post of a new container (the same container as every other producer),
    one id that every producer queues into a container of its own, and a post behind the busy
    container's head, in an order of its own."""
    result: dict[str, Any] = {"calls": [], "errors": []}
    try:
        setup_django(db_name, outbox_settings)
        from django.db import transaction

        from django_connector_outbox import Outbox

        outbox = Outbox(SOURCE)
        rng = random.Random(index)
        start.wait(timeout=120)
        for round_ in range(rounds):
            together.wait(timeout=120)
            shared = f"shared-{round_ % SHARED}"
            batch = [
                dict(
                    post_id=f"{shared}-{round_:03d}-{k}",
                    workspace_id="W",
                    container_id=shared,
                    body={"seq": k},
                )
                for k in range(5)
            ]
            calls: list[tuple[str, Any]] = [
                ("many", batch),
                ("one", (f"new-{round_:03d}-{index}", f"new-{round_:03d}")),
                ("one", (f"same-{round_:03d}", f"own-{index}")),
                ("one", (f"{BUSY}-p{index}-{round_:03d}", BUSY)),
            ]
            rng.shuffle(calls)
            for kind, args in calls:
                try:
                    # In a transaction of the caller's, one call each: lanes are locked until the
                    # commit, so two callers queueing into two containers in opposite orders in
                    # one transaction each wait for the other (their own lock order).
                    with transaction.atomic():
                        if kind == "many":
                            queued = outbox.queue_many(args)
                            post_ids, container = [p["post_id"] for p in args], args[0]["container_id"]
                        else:
                            post_id, container = args
                            queued = outbox.queue(
                                post_id, workspace_id="W", container_id=container, body={"seq": 0}
                            )
                            post_ids = [post_id]
                    result["calls"].append([kind, post_ids, container, queued])
                except Exception:
                    result["errors"].append(traceback.format_exc())
    except BaseException:
        start.abort()
        together.abort()
        result["errors"].append(traceback.format_exc())
    finally:
        write_result(out_path, result)


def cancel(
    db_name: str, outbox_settings: dict[str, Any], barrier: Any, seconds: float, out_path: str
) -> None:
    """Each time the busy container's head moves on, cancel the post right behind the new head
    (now and then the head itself), until nothing of it is queued or time is up."""
    result: dict[str, Any] = {"calls": [], "errors": []}
    try:
        setup_django(db_name, outbox_settings)
        from django_connector_outbox import Outbox
        from django_connector_outbox.models import QUEUE_ORDER, Post

        outbox = Outbox(SOURCE)
        rng = random.Random(0)
        barrier.wait(timeout=120)
        deadline = time.monotonic() + seconds
        head = None
        while time.monotonic() < deadline:
            queued = Post.objects.filter(container_id=BUSY, state="queued").order_by(*QUEUE_ORDER)
            front = list(queued.values_list("post_id", flat=True)[:2])
            if not front:
                break
            if front[0] == head:
                continue  # the same head: read again until the sender moves on
            head = front[0]
            post_id = front[0] if len(front) == 1 or rng.random() < 0.2 else front[1]
            try:
                result["calls"].append([post_id, outbox.cancel_queued(post_id)])
            except Exception:
                result["errors"].append(traceback.format_exc())
    except BaseException:
        barrier.abort()
        result["errors"].append(traceback.format_exc())
    finally:
        write_result(out_path, result)
