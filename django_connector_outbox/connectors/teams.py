"""Microsoft Teams, through the Bot Framework's Bot Connector REST API, with httpx.

Place: ``workspace_id`` is the tenant id, ``container_id`` the conversation id (a channel's
``19:…@thread.tacv2``, a group chat's ``19:…@thread.v2``, a personal chat's ``a:…``),
``thread_id`` the root message of a channel's reply chain ("" for none), ``message_ref`` the
activity id. The service URL of each tenant comes from its installation
(`installations.teams.TeamsInstallations`); the token is the app's, for every tenant.

Calls: a message is ``POST {serviceUrl}/v3/conversations/{id}/activities`` (a proactive
message: an Activity of type ``message``, the post's body its fields); a status is that once,
then ``PUT …/activities/{activityId}`` (UpdateActivity); a delete (a retract) is ``DELETE`` on
the same route (DeleteActivity), done also when Teams answers 404 (gone already). A reply in a
channel goes to the conversation ``{channel id};messageid={root message id}``, Teams' address
of a reply chain.

Auth: an Azure AD token of the client-credentials grant (scope ``https://api.botframework.com/
.default``), fetched by one thread at a time, kept until shortly before it expires, and renewed
once within a send that Teams answers 401 (no attempt is spent on it).

No lookup: the Bot Connector cannot read a conversation (only Microsoft Graph can, with the
protected ``ChannelMessage.Read.All`` permission), so `find_sent` raises `CannotCheck` and a
create whose reply was lost ends ``uncertain`` rather than maybe twice. A delete is never looked
up: sent again, an activity deleted already answers 404, which is done.

Both forms, one plan (connectors/http.py): run_outbox awaits `asend` on the loop's async
client; `send` carries out the same requests and mapping through the blocking client. The
tenant's installation is read, and a due token fetched (through the blocking client, one fetch
at a time), off the loop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

import httpx
from django.core import checks
from django.utils.translation import gettext

from django_connector_outbox.connectors import teams_render
from django_connector_outbox.connectors.base import (
    CannotCheck,
    Delivered,
    Hold,
    MaybeSent,
    Outcome,
    RateLimited,
    Refused,
    RetryLater,
)
from django_connector_outbox.connectors.http import (
    DEFAULT_TIMEOUT,
    HttpConnector,
    LostReply,
    NotSent,
    Plan,
    TransportError,
    http,
    json_or_none,
    parse_retry_after,
)
from django_connector_outbox.connectors.plans import cached_or, offload
from django_connector_outbox.connectors.spread import Recent429s
from django_connector_outbox.installations.store import Installations, NotInstalled
from django_connector_outbox.installations.teams import SERVICE_URL
from django_connector_outbox.message import Message
from django_connector_outbox.posts import ClaimedPost, Kind, Scope

DEFAULT_LOGIN_URL = "https://login.microsoftonline.com"
#: A multi-tenant bot's token comes from this tenant; a single-tenant bot's from its own
#: (botframework-connector's MicrosoftAppCredentials: "'botframework.com' is the default
#: tenant when no value is provided", required otherwise for SingleTenant app types).
MULTI_TENANT = "botframework.com"
#: The Bot Connector's audience (learn.microsoft.com, "Authentication with the Bot Connector API").
SCOPE = "https://api.botframework.com/.default"
#: A token is renewed this long before it expires (or a quarter of its life, if shorter).
RENEW_AHEAD = 300.0
#: The place comes from the post and its installation: a body that sets it is refused.
PLACE_FIELDS = frozenset({"conversation", "serviceUrl", "id", "replyToId"})
#: "The thread limit of 3600 seconds and 1800 operations applies only if multiple bot
#: messages are sent to a single user" (msteams-docs bots/how-to/rate-limit.md): after each
#: write to a personal chat (an id not of a thread, "19:…"), its conversation waits 2 s.
PERSONAL_INTERVAL = 2.0
#: Teams' 429 does not say which limit tripped (the thread's or the app's 50 a second in the
#: tenant); 429s from this many conversations of one tenant within the window hold the tenant.
WORKSPACE_429_CONVERSATIONS = 2
WORKSPACE_429_WINDOW = 5.0  # seconds
#: A 429 without Retry-After (the docs promise none: "implement the appropriate backoff").
DEFAULT_WAIT = 2.0


class TokenError(Exception):
    """No token: Azure AD refused (bad app id or password) or could not be reached."""

    def __init__(self, reason: str, after: float | None = None) -> None:
        super().__init__(reason)
        self.reason, self.after = reason, after


class AppToken:
    """The bot's access token, shared by the send threads: one fetch at a time, kept until
    `RENEW_AHEAD` before it expires, renewed at once when Teams refuses the one a send used."""

    def __init__(self, fetch: Callable[[], tuple[str, float]], clock: Callable[[], float] = time.monotonic):
        self._fetch, self._clock = fetch, clock
        self._lock = threading.Lock()
        self._current: tuple[str, float] | None = None  # (token, renew at), replaced whole

    @property
    def value(self) -> str | None:
        return self._current[0] if self._current else None

    def fresh(self) -> str | None:
        """The token, if one is kept and not due for renewal: no fetch, no wait."""
        current = self._current
        return current[0] if current is not None and self._clock() < current[1] else None

    def get(self) -> str:
        return self.fresh() or self._renew(used=None)

    def renew(self, used: str) -> str:
        """A token other than `used` (refused by Teams): the one another thread got since, or new."""
        return self._renew(used=used)

    def _renew(self, used: str | None) -> str:
        with self._lock:
            current = self._current
            if current is not None and current[0] != used and self._clock() < current[1]:
                return current[0]  # another thread renewed it while this one waited
            now = self._clock()
            token, lifetime = self._fetch()
            self._current = (token, now + lifetime - min(RENEW_AHEAD, lifetime / 4))
            return token


class TeamsError:
    """A refusal of the Bot Connector: ``{"error": {"code", "message"}}`` (its ErrorResponse),
    or a body that is not one (a proxy's page)."""

    def __init__(self, response: httpx.Response) -> None:
        data = json_or_none(response)
        error = data.get("error") if isinstance(data, dict) else None
        error = error if isinstance(error, dict) else {}
        self.status = response.status_code
        self.code = str(error.get("code") or response.reason_phrase or "")[:100]
        self.message = str(error.get("message") or "")[:300]
        self.retry_after = parse_retry_after(response.headers.get("Retry-After"))

    @property
    def reason(self) -> str:
        text = f"teams {self.status} {self.code}".strip()
        return f"{text}: {self.message}" if self.message else text


class TeamsConnector(HttpConnector):
    """Messages, statuses and deletes through a Teams bot (Azure Bot registration: app id and
    password)."""

    kinds = frozenset({Kind.MESSAGE, Kind.STATUS, Kind.DELETE})
    lookup_requests = 0  # find_sent never makes a request
    #: Per bot per thread, "Send to conversation": 7 per 1 s, 8 per 2 s, 60 per 30 s, 1800 per
    #: 3600 s; per app per tenant 50 a second (msteams-docs bots/how-to/rate-limit.md). A
    #: conversation: 4 at once, then one each 0.6 s, so that no 1 s holds 7, no 2 s 8, no 30 s
    #: 60 (at 0.55 s the fake saw 59 in its busiest 30 s); a personal chat waits
    #: PERSONAL_INTERVAL more, for the 1800 an hour. A tenant: 3 at once, then one each 25 ms
    #: (40 a second: sends arrive up to 0.2 s bunched, and 45 drew 2% 429s from a sliding 50 a
    #: second). bench/rate_limits.py measures it on the fake.
    pace = {Scope.CONTAINER: (4, 2.4), Scope.WORKSPACE: (3, 0.075)}

    @classmethod
    def message_problem(cls, message: Message, options: Mapping[str, Any]) -> str | None:
        return teams_render.problem(message)

    def render(self, message: Message) -> dict[str, Any]:
        return teams_render.render(message)

    def __init__(
        self,
        source: str,
        *,
        app_id: Any = None,
        app_password: Any = None,
        tenant_id: Any = MULTI_TENANT,
        login_url: Any = DEFAULT_LOGIN_URL,
        timeout: Any = DEFAULT_TIMEOUT,
    ) -> None:
        super().__init__(source, timeout=timeout)
        # Values read from secrets files end with a newline; none of these has whitespace.
        self.app_id = app_id.strip() if isinstance(app_id, str) else app_id
        self._password = app_password.strip() if isinstance(app_password, str) else app_password
        self.tenant_id = tenant_id.strip() if isinstance(tenant_id, str) else tenant_id
        self._login_url_option = login_url
        self.token_url = f"{str(login_url).rstrip('/')}/{self.tenant_id}/oauth2/v2.0/token"
        self.installations = Installations(source, needs_token=False)
        self.token = AppToken(self._fetch_token)
        self._limits = Recent429s(WORKSPACE_429_WINDOW)

    def __repr__(self) -> str:  # never show the password
        return f"<TeamsConnector source={self.source!r} app_id={self.app_id!r}>"

    def secrets(self) -> list[str]:
        return [s for s in (self._password, self.token.value) if isinstance(s, str) and s]

    # -- the token --------------------------------------------------------------------

    def _fetch_token(self) -> tuple[str, float]:
        form = {
            "grant_type": "client_credentials",
            "client_id": str(self.app_id),
            "client_secret": str(self._password),
            "scope": SCOPE,
        }
        try:
            response = self.request("POST", self.token_url, data=form)
        except TransportError as exc:
            # A token request posts nothing: whatever happened, asking again is harmless.
            raise TokenError(f"teams token: {exc}") from None
        data = json_or_none(response)
        data = data if isinstance(data, dict) else {}
        token, lifetime = data.get("access_token"), data.get("expires_in")
        if response.status_code == 200 and isinstance(token, str) and token:
            try:  # Azure AD gives it as a number or a string
                return token, max(float(lifetime if lifetime is not None else "x"), 1.0)
            except (TypeError, ValueError):
                return token, 3599.0
        # {"error": "invalid_client", "error_description": "AADSTS7000215: Invalid client secret ..."}
        code = str(data.get("error") or response.reason_phrase)[:100]
        description = str(data.get("error_description") or "").split(" Trace ID")[0][:200]
        reason = self.scrub(f"teams token: HTTP {response.status_code} {code} {description}".strip())
        raise TokenError(reason, parse_retry_after(response.headers.get("Retry-After")))

    # -- sending ----------------------------------------------------------------------

    # -- the two forms, one plan (connectors/http.py) ---------------------------------

    def send(self, post: ClaimedPost) -> Outcome:
        return self._run(self._send_plan(post))

    async def asend(self, post: ClaimedPost) -> Outcome:
        return await self._arun(self._send_plan(post))

    def _send_plan(self, post: ClaimedPost) -> Plan[Outcome]:
        if post.kind not in self.kinds:
            return Refused(f"teams cannot send a {post.kind!r} post")
        taken = sorted(PLACE_FIELDS & post.body.keys())
        if taken:
            return Refused(f"teams body may not set {', '.join(taken)}: the outbox sets it from the post")
        try:
            # The installations' cache, or the database on a miss: off the loop.
            credentials = yield from cached_or(
                self.installations.cached(post.workspace_id),
                self.installations.credentials,
                post.workspace_id,
            )
        except NotInstalled as missing:
            return Refused(str(missing))  # no request: the tenant never added the bot, or removed it
        service_url = credentials.extra.get(SERVICE_URL)
        if not isinstance(service_url, str) or not service_url.startswith(("https://", "http://")):
            return Refused(
                f"the installation of source {self.source!r} in tenant {post.workspace_id} has no service URL: "
                "record it with TeamsInstallations.save_activity"
            )
        conversation = post.container_id
        if post.thread_id:
            # A channel's reply chain: "Channel id + Reply chain root message id".
            conversation = f"{conversation};messageid={post.thread_id}"
        url = f"{service_url.rstrip('/')}/v3/conversations/{quote(conversation, safe='')}/activities"
        if post.kind == Kind.DELETE:
            return (yield from self._delete(post, url))
        activity = {"type": "message", **post.body}
        if post.kind == Kind.STATUS and post.message_ref:
            url = f"{url}/{quote(post.message_ref, safe='')}"
            return (
                yield from self._write(post, "PUT", url, {**activity, "id": post.message_ref}, create=False)
            )
        return (yield from self._write(post, "POST", url, activity, create=True))

    def _write(
        self, post: ClaimedPost, method: str, url: str, activity: dict[str, Any], *, create: bool
    ) -> Plan[Outcome]:
        try:
            response = yield from self._authorized(method, url, activity, create=create)
        except _Lost as lost:
            return lost.outcome
        if response.status_code in (200, 201, 202):
            data = json_or_none(response)
            ref = data.get("id") if isinstance(data, dict) else None
            if create and not (isinstance(ref, str) and ref):
                return MaybeSent(f"teams answered {response.status_code} without an activity id")
            return self._delivered(post, ref if create else post.message_ref)
        return self._map_error(post, response, create=create)

    def _delete(self, post: ClaimedPost, activities_url: str) -> Plan[Outcome]:
        if not post.message_ref:
            return Refused("teams delete needs the message_ref of the activity to delete")
        url = f"{activities_url}/{quote(post.message_ref, safe='')}"
        try:
            response = yield from self._authorized("DELETE", url, None, create=False)
        except _Lost as lost:
            return lost.outcome  # deleting twice is harmless: the second finds a 404
        data = json_or_none(response)
        if response.status_code in (200, 202, 204) or (
            # Gone already (an earlier try whose reply was lost, a person), in the Bot
            # Connector's own ErrorResponse: a proxy's 404 page is no answer about the activity.
            response.status_code == 404 and isinstance(data, dict) and isinstance(data.get("error"), dict)
        ):
            return self._delivered(post, post.message_ref)
        return self._map_error(post, response, create=False)

    def _authorized(
        self, method: str, url: str, activity: dict[str, Any] | None, *, create: bool
    ) -> Plan[httpx.Response]:
        """The response to the request with the app's token; raises `_Lost` with the outcome
        when no answer came, or no token."""
        try:
            # A fetch (one at a time, blocking) only when the token is due: off the loop.
            token = self.token.fresh() or (yield from offload(self.token.get))
            response = yield from self._call(method, url, activity, token, create=create)
            if response.status_code == 401:
                # The token expired early or was revoked: a new one, once, in the same send (a
                # 401 posted nothing). A second 401 is the app's: not allowed in this tenant.
                renewed = yield from offload(self.token.renew, token)
                response = yield from self._call(method, url, activity, renewed, create=create)
        except TokenError as error:
            raise _Lost(RetryLater(error.reason, error.after)) from None
        return response

    def _call(
        self, method: str, url: str, activity: dict[str, Any] | None, token: str, *, create: bool
    ) -> Plan[httpx.Response]:
        try:
            headers = {"Authorization": f"Bearer {token}"}
            return (yield from http(method, url, json=activity, headers=headers))
        except NotSent as exc:
            raise _Lost(RetryLater(str(exc))) from None
        except LostReply as exc:
            # An update sets the activity's content, a delete removes it: sending either again is
            # harmless.
            raise _Lost(MaybeSent(str(exc)) if create else RetryLater(str(exc))) from None

    def _delivered(self, post: ClaimedPost, ref: str | None) -> Delivered:
        if not post.container_id.startswith("19:"):
            return Delivered(
                ref, Hold(PERSONAL_INTERVAL, "teams personal chat: at most 1800 messages an hour")
            )
        return Delivered(ref)

    def _map_error(self, post: ClaimedPost, response: httpx.Response, *, create: bool) -> Outcome:
        error = TeamsError(response)
        reason = self.scrub(error.reason)
        if error.status == 429 or (error.status == 503 and error.retry_after is not None):
            # 503 with Retry-After: the service turned the request away before doing it.
            after = error.retry_after if error.retry_after is not None else DEFAULT_WAIT
            conversations = self._limits.note(post.workspace_id, post.container_id)
            if conversations >= WORKSPACE_429_CONVERSATIONS:
                return RateLimited(
                    after,
                    f"{reason} (429s from {conversations} conversations: the tenant's limit)",
                    Scope.WORKSPACE,
                )
            return RateLimited(after, reason)
        if error.status == 412:
            # "In addition to retrying error code 429, error codes 412, 502, and 504 must also
            # be retried" (rate-limit.md): a precondition failed, nothing was done.
            return RetryLater(reason, error.retry_after)
        if error.status >= 500:
            # The request reached Teams, which may have posted it: with no lookup, a second
            # send could post it twice. An update is safe to send again.
            return MaybeSent(reason) if create else RetryLater(reason, error.retry_after)
        # 400 (a bad activity), 401 twice (the app is not allowed in the tenant), 403 (the bot
        # is not in the conversation: BotNotInConversationRoster), 404 (ConversationNotFound,
        # an activity to update that is gone; a delete's 404 is done before this): the same
        # request would get the same answer.
        return Refused(reason)

    async def afind_sent(self, post: ClaimedPost) -> str | None:
        return self.find_sent(post)  # no request: nothing to await

    def find_sent(self, post: ClaimedPost) -> str | None:
        if post.kind == Kind.DELETE:
            return None  # a delete is sent again: an activity deleted already answers 404
        raise CannotCheck(
            "a Teams bot cannot read a conversation's messages (only Microsoft Graph can, with "
            "ChannelMessage.Read.All): whether the message was posted cannot be checked"
        )

    # -- configuration ----------------------------------------------------------------

    def check(self) -> list[checks.CheckMessage]:
        """connector_outbox.E241 app_id, E242 app_password, E243 tenant_id, E244 login_url,
        E245 timeout. An unknown option name is a TypeError when the connector is built (E005)."""
        errors: list[checks.CheckMessage] = []
        if not isinstance(self.app_id, str) or not self.app_id:
            errors.append(
                checks.Error(
                    gettext(
                        "CONNECTOR_OUTBOX source %(source)r: Teams needs the bot's Microsoft App ID in OPTIONS['app_id']."
                    )
                    % {"source": self.source},
                    hint=gettext("The Azure Bot resource's Configuration page shows it."),
                    id="connector_outbox.E241",
                )
            )
        if not isinstance(self._password, str) or not self._password:
            errors.append(
                checks.Error(
                    gettext(
                        "CONNECTOR_OUTBOX source %(source)r: Teams needs the bot's client secret in "
                        "OPTIONS['app_password']."
                    )
                    % {"source": self.source},
                    hint=gettext(
                        "Make one under the app registration's Certificates & secrets; read it from the environment."
                    ),
                    id="connector_outbox.E242",
                )
            )
        if not isinstance(self.tenant_id, str) or not self.tenant_id or "/" in self.tenant_id:
            errors.append(
                checks.Error(
                    gettext(
                        "CONNECTOR_OUTBOX source %(source)r: OPTIONS['tenant_id'] must be the bot's tenant id "
                        "(a single-tenant bot) or %(multi)r (a multi-tenant bot), not %(value)r."
                    )
                    % {"source": self.source, "multi": MULTI_TENANT, "value": self.tenant_id},
                    id="connector_outbox.E243",
                )
            )
        errors += self.check_http_url("login_url", self._login_url_option, "connector_outbox.E244")
        errors += self.check_timeout("connector_outbox.E245")
        return errors


class _Lost(Exception):
    """A request that got no answer, or could not be made for want of a token, with the
    outcome it means."""

    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome
