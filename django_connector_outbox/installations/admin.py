"""The operators' view of installations and destinations: what is installed where, what is
revoked or failing to refresh, and how many posts wait for each workspace's installation
(PostQuerySet.waiting_for_installation). Read-only. Times are model fields shown as they are,
so that Django's admin formats them all alike (the active language's format, in the current
time zone), in the list and on the change page, as it does every other model's times.

Invariant: no page shows a secret. The `secrets` column is in no list, form, search or filter
(`exclude`, and every field shown is read-only, so no form can ever be bound to it); a
destination shows nothing of its URL, not even its host, since the whole URL is the credential.
The one change offered is the `revoke_installations` action (the `change_installation`
permission), which goes through `Installations.revoke` as a platform's answer would.

Registered by django_connector_outbox.admin (the app's admin module imports this one).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.db.models import Count, IntegerField, OuterRef, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce
from django.http import HttpRequest
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from django_connector_outbox.installations.store import Installations
from django_connector_outbox.models import Destination, Installation, Post

if TYPE_CHECKING:  # ModelAdmin is generic for django-stubs only, not at run time
    InstallationAdminBase = admin.ModelAdmin[Installation]
    DestinationAdminBase = admin.ModelAdmin[Destination]
else:
    InstallationAdminBase = DestinationAdminBase = admin.ModelAdmin


def posts_waiting() -> Coalesce:
    """The posts waiting for each installation (PostQuerySet.waiting_for_installation), as one
    correlated subquery: the list stays one query per page, however many rows it shows."""
    waiting = (
        Post.objects.filter(source=OuterRef("source"), workspace_id=OuterRef("workspace_id"))
        .waiting_for_installation()
        .order_by()
        .values("source")
        .annotate(n=Count("pk"))
        .values("n")
    )
    return Coalesce(Subquery(waiting, output_field=IntegerField()), Value(0))


class ReadOnly:
    """Nobody adds, edits or deletes rows here: installations come from the platforms' install
    flows and Installations/Destinations, and a row deleted here would lose its revocation."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class RevokedFilter(admin.SimpleListFilter):
    title = _("revoked")
    parameter_name = "revoked"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", gettext("Revoked")), ("no", gettext("Live")), ("failing", gettext("Refresh failing"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        match self.value():
            case "yes":
                return queryset.filter(revoked_at__isnull=False)
            case "no":
                return queryset.filter(revoked_at__isnull=True)
            case "failing":
                return queryset.filter(revoked_at__isnull=True).exclude(refresh_error="")
        return queryset


@admin.register(Installation)
class InstallationAdmin(ReadOnly, InstallationAdminBase):
    list_display = (
        "source", "workspace_id", "team_name", "bot_user_id", "scopes", "installed_at", "token_expires_at",
        "revoked_at", "refresh_error", "waiting",
    )  # fmt: skip
    list_filter = ("source", RevokedFilter)
    search_fields = ("=workspace_id", "=enterprise_id", "team_name")
    search_help_text = _("Exact workspace or enterprise id, or part of the team name.")
    ordering = ("source", "workspace_id")
    list_per_page = 100
    show_facets = admin.ShowFacets.NEVER
    exclude = ("secrets",)
    fieldsets = (
        (None, {"fields": ("source", "workspace_id", "team_name", "enterprise_id", "enterprise_name")}),
        (
            _("App"),
            {"fields": ("app_id", "bot_id", "bot_user_id", "scopes", "installer_user_id", "user_scopes")},
        ),
        (_("Token"), {"fields": ("token_type", "token_issued_at", "token_expires_at", "refresh_error")}),
        (_("Times"), {"fields": ("installed_at", "updated_at", "revoked_at", "revoked_reason", "waiting")}),
        (_("Platform"), {"fields": ("is_enterprise_install", "extra")}),
    )
    readonly_fields = (
        "source", "workspace_id", "team_name", "enterprise_id", "enterprise_name", "app_id", "bot_id",
        "bot_user_id", "scopes", "installer_user_id", "user_scopes", "token_type", "token_issued_at",
        "token_expires_at", "refresh_error", "installed_at", "updated_at", "revoked_at", "revoked_reason",
        "waiting",
        "is_enterprise_install", "extra",
    )  # fmt: skip
    actions = ("revoke_installations",)
    empty_value_display = "—"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Installation]:
        # defer: the sealed secrets are never even read for these pages.
        return super().get_queryset(request).defer("secrets").annotate(posts_waiting=posts_waiting())

    def has_revoke_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(f"{self.opts.app_label}.change_installation")

    @admin.display(description=_("scopes"))
    def scopes(self, row: Installation) -> str:
        return ", ".join(s for s in row.bot_scopes.split(",") if s)

    @admin.display(description=_("posts waiting"), ordering="posts_waiting")
    def waiting(self, row: Installation) -> int:
        return getattr(row, "posts_waiting", 0)

    @admin.action(permissions=["revoke"], description=_("Revoke selected installations (erase their tokens)"))
    def revoke_installations(self, request: HttpRequest, queryset: QuerySet[Installation]) -> None:
        revoked = 0
        for source, workspace_id in queryset.filter(revoked_at=None).values_list("source", "workspace_id"):
            reason = f"revoked in the admin by {request.user.get_username()}"
            if Installations(source, using=queryset.db).revoke(workspace_id, reason):
                revoked += 1
        text = ngettext(
            "%(count)s installation(s) revoked.", "%(count)s installation(s) revoked.", revoked
        ) % {"count": revoked}
        self.message_user(request, text, messages.SUCCESS)


@admin.register(Destination)
class DestinationAdmin(ReadOnly, DestinationAdminBase):
    list_display = ("source", "container_id", "workspace_id", "updated_at")
    list_filter = ("source",)
    search_fields = ("=container_id", "=workspace_id")
    search_help_text = _("Exact container or workspace id.")
    ordering = ("source", "container_id")
    list_per_page = 100
    show_facets = admin.ShowFacets.NEVER
    exclude = ("secrets",)
    fields = ("source", "container_id", "workspace_id", "created_at", "updated_at")
    readonly_fields = fields

    def get_queryset(self, request: HttpRequest) -> QuerySet[Destination]:
        return super().get_queryset(request).defer("secrets")
