"""Operator operations on posts, beyond what producers and senders do: used by the admin.

They follow `outbox.py`'s locking rules (the lane row first, then posts of that lane) and
change a post only with a conditional update on its state, so that a post being sent is
never touched whatever happens meanwhile.
"""

from __future__ import annotations

from django.db import transaction

from django_connector_outbox.outbox import Outbox
from django_connector_outbox.posts import State

# The states an operator may send back to the queue: a sender has given up on them.
RETRYABLE_STATES = (State.FAILED, State.UNCERTAIN)


def requeue(outbox: Outbox, post_id: str) -> bool:
    """Send a `failed` or `uncertain` post back to the back of its container's queue.

    It becomes `queued`, due now, with attempts 0 and `queued_at` now (so it queues behind
    what its container already holds). Its `last_error` is kept: it stays the latest error
    known until a new attempt replaces it, and tells the operator why the post had stopped.
    Its `message_ref` and `rev` are kept too (a status with a ref is edited, not re-created).

    Returns False, changing nothing, when the post is in any other state (a sender may hold
    it: `sending`) or has no body to send any more. An uncertain post may have reached the
    source already; asking the operator whether to risk a duplicate is the caller's job.
    """
    movable = dict(state__in=RETRYABLE_STATES, body__isnull=False)
    with transaction.atomic(using=outbox.using, savepoint=False):
        found = outbox._posts().filter(post_id=post_id, **movable).values("pk", "lane_id").first()
        if found is None:
            return False
        outbox._lock_lanes([found["lane_id"]])
        now = outbox.clock()
        # Conditional on the state again: it may have changed while we waited for the lane.
        moved = outbox._posts().filter(pk=found["pk"], **movable).update(
            state=State.QUEUED, attempts=0, queued_at=now, next_at=now, updated_at=now,
            lease_token="", lease_until=None, sent_at=None,
        )  # fmt: skip
        if not moved:
            return False
        outbox._refresh_heads([found["lane_id"]])
        # Wake idle senders where the outbox can (PostgreSQL NOTIFY on commit).
        notify = getattr(outbox, "_notify", None)
        if notify is not None:
            notify()
        return True
