"""A source's installations: each workspace's credentials, read through a cache, refreshed by
one sender at a time, revoked for good when the platform says so.

Invariants:
- A token is used only before its refresh point (`Credentials.due`): a cached token is
  checked before every use, so the cache never serves a token past it.
- A refresh runs under the installation's row lock (SELECT ... FOR UPDATE): the first sender
  to take the lock refreshes and saves the new token and refresh token in one transaction;
  the others, once they hold the lock, find a token they did not use and take it. One refresh
  per expiry, whatever the number of senders.
- A revocation names the token it is about: an answer to an old token never revokes the
  installation saved since (a re-install). A revoked installation keeps its row with its
  secrets erased, so its posts fail with a reason and no request is made for them; saving the
  workspace's installation again clears it.
- Connectors call this from the sender's send threads: each database use leaves the thread's
  connection as it found it (closed, on a send thread), so sixty-four threads never hold
  sixty-four connections.
- Entries that expire together are read again together: one thread reads every entry that
  expired lately in one query, while the others keep using theirs (at most one more
  CACHE_SECONDS: a token is never used past its refresh point whatever its entry's age), so a
  sender serving a thousand workspaces does not open a thousand connections each CACHE_SECONDS
  (bench/many_workspaces.py: 82% of the pace's ceiling with a read each, 97% together).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, router, transaction
from django.dispatch import Signal
from django.utils import timezone

from django_connector_outbox.installations.cache import TtlCache
from django_connector_outbox.installations.sealing import open_sealed, seal
from django_connector_outbox.models import Installation
from django_connector_outbox.posts import INSTALL_AGAIN
from django_connector_outbox.signals import installation_refreshed, installation_revoked

logger = logging.getLogger("django_connector_outbox.installations")

#: How long a read installation serves sends before it is read again: a revocation, refresh
#: or re-install made by another process reaches a sender this late (twice this, while
#: another thread reads the entries again) at most.
CACHE_SECONDS = 10.0
#: The most workspaces one source keeps in memory; the least recently used are read again.
CACHE_SIZE = 10_000
#: The most workspaces one read takes (an IN list the databases all take, and a query of a
#: few milliseconds).
READ_BATCH = 500
#: A rotating token is refreshed this long before it expires (slack-sdk's TokenRotator and
#: Bolt: two hours of Slack's twelve), or a quarter of its lifetime when that is shorter.
REFRESH_AHEAD = timedelta(hours=2)

#: The key of the bot token (and its refresh token) in an installation's sealed secrets.
TOKEN = "bot_token"
REFRESH_TOKEN = "bot_refresh_token"


class NotInstalled(Exception):
    """The workspace has no usable installation: its posts fail with this message as reason.
    It ends with ": " and posts.INSTALL_AGAIN, whether the workspace never installed the app or
    its installation was revoked or left without a token (the CONTRACT's wording): that ending
    is what PostQuerySet.failed_for_installation tells such failures by."""

    def __init__(self, message: str, workspace_id: str) -> None:
        super().__init__(message)
        self.workspace_id = workspace_id


class RefreshFailed(Exception):
    """A refresh did not give a new token. `revoked`: the platform says the installation is gone
    (a revoked refresh token), so retrying cannot help; else it may pass."""

    def __init__(self, reason: str, *, revoked: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.revoked = revoked


@dataclass(frozen=True)
class Credentials:
    """What a send needs of a workspace's installation (secrets kept out of its repr)."""

    source: str
    workspace_id: str
    token: str = field(repr=False)
    refresh_token: str = field(repr=False, default="")
    issued_at: datetime | None = None
    expires_at: datetime | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def due(self, now: datetime) -> bool:
        """Whether the token must be refreshed before it is used (never, if it does not expire)."""
        if self.expires_at is None:
            return False
        ahead = REFRESH_AHEAD
        if self.issued_at is not None:
            ahead = min(ahead, (self.expires_at - self.issued_at) / 4)
        return now >= self.expires_at - ahead


@dataclass(frozen=True)
class Renewal:
    """A refresh's result: the new token, its refresh token and expiry."""

    token: str = field(repr=False)
    refresh_token: str = field(repr=False)
    expires_at: datetime | None


class Installations:
    """The installations of one source (any platform): read, refresh, revoke, save."""

    def __init__(
        self,
        source: str,
        *,
        using: str | None = None,
        clock: Callable[[], datetime] = timezone.now,
        cache_seconds: float = CACHE_SECONDS,
        needs_token: bool = True,
    ) -> None:
        self.source = source
        # False where the token is the app's, not the workspace's (Teams: one Bot Framework
        # token for every tenant; an installation holds where to send, its service URL).
        self.needs_token = needs_token
        self.using = using or router.db_for_write(Installation)
        self.clock = clock
        self._cache: TtlCache[Credentials | NotInstalled] = TtlCache(ttl=cache_seconds, size=CACHE_SIZE)
        self._refreshing = threading.Lock()  # held by the thread reading expired entries again

    # -- reading

    def credentials(self, workspace_id: str) -> Credentials:
        """The workspace's credentials (cached); NotInstalled when there are none to use."""
        known = self._cache.get(workspace_id)
        if known is None:
            known = self._read_again(workspace_id)
        if isinstance(known, NotInstalled):
            raise NotInstalled(str(known), workspace_id)  # a new one: the cached one keeps no traceback
        return known

    def cached(self, workspace_id: str) -> Credentials | None:
        """The workspace's credentials if the cache holds them, fresh; else None (read them
        with `credentials`). Never reads the database: an event loop may call it."""
        known = self._cache.get(workspace_id)
        return known if isinstance(known, Credentials) else None

    def forget(self, workspace_id: str | None = None) -> None:
        """Read the workspace (or every workspace) from the database at its next use."""
        self._cache.drop(workspace_id)

    # -- refresh and revocation

    def refresh(
        self, used: Credentials, renew: Callable[[Credentials], Renewal], *, force: bool = False
    ) -> Credentials:
        """Credentials to use instead of `used`, which is due (or, with `force`, was refused as
        expired): another sender's refresh if one was saved meanwhile, else `renew`'s, saved.

        Raises NotInstalled if the installation is gone, RefreshFailed (recorded on the row as
        `refresh_error`) if `renew` fails; a revoked refresh revokes the installation.
        """
        failed: RefreshFailed | None = None
        with connection_as_found(self.using), transaction.atomic(using=self.using):
            row = self.rows().select_for_update().filter(workspace_id=used.workspace_id).first()
            current = self._read(row, used.workspace_id)
            if isinstance(current, NotInstalled):
                self._cache.put(used.workspace_id, current)
                raise current
            assert row is not None
            if current.token != used.token and not current.due(self.clock()):
                return self._remember(used.workspace_id, current)
            if not force and not current.due(self.clock()):
                return self._remember(used.workspace_id, current)
            try:
                renewal = renew(current)
            except RefreshFailed as error:
                failed = error
                if error.revoked:
                    self._erase(row, f"refresh refused: {error.reason}")
                else:
                    row.refresh_error = error.reason
                    row.save(update_fields=["refresh_error"])
            else:
                now = self.clock()
                secrets = {**open_sealed(row.secrets, what=str(row)), TOKEN: renewal.token}
                secrets[REFRESH_TOKEN] = renewal.refresh_token
                row.secrets = seal(secrets)
                row.token_issued_at, row.token_expires_at = now, renewal.expires_at
                row.refresh_error, row.updated_at = "", now
                row.save(
                    update_fields=[
                        "secrets",
                        "token_issued_at",
                        "token_expires_at",
                        "refresh_error",
                        "updated_at",
                    ]
                )
                fresh = self._read(row, used.workspace_id)
        if failed is None:
            assert isinstance(fresh, Credentials)
            self._announce(installation_refreshed, used.workspace_id)
            return self._remember(used.workspace_id, fresh)
        self.forget(used.workspace_id)
        if failed.revoked:
            self._announce(
                installation_revoked, used.workspace_id, reason=f"refresh refused: {failed.reason}"
            )
            raise NotInstalled(self._revoked_message(used.workspace_id, failed.reason), used.workspace_id)
        raise failed

    def revoke(self, workspace_id: str, reason: str, *, token: str | None = None) -> bool:
        """Mark the workspace's installation revoked and erase its secrets; with `token`, only if
        that is still its token (an answer to an old token never revokes a re-install)."""
        with connection_as_found(self.using), transaction.atomic(using=self.using):
            row = self.rows().select_for_update().filter(workspace_id=workspace_id, revoked_at=None).first()
            if row is None:
                return False
            if token is not None and open_sealed(row.secrets, what=str(row)).get(TOKEN) != token:
                return False
            self._erase(row, reason)
        self.forget(workspace_id)
        self._announce(installation_revoked, workspace_id, reason=reason)
        return True

    # -- saving (the platforms' installation stores build on this)

    def save(self, workspace_id: str, *, secrets: Mapping[str, str], **fields: Any) -> Installation:
        """Create or replace the workspace's installation (clearing any revocation). A save is
        an install: `installed_at` becomes now, unless `fields` name it (a save that only
        replaces the tokens of an installation keeps the time it was installed)."""
        now = self.clock()
        values = {
            "installed_at": now,
            **fields,
            "secrets": seal({k: v for k, v in secrets.items() if v}),
            "revoked_at": None,
            "revoked_reason": "",
            "refresh_error": "",
            "updated_at": now,
        }
        with connection_as_found(self.using):
            row, _ = Installation.objects.using(self.using).update_or_create(
                source=self.source,
                workspace_id=workspace_id,
                defaults=values,
            )
        self.forget(workspace_id)
        return row

    def secrets_of(self, row: Installation) -> dict[str, str]:
        """The sealed secrets of `row`, opened."""
        return open_sealed(row.secrets, what=str(row))

    def rows(self) -> Any:
        """The source's installation rows (a queryset)."""
        return Installation.objects.using(self.using).filter(source=self.source)

    def organizations(self) -> list[str]:
        """The workspace ids of the source's live org-wide installations (Enterprise Grid)."""
        with connection_as_found(self.using):
            return list(
                self.rows()
                .filter(is_enterprise_install=True, revoked_at=None)
                .values_list("workspace_id", flat=True)
            )

    def set_teams(self, workspace_id: str, team_ids: list[str]) -> None:
        """Record the teams an org-wide installation serves (Slack's auth.teams.list), so that
        posts naming one of them are sent with it."""
        with connection_as_found(self.using), transaction.atomic(using=self.using):
            row = self.rows().select_for_update().filter(workspace_id=workspace_id).first()
            if row is not None:
                row.extra = {**row.extra, "team_ids": sorted(set(team_ids))}
                row.save(update_fields=["extra"])
        self.forget()

    # -- internals

    def _read_again(self, workspace_id: str) -> Credentials | NotInstalled:
        """Read `workspace_id` from the database. The one thread that gets `_refreshing` reads,
        in the same query, every entry that expired lately (they were read together, so they
        expire together); while it does, the others use their entries a little past their
        time rather than each open a connection, and only a workspace never read reads alone.
        Raises what reading `workspace_id`'s own row raises (CannotOpen)."""
        if not self._refreshing.acquire(blocking=False):
            late = self._cache.late(workspace_id)
            if late is not None:
                return late
            return self._read_now([workspace_id])[workspace_id]
        try:
            expired = self._cache.expired(READ_BATCH)
            return self._read_now([workspace_id, *(key for key in expired if key != workspace_id)])[
                workspace_id
            ]
        finally:
            self._refreshing.release()

    def _read_now(self, keys: list[str]) -> dict[str, Credentials | NotInstalled]:
        """What `keys` read as, in one query (and one for org-wide installations if one has no
        row of its own), cached. A workspace whose row cannot be opened is left out, but the
        first, which raises it."""
        with connection_as_found(self.using):
            rows = {row.workspace_id: row for row in self.rows().filter(workspace_id__in=keys)}
            if len(rows) < len(keys):  # a team of an org-wide installation, or none
                orgs = list(self.rows().filter(is_enterprise_install=True, revoked_at=None))
                for key in keys:
                    serving = (org for org in orgs if key in org.extra.get("team_ids", ()))
                    if key not in rows and (org := next(serving, None)) is not None:
                        rows[key] = org
            read = {}
            for key in keys:
                try:
                    read[key] = self._cache.put(key, self._read(rows.get(key), key))
                except Exception:  # noqa: BLE001 - its own read will raise it to its own send
                    if key == keys[0]:
                        raise
        return read

    def _read(self, row: Installation | None, workspace_id: str) -> Credentials | NotInstalled:
        if row is None:
            return NotInstalled(
                f"workspace {workspace_id} has no installation of source {self.source!r}: {INSTALL_AGAIN}",
                workspace_id,
            )
        if row.revoked_at is not None:
            return NotInstalled(self._revoked_message(workspace_id, row.revoked_reason), workspace_id)
        secrets = open_sealed(row.secrets, what=f"the installation of {row}")
        if self.needs_token and not secrets.get(TOKEN):
            return NotInstalled(
                f"the installation of source {self.source!r} in workspace {workspace_id} has no token: {INSTALL_AGAIN}",
                workspace_id,
            )
        return Credentials(
            source=self.source,
            workspace_id=row.workspace_id,  # an org-wide installation's, for a team of its org
            token=secrets.get(TOKEN, ""),
            refresh_token=secrets.get(REFRESH_TOKEN, ""),
            issued_at=row.token_issued_at,
            expires_at=row.token_expires_at,
            extra=dict(row.extra),
        )

    def _announce(self, signal: Signal, workspace_id: str, **more: str) -> None:
        """Send `signal`; a receiver that raises is logged, never turned into a send's failure."""
        for _, error in signal.send_robust(
            sender=Installations, source=self.source, workspace_id=workspace_id, **more
        ):
            if isinstance(error, Exception):
                logger.error(
                    "installation signal receiver raised workspace_id=%s error=%r", workspace_id, error
                )

    def _remember(self, workspace_id: str, credentials: Credentials) -> Credentials:
        self._cache.put(workspace_id, credentials)
        return credentials

    def _revoked_message(self, workspace_id: str, reason: str) -> str:
        why = f" ({reason})" if reason else ""
        return f"the installation of source {self.source!r} in workspace {workspace_id} was revoked{why}: {INSTALL_AGAIN}"

    def _erase(self, row: Installation, reason: str) -> None:
        now = self.clock()
        row.secrets, row.revoked_at, row.revoked_reason, row.updated_at = "", now, reason, now
        row.token_expires_at = None
        row.save(update_fields=["secrets", "revoked_at", "revoked_reason", "updated_at", "token_expires_at"])


@contextlib.contextmanager
def connection_as_found(using: str) -> Iterator[None]:
    """Use database `using`, then leave this thread's connection as found: closed again on a
    send thread (see the module), kept where it was open (the sender's loop, a request)."""
    connection = connections[using]
    was_open = connection.connection is not None
    try:
        yield
    finally:
        if not was_open and not connection.in_atomic_block:
            connection.close()
