"""One source's health as operators watch it: counts by state, the oldest due post, holds
(posts sent back to wait, and places held for all their posts); and whether a database has
the outbox's tables at all.

Read through the Outbox (whose oldest-due rule, PostQuerySet.oldest_due, the admin's header
reads too), so that `outbox_status`, the metrics collector and the admin agree.

A database without the outbox's tables is a deployment error (`migrate` was not run), not a
database that is away: `run_outbox` and the operators' commands say so and exit, where a
sender would otherwise retry for ever (SQLite's "no such table" is an OperationalError, as a
dropped connection is).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, connections
from django.utils.translation import gettext

from django_connector_outbox.outbox import GateHold, HeldPost, Outbox
from django_connector_outbox.posts import State

APP_LABEL = "django_connector_outbox"


class NotMigrated(ImproperlyConfigured):
    """The outbox's tables are missing from a database: run `manage.py migrate`."""

    def __init__(self, using: str, missing: list[str]) -> None:
        self.using = using
        self.missing = missing
        database = "" if using == DEFAULT_DB_ALIAS else f" --database {using}"
        super().__init__(
            gettext(
                "database %(alias)r has no table %(tables)s: the app %(app)s is not migrated there; "
                "run `%(command)s`"
            )
            % {
                "alias": using,
                "tables": ", ".join(missing),
                "app": APP_LABEL,
                "command": f"manage.py migrate{database}",
            }
        )


def missing_tables(using: str) -> list[str]:
    """The outbox's tables that database `using` lacks (sorted); DatabaseError if it is away."""
    wanted = {model._meta.db_table for model in apps.get_app_config(APP_LABEL).get_models()}
    connection = connections[using]
    with connection.cursor() as cursor:
        present = set(connection.introspection.table_names(cursor))
    return sorted(wanted - present)


def require_tables(using: str) -> None:
    """NotMigrated unless database `using` has the outbox's tables."""
    missing = missing_tables(using)
    if missing:
        raise NotMigrated(using, missing)


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
