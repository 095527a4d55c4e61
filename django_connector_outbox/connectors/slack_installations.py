"""The Slack connector with ``"installations": True``: each workspace's bot token, its client,
its refresh and its revocation.

Imported by `SlackConnector` only for such a source (it needs the app's models, so the plain
connector stays importable before Django is set up).

Invariants:
- One slack-sdk `WebClient` per token, at most CLIENTS of them (least recently used goes
  first); the client of a token that was refreshed or revoked is dropped at once, so this
  process never calls with a token after it saved or read its replacement.
- Refreshes go through `Installations.refresh` (row lock: one refresh per expiry, whatever the
  number of senders); one that fails for a reason that may pass holds the workspace.
- No token, refresh token or client secret reaches a reason, a log line or an exception: an
  error's text is scrubbed with every secret of the call, and the client that refreshes logs
  nothing at DEBUG (slack-sdk would log the refresh token it sends and the tokens it gets).
- auth.teams.list is called at most once per TEAMS_INTERVAL per org-wide installation.
"""

from __future__ import annotations

import http.client
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Final

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from django_connector_outbox.connectors.base import RateLimited
from django_connector_outbox.connectors.slack_calls import Grant, error_code, text_of
from django_connector_outbox.connectors.text import scrub
from django_connector_outbox.installations.cache import TtlCache
from django_connector_outbox.installations.store import (
    CACHE_SIZE,
    Credentials,
    Installations,
    NotInstalled,
    RefreshFailed,
    Renewal,
)
from django_connector_outbox.posts import INSTALL_AGAIN, Scope

logger = logging.getLogger("django_connector_outbox.connectors")

#: The most WebClients one source keeps (one per token in use); the others are built again.
CLIENTS: Final = 1_000
#: A workspace whose token refresh failed for a reason that may pass waits this long.
REFRESH_RETRY: Final = 60.0
#: An org-wide installation's teams are listed (auth.teams.list) at most this often.
TEAMS_INTERVAL: Final = 60.0
#: oauth.v2.access answers meaning the installation is gone: no refresh can ever succeed.
#: (`invalid_client_id`, `bad_client_secret`: our settings are wrong, the installation is fine.)
REFRESH_REVOKED_CODES: Final = frozenset({"invalid_refresh_token", "token_revoked", "account_inactive"})

# slack-sdk logs each request's body and each reply's body at DEBUG whenever its logger's own
# `level` is NOTSET or DEBUG (it tests `logger.level`, not the effective level): for
# oauth.v2.access that is the refresh token sent and the tokens received. This logger's level
# is INFO whatever the logging configuration says; it passes slack-sdk's INFO and errors on to
# the package's logger.
QUIET: Final = logging.Logger("django_connector_outbox.connectors.slack_oauth", logging.INFO)
QUIET.parent = logger


class Held(Exception):
    """The workspace must wait (a refresh failed for a reason that may pass): `outcome`."""

    def __init__(self, outcome: RateLimited) -> None:
        super().__init__(outcome.reason)
        self.outcome = outcome


class Clients:
    """One WebClient per token, bounded (LRU) and thread-safe."""

    def __init__(self, make: Callable[[str], WebClient], size: int = CLIENTS) -> None:
        self.make = make
        self.size = size
        self._lock = threading.Lock()
        self._clients: OrderedDict[str, WebClient] = OrderedDict()

    def get(self, token: str) -> WebClient:
        with self._lock:
            client = self._clients.get(token)
            if client is None:
                client = self._clients[token] = self.make(token)
            self._clients.move_to_end(token)
            while len(self._clients) > self.size:
                self._clients.popitem(last=False)
            return client

    def drop(self, token: str) -> None:
        with self._lock:
            self._clients.pop(token, None)

    def __contains__(self, token: str) -> bool:
        with self._lock:
            return token in self._clients

    def __len__(self) -> int:
        return len(self._clients)


