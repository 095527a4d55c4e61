"""A fake Slack Web API on 127.0.0.1, faithful enough for the Slack connector and its sender.

It speaks the methods the connector uses (chat.postMessage, chat.update, chat.delete,
chat.postEphemeral, reactions.add, conversations.history, conversations.replies) the way Slack
does: POST with a JSON, form or query-string body, `Authorization: Bearer <token>`, `{"ok": false, "error": ...}`
answers with HTTP 200, HTTP 429 + Retry-After for rate limits, metadata returned only with
`include_all_metadata`, history newest first and cursor pagination. Blocks are checked as
Slack checks them (block_kit.py), refused with `invalid_blocks` and Slack's messages.

Every request is recorded (method and arguments, never the token), so tests can assert exactly
what reached the "platform", and the next calls of a method can be scripted to fail in the ways
Slack and networks fail: an error code, a 429, an HTML 5xx page, a dropped connection after the
post was stored (a lost reply), a reply slower than the client's timeout.

In a test: `FakeSlack(token=...).start()` ... `.stop()` (or the `with` statement, or the
`fake_slack` fixture of the package's pytest plugin). From another process: `python -m
django_connector_outbox.fakes.slack [--port P] [--token T] [--channel C1] [--team T1] [--client-id
ID] [--client-secret S]` prints its base URL on the first line of stdout, then the settings to
paste (a bot token, or "Add to Slack" with the fake's client id and secret) and how to install
in more workspaces, and serves until SIGTERM; `GET /_fake/state` returns what it holds and
received, `POST /_fake/script` scripts failures and `POST /_fake/channels` adds channels.

Many teams (django_connector_outbox/fakes/slack_teams.py keeps them): the single `token` belongs to the default
team (`team_id`); `add_team`, `add_enterprise`, `issue_code` (and `GET /oauth/v2/authorize`,
which redirects with a code), `oauth.v2.access` (code exchange, refresh with rotation),
`auth.test`, `auth.teams.list`, `revoke`/`uninstall`/`expire` serve apps installed in many
workspaces. `GET /oauth/v2/authorize` approves at once, in the default team unless its query
names another (``&team=T2``, as Slack's does) or `authorize_as` said otherwise. Each channel belongs to a team; a call must use a token serving the channel's team
(else `channel_not_found`, recorded in `wrong_team_calls`). Each recorded call names the token's
owner (`team`) and id (`token_id`, never the token). From another process: `POST /_fake/teams`,
`/_fake/enterprises`, `/_fake/install`, `/_fake/codes`, `/_fake/authorize` (`authorize_as`),
`/_fake/revoke`, `/_fake/uninstall`, `/_fake/expire` (JSON bodies with the arguments of the
methods of the same names).

An app distributed outside the Slack Marketplace (``non_marketplace``): "this method is rate
limited to 1 request per minute. The maximum and default values for the limit parameter have
both been reduced to 15 objects" (conversations.history and .replies): a larger `limit` reads 15
(the pages the docs describe), a second call within the minute is a 429.

Rate limits (none unless given): `channel_limit` and `workspace_limit` hold chat.postMessage to
"one message per second per channel, while also maintaining a workspace-wide limit", and
`method_limits` hold any method "per API method per workspace/team per app" (chat.update and
reactions.add are Tier 3: `Limit(50, 60)`). Each is a token bucket (Slack allows "short
bursts"); past one, Slack's answer: HTTP 429, `{"ok": false, "error": "ratelimited"}` and
`Retry-After` in whole seconds. `limited` counts which limit answered each enforced 429.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
import math
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Self
from urllib.parse import parse_qsl, urlencode, urlsplit

from django_connector_outbox.fakes.base import (
    JSON,
    Answer,
    Bucket,
    CommonActions,
    FakeHandler,
    FakeServer,
    Limit,
    add_chat_arguments,
    chat_channels,
    chat_limits,
    command_line,
    python_literal,
)
from django_connector_outbox.fakes.block_kit import check_blocks
from django_connector_outbox.fakes.slack_teams import (
    CLIENT_ID,
    CLIENT_SECRET,
    DEFAULT_SCOPES,
    EXPIRES_IN,
    Accounts,
    SlackError,
    Token,
)

# Slack ids and timestamps, as Slack writes them.
_TS = re.compile(r"\d{10}\.\d{6}")

# The methods that write: each one accepted is logged (`accepted`) with its time.
WRITES = frozenset({"chat.postMessage", "chat.update", "chat.delete", "chat.postEphemeral", "reactions.add"})

#: chat.postMessage keeps the first 40,000 characters of `text` (docs.slack.dev, chat.postMessage
#: "Truncating content"); chat.update refuses more than 4,000 with `msg_too_long` ("The text
#: field cannot exceed 4,000 characters", chat.update's errors).
TRUNCATED_AFTER = 40000
UPDATE_TEXT_CHARS = 4000

BOT_USER_ID = "UFAKEBOT1"
BOT_ID = "BFAKEBOT1"
APP_ID = "AFAKEAPP1"


# The arguments never recorded as given: secrets (a refresh token is recorded by its id).
_SECRET_ARGS = frozenset({"token", "client_secret", "refresh_token"})


#: A non-Marketplace app's history and replies: 15 a page, one call a minute per workspace.
NON_MARKETPLACE_HISTORY = (15, Limit(1, 60))


@dataclass
class Call:
    """One request the fake received: the API method and its arguments (token removed), and
    which team's (or enterprise's) token made it, by id."""

    method: str
    args: JSON
    authorized: bool
    content_type: str
    team: str = ""
    token_id: str = ""


@dataclass
class Action(CommonActions):
    """How to answer one scripted call.

    `kind`: "ok" (answer normally), "error" (ok:false with `code`, HTTP `status`), "ratelimit" (HTTP 429,
    `retry_after`), "html" (an HTML page with HTTP `status`), "drop" (handle the call, store the
    post, then close the connection without a reply), "drop_before" (close without handling),
    "reset" (handle, then reset the connection), "delay" (handle, then reply after `seconds`).
    """

    kind: str
    code: str = ""
    status: int = 200
    retry_after: str = "1"
    seconds: float = 0.0


def ok() -> Action:
    """Answer normally (to script a failure of a later call: ok(), error(...))."""
    return Action("ok")


def error(code: str, status: int = 200) -> Action:
    return Action("error", code=code, status=status)


def ratelimit(retry_after: str = "1") -> Action:
    return Action("ratelimit", code="ratelimited", status=429, retry_after=retry_after)


def html(status: int = 503) -> Action:
    return Action.html(status)


drop = Action.drop
reset = Action.reset
delay = Action.delay


@dataclass
class Message:
    ts: str
    text: str = ""
    user: str = BOT_USER_ID
    bot: bool = True
    thread_ts: str = ""  # the parent's ts, for a reply
    blocks: list[Any] | None = None
    attachments: list[Any] | None = None
    metadata: JSON | None = None
    reply_broadcast: bool = False
    reactions: dict[str, list[str]] = field(default_factory=dict)  # name -> users
    replies: list[str] = field(default_factory=list)  # ts of the replies, for a parent

    def as_slack(self, *, with_metadata: bool) -> JSON:
        out: JSON = {"type": "message", "ts": self.ts, "text": self.text, "user": self.user}
        if self.bot:
            out.update(bot_id=BOT_ID, app_id=APP_ID)
        if self.blocks is not None:
            out["blocks"] = self.blocks
        if self.attachments is not None:
            out["attachments"] = self.attachments
        if self.thread_ts:
            out["thread_ts"] = self.thread_ts
            out["parent_user_id"] = BOT_USER_ID
        elif self.replies:
            out.update(thread_ts=self.ts, reply_count=len(self.replies), latest_reply=self.replies[-1])
        if self.reactions:
            out["reactions"] = [
                {"name": name, "users": users, "count": len(users)} for name, users in self.reactions.items()
            ]
        if with_metadata and self.metadata is not None:
            out["metadata"] = self.metadata
        return out


@dataclass
class Channel:
    id: str
    team: str = ""  # the team it belongs to
    members: set[str] = field(default_factory=set)  # empty: anyone (for postEphemeral)
    archived: bool = False
    messages: dict[str, Message] = field(default_factory=dict)  # ts -> message (replies too)


class FakeSlack(FakeServer[Call, Action]):
    """The fake server. Thread-safe: the HTTP handlers and the test share it under one lock."""

    thread_name = "fake-slack"
    action_class = Action
    platform = "Slack"
    source_name = "slack"
    backend = "django_connector_outbox.connectors.slack.SlackConnector"

    def __init__(
        self,
        token: str = "xoxb-fake-token",
        *,
        channels: tuple[str, ...] = ("C0000000001",),
        team_id: str = "T0000000001",
        client_id: str = CLIENT_ID,
        client_secret: str = CLIENT_SECRET,
        channel_limit: Limit | None = None,
        workspace_limit: Limit | None = None,
        method_limits: Mapping[str, Limit] | None = None,
        non_marketplace: bool = False,
        clock: Callable[[], float] = time.time,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        super().__init__(clock=clock, host=host, port=port)
        self.token = token
        self.team_id = team_id  # the default team: `token`'s, and of channels added without one
        self.accounts = Accounts(client_id=client_id, client_secret=client_secret)
        default = self.accounts.add_team(team_id, name="Fake Team")
        default.bot_user_id, default.bot_id = BOT_USER_ID, BOT_ID
        self.accounts.add_token(team_id, token, clock())
        self.channel_limit = channel_limit
        self.workspace_limit = workspace_limit
        self.method_limits = dict(method_limits or {})
        # An app distributed outside the Marketplace (see the module): history and replies at
        # most 15 a page (and by default), one call a minute per workspace.
        self.history_limit = NON_MARKETPLACE_HISTORY[0] if non_marketplace else 999
        if non_marketplace:
            for method in ("conversations.history", "conversations.replies"):
                self.method_limits.setdefault(method, NON_MARKETPLACE_HISTORY[1])
        # Slack's limits are per workspace (team): each team has its own buckets.
        self._channel_buckets: dict[str, Bucket] = {}
        self._workspace_buckets: dict[str, Bucket] = {}
        self._method_buckets: dict[tuple[str, str], Bucket] = {}
        self.limited: Counter[str] = Counter()  # "channel", "workspace" or a method -> its 429s
        self._last_ts = 0.0
        self.channels: dict[str, Channel] = {}
        self.ephemeral: list[JSON] = []
        # What the next GET /oauth/v2/authorize does (see `authorize_as`).
        self._authorize: JSON = {"team": team_id, "user": "UINSTALLER1", "enterprise": False, "deny": False}
        for channel in channels:
            self.add_channel(channel)

    @property
    def base_url(self) -> str:
        """What to give the connector as `base_url`."""
        return f"{self.origin}/api/"

    # -- the settings of a source it delivers, and python -m

    @property
    def address(self) -> str:
        return self.base_url

    def connector_options(self) -> JSON:
        """One workspace's bot token (the default team's)."""
        return {"token": self.token, "base_url": self.base_url}

    def installations_options(self) -> JSON:
        """An app for many workspaces ("Add to Slack"): the fake's client id and secret."""
        return {
            "installations": True,
            "client_id": self.accounts.client_id,
            "client_secret": self.accounts.client_secret,
            "scopes": DEFAULT_SCOPES.split(","),
            "base_url": self.base_url,
        }

    def guide(self, source: str) -> str:
        with self._lock:
            team = self.accounts.teams[self.team_id]
            channels = ", ".join(c.id for c in self.channels.values() if c.team == self.team_id) or "none"
        settings = python_literal(
            {"CONNECTORS": {source: {"BACKEND": self.backend, "OPTIONS": self.installations_options()}}}
        )
        return f"""\
Queue posts with workspace_id="{team.id}" (the workspace "{team.name}") and a container_id of its
channels: {channels} (more: POST {self.origin}/_fake/channels {{"id": "C0000000009"}}).

"Add to Slack" instead (one app, many workspaces, each with its installation; see
the docs' "A Slack app for many workspaces"), with the fake's client id and secret:

CONNECTOR_OUTBOX = {settings}

and in urls.py: path("slack/", include("django_connector_outbox.installations.slack_urls")).
Open /slack/install/{source}/ on your site (http://127.0.0.1:8000/slack/install/{source}/ under
runserver): the fake approves at once (it takes any redirect URL: nothing to register) and sends
you back with a code for {team.id}; your site saves its installation. Another workspace: add it,
with its channels, not yet installed,

  curl -X POST {self.origin}/_fake/teams -d '{{"id": "T0000000002", "name": "Second", "channels": ["C0000000002"], "install": false}}'

then have the next install go there,

  curl -X POST {self.origin}/_fake/authorize -d '{{"team": "T0000000002"}}'

(or add &team=T0000000002 to the fake's /oauth/v2/authorize URL the install page redirects to, as
Slack's authorize page takes it), and open /slack/install/{source}/ again."""

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        add_chat_arguments(
            parser,
            token="xoxb-fake-token",
            channel="C0000000001",
            limits="channel, workspace or a method such as chat.update",
        )
        parser.add_argument(
            "--team", default="T0000000001", help="the id of its first workspace, the token's"
        )
        parser.add_argument(
            "--client-id", default=CLIENT_ID, help="the Slack app's client id, for Add to Slack"
        )
        parser.add_argument("--client-secret", default=CLIENT_SECRET, help="the Slack app's client secret")

    @classmethod
    def from_options(cls, options: argparse.Namespace) -> Self:
        limits = chat_limits(options)  # channel, workspace, and any method name
        return cls(
            options.token,
            channels=chat_channels(options),
            team_id=options.team,
            client_id=options.client_id,
            client_secret=options.client_secret,
            channel_limit=limits.pop("channel", None),
            workspace_limit=limits.pop("workspace", None),
            method_limits=limits,
            host=options.host,
            port=options.port,
        )

    # -- set-up and inspection, for tests

    def add_channel(
        self,
        channel_id: str,
        *,
        team: str | None = None,
        members: set[str] | None = None,
        archived: bool = False,
    ) -> None:
        """A channel of `team` (the default team if None)."""
        with self._lock:
            owner = team or self.team_id
            if owner not in self.accounts.teams:
                raise ValueError(f"no team {owner!r}: add_team first")
            self.channels[channel_id] = Channel(
                channel_id, team=owner, members=set(members or ()), archived=archived
            )

    # -- teams, installations and tokens (see django_connector_outbox/fakes/slack_teams.py)

    def add_team(
        self,
        team_id: str,
        *,
        name: str = "",
        enterprise_id: str | None = None,
        rotation: bool = False,
        expires_in: int = EXPIRES_IN,
        channels: tuple[str, ...] = (),
        install: bool = True,
    ) -> JSON | None:
        """A workspace with `channels`; with `install`, the app is installed in it and this returns
        what `oauth.v2.access` would have answered (its `access_token`, with `rotation` its
        `refresh_token` and `expires_in`)."""
        with self._lock:
            self.accounts.add_team(
                team_id, name=name, enterprise_id=enterprise_id, rotation=rotation, expires_in=expires_in
            )
            for channel in channels:
                self.add_channel(channel, team=team_id)
            return self.accounts.install(team_id, self.clock()) if install else None

    def add_enterprise(
        self,
        enterprise_id: str,
        *,
        name: str = "",
        teams: tuple[str, ...] | list[str] = (),
        rotation: bool = False,
        expires_in: int = EXPIRES_IN,
        install: bool = False,
    ) -> JSON | None:
        """An Enterprise Grid org of `teams` (added if new); with `install`, the app is installed
        org-wide and this returns the oauth.v2.access answer (its token serves every team)."""
        with self._lock:
            self.accounts.add_enterprise(
                enterprise_id, name=name, teams=list(teams), rotation=rotation, expires_in=expires_in
            )
            return self.accounts.install(enterprise_id, self.clock()) if install else None

    def install(self, owner: str, *, user: str = "UINSTALLER1", scopes: str = DEFAULT_SCOPES) -> JSON:
        """(Re)install the app in a team, or org-wide in an enterprise: new tokens."""
        with self._lock:
            return self.accounts.install(owner, self.clock(), user=user, scopes=scopes)

    def issue_code(
        self,
        *,
        team: str,
        user: str = "UINSTALLER1",
        enterprise: bool = False,
        scopes: str = DEFAULT_SCOPES,
        user_scopes: str = "",
        redirect_uri: str = "",
    ) -> str:
        """A one-time OAuth code, as Slack gives the redirect after a user approved the install
        in `team` (org-wide in its enterprise with `enterprise`); valid 10 minutes."""
        with self._lock:
            return self.accounts.issue_code(
                self.clock(),
                team=team,
                user=user,
                enterprise=enterprise,
                scopes=scopes,
                user_scopes=user_scopes,
                redirect_uri=redirect_uri,
            )

    def authorize_as(
        self,
        *,
        team: str | None = None,
        user: str = "UINSTALLER1",
        enterprise: bool = False,
        deny: bool = False,
    ) -> None:
        """What the following GET /oauth/v2/authorize do: install in `team` (org-wide with
        `enterprise`) as `user`, or, with `deny`, redirect with error=access_denied."""
        with self._lock:
            self._authorize = {
                "team": team or self.team_id,
                "user": user,
                "enterprise": enterprise,
                "deny": deny,
            }

    def revoke(self, team: str, *, error: str = "token_revoked") -> int:
        """The tokens of `team` (or enterprise) issued so far answer `error` (Slack's for a revoked
        token; `account_inactive` for a deleted workspace or bot user). Returns how many."""
        with self._lock:
            return self.accounts.revoke(team, error)

    def uninstall(self, team: str) -> int:
        """The app is uninstalled from `team`: as Slack does then, its tokens are revoked."""
        return self.revoke(team)

    def expire(self, team: str) -> int:
        """The expiring access tokens of `team` (or enterprise) expire now. Returns how many."""
        with self._lock:
            return self.accounts.expire(team, self.clock())

    @property
    def refreshes(self) -> Counter[str]:
        """Owner (team or enterprise) -> refresh grants answered."""
        with self._lock:
            return Counter(self.accounts.refreshes)

    @property
    def wrong_team_calls(self) -> list[JSON]:
        with self._lock:
            return list(self.accounts.wrong_team_calls)

    @property
    def expired_token_calls(self) -> list[JSON]:
        with self._lock:
            return list(self.accounts.expired_token_calls)

    @property
    def stale_token_calls(self) -> list[JSON]:
        with self._lock:
            return list(self.accounts.stale_token_calls)

    def accounts_identify(self, token: str | None) -> tuple[str, str]:
        """(owner, token id) of a token, ("", "") if unknown."""
        with self._lock:
            return self.accounts.identify(token)

    def tokens_used(self, method: str | None = None) -> dict[str, set[str]]:
        """Owner -> ids of the tokens its calls were made with (of `method`, or all)."""
        used: dict[str, set[str]] = {}
        with self._lock:
            for call in self.calls:
                if call.token_id and method in (None, call.method):
                    used.setdefault(call.team, set()).add(call.token_id)
        return used

    def add_message(
        self, channel: str, text: str = "", *, user: str = "UPERSON01", thread_ts: str = ""
    ) -> str:
        """A message posted by a person (not the app); returns its ts."""
        with self._lock:
            message = Message(ts=self._next_ts(), text=text, user=user, bot=False, thread_ts=thread_ts)
            self._store(self.channels[channel], message)
            return message.ts

    def script(self, method: str, *actions: Action, times: int = 1) -> None:
        """Answer the next calls of `method` with `actions` (each repeated `times`), in order."""
        super().script(method, *actions, times=times)

    # Slack's calls are known by their arguments (a method's JSON), not by the Call records.
    def calls_of(self, method: str) -> list[JSON]:  # type: ignore[override]
        with self._lock:
            return [c.args for c in self.calls if c.method == method]

    def messages(self, channel: str, *, thread_ts: str | None = None) -> list[Message]:
        """Stored messages, oldest first: top level (thread_ts None) or one thread's replies."""
        with self._lock:
            found = sorted(self.channels[channel].messages.values(), key=lambda m: m.ts)
            if thread_ts is None:
                return [m for m in found if not m.thread_ts]
            return [m for m in found if m.thread_ts == thread_ts]

    def message(self, channel: str, ts: str) -> Message:
        with self._lock:
            return self.channels[channel].messages[ts]

    def state(self) -> JSON:
        """Everything held and received, as JSON (for other processes, via /_fake/state)."""
        with self._lock:
            return {
                "calls": [asdict(c) for c in self.calls],
                "channels": {
                    cid: [
                        m.as_slack(with_metadata=True)
                        for m in sorted(ch.messages.values(), key=lambda m: m.ts)
                    ]
                    for cid, ch in self.channels.items()
                },
                "channel_teams": {cid: ch.team for cid, ch in self.channels.items()},
                "ephemeral": list(self.ephemeral),
                **self.accounts.state(),
                **self.records(),
            }

    # -- the Web API

    def _next_ts(self) -> str:
        # Slack's ts: Unix seconds with 6 decimals, unique and increasing within a channel.
        now = max(self.clock(), self._last_ts + 0.000001)
        self._last_ts = round(now, 6)
        return f"{self._last_ts:.6f}"

    def _store(self, channel: Channel, message: Message) -> None:
        channel.messages[message.ts] = message
        if message.thread_ts in channel.messages:
            channel.messages[message.thread_ts].replies.append(message.ts)

    def limit(self, method: str, args: JSON, team: str = "") -> float | None:
        """Seconds to wait if a rate limit refuses this call of `team`, else None (and the call
        counts)."""
        buckets: list[tuple[str, Bucket]] = []
        with self._lock:
            team = team or self.team_id
            if method in self.method_limits:
                key = (method, team)
                buckets.append(
                    (method, self._method_buckets.setdefault(key, Bucket(self.method_limits[method])))
                )
            if method == "chat.postMessage":
                if self.channel_limit is not None:
                    channel = _str(args, "channel")
                    bucket = self._channel_buckets.setdefault(channel, Bucket(self.channel_limit))
                    buckets.append(("channel", bucket))
                if self.workspace_limit is not None:
                    bucket = self._workspace_buckets.setdefault(team, Bucket(self.workspace_limit))
                    buckets.append(("workspace", bucket))
            now = self.clock()
            for name, bucket in buckets:
                wait = bucket.wait(now)
                if wait > 0:
                    self.limited[name] += 1
                    return wait
            for _, bucket in buckets:
                bucket.take(now)
            return None

    def team_of(self, args: JSON, token: str | None) -> str:
        """The team a call addresses: its channel's, else its token's (for the rate limits)."""
        with self._lock:
            channel = self.channels.get(_str(args, "channel"))
            if channel is not None:
                return channel.team
            owner, _ = self.accounts.identify(token)
            return owner if owner in self.accounts.teams else self.team_id

    def handle(
        self, method: str, args: JSON, bearer: str | None, basic: tuple[str, str] | None = None
    ) -> tuple[int, JSON]:
        """Answer one API call as Slack would: (HTTP status, JSON body)."""
        token = bearer if bearer is not None else args.pop("token", None)
        with self._lock:
            try:
                if method == "oauth.v2.access":
                    # No token: the app authenticates with its client id and secret.
                    return 200, {"ok": True, **self.accounts.oauth_v2_access(args, basic, self.clock())}
                caller = self.accounts.authenticate(token, method, self.clock())
                api = _METHODS.get(method)
                if api is None:
                    return 200, {"ok": False, "error": "unknown_method"}
                answer = {"ok": True, **api(self, args, caller)}
            except _WrongTeam as err:
                self.accounts.wrong_team(caller, method, err.channel.id, err.channel.team)
                return 200, {"ok": False, "error": err.code}
            except SlackError as err:
                return 200, {"ok": False, "error": err.code, **err.details}
            if method in WRITES:
                self.accept(method, _str(args, "channel"))
            return 200, answer

    def _auth_test(self, args: JSON, caller: Token) -> JSON:
        return self.accounts.auth_test(caller, self.base_url)

    def _teams_list(self, args: JSON, caller: Token) -> JSON:
        return self.accounts.teams_list(caller)

    def _channel(self, args: JSON, caller: Token) -> Channel:
        channel_id = _str(args, "channel")
        if not channel_id:
            raise SlackError("channel_not_found")
        if channel_id.startswith("U") and channel_id not in self.channels:
            # A user id as channel opens (or reuses) the DM with that person: Slack answers with
            # the DM's own id, which chat.update needs later.
            dm = "D" + channel_id[1:]
            team = caller.owner
            if team not in self.accounts.teams:  # an org-wide token: a team of its enterprise
                team = self.accounts.enterprises[team].teams[0]
            self.channels.setdefault(dm, Channel(dm, team=team))
            channel_id = dm
        channel = self.channels.get(channel_id)
        if channel is None:
            raise SlackError("channel_not_found")
        if not self.accounts.serves(caller, channel.team):
            # Slack cannot see another workspace's channel with this token: channel_not_found.
            raise _WrongTeam(channel)
        return channel

    def _content(self, args: JSON, *, text_limit: int | None = None) -> JSON:
        content: JSON = {}
        for key in ("blocks", "attachments"):
            if key in args:
                value = _json_arg(args[key])
                if not isinstance(value, list):
                    raise SlackError(f"invalid_{key}")
                content[key] = value
        if "blocks" in content:
            check_blocks(content["blocks"])
        for key in ("text", "markdown_text"):
            if key in args:
                content[key] = str(args[key])
        text = content.get("text")
        if text is not None:
            if text_limit is not None and len(text) > text_limit:
                raise SlackError("msg_too_long")
            # chat.postMessage: Slack truncates "messages containing more than 40,000
            # characters" (docs.slack.dev/reference/methods/chat.postMessage).
            content["text"] = text[:TRUNCATED_AFTER]
        return content

    def _post_message(self, args: JSON, caller: Token) -> JSON:
        channel = self._channel(args, caller)
        if channel.archived:
            raise SlackError("is_archived")
        content = self._content(args)
        if not (
            content.get("text")
            or content.get("markdown_text")
            or content.get("blocks")
            or content.get("attachments")
        ):
            raise SlackError("no_text")
        thread_ts = _str(args, "thread_ts")
        if thread_ts and not _TS.fullmatch(thread_ts):
            raise SlackError("invalid_thread_ts")
        metadata = None
        if "metadata" in args:
            metadata = _json_arg(args["metadata"])
            if not isinstance(metadata, dict) or not isinstance(metadata.get("event_type"), str):
                raise SlackError("invalid_metadata_format")
        message = Message(
            ts=self._next_ts(),
            text=str(content.get("text", content.get("markdown_text", ""))),
            thread_ts=thread_ts,
            blocks=content.get("blocks"),
            attachments=content.get("attachments"),
            metadata=metadata,
            reply_broadcast=_bool(args.get("reply_broadcast")),
        )
        self._store(channel, message)
        return {"channel": channel.id, "ts": message.ts, "message": message.as_slack(with_metadata=True)}

    def _update(self, args: JSON, caller: Token) -> JSON:
        channel = self._channel(args, caller)
        message = channel.messages.get(_str(args, "ts"))
        if message is None:
            raise SlackError("message_not_found")
        if not message.bot:
            raise SlackError("cant_update_message")
        content = self._content(args, text_limit=UPDATE_TEXT_CHARS)
        if "text" in content:
            message.text = content["text"]
            # "If the text argument is provided and blocks are not provided, the blocks will be
            # removed" (chat.update).
            message.blocks = content.get("blocks")
        elif "blocks" in content:
            message.blocks = content["blocks"]
        if "attachments" in content:
            message.attachments = content["attachments"]
        if "metadata" in args:
            # Without it, "the message's previous metadata will be retained".
            message.metadata = _json_arg(args["metadata"])
        return {
            "channel": channel.id,
            "ts": message.ts,
            "text": message.text,
            "message": message.as_slack(with_metadata=True),
        }

    def _delete(self, args: JSON, caller: Token) -> JSON:
        channel = self._channel(args, caller)
        ts = _str(args, "ts")
        message = channel.messages.get(ts)
        if message is None:  # never posted, or deleted already
            raise SlackError("message_not_found")
        if not message.bot:
            # A bot token deletes only its own messages ("cant_delete_message: Authenticated
            # user does not have permission to delete this message").
            raise SlackError("cant_delete_message")
        del channel.messages[ts]
        parent = channel.messages.get(message.thread_ts)
        if parent is not None:
            parent.replies.remove(ts)
        return {"channel": channel.id, "ts": ts}

    def _react(self, args: JSON, caller: Token) -> JSON:
        channel = self._channel(args, caller)
        name = _str(args, "name").strip(":")
        if not name or not re.fullmatch(r"[a-z0-9_+\-']+(::skin-tone-\d)?", name):
            raise SlackError("invalid_name")
        message = channel.messages.get(_str(args, "timestamp"))
        if message is None:
            raise SlackError("message_not_found")
        users = message.reactions.setdefault(name, [])
        if BOT_USER_ID in users:
            raise SlackError("already_reacted")
        users.append(BOT_USER_ID)
        return {}

    def _post_ephemeral(self, args: JSON, caller: Token) -> JSON:
        channel = self._channel(args, caller)
        user = _str(args, "user")
        if not user:
            raise SlackError("user_not_found")
        if channel.members and user not in channel.members:
            raise SlackError("user_not_in_channel")
        content = self._content(args)
        if not (content.get("text") or content.get("blocks") or content.get("attachments")):
            raise SlackError("no_text")
        ts = self._next_ts()
        self.ephemeral.append(
            {"channel": channel.id, "user": user, "ts": ts, "thread_ts": _str(args, "thread_ts"), **content}
        )
        return {"message_ts": ts}

    def _history(self, args: JSON, caller: Token) -> JSON:
        channel = self._channel(args, caller)
        # Parents only (and replies broadcast to the channel), the most recent first.
        found = [m for m in channel.messages.values() if not m.thread_ts or m.reply_broadcast]
        found = _window(found, args)
        found.sort(key=lambda m: m.ts, reverse=True)
        return _page(found, args, self.history_limit, with_metadata=_bool(args.get("include_all_metadata")))

    def _replies(self, args: JSON, caller: Token) -> JSON:
        channel = self._channel(args, caller)
        parent = channel.messages.get(_str(args, "ts"))
        if parent is None:
            raise SlackError("thread_not_found")
        if parent.thread_ts:  # the ts of a reply: Slack answers with its whole thread
            parent = channel.messages.get(parent.thread_ts)
            if parent is None:  # its parent was deleted
                raise SlackError("thread_not_found")
        replies = _window([channel.messages[ts] for ts in parent.replies], args)
        # The parent first, then the replies oldest first.
        return _page(
            [parent, *sorted(replies, key=lambda m: m.ts)],
            args,
            self.history_limit,
            with_metadata=_bool(args.get("include_all_metadata")),
        )


