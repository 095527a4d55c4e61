"""Settings, read lazily from ``settings.CONNECTOR_OUTBOX`` on every access.

Reading on access (never caching, never writing to settings) keeps ``override_settings``
working in tests, as in django-cors-headers.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from django_connector_outbox.posts import Pace, Scope

DEFAULTS: dict[str, Any] = {
    "CONNECTORS": {},
    "LEASE": 120,  # seconds a claim holds a post
    "MAX_ATTEMPTS": 5,
    "RETRY_BASE": 2,  # backoff: min(RETRY_BASE * 2 ** (attempts - 1), RETRY_MAX)
    "RETRY_MAX": 60,
    "RETRY_JITTER": 0.2,  # backoff is multiplied by a random factor in [1 - j, 1]
    "CLAIM_BATCH": 20,
    "POLL_INTERVAL": 1.0,  # longest idle wait where no wake-up signal exists
    "RETENTION": 7 * 24 * 3600,  # finished one-off posts are kept this long
    "MAX_BODY_BYTES": 256 * 1024,  # largest compact JSON encoding of a body
    "MAX_HOLD": 3600,  # the longest wait a retry or hold may set; longer ones are cut to it
    # "auto": PostgreSQL's own statements there, the ORM elsewhere; "orm": the ORM everywhere
    # (a pooler that cannot keep prepared statements, or to compare the two).
    "STORE": "auto",
}
STORES = ("auto", "orm")

DURATIONS = ("LEASE", "RETRY_BASE", "RETRY_MAX", "POLL_INTERVAL", "RETENTION", "MAX_HOLD")
# The longest duration any setting or option may give (about ten years): a longer one is a
# mistake, and 1e12 seconds from now is past the year 9999 that datetimes (and databases) end at.
MAX_DURATION = 10 * 365 * 24 * 3600


def seconds(value: float | timedelta) -> float:
    """A duration given as seconds (int/float) or a timedelta, in seconds."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"a duration must be seconds (int/float) or a timedelta, not {value!r}")
    return float(value)


def parse_pace(value: Any, where: str) -> dict[Scope, Pace]:
    """A PACE (a source's setting, or a connector's `pace`) as {Scope: Pace}.

    Raises ValueError with a message that starts with `where` (the setting's name) and says
    what is wrong; the system check E020 reports the same message.
    """
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be a dict of scope -> (count, seconds), not {value!r}.")
    pace: dict[Scope, Pace] = {}
    for scope, limit in value.items():
        if scope not in Scope.values:
            raise ValueError(f"{where} has an unknown scope {scope!r}; scopes: {', '.join(Scope.values)}.")
        count, per = limit if isinstance(limit, (tuple, list)) and len(limit) == 2 else (None, None)
        try:
            duration = seconds(per)  # type: ignore[arg-type]  # anything: a TypeError is the answer
        except TypeError:
            duration = math.nan
        if (
            isinstance(count, bool)
            or not isinstance(count, int)
            or count < 1
            or not 0 < duration <= MAX_DURATION
        ):
            raise ValueError(
                f"{where}[{scope!r}] must be (count, seconds): a positive int, and a positive number of "
                f"seconds or a timedelta of at most {MAX_DURATION} (ten years), not {limit!r}."
            )
        pace[Scope(scope)] = Pace(count, duration)
    return pace


class Settings:
    @property
    def _user(self) -> dict[str, Any]:
        return getattr(settings, "CONNECTOR_OUTBOX", {})

    def raw(self, name: str) -> Any:
        return self._user.get(name, DEFAULTS[name])

    @property
    def CONNECTORS(self) -> dict[str, dict[str, Any]]:
        return self.raw("CONNECTORS")  # type: ignore[no-any-return]

    @property
    def LEASE(self) -> float:
        return seconds(self.raw("LEASE"))

    @property
    def MAX_ATTEMPTS(self) -> int:
        return int(self.raw("MAX_ATTEMPTS"))

    @property
    def RETRY_BASE(self) -> float:
        return seconds(self.raw("RETRY_BASE"))

    @property
    def RETRY_MAX(self) -> float:
        return seconds(self.raw("RETRY_MAX"))

    @property
    def RETRY_JITTER(self) -> float:
        return float(self.raw("RETRY_JITTER"))

    @property
    def CLAIM_BATCH(self) -> int:
        return int(self.raw("CLAIM_BATCH"))

    @property
    def POLL_INTERVAL(self) -> float:
        return seconds(self.raw("POLL_INTERVAL"))

    @property
    def RETENTION(self) -> float:
        return seconds(self.raw("RETENTION"))

    @property
    def MAX_BODY_BYTES(self) -> int:
        return int(self.raw("MAX_BODY_BYTES"))

    @property
    def MAX_HOLD(self) -> float:
        return seconds(self.raw("MAX_HOLD"))

    @property
    def STORE(self) -> str:
        return str(self.raw("STORE"))

    def pace(self, source: str) -> dict[Scope, Pace]:
        """The pacing of `source`: its "PACE" if given (``{}``: none), else its connector class's
        `pace`. ImproperlyConfigured for an unknown source; ValueError for a bad pace (E020)."""
        config = self.CONNECTORS.get(source)
        if config is None:
            raise ImproperlyConfigured(f"Unknown connector outbox source {source!r}.")
        if "PACE" in config:
            return parse_pace(config["PACE"], f"CONNECTOR_OUTBOX['CONNECTORS'][{source!r}]['PACE']")
        backend = config["BACKEND"]
        return parse_pace(import_string(backend).pace, f"{backend}.pace")


conf = Settings()
