"""A fake Discord REST API (v10) on 127.0.0.1, faithful for the routes the Discord connector uses.

Routes, answered the way Discord does (developers/resources/message.mdx, user.mdx,
topics/opcodes-and-status-codes.mdx, topics/rate-limits.mdx):

- ``GET /users/@me`` (get_current_user): the bot user.
- ``POST /channels/{id}/messages`` (create_message): snowflake ids increasing with time,
  ``nonce`` (25 characters at most) returned in the reply only, never in history, and with
  ``enforce_nonce`` a second create by the same author with the same nonce within the window
  returns the first message instead of creating one.
- ``PATCH /channels/{id}/messages/{id}`` (edit_message): by the author only (50005).
- ``DELETE /channels/{id}/messages/{id}`` (delete_message): 204 No Content; the bot's own
  messages only (``403 50013 Missing Permissions``: it has no Manage Messages in the fake's
  channels); a message deleted is not found again (``404 10008 Unknown Message``). A thread
  started from a message outlives it, as in Discord.
- Both check the body as Discord does (discord_form.py: content, embeds and their 6,000
  characters, action rows of link buttons) and answer ``50035 Invalid Form Body`` with the
  ``errors`` tree naming each bad value.
- ``PUT /channels/{id}/messages/{id}/reactions/{emoji}/@me`` (create_reaction): 204; the emoji
  is URL-decoded, a unicode emoji or a custom ``name:id``; anything else is 10014.
- ``GET /channels/{id}/messages`` (get_channel_messages): ``after``/``before``/``limit``
  (1-100, default 50), newest first; an empty list when the bot lacks READ_MESSAGE_HISTORY.
- ``POST /channels/{id}/messages/{id}/threads`` (start_thread_from_message): a thread (a
  channel) whose id is the message's, ``name`` 1-100 characters; 160004 when the message has
  a thread already, 50024 for a message that is itself in a thread.

``Authorization: Bot <token>`` is required (401 otherwise). Errors are ``{"code", "message"}``
with Discord's codes; 429s carry ``Retry-After``, ``X-RateLimit-Scope`` and a ``retry_after``
float, plus ``X-RateLimit-Global`` and ``"global": true`` for the global limit.

Every request is recorded (route, arguments, User-Agent; never the token), and the next calls
of a route can be scripted to fail: an error code, a 429 (route or global), a 5xx, a dropped
connection after the message was stored (a lost reply), a reply slower than the client's timeout.

In a test: ``FakeDiscord(token=...).start()`` ... ``.stop()`` (or ``with running() as fake``).
In a project's tests, the ``fake_discord`` fixture (the package's pytest plugin) is one.
From another process: ``python -m django_connector_outbox.fakes.discord [--token T] [--channel
111] [--port N]`` prints its base URL on the first line of stdout, then the settings to paste,
and serves until SIGTERM; ``GET /_fake/state`` returns
what it holds and received, ``POST /_fake/script`` scripts failures (``{"route", "action",
"times"}``), ``POST /_fake/channels`` adds a channel (``{"id", "read_history"}``) and
``POST /_fake/messages`` adds a person's message (``{"channel", "content"}``).

Rate limits (none unless given), as topics/rate-limits.mdx describes them: `route_limit` is
each route's bucket per channel (a fixed window opened by its first request; every answer of
the route then carries ``X-RateLimit-Limit``, ``-Remaining``, ``-Reset``, ``-Reset-After`` and
``-Bucket``, and a request past it gets a 429 with ``X-RateLimit-Scope: user``), and
`global_limit` all requests of the bot ("All bots can make up to 50 requests per second":
`Limit(50, 1)`; a 429 with ``X-RateLimit-Global: true``, ``X-RateLimit-Scope: global`` and
``"global": true``). `limited` counts which limit answered each enforced 429, and
`invalid_requests` what Discord's invalid-request limit counts (401, 403, and 429 but those
of scope ``shared``: 10,000 in 10 minutes earn a ban).
"""

from __future__ import annotations

import argparse
import math
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, Self
from urllib.parse import parse_qsl, urlsplit