_METHODS: dict[str, Callable[[FakeSlack, JSON, Token], JSON]] = {
    "auth.test": FakeSlack._auth_test,
    "auth.teams.list": FakeSlack._teams_list,
    "chat.postMessage": FakeSlack._post_message,
    "chat.update": FakeSlack._update,
    "chat.delete": FakeSlack._delete,
    "chat.postEphemeral": FakeSlack._post_ephemeral,
    "reactions.add": FakeSlack._react,
    "conversations.history": FakeSlack._history,
    "conversations.replies": FakeSlack._replies,
}


class _WrongTeam(SlackError):
    """A channel of a team the caller's token does not serve."""

    def __init__(self, channel: Channel) -> None:
        super().__init__("channel_not_found")
        self.channel = channel


def _str(args: JSON, key: str) -> str:
    value = args.get(key, "")
    return value if isinstance(value, str) else str(value)


def _bool(value: Any) -> bool:
    # JSON bodies carry true/false; form bodies "1"/"0" (slack-sdk) or "true"/"false".
    return value is True or (isinstance(value, str) and value.lower() in ("1", "true"))


def _json_arg(value: Any) -> Any:
    # In a form body, structured arguments (blocks, metadata, ...) are JSON strings.
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return None
    return value


def _window(messages: list[Message], args: JSON) -> list[Message]:
    inclusive = _bool(args.get("inclusive"))
    oldest, latest = args.get("oldest"), args.get("latest")
    if oldest not in (None, ""):
        bound = float(oldest)
        messages = [m for m in messages if float(m.ts) > bound or (inclusive and float(m.ts) == bound)]
    if latest not in (None, ""):
        bound = float(latest)
        messages = [m for m in messages if float(m.ts) < bound or (inclusive and float(m.ts) == bound)]
    return messages


