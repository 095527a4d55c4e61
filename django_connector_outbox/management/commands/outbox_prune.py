"""``manage.py outbox_prune``: delete finished posts now, rather than at the senders' next pruning."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand

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
        "Delete finished one-off posts (posted, failed, uncertain, cancelled) last changed more "
        "than the retention ago, in short batches; status posts are kept."
    )

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_source_and_database(parser)
        parser.add_argument(
            "--retention", type=duration, metavar="AGE", help="keep posts changed within AGE (RETENTION)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        retention = conf.RETENTION if options["retention"] is None else options["retention"]
        total = 0
        for source in sources_and_database(options):
            pruned = Outbox(source, using=options["database"]).prune_finished(retention)
            total += pruned
            if options["verbosity"] >= 1:
                self.stdout.write(f"{source}: {pruned} pruned")
        self.stdout.write(f"{total} pruned (last changed more than {human(retention)} ago)")
