"""Mattermost, through the REST API v4 with a bot's access token (plain httpx, see below).

Place: ``workspace_id`` is the team id, ``container_id`` the channel id, ``thread_id`` the root
post id of a thread ("" for none: Mattermost replies name the thread's root, never a reply),
and ``message_ref`` the post id.

Finding a post again after a lost reply: every post the outbox creates carries its marker in
``props`` (``props.outbox_id``: a 22-character digest of source and post id; Mattermost keeps
custom props and returns them in every listing) and the same digest as ``pending_post_id``,
Mattermost's own dedupe key: a second create with it within 30 seconds returns the first post
instead of a new one (server ``app/post.go`` ``deduplicateCreatePost``; in-memory, so not a
guarantee on a cluster: the lookup is what recovers a lost reply). `find_sent` reads the
channel's posts changed since just before the first claim (``GET /channels/{id}/posts?since=``,
at most 1000 posts) or, for a reply, the thread (``GET /posts/{root}/thread``), and matches the
bot's own post by its marker. Ephemeral posts are not stored: they cannot be looked up.

Why httpx and not ``mattermostdriver``: its last release (7.3.2) is of January 2022; it sends
each request with a new connection (module-level ``requests.post``), turns 4xx answers into
exceptions carrying the message only (the rate-limit headers of a 429 and Mattermost's error
id are lost) and logs every error body at ERROR level; it pulls in ``websockets`` too. It does
not retry, but nothing else of it would be used: five routes are simpler over `HttpConnector`.

A delete (a retract) is ``DELETE /posts/{message_ref}``; a 404 counts as done (deleted already).

With ``installations: True`` each post is sent to its team's server with its bot's token, as
saved by `Installations(source).save(team_id, secrets={"bot_token": ...}, extra={"url": ...})`.
A team without a usable installation fails its posts (`Refused`, no request); a 401 revokes it.

Both forms, one plan (connectors/http.py): run_outbox awaits `asend` and `afind_sent` on the
loop's async client; `send` and `find_sent` carry out the same requests and mapping through
the blocking client. Installations are read (and revoked) off the loop.
"""

from __future__ import annotations

import base64
import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import quote

import httpx
from django.core import checks
from django.utils.translation import gettext