def _page(messages: list[Message], args: JSON, most: int, *, with_metadata: bool) -> JSON:
    """A page of `messages`: `limit` of them (100 by default, at most `most`), from `cursor`."""
    try:
        limit = int(args.get("limit") or min(100, most))
    except ValueError:
        raise SlackError("invalid_limit") from None
    limit = max(1, min(limit, most))
    start = 0
    cursor = _str(args, "cursor")
    if cursor:
        try:
            start = int(base64.b64decode(cursor).decode().removeprefix("offset:"))
        except ValueError:
            raise SlackError("invalid_cursor") from None
    page = messages[start : start + limit]
    more = start + limit < len(messages)
    next_cursor = base64.b64encode(f"offset:{start + limit}".encode()).decode() if more else ""
    return {
        "messages": [m.as_slack(with_metadata=with_metadata) for m in page],
        "has_more": more,
        "response_metadata": {"next_cursor": next_cursor},
    }


class _Handler(FakeHandler):
    fake: FakeSlack
    script_field = "method"
    normal_kind = "ok"
    html_title = "Server Error"
    json_type = "application/json; charset=utf-8"

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if self._control(path):
            return
        if path == "/oauth/v2/authorize":
            self._authorize()
        else:
            self._handle_api()

    def do_POST(self) -> None:
        path = urlsplit(self.path).path
        if self._control(path):
            return
        control = _CONTROLS.get(path)
        if control is None:
            self._handle_api()
            return
        try:
            self._reply(200, {"ok": True, **control(self.fake, self._read_json())})
        except (KeyError, TypeError, ValueError) as err:
            self._reply(400, {"ok": False, "error": f"{type(err).__name__}: {err}"})

    def _authorize(self) -> None:
        """Slack's install page, approved at once (or denied, as `authorize_as` says): a redirect
        to `redirect_uri` with a code (or error=access_denied) and the `state` given."""
        query = dict(parse_qsl(urlsplit(self.path).query))
        fake = self.fake
        fake.record(Call("oauth/v2/authorize", dict(query), authorized=False, content_type=""))
        redirect_uri = query.get("redirect_uri", "")
        if query.get("client_id") != fake.accounts.client_id or not redirect_uri:
            self._html(400, "Bad client_id or redirect_uri")
            return
        with fake._lock:
            how = dict(fake._authorize)
        answer = {"state": query.get("state", "")}
        if how["deny"]:
            answer = {"error": "access_denied", **answer}
        else:
            code = fake.issue_code(
                team=query.get("team") or how["team"],
                user=how["user"],
                enterprise=how["enterprise"],
                scopes=query.get("scope", ""),
                user_scopes=query.get("user_scope", ""),
                redirect_uri=redirect_uri,
            )
            answer = {"code": code, **answer}
        separator = "&" if "?" in redirect_uri else "?"
        self._send(302, b"", "", {"Location": f"{redirect_uri}{separator}{urlencode(answer)}"})

    def _handle_api(self) -> None:
        url = urlsplit(self.path)
        if not url.path.startswith("/api/"):
            self._reply(404, {"ok": False, "error": "unknown_method"})
            return
        method = url.path.removeprefix("/api/")
        content_type = self.headers.get("Content-Type", "")
        raw = self._read_body()
        args: JSON = dict(parse_qsl(url.query))
        if content_type.startswith("application/json"):
            body = json.loads(raw or b"{}")
            args.update(body if isinstance(body, dict) else {})
        elif raw:
            args.update(parse_qsl(raw.decode("utf-8")))
        authorization = self.headers.get("Authorization", "")
        bearer = (
            authorization.removeprefix("Bearer ").strip() if authorization.startswith("Bearer ") else None
        )
        basic = _basic(authorization)
        token = bearer or args.get("token")
        owner, token_id = self.fake.accounts_identify(token)
        recorded = {k: v for k, v in args.items() if k not in _SECRET_ARGS}
        if "refresh_token" in args:
            recorded["refresh_token"] = self.fake.accounts_identify(str(args["refresh_token"]))[1]
        self.fake.record(
            Call(
                method,
                recorded,
                authorized=bool(token_id),
                content_type=content_type,
                team=owner,
                token_id=token_id,
            )
        )
        wait = self.fake.limit(method, args, self.fake.team_of(args, token))
        if wait is not None:
            # Slack's Retry-After is a whole number of seconds.
            headers = {"Retry-After": str(max(1, math.ceil(wait)))}
            self._reply(429, {"ok": False, "error": "ratelimited"}, headers=headers)
            return
        self._answer(self.fake._next_action(method), lambda: self.fake.handle(method, args, bearer, basic))

    def _answer_own(self, action: Action, work: Callable[[], Answer]) -> None:
        if action.kind == "error":
            self._reply(action.status, {"ok": False, "error": action.code})
        elif action.kind == "ratelimit":
            self._reply(429, {"ok": False, "error": action.code}, headers={"Retry-After": action.retry_after})
        else:
            super()._answer_own(action, work)


