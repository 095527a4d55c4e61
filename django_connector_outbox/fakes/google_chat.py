"""A fake Google Chat on 127.0.0.1: Google's OAuth token endpoint for a service account and the
Chat API's messages (v1), faithful for what the Google Chat connector uses.

- ``POST /token`` (developers.google.com/identity/protocols/oauth2/service-account, "Making
  the access token request"): ``grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer`` and an
  ``assertion``, a JWT signed RS256 with the service account's private key. Its signature is
  checked with the account's public key (the header's ``kid`` names it), and its claims: ``iss``
  the account's email, ``aud`` this endpoint, ``scope`` holding ``chat.bot``, ``iat``/``exp`` at
  most an hour apart and not expired. Answers ``{"access_token", "expires_in", "token_type"}``
  or ``{"error": "invalid_grant", "error_description"}``.
- ``POST /v1/{space}/messages`` (spaces.messages.create): ``messageId`` (``client-``, lowercase
  letters, digits and hyphens, 63 characters at most, unique in the space: a second create with
  it is 409 ALREADY_EXISTS), ``thread.threadKey`` or ``thread.name`` (or the deprecated
  ``threadKey`` parameter) with ``messageReplyOption``; the Message's ``text`` and ``cardsV2``
  are checked against Chat's limits (32,000 bytes, 4,096 characters of text, 100 widgets a
  card) and the card's shape (each widget one known kind, openLink urls http(s)).
- ``GET``, ``PATCH`` (``updateMask`` required: text, cardsV2, accessoryWidgets or ``*``) and
  ``DELETE /v1/{space}/messages/{message}``, where ``{message}`` is the system-assigned id or
  the ``client-`` id. Only the app's own messages can be edited or deleted.

``Authorization: Bearer <token>`` with a token it issued and that has not expired, else 401
UNAUTHENTICATED. Errors are ``{"error": {"code", "message", "status"}}`` (google.rpc.Status).
Rate limits, when given: `space_limit` (writes per space, "60 per minute") and
`project_limit` (message writes of the app, "3000 per minute"), each a fixed window; a write
past one answers 429 RESOURCE_EXHAUSTED with an ErrorInfo naming the quota.

Scripted actions per route ("token", "create_message", "get_message", "update_message",
"delete_message"): "error" (`status`, `code`, `message`), "ratelimit" (429 of the space's quota,
or the project's with ``project=True``), "html", "drop" (done, no reply), "drop_before",
"reset", "delay". ``python -m django_connector_outbox.fakes.google_chat [--port N] [--space
spaces/X]`` serves one for other processes (``GET /_fake/state``, ``POST /_fake/script``) and
prints the settings to paste, the fake service account's key included. In a project's tests,
the ``fake_google_chat`` fixture of the package's pytest plugin is one.

Besides the standard library it imports `cryptography` (a dependency of this package) for the
service account's RSA key.
"""

from __future__ import annotations

import argparse
import base64
import functools
import itertools
import json
import math
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, Self
from urllib.parse import parse_qsl, urlsplit

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from django_connector_outbox.fakes.base import (
    JSON,
    Answer,
    CommonActions,
    FakeHandler,
    FakeServer,
    Limit,
    Window,
    chat_limits,
    command_line,
    match_route,
    parse_json,
)

