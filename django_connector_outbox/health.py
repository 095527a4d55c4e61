"""One source's health as operators watch it: counts by state, the oldest due post, holds
(posts sent back to wait, and places held for all their posts).

Read through the Outbox (whose oldest-due rule, PostQuerySet.oldest_due, the admin's header
reads too), so that `outbox_status`, the metrics collector and the admin agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django_connector_outbox.outbox import GateHold, HeldPost, Outbox
from django_connector_outbox.posts import State


@dataclass(frozen=True)
class OldestDue:
    """The queued post that is due and has held its place longest: how long it has waited."""

    post_id: str
    queued_at: datetime
    age: float  # seconds since queued_at


@dataclass(frozen=True)
class SourceHealth:
    source: str
    at: datetime
    counts: dict[str, int]  # by state, for the states asked for
    oldest_due: OldestDue | None
    held: int  # how many queued posts wait past now after a retry or a hold
    holds: list[HeldPost]  # the ones due last, at most the number asked for
    # Places held past now (the whole source, workspaces, containers), by scope, widest first.
    held_places: dict[str, int]
    place_holds: list[GateHold]  # the widest, at most the number asked for

    @property
    def depth(self) -> int:
        """Posts not yet finished: queued and sending."""
        return self.counts.get(State.QUEUED, 0) + self.counts.get(State.SENDING, 0)


def source_health(outbox: Outbox, *, states: tuple[str, ...] = tuple(State), holds: int = 10) -> SourceHealth:
    now = outbox.clock()
    oldest = outbox.oldest_due()
    held, shown = outbox.holds(limit=holds)
    held_places, place_holds = outbox.gate_holds(limit=holds)
    return SourceHealth(
        source=outbox.source,
        at=now,
        counts=outbox.state_counts(states),
        oldest_due=OldestDue(oldest[0], oldest[1], (now - oldest[1]).total_seconds()) if oldest else None,
        held=held,
        holds=shown,
        held_places=held_places,
        place_holds=place_holds,
    )
