"""Microsoft Teams installations: where each tenant's posts go (its Bot Framework service URL).

A Teams bot has one token for every tenant (the app's, from Azure AD: see connectors/teams.py),
so a Teams installation holds no secret: only the tenant id (the posts' `workspace_id`) and the
service URL that the Bot Connector gave with the bot's activities in that tenant. Record it when
the bot is added (its ``conversationUpdate`` or ``installationUpdate`` activity), forget it
when it is removed; a tenant without one fails its posts with a reason that names it.

Record only activities your bot has authenticated (the Bot Connector's JWT, as every bot
framework checks it): the connector sends the bot's token to the service URL it reads here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django_connector_outbox.installations.store import Installations
from django_connector_outbox.models import Installation

#: The key of the service URL in an installation's `extra`.
SERVICE_URL = "service_url"


class TeamsInstallations:
    """The tenants a Teams source posts to, each with its service URL."""

    def __init__(self, source: str, *, using: str | None = None) -> None:
        self.installations = Installations(source, using=using, cache_seconds=0, needs_token=False)

    def save(self, tenant_id: str, *, service_url: str, team_name: str = "") -> Installation:
        """Record (or replace) the tenant's service URL, clearing any earlier removal."""
        if not tenant_id or not isinstance(tenant_id, str):
            raise ValueError("a Teams installation needs the tenant id (channelData.tenant.id)")
        if not isinstance(service_url, str) or not service_url.startswith(("https://", "http://")):
            raise ValueError(
                f"a Teams service URL is an http(s) URL (the activity's serviceUrl), not {service_url!r}"
            )
        return self.installations.save(
            tenant_id, secrets={}, team_name=team_name, extra={SERVICE_URL: service_url}
        )

    def save_activity(self, activity: Mapping[str, Any]) -> Installation:
        """Record the tenant of an incoming activity (a ``conversationUpdate`` or
        ``installationUpdate`` as received, JSON-decoded): its ``serviceUrl`` and
        ``channelData.tenant.id`` (and the team's name, when it is a team's)."""
        channel_data = activity.get("channelData") or {}
        tenant = (channel_data.get("tenant") or {}).get("id") or (activity.get("conversation") or {}).get(
            "tenantId"
        )
        team = channel_data.get("team") or {}
        return self.save(
            str(tenant or ""), service_url=activity.get("serviceUrl", ""), team_name=team.get("name", "")
        )

    def remove(self, tenant_id: str, reason: str = "the bot was removed") -> bool:
        """Forget the tenant (its posts then fail, saying to add the bot again); False if none."""
        return self.installations.revoke(tenant_id, reason)
