"""A fake Microsoft Teams on 127.0.0.1: Azure AD's token endpoint and the Bot Connector API,
faithful for what the Teams connector uses.

- ``POST /{tenant}/oauth2/v2.0/token`` (client credentials, form-encoded): checks the app id,
  password and scope, answers ``{"token_type": "Bearer", "expires_in", "access_token"}`` or
  Azure AD's ``{"error": "invalid_client", "error_description": "AADSTS…"}``.
- ``POST {serviceUrl}v3/conversations/{id}/activities`` creates an activity (201 ``{"id"}``);
  ``PUT …/activities/{activityId}`` updates one (200 ``{"id"}``), ``DELETE`` on it deletes one
  (200, no body; deleted, it is 404 ``ActivityNotFound``; a root's reply chain stays, as in
  Teams, where it shows "This message has been deleted"). The service URL is any path
  prefix (``/teams/``, as ``https://smba.trafficmanager.net/teams/``). A conversation id
  ``{channel};messageid={root}`` is a reply in the root's chain. Errors as the Bot Connector's
  ErrorResponse ``{"error": {"code", "message"}}``: 401 for a missing, unknown or expired token,
  403 ``BotNotInConversationRoster``, 404 ``ConversationNotFound`` / ``ActivityNotFound``, 400
  ``BadArgument`` (an Adaptive Card the schema refuses: adaptive_card.py), 413
  ``MessageSizeTooBig`` (over about 100 KB).

Limits, when given: per conversation (its channel, replies included) any number of windows
(msteams-docs: 7/1 s, 8/2 s, 60/30 s, 1800/3600 s), per tenant one (50/1 s), each a sliding
window; a 429 says ``Retry-After`` (seconds, rounded up) unless `retry_after_header` is off.

Scripted actions per route ("token", "create", "update", "delete"): "error" (`status`, `code`),
"ratelimit" (429, `retry_after`), "unavailable" (503 with Retry-After), "html" (a proxy's page), "drop" (stored, no reply),
"drop_before", "reset", "delay". ``python -m django_connector_outbox.fakes.teams [--port N]
[--app-id ID] [--app-password P] [--conversation ID]`` serves one for other processes
(``GET /_fake/state``, ``POST /_fake/script``): its first line is the `login_url`, then come the
settings to paste and the installation to record. In a project's tests, the ``fake_teams``
fixture of the package's pytest plugin is one.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Self
from urllib.parse import parse_qs, unquote, urlsplit

from django_connector_outbox.fakes.adaptive_card import attachment_errors
from django_connector_outbox.fakes.base import (
    JSON,
    Answer,
    CommonActions,
    FakeHandler,
    FakeServer,
    Limit,
    command_line,
    parse_json,
)

APP_ID = "00000000-0000-4000-8000-0000000b0700"
APP_PASSWORD = "fake~teams~client~secret~0123456789"
SCOPE = "https://api.botframework.com/.default"
TENANT = "11111111-2222-3333-4444-555555555555"
CHANNEL = "19:general0000000000000000000000@thread.tacv2"
#: "The message size limit is approximately 100 KB", counted in UTF-16 (msteams-docs
#: bots/how-to/format-your-bot-messages.md); over it Teams answers 413 MessageSizeTooBig.
MESSAGE_BYTES = 100 * 1024
#: The documented per bot per thread limits ("Send to conversation").
THREAD_LIMITS = (Limit(7, 1.0), Limit(8, 2.0), Limit(60, 30.0), Limit(1800, 3600.0))


@dataclass
class Call:
    """One request the fake received (no token or password is kept)."""

    route: str
    conversation: str
    activity_id: str
    body: Any
    authorized: bool


@dataclass
class Action(CommonActions):
    """How to answer one scripted call: "pass", "error" (`status`, `code`), "ratelimit" (429,
    `retry_after`), "html" (`status`), "drop", "drop_before", "reset", "delay" (`seconds`)."""

    kind: str
    status: int = 400
    code: str = "BadArgument"
    retry_after: int = 1
    seconds: float = 0.0


def error(status: int, code: str) -> Action:
    return Action("error", status=status, code=code)


def ratelimit(retry_after: int = 1) -> Action:
    return Action("ratelimit", status=429, retry_after=retry_after)


def unavailable(retry_after: int = 1) -> Action:
    """503 with Retry-After: the service turns the request away before doing it."""
    return Action("unavailable", status=503, code="ServiceUnavailable", retry_after=retry_after)


html = Action.html
drop = Action.drop
reset = Action.reset
delay = Action.delay


class TeamsError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclass
class Activity:
    id: str
    conversation: str  # the channel or chat, without ";messageid="
    text: str
    reply_to: str | None = None  # the root of its reply chain
    body: JSON = field(default_factory=dict)
    edits: int = 0


@dataclass
class Conversation:
    id: str
    tenant: str
    bot_member: bool = True
    activities: dict[str, Activity] = field(default_factory=dict)
    deleted: set[str] = field(default_factory=set)  # ids of activities deleted: their chains stay


class SlidingWindow:
    """At most `limit.count` requests in any `limit.seconds`."""

    def __init__(self, limit: Limit) -> None:
        self.limit = limit
        self.times: deque[float] = deque()

    def wait(self, now: float) -> float:
        while self.times and self.times[0] <= now - self.limit.seconds:
            self.times.popleft()
        if len(self.times) < self.limit.count:
            return 0.0
        return self.times[0] + self.limit.seconds - now

    def take(self, now: float) -> None:
        self.times.append(now)


class FakeTeams(FakeServer[Call, Action]):
    """The fake server. Thread-safe: the HTTP handlers and the test share it under one lock."""

    thread_name = "fake-teams"
    action_class = Action
    routes = frozenset({"token", "create", "update", "delete"})
    platform = "Microsoft Teams"
    source_name = "teams"
    backend = "django_connector_outbox.connectors.teams.TeamsConnector"

    def __init__(
        self,
        app_id: str = APP_ID,
        app_password: str = APP_PASSWORD,
        *,
        conversations: tuple[str, ...] = (CHANNEL,),
        tenant: str = TENANT,
        thread_limits: tuple[Limit, ...] = (),
        tenant_limit: Limit | None = None,
        token_lifetime: int = 3599,
        retry_after_header: bool = True,
        clock: Callable[[], float] = time.time,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        super().__init__(clock=clock, host=host, port=port)
        self.app_id, self.app_password = app_id, app_password
        self.token_lifetime = token_lifetime
        self.thread_limits, self.tenant_limit = thread_limits, tenant_limit
        self.retry_after_header = retry_after_header
        self._windows: dict[tuple[str, str], list[SlidingWindow]] = {}
        self.tokens: dict[str, float] = {}  # token -> expires at (fake clock)
        self.token_requests: list[str] = []  # the tenant of each
        self.limited: Counter[str] = Counter()  # "thread", "tenant" -> its 429s
        self.conversations: dict[str, Conversation] = {}
        self._ids = itertools.count(1_700_000_000_000)  # Teams message ids look like epoch ms
        self._tokens = itertools.count(1)
        for conversation in conversations:
            self.add_conversation(conversation, tenant=tenant)

    @property
    def login_url(self) -> str:
        """What to give the connector as `login_url`."""
        return self.origin

    @property
    def service_url(self) -> str:
        """What a tenant's installation holds as its service URL."""
        return f"{self.origin}/teams/"

    # -- the settings of a source it delivers, and python -m

    @property
    def address(self) -> str:
        return self.login_url

    def connector_options(self) -> JSON:
        return {"app_id": self.app_id, "app_password": self.app_password, "login_url": self.login_url}

    def guide(self, source: str) -> str:
        with self._lock:
            tenants = sorted({c.tenant for c in self.conversations.values()}) or [TENANT]
            conversations = ", ".join(self.conversations) or "none"
        saves = "\n".join(
            f'TeamsInstallations("{source}").save("{tenant}", service_url="{self.service_url}")'
            for tenant in tenants
        )
        return f"""\
Each tenant's service URL comes from its installation, as your bot records it from Teams'
activities; for the fake's, once, in `manage.py shell`:

from django_connector_outbox.installations.teams import TeamsInstallations
{saves}

Then queue posts with workspace_id="{tenants[0]}" (the tenant)
and a container_id of its conversations: {conversations}
(more: --conversation, repeated, or POST {self.origin}/_fake/conversations
{{"id": "19:...@thread.tacv2"}}); a reply in a channel's thread is "CHANNEL;messageid=ROOT"."""

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--app-id", default=APP_ID, help="the bot's Microsoft App ID it accepts")
        parser.add_argument("--app-password", default=APP_PASSWORD, help="the app's client secret it accepts")
        parser.add_argument("--tenant", default=TENANT, help="the tenant of its conversations")
        parser.add_argument(
            "--conversation", action="append", default=[], help="a conversation id (repeatable)"
        )
        parser.add_argument("--thread-limit", action="append", default=[], help="COUNT/SECONDS (repeatable)")
        parser.add_argument("--documented-limits", action="store_true", help="the documented thread limits")
        parser.add_argument("--tenant-limit", default=None, help="COUNT/SECONDS")

    @classmethod
    def from_options(cls, options: argparse.Namespace) -> Self:
        limits = tuple(Limit.parse(x) for x in options.thread_limit)
        return cls(
            options.app_id,
            options.app_password,
            conversations=tuple(options.conversation) or (CHANNEL,),
            tenant=options.tenant,
            thread_limits=limits + (THREAD_LIMITS if options.documented_limits else ()),
            tenant_limit=Limit.parse(options.tenant_limit) if options.tenant_limit else None,
            host=options.host,
            port=options.port,
        )

    # -- set-up and inspection, for tests

    def add_conversation(
        self, conversation_id: str, *, tenant: str = TENANT, bot_member: bool = True
    ) -> None:
        with self._lock:
            self.conversations[conversation_id] = Conversation(conversation_id, tenant, bot_member)

    def expire_tokens(self) -> None:
        """Every token issued so far is refused from now on (401), as a revoked or expired one."""
        with self._lock:
            self.tokens = dict.fromkeys(self.tokens, -math.inf)

    def activities(self, conversation_id: str) -> list[Activity]:
        with self._lock:
            return list(self.conversations[conversation_id].activities.values())

    def state(self) -> JSON:
        with self._lock:
            return {
                "calls": [asdict(c) for c in self.calls],
                "token_requests": list(self.token_requests),
                "conversations": {
                    cid: [asdict(a) for a in c.activities.values()] for cid, c in self.conversations.items()
                },
                "limited": dict(self.limited),
                **self.records(),
            }

    # -- the token endpoint

    def issue_token(self, tenant: str, form: dict[str, str]) -> Answer:
        with self._lock:
            self.token_requests.append(tenant)
            if form.get("grant_type") != "client_credentials":
                return 400, _aad(
                    "unsupported_grant_type", "AADSTS70003: The app requested an unsupported grant type."
                )
            if form.get("client_id") != self.app_id:
                return 400, _aad(
                    "unauthorized_client",
                    f"AADSTS700016: Application with identifier '{form.get('client_id')}' was not found.",
                )
            if form.get("client_secret") != self.app_password:
                return 401, _aad("invalid_client", "AADSTS7000215: Invalid client secret provided.")
            if form.get("scope") != SCOPE:
                return 400, _aad("invalid_scope", "AADSTS1002012: The provided value for scope is not valid.")
            token = f"fake-teams-access-token-{next(self._tokens)}-{int(self.clock())}"
            self.tokens[token] = self.clock() + self.token_lifetime
            return 200, {
                "token_type": "Bearer",
                "expires_in": self.token_lifetime,
                "ext_expires_in": self.token_lifetime,
                "access_token": token,
            }

    def authorized(self, header: str | None) -> bool:
        token = (header or "").removeprefix("Bearer ")
        with self._lock:
            return self.tokens.get(token, -math.inf) > self.clock()

    # -- limits

    def limit(self, conversation_id: str) -> float | None:
        """Seconds to wait when a limit refuses this write, else None (and it counts)."""
        with self._lock:
            now = self.clock()
            channel = conversation_id.split(";")[0]
            conversation = self.conversations.get(channel)
            tenant = conversation.tenant if conversation else ""
            windows = [("thread", w) for w in self._windows_of("thread", channel, self.thread_limits)]
            if self.tenant_limit is not None:
                windows += [("tenant", w) for w in self._windows_of("tenant", tenant, (self.tenant_limit,))]
            name, wait = max(((n, w.wait(now)) for n, w in windows), key=lambda x: x[1], default=("", 0.0))
            if wait > 0:
                self.limited[name] += 1
                return wait
            for _, window in windows:
                window.take(now)
            return None

    def _windows_of(self, kind: str, key: str, limits: tuple[Limit, ...]) -> list[SlidingWindow]:
        return self._windows.setdefault((kind, key), [SlidingWindow(limit) for limit in limits])

    # -- the Bot Connector

    def handle(self, route: str, conversation_id: str, activity_id: str, body: Any) -> Answer:
        with self._lock:
            try:
                if route == "create":
                    answer: Answer = 201, self._create(conversation_id, body)
                elif route == "update":
                    answer = 200, self._update(conversation_id, activity_id, body)
                else:
                    self._delete(conversation_id, activity_id)
                    answer = 200, None
            except TeamsError as err:
                return err.status, {"error": {"code": err.code, "message": err.message}}
            self.accept(route, conversation_id.split(";")[0])
            return answer

    def _conversation(self, conversation_id: str) -> tuple[Conversation, str | None]:
        channel, _, root = conversation_id.partition(";messageid=")
        conversation = self.conversations.get(channel)
        if conversation is None:
            raise TeamsError(404, "ConversationNotFound", "Conversation not found.")
        if not conversation.bot_member:
            raise TeamsError(
                403, "BotNotInConversationRoster", "The bot is not part of the conversation roster."
            )
        if root and root not in conversation.activities and root not in conversation.deleted:
            raise TeamsError(404, "ConversationNotFound", "Conversation not found.")
        return conversation, root or None

    def _create(self, conversation_id: str, body: Any) -> JSON:
        conversation, root = self._conversation(conversation_id)
        text = _check_activity(body)
        activity = Activity(str(next(self._ids)), conversation.id, text, reply_to=root, body=dict(body))
        conversation.activities[activity.id] = activity
        return {"id": activity.id}

    def _update(self, conversation_id: str, activity_id: str, body: Any) -> JSON:
        conversation, _ = self._conversation(conversation_id)
        activity = conversation.activities.get(activity_id)
        if activity is None:
            raise TeamsError(404, "ActivityNotFound", "Activity not found.")
        activity.text, activity.body = _check_activity(body), dict(body)
        activity.edits += 1
        return {"id": activity.id}

    def _delete(self, conversation_id: str, activity_id: str) -> None:
        conversation, _ = self._conversation(conversation_id)
        if conversation.activities.pop(activity_id, None) is None:
            raise TeamsError(404, "ActivityNotFound", "Activity not found.")
        conversation.deleted.add(activity_id)