from django_connector_outbox.fakes.base import (
    JSON,
    Answer,
    CommonActions,
    FakeHandler,
    FakeServer,
    Limit,
    Window,
    add_chat_arguments,
    chat_channels,
    chat_limits,
    command_line,
    match_route,
    parse_json,
)
from django_connector_outbox.fakes.discord_form import form_errors

DISCORD_EPOCH_MS = 1420070400000
API_PREFIX = "/api/v10"
PERSON_ID = "300000000000000001"
_CUSTOM_EMOJI = re.compile(r"^[A-Za-z0-9_]{2,32}:\d{1,20}$")
# The routes that write: each one accepted is logged (`accepted`) with its time.
WRITES = frozenset(
    {"create_message", "edit_message", "delete_message", "create_reaction", "start_thread_from_message"}
)
_CREATE_FIELDS = ("content", "embeds", "components", "sticker_ids", "attachments", "poll")


@dataclass
class Call:
    """One request the fake received (the token is never kept)."""

    route: str
    method: str
    path: str
    query: JSON
    json: Any
    authorized: bool
    user_agent: str


@dataclass
class Action(CommonActions):
    """How to answer one scripted call.

    `kind`: "pass" (answer normally, so that a later call of the route fails), "error" (HTTP
    `status`, JSON `code`/`message`, `retry_after` if set), "ratelimit" (429, `retry_after`
    seconds, `is_global`, `scope`), "html" (an HTML page with `status`, as Cloudflare sends),
    "drop" (handle the call, store, then close without a reply), "drop_before" (close without
    handling), "reset" (handle, then reset the connection), "delay" (handle, then reply after
    `seconds`).
    """

    kind: str
    status: int = 400
    code: int = 0
    message: str = ""
    retry_after: float | None = None
    is_global: bool = False
    scope: str = "user"
    seconds: float = 0.0


def passthrough() -> Action:
    return Action("pass")


def error(code: int, message: str, status: int = 400, *, retry_after: float | None = None) -> Action:
    return Action("error", status=status, code=code, message=message, retry_after=retry_after)


def ratelimit(retry_after: float = 1.5, *, is_global: bool = False, scope: str = "user") -> Action:
    return Action(
        "ratelimit",
        status=429,
        retry_after=retry_after,
        is_global=is_global,
        scope="global" if is_global else scope,
    )


def server_error(status: int = 502) -> Action:
    return Action(
        "error", status=status, code=0, message=f"{status}: Bad Gateway" if status == 502 else f"{status}"
    )


def html(status: int = 503) -> Action:
    return Action.html(status)


drop = Action.drop
reset = Action.reset
delay = Action.delay