from django_connector_outbox.connectors import mattermost_render
from django_connector_outbox.connectors.base import (
    CannotCheck,
    CheckLater,
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
from django_connector_outbox.connectors.text import scrub
from django_connector_outbox.installations.store import Credentials, Installations, NotInstalled
from django_connector_outbox.message import Message
from django_connector_outbox.posts import INSTALL_AGAIN, ClaimedPost, Kind, Scope

API = "/api/v4"
MARKER_PROP = "outbox_id"
# Fields of the create-post JSON that a patch may set ("Omitted fields will not be updated";
# PUT /posts/{id} instead blanks what it is not given).
PATCH_FIELDS = ("message", "props", "file_ids", "is_pinned", "has_reactions")
# Posts are read from this long before the first claim: our clock and the server's may differ.
LOOKUP_SKEW = timedelta(seconds=60)
# "If since is used, it will always return all posts modified since that time, ordered by
# their create time limited till 1000" (Get posts for a channel): a full answer may miss ours.
SINCE_CAP = 1000
# A 429 without Retry-After or X-Ratelimit-Reset (a proxy's): hold this long.
DEFAULT_RATE_LIMIT_WAIT = 1.0
REASON_LENGTH = 300


def marker_for(source: str, post_id: str) -> str:
    """22 characters: unpadded base64url of a 16-byte digest of source and post id."""
    digest = hashlib.blake2b(f"{source}\0{post_id}".encode(), digest_size=16).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


@dataclass(frozen=True)
class Server:
    """Where one post goes: the API root and the bot token (from OPTIONS or an installation)."""

    api: str
    token: str
    workspace_id: str = ""
    installed: bool = False

    def __repr__(self) -> str:  # never show the token
        return f"<Server {self.api}>"


class MattermostConnector(HttpConnector):
    """Posts, edits, deletes, reactions and ephemeral posts through a Mattermost bot's token."""

    kinds = frozenset(Kind.values)

    #: Mattermost's rate limiting, when an administrator enables it, throttles each IP (and/or
    #: token) to "Maximum queries per second" (default 10) with a "Maximum burst size" (default
    #: 100), across every route and channel (docs.mattermost.com, Rate limiting configuration
    #: settings; a GCRA in server/channels/app/ratelimit.go). Ten claims a second for the
    #: source, up to ten at once, leaves the burst for lookups and the project's other calls
    #: (bench/rate_limits.py, 4 senders against the fake at the defaults: 10.5 posts/s, no 429).
    #: A source with installations on many servers sets "PACE": {"workspace": (10, 1.0)}.
    pace = {Scope.SOURCE: (10, 1.0)}

    #: GET /users/me (once per server, for the bot's id) and one listing.
    lookup_requests = 2

    @classmethod
    def message_problem(cls, message: Message, options: Mapping[str, Any]) -> str | None:
        return mattermost_render.problem(message)

    def render(self, message: Message) -> dict[str, Any]:
        return mattermost_render.render(message)

    def __init__(
        self,
        source: str,
        *,
        url: Any = None,
        token: Any = None,
        installations: Any = False,
        timeout: Any = DEFAULT_TIMEOUT,
    ) -> None:
        super().__init__(source, timeout=timeout)
        self._url_option = url
        # A token read from a secrets file ends with a newline; Mattermost's have no whitespace.
        self._token = token.strip() if isinstance(token, str) else token
        self.installations = installations
        self._installations: Installations | None = None  # built on first use: no query in check()
        self._bot_ids: dict[tuple[str, str], str] = {}
        # The server limits the bot (or its IP) on every route: a 429 holds all it serves.
        self.limit_scope = Scope.WORKSPACE if installations is True else Scope.SOURCE

    def __repr__(self) -> str:  # never show the token
        return f"<MattermostConnector source={self.source!r}>"

    def secrets(self) -> list[str]:
        return [self._token] if isinstance(self._token, str) else []

    # -- where a post goes ----------------------------------------------------------------

    def _installed(self) -> Installations:
        if self._installations is None:
            self._installations = Installations(self.source)
        return self._installations

    def _server(self, post: ClaimedPost, credentials: Credentials) -> Server:
        """The server and token of `post`, from its team's installation; NotInstalled when that
        names no server."""
        url = credentials.extra.get("url")
        if not isinstance(url, str) or not url.startswith(("https://", "http://")):
            raise NotInstalled(
                f"the installation of source {self.source!r} in workspace {post.workspace_id} "
                f"has no server url (extra['url']): {INSTALL_AGAIN}",
                post.workspace_id,
            )
        return Server(_api_root(url), credentials.token, credentials.workspace_id, installed=True)

    def _server_of(self, post: ClaimedPost) -> Plan[Server]:
        """The server and token of `post`: the options', or its team's installation (their
        cache, or the database off the loop); NotInstalled when its team has none."""
        if self.installations is not True:
            return Server(_api_root(str(self._url_option)), str(self._token))
        installed = self._installed()
        credentials = yield from cached_or(
            installed.cached(post.workspace_id), installed.credentials, post.workspace_id
        )
        return self._server(post, credentials)

    def _call(self, server: Server, method: str, path: str, **kwargs: Any) -> Plan[httpx.Response]:
        headers = {"Authorization": f"Bearer {server.token}"}
        try:
            return (yield from http(method, server.api + path, headers=headers, **kwargs))
        except TransportError as exc:
            raise type(exc)(scrub(str(exc), [server.token])) from None

    # -- the two forms, one plan each (connectors/http.py) ----------------------------------

    def send(self, post: ClaimedPost) -> Outcome:
        return self._run(self._send_plan(post))

    async def asend(self, post: ClaimedPost) -> Outcome:
        return await self._arun(self._send_plan(post))

    def find_sent(self, post: ClaimedPost) -> str | None:
        """The id of the bot's post carrying this post's marker, None if there is none.

        Raises CannotCheck for an ephemeral post (never stored) and CheckLater when a request
        fails or the channel changed too much since the claim to be read in one answer.
        """
        return self._run(self._find_plan(post))

    async def afind_sent(self, post: ClaimedPost) -> str | None:
        return await self._arun(self._find_plan(post))

    def _send_plan(self, post: ClaimedPost) -> Plan[Outcome]:
        if post.kind not in self.kinds:
            return Refused(f"mattermost cannot send a {post.kind!r} post")
        try:
            server = yield from self._server_of(post)
        except NotInstalled as missing:
            return Refused(str(missing))  # no request: the reason names the team
        if post.kind == Kind.REACTION:
            return (yield from self._react(server, post))
        if post.kind == Kind.EPHEMERAL:
            return (yield from self._ephemeral(server, post))
        if post.kind == Kind.DELETE:
            return (yield from self._delete(server, post))
        if post.kind == Kind.STATUS and post.message_ref:
            return (yield from self._patch(server, post, post.message_ref))
        return (yield from self._create(server, post))

    def _create(self, server: Server, post: ClaimedPost) -> Plan[Outcome]:
        key = marker_for(self.source, post.post_id)
        props = _props_with_marker(post, key)
        if isinstance(props, Refused):
            return props
        payload = {**post.body, "channel_id": post.container_id, "pending_post_id": key, "props": props}
        payload.pop("root_id", None)
        if post.thread_id:
            payload["root_id"] = post.thread_id
        try:
            response = yield from self._call(server, "POST", "/posts", json=payload)
        except NotSent as exc:
            return RetryLater(str(exc))
        except LostReply as exc:
            return MaybeSent(str(exc))
        if response.status_code == 201:
            created = json_or_none(response)
            ref = created.get("id") if isinstance(created, dict) else None
            if not isinstance(ref, str) or not ref:
                return MaybeSent("mattermost answered 201 without a post id")
            if post.kind == Kind.STATUS and created.get("message") != payload.get("message", ""):
                # pending_post_id returned the post an earlier try created (its reply was a
                # 5xx), and the status changed since: bring the post up to date.
                return (yield from self._patch(server, post, ref))
            return self._delivered(ref, response)
        return (yield from self._map_error(server, response, create=True))

    def _patch(self, server: Server, post: ClaimedPost, ref: str) -> Plan[Outcome]:
        # A patch replaces props whole: the marker stays in them.
        props = _props_with_marker(post, marker_for(self.source, post.post_id))
        if isinstance(props, Refused):
            return props
        payload = {k: v for k, v in post.body.items() if k in PATCH_FIELDS}
        payload["props"] = props
        try:
            response = yield from self._call(server, "PUT", f"/posts/{_seg(ref)}/patch", json=payload)
        except TransportError as exc:
            # A patch sets state: sending it again is harmless, so a lost reply is a retry.
            return RetryLater(str(exc))
        if response.status_code == 200:
            return self._delivered(ref, response)
        return (yield from self._map_error(server, response, create=False))

    def _delete(self, server: Server, post: ClaimedPost) -> Plan[Outcome]:
        if not post.message_ref:
            return Refused("mattermost delete needs the message_ref of the post to delete")
        try:
            response = yield from self._call(server, "DELETE", f"/posts/{_seg(post.message_ref)}")
        except TransportError as exc:
            return RetryLater(str(exc))  # deleting twice is harmless: the second finds a 404
        if response.status_code in (200, 404):
            # 404: deleted already (an earlier try whose reply was lost, or a person); the
            # server reads the post without deleted ones first (api4/post.go deletePost).
            return self._delivered(post.message_ref, response)
        if response.status_code == 403:
            # Another user's post needs delete_others_posts; the bot's own, delete_post.
            reason = self._reason(server, response, json_or_none(response))
            return Refused(
                f"{reason} (the bot may not delete this post: it needs the delete_post permission)"
            )
        return (yield from self._map_error(server, response, create=False))

    def _react(self, server: Server, post: ClaimedPost) -> Plan[Outcome]:
        post_id = post.body.get("post_id")
        emoji = post.body.get("emoji_name")
        if not isinstance(post_id, str) or not post_id or not isinstance(emoji, str) or not emoji.strip(":"):
            return Refused("mattermost reaction body needs 'post_id' and 'emoji_name'")
        try:
            payload = {
                "user_id": (yield from self._bot_user_id(server)),
                "post_id": post_id,
                "emoji_name": emoji.strip(":"),
            }
            # "We don't consider duplicated save calls as an error" (the reaction store upserts):
            # a repeat is harmless, so a lost reply is a retry.
            response = yield from self._call(server, "POST", "/reactions", json=payload)
        except (CheckLater, TransportError) as exc:
            return RetryLater(str(exc))
        if response.status_code in (200, 201):
            return self._delivered(None, response)
        return (yield from self._map_error(server, response, create=False))

    def _ephemeral(self, server: Server, post: ClaimedPost) -> Plan[Outcome]:
        user_id = post.body.get("user_id")
        if not isinstance(user_id, str) or not user_id:
            return Refused("mattermost ephemeral body needs 'user_id'")
        inner = {k: v for k, v in post.body.items() if k != "user_id"}
        inner["channel_id"] = post.container_id
        inner.pop("root_id", None)
        if post.thread_id:
            inner["root_id"] = post.thread_id
        try:
            response = yield from self._call(
                server, "POST", "/posts/ephemeral", json={"user_id": user_id, "post": inner}
            )
        except NotSent as exc:
            return RetryLater(str(exc))
        except LostReply as exc:
            return MaybeSent(str(exc))  # never stored, never looked up: it ends uncertain
        if response.status_code == 201:
            return self._delivered(None, response)  # no id to edit or look up
        return (yield from self._map_error(server, response, create=True))

    def _delivered(self, ref: str | None, response: httpx.Response) -> Delivered:
        """Delivered, holding what the limit covers for a second when this request emptied the
        bucket (``X-Ratelimit-Remaining: 0``): Mattermost refills it at least once a second."""
        if response.headers.get("X-Ratelimit-Remaining") != "0":
            return Delivered(ref)
        reason = "mattermost rate limit: X-Ratelimit-Remaining 0"
        return Delivered(ref, Hold(1.0, reason, self.limit_scope))

    # -- errors ---------------------------------------------------------------------------

    def _map_error(self, server: Server, response: httpx.Response, *, create: bool) -> Plan[Outcome]:
        error = json_or_none(response)
        error_id = error.get("id") if isinstance(error, dict) else None
        reason = self._reason(server, response, error)
        status = response.status_code
        if status == 429:
            # Mattermost's limiter sends Retry-After and X-Ratelimit-Reset, both in seconds
            # (server/channels/app/ratelimit.go; the docs' "epoch" for Reset is not what it sends).
            after = parse_retry_after(response.headers.get("Retry-After"))
            if after is None:
                after = _seconds(response.headers.get("X-Ratelimit-Reset"))
            after = DEFAULT_RATE_LIMIT_WAIT if after is None else after
            return RateLimited(after, f"{reason} (rate limited)", self.limit_scope)
        if status >= 500:
            if not create or isinstance(error_id, str):
                # Mattermost itself answered with its error: the create failed (and its
                # pending_post_id was dropped "allowing a proper retry"), or, as
                # api.post.deduplicate_create_post.pending, an earlier try is still saving it,
                # and the retry's pending_post_id returns that post (server app/post.go).
                return RetryLater(reason, parse_retry_after(response.headers.get("Retry-After")))
            # A proxy's 5xx (502, 504: no Mattermost JSON): the create may have been done.
            return MaybeSent(reason)
        if status == 401 and server.installed:
            return (yield from offload(self._revoke, server, reason))
        # 400 (bad body, message too long, archived channel, bad root_id, edit time limit),
        # 401 (token), 403 (permission), 404, 413, 501 (feature off): the same again gets the same.
        return Refused(reason)

    def _reason(self, server: Server, response: httpx.Response, error: Any) -> str:
        """``mattermost <status> <error id>: <message>``, without a token, cut short."""
        if isinstance(error, dict) and isinstance(error.get("id"), str):
            text = f"mattermost {response.status_code} {error['id']}: {error.get('message', '')}"
        else:
            text = f"mattermost {response.status_code} {response.reason_phrase}".rstrip()
        return scrub(text, [*self.secrets(), server.token])[:REASON_LENGTH]

    def _revoke(self, server: Server, reason: str) -> Refused:
        """A 401 to an installation's token: its installation is gone (the bot or its token
        was removed). Revoke it (unless installed again since) so the team's posts fail at once."""
        assert self._installations is not None
        self._installations.revoke(server.workspace_id, reason, token=server.token)
        # Read it again even if another sender revoked it first (this one's copy is cached).
        self._installations.forget(server.workspace_id)
        try:
            self._installations.credentials(server.workspace_id)
        except NotInstalled as missing:
            return Refused(str(missing))
        return Refused(f"{reason}; the workspace was installed again since")

    # -- lookup ---------------------------------------------------------------------------

    def _find_plan(self, post: ClaimedPost) -> Plan[str | None]:
        if post.kind == Kind.REACTION:
            return None  # the reaction store upserts: "not there" makes the sender send it again
        if post.kind == Kind.DELETE:
            return None  # a delete is sent again: a post deleted already answers 404
        if post.kind == Kind.EPHEMERAL:
            raise CannotCheck("mattermost ephemeral posts are not stored: they cannot be looked up")
        try:
            server = yield from self._server_of(post)
        except NotInstalled as missing:
            raise CannotCheck(str(missing)) from None
        bot_id = yield from self._bot_user_id(server)
        if post.thread_id:
            posts = yield from self._listing(server, f"/posts/{_seg(post.thread_id)}/thread", {})
        else:
            since = int((post.sent_at - LOOKUP_SKEW).timestamp() * 1000)
            posts = yield from self._listing(
                server, f"/channels/{_seg(post.container_id)}/posts", {"since": str(since)}
            )
            if len(posts) >= SINCE_CAP:
                raise CheckLater(
                    f"mattermost posts since the claim: {SINCE_CAP} or more, ours may be missing"
                )
        key = marker_for(self.source, post.post_id)
        for found in posts:
            props = found.get("props")
            if found.get("user_id") == bot_id and isinstance(props, dict) and props.get(MARKER_PROP) == key:
                return str(found["id"])
        return None

    def _listing(self, server: Server, path: str, params: dict[str, str]) -> Plan[list[dict[str, Any]]]:
        """The posts of a post list (``{"order": [...], "posts": {id: post}}``)."""
        try:
            response = yield from self._call(server, "GET", path, params=params)
        except TransportError as exc:
            raise CheckLater(f"mattermost lookup: {exc}") from exc
        data = json_or_none(response)
        if response.status_code != 200:
            raise CheckLater(f"mattermost lookup: {self._reason(server, response, data)}")
        posts = data.get("posts") if isinstance(data, dict) else None
        if posts is None and isinstance(data, dict) and "order" in data:
            return []  # an empty list: Go's nil map comes as null
        if not isinstance(posts, dict) or not all(
            isinstance(p, dict) and isinstance(p.get("id"), str) for p in posts.values()
        ):
            raise CheckLater("mattermost lookup: unexpected answer")
        return list(posts.values())

    def _bot_user_id(self, server: Server) -> Plan[str]:
        """The bot's own user id on `server` (GET /users/me once, then cached; two lookups at
        once may both ask, and get the same answer)."""
        key = (server.api, server.token)
        known = self._bot_ids.get(key)
        if known is not None:
            return known
        try:
            response = yield from self._call(server, "GET", "/users/me")
        except TransportError as exc:
            raise CheckLater(f"mattermost users/me: {exc}") from exc
        data = json_or_none(response)
        if response.status_code != 200 or not isinstance(data, dict) or not data.get("id"):
            raise CheckLater(f"mattermost users/me: {self._reason(server, response, data)}")
        self._bot_ids[key] = str(data["id"])
        return self._bot_ids[key]

    # -- configuration --------------------------------------------------------------------

    def check(self) -> list[checks.CheckMessage]:
        """connector_outbox.E231 url, E232 token, E233 timeout, E234 token and installations."""
        errors: list[checks.CheckMessage] = []
        if self.installations not in (True, False):
            errors.append(
                checks.Error(
                    gettext(
                        "CONNECTOR_OUTBOX source %(source)r: OPTIONS['installations'] must be True or False, "
                        "not %(value)r."
                    )
                    % {"source": self.source, "value": self.installations},
                    id="connector_outbox.E234",
                )
            )
        elif self.installations:
            if self._token is not None or self._url_option is not None:
                errors.append(
                    checks.Error(
                        gettext(
                            "CONNECTOR_OUTBOX source %(source)r: with OPTIONS['installations'], each team's "
                            "server url and bot token come from its installation: remove OPTIONS['url'] and "
                            "OPTIONS['token']."
                        )
                        % {"source": self.source},
                        id="connector_outbox.E234",
                    )
                )
        else:
            errors += self.check_http_url(
                "url",
                self._url_option,
                "connector_outbox.E231",
                needs=gettext("Mattermost needs the server's http(s) URL in OPTIONS['url']"),
                hint=gettext("For example https://chat.example.com (the API is under /api/v4)."),
            )
            errors += self.check_header_token(
                "token",
                self._token,
                "connector_outbox.E232",
                missing=gettext(
                    "Mattermost needs a bot access token in OPTIONS['token'] (or 'installations': True)"
                ),
                hint=gettext(
                    "Create a bot account (Integrations > Bot Accounts) and read its token from the environment."
                ),
            )
        errors += self.check_timeout("connector_outbox.E233")
        return errors


def _props_with_marker(post: ClaimedPost, key: str) -> dict[str, Any] | Refused:
    """The body's ``props`` with the outbox's marker added."""
    props = post.body.get("props") or {}
    if not isinstance(props, dict):
        return Refused("mattermost body 'props' must be a JSON object")
    return {**props, MARKER_PROP: key}


def _api_root(url: str) -> str:
    """The API v4 root of a server URL given with or without ``/api/v4``."""
    return url.rstrip("/").removesuffix(API) + API


def _seconds(value: str | None) -> float | None:
    try:
        seconds = float(value or "")
    except ValueError:
        return None
    return max(seconds, 0.0) if math.isfinite(seconds) else None


def _seg(value: str) -> str:
    """A path segment; ids are 26 characters of [a-z0-9], but never let a '/' change the route."""
    return quote(str(value), safe="")
