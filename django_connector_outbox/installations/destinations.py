"""Destinations: a URL (and signing secret) per container, for sources whose platform gives one
incoming-webhook URL per channel (Teams Workflows, Mattermost, Discord, Google Chat).

The URL is a credential (whoever has it can post), so it is sealed like an installation's
tokens. Reads go through a cache of CACHE_SECONDS, as installations' do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

from django.db import router
from django.utils import timezone

from django_connector_outbox.installations.cache import TtlCache
from django_connector_outbox.installations.sealing import open_sealed, seal
from django_connector_outbox.installations.store import CACHE_SECONDS, CACHE_SIZE, connection_as_found
from django_connector_outbox.models import Destination
from django_connector_outbox.validation import id_flaw


class NoDestination(Exception):
    """The container has no destination: its posts fail with this message as reason."""


@dataclass(frozen=True)
class Target:
    """Where one container's posts go (its secrets kept out of the repr)."""

    container_id: str
    workspace_id: str
    url: str = field(repr=False)
    secret: str | None = field(repr=False, default=None)


class Destinations:
    """The destinations of one source: ``Destinations("teams-hooks").set("C1", url, secret=...)``."""

    def __init__(
        self, source: str, *, using: str | None = None, cache_seconds: float = CACHE_SECONDS
    ) -> None:
        self.source = source
        self.using = using or router.db_for_write(Destination)
        self._cache: TtlCache[Target | NoDestination] = TtlCache(ttl=cache_seconds, size=CACHE_SIZE)

    def set(self, container_id: str, url: str, *, workspace_id: str = "", secret: str | None = None) -> None:
        """Send the container's posts to `url` (signed with `secret`, if given) from now on."""
        for name, value, required in (
            ("container_id", container_id, True),
            ("workspace_id", workspace_id, False),
        ):
            if flaw := id_flaw(value, required=required):
                raise ValueError(f"Destinations.set: {name} {flaw}")
        parts = urlsplit(url) if isinstance(url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
            # Not the URL itself: it is a credential.
            raise ValueError(f"Destinations.set: the URL of container {container_id} must be an http(s) URL")
        if secret is not None and (not isinstance(secret, str) or not secret):
            raise ValueError("Destinations.set: secret must be a non-empty string or None")
        secrets = {"url": url, **({"secret": secret} if secret else {})}
        now = timezone.now()
        Destination.objects.using(self.using).update_or_create(
            source=self.source,
            container_id=container_id,
            defaults={"workspace_id": workspace_id, "secrets": seal(secrets), "updated_at": now},
            create_defaults={
                "workspace_id": workspace_id,
                "secrets": seal(secrets),
                "created_at": now,
                "updated_at": now,
            },
        )
        self._cache.drop(container_id)

    def remove(self, container_id: str) -> bool:
        """Stop sending the container's posts anywhere; False if it had no destination."""
        deleted, _ = (
            Destination.objects.using(self.using)
            .filter(source=self.source, container_id=container_id)
            .delete()
        )
        self._cache.drop(container_id)
        return bool(deleted)

    def cached(self, container_id: str) -> Target | None:
        """Where the container's posts go if the cache holds it, fresh; else None (`target`
        reads it). Never reads the database: an event loop may call it."""
        known = self._cache.get(container_id)
        return known if isinstance(known, Target) else None

    def target(self, container_id: str) -> Target:
        """Where the container's posts go (cached); NoDestination if nowhere."""
        known = self._cache.get(container_id)
        if known is None:
            with connection_as_found(self.using):
                row = (
                    Destination.objects.using(self.using)
                    .filter(source=self.source, container_id=container_id)
                    .first()
                )
            if row is None:
                known = NoDestination(
                    f"container {container_id} has no destination in source {self.source!r}: "
                    "set one with Destinations(source).set(container_id, url)"
                )
            else:
                secrets = open_sealed(row.secrets, what=f"the destination {row}")
                known = Target(container_id, row.workspace_id, secrets["url"], secrets.get("secret"))
            self._cache.put(container_id, known)
        if isinstance(known, NoDestination):
            raise NoDestination(str(known))
        return known

    def forget(self, container_id: str | None = None) -> None:
        self._cache.drop(container_id)
