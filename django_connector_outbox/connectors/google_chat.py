"""Google Chat, through the Chat API (v1) as a Chat app (its service account), over the shared
async core of connectors/http.py (one AsyncClient per loop, `arequest`'s transport failures
and scrubbing): a coroutine connector (`asend`, `afind_sent`, `aclose`).

Place: ``workspace_id`` is the Google Workspace customer id (``C01abcdef``) or "" (the API does
not take it, so `workspace_required` is off: CONTRACT's "the Google Workspace customer or \"\""),
``container_id`` the space's resource name (``spaces/AAAA``), ``thread_id`` a thread key
("" for none), ``message_ref`` the message's resource name (``spaces/AAAA/messages/BBBB``).

Calls (developers.google.com/workspace/chat/api/reference/rest/v1/spaces.messages):

- message, and a status's first send: ``POST /v1/{space}/messages?messageId=client-…`` with
  the body (a Chat ``Message``: ``text``, ``cardsV2`` …); in a thread ``thread.threadKey`` and
  ``messageReplyOption=REPLY_MESSAGE_FALLBACK_TO_NEW_THREAD`` (the ``threadKey`` query
  parameter is deprecated: "Use thread.thread_key instead").
- a status's edit: ``PATCH /v1/{message_ref}?updateMask=text,cardsV2`` (both fields, so that a
  part the new body lacks is cleared, not left over from the old one).
- delete (a retract): ``DELETE /v1/{message_ref}``; a 404 counts as done.

Exactly once: every create carries a client-assigned message id derived from the source and
post id (`message_id_for`), "unique within a space". A create repeated after a lost reply or
a 5xx answers 409 ALREADY_EXISTS instead of posting twice, and a lost reply is looked up
exactly, ``GET /v1/{space}/messages/client-…``: found (its name) or 404 (not sent).

Replies (`thread_of`): a reply goes into its parent's thread key when the parent has one;
otherwise the parent started a thread of its own, whose name (``spaces/AAAA/threads/CCCC``) a
``GET`` of the parent message tells, and the reply is created with ``thread.name``.

The token: the app's service account buys it with a signed JWT, in a thread, once per expiry
(google_chat_auth.py).
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import httpx
from django.core import checks
from django.utils.translation import gettext

from django_connector_outbox.connectors import google_chat_render
from django_connector_outbox.connectors.base import (
    CheckLater,
    Delivered,
    MaybeSent,
    Outcome,
    RateLimited,
    Refused,
    RetryLater,
)
from django_connector_outbox.connectors.google_chat_auth import (
    AppToken,
    ServiceAccount,
    TokenError,
    key_problem,
)
from django_connector_outbox.connectors.http import (
    DEFAULT_TIMEOUT,
    HttpConnector,
    LostReply,
    NotSent,
    TransportError,
    json_or_none,
    parse_retry_after,
)
from django_connector_outbox.message import Message
from django_connector_outbox.posts import ClaimedPost, Kind, Parent, Scope

DEFAULT_BASE_URL = "https://chat.googleapis.com"
#: "Begins with client- ... Contains up to 63 characters and only lowercase letters, numbers,
#: and hyphens" (spaces.messages.create, messageId).
MESSAGE_ID_PREFIX = "client-"
#: The fields of a status's edit (the updateMask); "text,cardsV2" sets both or clears them.
EDIT_FIELDS = ("text", "cardsV2")
#: The place comes from the post: a body that sets it is refused.
PLACE_FIELDS = frozenset({"name", "thread", "space"})
#: "If you exceed a quota, you'll receive a 429 ... use an exponential backoff algorithm"
#: (workspace/chat/limits): no Retry-After is promised, so a 429 without one waits this long.
DEFAULT_WAIT = 5.0
REPLY_OPTION = "REPLY_MESSAGE_FALLBACK_TO_NEW_THREAD"


def message_id_for(source: str, post_id: str) -> str:
    """``client-`` and 32 base32 letters and digits of a 20-byte digest of source and post id:
    deterministic, lowercase, 39 characters (Google allows 63), and distinct for "p1" and "P1"."""
    digest = hashlib.blake2b(f"{source}\0{post_id}".encode(), digest_size=20).digest()
    return MESSAGE_ID_PREFIX + base64.b32encode(digest).decode().lower()


class GoogleChatError:
    """A refusal of the Chat API: ``{"error": {"code", "message", "status", "details"}}`` (the
    google.rpc.Status of every Google REST API), or a body that is not one (a proxy's page)."""

    def __init__(self, response: httpx.Response) -> None:
        data = json_or_none(response)
        error = data.get("error") if isinstance(data, dict) else None
        error = error if isinstance(error, dict) else {}
        self.status = response.status_code
        self.code = str(error.get("status") or response.reason_phrase or "")[:100]
        self.message = str(error.get("message") or "")[:300]
        self.retry_after = parse_retry_after(response.headers.get("Retry-After"))
        self.quota = _quota_limit(error)

    @property
    def reason(self) -> str:
        text = f"google chat {self.status} {self.code}".strip()
        return f"{text}: {self.message}" if self.message else text


def _quota_limit(error: Mapping[str, Any]) -> str:
    """The name of the quota a 429 names: ErrorInfo's ``quota_limit`` (in ``details``), else
    the limit quoted in the message ("... and limit 'Write requests per minute per space' ...")."""
    for detail in error.get("details") or []:
        metadata = detail.get("metadata") if isinstance(detail, dict) else None
        if isinstance(metadata, dict) and isinstance(metadata.get("quota_limit"), str):
            return str(metadata["quota_limit"])
    found = re.search(r"limit '([^']+)'", str(error.get("message") or ""))
    return found[1] if found else ""


class GoogleChatConnector(HttpConnector):
    """Messages, statuses and deletes in Google Chat spaces, as a Chat app."""

    kinds = frozenset({Kind.MESSAGE, Kind.STATUS, Kind.DELETE})
    workspace_required = False  # a space's name is the whole place
    #: A lookup is one GET; at worst after a token fetch, and again with a new token after a 401.
    lookup_requests = 4
    #: Per space, "Writes per minute ... 60 (shared among all Chat apps in the space)", and per
    #: project (the app) "Message writes per minute (spaces.messages.create, patch, delete)
    #: 3000" (developers.google.com/workspace/chat/limits; reference/limits.json). A space:
    #: 5 at once, then one each 1.1 s, so that no 60 s hold more than 5 + 54.5 writes; the
    #: app: 50 at once, then one each 21 ms (at most 2,907 in any 60 s). Google counts its
    #: quotas per minute without saying how the minute is cut, so neither pace may exceed the
    #: quota in any 60 s, wherever the window falls.
    pace = {Scope.CONTAINER: (5, 5.5), Scope.SOURCE: (50, 1.05)}

    @classmethod
    def message_problem(cls, message: Message, options: Mapping[str, Any]) -> str | None:
        return google_chat_render.message_problem(message)

    def render(self, message: Message) -> dict[str, Any]:
        return google_chat_render.render(message)

    def __init__(
        self,
        source: str,
        *,
        service_account_file: Any = None,
        service_account_info: Any = None,
        base_url: Any = DEFAULT_BASE_URL,
        token_uri: Any = None,
        timeout: Any = DEFAULT_TIMEOUT,
    ) -> None:
        super().__init__(source, timeout=timeout)
        self._base_url_option = base_url
        self.base_url = str(base_url).rstrip("/")
        self.account = ServiceAccount(
            file=service_account_file,
            info=service_account_info,
            token_uri=token_uri,
            timeout=self.timeout,
            user_agent=self.user_agent,
        )
        self.token = AppToken(self._fetch_token)

    def __repr__(self) -> str:  # never show the key
        return f"<GoogleChatConnector source={self.source!r}>"

    def secrets(self) -> list[str]:
        """The service account's private key and the access token: never in a reason or a log."""
        return [s for s in (self.token.value, self.account.private_key) if s]

    # -- the token (blocking: runs in a thread) ---------------------------------------

    # -- requests ---------------------------------------------------------------------

    async def _call(
        self, method: str, path: str, *, params: dict[str, str] | None = None, json: Any = None
    ) -> httpx.Response:
        """One API request with the app's token, renewed once if Google answers 401 (a 401
        did nothing). Raises `TokenError`, `NotSent` or `LostReply` (scrubbed, unchained)."""
        token = await self.token.get()
        response = await self._send(method, path, token, params=params, json=json)
        if response.status_code == 401:
            response = await self._send(method, path, await self.token.renew(token), params=params, json=json)
        return response

    async def _send(
        self, method: str, path: str, token: str, *, params: dict[str, str] | None, json: Any
    ) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"}
        return await self.arequest(method, self.base_url + path, params=params, json=json, headers=headers)

    def _fetch_token(self) -> tuple[str, float]:
        return self.account.fetch_token(self.secrets)

    # -- sending ----------------------------------------------------------------------

    async def asend(self, post: ClaimedPost) -> Outcome:
        if post.kind not in self.kinds:
            return Refused(f"google chat cannot send a {post.kind!r} post")
        if post.kind == Kind.DELETE:
            return await self._delete(post)
        taken = sorted(PLACE_FIELDS & post.body.keys())
        if taken:
            return Refused(
                f"google chat body may not set {', '.join(taken)}: the outbox sets it from the post"
            )
        try:
            if post.kind == Kind.STATUS and post.message_ref:
                return await self._edit(post, post.message_ref)
            return await self._create(post)
        except TokenError as error:
            return RetryLater(error.reason, error.after)

    async def _create(self, post: ClaimedPost) -> Outcome:
        body = dict(post.body)
        params = {"messageId": message_id_for(self.source, post.post_id)}
        if post.thread_id:
            thread = await self._thread_of(post)
            if not isinstance(thread, dict):
                return thread
            body["thread"] = thread
            params["messageReplyOption"] = REPLY_OPTION
        try:
            response = await self._call(
                "POST", f"/v1/{_path(post.container_id)}/messages", params=params, json=body
            )
        except NotSent as exc:
            return RetryLater(str(exc))
        except LostReply as exc:
            return MaybeSent(str(exc))  # looked up by its id once the lease ends
        if response.status_code == 200:
            name = _name_of(response)
            return Delivered(name) if name else MaybeSent("google chat answered 200 without a message name")
        if response.status_code == 409:
            # ALREADY_EXISTS: an earlier try (a 5xx, a lost reply) created it. A status may have
            # changed since: it is brought up to date.
            try:
                name = await self._lookup(post)
            except CheckLater as exc:
                return MaybeSent(f"{self.scrub(GoogleChatError(response).reason)}; {exc}")
            if name is None:  # deleted since: the id stays taken, so it can never be posted again
                return Refused(f"{self.scrub(GoogleChatError(response).reason)} (and it is gone)")
            return await self._edit(post, name) if post.kind == Kind.STATUS else Delivered(name)
        # A 5xx after which the message was created makes the next try a 409: safe to retry.
        return self._map_error(response)

    async def _thread_of(self, post: ClaimedPost) -> dict[str, str] | Outcome:
        """The ``thread`` of a reply's create: its thread key, or for a reply to a message
        (`reply_thread` gave the parent's name) that message's thread name."""
        if "/messages/" not in post.thread_id:
            return {"threadKey": post.thread_id}
        try:
            response = await self._call("GET", f"/v1/{_path(post.thread_id)}")
        except TransportError as exc:
            return RetryLater(f"google chat thread of {post.thread_id}: {exc}")
        data = json_or_none(response)
        thread = data.get("thread") if isinstance(data, dict) else None
        if response.status_code == 200 and isinstance(thread, dict) and isinstance(thread.get("name"), str):
            return {"name": thread["name"]}
        if response.status_code == 200:
            return Refused(f"google chat message {post.thread_id} is in no thread to reply in")
        return self._map_error(response)

    async def _edit(self, post: ClaimedPost, name: str) -> Outcome:
        fields = {field: post.body[field] for field in EDIT_FIELDS if field in post.body}
        params = {"updateMask": ",".join(EDIT_FIELDS)}
        try:
            response = await self._call("PATCH", f"/v1/{_path(name)}", params=params, json=fields)
        except TransportError as exc:
            return RetryLater(str(exc))  # an edit sets state: sending it again is harmless
        if response.status_code == 200:
            return Delivered(name)
        return self._map_error(response)

    async def _delete(self, post: ClaimedPost) -> Outcome:
        if not post.message_ref:
            return Refused("google chat delete needs the message_ref of the message to delete")
        try:
            response = await self._call("DELETE", f"/v1/{_path(post.message_ref)}")
        except TokenError as error:
            return RetryLater(error.reason, error.after)
        except TransportError as exc:
            return RetryLater(str(exc))  # deleting twice is harmless: the second finds a 404
        if response.status_code in (200, 404):
            return Delivered(post.message_ref)  # 404: deleted already (an earlier try, a person)
        return self._map_error(response)

    def _map_error(self, response: httpx.Response) -> Outcome:
        error = GoogleChatError(response)
        reason = self.scrub(error.reason)
        if error.status == 429:
            after = error.retry_after if error.retry_after is not None else DEFAULT_WAIT
            if "project" in error.quota.lower():
                # The app's quota across every space: each space would get the same answer.
                return RateLimited(after, f"{reason} (the project's quota)", Scope.SOURCE)
            return RateLimited(after, reason)
        if error.status >= 500:
            return RetryLater(reason, error.retry_after)
        # 400 INVALID_ARGUMENT (a bad card), 401 twice (the key is not the Chat app's), 403
        # PERMISSION_DENIED (the app is not in the space), 404 NOT_FOUND (no such space or
        # message): the same request would get the same answer.
        return Refused(reason)

    # -- lookup -----------------------------------------------------------------------

    async def afind_sent(self, post: ClaimedPost) -> str | None:
        """The message's name if a create of this post reached the space, None if none did.

        Raises CheckLater when Google cannot tell now (a failed lookup, a 429, no token).
        """
        if post.kind == Kind.DELETE:
            return None  # a delete is sent again: a message deleted already answers 404
        try:
            name = await self._lookup(post)
        except TokenError as error:
            raise CheckLater(error.reason) from None
        return name

    async def _lookup(self, post: ClaimedPost) -> str | None:
        path = f"/v1/{_path(post.container_id)}/messages/{message_id_for(self.source, post.post_id)}"
        try:
            response = await self._call("GET", path)
        except TransportError as exc:
            raise CheckLater(f"google chat lookup: {exc}") from None
        if response.status_code == 404:
            return None
        name = _name_of(response) if response.status_code == 200 else None
        if name is None:
            raise CheckLater(f"google chat lookup: {self.scrub(GoogleChatError(response).reason)}")
        return name

    def reply_thread(self, parent: Parent) -> str:
        """The parent's thread key, else its message's name, whose thread `asend` reads."""
        return parent.thread_id or parent.message_ref or ""

    # -- closing ----------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close this loop's client and the token's; a later send opens new ones."""
        await self.aclose_clients()
        # Not through `blocking`: closing a client whose pool is idle only closes its sockets.
        self.account.close()

    def close(self) -> None:
        """`HttpConnector.close`, and the token's client."""
        super().close()
        self.account.close()

    # -- configuration ----------------------------------------------------------------

    def check(self) -> list[checks.CheckMessage]:
        """connector_outbox.E271 the service account, E272 base_url, E273 token_uri, E274
        timeout. An unknown option name is a TypeError when the connector is built (E005)."""
        errors = self._check_service_account()
        errors += self.check_http_url("base_url", self._base_url_option, "connector_outbox.E272")
        if self.account.token_uri is not None:
            errors += self.check_http_url("token_uri", self.account.token_uri, "connector_outbox.E273")
        errors += self.check_timeout("connector_outbox.E274")
        return errors

    def _check_service_account(self) -> list[checks.CheckMessage]:
        given = [o for o in (self.account.file, self.account.info) if o is not None]
        if len(given) != 1:
            says = (
                gettext(
                    "CONNECTOR_OUTBOX source %(source)r: Google Chat needs the Chat app's service account key "
                    "in OPTIONS['service_account_file'] or OPTIONS['service_account_info']."
                )
                if not given
                else gettext(
                    "CONNECTOR_OUTBOX source %(source)r: give OPTIONS['service_account_file'] or "
                    "OPTIONS['service_account_info'], not both."
                )
            )
            hint = gettext(
                "Make a JSON key of the service account of the Google Cloud project whose Chat API "
                "configuration is the Chat app; keep it out of the repository."
            )
            return [checks.Error(says % {"source": self.source}, hint=hint, id="connector_outbox.E271")]
        try:
            self.account.credentials()
        except (OSError, ValueError) as exc:
            return [
                checks.Error(
                    gettext(
                        "CONNECTOR_OUTBOX source %(source)r: the service account key cannot be used: %(problem)s."
                    )
                    % {"source": self.source, "problem": self.scrub(key_problem(exc))},
                    id="connector_outbox.E271",
                )
            ]
        return []


def _name_of(response: httpx.Response) -> str | None:
    data = json_or_none(response)
    name = data.get("name") if isinstance(data, dict) else None
    return name if isinstance(name, str) and name.startswith("spaces/") else None


def _path(name: str) -> str:
    """A resource name (``spaces/AAAA/messages/BBBB``) as a URL path: its slashes kept, and
    whatever else could change the route (``?``, ``#``, a ``..`` segment) escaped."""
    return "/".join(_segment(part) for part in name.split("/"))


def _segment(part: str) -> str:
    return "%2E" * len(part) if part in (".", "..") else quote(part, safe="")
