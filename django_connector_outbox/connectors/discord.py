"""Discord, through the bot REST API (v10).

Place: ``workspace_id`` is the guild id, ``container_id`` the channel id, ``thread_id`` a
thread's channel id ("" for none; threads are channels, so a thread post goes there), and
``message_ref`` the message's snowflake id.

How a post is found again after a lost reply: Discord keeps no idempotency key. The create
carries a ``nonce`` with ``enforce_nonce`` (a quick re-send returns the first message instead
of posting twice), but the nonce is not stored with the message. So every message the outbox
posts also carries a marker embed, a small embed whose footer reads ``outbox:<key>``, where
``<key>`` is the same 22-character digest of source and post id. Discord returns an app's
own embeds in history even without the MESSAGE_CONTENT intent, so `find_sent` reads the
channel from just before the post's first claim and matches the bot's own messages by it.
Visible effect: each message shows one extra small embed with that grey footer line.

Replies (`thread_of`): Discord's threads are channels, and a thread started from a message has
the message's id ("The id of the created thread will be the same as the id of the source
message", Start Thread from Message). So a reply's thread is its parent's thread when the
parent is itself in one, else the parent's message id (`reply_thread`, no request), and before
the first reply is created (or looked up) the thread is started from the parent message:
``POST /channels/{channel}/messages/{parent}/threads``, named by the reply body's
``thread_name`` (taken out of the message) or else the parent's post id. A second start
answers 160004 ("A thread has already been created for this message"), which counts as
started: the connector remembers the threads it started only to save that request, and a
restarted sender asks once more.

A delete (a retract) is ``DELETE /channels/{channel}/messages/{message_ref}`` in the channel the
message is in: its thread's when it has one (a thread is a channel). A ``10008 Unknown Message``
counts as done (deleted already); it is never looked up, since sending it again is harmless.

Both forms, one plan (connectors/http.py): run_outbox awaits `asend` and `afind_sent` on the
loop's async client; `send` and `find_sent` carry out the same requests and mapping through
the blocking client.
"""

from __future__ import annotations

import base64
import hashlib
import math
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

import httpx
from django.core import checks
from django.utils.translation import gettext