class WorkspaceTokens:
    """The bot tokens of a source's installations, as the Slack connector's calls need them."""

    def __init__(
        self,
        source: str,
        *,
        client_id: str,
        client_secret: str,
        make_client: Callable[..., WebClient],
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.installations = Installations(source)
        self.clients = Clients(make_client)
        self.client_id = client_id
        self.client_secret = client_secret
        # Token-less: oauth.v2.access authenticates with the client id and secret.
        self.oauth = make_client("", logger=QUIET)
        self.monotonic = monotonic
        self._teams_lock = threading.Lock()
        self._listed: dict[str, float] = {}  # org workspace id -> when its teams were listed
        self._misses: TtlCache[float] = TtlCache(ttl=2 * TEAMS_INTERVAL, size=CACHE_SIZE)
        self._orgs: tuple[float, list[str]] | None = None

    # -- what the connector asks

    def grant(self, workspace_id: str) -> Grant:
        """What to call with for a post of `workspace_id`: its installation's token (refreshed
        first if due). Raises NotInstalled, or Held when a due refresh failed."""
        credentials = self._credentials(workspace_id)
        if credentials.refresh_token and credentials.due(self.installations.clock()):
            credentials = self._refresh(workspace_id, credentials, force=False)
        return self._grant(workspace_id, credentials)

    def cached(self, workspace_id: str) -> Grant | None:
        """`grant` where the installations' cache holds the workspace's credentials and no
        refresh is due; else None (`grant` reads, or refreshes). Never reads the database."""
        credentials = self.installations.cached(workspace_id)
        if credentials is None or (credentials.refresh_token and credentials.due(self.installations.clock())):
            return None
        return self._grant(workspace_id, credentials)

    def expired(self, grant: Grant) -> Grant:
        """Slack answered `token_expired` to `grant`'s token: the token saved since, or a new one."""
        return self._grant(
            grant.workspace_id, self._refresh(grant.workspace_id, grant.credentials, force=True)
        )

    def revoked(self, grant: Grant, reason: str) -> Grant:
        """Slack refused `grant`'s token as revoked: revoke the installation if that is still its
        token, and return the one saved since (a re-install); NotInstalled if there is none."""
        used: Credentials = grant.credentials
        if self.installations.revoke(used.workspace_id, reason, token=used.token):
            logger.warning(
                "installation revoked source=%s workspace_id=%s reason=%r",
                self.installations.source, used.workspace_id, reason,
            )  # fmt: skip
        self.clients.drop(used.token)
        self.installations.forget(grant.workspace_id)
        fresh = self._credentials(grant.workspace_id)
        if fresh.token == used.token:  # revoked by then through another row? never call it again
            raise NotInstalled(
                f"the token of workspace {grant.workspace_id} was revoked ({reason}): {INSTALL_AGAIN}",
                grant.workspace_id,
            )
        return self._grant(grant.workspace_id, fresh)

    def secrets(self, credentials: Credentials | None) -> tuple[str, ...]:
        """Everything to scrub from the text of a call made with `credentials`."""
        if credentials is None:
            return (self.client_secret,)
        return (credentials.token, credentials.refresh_token, self.client_secret)

    # -- internals

    def _grant(self, workspace_id: str, credentials: Credentials) -> Grant:
        return Grant(
            workspace_id,
            self.clients.get(credentials.token),
            credentials.token,
            credentials,
            self.secrets(credentials),
        )

    def _credentials(self, workspace_id: str) -> Credentials:
        """The workspace's credentials; a team of an org-wide installation not yet known is
        looked for in the orgs' teams (auth.teams.list), at most once per TEAMS_INTERVAL."""
        try:
            return self.installations.credentials(workspace_id)
        except NotInstalled as missing:
            wait = self._list_teams(workspace_id)
            try:
                return self.installations.credentials(workspace_id)
            except NotInstalled:
                if wait <= 0:
                    raise
                # An org listed before this team was first missed may have it since: wait for
                # its next listing rather than fail a post of a team that just joined.
                raise Held(
                    RateLimited(
                        after=wait,
                        scope=Scope.WORKSPACE,
                        reason=f"{missing}; the teams of org-wide installations are listed again in {math.ceil(wait)}s",
                    )
                ) from None

    def _refresh(self, workspace_id: str, used: Credentials, *, force: bool) -> Credentials:
        try:
            fresh = self.installations.refresh(used, self._renew, force=force)
        except RefreshFailed as failed:
            raise Held(
                RateLimited(
                    after=REFRESH_RETRY,
                    scope=Scope.WORKSPACE,
                    reason=f"token refresh for workspace {workspace_id} failed: {failed.reason}",
                )
            ) from None
        except NotInstalled:
            self.clients.drop(used.token)
            self.installations.forget(workspace_id)
            raise
        if fresh.token != used.token:
            self.clients.drop(used.token)
        if fresh.workspace_id != workspace_id:
            # An org-wide installation's: the team's cache entry still holds the old token.
            self.installations.forget(workspace_id)
        return fresh

    def _renew(self, current: Credentials) -> Renewal:
        """Slack's token rotation: oauth.v2.access with grant_type=refresh_token.

        Called directly rather than through slack-sdk's TokenRotator: the refresh point is
        `Credentials.due` (decided under the row lock by `Installations.refresh`, which
        TokenRotator would decide again from a Bot object), and telling a revoked installation
        from a passing failure needs Slack's error code, which TokenRotator wraps away.
        """
        if not current.refresh_token:
            raise RefreshFailed("the installation has no refresh token", revoked=True)
        secrets = (*self.secrets(current), current.refresh_token)
        try:
            response = self.oauth.oauth_v2_access(
                client_id=self.client_id,
                client_secret=self.client_secret,
                grant_type="refresh_token",
                refresh_token=current.refresh_token,
            )
        except SlackApiError as error:
            code = error_code(error.response)
            if code is None:
                raise RefreshFailed(
                    f"oauth.v2.access: HTTP {error.response.status_code} without a Slack answer"
                ) from None
            raise RefreshFailed(
                f"slack error {code} on oauth.v2.access", revoked=code in REFRESH_REVOKED_CODES
            ) from None
        except (OSError, http.client.HTTPException) as error:  # URLError is an OSError
            raise RefreshFailed(f"oauth.v2.access: {scrub(text_of(error), secrets)}") from None
        token, refresh_token = response.get("access_token"), response.get("refresh_token")
        if not isinstance(token, str) or not token or not isinstance(refresh_token, str) or not refresh_token:
            raise RefreshFailed("oauth.v2.access answered without an access token and a refresh token")
        return Renewal(token, refresh_token, self._expiry(response.get("expires_in")))

    def _expiry(self, expires_in: Any) -> Any:
        if isinstance(expires_in, int) and not isinstance(expires_in, bool) and expires_in > 0:
            return self.installations.clock() + timedelta(seconds=expires_in)
        return None

    # -- Enterprise Grid: the teams of org-wide installations

    def _list_teams(self, workspace_id: str) -> float:
        """List the teams of each org-wide installation not listed since `workspace_id` was
        first missed (and not within TEAMS_INTERVAL); return how long until the ones skipped
        may be listed again (0: every org was asked)."""
        with self._teams_lock:
            now = self.monotonic()
            missed = self._misses.get(workspace_id)
            if missed is None:
                missed = self._misses.put(workspace_id, now)
            wait = 0.0
            for org in self._organizations(now):
                listed = self._listed.get(org)
                if listed is not None and listed >= missed:
                    continue  # listed since the miss: what it said stands
                if listed is not None and now - listed < TEAMS_INTERVAL:
                    wait = max(wait, listed + TEAMS_INTERVAL - now)
                    continue
                self._listed[org] = now
                self._list_org(org)
            return wait

    def _organizations(self, now: float) -> list[str]:
        """The source's live org-wide installations, read at most once per TEAMS_INTERVAL."""
        if self._orgs is None or now - self._orgs[0] >= TEAMS_INTERVAL:
            self._orgs = (now, self.installations.organizations())
        return self._orgs[1]

    def _list_org(self, org: str) -> None:
        try:
            credentials = self.installations.credentials(org)
        except NotInstalled:
            return
        client = self.clients.get(credentials.token)
        teams: list[str] = []
        cursor = None
        try:
            while True:
                response = client.auth_teams_list(cursor=cursor, limit=1000)
                teams += [t["id"] for t in response.get("teams") or [] if isinstance(t, dict) and t.get("id")]
                cursor = (response.get("response_metadata") or {}).get("next_cursor")
                if not cursor:
                    break
        except SlackApiError as error:
            code = error_code(error.response) or f"HTTP {error.response.status_code}"
            logger.warning(
                "auth.teams.list failed source=%s org=%s error=%s", self.installations.source, org, code
            )
            return
        except (OSError, http.client.HTTPException) as error:
            logger.warning(
                "auth.teams.list failed source=%s org=%s error=%s",
                self.installations.source, org, scrub(text_of(error), self.secrets(credentials)),
            )  # fmt: skip
            return
        self.installations.set_teams(org, teams)