class DiscordError(Exception):
    def __init__(self, status: int, code: int, message: str, errors: JSON | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.errors = status, code, message, errors


@dataclass
class Message:
    id: str
    channel_id: str
    author_id: str
    content: str = ""
    embeds: list[JSON] = field(default_factory=list)
    components: list[JSON] = field(default_factory=list)
    flags: int = 0
    timestamp: str = ""
    edited_timestamp: str | None = None
    nonce: str | None = None
    created: float = 0.0
    reactions: dict[str, list[str]] = field(default_factory=dict)  # emoji -> user ids

    def as_discord(self, fake: FakeDiscord, *, with_nonce: bool = False) -> JSON:
        author = (
            fake.bot_user
            if self.author_id == fake.bot_user["id"]
            else {
                "id": self.author_id,
                "username": "person",
                "discriminator": "0",
                "global_name": "A Person",
            }
        )
        data: JSON = {
            "type": 0,
            "id": self.id,
            "channel_id": self.channel_id,
            "author": dict(author),
            "content": self.content,
            "embeds": [dict(e) for e in self.embeds],
            "components": list(self.components),
            "attachments": [],
            "mentions": [],
            "mention_roles": [],
            "mention_everyone": False,
            "pinned": False,
            "tts": False,
            "timestamp": self.timestamp,
            "edited_timestamp": self.edited_timestamp,
            "flags": self.flags,
        }
        if self.reactions:
            data["reactions"] = [
                {"count": len(users), "me": fake.bot_user["id"] in users, "emoji": _emoji_object(name)}
                for name, users in self.reactions.items()
            ]
        if with_nonce and self.nonce is not None:
            # The nonce is echoed in the create reply (and the gateway event) but not stored.
            data["nonce"] = self.nonce
        return data


@dataclass
class Channel:
    id: str
    read_history: bool = True
    messages: dict[str, Message] = field(default_factory=dict)
    parent_id: str = ""  # a thread's channel
    name: str = ""  # a thread's name


class FakeDiscord(FakeServer[Call, Action]):
    """The fake server. Thread-safe: the HTTP handlers and the test share it under one lock."""

    thread_name = "fake-discord"
    action_class = Action
    platform = "Discord"
    source_name = "discord"
    backend = "django_connector_outbox.connectors.discord.DiscordConnector"

    def __init__(
        self,
        token: str = "fake-discord-bot-token",
        *,
        channels: tuple[str, ...] = ("111111111111111111",),
        nonce_window: float = 300.0,
        route_limit: Limit | None = None,
        global_limit: Limit | None = None,
        clock: Callable[[], float] = time.time,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        super().__init__(clock=clock, host=host, port=port)
        self.token = token
        self.route_limit = route_limit
        self._route_windows: dict[tuple[str, str], Window] = {}
        self._global_window = Window(global_limit) if global_limit else None
        self.limited: Counter[str] = Counter()  # "route" or "global" -> its 429s
        self.shared_429s = 0  # scripted 429s of scope shared: not invalid requests
        self.nonce_window = nonce_window
        self._last_ms = 0
        self._increment = 0
        self.bot_user: JSON = {
            "id": "200000000000000001",
            "username": "outbox-bot",
            "discriminator": "0",
            "global_name": None,
            "bot": True,
        }
        self.channels: dict[str, Channel] = {}
        self._nonces: dict[tuple[str, str], Message] = {}
        for channel in channels:
            self.add_channel(channel)

    @property
    def base_url(self) -> str:
        """What to give the connector as `base_url`."""
        return f"{self.origin}{API_PREFIX}"

    # -- the settings of a source it delivers, and python -m

    @property
    def address(self) -> str:
        return self.base_url

    def connector_options(self) -> JSON:
        return {"token": self.token, "base_url": self.base_url}

    def guide(self, source: str) -> str:
        with self._lock:
            channels = ", ".join(self.channels) or "none"
        return f"""\
Queue posts with a container_id of its channels: {channels} (a thread is a channel
too; more: POST {self.origin}/_fake/channels {{"id": "111111111111111119"}});
workspace_id is your guild's id, which the fake does not check. A person's message, to react to or thread from:
POST {self.origin}/_fake/messages {{"channel": "...", "content": "..."}}."""

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        add_chat_arguments(
            parser, token="fake-discord-bot-token", channel="111111111111111111", limits="route or global"
        )

    @classmethod
    def from_options(cls, options: argparse.Namespace) -> Self:
        limits = chat_limits(options)
        return cls(
            options.token,
            channels=chat_channels(options),
            route_limit=limits.get("route"),
            global_limit=limits.get("global"),
            host=options.host,
            port=options.port,
        )

    # -- set-up and inspection, for tests

    def add_channel(self, channel_id: str, *, read_history: bool = True) -> None:
        """A text channel or a thread (threads are channels); `read_history=False` is a
        channel where the bot lacks READ_MESSAGE_HISTORY."""
        with self._lock:
            self.channels[channel_id] = Channel(channel_id, read_history=read_history)

    def add_message(
        self, channel: str, content: str = "", *, author_id: str = PERSON_ID, embeds: Any = ()
    ) -> str:
        """A message posted by someone (a person by default); returns its id."""
        with self._lock:
            message = self._new_message(channel, author_id, {"content": content, "embeds": list(embeds)})
            return message.id

    def messages(self, channel: str) -> list[Message]:
        """Stored messages of a channel (or thread), oldest first."""
        with self._lock:
            return sorted(self.channels[channel].messages.values(), key=lambda m: int(m.id))

    def message(self, channel: str, message_id: str) -> Message:
        with self._lock:
            return self.channels[channel].messages[message_id]

    @property
    def invalid_requests(self) -> int:
        """The answers Discord's invalid-request limit counts: 401, 403, 429 (not `shared`)."""
        with self._lock:
            return self.statuses[401] + self.statuses[403] + self.statuses[429] - self.shared_429s

    def state(self) -> JSON:
        """Everything held and received, as JSON (for other processes, via /_fake/state)."""
        with self._lock:
            return {
                "bot_user": dict(self.bot_user),
                "calls": [asdict(c) for c in self.calls],
                "channels": {cid: [m.as_discord(self) for m in self.messages(cid)] for cid in self.channels},
                "invalid_requests": self.invalid_requests,
                **self.records(),
            }

    def limit(self, route: str, params: dict[str, str]) -> tuple[dict[str, str], JSON | None]:
        """The rate-limit headers of this call, and the body of a 429 if a limit refuses it
        (else None, and the call counts against the limits)."""
        with self._lock:
            now = self.clock()
            if self._global_window is not None:
                wait = self._global_window.wait(now)
                if wait > 0:
                    self.limited["global"] += 1
                    headers = {
                        "Retry-After": str(math.ceil(wait)),
                        "X-RateLimit-Global": "true",
                        "X-RateLimit-Scope": "global",
                    }
                    return headers, _limited_body(wait, is_global=True)
            window = None
            if self.route_limit is not None:
                key = (route, params.get("channel", ""))
                window = self._route_windows.setdefault(key, Window(self.route_limit))
                wait = window.wait(now)
                if wait > 0:
                    self.limited["route"] += 1
                    headers = {
                        **_bucket_headers(route, window, now),
                        "Retry-After": str(math.ceil(wait)),
                        "X-RateLimit-Scope": "user",
                    }
                    return headers, _limited_body(wait, is_global=False)
            if self._global_window is not None:
                self._global_window.take(now)
            if window is None:
                return {}, None
            window.take(now)
            return _bucket_headers(route, window, now), None

    # -- the API

    def next_snowflake(self) -> str:
        """(ms since the Discord epoch) << 22 | worker 1 << 17 | increment: grows with time."""
        ms = max(int(self.clock() * 1000) - DISCORD_EPOCH_MS, self._last_ms)
        if ms == self._last_ms:
            self._increment += 1
            if self._increment >= 4096:
                ms, self._increment = ms + 1, 0
        else:
            self._increment = 0
        self._last_ms = ms
        return str((ms << 22) | (1 << 17) | self._increment)

    def _new_message(self, channel_id: str, author_id: str, args: JSON, nonce: str | None = None) -> Message:
        channel = self._channel(channel_id)
        now = self.clock()
        message = Message(
            id=self.next_snowflake(),
            channel_id=channel.id,
            author_id=author_id,
            content=str(args.get("content") or ""),
            embeds=[{"type": "rich", **e} for e in args.get("embeds") or []],
            components=list(args.get("components") or []),
            flags=int(args.get("flags") or 0),
            timestamp=datetime.fromtimestamp(now, UTC).isoformat(),
            nonce=nonce,
            created=now,
        )
        channel.messages[message.id] = message
        return message

    def _channel(self, channel_id: str) -> Channel:
        channel = self.channels.get(channel_id)
        if channel is None:
            raise DiscordError(404, 10003, "Unknown Channel")
        return channel

    def handle(self, route: str, params: dict[str, str], query: JSON, body: Any) -> tuple[int, Any]:
        """Answer one authorized API call as Discord would: (HTTP status, JSON body or None)."""
        with self._lock:
            try:
                status, answer = _ROUTES[route](self, params, query, body)
            except DiscordError as err:
                answer = {"message": err.message, "code": err.code}
                if err.errors:
                    answer["errors"] = err.errors
                return err.status, answer
            if route in WRITES:
                self.accept(route, params["channel"])
            return status, answer

    def _get_current_user(self, params: dict[str, str], query: JSON, body: Any) -> tuple[int, Any]:
        return 200, dict(self.bot_user)

    def _create_message(self, params: dict[str, str], query: JSON, body: Any) -> tuple[int, Any]:
        channel = self._channel(params["channel"])
        if not isinstance(body, dict):
            raise DiscordError(400, 50109, "The request body contains invalid JSON.")
        _validate_content(body)
        nonce = body.get("nonce")
        if nonce is not None:
            if not isinstance(nonce, (str, int)) or len(str(nonce)) > 25:
                raise _form_error("nonce", "Must be 25 or fewer in length.")
            nonce = str(nonce)
        if not any(body.get(k) for k in _CREATE_FIELDS):
            raise DiscordError(400, 50006, "Cannot send an empty message")
        author = self.bot_user["id"]
        if nonce is not None and body.get("enforce_nonce"):
            earlier = self._nonces.get((author, nonce))
            if earlier is not None and self.clock() - earlier.created <= self.nonce_window:
                # "If another message was created by the same author with the same nonce,
                # that message will be returned and no new message will be created."
                return 200, earlier.as_discord(self, with_nonce=True)
        message = self._new_message(channel.id, author, body, nonce)
        if nonce is not None:
            self._nonces[(author, nonce)] = message
        return 200, message.as_discord(self, with_nonce=True)

    def _edit_message(self, params: dict[str, str], query: JSON, body: Any) -> tuple[int, Any]:
        message = self._message(params)
        if message.author_id != self.bot_user["id"]:
            raise DiscordError(403, 50005, "Cannot edit a message authored by another user")
        if not isinstance(body, dict):
            raise DiscordError(400, 50109, "The request body contains invalid JSON.")
        _validate_content(body)
        if "content" in body:
            message.content = str(body["content"] or "")
        if "embeds" in body:
            message.embeds = [{"type": "rich", **e} for e in body["embeds"] or []]
        if "components" in body:
            message.components = list(body["components"] or [])
        if "flags" in body:
            message.flags = int(body["flags"] or 0)
        message.edited_timestamp = datetime.fromtimestamp(self.clock(), UTC).isoformat()
        return 200, message.as_discord(self)

    def _delete_message(self, params: dict[str, str], query: JSON, body: Any) -> tuple[int, Any]:
        message = self._message(params)
        if message.author_id != self.bot_user["id"]:
            # Another's message needs MANAGE_MESSAGES, which the bot has in none of these channels.
            raise DiscordError(403, 50013, "Missing Permissions")
        del self.channels[params["channel"]].messages[message.id]
        return 204, None

    def _create_reaction(self, params: dict[str, str], query: JSON, body: Any) -> tuple[int, Any]:
        channel = self._channel(params["channel"])
        if not channel.read_history:
            raise DiscordError(403, 50013, "Missing Permissions")
        message = self._message(params)
        emoji = params["emoji"]
        if not (_CUSTOM_EMOJI.match(emoji) or (emoji and not emoji.isascii() and ":" not in emoji)):
            raise DiscordError(400, 10014, "Unknown Emoji")
        users = message.reactions.setdefault(emoji, [])
        if self.bot_user["id"] not in users:
            users.append(self.bot_user["id"])
        return 204, None

    def _get_channel_messages(self, params: dict[str, str], query: JSON, body: Any) -> tuple[int, Any]:
        channel = self._channel(params["channel"])
        try:
            limit = int(query.get("limit", 50))
        except ValueError:
            raise _form_error("limit", "Value is not int.") from None
        if not 1 <= limit <= 100:
            raise _form_error("limit", "int value should be less than or equal to 100.")
        if sum(k in query for k in ("after", "before", "around")) > 1:
            raise _form_error("after", "Only one of before, after and around may be given.")
        if not channel.read_history:
            # "If the current user is missing the READ_MESSAGE_HISTORY permission in the
            # channel, then no messages will be returned."
            return 200, []
        messages = self.messages(channel.id)
        if "after" in query:
            chosen = [m for m in messages if int(m.id) > int(query["after"])][:limit]
        elif "before" in query:
            chosen = [m for m in messages if int(m.id) < int(query["before"])][-limit:]
        else:
            chosen = messages[-limit:]
        return 200, [m.as_discord(self) for m in reversed(chosen)]  # newest first

    def _start_thread_from_message(self, params: dict[str, str], query: JSON, body: Any) -> tuple[int, Any]:
        channel = self._channel(params["channel"])
        message = self._message(params)
        if channel.parent_id:
            raise DiscordError(400, 50024, "Cannot execute action on this channel type")
        name = body.get("name") if isinstance(body, dict) else None
        if not isinstance(name, str) or not 1 <= len(name) <= 100:
            raise _form_error("name", "Must be between 1 and 100 in length.")
        if message.id in self.channels:
            raise DiscordError(400, 160004, "A thread has already been created for this message")
        # "The id of the created thread will be the same as the id of the source message."
        thread = Channel(message.id, read_history=channel.read_history, parent_id=channel.id, name=name)
        self.channels[thread.id] = thread
        return 201, {"id": thread.id, "type": 11, "guild_id": None, "parent_id": channel.id, "name": name}

    def threads(self) -> dict[str, tuple[str, str]]:
        """The threads started: thread id -> (its channel, its name)."""
        with self._lock:
            return {c.id: (c.parent_id, c.name) for c in self.channels.values() if c.parent_id}

    def _message(self, params: dict[str, str]) -> Message:
        message = self._channel(params["channel"]).messages.get(params["message"])
        if message is None:
            raise DiscordError(404, 10008, "Unknown Message")
        return message


def _validate_content(body: JSON) -> None:
    errors = form_errors(body)
    if errors:
        raise DiscordError(400, 50035, "Invalid Form Body", errors)
    for embed in body.get("embeds") or []:
        if not any(
            embed.get(k) for k in ("title", "description", "fields", "footer", "image", "author", "thumbnail")
        ):
            raise _form_error("embeds", "Embed must not be empty.")


def _bucket_headers(route: str, window: Window, now: float) -> dict[str, str]:
    return {
        "X-RateLimit-Limit": str(window.limit.count),
        "X-RateLimit-Remaining": str(window.remaining()),
        "X-RateLimit-Reset": f"{window.reset_at:.3f}",
        "X-RateLimit-Reset-After": f"{window.reset_at - now:.3f}",
        "X-RateLimit-Bucket": f"fake-{route}",
    }


def _limited_body(wait: float, *, is_global: bool) -> JSON:
    return {"message": "You are being rate limited.", "retry_after": round(wait, 3), "global": is_global}


def _form_error(name: str, message: str) -> DiscordError:
    return DiscordError(
        400,
        50035,
        "Invalid Form Body",
        {name: {"_errors": [{"code": "BASE_TYPE_INVALID", "message": message}]}},
    )


def _emoji_object(name: str) -> JSON:
    if ":" in name:
        emoji_name, emoji_id = name.split(":", 1)
        return {"id": emoji_id, "name": emoji_name}
    return {"id": None, "name": name}


# (HTTP method, path pattern over raw, still percent-encoded segments) -> route name.
_PATTERNS = [
    ("GET", re.compile(r"^/users/@me$"), "get_current_user"),
    ("POST", re.compile(r"^/channels/(?P<channel>[^/]+)/messages$"), "create_message"),
    ("GET", re.compile(r"^/channels/(?P<channel>[^/]+)/messages$"), "get_channel_messages"),
    ("PATCH", re.compile(r"^/channels/(?P<channel>[^/]+)/messages/(?P<message>[^/]+)$"), "edit_message"),
    ("DELETE", re.compile(r"^/channels/(?P<channel>[^/]+)/messages/(?P<message>[^/]+)$"), "delete_message"),
    (
        "PUT",
        re.compile(
            r"^/channels/(?P<channel>[^/]+)/messages/(?P<message>[^/]+)/reactions/(?P<emoji>[^/]+)/@me$"
        ),
        "create_reaction",
    ),
    (
        "POST",
        re.compile(r"^/channels/(?P<channel>[^/]+)/messages/(?P<message>[^/]+)/threads$"),
        "start_thread_from_message",
    ),
]
_ROUTES: dict[str, Callable[[FakeDiscord, dict[str, str], JSON, Any], tuple[int, Any]]] = {
    "get_current_user": FakeDiscord._get_current_user,
    "create_message": FakeDiscord._create_message,
    "get_channel_messages": FakeDiscord._get_channel_messages,
    "edit_message": FakeDiscord._edit_message,
    "delete_message": FakeDiscord._delete_message,
    "create_reaction": FakeDiscord._create_reaction,
    "start_thread_from_message": FakeDiscord._start_thread_from_message,
}
# What script() takes: get_current_user, create_message, edit_message, delete_message,
# create_reaction, get_channel_messages, start_thread_from_message.
FakeDiscord.routes = frozenset(_ROUTES)


class _Handler(FakeHandler):
    fake: FakeDiscord
    protocol_version = "HTTP/1.1"  # keep-alive, as Discord: the client's pool is exercised
    normal_kind = "pass"
    html_title = "Service Unavailable"

    def do_GET(self) -> None:
        if not self._control(urlsplit(self.path).path):
            self._handle_api("GET")

    def do_POST(self) -> None:
        path = urlsplit(self.path).path
        if self._control(path):
            return
        if path == "/_fake/channels":
            spec = self._read_json()
            self.fake.add_channel(str(spec["id"]), read_history=bool(spec.get("read_history", True)))
            self._reply(200, {"ok": True})
        elif path == "/_fake/messages":
            spec = self._read_json()
            message_id = self.fake.add_message(str(spec["channel"]), str(spec.get("content", "")))
            self._reply(200, {"id": message_id})
        else:
            self._handle_api("POST")

    def do_PATCH(self) -> None:
        self._handle_api("PATCH")

    def do_PUT(self) -> None:
        self._handle_api("PUT")

    def do_DELETE(self) -> None:
        self._handle_api("DELETE")

    def _handle_api(self, method: str) -> None:
        url = urlsplit(self.path)
        raw = self._read_body()
        if not url.path.startswith(API_PREFIX + "/"):
            self._reply(404, {"message": "404: Not Found", "code": 0})
            return
        path = url.path.removeprefix(API_PREFIX)
        found = match_route(_PATTERNS, method, path)
        if found is None:
            self._reply(
                405 if any(p.match(path) for _, p, _ in _PATTERNS) else 404,
                {"message": "404: Not Found", "code": 0},
            )
            return
        route, params = found
        query: JSON = dict(parse_qsl(url.query))
        body = parse_json(raw)
        authorized = self.headers.get("Authorization", "") == f"Bot {self.fake.token}"
        self.fake.record(
            Call(
                route,
                method,
                url.path,
                query,
                None if body is ... else body,
                authorized,
                self.headers.get("User-Agent", ""),
            )
        )
        if not authorized:
            self._reply(401, {"message": "401: Unauthorized", "code": 0})
            return
        if body is ...:
            self._reply(400, {"message": "The request body contains invalid JSON.", "code": 50109})
            return
        headers, refused = self.fake.limit(route, params)
        if refused is not None:
            self._reply(429, refused, headers=headers)
            return
        self._limit_headers = headers
        self._answer(self.fake._next_action(route), lambda: self.fake.handle(route, params, query, body))

    def _answer_own(self, action: Action, work: Callable[[], Answer]) -> None:
        if action.kind == "error":
            payload: JSON = {"message": action.message, "code": action.code}
            if action.retry_after is not None:
                payload["retry_after"] = action.retry_after
            self._reply(action.status, payload)
        elif action.kind == "ratelimit":
            retry_after = action.retry_after if action.retry_after is not None else 1.0
            headers = {
                "Retry-After": str(max(1, round(retry_after))),
                "X-RateLimit-Scope": action.scope,
                "X-RateLimit-Limit": "5",
                "X-RateLimit-Remaining": "0",
                "X-RateLimit-Reset-After": f"{retry_after:.3f}",
            }
            if action.is_global:
                headers["X-RateLimit-Global"] = "true"
            if action.scope == "shared":
                with self.fake._lock:
                    self.fake.shared_429s += 1
            payload = {
                "message": "You are being rate limited.",
                "retry_after": retry_after,
                "global": action.is_global,
            }
            self._reply(429, payload, headers=headers)
        else:
            super()._answer_own(action, work)

    _limit_headers: dict[str, str] = {}  # noqa: RUF012 - replaced per request, never mutated

    def _reply(self, status: int, body: Any, *, headers: dict[str, str] | None = None) -> None:
        # Every answer of a limited route carries its bucket's headers, as Discord's do.
        merged = {**self._limit_headers, **(headers or {})}
        super()._reply(status, None if status == 204 else body, headers=merged)


FakeDiscord.handler_class = _Handler
running = FakeDiscord.running


def main(argv: list[str] | None = None) -> None:
    command_line(FakeDiscord, argv)


if __name__ == "__main__":
    main()
