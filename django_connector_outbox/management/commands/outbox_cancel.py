"""``manage.py outbox_cancel``: cancel queued posts before they are sent, or (``--retract``)
take posted ones back, their messages deleted."""

from __future__ import annotations

import argparse
from typing import Any

from django.utils.translation import gettext, ngettext_lazy
from django.utils.translation import gettext_lazy as _

from django_connector_outbox.management.operator import PostActionCommand
from django_connector_outbox.outbox import Outbox
from django_connector_outbox.posts import RETRACTABLE_STATES, State


class Command(PostActionCommand):
    help = _(  # type: ignore[assignment]  # lazy: in the language of each run
        "Cancel queued posts (their bodies are dropped), through Outbox.cancel_queued. A post "
        "being sent, or finished, is left alone. With --retract, retract posted posts instead "
        "(and posts being sent), through Outbox.retract: a delete of each one's message is queued "
        "behind it in its container."
    )
    done_line = _("cancelled %(post)s")
    would_line = _("would cancel %(post)s")
    done_count = ngettext_lazy("%(count)s cancelled", "%(count)s cancelled", "count")
    would_count = ngettext_lazy("%(count)s would be cancelled", "%(count)s would be cancelled", "count")
    name_the_posts = _(
        "Name the posts to cancel: post ids, or --source, --state, --container, --older-than; or --all"
    )
    default_states: tuple[str, ...] = (State.QUEUED,)
    changed_meanwhile = _("no longer queued")
    retracting = False  # --retract

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        super().add_arguments(parser)
        parser.add_argument(
            "--retract",
            action="store_true",
            help=gettext(
                "retract posted (and sending) posts instead: delete their messages (default state %(states)s)"
            )
            % {"states": ", ".join(RETRACTABLE_STATES)},
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self.retracting = options["retract"]
        if self.retracting:  # the same selection, another action and its sentences
            self.done_line = _("retracted %(post)s")
            self.would_line = _("would retract %(post)s")
            self.done_count = ngettext_lazy("%(count)s retracted", "%(count)s retracted", "count")
            self.would_count = ngettext_lazy(
                "%(count)s would be retracted", "%(count)s would be retracted", "count"
            )
            self.name_the_posts = _(
                "Name the posts to retract: post ids, or --source, --state, --container, --older-than; or --all"
            )
            self.default_states = RETRACTABLE_STATES
            self.changed_meanwhile = _(
                "not retracted: retracted already, without a message, or its source cannot delete"
            )
        super().handle(*args, **options)

    def skip_reason(self, state: str, has_body: bool, options: dict[str, Any]) -> str | None:
        if self.retracting:
            return None if state in RETRACTABLE_STATES else gettext("only posted posts can be retracted")
        return None if state == State.QUEUED else gettext("only queued posts can be cancelled")

    def act(self, outbox: Outbox, post_id: str) -> bool:
        if self.retracting:
            return outbox.retract(post_id)
        return outbox.cancel_queued(post_id)
