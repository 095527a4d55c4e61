"""``manage.py outbox_cancel``: cancel queued posts before they are sent."""

from __future__ import annotations

from typing import Any

from django_connector_outbox.management.operator import PostActionCommand
from django_connector_outbox.outbox import Outbox
from django_connector_outbox.posts import State


class Command(PostActionCommand):
    help = (
        "Cancel queued posts (their bodies are dropped), through Outbox.cancel_queued. A post "
        "being sent, or finished, is left alone."
    )
    verb = "cancel"
    done = "cancelled"
    default_states = (State.QUEUED,)
    changed_meanwhile = "no longer queued"

    def skip_reason(self, state: str, has_body: bool, options: dict[str, Any]) -> str | None:
        return None if state == State.QUEUED else "only queued posts can be cancelled"

    def act(self, outbox: Outbox, post_id: str) -> bool:
        return outbox.cancel_queued(post_id)
