"""Pacing by the generic cell rate algorithm (GCRA): one timestamp per paced place.

A pace (count, seconds) lets `count` claims through at once after a quiet spell and refills at
`count` per `seconds`: an emission interval T = seconds / count and a burst tolerance
tau = T * (count - 1). The place keeps its theoretical arrival time (tat): a claim at `now` is
allowed while now >= tat - tau, and each allowed claim moves tat to max(tat, now) + T. This is
the token bucket of the contract with a single column (redis-cell and Stripe's limiters use it).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django_connector_outbox.posts import Pace

# Float error of a division by the interval must not refuse a claim that is due exactly now.
EPSILON = 1e-9


def interval(pace: Pace) -> timedelta:
    return timedelta(seconds=pace.seconds / pace.count)


def tolerance(pace: Pace) -> timedelta:
    """The burst tolerance tau: how far ahead of now a place's tat may be while a claim is let
    through (models.LaneQuerySet.pace_allows and the SQL claim restate `allowed` with it)."""
    return interval(pace) * (pace.count - 1)


def allowed(pace: Pace, tat: datetime | None, now: datetime) -> int:
    """How many claims the pace lets through at `now`."""
    if tat is None or tat <= now:
        return pace.count
    step = pace.seconds / pace.count
    slack = (now - tat).total_seconds() + step * (pace.count - 1)
    if slack < -EPSILON:
        return 0
    return min(pace.count, int(slack / step + EPSILON) + 1)


def after(pace: Pace, tat: datetime | None, now: datetime, claims: int) -> datetime | None:
    """The tat once `claims` claims went through at `now` (unchanged without claims)."""
    if not claims:
        return tat
    start = now if tat is None or tat < now else tat
    return start + interval(pace) * claims


def free_at(pace: Pace, tat: datetime) -> datetime:
    """When the pace lets the next claim through."""
    return tat - tolerance(pace)
