"""What operators must fix per workspace of a source with installations: installations revoked,
refreshes failing, and workspaces whose posts wait with no installation at all.

A fixed number of queries per source, each served by an index (the installations' unique
(source, workspace_id), the posts' (source, state, queued_at)), and at most `limit` rows of
each kind read: `outbox_status` stays fast at ten thousand installations.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Exists, OuterRef

from django_connector_outbox.models import Installation, Post


@dataclass(frozen=True)
class Revoked:
    workspace_id: str
    at: datetime
    reason: str


@dataclass(frozen=True)
class Failing:
    workspace_id: str
    error: str


@dataclass(frozen=True)
class WorkspaceProblems:
    revoked: int
    revoked_shown: list[Revoked]  # the latest first, at most `limit`
    failing: int
    failing_shown: list[Failing]
    not_installed: list[str]  # workspaces with posts waiting and no installation, at most `limit`

    def __bool__(self) -> bool:
        return bool(self.revoked or self.failing or self.not_installed)


def workspace_problems(
    source: str, *, using: str, limit: int, installed_only: bool = True
) -> WorkspaceProblems:
    """The source's problems; `installed_only`: also the workspaces without an installation
    (not for a source whose containers have destinations instead)."""
    rows = Installation.objects.using(using).filter(source=source)
    revoked = rows.filter(revoked_at__isnull=False)
    failing = rows.filter(revoked_at__isnull=True).exclude(refresh_error="")
    not_installed: list[str] = []
    if installed_only:
        # An org-wide installation serves the teams it lists: few rows, read whole.
        served = {
            team
            for extra in rows.filter(is_enterprise_install=True).values_list("extra", flat=True)
            for team in (extra or {}).get("team_ids", ())
        }
        waiting = (
            Post.objects.using(using)
            .filter(source=source)
            .waiting_for_installation()
            .filter(~Exists(rows.filter(workspace_id=OuterRef("workspace_id"))))
            .order_by("workspace_id")
            .values_list("workspace_id", flat=True)
            .distinct()
        )
        not_installed = [w for w in waiting[: limit + len(served)] if w not in served][:limit]
    return WorkspaceProblems(
        revoked=revoked.count(),
        revoked_shown=[
            Revoked(w, at, reason)
            for w, at, reason in revoked.order_by("-revoked_at", "workspace_id").values_list(
                "workspace_id", "revoked_at", "revoked_reason"
            )[:limit]
            if at is not None  # never None here (revoked rows), as the type cannot say
        ],
        failing=failing.count(),
        failing_shown=[
            Failing(w, error)
            for w, error in failing.order_by("workspace_id").values_list("workspace_id", "refresh_error")[
                :limit
            ]
        ],
        not_installed=not_installed,
    )
