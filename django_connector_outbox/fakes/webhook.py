"""A generic webhook receiver on 127.0.0.1, as a careful receiver would be written.

- ``POST /hook`` (route "deliver"): takes a JSON body. With a `secret` it verifies the
  Standard Webhooks signature (``webhook-id``, ``webhook-timestamp`` within 5 minutes,
  ``webhook-signature: v1,<base64 HMAC-SHA256 of "id.timestamp.body">``; a ``whsec_`` secret
  is base64-decoded) and answers 401 when it does not match. With `idempotency` (the default)
  it honours ``Idempotency-Key`` (an RFC 8941 string) as the IETF draft says: a key seen with
  the same body replays the first answer, with another body is 422. It answers 200
  ``{"id": "<delivery id>"}`` (or 204 with ``reply_with_id=False``). With `hooks` (path ->
  secret), it serves several hooks, one per channel, each with its own secret (or None).
- ``GET /lookup/{post id}`` and ``GET /lookup?post_id=...`` (route "lookup"): 200
  ``{"id": ...}`` when a delivery carried that ``X-Outbox-Post-Id``, else 404.

Every request is recorded (headers and body), and the next calls of a route can be scripted:
any status with a JSON body and headers (429 + Retry-After, 503, 410, 3xx ...), a dropped
connection after the delivery was stored (a lost reply), a reply slower than the client's timeout.

In a test: ``FakeWebhook(secret=...).start()`` ... ``.stop()`` (or ``with running() as fake``).
In a project's tests, the ``fake_webhook`` fixture (the package's pytest plugin) is one. From
another process: ``python -m django_connector_outbox.fakes.webhook [--port N] [--secret S]``
prints its hook URL on the first line of stdout, then the settings to paste, and serves until
SIGTERM; ``GET /_fake/state``
returns what it received and ``POST /_fake/script`` scripts answers (``{"route", "action",
"times"}``).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hashlib
import hmac
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Self
from urllib.parse import parse_qsl, unquote, urlsplit

from django_connector_outbox.fakes.base import (
    JSON,
    Answer,
    CommonActions,
    FakeHandler,
    FakeServer,
    command_line,
)

SIGNATURE_TOLERANCE = 300  # seconds, as the Standard Webhooks libraries


@dataclass
class Call:
    """One request the fake received."""

    route: str
    method: str
    path: str
    query: JSON
    headers: dict[str, str]  # lower-case names
    body: bytes = field(repr=False, default=b"")

    @property
    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


@dataclass
class Action(CommonActions):
    """How to answer one scripted call.

    `kind`: "respond" (HTTP `status` with JSON `body` and `headers`, without storing), "drop"
    (store the delivery, then close without a reply), "drop_before" (close without storing),
    "reset" (store, then reset the connection), "delay" (store, then reply after `seconds`).
    """

    kind: str
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0


def respond(status: int, body: Any = None, **headers: str) -> Action:
    """Answer with `status`; header names use underscores (Retry_After -> Retry-After)."""
    return Action(
        "respond", status=status, body=body, headers={k.replace("_", "-"): v for k, v in headers.items()}
    )


drop = Action.drop
reset = Action.reset
delay = Action.delay


@dataclass
class Delivery:
    """A post the receiver accepted."""

    id: str
    post_id: str
    kind: str
    rev: str
    key: str | None
    body: Any
    raw: bytes = field(repr=False, default=b"")
    path: str = "/hook"  # the hook it came to


class FakeWebhook(FakeServer[Call, Action]):
    """The fake receiver. Thread-safe: the HTTP handlers and the test share it under one lock."""

    thread_name = "fake-webhook"
    action_class = Action
    routes = frozenset(("deliver", "lookup"))
    platform = "webhook receiver"
    source_name = "webhook"
    backend = "django_connector_outbox.connectors.webhook.WebhookConnector"

    def __init__(
        self,
        *,
        secret: str | None = None,
        idempotency: bool = True,
        reply_with_id: bool = True,
        clock: Callable[[], float] = time.time,
        host: str = "127.0.0.1",
        port: int = 0,
        hooks: dict[str, str | None] | None = None,
    ) -> None:
        super().__init__(clock=clock, host=host, port=port)
        self.secret = secret
        # path -> its signing secret: one hook per channel, as Teams/Mattermost/Discord serve them.
        self.hooks = hooks if hooks is not None else {"/hook": secret}
        self.idempotency = idempotency
        self.reply_with_id = reply_with_id
        self.deliveries: list[Delivery] = []
        self._keys: dict[str, tuple[bytes, int, Any]] = {}  # key -> (body, status, answer)

    @property
    def url(self) -> str:
        """What to give the connector as `url`."""
        return f"{self.origin}/hook"

    def hook_url(self, path: str) -> str:
        """The URL of the hook at `path` (one of `hooks`)."""
        return f"{self.origin}{path}"

    @property
    def lookup_url(self) -> str:
        """A `lookup_url` with the post id in the path; without the placeholder, the
        connector sends it as ?post_id=."""
        return f"{self.origin}/lookup/{{post_id}}"

    # -- the settings of a source it delivers, and python -m

    @property
    def address(self) -> str:
        return self.url

    def connector_options(self) -> JSON:
        """Its hook, its lookup (so that a lost reply is looked up) and its secret, if any."""
        options: JSON = {"url": self.url, "lookup_url": self.lookup_url}
        if self.secret is not None:
            options["secret"] = self.secret
        return options

    def guide(self, source: str) -> str:
        signed = (
            "checks each signature with that secret"
            if self.secret
            else "takes unsigned deliveries (--secret S: signed)"
        )
        return f"""\
