"""A claimer process for tests/test_concurrency.py (started with the multiprocessing "spawn" context).

It configures Django itself against the parent's test database, waits at a barrier so that
every claimer starts at once, then claims and finishes posts until none is left to post. It
writes what it saw to a JSON file: every claim (post, lease token, the claim's own `now`,
lease end), what it did with it, and wall-clock marks taken just after `claim()` returned and
just before each finish was called. Times are integer microseconds since the epoch, all from
the same clock (CLOCK_REALTIME) as the outbox's `timezone.now`.

Actions, chosen at random per claim (seeded per process), on the first two attempts only, so
that no post runs out of attempts: mostly `posted`; some `retry(after=0)`; some
`hold(after=0)`; some abandoned (the lease of a few tenths of a second runs out and another
claimer takes the post back, stale). Half of the abandoned claims are finished late with
`posted()` once their lease has ended: that either changes nothing (the post was taken back:
fencing) or posts it (nobody had taken it back: the claim was still current).
"""

from __future__ import annotations

import json
import os
import random
import time
import traceback
from datetime import UTC, datetime, timedelta
from typing import Any

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# Chances of each action on a claim's first two attempts (the rest: posted).
P_RETRY = 0.08
P_HOLD = 0.08
P_ABANDON = 0.03


def micros(value: datetime) -> int:
    return (value - EPOCH) // timedelta(microseconds=1)


def wall() -> int:
    return time.time_ns() // 1000


def setup_django(db_name: str, lease: float) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    from django.conf import settings

    # tests.settings reads DATABASE_URL (inherited from the parent); point it at the test
    # database that pytest-django created, before any connection is made.
    settings.DATABASES["default"]["NAME"] = db_name
    settings.CONNECTOR_OUTBOX = {**settings.CONNECTOR_OUTBOX, "LEASE": lease}

    import django

    django.setup()


def run(index: int, db_name: str, lease: float, barrier: Any, out_path: str, seconds: float) -> None:
    result: dict[str, Any] = {"worker": index, "claims": [], "violations": [], "error": None}
    try:
        try:
            setup_django(db_name, lease)
        except BaseException:
            barrier.abort()  # the parent and the other workers stop waiting
            raise
        barrier.wait(timeout=120)
        _claim_until_done(index, lease, result, deadline=time.monotonic() + seconds)
    except BaseException:
        result["error"] = traceback.format_exc()
    finally:
        write_result(out_path, result)


def write_result(out_path: str, result: dict[str, Any]) -> None:
    """Close this process's connections (if Django was set up at all), then write `result`."""
    try:
        from django.db import connections

        connections.close_all()
    except Exception:  # noqa: S110 - Django may not even be set up
        pass
    with open(out_path, "w") as out:
        json.dump(result, out)


def _claim_until_done(index: int, lease: float, result: dict[str, Any], deadline: float) -> None:
    from django.db.models import Count

    from django_connector_outbox import Outbox
    from django_connector_outbox.models import Post

    rng = random.Random(1000 + index)
    outbox = Outbox("memory")
    lease_delta = timedelta(seconds=lease)
    zombies: list[tuple[dict[str, Any], Any]] = []  # abandoned claims to finish late
    records = result["claims"]
    result["finished"] = False

    def sending_twice() -> None:
        # One statement, so one snapshot: no container may ever show two sending posts.
        doubled = (
            Post.objects.filter(state="sending")
            .values("container_id")
            .annotate(n=Count("pk"))
            .filter(n__gt=1)
        )
        for row in doubled:
            result["violations"].append({"at": wall(), "container": row["container_id"], "sending": row["n"]})

    while time.monotonic() < deadline:
        claims = outbox.claim(limit=rng.choice((1, 2, 5, 10)), worker=f"w{index}")
        returned = wall()
        if claims:
            sending_twice()
        for claim in claims:
            record = {
                "post": claim.post_id,
                "container": claim.container_id,
                "token": claim.lease_token,
                "stale": claim.stale,
                "attempts": claim.attempts,
                # The contract: leased until the claim's now + LEASE.
                "claim_now": micros(claim.lease_until - lease_delta),
                "lease_until": micros(claim.lease_until),
                "returned": returned,
                "action": "posted",
                "called": None,
                "result": None,
            }
            records.append(record)
            roll = rng.random() if claim.attempts <= 2 else 1.0
            if roll < P_ABANDON:
                record["action"] = "abandon"
                if rng.random() < 0.5:
                    zombies.append((record, claim))
                continue
            if roll < P_ABANDON + P_RETRY:
                record["action"] = "retry"
                finish = lambda c: outbox.retry(c, after=0, reason="try again")  # noqa: E731
            elif roll < P_ABANDON + P_RETRY + P_HOLD:
                record["action"] = "hold"
                finish = lambda c: outbox.hold(c, 0, reason="rate limited")  # noqa: E731
            else:
                finish = outbox.posted
            record["called"] = wall()
            record["result"] = finish(claim)

        # Late finishes of abandoned claims whose lease has ended.
        now = wall()
        for record, claim in [z for z in zombies if z[0]["lease_until"] < now]:
            zombies.remove((record, claim))
            record["action"] = "late-posted"
            record["called"] = wall()
            record["result"] = outbox.posted(claim)

        if not claims:
            if not zombies and not Post.objects.exclude(state="posted").exists():
                result["finished"] = True
                return
            time.sleep(0.002)  # idle: nothing due yet (a lease or a late finish to wait for)