SPACE = "spaces/AAAAfakeSpc"
CLIENT_EMAIL = "outbox-chat-app@fake-project.iam.gserviceaccount.com"
JWT_GRANT = "urn:ietf:params:oauth:grant-type:jwt-bearer"
SCOPE = "https://www.googleapis.com/auth/chat.bot"
#: The audience of every assertion: "https://oauth2.googleapis.com/token" ("The audience must
#: be the auth token endpoint's URI", google-auth; the service-account guide's ``aud``).
GOOGLE_TOKEN_URI = "https://oauth2.googleapis.com/token"
APP_USER = "users/fake-chat-app"
#: spaces.messages.create, messageId: "Begins with client-", "up to 63 characters and only
#: lowercase letters, numbers, and hyphens".
CLIENT_ID = re.compile(r"^client-[a-z0-9-]+$")
CLIENT_ID_MAX = 63
MESSAGE_BYTES = 32_000  # "The maximum message size, including text and cards, is 32,000 bytes"
TEXT_CHARS = 4_096
WIDGETS_PER_CARD = 100  # Card v2: "You can add up to 100 widgets per card"
UPDATABLE = frozenset({"text", "attachment", "cards", "cardsV2", "accessoryWidgets", "quotedMessageMetadata"})
REPLY_OPTIONS = frozenset(
    {"MESSAGE_REPLY_OPTION_UNSPECIFIED", "REPLY_MESSAGE_FALLBACK_TO_NEW_THREAD", "REPLY_MESSAGE_OR_FAIL"}
)
WIDGETS = frozenset(
    {
        "textParagraph", "image", "decoratedText", "buttonList", "textInput", "selectionInput",
        "dateTimePicker", "divider", "grid", "columns", "chipList",
    }
)  # fmt: skip
WRITES = frozenset({"create_message", "update_message", "delete_message"})


@functools.cache
def shared_key() -> rsa.RSAPrivateKey:
    """One RSA key per process: making a 2,048-bit key takes a while, and every fake may share it."""
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def service_account_key(
    key: rsa.RSAPrivateKey, *, client_email: str = CLIENT_EMAIL, key_id: str = "", token_uri: str = ""
) -> JSON:
    """A service account's JSON key, as the Cloud console downloads it."""
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    return {
        "type": "service_account",
        "project_id": "fake-project",
        "private_key_id": key_id or secrets.token_hex(20),
        "private_key": pem,
        "client_email": client_email,
        "client_id": "100000000000000000001",
        "auth_uri": "https://accounts.google.com/o/oauth2/auth",
        "token_uri": token_uri or GOOGLE_TOKEN_URI,
    }


@dataclass
class Call:
    """One request the fake received (no token or assertion is kept)."""

    route: str
    method: str
    path: str
    query: JSON
    body: Any
    authorized: bool


@dataclass
class Action(CommonActions):
    """How to answer one scripted call: "pass", "error" (`status`, `code`, `message`),
    "ratelimit" (429; the project's quota with `project`, else the space's; `retry_after`
    seconds in a Retry-After header if set), "html", "drop", "drop_before", "reset", "delay"."""

    kind: str
    status: int = 400
    code: str = "INVALID_ARGUMENT"
    message: str = ""
    project: bool = False
    retry_after: float | None = None
    seconds: float = 0.0


def passthrough() -> Action:
    return Action("pass")


def error(status: int, code: str, message: str = "") -> Action:
    return Action("error", status=status, code=code, message=message)


def ratelimit(*, project: bool = False, retry_after: float | None = None) -> Action:
    return Action("ratelimit", status=429, project=project, retry_after=retry_after)


def server_error(status: int = 503) -> Action:
    return Action("error", status=status, code="UNAVAILABLE" if status == 503 else "INTERNAL")


drop = Action.drop
reset = Action.reset
delay = Action.delay
html = Action.html