from django_connector_outbox import __version__
from django_connector_outbox.connectors import discord_render
from django_connector_outbox.connectors.base import (
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
from django_connector_outbox.message import Message
from django_connector_outbox.posts import ClaimedPost, Kind, Parent, Scope

DEFAULT_BASE_URL = "https://discord.com/api/v10"
DISCORD_EPOCH_MS = 1420070400000
MARKER_PREFIX = "outbox:"
MAX_EMBEDS = 10
# Fields of the create-message JSON that an edit may set (Edit Message, author only).
EDIT_FIELDS = ("content", "embeds", "flags", "components", "allowed_mentions", "attachments")
# History is read from this long before the first claim: our clock and Discord's may differ.
LOOKUP_SKEW = timedelta(seconds=60)
PAGE_LIMIT = 100
# A busier channel than 500 messages since the claim: look again later. Few pages keep the
# worst lookup (pages x timeout) well inside the default LEASE with a send after it.
MAX_PAGES = 5

# JSON error codes (opcodes-and-status-codes.mdx) that mean "not now" rather than "never";
# all hold the channel but 20029, the server's (the guild's: the workspace).
RATE_CODES = {
    20016: "slowmode",
    20022: "announcement edit rate limit",
    20028: "channel write rate limit",
    20029: "server write rate limit",
    30046: "edit limit on messages older than 1 hour",
    40062: "service resource rate limited",
}
SERVER_RATE_CODE = 20029
# The API itself answered "try later": nothing was created, so even a create may be re-sent.
TRANSIENT_CODES = {130000, 40004, 40006}
# "A thread has already been created for this message": a start of a reply's thread that an
# earlier try (or another sender) made already.
THREAD_EXISTS = 160004
THREAD_NAME_MAX = 100
# A delete's answers: "Unknown Message" (deleted already: done), and "Missing Permissions" (a
# message of someone else's, without Manage Messages).
UNKNOWN_MESSAGE = 10008
MISSING_PERMISSIONS = 50013
# Threads remembered as started (see the module); past this many the memory starts over.
STARTED_THREADS_MAX = 10_000


def nonce_for(source: str, post_id: str) -> str:
    """22 characters: unpadded base64url of a 16-byte digest (Discord allows 25)."""
    digest = hashlib.blake2b(f"{source}\0{post_id}".encode(), digest_size=16).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def snowflake_at(when: datetime) -> int:
    """The smallest snowflake of the millisecond `when` (for ?after= pagination)."""
    return max(int(when.timestamp() * 1000) - DISCORD_EPOCH_MS, 0) << 22


def first_form_error(errors: Any, path: tuple[str, ...] = ()) -> str:
    """The first leaf of Discord's `errors` tree as "embeds.0.title: Must be 256 or fewer in
    length." (developers/reference.mdx, Error Messages), or "" without one."""
    if not isinstance(errors, dict):
        return ""
    for key, value in errors.items():
        if key == "_errors" and isinstance(value, list) and value and isinstance(value[0], dict):
            return f"{'.'.join(path)}: {value[0].get('message', '')}"
        found = first_form_error(value, (*path, str(key)))
        if found:
            return found
    return ""


class DiscordError:
    """A non-2xx answer: HTTP status, Discord's JSON code and message, retry_after."""

    def __init__(self, response: httpx.Response) -> None:
        data = json_or_none(response)
        data = data if isinstance(data, dict) else {}
        self.status = response.status_code
        code = data.get("code")
        self.code = code if isinstance(code, int) else None
        self.message = str(data.get("message") or response.reason_phrase or "")[:300]
        form = first_form_error(data.get("errors"))
        if form:  # 50035 Invalid Form Body says where in its `errors` tree
            self.message = f"{self.message} ({form})"[:300]
        retry_after = data.get("retry_after")
        if isinstance(retry_after, (int, float)) and not isinstance(retry_after, bool):
            self.retry_after: float | None = max(float(retry_after), 0.0)
        else:
            self.retry_after = parse_retry_after(response.headers.get("Retry-After"))
        self.is_global = bool(data.get("global")) or response.headers.get("X-RateLimit-Global") == "true"
        self.scope = response.headers.get("X-RateLimit-Scope", "")
        self.json = bool(data)

    @property
    def reason(self) -> str:
        code = self.code if self.code is not None else f"HTTP {self.status}"
        return f"discord {code} {self.message}".strip()


class DiscordConnector(HttpConnector):
    """Posts, edits, deletes and reactions through a Discord bot token."""

    kinds = frozenset({Kind.MESSAGE, Kind.STATUS, Kind.REACTION, Kind.DELETE})
    # The pages, one probe of an empty channel, and the start of a reply's thread.
    lookup_requests = MAX_PAGES + 2
    # "Clients using the HTTP API must provide a valid User Agent ... DiscordBot ($url,
    # $versionNumber)" (developers/reference.mdx).
    user_agent = f"DiscordBot (https://pypi.org/project/django-connector-outbox/, {__version__})"
    #: "All bots can make up to 50 requests per second to our API" (topics/rate-limits.mdx),
    #: per bot token: the source. Three at once, then one each 21 ms (47.6 a second), so that
    #: no second holds more than 50 whether Discord counts in windows or in a bucket. The burst
    #: of 3 lets a claim come up to 42 ms late without losing its slot: with 2 (22 ms) four
    #: senders on a busy machine kept 43.5 a second of the 45 paced (bench/rate_limits.py);
    #: with 3, 47.4, and 0.3% 429s from a fake counting fixed 1 s windows. Channels
    #: have per-route buckets whose size Discord does not publish ("rate limits should not be
    #: hard coded"): they are followed from the headers instead (`X-RateLimit-Remaining: 0`
    #: with `Reset-After` on a success holds the channel: `Delivered.hold`).
    pace = {Scope.SOURCE: (3, 0.063)}

    @classmethod
    def message_problem(cls, message: Message, options: Mapping[str, Any]) -> str | None:
        return discord_render.problem(message)

    def render(self, message: Message) -> dict[str, Any]:
        return discord_render.render(message)

    def __init__(
        self,
        source: str,
        *,
        token: Any = None,
        base_url: Any = DEFAULT_BASE_URL,
        timeout: Any = DEFAULT_TIMEOUT,
    ) -> None:
        super().__init__(source, timeout=timeout)
        # A token read from a secrets file ends with a newline; Discord's never has whitespace.
        self._token = token.strip() if isinstance(token, str) else token
        self._base_url_option = base_url
        self.base_url = str(base_url).rstrip("/")
        self._bot_id: str | None = None
        self._started: set[str] = set()  # thread ids of replies' threads started (see the module)

    def __repr__(self) -> str:  # never show the token
        return f"<DiscordConnector source={self.source!r}>"

    def secrets(self) -> list[str]:
        return [self._token] if isinstance(self._token, str) else []

    # -- requests ---------------------------------------------------------------------

    def _call(self, method: str, path: str, **kwargs: Any) -> Plan[httpx.Response]:
        headers = {"Authorization": f"Bot {self._token}"}
        return (yield from http(method, self.base_url + path, headers=headers, **kwargs))

    # -- the two forms, one plan each (connectors/http.py) ----------------------------

    def send(self, post: ClaimedPost) -> Outcome:
        return self._run(self._send_plan(post))

    async def asend(self, post: ClaimedPost) -> Outcome:
        return await self._arun(self._send_plan(post))

    def find_sent(self, post: ClaimedPost) -> str | None:
        """The id of the bot's message carrying this post's marker, None if there is none.

        Reads the channel (or thread) forward from just before `post.sent_at`. Raises
        CheckLater if any page fails, and also when the channel shows no message at all:
        without READ_MESSAGE_HISTORY Discord answers with empty pages instead of an error,
        and an empty page must not pass for "not sent".
        """
        return self._run(self._find_plan(post))

    async def afind_sent(self, post: ClaimedPost) -> str | None:
        return await self._arun(self._find_plan(post))

    def _send_plan(self, post: ClaimedPost) -> Plan[Outcome]:
        channel = post.thread_id or post.container_id
        if post.kind == Kind.REACTION:
            return (yield from self._react(post, channel))
        if post.kind == Kind.DELETE:
            return (yield from self._delete(post, channel))
        if post.kind == Kind.STATUS and post.message_ref:
            return (yield from self._edit(post, channel, post.message_ref))
        if post.kind in (Kind.MESSAGE, Kind.STATUS):
            if (failed := (yield from self._start_thread(post))) is not None:
                return failed
            return (yield from self._create(post, channel))
        return Refused(f"discord cannot send a {post.kind!r} post")

    def reply_thread(self, parent: Parent) -> str:
        """The parent's thread, else the thread started from its message, whose id is the
        message's (see the module): `send` and `find_sent` start it."""
        return parent.thread_id or parent.message_ref or ""

    def _start_thread(self, post: ClaimedPost) -> Plan[Outcome | None]:
        """Start a reply's thread from its parent message unless it was (see the module);
        None when it exists, else the outcome of a start that failed."""
        parent = post.parent
        if parent is None or parent.thread_id or not post.thread_id or post.thread_id != parent.message_ref:
            return None  # not a reply, or its parent is in a thread already
        if post.thread_id in self._started:
            return None
        name = post.body.get("thread_name")
        if not isinstance(name, str) or not name.strip():
            name = parent.post_id
        path = f"/channels/{_seg(post.container_id)}/messages/{_seg(post.thread_id)}/threads"
        try:
            response = yield from self._call("POST", path, json={"name": name.strip()[:THREAD_NAME_MAX]})
        except TransportError as exc:
            # Starting it again is harmless: a thread started meanwhile answers 160004.
            return RetryLater(f"discord thread of {parent.post_id}: {exc}")
        if response.status_code not in (200, 201) and DiscordError(response).code != THREAD_EXISTS:
            failed = self._map_error(response)
            if isinstance(failed, (RetryLater, RateLimited, Refused)):
                failed = replace(failed, reason=f"discord thread of {parent.post_id}: {failed.reason}")
            return failed
        if len(self._started) >= STARTED_THREADS_MAX:
            self._started.clear()
        self._started.add(post.thread_id)
        return None

    def _create(self, post: ClaimedPost, channel: str) -> Plan[Outcome]:
        body = post.body
        if post.parent is not None and "thread_name" in body:  # the thread's, not the message's
            body = {k: v for k, v in body.items() if k != "thread_name"}
        payload = self._with_marker(post, body)
        if isinstance(payload, Refused):
            return payload
        payload["nonce"] = nonce_for(self.source, post.post_id)
        payload["enforce_nonce"] = True
        try:
            response = yield from self._call("POST", f"/channels/{_seg(channel)}/messages", json=payload)
        except NotSent as exc:
            return RetryLater(str(exc))
        except LostReply as exc:
            return MaybeSent(str(exc))
        if response.status_code == 200:
            message = json_or_none(response) or {}
            ref = str(message.get("id")) if isinstance(message, dict) and message.get("id") else None
            if ref is None:
                return MaybeSent("discord answered 200 without a message id")
            if post.kind == Kind.STATUS and message.get("content", "") != payload.get("content", ""):
                # enforce_nonce returned the message an earlier try created, and the status
                # changed since (a retry after a 5xx that had in fact posted): bring it up to date.
                return (yield from self._edit(post, channel, ref))
            return _delivered(ref, response)
        # A 5xx on a create is ambiguous in general, but this create carries a nonce with
        # enforce_nonce: a re-send within "a few minutes" returns the message the first try
        # created instead of a second one. With the default backoff (RETRY_BASE 2, RETRY_MAX
        # 60) every retry falls well inside that window, so RetryLater is safe here and much
        # faster than MaybeSent (a lease wait, then a history lookup). A lost reply is still
        # MaybeSent: the next try could come after the lease, outside the window.
        return self._map_error(response)

    def _edit(self, post: ClaimedPost, channel: str, ref: str) -> Plan[Outcome]:
        payload = self._with_marker(post, {k: v for k, v in post.body.items() if k in EDIT_FIELDS})
        if isinstance(payload, Refused):
            return payload
        try:
            response = yield from self._call(
                "PATCH", f"/channels/{_seg(channel)}/messages/{_seg(ref)}", json=payload
            )
        except TransportError as exc:
            # An edit sets state: sending it again is harmless, so a lost reply is a retry.
            return RetryLater(str(exc))
        if response.status_code == 200:
            return _delivered(ref, response)
        return self._map_error(response)

    def _react(self, post: ClaimedPost, channel: str) -> Plan[Outcome]:
        message_id = str(post.body.get("message_id") or "")
        emoji = _emoji_for_url(post.body.get("emoji"))
        if not message_id or not emoji:
            return Refused("discord reaction body needs 'message_id' and 'emoji'")
        path = f"/channels/{_seg(channel)}/messages/{_seg(message_id)}/reactions/{quote(emoji, safe='')}/@me"
        try:
            response = yield from self._call("PUT", path)
        except TransportError as exc:
            # PUT of our own reaction is idempotent: sending it again is harmless.
            return RetryLater(str(exc))
        if response.status_code in (200, 204):
            return _delivered(None, response)
        return self._map_error(response)

    def _delete(self, post: ClaimedPost, channel: str) -> Plan[Outcome]:
        if not post.message_ref:
            return Refused("discord delete needs the message_ref of the message to delete")
        path = f"/channels/{_seg(channel)}/messages/{_seg(post.message_ref)}"
        try:
            response = yield from self._call("DELETE", path)
        except TransportError as exc:
            return RetryLater(str(exc))  # deleting twice is harmless: the second finds 10008
        if response.status_code in (200, 204):
            return _delivered(post.message_ref, response)
        error = DiscordError(response)
        if error.status == 404 and error.code == UNKNOWN_MESSAGE:
            # Deleted already: an earlier try whose reply was lost, or a person.
            return _delivered(post.message_ref, response)
        if error.status == 403 and error.code == MISSING_PERMISSIONS:
            # A bot deletes its own messages with no permission; anyone else's needs this one.
            return Refused(
                f"{error.reason} (the bot may delete only its own messages without the Manage "
                "Messages permission in the channel)"
            )
        return self._map_error(response)

    def _with_marker(self, post: ClaimedPost, body: dict[str, Any]) -> dict[str, Any] | Refused:
        """`body` with the marker embed appended (the edit of a status keeps it too)."""
        payload = dict(body)
        embeds = list(payload.get("embeds") or [])
        if len(embeds) >= MAX_EMBEDS:
            return Refused(
                f"discord body has {len(embeds)} embeds; the outbox needs one of the 10 for its marker"
            )
        embeds.append({"footer": {"text": MARKER_PREFIX + nonce_for(self.source, post.post_id)}})
        payload["embeds"] = embeds
        return payload

    def _map_error(self, response: httpx.Response) -> Outcome:
        error = DiscordError(response)
        limited = error.status == 429
        after = error.retry_after if error.retry_after is not None else 1.0
        if limited and (error.is_global or error.scope == "global"):
            # The bot's global limit: every channel would get the same answer.
            return RateLimited(after, f"{error.reason} (rate limited, scope global)", Scope.SOURCE)
        if limited and not error.scope and not error.json:
            # No rate-limit headers and no JSON: not Discord's limiter but Cloudflare's page,
            # which limits (and bans) the whole IP, so every channel of the bot.
            return RateLimited(after, f"{error.reason} (rate limited, not by Discord's API)", Scope.SOURCE)
        if error.code in RATE_CODES:
            reason = f"{error.reason} ({RATE_CODES[error.code]})"
            if not limited and error.retry_after is None:
                return RetryLater(reason)
            scope = Scope.WORKSPACE if error.code == SERVER_RATE_CODE else Scope.CONTAINER
            return RateLimited(after, reason, scope)
        if limited:
            # `user` and `shared` limits are the route's, per channel (`shared`: per resource,
            # and not counted towards the invalid-request limit).
            return RateLimited(after, f"{error.reason} (rate limited, scope {error.scope or 'route'})")
        if error.code in TRANSIENT_CODES or error.status >= 500:
            return RetryLater(error.reason, error.retry_after)
        # 400 payload, 401 token, 403 access/permission, 404 unknown channel/message/emoji,
        # and any other 4xx: sending the same request again would get the same answer.
        return Refused(error.reason)

    # -- lookup -----------------------------------------------------------------------

    def _find_plan(self, post: ClaimedPost) -> Plan[str | None]:
        if post.kind == Kind.REACTION:
            # A reaction PUT is idempotent: "not there" makes the sender simply send it again.
            return None
        if post.kind == Kind.DELETE:
            return None  # a delete is sent again: a message deleted already answers 10008
        if (failed := (yield from self._start_thread(post))) is not None:  # a reply's thread, to read
            raise CheckLater(getattr(failed, "reason", "") or "discord thread could not be started")
        channel = post.thread_id or post.container_id
        marker = MARKER_PREFIX + nonce_for(self.source, post.post_id)
        bot_id = yield from self._bot_user_id()
        after = snowflake_at(post.sent_at - LOOKUP_SKEW)
        seen_any = False
        for _ in range(MAX_PAGES):
            page = yield from self._history(channel, {"after": str(after), "limit": str(PAGE_LIMIT)})
            seen_any = seen_any or bool(page)
            for message in page:
                if _author_id(message) == bot_id and _has_marker(message, marker):
                    return str(message["id"])
            if len(page) < PAGE_LIMIT:
                break
            # Pages come newest first; the next page starts after the newest id seen.
            after = max(int(m["id"]) for m in page)
        else:
            raise CheckLater(f"discord history: more than {MAX_PAGES * PAGE_LIMIT} messages to read")
        if not seen_any and not (yield from self._history(channel, {"limit": "1"})):
            raise CheckLater(
                "discord history is empty: the bot may lack Read Message History in this channel"
            )
        return None

    def _history(self, channel: str, params: dict[str, str]) -> Plan[list[dict[str, Any]]]:
        try:
            response = yield from self._call("GET", f"/channels/{_seg(channel)}/messages", params=params)
        except TransportError as exc:
            raise CheckLater(f"discord history: {exc}") from exc
        if response.status_code != 200:
            raise CheckLater(f"discord history: {DiscordError(response).reason}")
        page = json_or_none(response)
        if not isinstance(page, list) or not all(
            isinstance(m, dict) and str(m.get("id", "")).isdigit() for m in page
        ):
            raise CheckLater("discord history: unexpected answer")
        return page

    def _bot_user_id(self) -> Plan[str]:
        """The bot's own user id (GET /users/@me once, then cached; two lookups at once may
        both ask, and get the same answer)."""
        if self._bot_id is None:
            try:
                response = yield from self._call("GET", "/users/@me")
            except TransportError as exc:
                raise CheckLater(f"discord users/@me: {exc}") from exc
            data = json_or_none(response)
            if response.status_code != 200 or not isinstance(data, dict) or "id" not in data:
                raise CheckLater(f"discord users/@me: {DiscordError(response).reason}")
            self._bot_id = str(data["id"])
        return self._bot_id

    # -- configuration ----------------------------------------------------------------

    def check(self) -> list[checks.CheckMessage]:
        """connector_outbox.E201 token, E202 base_url, E203 timeout.

        An unknown option name is a TypeError when the connector is built (E005).
        """
        errors: list[checks.CheckMessage] = []
        if isinstance(self._token, str) and self._token.startswith("Bot "):
            errors.append(
                checks.Error(
                    gettext(
                        "CONNECTOR_OUTBOX source %(source)r: OPTIONS['token'] must be the bare bot token, "
                        "without the 'Bot ' prefix."
                    )
                    % {"source": self.source},
                    id="connector_outbox.E201",
                )
            )
        else:
            errors += self.check_header_token(
                "token",
                self._token,
                "connector_outbox.E201",
                missing=gettext("Discord needs a bot token in OPTIONS['token']"),
                hint=gettext(
                    "Copy it from the Developer Portal (Bot page) and read it from the environment."
                ),
            )
        errors += self.check_http_url("base_url", self._base_url_option, "connector_outbox.E202")
        errors += self.check_timeout("connector_outbox.E203")
        return errors


def _delivered(ref: str | None, response: httpx.Response) -> Delivered:
    """Delivered, holding the channel until its bucket resets when this request emptied it:
    "X-RateLimit-Remaining ... Reset-After" (topics/rate-limits.mdx), so that the next post of
    the channel waits instead of collecting a 429 (an invalid request, towards the ban)."""
    if response.headers.get("X-RateLimit-Remaining") != "0":
        return Delivered(ref)
    try:
        after = float(response.headers.get("X-RateLimit-Reset-After", ""))
    except ValueError:
        return Delivered(ref)
    if not math.isfinite(after) or after <= 0:
        return Delivered(ref)
    bucket = response.headers.get("X-RateLimit-Bucket", "")[:64]
    name = f"discord bucket {bucket}" if bucket else "discord bucket"
    return Delivered(ref, Hold(after, f"{name} empty (X-RateLimit-Remaining 0, Reset-After {after:g})"))


def _seg(value: str) -> str:
    """A path segment; ids are snowflakes, but never let a stray '/' or '?' change the route."""
    return quote(str(value), safe="")


def _emoji_for_url(emoji: Any) -> str:
    """A unicode emoji as is; a custom one as ``name:id`` (also accepts ``<:name:id>``)."""
    if not isinstance(emoji, str):
        return ""
    text = emoji.strip()
    if text.startswith("<") and text.endswith(">"):  # the message-content form
        text = text[1:-1].removeprefix("a:").lstrip(":")
    return text


def _author_id(message: dict[str, Any]) -> str | None:
    author = message.get("author")
    return str(author.get("id")) if isinstance(author, dict) else None


def _has_marker(message: dict[str, Any], marker: str) -> bool:
    for embed in message.get("embeds") or []:
        footer = embed.get("footer") if isinstance(embed, dict) else None
        if isinstance(footer, dict) and footer.get("text") == marker:
            return True
    return False
