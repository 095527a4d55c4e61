"""A fake Slack Web API on 127.0.0.1, faithful enough for the Slack connector and its sender.

It speaks the methods the connector uses (chat.postMessage, chat.update, chat.postEphemeral,
reactions.add, conversations.history, conversations.replies) the way Slack does: POST with a
JSON, form or query-string body, `Authorization: Bearer <token>`, `{"ok": false, "error": ...}`
answers with HTTP 200, HTTP 429 + Retry-After for rate limits, metadata returned only with
`include_all_metadata`, history newest first and cursor pagination.

Every request is recorded (method and arguments, never the token), so tests can assert exactly
what reached the "platform", and the next calls of a method can be scripted to fail in the ways
Slack and networks fail: an error code, a 429, an HTML 5xx page, a dropped connection after the
post was stored (a lost reply), a reply slower than the client's timeout.

In a test: `FakeSlack(token=...).start()` ... `.stop()` (or the `with` statement). From another
process: `python -m tests.fakes.slack --token T --channel C1` prints its base URL on the first
line of stdout and serves until SIGTERM; `GET /_fake/state` returns what it holds and received,
`POST /_fake/script` scripts failures and `POST /_fake/channels` adds channels.

Rate limits (none unless given): `channel_limit` and `workspace_limit` hold chat.postMessage to
"one message per second per channel, while also maintaining a workspace-wide limit", and
`method_limits` hold any method "per API method per workspace/team per app" (chat.update and
reactions.add are Tier 3: `Limit(50, 60)`). Each is a token bucket (Slack allows "short
bursts"); past one, Slack's answer: HTTP 429, `{"ok": false, "error": "ratelimited"}` and
`Retry-After` in whole seconds. `limited` counts which limit answered each enforced 429.
"""

from __future__ import annotations

import base64
import json
import math
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from tests.fakes.base import (
    JSON,
    Answer,
    Bucket,
    CommonActions,
    FakeHandler,
    FakeServer,
    Limit,
    chat_options,
    serve_until_signalled,
)

# Slack ids and timestamps, as Slack writes them.
_TS = re.compile(r"\d{10}\.\d{6}")

# The methods that write: each one accepted is logged (`accepted`) with its time.
WRITES = frozenset({"chat.postMessage", "chat.update", "chat.postEphemeral", "reactions.add"})

BOT_USER_ID = "UFAKEBOT1"
BOT_ID = "BFAKEBOT1"
APP_ID = "AFAKEAPP1"


@dataclass
class Call:
    """One request the fake received: the API method and its arguments (token removed)."""

    method: str
    args: JSON
    authorized: bool
    content_type: str


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
    return Action("html", status=status)


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
    members: set[str] = field(default_factory=set)  # empty: anyone (for postEphemeral)
    archived: bool = False
    messages: dict[str, Message] = field(default_factory=dict)  # ts -> message (replies too)


