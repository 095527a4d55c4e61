"""``manage.py outbox_retry``: send failed (and, if asked, uncertain) posts back to their queues."""

from __future__ import annotations

import argparse
from typing import Any

from django.utils.translation import gettext, ngettext_lazy
from django.utils.translation import gettext_lazy as _

from django_connector_outbox.management.operator import PostActionCommand
from django_connector_outbox.outbox import Outbox
from django_connector_outbox.posts import RETRYABLE_STATES, State


class Command(PostActionCommand):
    help = _(  # type: ignore[assignment]  # lazy: in the language of each run
        "Send failed posts back to the back of their container's queue (attempts 0), through "
        "Outbox.requeue. Uncertain posts may be in the source already: they are retried only "
        "with --include-uncertain."
    )
    done_line = _("retried %(post)s")
    would_line = _("would retry %(post)s")
    done_count = ngettext_lazy("%(count)s retried", "%(count)s retried", "count")
    would_count = ngettext_lazy("%(count)s would be retried", "%(count)s would be retried", "count")
    name_the_posts = _(
        "Name the posts to retry: post ids, or --source, --state, --container, --older-than; or --all"
    )
    default_states = tuple(RETRYABLE_STATES)
    changed_meanwhile = _("no longer failed or uncertain")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        super().add_arguments(parser)
        parser.add_argument(
            "--include-uncertain",
            action="store_true",
            help=gettext("retry uncertain posts too, although they may appear twice"),
        )

    def skip_reason(self, state: str, has_body: bool, options: dict[str, Any]) -> str | None:
        if state not in RETRYABLE_STATES:
            return gettext("only failed and uncertain posts can be retried")
        if state == State.UNCERTAIN and not options["include_uncertain"]:
            return gettext("it may be in the source already; --include-uncertain retries it anyway")
        if not has_body:
            return gettext("its body is gone, nothing to send")
        return None

    def act(self, outbox: Outbox, post_id: str) -> bool:
        return outbox.requeue(post_id)
