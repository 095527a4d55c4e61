"""``manage.py outbox_cancel``: cancel queued posts before they are sent."""

from __future__ import annotations

from typing import Any

from django.utils.translation import gettext, ngettext_lazy
from django.utils.translation import gettext_lazy as _

from django_connector_outbox.management.operator import PostActionCommand
from django_connector_outbox.outbox import Outbox
from django_connector_outbox.posts import State


class Command(PostActionCommand):
    help = _(  # type: ignore[assignment]  # lazy: in the language of each run
        "Cancel queued posts (their bodies are dropped), through Outbox.cancel_queued. A post "
        "being sent, or finished, is left alone."
    )
    done_line = _("cancelled %(post)s")
    would_line = _("would cancel %(post)s")
    done_count = ngettext_lazy("%(count)s cancelled", "%(count)s cancelled", "count")
    would_count = ngettext_lazy("%(count)s would be cancelled", "%(count)s would be cancelled", "count")
    name_the_posts = _(
        "Name the posts to cancel: post ids, or --source, --state, --container, --older-than; or --all"
    )
    default_states = (State.QUEUED,)
    changed_meanwhile = _("no longer queued")

    def skip_reason(self, state: str, has_body: bool, options: dict[str, Any]) -> str | None:
        return None if state == State.QUEUED else gettext("only queued posts can be cancelled")

    def act(self, outbox: Outbox, post_id: str) -> bool:
        return outbox.cancel_queued(post_id)
