"""``manage.py outbox_reencrypt``: reseal every installation's and destination's secrets with the
newest key (the first of SECRET_KEYS), the step between adding a key and dropping the old one.

Each row is written by a conditional update (``WHERE pk = .. AND secrets = <as read>``): a
refresh or a re-install that saved the row meanwhile is never overwritten (its secrets are
already sealed with the newest key). Rows are read in batches by primary key, so the command
holds no lock and no transaction for long, and memory stays flat however many rows there are.

A row that no key opens is named (source and workspace or container, never its content) and
left as it is; the command then exits 1, since dropping the old key would lose it.
"""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import Model

from django_connector_outbox.health import NotMigrated, require_tables
from django_connector_outbox.installations.sealing import CannotOpen, reseal
from django_connector_outbox.management.operator import check_text
from django_connector_outbox.models import Destination, Installation

BATCH = 500


class Command(BaseCommand):
    help = (
        "Reseal the secrets of every installation and destination with the first key of "
        "SECRET_KEYS, so that the older keys can be dropped."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--database", default=DEFAULT_DB_ALIAS, help="database alias (default)")
        parser.add_argument(
            "--batch", type=int, default=BATCH, metavar="N", help=f"rows read at once ({BATCH})"
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="count what would be resealed, change nothing"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        check_text(options, {"database": "--database"})
        using = options["database"]
        if using not in connections:
            raise CommandError(f"Unknown database alias {using!r}")
        if options["batch"] < 1:
            raise CommandError("--batch must be at least 1")
        try:
            require_tables(using)
        except NotMigrated as e:
            raise CommandError(str(e)) from e
        resealed = changed = 0
        unreadable: list[str] = []
        for model, place in ((Installation, "workspace_id"), (Destination, "container_id")):
            done, moved, bad = self._reseal(model, place, using, options["batch"], options["dry_run"])
            resealed, changed, unreadable = resealed + done, changed + moved, unreadable + bad
        verb = "would be resealed" if options["dry_run"] else "resealed"
        summary = f"{resealed} {verb}"
        if changed:
            summary += f", {changed} changed meanwhile (already sealed anew)"
        if unreadable:
            summary += f", {len(unreadable)} could not be opened"
        self.stdout.write(summary + ("; nothing changed" if options["dry_run"] else ""))
        if unreadable:
            for name in unreadable:
                self.stderr.write(f"cannot open {name}: sealed with a key that is not in SECRET_KEYS")
            raise CommandError(
                f"{len(unreadable)} row(s) could not be opened with any key: add the key they were "
                "sealed with to SECRET_KEYS (after the new one) and run this again",
                returncode=1,
            )

    @staticmethod
    def _reseal(
        model: type[Model], place: str, using: str, batch: int, dry_run: bool
    ) -> tuple[int, int, list[str]]:
        """(resealed, changed meanwhile, rows no key opens) of one table."""
        what = model._meta.verbose_name
        rows = model._default_manager.using(using).exclude(secrets="").order_by("pk")
        resealed = changed = 0
        unreadable: list[str] = []
        last = None
        while True:
            page = rows.filter(pk__gt=last) if last is not None else rows
            chunk = list(page.values_list("pk", "source", place, "secrets")[:batch])
            if not chunk:
                return resealed, changed, unreadable
            last = chunk[-1][0]
            for pk, source, name, sealed in chunk:
                try:
                    new = reseal(sealed)
                except CannotOpen:
                    unreadable.append(f"the {what} {source}:{name}")
                    continue
                if dry_run or model._default_manager.using(using).filter(pk=pk, secrets=sealed).update(
                    secrets=new
                ):
                    resealed += 1
                else:
                    changed += 1
