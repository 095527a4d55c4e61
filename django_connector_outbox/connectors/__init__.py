"""Connectors, and the registry that builds one per configured source.

A source's connector is built on first use from ``CONNECTOR_OUTBOX["CONNECTORS"][source]``
as ``BACKEND(source=NAME, **OPTIONS)``, then cached; the cache is cleared when the setting
changes (so ``override_settings`` works in tests).
"""

from __future__ import annotations

import threading
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.translation import gettext

from django_connector_outbox.conf import InvalidSetting, conf, connector_class
from django_connector_outbox.connectors.base import (
    CannotCheck,
    CheckLater,
    Connector,
    Delivered,
    Hold,
    MaybeSent,
    Outcome,
    RateLimited,
    Refused,
    RetryLater,
)
from django_connector_outbox.posts import Pace, Scope

__all__ = [
    "CannotCheck",
    "CheckLater",
    "Connector",
    "Delivered",
    "Hold",
    "MaybeSent",
    "Outcome",
    "RateLimited",
    "Refused",
    "RetryLater",
    "Pace",
    "Scope",
    "build_connector",
    "connectors",
    "load_connector",
]


def build_connector(source: str) -> Connector:
    """A new connector for `source`, from its settings; ImproperlyConfigured if unknown or bad."""
    config = conf.CONNECTORS.get(source)
    if config is None:
        raise ImproperlyConfigured(
            gettext("Unknown connector outbox source %(source)r; configured: %(configured)s.")
            % {"source": source, "configured": ", ".join(sorted(conf.CONNECTORS)) or gettext("none")}
        )
    return load_connector(source, config)


def load_connector(source: str, config: dict[str, Any]) -> Connector:
    """``BACKEND(source=source, **OPTIONS)`` for a well-formed entry (see `conf.source_config`).

    Raises `InvalidSetting` E003 when BACKEND cannot be imported, E004 when it is not a
    Connector class, E005 when it cannot be built from OPTIONS: the system checks report the
    same errors.
    """
    where = {"source": source, "backend": config["BACKEND"]}
    backend = connector_class(source, config)
    try:
        return backend(source=source, **config.get("OPTIONS", {}))
    except Exception as e:  # noqa: BLE001 - any failure to build is a configuration error to report
        raise InvalidSetting(
            gettext(
                "CONNECTOR_OUTBOX['CONNECTORS'][%(source)r]: the connector cannot be built from its OPTIONS: %(error)s"
            )
            % {**where, "error": e},
            "E005",
        ) from e


class ConnectorHandler:
    """source name -> the one shared connector instance for it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._connectors: dict[str, Connector] = {}

    def __getitem__(self, source: str) -> Connector:
        try:
            return self._connectors[source]
        except KeyError:
            with self._lock:
                if source not in self._connectors:
                    self._connectors[source] = build_connector(source)
                return self._connectors[source]

    def reset(self) -> None:
        with self._lock:
            built, self._connectors = self._connectors, {}
        for connector in built.values():
            connector.close()


connectors = ConnectorHandler()


@receiver(setting_changed)
def _reset_connectors(*, setting: str, **kwargs: Any) -> None:
    if setting == "CONNECTOR_OUTBOX":
        connectors.reset()
