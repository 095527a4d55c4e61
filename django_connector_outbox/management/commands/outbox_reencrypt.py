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

from django.core.management.base import CommandError
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import Model
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from django_connector_outbox.health import NotMigrated, require_tables
from django_connector_outbox.installations.sealing import CannotOpen, reseal
from django_connector_outbox.management.operator import OutboxCommand, check_text
from django_connector_outbox.models import Destination, Installation

BATCH = 500


class Command(OutboxCommand):
    help = _(  # type: ignore[assignment]  # lazy: in the language of each run
        "Reseal the secrets of every installation and destination with the first key of "
        "SECRET_KEYS, so that the older keys can be dropped."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--database", default=DEFAULT_DB_ALIAS, help=gettext("database alias (default)"))
        parser.add_argument(
            "--batch",
            type=int,
            default=BATCH,
            metavar="N",
            help=gettext("rows read at once (%(batch)s)") % {"batch": BATCH},
        )
        parser.add_argument(
            "--dry-run", action="store_true", help=gettext("count what would be resealed, change nothing")
        )

    def handle(self, *args: Any, **options: Any) -> None:
        check_text(options, {"database": "--database"})
        using = options["database"]
        if using not in connections:
            raise CommandError(gettext("Unknown database alias %(alias)r") % {"alias": using})
        if options["batch"] < 1:
            raise CommandError(gettext("--batch must be at least 1"))
        try:
            require_tables(using)
        except NotMigrated as e:
            raise CommandError(str(e)) from e
        resealed = changed = 0
        unreadable: list[str] = []
        for model, place in ((Installation, "workspace_id"), (Destination, "container_id")):
            done, moved, bad = self._reseal(model, place, using, options["batch"], options["dry_run"])
            resealed, changed, unreadable = resealed + done, changed + moved, unreadable + bad
        if options["dry_run"]:
            summary = ngettext("%(count)s would be resealed", "%(count)s would be resealed", resealed)
        else:
            summary = ngettext("%(count)s resealed", "%(count)s resealed", resealed)
        summary %= {"count": resealed}
        if changed:
            summary += ngettext(
                ", %(count)s changed meanwhile (already sealed anew)",
                ", %(count)s changed meanwhile (already sealed anew)",
                changed,
            ) % {"count": changed}
        if unreadable:
            summary += ngettext(
                ", %(count)s could not be opened", ", %(count)s could not be opened", len(unreadable)
            ) % {"count": len(unreadable)}
        self.stdout.write(summary + (gettext("; nothing changed") if options["dry_run"] else ""))
        if unreadable:
            for name in unreadable:
                self.stderr.write(
                    gettext("cannot open %(row)s: sealed with a key that is not in SECRET_KEYS")
                    % {"row": name}
                )
            raise CommandError(
                ngettext(
                    "%(count)s row(s) could not be opened with any key: add the key they were "
                    "sealed with to SECRET_KEYS (after the new one) and run this again",
                    "%(count)s row(s) could not be opened with any key: add the key they were "
                    "sealed with to SECRET_KEYS (after the new one) and run this again",
                    len(unreadable),
                )
                % {"count": len(unreadable)},
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
                    unreadable.append(
                        gettext("the %(model)s %(row)s") % {"model": what, "row": f"{source}:{name}"}
                    )
                    continue
                if dry_run or model._default_manager.using(using).filter(pk=pk, secrets=sealed).update(
                    secrets=new
                ):
                    resealed += 1
                else:
                    changed += 1
