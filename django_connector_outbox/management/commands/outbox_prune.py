"""``manage.py outbox_prune``: delete finished posts now, rather than at the senders' next pruning.

Posted and cancelled posts go after RETENTION (`--retention`); failed and uncertain ones wait
for a person and go after ATTENTION_RETENTION (`--attention-retention`; never sooner than the
others). `--dry-run` counts what would go and deletes nothing; a retention of 0 (everything
finished, at once) needs `--yes`.
"""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from django_connector_outbox.conf import conf
from django_connector_outbox.management.operator import (
    add_source_and_database,
    duration,
    human,
    sources_and_database,
)
from django_connector_outbox.outbox import Outbox


class Command(BaseCommand):
    help = (
        "Delete finished one-off posts in short batches: posted and cancelled ones last changed "
        "more than RETENTION ago, failed and uncertain ones more than ATTENTION_RETENTION ago; "
        "status posts are kept."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_source_and_database(parser)
        parser.add_argument(
            "--retention",
            type=duration,
            metavar="AGE",
            help="keep posted and cancelled posts changed within AGE (RETENTION): 90, 15m, 2h, 7d",
        )
        parser.add_argument(
            "--attention-retention",
            type=duration,
            metavar="AGE",
            help="keep failed and uncertain posts changed within AGE (ATTENTION_RETENTION, "
            "and at least --retention)",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="say how many would be deleted, delete nothing"
        )
        parser.add_argument(
            "--yes", action="store_true", help="confirm a retention of 0 (prune all finished posts)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        retention = conf.RETENTION if options["retention"] is None else options["retention"]
        attention = options["attention_retention"]
        if attention is None:
            attention = max(conf.ATTENTION_RETENTION, retention)
        zero = [
            name
            for name, value in (("--retention", retention), ("--attention-retention", attention))
            if value == 0
        ]
        if zero and not options["yes"] and not options["dry_run"]:
            raise CommandError(
                f"{' and '.join(zero)} 0 deletes {self._which(retention, attention)} at once; "
                "add --yes to do it (--dry-run shows how many)"
            )
        sources = sources_and_database(options)
        kept = (
            f"posted and cancelled last changed more than {human(retention)} ago, "
            f"failed and uncertain more than {human(attention)} ago"
        )
        total = 0
        for source in sources:
            outbox = Outbox(source, using=options["database"])
            if options["dry_run"]:
                counts = outbox.prunable(retention, attention_retention=attention)
                found = sum(counts.values())
                detail = ", ".join(f"{n} {state}" for state, n in counts.items() if n)
                line = f"{source}: {found} would be pruned" + (f" ({detail})" if detail else "")
            else:
                found = outbox.prune_finished(retention, attention_retention=attention)
                line = f"{source}: {found} pruned"
            total += found
            if options["verbosity"] >= 1:
                self.stdout.write(line)
        if options["dry_run"]:
            self.stdout.write(f"dry run: {total} would be pruned ({kept}); nothing deleted")
        else:
            self.stdout.write(f"{total} pruned ({kept})")

    @staticmethod
    def _which(retention: float, attention: float) -> str:
        if retention == 0 and attention == 0:
            return "every finished post"
        if retention == 0:
            return "every posted and cancelled post"
        return "every failed and uncertain post"
