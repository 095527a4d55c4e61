"""The operators' view of the running senders (heartbeat.py): who runs where, since when, when
each was last heard of, and how many posts it delivered. Read-only: rows are written by the
senders themselves, and a silent one (no heartbeat for longer than LEASE) is flagged.

Registered by django_connector_outbox.admin (the app's admin module imports this one).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from django_connector_outbox.conf import conf
from django_connector_outbox.heartbeat import silent
from django_connector_outbox.models import Heartbeat

if TYPE_CHECKING:  # ModelAdmin is generic for django-stubs only, not at run time
    HeartbeatAdminBase = admin.ModelAdmin[Heartbeat]
else:
    HeartbeatAdminBase = admin.ModelAdmin


@admin.register(Heartbeat)
class HeartbeatAdmin(HeartbeatAdminBase):
    list_display = (
        "worker",
        "host",
        "pid",
        "served",
        "started_at",
        "last_seen",
        "sent",
        "in_flight",
        "loop_lag",
        "alive",
    )
    ordering = ("worker", "started_at")
    list_display_links = None
    readonly_fields = (
        "worker",
        "host",
        "pid",
        "sources",
        "started_at",
        "last_seen",
        "sent",
        "in_flight",
        "loop_lag",
    )

    @admin.display(description=_("sources"))
    def served(self, heartbeat: Heartbeat) -> str:
        return ", ".join(heartbeat.sources)

    @admin.display(boolean=True, description=_("heard from within LEASE"))
    def alive(self, heartbeat: Heartbeat) -> bool:
        return not silent(heartbeat.last_seen, timezone.now(), conf.LEASE)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