def _basic(authorization: str) -> tuple[str, str] | None:
    """(client_id, client_secret) of an HTTP Basic header (slack-sdk's way for oauth.v2.access)."""
    if not authorization.startswith("Basic "):
        return None
    try:
        decoded = base64.b64decode(authorization.removeprefix("Basic ").strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return ("", "")
    client_id, _, client_secret = decoded.partition(":")
    return client_id, client_secret


def _add_channel(fake: FakeSlack, spec: JSON) -> JSON:
    fake.add_channel(
        spec["id"],
        team=spec.get("team"),
        members=set(spec.get("members", ())),
        archived=spec.get("archived", False),
    )
    return {}


def _add_team(fake: FakeSlack, spec: JSON) -> JSON:
    return {
        "install": fake.add_team(
            spec["id"],
            name=spec.get("name", ""),
            enterprise_id=spec.get("enterprise_id"),
            rotation=spec.get("rotation", False),
            expires_in=int(spec.get("expires_in", EXPIRES_IN)),
            channels=tuple(spec.get("channels", ())),
            install=spec.get("install", True),
        )
    }


def _add_enterprise(fake: FakeSlack, spec: JSON) -> JSON:
    return {
        "install": fake.add_enterprise(
            spec["id"],
            name=spec.get("name", ""),
            teams=list(spec.get("teams", ())),
            rotation=spec.get("rotation", False),
            expires_in=int(spec.get("expires_in", EXPIRES_IN)),
            install=spec.get("install", False),
        )
    }


# POST /_fake/<what>: a JSON body with the arguments of the method of the same name.
_CONTROLS: dict[str, Callable[[FakeSlack, JSON], JSON]] = {
    "/_fake/channels": _add_channel,
    "/_fake/teams": _add_team,
    "/_fake/enterprises": _add_enterprise,
    "/_fake/install": lambda fake, spec: {
        "install": fake.install(spec["owner"], **_only(spec, "user", "scopes"))
    },
    "/_fake/authorize": lambda fake, spec: _authorize_as(fake, spec),
    "/_fake/codes": lambda fake, spec: {
        "code": fake.issue_code(
            **_only(spec, "team", "user", "enterprise", "scopes", "user_scopes", "redirect_uri")
        )
    },
    "/_fake/revoke": lambda fake, spec: {"revoked": fake.revoke(spec["team"], **_only(spec, "error"))},
    "/_fake/uninstall": lambda fake, spec: {"revoked": fake.uninstall(spec["team"])},
    "/_fake/expire": lambda fake, spec: {"expired": fake.expire(spec["team"])},
}


def _authorize_as(fake: FakeSlack, spec: JSON) -> JSON:
    fake.authorize_as(**_only(spec, "team", "user", "enterprise", "deny"))
    return {}


def _only(spec: JSON, *names: str) -> JSON:
    return {name: spec[name] for name in names if name in spec}


FakeSlack.handler_class = _Handler
running = FakeSlack.running


def main(argv: list[str] | None = None) -> None:
    command_line(FakeSlack, argv)


if __name__ == "__main__":
    main()