Queue posts of the kinds message and status, to any workspace_id and container_id. The
receiver {signed}, honours Idempotency-Key,
and answers GET {self.origin}/lookup/POST_ID for the posts it received."""

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--secret", default=None, help="the signing secret it checks (default: none)")
        parser.add_argument("--no-idempotency", action="store_true", help="ignore Idempotency-Key")

    @classmethod
    def from_options(cls, options: argparse.Namespace) -> Self:
        return cls(
            secret=options.secret,
            idempotency=not options.no_idempotency,
            host=options.host,
            port=options.port,
        )

    # -- set-up and inspection, for tests

    def state(self) -> JSON:
        with self._lock:
            return {
                "calls": [
                    {
                        **{k: v for k, v in asdict(c).items() if k != "body"},
                        "body": c.body.decode("utf-8", "replace"),
                    }
                    for c in self.calls
                ],
                "deliveries": [{k: v for k, v in asdict(d).items() if k != "raw"} for d in self.deliveries],
            }

    # -- the receiver

    def verify(self, headers: dict[str, str], body: bytes, secret: str) -> bool:
        """The Standard Webhooks check of a delivery signed with `secret`."""
        msg_id, timestamp = headers.get("webhook-id"), headers.get("webhook-timestamp")
        signatures = headers.get("webhook-signature", "")
        if not msg_id or not timestamp or not timestamp.isdigit():
            return False
        if abs(self.clock() - int(timestamp)) > SIGNATURE_TOLERANCE:
            return False
        key = secret.encode()
        if secret.startswith("whsec_"):
            try:
                key = base64.b64decode(secret.removeprefix("whsec_"), validate=True)
            except binascii.Error:
                return False
        expected = base64.b64encode(
            hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
        ).decode()
        for signature in signatures.split():
            version, _, value = signature.partition(",")
            if version == "v1" and hmac.compare_digest(value, expected):
                return True
        return False

    def deliver(self, headers: dict[str, str], body: bytes, path: str = "/hook") -> tuple[int, Any]:
        with self._lock:
            secret = self.hooks[path]
            if secret is not None and not self.verify(headers, body, secret):
                return 401, {"error": "invalid_signature", "message": "webhook signature does not match"}
            try:
                data = json.loads(body)
            except ValueError:
                return 400, {"error": "invalid_json"}
            key = _parse_sf_string(headers["idempotency-key"]) if "idempotency-key" in headers else None
            if self.idempotency and key is not None and key in self._keys:
                first_body, status, answer = self._keys[key]
                if first_body != body:
                    return 422, {
                        "error": "idempotency_key_reused",
                        "message": "key reused with another payload",
                    }
                return status, answer  # "respond with the result of the previously completed operation"
            delivery = Delivery(
                id=f"d-{len(self.deliveries) + 1}",
                post_id=headers.get("x-outbox-post-id", ""),
                kind=headers.get("x-outbox-kind", ""),
                rev=headers.get("x-outbox-rev", ""),
                key=key,
                body=data,
                raw=body,
                path=path,
            )
            self.deliveries.append(delivery)
            status, answer = (200, {"id": delivery.id}) if self.reply_with_id else (204, None)
            if self.idempotency and key is not None:
                self._keys[key] = (body, status, answer)
            return status, answer

    def lookup(self, post_id: str) -> tuple[int, Any]:
        with self._lock:
            for delivery in reversed(self.deliveries):
                if delivery.post_id == post_id:
                    return 200, {"id": delivery.id}
            return 404, {"error": "not_found"}


def _parse_sf_string(value: str) -> str | None:
    value = value.strip()
    if len(value) < 2 or value[0] != '"' or value[-1] != '"':
        return None
    out, escaped = [], False
    for char in value[1:-1]:
        if escaped:
            out.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        else:
            out.append(char)
    return "".join(out)


class _Handler(FakeHandler):
    fake: FakeWebhook
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if self._control(url.path):
            return
        if url.path == "/lookup" or url.path.startswith("/lookup/"):
            query = dict(parse_qsl(url.query))
            post_id = (
                unquote(url.path.removeprefix("/lookup/"))
                if url.path != "/lookup"
                else query.get("post_id", "")
            )
            self._handle("lookup", url.path, query, b"", lambda: self.fake.lookup(post_id))
        else:
            self._no_hook()

    def do_POST(self) -> None:
        url = urlsplit(self.path)
        if self._control(url.path):
            return
        body = self._read_body()
        if url.path in self.fake.hooks:
            headers = {k.lower(): v for k, v in self.headers.items()}
            self._handle(
                "deliver",
                url.path,
                dict(parse_qsl(url.query)),
                body,
                lambda: self.fake.deliver(headers, body, url.path),
            )
        else:
            self._no_hook()

    def _no_hook(self) -> None:
        # As real receivers do (a hook's token is in its path): the error echoes the path asked for.
        self._reply(404, {"error": "not_found", "message": f"no hook at {self.path}"})

    def _handle(self, route: str, path: str, query: JSON, body: bytes, work: Callable[[], Answer]) -> None:
        self.fake.record(
            Call(route, self.command, path, query, {k.lower(): v for k, v in self.headers.items()}, body)
        )
        self._answer(self.fake._next_action(route), work)

    def _answer_own(self, action: Action, work: Callable[[], Answer]) -> None:
        if action.kind == "respond":
            self._reply(action.status, action.body, headers=action.headers)
        else:
            super()._answer_own(action, work)


FakeWebhook.handler_class = _Handler
running = FakeWebhook.running


def main(argv: list[str] | None = None) -> None:
    command_line(FakeWebhook, argv)


if __name__ == "__main__":
    main()