def _check_activity(body: Any) -> str:
    if not isinstance(body, dict) or body.get("type") != "message":
        raise TeamsError(400, "BadArgument", "Activity type must be 'message'.")
    text = body.get("text", "")
    if not isinstance(text, str) or not (text.strip() or body.get("attachments")):
        raise TeamsError(400, "BadArgument", "Activity must have text or attachments.")
    problems = attachment_errors(body.get("attachments", []))
    if problems:
        raise TeamsError(400, "BadArgument", f"Invalid attachment: {'; '.join(problems)}")
    if len(json.dumps(body, ensure_ascii=False).encode("utf-16-le")) > MESSAGE_BYTES:
        raise TeamsError(413, "MessageSizeTooBig", "Message size too big.")
    return text


def _aad(code: str, description: str) -> JSON:
    return {
        "error": code,
        "error_description": f"{description} Trace ID: 0000 Correlation ID: 0000",
        "error_codes": [0],
    }


class _Handler(FakeHandler):
    fake: FakeTeams
    protocol_version = "HTTP/1.1"  # keep-alive: the client's pool is exercised
    normal_kind = "pass"

    def do_GET(self) -> None:
        if not self._control(urlsplit(self.path).path):
            self._reply(404, {"error": {"code": "NotFound", "message": "Not found."}})

    def do_POST(self) -> None:
        path = urlsplit(self.path).path
        if self._control(path):
            return
        if path == "/_fake/conversations":
            spec = self._read_json()
            self.fake.add_conversation(spec["id"], tenant=spec.get("tenant", TENANT))
            self._reply(200, {"ok": True})
        elif path.endswith("/oauth2/v2.0/token"):
            tenant = path.strip("/").split("/")[0]
            form = {k: v[0] for k, v in parse_qs(self._read_body().decode()).items()}
            self.fake.record(
                Call("token", "", "", {"tenant": tenant, "client_id": form.get("client_id")}, True)
            )
            self._answer(self.fake._next_action("token"), lambda: self.fake.issue_token(tenant, form))
        else:
            self._connector("create", path)

    def do_PUT(self) -> None:
        self._connector("update", urlsplit(self.path).path)

    def do_DELETE(self) -> None:
        self._connector("delete", urlsplit(self.path).path)

    def _connector(self, route: str, path: str) -> None:
        raw = self._read_body()
        _, _, rest = path.partition("/v3/conversations/")
        parts = rest.split("/")
        expected = 2 if route == "create" else 3
        if len(parts) != expected or parts[1] != "activities":
            self._reply(404, {"error": {"code": "NotFound", "message": "Not found."}})
            return
        conversation, activity_id = unquote(parts[0]), unquote(parts[2]) if route != "create" else ""
        body = parse_json(raw, invalid=None)
        authorized = self.fake.authorized(self.headers.get("Authorization"))
        self.fake.record(Call(route, conversation, activity_id, body, authorized))
        if not authorized:
            self._reply(401, {"message": "Authorization has been denied for this request."})
            return
        wait = self.fake.limit(conversation)
        if wait is not None:
            headers = {"Retry-After": str(max(1, math.ceil(wait)))} if self.fake.retry_after_header else {}
            self._reply(
                429, {"error": {"code": "TooManyRequests", "message": "Too many requests."}}, headers=headers
            )
            return
        self._answer(
            self.fake._next_action(route), lambda: self.fake.handle(route, conversation, activity_id, body)
        )

    def _answer_own(self, action: Action, work: Callable[[], Answer]) -> None:
        if action.kind == "error":
            self._reply(action.status, {"error": {"code": action.code, "message": f"scripted {action.code}"}})
        elif action.kind == "ratelimit":
            headers = {"Retry-After": str(action.retry_after)} if self.fake.retry_after_header else {}
            self._reply(
                429, {"error": {"code": "TooManyRequests", "message": "Too many requests."}}, headers=headers
            )
        elif action.kind == "unavailable":
            body = {"error": {"code": action.code, "message": f"scripted {action.code}"}}
            self._reply(503, body, headers={"Retry-After": str(action.retry_after)})
        else:
            super()._answer_own(action, work)


FakeTeams.handler_class = _Handler
running = FakeTeams.running


def main(argv: list[str] | None = None) -> None:
    command_line(FakeTeams, argv)


if __name__ == "__main__":
    main()
