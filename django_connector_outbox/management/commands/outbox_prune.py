"""``manage.py outbox_prune``: delete finished posts now, rather than at the senders' next pruning.

Posted and cancelled posts go after RETENTION (`--retention`); failed and uncertain ones wait
for a person and go after ATTENTION_RETENTION (`--attention-retention`; never sooner than the
others); finished status posts go after STATUS_RETENTION (`--status-retention`) when it is
set, and are kept otherwise. Then the lanes left idle for the retention go too (a channel's
queue row, made again with its next post). `--dry-run` counts what would go and deletes
nothing; a retention of 0 (everything finished, at once) needs `--yes`.
"""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import CommandError
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from django_connector_outbox.conf import conf
from django_connector_outbox.management.operator import (
    OutboxCommand,
    add_source_and_database,
    duration,
    human,
    sources_and_database,
)
from django_connector_outbox.outbox import Outbox


class Command(OutboxCommand):
    help = _(  # type: ignore[assignment]  # lazy: in the language of each run
        "Delete finished posts in short batches: posted and cancelled ones last changed more than "
        "RETENTION ago, failed and uncertain ones more than ATTENTION_RETENTION ago, status posts more "
        "than STATUS_RETENTION ago (when it is set; they are kept otherwise); then the lanes idle for RETENTION."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_source_and_database(parser)
        parser.add_argument(
            "--retention",
            type=duration,
            metavar="AGE",
            help=gettext("keep posted and cancelled posts changed within AGE (RETENTION): 90, 15m, 2h, 7d"),
        )
        parser.add_argument(
            "--attention-retention",
            type=duration,
            metavar="AGE",
            help=gettext(
                "keep failed and uncertain posts changed within AGE (ATTENTION_RETENTION, and at least --retention)"
            ),
        )
        parser.add_argument(
            "--status-retention",
            type=duration,
            metavar="AGE",
            help=gettext("keep finished status posts changed within AGE (STATUS_RETENTION; unset: for ever)"),
        )
        parser.add_argument(
            "--dry-run", action="store_true", help=gettext("say how many would be deleted, delete nothing")
        )
        parser.add_argument(
            "--yes", action="store_true", help=gettext("confirm a retention of 0 (prune all finished posts)")
        )

    def handle(self, *args: Any, **options: Any) -> None:
        retention = conf.RETENTION if options["retention"] is None else options["retention"]
        attention = options["attention_retention"]
        if attention is None:
            attention = max(Outbox.attention_retention(), retention)
        status = conf.STATUS_RETENTION if options["status_retention"] is None else options["status_retention"]
        zero = [
            name
            for name, value in (
                ("--retention", retention),
                ("--attention-retention", attention),
                ("--status-retention", status),
            )
            if value == 0
        ]
        if zero and not options["yes"] and not options["dry_run"]:
            raise CommandError(
                gettext(
                    "%(options)s 0 deletes %(which)s at once; add --yes to do it (--dry-run shows how many)"
                )
                % {"options": gettext(" and ").join(zero), "which": self._which(retention, attention, status)}
            )
        sources = sources_and_database(options)
        kept = gettext(
            "posted and cancelled last changed more than %(retention)s ago, "
            "failed and uncertain more than %(attention)s ago"
        ) % {"retention": human(retention), "attention": human(attention)}
        if status is not None:
            kept += gettext(", status more than %(status)s ago") % {"status": human(status)}
        total = lanes = 0
        for source in sources:
            outbox = Outbox(source, using=options["database"])
            retentions = dict(attention_retention=attention, status_retention=status)
            if options["dry_run"]:
                counts = outbox.prunable(retention, **retentions)
                idle = counts.pop("lanes")
                found = sum(counts.values())
                detail = ", ".join(f"{n} {state}" for state, n in counts.items() if n)
                line = ngettext(
                    "%(source)s: %(count)s would be pruned", "%(source)s: %(count)s would be pruned", found
                ) % {"source": source, "count": found}
                line += f" ({detail})" if detail else ""
            else:
                found, idle = outbox.prune(retention, **retentions)
                line = ngettext("%(source)s: %(count)s pruned", "%(source)s: %(count)s pruned", found) % {
                    "source": source,
                    "count": found,
                }
            if idle:
                line += self._lanes(idle)
            total += found
            lanes += idle
            if options["verbosity"] >= 1:
                self.stdout.write(line)
        if options["dry_run"]:
            message = ngettext(
                "dry run: %(count)s would be pruned%(lanes)s (%(kept)s); nothing deleted",
                "dry run: %(count)s would be pruned%(lanes)s (%(kept)s); nothing deleted",
                total,
            )
        else:
            message = ngettext(
                "%(count)s pruned%(lanes)s (%(kept)s)", "%(count)s pruned%(lanes)s (%(kept)s)", total
            )
        self.stdout.write(
            message % {"count": total, "lanes": self._lanes(lanes) if lanes else "", "kept": kept}
        )

    @staticmethod
    def _lanes(count: int) -> str:
        return ngettext(", %(count)s idle lane", ", %(count)s idle lanes", count) % {"count": count}

    @staticmethod
    def _which(retention: float, attention: float, status: float | None) -> str:
        which = []
        if retention == 0 and attention == 0:
            which.append(gettext("every finished one-off post"))
        elif retention == 0:
            which.append(gettext("every posted and cancelled post"))
        elif attention == 0:
            which.append(gettext("every failed and uncertain post"))
        if status == 0:
            which.append(gettext("every finished status post"))
        return gettext(" and ").join(which)
