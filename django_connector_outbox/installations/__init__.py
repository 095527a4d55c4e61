"""Many workspaces: a source's installations (credentials per workspace) and destinations
(a URL per container), stored sealed in the app's database.

`SlackInstallationStore` needs slack-sdk (the "slack" extra); it is imported on first use so
that the rest works without it.
"""

from __future__ import annotations

from typing import Any

from django_connector_outbox.installations.destinations import Destinations, NoDestination, Target
from django_connector_outbox.installations.store import (
    Credentials,
    Installations,
    NotInstalled,
    RefreshFailed,
    Renewal,
)

__all__ = [
    "Credentials",
    "Destinations",
    "Installations",
    "NoDestination",
    "NotInstalled",
    "RefreshFailed",
    "Renewal",
    "SlackInstallationStore",
    "Target",
]


def __getattr__(name: str) -> Any:
    if name == "SlackInstallationStore":
        from django_connector_outbox.installations.slack import SlackInstallationStore

        return SlackInstallationStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