class ChatError(Exception):
    def __init__(self, status: int, code: str, message: str, details: list[JSON] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.details = status, code, message, details

    def body(self) -> JSON:
        error: JSON = {"code": self.status, "message": self.message, "status": self.code}
        if self.details:
            error["details"] = self.details
        return {"error": error}


def quota_error(*, project: bool) -> ChatError:
    """The 429 of a quota, as Google's APIs word it (an ErrorInfo with the quota's name)."""
    limit = "MessageWritesPerMinutePerProject" if project else "WriteRequestsPerMinutePerSpace"
    words = (
        "Message write requests per minute per project" if project else "Write requests per minute per space"
    )
    return ChatError(
        429,
        "RESOURCE_EXHAUSTED",
        f"Quota exceeded for quota metric 'Write requests' and limit '{words}' of service "
        "'chat.googleapis.com' for consumer 'project_number:000000000000'.",
        [
            {
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": "RATE_LIMIT_EXCEEDED",
                "domain": "googleapis.com",
                "metadata": {"quota_limit": limit, "service": "chat.googleapis.com"},
            }
        ],
    )


@dataclass
class Message:
    name: str
    space: str
    thread: str  # the thread's name
    text: str = ""
    cards_v2: list[JSON] = field(default_factory=list)
    accessory_widgets: list[JSON] = field(default_factory=list)
    client_id: str = ""
    thread_key: str = ""
    sender: str = APP_USER
    created: float = 0.0
    updated: float | None = None

    def as_chat(self) -> JSON:
        data: JSON = {
            "name": self.name,
            "sender": {"name": self.sender, "type": "BOT" if self.sender == APP_USER else "HUMAN"},
            "createTime": _rfc3339(self.created),
            "text": self.text,
            "thread": {"name": self.thread, **({"threadKey": self.thread_key} if self.thread_key else {})},
            "space": {"name": self.space},
            "argumentText": self.text,
        }
        if self.cards_v2:
            data["cardsV2"] = self.cards_v2
        if self.accessory_widgets:
            data["accessoryWidgets"] = self.accessory_widgets
        if self.client_id:
            data["clientAssignedMessageId"] = self.client_id
        if self.updated is not None:
            data["lastUpdateTime"] = _rfc3339(self.updated)
        return data


@dataclass
class Space:
    name: str
    member: bool = True  # the app was added to it
    messages: dict[str, Message] = field(default_factory=dict)  # system id -> message
    client_ids: dict[str, str] = field(default_factory=dict)  # client id -> system id (kept after a delete)
    threads: dict[str, str] = field(default_factory=dict)  # thread key -> thread name


class FakeGoogleChat(FakeServer[Call, Action]):
    """The fake server. Thread-safe: the HTTP handlers and the test share it under one lock."""

    thread_name = "fake-google-chat"
    action_class = Action
    platform = "Google Chat"
    source_name = "google_chat"
    backend = "django_connector_outbox.connectors.google_chat.GoogleChatConnector"

    def __init__(
        self,
        *,
        spaces: tuple[str, ...] = (SPACE,),
        key: rsa.RSAPrivateKey | None = None,
        token_lifetime: float = 3599.0,
        space_limit: Limit | None = None,
        project_limit: Limit | None = None,
        clock: Callable[[], float] = time.time,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        super().__init__(clock=clock, host=host, port=port)
        self.key = key or shared_key()
        self.key_id = secrets.token_hex(20)
        self.client_email = CLIENT_EMAIL
        self.token_lifetime = token_lifetime
        self.tokens: dict[str, float] = {}  # access token -> when it expires
        self.token_requests = 0
        self.space_limit, self.project_limit = space_limit, project_limit
        self._space_windows: dict[str, Window] = {}
        self._project_window = Window(project_limit) if project_limit else None
        self._ids = itertools.count(1)
        self.spaces: dict[str, Space] = {}
        for space in spaces:
            self.add_space(space)

    # -- the settings of a source it delivers, and python -m

    @property
    def token_uri(self) -> str:
        """What to give the connector as `token_uri` (the key's own is Google's)."""
        return f"{self.origin}/token"

    @property
    def service_account_info(self) -> JSON:
        """The service account's key (OPTIONS['service_account_info']), as downloaded from Google."""
        return service_account_key(self.key, client_email=self.client_email, key_id=self.key_id)

    def connector_options(self) -> JSON:
        return {
            "service_account_info": self.service_account_info,
            "base_url": self.origin,
            "token_uri": self.token_uri,
        }

    def guide(self, source: str) -> str:
        with self._lock:
            spaces = ", ".join(self.spaces) or "none"
        return f"""\
Queue posts with a container_id of its spaces: {spaces} (more: POST
{self.origin}/_fake/spaces {{"name": "spaces/BBBB"}}); workspace_id is your Workspace customer
id, which the fake does not check. A person's
message, to reply to: POST {self.origin}/_fake/messages {{"space": "...", "text": "..."}}."""

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--space",
            action="append",
            default=[],
            help=f"a space the app is in (repeatable; default {SPACE})",
        )
        parser.add_argument(
            "--limit",
            action="append",
            default=[],
            help="a rate limit, NAME=COUNT/SECONDS (repeatable; NAME: space or project)",
        )

    @classmethod
    def from_options(cls, options: argparse.Namespace) -> Self:
        limits = chat_limits(options)
        return cls(
            spaces=tuple(options.space) or (SPACE,),
            space_limit=limits.get("space"),
            project_limit=limits.get("project"),
            host=options.host,
            port=options.port,
        )

    # -- set-up and inspection, for tests

    def add_space(self, name: str, *, member: bool = True) -> None:
        """A space; `member=False` is one the app was not added to (403 PERMISSION_DENIED)."""
        with self._lock:
            self.spaces[name] = Space(name, member=member)

    def add_message(self, space: str, text: str, *, sender: str = "users/100000000000000000002") -> str:
        """A person's message (in a thread of its own); returns its name."""
        with self._lock:
            return self._new_message(self.spaces[space], {"text": text}, None, "", sender=sender).name

    def messages(self, space: str) -> list[Message]:
        """The messages of a space, oldest first (deleted ones are gone)."""
        with self._lock:
            return sorted(self.spaces[space].messages.values(), key=lambda m: m.created)

    def message(self, name: str) -> Message:
        space, _, system_id = name.rpartition("/messages/")
        with self._lock:
            return self.spaces[space].messages[system_id]

    def expire_tokens(self) -> None:
        """Every token issued so far expires now (the next request with one answers 401)."""
        with self._lock:
            self.tokens = dict.fromkeys(self.tokens, -math.inf)

    def state(self) -> JSON:
        with self._lock:
            return {
                "calls": [asdict(c) for c in self.calls],
                "spaces": {name: [m.as_chat() for m in self.messages(name)] for name in self.spaces},
                "token_requests": self.token_requests,
                **self.records(),
            }

    # -- the token endpoint

    def issue_token(self, form: dict[str, str]) -> Answer:
        """A token for a valid JWT assertion, or OAuth's error JSON."""
        with self._lock:
            self.token_requests += 1
            if form.get("grant_type") != JWT_GRANT:
                return 400, {
                    "error": "unsupported_grant_type",
                    "error_description": f"Invalid grant_type: {form.get('grant_type', '')}",
                }
            problem = self._assertion_problem(form.get("assertion", ""))
            if problem:
                return 400, {"error": "invalid_grant", "error_description": problem}
            token = f"ya29.fake-{secrets.token_urlsafe(24)}"
            self.tokens[token] = self.clock() + self.token_lifetime
            return 200, {
                "access_token": token,
                "expires_in": int(self.token_lifetime),
                "token_type": "Bearer",
            }

    def _assertion_problem(self, assertion: str) -> str:
        parts = assertion.split(".")
        if len(parts) != 3:
            return "Invalid JWT: Token must be a short-lived token and in a reasonable timeframe."
        try:
            header, claims = (json.loads(_unb64(p)) for p in parts[:2])
            signature = _unb64(parts[2])
        except ValueError:
            return "Invalid JWT: the header or claims are not base64url JSON."
        if header.get("alg") != "RS256":
            return "Invalid JWT: alg must be RS256."
        if header.get("kid") not in (None, self.key_id):
            return "Invalid JWT Signature."
        try:
            self.key.public_key().verify(
                signature, f"{parts[0]}.{parts[1]}".encode(), padding.PKCS1v15(), hashes.SHA256()
            )
        except InvalidSignature:
            return "Invalid JWT Signature."
        if claims.get("iss") != self.client_email:
            return "Invalid JWT: iss is not the service account."
        if claims.get("aud") not in (GOOGLE_TOKEN_URI, self.token_uri):
            return f"Invalid JWT: aud must be {GOOGLE_TOKEN_URI}."
        if SCOPE not in str(claims.get("scope", "")).split():
            return f"Invalid JWT: the scope does not hold {SCOPE}."
        now, iat, exp = self.clock(), claims.get("iat"), claims.get("exp")
        if (
            not isinstance(iat, int)
            or not isinstance(exp, int)
            or exp - iat > 3600
            or exp <= now
            or iat > now + 300
        ):
            return (
                "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe."
            )
        return ""

    def authorized(self, header: str) -> bool:
        token = header.removeprefix("Bearer ") if header.startswith("Bearer ") else ""
        with self._lock:
            return self.tokens.get(token, -math.inf) > self.clock()

    # -- the API

    def handle(self, route: str, params: dict[str, str], query: JSON, body: Any) -> Answer:
        """Answer one authorized API call as the Chat API would."""
        with self._lock:
            try:
                space = self._space(params["space"])
                if route in WRITES:
                    self._limit(space.name)
                status, answer = _ROUTES[route](self, space, params, query, body)
            except ChatError as err:
                return err.status, err.body()
            if route in WRITES:
                self.accept(route, space.name)
            return status, answer

    def _limit(self, space: str) -> None:
        now = self.clock()
        window = None
        if self.space_limit is not None:
            window = self._space_windows.setdefault(space, Window(self.space_limit))
            if window.wait(now) > 0:
                raise quota_error(project=False)
        if self._project_window is not None:
            if self._project_window.wait(now) > 0:
                raise quota_error(project=True)
            self._project_window.take(now)
        if window is not None:
            window.take(now)

    def _space(self, name: str) -> Space:
        space = self.spaces.get(name)
        if space is None:
            raise ChatError(404, "NOT_FOUND", "Requested entity was not found.")
        if not space.member:
            raise ChatError(403, "PERMISSION_DENIED", "This Chat app is not a member of this space.")
        return space

    def _message(self, space: Space, message_id: str) -> Message:
        system_id = space.client_ids.get(message_id, message_id)
        message = space.messages.get(system_id)
        if message is None:
            raise ChatError(404, "NOT_FOUND", "Message not found.")
        return message

    def _new_message(
        self, space: Space, body: JSON, thread: JSON | None, reply_option: str, *, sender: str = APP_USER
    ) -> Message:
        number = next(self._ids)
        thread_name, key = "", ""
        if thread and reply_option in ("REPLY_MESSAGE_FALLBACK_TO_NEW_THREAD", "REPLY_MESSAGE_OR_FAIL"):
            key = str(thread.get("threadKey") or "")
            if thread.get("name"):
                thread_name = str(thread["name"])
                if thread_name not in space.threads.values() and not any(
                    m.thread == thread_name for m in space.messages.values()
                ):
                    if reply_option == "REPLY_MESSAGE_OR_FAIL":
                        raise ChatError(404, "NOT_FOUND", "Thread not found.")
                    thread_name = ""
            elif key in space.threads:
                thread_name = space.threads[key]
            elif reply_option == "REPLY_MESSAGE_OR_FAIL":
                raise ChatError(404, "NOT_FOUND", "Thread not found.")
        # "Starts a new thread. Using this option ignores any thread ID or threadKey" (UNSPECIFIED).
        thread_id = f"t{number:07d}"
        if not thread_name:
            thread_name = f"{space.name}/threads/{thread_id}"
            if key:
                space.threads[key] = thread_name
        system_id = f"{thread_name.rpartition('/')[2]}.m{number:07d}"
        message = Message(
            name=f"{space.name}/messages/{system_id}",
            space=space.name,
            thread=thread_name,
            text=str(body.get("text") or ""),
            cards_v2=list(body.get("cardsV2") or []),
            accessory_widgets=list(body.get("accessoryWidgets") or []),
            thread_key=key,
            sender=sender,
            created=self.clock(),
        )
        space.messages[system_id] = message
        return message

    def _create_message(self, space: Space, params: dict[str, str], query: JSON, body: Any) -> Answer:
        if not isinstance(body, dict):
            raise ChatError(400, "INVALID_ARGUMENT", "Invalid JSON payload received.")
        client_id = str(query.get("messageId", ""))
        if client_id and (not CLIENT_ID.match(client_id) or len(client_id) > CLIENT_ID_MAX):
            raise ChatError(
                400,
                "INVALID_ARGUMENT",
                "Invalid message ID. Message IDs must begin with client-, contain only lowercase letters, "
                "numbers, and hyphens, and be at most 63 characters.",
            )
        if client_id in space.client_ids:
            raise ChatError(
                409, "ALREADY_EXISTS", f"Message with client assigned id {client_id} already exists."
            )
        reply_option = str(query.get("messageReplyOption", "MESSAGE_REPLY_OPTION_UNSPECIFIED"))
        if reply_option not in REPLY_OPTIONS:
            raise ChatError(
                400, "INVALID_ARGUMENT", f"Invalid value at 'message_reply_option' ({reply_option})."
            )
        _validate_content(body)
        thread = body.get("thread")
        if "threadKey" in query:  # the deprecated parameter, which thread.threadKey replaces
            thread = {"threadKey": str(query["threadKey"])}
        message = self._new_message(space, body, thread if isinstance(thread, dict) else None, reply_option)
        if client_id:
            message.client_id = client_id
            space.client_ids[client_id] = message.name.rpartition("/")[2]
        return 200, message.as_chat()

    def _get_message(self, space: Space, params: dict[str, str], query: JSON, body: Any) -> Answer:
        return 200, self._message(space, params["message"]).as_chat()

    def _update_message(self, space: Space, params: dict[str, str], query: JSON, body: Any) -> Answer:
        message = self._message(space, params["message"])
        mask = [f.strip() for f in str(query.get("updateMask", "")).split(",") if f.strip()]
        if not mask:
            raise ChatError(400, "INVALID_ARGUMENT", "updateMask is required.")
        if mask != ["*"] and not set(mask) <= UPDATABLE:
            raise ChatError(400, "INVALID_ARGUMENT", f"Invalid update mask: {','.join(mask)}.")
        if message.sender != APP_USER:
            raise ChatError(403, "PERMISSION_DENIED", "A Chat app can only update its own messages.")
        if not isinstance(body, dict):
            raise ChatError(400, "INVALID_ARGUMENT", "Invalid JSON payload received.")
        fields = UPDATABLE if mask == ["*"] else set(mask)
        updated: JSON = {
            "text": body.get("text", "") if "text" in fields else message.text,
            "cardsV2": body.get("cardsV2", []) if "cardsV2" in fields else message.cards_v2,
            "accessoryWidgets": (
                body.get("accessoryWidgets", [])
                if "accessoryWidgets" in fields
                else message.accessory_widgets
            ),
        }
        _validate_content(updated)
        message.text = str(updated["text"] or "")
        message.cards_v2 = list(updated["cardsV2"] or [])
        message.accessory_widgets = list(updated["accessoryWidgets"] or [])
        message.updated = self.clock()
        return 200, message.as_chat()

    def _delete_message(self, space: Space, params: dict[str, str], query: JSON, body: Any) -> Answer:
        message = self._message(space, params["message"])
        if message.sender != APP_USER:
            raise ChatError(403, "PERMISSION_DENIED", "A Chat app can only delete its own messages.")
        del space.messages[message.name.rpartition("/")[2]]
        return 200, {}


def content_errors(body: JSON) -> list[str]:
    """What the Chat API would answer to a Message's content (nothing if it takes it), for
    checks without an HTTP round trip, like the other fakes' schema checks."""
    try:
        _validate_content(body)
    except ChatError as exc:
        return [str(exc)]
    return []


def _validate_content(body: JSON) -> None:
    """What the Chat API refuses in a Message's content: nothing to show, over its limits, a
    card of the wrong shape."""
    text, cards = body.get("text") or "", body.get("cardsV2") or []
    if not isinstance(text, str) or not isinstance(cards, list):
        raise ChatError(
            400, "INVALID_ARGUMENT", "Invalid JSON payload: text must be a string, cardsV2 a list."
        )
    if not text and not cards and not body.get("accessoryWidgets"):
        raise ChatError(400, "INVALID_ARGUMENT", "Message cannot be empty. Set the text or cardsV2.")
    if len(text) > TEXT_CHARS:
        raise ChatError(
            400, "INVALID_ARGUMENT", f"Message text is too long: {len(text)} characters (max {TEXT_CHARS})."
        )
    size = len(json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode())
    if size > MESSAGE_BYTES:
        raise ChatError(400, "INVALID_ARGUMENT", f"Message is too large: {size} bytes (max {MESSAGE_BYTES}).")
    for n, item in enumerate(cards):
        _validate_card(item, f"cards_v2[{n}]")


def _validate_card(item: Any, where: str) -> None:
    def refuse(what: str) -> ChatError:
        return ChatError(400, "INVALID_ARGUMENT", f"Invalid JSON payload: {where}{what}.")

    if not isinstance(item, dict) or not isinstance(item.get("card"), dict):
        raise refuse(": a CardWithId needs a card")
    card = item["card"]
    header = card.get("header")
    if header is not None and (not isinstance(header, dict) or not isinstance(header.get("title"), str)):
        raise refuse(".card.header: title is required")
    sections = card.get("sections") or []
    if not isinstance(sections, list) or (not sections and header is None):
        raise refuse(".card: sections are required")
    count = 0
    for s, section in enumerate(sections):
        widgets = section.get("widgets") if isinstance(section, dict) else None
        if not isinstance(widgets, list) or not widgets:
            raise refuse(f".card.sections[{s}]: widgets are required")
        for w, widget in enumerate(widgets):
            count += 1
            at = f".card.sections[{s}].widgets[{w}]"
            kinds = [k for k in widget if k in WIDGETS] if isinstance(widget, dict) else []
            if len(kinds) != 1:
                raise refuse(f"{at}: exactly one widget kind is required")
            _validate_widget(kinds[0], widget[kinds[0]], refuse, at)
    if count > WIDGETS_PER_CARD:
        raise refuse(f".card: {count} widgets, over {WIDGETS_PER_CARD}")


def _validate_widget(kind: str, widget: Any, refuse: Callable[[str], ChatError], at: str) -> None:
    if not isinstance(widget, dict):
        raise refuse(f"{at}.{kind}: must be an object")
    if kind == "textParagraph" and not isinstance(widget.get("text"), str):
        raise refuse(f"{at}.textParagraph: text is required")
    if kind == "decoratedText" and not isinstance(widget.get("text"), str):
        raise refuse(f"{at}.decoratedText: text is required")
    if kind == "image" and not _http_url(widget.get("imageUrl")):
        raise refuse(f"{at}.image: imageUrl must be an http(s) URL")
    if kind == "buttonList":
        buttons = widget.get("buttons")
        if not isinstance(buttons, list) or not buttons:
            raise refuse(f"{at}.buttonList: buttons are required")
        for b, button in enumerate(buttons):
            link = button.get("onClick", {}).get("openLink", {}) if isinstance(button, dict) else {}
            if not isinstance(button.get("text"), str) or not _http_url(link.get("url")):
                raise refuse(f"{at}.buttonList.buttons[{b}]: text and onClick.openLink.url are required")


def _http_url(value: Any) -> bool:
    return isinstance(value, str) and value.startswith(("https://", "http://")) and len(value) > 8


def _unb64(part: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
    except (ValueError, TypeError) as exc:
        raise ValueError("not base64url") from exc


def _rfc3339(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z")


# (HTTP method, path pattern over raw, still percent-encoded segments) -> route name.
_SPACE = r"/v1/(?P<space>spaces/[^/]+)"
_PATTERNS = [
    ("POST", re.compile(rf"^{_SPACE}/messages$"), "create_message"),
    ("GET", re.compile(rf"^{_SPACE}/messages/(?P<message>[^/]+)$"), "get_message"),
    ("PATCH", re.compile(rf"^{_SPACE}/messages/(?P<message>[^/]+)$"), "update_message"),
    ("DELETE", re.compile(rf"^{_SPACE}/messages/(?P<message>[^/]+)$"), "delete_message"),
]
_ROUTES: dict[str, Callable[[FakeGoogleChat, Space, dict[str, str], JSON, Any], Answer]] = {
    "create_message": FakeGoogleChat._create_message,
    "get_message": FakeGoogleChat._get_message,
    "update_message": FakeGoogleChat._update_message,
    "delete_message": FakeGoogleChat._delete_message,
}
FakeGoogleChat.routes = frozenset({*_ROUTES, "token"})


class _Handler(FakeHandler):
    fake: FakeGoogleChat
    protocol_version = "HTTP/1.1"  # keep-alive, as Google's front ends
    normal_kind = "pass"
    html_title = "Service Unavailable"

    def do_GET(self) -> None:
        if not self._control(urlsplit(self.path).path):
            self._handle_api("GET")

    def do_POST(self) -> None:
        path = urlsplit(self.path).path
        if self._control(path):
            return
        if path == "/token":
            raw = self._read_body()
            form = dict(parse_qsl(raw.decode("latin-1")))
            self.fake.record(Call("token", "POST", path, {}, {"grant_type": form.get("grant_type")}, True))
            self._answer(self.fake._next_action("token"), lambda: self.fake.issue_token(form))
        elif path == "/_fake/spaces":
            spec = self._read_json()
            self.fake.add_space(str(spec["name"]), member=bool(spec.get("member", True)))
            self._reply(200, {"ok": True})
        elif path == "/_fake/messages":
            spec = self._read_json()
            self._reply(200, {"name": self.fake.add_message(str(spec["space"]), str(spec.get("text", "")))})
        else:
            self._handle_api("POST")

    def do_PATCH(self) -> None:
        self._handle_api("PATCH")

    def do_DELETE(self) -> None:
        self._handle_api("DELETE")

    def _handle_api(self, method: str) -> None:
        url = urlsplit(self.path)
        raw = self._read_body()
        found = match_route(_PATTERNS, method, url.path)
        if found is None:
            self._reply(404, ChatError(404, "NOT_FOUND", "Requested entity was not found.").body())
            return
        route, params = found
        query: JSON = dict(parse_qsl(url.query))
        body = parse_json(raw, empty={})
        authorized = self.fake.authorized(self.headers.get("Authorization", ""))
        self.fake.record(Call(route, method, url.path, query, None if body is ... else body, authorized))
        if not authorized:
            message = (
                "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie "
                "or other valid authentication credential."
            )
            self._reply(401, ChatError(401, "UNAUTHENTICATED", message).body())
            return
        if body is ...:
            self._reply(400, ChatError(400, "INVALID_ARGUMENT", "Invalid JSON payload received.").body())
            return
        self._answer(self.fake._next_action(route), lambda: self.fake.handle(route, params, query, body))

    def _answer_own(self, action: Action, work: Callable[[], Answer]) -> None:
        if action.kind == "error":
            message = action.message or f"The service is currently unavailable ({action.code})."
            self._reply(action.status, ChatError(action.status, action.code, message).body())
        elif action.kind == "ratelimit":
            headers = {"Retry-After": f"{action.retry_after:g}"} if action.retry_after is not None else {}
            self._reply(429, quota_error(project=action.project).body(), headers=headers)
        else:
            super()._answer_own(action, work)


FakeGoogleChat.handler_class = _Handler
running = FakeGoogleChat.running


def main(argv: list[str] | None = None) -> None:
    command_line(FakeGoogleChat, argv)


if __name__ == "__main__":
    main()
