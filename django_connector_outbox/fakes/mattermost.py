"""A fake Mattermost server (REST API v4) on 127.0.0.1, for the routes the Mattermost connector uses.

Routes, answered the way Mattermost does (api/v4/source/posts.yaml, reactions.yaml, users.yaml;
server/channels/app/post.go):

- ``GET /api/v4/users/me``: the bot user.
- ``POST /api/v4/posts`` (create_post): 201 with the post; ids of 26 characters [a-z0-9];
  ``root_id`` must be a root post of the channel (400); ``message`` at most 16383 characters;
  ``props`` kept, if the server could take them (an object of at most 400,000 runes of
  JSON; message attachments that decode); ``pending_post_id`` dedupes: a second create with it within `dedupe_window`
  (30 s) returns the first post ("making the API call feel idempotent").
- ``PUT /api/v4/posts/{id}/patch`` (patch_post): by the author only (403); omitted fields kept.
- ``DELETE /api/v4/posts/{id}`` (delete_post): 200 ``{"status": "OK"}``; the bot's own posts
  only (403: it has ``delete_post``, not ``delete_others_posts``); a root takes its replies
  with it; a deleted post is not found again (a second delete is a 404).
- ``POST /api/v4/reactions`` (save_reaction): ``user_id`` must be the token's user (403);
  ``emoji_name`` ``[a-z0-9_+-]``; saving one twice is no error (an upsert).
- ``POST /api/v4/posts/ephemeral`` (create_ephemeral): ``{user_id, post}``; 201, kept apart
  (`ephemerals`), in no listing.
- ``GET /api/v4/channels/{id}/posts`` (get_posts): ``since`` (ms: posts changed after it,
  at most 1000, newest first) or ``page``/``per_page`` (at most 200); a post list
  ``{"order", "posts"}``.
- ``GET /api/v4/posts/{id}/thread`` (get_thread): the root and its replies, as a post list.

``Authorization: Bearer <token>`` is required (401 ``api.context.session_expired.app_error``).
Errors are Mattermost's ``{"id", "message", "detailed_error", "request_id", "status_code"}``.
With `limit` (a `Limit`: Mattermost's "Maximum queries per second" and "Maximum burst size"
are `mattermost_limit(per_sec, burst)`), every API request of the token is counted in a GCRA
bucket, as server/channels/app/ratelimit.go does: each answer carries ``X-Ratelimit-Limit``,
``X-Ratelimit-Remaining`` and ``X-Ratelimit-Reset`` (seconds), and a request past it gets a 429
``limit exceeded`` (plain text) with ``Retry-After`` (whole seconds).

Every request is recorded (route, arguments; never the token), and the next calls of a route
can be scripted: an error, a 429, an HTML page, a dropped connection after the post was stored
(a lost reply), a slow reply.

In a project's tests, the ``fake_mattermost`` fixture (the package's pytest plugin) is one.
From another process: ``python -m django_connector_outbox.fakes.mattermost [--token T]
[--channel C] [--port N] [--limit api=COUNT/SECONDS]`` prints the server URL on its first line,
then the settings to paste, and serves until SIGTERM; ``GET /_fake/state``, ``POST /_fake/script`` (``{"route", "action", "times"}``),
``POST /_fake/posts`` (a person's post: ``{"channel", "message"}``).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Self
from urllib.parse import parse_qsl, urlsplit

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
    match_route,
    parse_json,
)

API_PREFIX = "/api/v4"
PERSON_ID = "personpersonpersonperson01"
MAX_MESSAGE = 16383
#: model/post.go: PostPropsMaxUserRunes = PostPropsMaxRunes (800,000) - 400,000, the room a
#: client's props may take.
MAX_PROPS = 400000
SINCE_CAP = 1000
WRITES = frozenset({"create_post", "patch_post", "save_reaction", "create_ephemeral", "delete_post"})
_EMOJI = re.compile(r"^[a-zA-Z0-9\-\+_]+$")


def mattermost_limit(per_sec: float = 10, burst: int = 100) -> Limit:
    """Mattermost's rate limit settings as a `Limit` for a token bucket: `burst` requests
    beyond the rate at once, refilled at `per_sec` (defaults: the server's, 10 and 100)."""
    return Limit(burst + 1, (burst + 1) / per_sec)


def new_id() -> str:
    """26 characters of [a-z0-9], as Mattermost's ids."""
    return "".join(secrets.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(26))


@dataclass
class Call:
    """One request the fake received (the token is never kept)."""

    route: str
    method: str
    path: str
    query: JSON
    json: Any
    authorized: bool


@dataclass
class Action(CommonActions):
    """How to answer one scripted call: "pass" (normally), "error" (`status`, Mattermost's
    `error_id` and `message`), "ratelimit" (429, `retry_after`), "html" (a proxy's page with
    `status`), "drop", "drop_before", "reset", "delay" (see `FakeHandler._answer`)."""

    kind: str
    status: int = 400
    error_id: str = ""
    message: str = ""
    retry_after: float = 1.0
    seconds: float = 0.0


def passthrough() -> Action:
    return Action("pass")


def error(error_id: str, message: str = "", status: int = 400) -> Action:
    return Action("error", status=status, error_id=error_id, message=message or error_id)


def ratelimit(retry_after: float = 1.0) -> Action:
    return Action("ratelimit", status=429, retry_after=retry_after)


html = Action.html
drop = Action.drop
reset = Action.reset
delay = Action.delay


class MattermostError(Exception):
    def __init__(self, status: int, error_id: str, message: str) -> None:
        super().__init__(message)
        self.status, self.error_id, self.message = status, error_id, message


@dataclass
class Post:
    id: str
    channel_id: str
    user_id: str
    message: str = ""
    root_id: str = ""
    props: JSON = field(default_factory=dict)
    file_ids: list[str] = field(default_factory=list)
    is_pinned: bool = False
    create_at: int = 0
    update_at: int = 0
    edit_at: int = 0
    pending_post_id: str = ""

    def as_mattermost(self) -> JSON:
        data = asdict(self)
        data.update(delete_at=0, type="", hashtags="", metadata={}, reply_count=0)
        return data


@dataclass
class Reaction:
    user_id: str
    post_id: str
    emoji_name: str
    create_at: int


class FakeMattermost(FakeServer[Call, Action]):
    """The fake server. Thread-safe: the HTTP handlers and the test share it under one lock."""

    thread_name = "fake-mattermost"
    action_class = Action
    platform = "Mattermost"
    source_name = "mattermost"
    backend = "django_connector_outbox.connectors.mattermost.MattermostConnector"

    def __init__(
        self,
        token: str = "fake-mattermost-bot-token",
        *,
        channels: tuple[str, ...] = ("channelchannelchannelchan1",),
        dedupe_window: float = 30.0,
        limit: Limit | None = None,
        clock: Callable[[], float] = time.time,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        super().__init__(clock=clock, host=host, port=port)
        self.token = token
        self.dedupe_window = dedupe_window
        self.limit = limit
        self._buckets: dict[str, Bucket] = {}
        self.bot_user: JSON = {"id": "botbotbotbotbotbotbotbot01", "username": "outbox-bot", "is_bot": True}
        self.channels: dict[str, dict[str, Post]] = {c: {} for c in channels}
        self.reactions: list[Reaction] = []
        self.ephemerals: list[JSON] = []
        self._pending: dict[str, tuple[float, str]] = {}  # pending_post_id -> (when, post id)
        self._last_ms = 0

    @property
    def url(self) -> str:
        """What to give the connector as `url` (the server)."""
        return self.origin

    # -- the settings of a source it delivers, and python -m

    def connector_options(self) -> JSON:
        return {"url": self.url, "token": self.token}

    def guide(self, source: str) -> str:
        with self._lock:
            channels = ", ".join(self.channels) or "none"
        return f"""\
Queue posts with a container_id of its channels: {channels} (more: --channel,
repeated); workspace_id is your team's id, which the fake does not check. A person's post, to reply or
react to: POST {self.origin}/_fake/posts {{"channel": "...", "message": "..."}}."""

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        add_chat_arguments(
            parser, token="fake-mattermost-bot-token", channel="channelchannelchannelchan1", limits="api"
        )

    @classmethod
    def from_options(cls, options: argparse.Namespace) -> Self:
        return cls(
            options.token,
            channels=chat_channels(options),
            limit=chat_limits(options).get("api"),
            host=options.host,
            port=options.port,
        )

    # -- set-up and inspection, for tests

    def add_channel(self, channel_id: str) -> None:
        with self._lock:
            self.channels.setdefault(channel_id, {})

    def add_post(
        self, channel: str, message: str = "", *, user_id: str = PERSON_ID, root_id: str = ""
    ) -> str:
        """A post by someone (a person by default); returns its id."""
        with self._lock:
            return self._new_post(channel, user_id, {"message": message, "root_id": root_id}).id

    def posts(self, channel: str) -> list[Post]:
        """Stored posts of a channel, oldest first."""
        with self._lock:
            return sorted(self.channels[channel].values(), key=lambda p: (p.create_at, p.id))

    def post(self, post_id: str) -> Post:
        with self._lock:
            return self._post(post_id)

    def state(self) -> JSON:
        with self._lock:
            return {
                "bot_user": dict(self.bot_user),
                "calls": [asdict(c) for c in self.calls],
                "channels": {c: [p.as_mattermost() for p in self.posts(c)] for c in self.channels},
                "reactions": [asdict(r) for r in self.reactions],
                "ephemerals": list(self.ephemerals),
                **self.records(),
            }

    def limited(self) -> tuple[dict[str, str], bool]:
        """The rate-limit headers of this request, and whether the limit refuses it."""
        if self.limit is None:
            return {}, False
        with self._lock:
            now = self.clock()
            bucket = self._buckets.setdefault(self.token, Bucket(self.limit))
            wait = bucket.wait(now)
            if wait <= 0:
                bucket.take(now)
            # The requests still allowed now (1e-9: 0.3 - 0.1 is 0.19999999999999998).
            left = math.floor((bucket.tolerance - max(bucket.tat - now, 0.0)) / bucket.interval + 1e-9) + 1
            headers = {
                "X-Ratelimit-Limit": str(self.limit.count),
                "X-Ratelimit-Remaining": str(max(min(left, self.limit.count), 0)),
                "X-Ratelimit-Reset": str(math.ceil(max(bucket.tat - now, 0.0))),
            }
            if wait > 0:
                headers["Retry-After"] = str(math.ceil(wait))
            return headers, wait > 0

    # -- the API

    def _now_ms(self) -> int:
        ms = max(int(self.clock() * 1000), self._last_ms + 1)
        self._last_ms = ms
        return ms

    def _new_post(self, channel_id: str, user_id: str, body: JSON) -> Post:
        posts = self._channel(channel_id)
        now = self._now_ms()
        post = Post(
            id=new_id(),
            channel_id=channel_id,
            user_id=user_id,
            message=str(body.get("message") or ""),
            root_id=str(body.get("root_id") or ""),
            props=dict(body.get("props") or {}),
            file_ids=list(body.get("file_ids") or []),
            create_at=now,
            update_at=now,
            pending_post_id=str(body.get("pending_post_id") or ""),
        )
        posts[post.id] = post
        return post

    def _channel(self, channel_id: str) -> dict[str, Post]:
        posts = self.channels.get(channel_id)
        if posts is None:
            # Mattermost checks the permission on the channel first: an unknown channel is a 403.
            raise MattermostError(
                403, "api.context.permissions.app_error", "You do not have the appropriate permissions."
            )
        return posts

    def _post(self, post_id: str) -> Post:
        for posts in self.channels.values():
            if post_id in posts:
                return posts[post_id]
        raise MattermostError(404, "app.post.get.app_error", "Unable to get the post.")

    def handle(self, route: str, params: dict[str, str], query: JSON, body: Any) -> Answer:
        with self._lock:
            try:
                status, answer = _ROUTES[route](self, params, query, body)
            except MattermostError as err:
                return err.status, _error_body(err.status, err.error_id, err.message)
            if route in WRITES:
                self.accept(route, params.get("channel", ""))
            return status, answer

    def _get_me(self, params: dict[str, str], query: JSON, body: Any) -> Answer:
        return 200, dict(self.bot_user)

    def _create_post(self, params: dict[str, str], query: JSON, body: Any) -> Answer:
        if not isinstance(body, dict) or not body.get("channel_id"):
            raise MattermostError(
                400, "api.context.invalid_body_param.app_error", "Invalid or missing post in request body."
            )
        channel_id = str(body["channel_id"])
        params["channel"] = channel_id
        posts = self._channel(channel_id)
        pending = str(body.get("pending_post_id") or "")
        if pending and pending in self._pending:
            when, earlier = self._pending[pending]
            if self.clock() - when <= self.dedupe_window:
                return 201, self._post(earlier).as_mattermost()
        message = str(body.get("message") or "")
        if len(message) > MAX_MESSAGE:
            raise MattermostError(
                400, "model.post.is_valid.message_length.app_error", "Invalid Message property length."
            )
        _check_props(body.get("props"))
        _check_file_ids(body.get("file_ids"))
        if not message and not body.get("file_ids") and not (body.get("props") or {}).get("attachments"):
            raise MattermostError(
                400, "api.post.create_post.no_content", "Post must have a message or files."
            )
        root = str(body.get("root_id") or "")
        if root and (root not in posts or posts[root].root_id):
            raise MattermostError(400, "api.post.create_post.root_id.app_error", "Invalid RootId parameter.")
        post = self._new_post(channel_id, self.bot_user["id"], body)
        if pending:
            self._pending[pending] = (self.clock(), post.id)
        return 201, post.as_mattermost()

    def _patch_post(self, params: dict[str, str], query: JSON, body: Any) -> Answer:
        post = self._post(params["post"])
        params["channel"] = post.channel_id
        if post.user_id != self.bot_user["id"]:
            raise MattermostError(
                403, "api.context.permissions.app_error", "You do not have the appropriate permissions."
            )
        if not isinstance(body, dict):
            raise MattermostError(
                400, "api.context.invalid_body_param.app_error", "Invalid or missing patch in request body."
            )
        if "message" in body:
            if len(str(body["message"])) > MAX_MESSAGE:
                raise MattermostError(
                    400, "model.post.is_valid.message_length.app_error", "Invalid Message property length."
                )
            post.message = str(body["message"])
        _check_props(body.get("props"))
        _check_file_ids(body.get("file_ids"))
        for name in ("props", "file_ids", "is_pinned"):
            if name in body:
                setattr(post, name, body[name])
        post.update_at = post.edit_at = self._now_ms()
        return 200, post.as_mattermost()

    def _save_reaction(self, params: dict[str, str], query: JSON, body: Any) -> Answer:
        if not isinstance(body, dict):
            raise MattermostError(
                400,
                "api.context.invalid_body_param.app_error",
                "Invalid or missing reaction in request body.",
            )
        if body.get("user_id") != self.bot_user["id"]:
            raise MattermostError(
                403, "api.context.permissions.app_error", "You do not have the appropriate permissions."
            )
        post = self._post(str(body.get("post_id") or ""))
        params["channel"] = post.channel_id
        emoji = str(body.get("emoji_name") or "")
        if not _EMOJI.match(emoji) or len(emoji) > 64:
            raise MattermostError(400, "model.reaction.is_valid.emoji_name.app_error", "Invalid emoji name.")
        key = (self.bot_user["id"], post.id, emoji)
        if not any((r.user_id, r.post_id, r.emoji_name) == key for r in self.reactions):
            self.reactions.append(Reaction(*key, self._now_ms()))
        post.update_at = self._now_ms()
        return 201, {"user_id": key[0], "post_id": key[1], "emoji_name": key[2], "create_at": post.update_at}

    def _delete_post(self, params: dict[str, str], query: JSON, body: Any) -> Answer:
        # Deleted posts are not found again: a second delete is a 404 (api4/post.go deletePost).
        post = self._post(params["post"])
        params["channel"] = post.channel_id
        if post.user_id != self.bot_user["id"]:  # the bot has delete_post, not delete_others_posts
            raise MattermostError(
                403, "api.context.permissions.app_error", "You do not have the appropriate permissions."
            )
        # The store deletes "Id = :Id OR RootId = :Id": a root takes its replies with it.
        posts = self.channels[post.channel_id]
        for gone in [p.id for p in posts.values() if post.id in (p.id, p.root_id)]:
            del posts[gone]
        return 200, {"status": "OK"}

    def _create_ephemeral(self, params: dict[str, str], query: JSON, body: Any) -> Answer:
        inner = body.get("post") if isinstance(body, dict) else None
        if not isinstance(inner, dict) or not body.get("user_id") or not inner.get("channel_id"):
            raise MattermostError(
                400, "api.context.invalid_body_param.app_error", "Invalid or missing post in request body."
            )
        params["channel"] = str(inner["channel_id"])
        self._channel(params["channel"])
        post = {**inner, "id": new_id(), "user_id": self.bot_user["id"], "create_at": self._now_ms()}
        self.ephemerals.append({"user_id": body["user_id"], "post": post})
        return 201, post

    def _get_posts(self, params: dict[str, str], query: JSON, body: Any) -> Answer:
        posts = sorted(self._channel(params["channel"]).values(), key=lambda p: p.create_at, reverse=True)
        if "since" in query:
            if any(k in query for k in ("before", "after", "page", "per_page")):
                raise MattermostError(
                    400, "api.context.invalid_url_param.app_error", "Invalid since parameter."
                )
            chosen = [p for p in posts if p.update_at > int(query["since"])][:SINCE_CAP]
        else:
            page, per_page = int(query.get("page", 0)), min(int(query.get("per_page", 60)), 200)
            chosen = posts[page * per_page : (page + 1) * per_page]
        return 200, _post_list(chosen)

    def _get_thread(self, params: dict[str, str], query: JSON, body: Any) -> Answer:
        root = self._post(params["post"])
        root = self._post(root.root_id) if root.root_id else root
        thread = [p for p in self.channels[root.channel_id].values() if root.id in (p.id, p.root_id)]
        return 200, _post_list(sorted(thread, key=lambda p: p.create_at, reverse=True))


def _post_list(posts: list[Post]) -> JSON:
    return {
        "order": [p.id for p in posts],
        "posts": {p.id: p.as_mattermost() for p in posts},
        "next_post_id": "",
        "prev_post_id": "",
        "has_next": False,
    }


#: "posts are limited to 5 files maximum" (api/v4/source/posts.yaml, Create a post: file_ids;
#: newer servers take 10: the fake holds a client to the documented 5).
MAX_FILE_IDS = 5


def _check_file_ids(file_ids: Any) -> None:
    """Refuse more files than a post may have ("model.post.is_valid.file_ids.app_error")."""
    if file_ids is not None and (not isinstance(file_ids, list) or len(file_ids) > MAX_FILE_IDS):
        raise MattermostError(
            400, "model.post.is_valid.file_ids.app_error", "Invalid FileIds property length."
        )


def _check_props(props: Any) -> None:
    """Refuse props the server cannot take: not an object, over `MAX_PROPS` runes of JSON
    (model/post.go PostPropsMaxUserRunes, "model.post.is_valid.props.app_error"), or message
    attachments that do not decode as the server's SlackAttachment list (model/
    slack_attachment.go: fields of a string `title`, a `value`, a boolean `short`)."""
    if props is None:
        return
    if not isinstance(props, dict):
        raise MattermostError(
            400, "api.context.invalid_body_param.app_error", "Invalid or missing post in request body."
        )
    if len(json.dumps(props, ensure_ascii=False)) > MAX_PROPS:
        raise MattermostError(400, "model.post.is_valid.props.app_error", "Invalid Props property length.")
    attachments = props.get("attachments", [])
    fields = [f for a in attachments if isinstance(a, dict) for f in a.get("fields") or []]
    if (
        not isinstance(attachments, list)
        or not all(isinstance(a, dict) for a in attachments)
        or not all(
            isinstance(f, dict)
            and isinstance(f.get("title", ""), str)
            and isinstance(f.get("short", False), bool)
            for f in fields
        )
    ):
        raise MattermostError(
            400, "api.context.invalid_body_param.app_error", "Invalid or missing post in request body."
        )


def _error_body(status: int, error_id: str, message: str) -> JSON:
    return {
        "id": error_id,
        "message": message,
        "detailed_error": "",
        "request_id": new_id(),
        "status_code": status,
    }


_PATTERNS = [
    ("GET", re.compile(r"^/users/me$"), "get_me"),
    ("POST", re.compile(r"^/posts$"), "create_post"),
    ("POST", re.compile(r"^/posts/ephemeral$"), "create_ephemeral"),
    ("PUT", re.compile(r"^/posts/(?P<post>[^/]+)/patch$"), "patch_post"),
    ("GET", re.compile(r"^/posts/(?P<post>[^/]+)/thread$"), "get_thread"),
    ("DELETE", re.compile(r"^/posts/(?P<post>[^/]+)$"), "delete_post"),
    ("POST", re.compile(r"^/reactions$"), "save_reaction"),
    ("GET", re.compile(r"^/channels/(?P<channel>[^/]+)/posts$"), "get_posts"),
]
_ROUTES: dict[str, Callable[[FakeMattermost, dict[str, str], JSON, Any], Answer]] = {
    "get_me": FakeMattermost._get_me,
    "create_post": FakeMattermost._create_post,
    "create_ephemeral": FakeMattermost._create_ephemeral,
    "patch_post": FakeMattermost._patch_post,
    "get_thread": FakeMattermost._get_thread,
    "delete_post": FakeMattermost._delete_post,
    "save_reaction": FakeMattermost._save_reaction,
    "get_posts": FakeMattermost._get_posts,
}
FakeMattermost.routes = frozenset(_ROUTES)


class _Handler(FakeHandler):
    fake: FakeMattermost
    protocol_version = "HTTP/1.1"
    normal_kind = "pass"
    _limit_headers: dict[str, str] = {}  # noqa: RUF012 - replaced per request, never mutated

    def do_GET(self) -> None:
        if not self._control(urlsplit(self.path).path):
            self._handle_api("GET")

    def do_POST(self) -> None:
        path = urlsplit(self.path).path
        if self._control(path):
            return
        if path == "/_fake/posts":
            spec = self._read_json()
            self._reply(200, {"id": self.fake.add_post(str(spec["channel"]), str(spec.get("message", "")))})
        else:
            self._handle_api("POST")

    def do_PUT(self) -> None:
        self._handle_api("PUT")

    def do_DELETE(self) -> None:
        self._handle_api("DELETE")

    def _handle_api(self, method: str) -> None:
        url = urlsplit(self.path)
        raw = self._read_body()
        path = url.path.removeprefix(API_PREFIX)
        found = match_route(_PATTERNS, method, path) if url.path.startswith(API_PREFIX + "/") else None
        if found is None:
            self._reply(
                404, _error_body(404, "api.context.404.app_error", "Sorry, we could not find the page.")
            )
            return
        route, params = found
        query: JSON = dict(parse_qsl(url.query))
        body = parse_json(raw)
        authorized = self.headers.get("Authorization", "") == f"Bearer {self.fake.token}"
        self.fake.record(Call(route, method, url.path, query, None if body is ... else body, authorized))
        if not authorized:
            self._reply(
                401,
                _error_body(
                    401,
                    "api.context.session_expired.app_error",
                    "Invalid or expired session, please login again.",
                ),
            )
            return
        headers, refused = self.fake.limited()
        self._limit_headers = headers
        if refused:
            # http.Error(w, "limit exceeded", 429) after the headers (ratelimit.go).
            self._send(429, b"limit exceeded\n", "text/plain; charset=utf-8", headers)
            return
        if body is ...:
            self._reply(400, _error_body(400, "api.context.invalid_body_param.app_error", "Invalid JSON."))
            return
        self._answer(self.fake._next_action(route), lambda: self.fake.handle(route, params, query, body))

    def _answer_own(self, action: Action, work: Callable[[], Answer]) -> None:
        if action.kind == "error":
            self._reply(action.status, _error_body(action.status, action.error_id, action.message))
        elif action.kind == "ratelimit":
            headers = {
                "X-Ratelimit-Limit": "101",
                "X-Ratelimit-Remaining": "0",
                "X-Ratelimit-Reset": str(math.ceil(action.retry_after)),
                "Retry-After": str(math.ceil(action.retry_after)),
            }
            self._send(429, b"limit exceeded\n", "text/plain; charset=utf-8", headers)
        else:
            super()._answer_own(action, work)

    def _reply(self, status: int, body: Any, *, headers: dict[str, str] | None = None) -> None:
        super()._reply(status, body, headers={**self._limit_headers, **(headers or {})})


FakeMattermost.handler_class = _Handler
running = FakeMattermost.running


def main(argv: list[str] | None = None) -> None:
    command_line(FakeMattermost, argv)


if __name__ == "__main__":
    main()
