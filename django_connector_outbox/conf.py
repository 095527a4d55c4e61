"""Settings, read lazily from ``settings.CONNECTOR_OUTBOX`` on every access.

Reading on access (never caching, never writing to settings) keeps ``override_settings``
working in tests, as in django-cors-headers.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings

DEFAULTS: dict[str, Any] = {
    "CONNECTORS": {},
    "LEASE": 120,  # seconds a claim holds a post
    "MAX_ATTEMPTS": 5,
    "RETRY_BASE": 2,  # backoff: min(RETRY_BASE * 2 ** (attempts - 1), RETRY_MAX)
    "RETRY_MAX": 60,
    "RETRY_JITTER": 0.2,  # backoff is multiplied by a random factor in [1 - j, 1]
    "CLAIM_BATCH": 100,  # by measurement: bench/README.md, "defaults"
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


conf = Settings()