class FakeSlack(FakeServer[Call, Action]):
    """The fake server. Thread-safe: the HTTP handlers and the test share it under one lock."""

    thread_name = "fake-slack"
    action_class = Action

    def __init__(
        self,
        token: str = "xoxb-fake-token",
        *,
        channels: tuple[str, ...] = ("C0000000001",),
        team_id: str = "T0000000001",
        channel_limit: Limit | None = None,
        workspace_limit: Limit | None = None,
        method_limits: Mapping[str, Limit] | None = None,
        clock: Callable[[], float] = time.time,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        super().__init__(clock=clock, host=host, port=port)
        self.token = token
        self.team_id = team_id
        self.channel_limit = channel_limit
        self._channel_buckets: dict[str, Bucket] = {}
        self._workspace_bucket = Bucket(workspace_limit) if workspace_limit else None
        self._method_buckets = {m: Bucket(limit) for m, limit in (method_limits or {}).items()}
        self.limited: Counter[str] = Counter()  # "channel", "workspace" or a method -> its 429s
        self._last_ts = 0.0
        self.channels: dict[str, Channel] = {}
        self.ephemeral: list[JSON] = []
        for channel in channels:
            self.add_channel(channel)

    @property
    def base_url(self) -> str:
        """What to give the connector as `base_url`."""
        return f"http://127.0.0.1:{self.port}/api/"

    # -- set-up and inspection, for tests

    def add_channel(
        self, channel_id: str, *, members: set[str] | None = None, archived: bool = False
    ) -> None:
        with self._lock:
            self.channels[channel_id] = Channel(channel_id, members=set(members or ()), archived=archived)

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

    def calls_of(self, method: str) -> list[JSON]:
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
                "ephemeral": list(self.ephemeral),
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

    def limit(self, method: str, args: JSON) -> float | None:
        """Seconds to wait if a rate limit refuses this call, else None (and the call counts)."""
        buckets: list[tuple[str, Bucket]] = []
        with self._lock:
            if method in self._method_buckets:
                buckets.append((method, self._method_buckets[method]))
            if method == "chat.postMessage":
                if self.channel_limit is not None:
                    channel = _str(args, "channel")
                    bucket = self._channel_buckets.setdefault(channel, Bucket(self.channel_limit))
                    buckets.append(("channel", bucket))
                if self._workspace_bucket is not None:
                    buckets.append(("workspace", self._workspace_bucket))
            now = self.clock()
            for name, bucket in buckets:
                wait = bucket.wait(now)
                if wait > 0:
                    self.limited[name] += 1
                    return wait
            for _, bucket in buckets:
                bucket.take(now)
            return None

    def handle(self, method: str, args: JSON, bearer: str | None) -> tuple[int, JSON]:
        """Answer one API call as Slack would: (HTTP status, JSON body)."""
        token = bearer if bearer is not None else args.pop("token", None)
        if not token:
            return 200, {"ok": False, "error": "not_authed"}
        if token != self.token:
            return 200, {"ok": False, "error": "invalid_auth"}
        api = _METHODS.get(method)
        if api is None:
            return 200, {"ok": False, "error": "unknown_method"}
        with self._lock:
            try:
                answer = {"ok": True, **api(self, args)}
            except _SlackError as err:
                return 200, {"ok": False, "error": err.code}
            if method in WRITES:
                self.accept(method, _str(args, "channel"))
            return 200, answer

    def _channel(self, args: JSON) -> Channel:
        channel_id = _str(args, "channel")
        if not channel_id:
            raise _SlackError("channel_not_found")
        if channel_id.startswith("U") and channel_id not in self.channels:
            # A user id as channel opens (or reuses) the DM with that person: Slack answers with
            # the DM's own id, which chat.update needs later.
            dm = "D" + channel_id[1:]
            self.channels.setdefault(dm, Channel(dm))
            channel_id = dm
        channel = self.channels.get(channel_id)
        if channel is None:
            raise _SlackError("channel_not_found")
        return channel

    def _content(self, args: JSON) -> JSON:
        content: JSON = {}
        for key in ("blocks", "attachments"):
            if key in args:
                value = _json_arg(args[key])
                if not isinstance(value, list):
                    raise _SlackError(f"invalid_{key}")
                content[key] = value
        for key in ("text", "markdown_text"):
            if key in args:
                content[key] = str(args[key])
        return content

    def _post_message(self, args: JSON) -> JSON:
        channel = self._channel(args)
        if channel.archived:
            raise _SlackError("is_archived")
        content = self._content(args)
        if not (
            content.get("text")
            or content.get("markdown_text")
            or content.get("blocks")
            or content.get("attachments")
        ):
            raise _SlackError("no_text")
        thread_ts = _str(args, "thread_ts")
        if thread_ts and not _TS.fullmatch(thread_ts):
            raise _SlackError("invalid_thread_ts")
        metadata = None
        if "metadata" in args:
            metadata = _json_arg(args["metadata"])
            if not isinstance(metadata, dict) or not isinstance(metadata.get("event_type"), str):
                raise _SlackError("invalid_metadata_format")
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

    def _update(self, args: JSON) -> JSON:
        channel = self._channel(args)
        message = channel.messages.get(_str(args, "ts"))
        if message is None:
            raise _SlackError("message_not_found")
        if not message.bot:
            raise _SlackError("cant_update_message")
        content = self._content(args)
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

    def _react(self, args: JSON) -> JSON:
        channel = self._channel(args)
        name = _str(args, "name").strip(":")
        if not name or not re.fullmatch(r"[a-z0-9_+\-']+(::skin-tone-\d)?", name):
            raise _SlackError("invalid_name")
        message = channel.messages.get(_str(args, "timestamp"))
        if message is None:
            raise _SlackError("message_not_found")
        users = message.reactions.setdefault(name, [])
        if BOT_USER_ID in users:
            raise _SlackError("already_reacted")
        users.append(BOT_USER_ID)
        return {}

    def _post_ephemeral(self, args: JSON) -> JSON:
        channel = self._channel(args)
        user = _str(args, "user")
        if not user:
            raise _SlackError("user_not_found")
        if channel.members and user not in channel.members:
            raise _SlackError("user_not_in_channel")
        content = self._content(args)
        if not (content.get("text") or content.get("blocks") or content.get("attachments")):
            raise _SlackError("no_text")
        ts = self._next_ts()
        self.ephemeral.append(
            {"channel": channel.id, "user": user, "ts": ts, "thread_ts": _str(args, "thread_ts"), **content}
        )
        return {"message_ts": ts}

    def _history(self, args: JSON) -> JSON:
        channel = self._channel(args)
        # Parents only (and replies broadcast to the channel), the most recent first.
        found = [m for m in channel.messages.values() if not m.thread_ts or m.reply_broadcast]
        found = _window(found, args)
        found.sort(key=lambda m: m.ts, reverse=True)
        return _page(found, args, with_metadata=_bool(args.get("include_all_metadata")))

    def _replies(self, args: JSON) -> JSON:
        channel = self._channel(args)
        parent = channel.messages.get(_str(args, "ts"))
        if parent is None:
            raise _SlackError("thread_not_found")
        if parent.thread_ts:  # the ts of a reply: Slack answers with its whole thread
            parent = channel.messages[parent.thread_ts]
        replies = _window([channel.messages[ts] for ts in parent.replies], args)
        # The parent first, then the replies oldest first.
        return _page(
            [parent, *sorted(replies, key=lambda m: m.ts)],
            args,
            with_metadata=_bool(args.get("include_all_metadata")),
        )


_METHODS: dict[str, Callable[[FakeSlack, JSON], JSON]] = {
    "chat.postMessage": FakeSlack._post_message,
    "chat.update": FakeSlack._update,
    "chat.postEphemeral": FakeSlack._post_ephemeral,
    "reactions.add": FakeSlack._react,
    "conversations.history": FakeSlack._history,
    "conversations.replies": FakeSlack._replies,
}


class _SlackError(Exception):
    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


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


def _page(messages: list[Message], args: JSON, *, with_metadata: bool) -> JSON:
    try:
        limit = int(args.get("limit") or 100)
    except ValueError:
        raise _SlackError("invalid_limit") from None
    limit = max(1, min(limit, 999))
    start = 0
    cursor = _str(args, "cursor")
    if cursor:
        try:
            start = int(base64.b64decode(cursor).decode().removeprefix("offset:"))
        except ValueError:
            raise _SlackError("invalid_cursor") from None
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
    json_type = "application/json; charset=utf-8"

    def do_GET(self) -> None:
        if not self._control(urlsplit(self.path).path):
            self._handle_api()

    def do_POST(self) -> None:
        path = urlsplit(self.path).path
        if self._control(path):
            return
        if path == "/_fake/channels":
            spec = self._read_json()
            self.fake.add_channel(
                spec["id"], members=set(spec.get("members", ())), archived=spec.get("archived", False)
            )
            self._reply(200, {"ok": True})
        else:
            self._handle_api()

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
        recorded = {k: v for k, v in args.items() if k != "token"}
        self.fake.record(
            Call(
                method,
                recorded,
                authorized=(bearer or args.get("token")) == self.fake.token,
                content_type=content_type,
            )
        )
        wait = self.fake.limit(method, args)
        if wait is not None:
            # Slack's Retry-After is a whole number of seconds.
            headers = {"Retry-After": str(max(1, math.ceil(wait)))}
            self._reply(429, {"ok": False, "error": "ratelimited"}, headers=headers)
            return
        self._answer(self.fake._next_action(method), lambda: self.fake.handle(method, args, bearer))

    def _answer_own(self, action: Action, work: Callable[[], Answer]) -> None:
        if action.kind == "error":
            self._reply(action.status, {"ok": False, "error": action.code})
        elif action.kind == "ratelimit":
            self._reply(429, {"ok": False, "error": action.code}, headers={"Retry-After": action.retry_after})
        elif action.kind == "html":
            self._html(action.status, "Server Error")
        else:
            super()._answer_own(action, work)


FakeSlack.handler_class = _Handler
running = FakeSlack.running


def main(argv: list[str] | None = None) -> None:
    options = chat_options(argv, __doc__, token="xoxb-fake-token", channel="C0000000001")
    limits = dict(options.limits)  # channel, workspace, and any method name
    fake = FakeSlack(
        options.token,
        channels=tuple(options.channel),
        channel_limit=limits.pop("channel", None),
        workspace_limit=limits.pop("workspace", None),
        method_limits=limits,
        port=options.port,
    ).start()
    serve_until_signalled(fake, fake.base_url)


if __name__ == "__main__":
    main()
