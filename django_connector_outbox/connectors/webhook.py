"""A generic HTTP webhook: POST the post's body as JSON to a URL of yours.

A Message is posted as ``{"text": <its plain text>, "message": <its JSON>}`` (webhook_render.py).

Every request carries (Standard Webhooks and the IETF Idempotency-Key draft):

- ``webhook-id: <key>`` and ``Idempotency-Key: "<key>"`` (a structured-header string). The key
  is the post id for a message. For a status it is ``<post id>:<rev>``, because a status is
  sent again with a new body each time it changes, and the draft forbids reusing a key with a
  different payload (a receiver would answer 422). Re-sends of one body keep one key, so a
  receiver that remembers keys never acts twice.
- ``X-Outbox-Post-Id``, ``X-Outbox-Kind`` (``message`` or ``status``) and ``X-Outbox-Rev``
  so that a receiver can treat a status as an upsert keyed by post id, newest rev winning;
  ``X-Outbox-Message-Ref`` when the status was delivered before with an id.
- with ``secret``: ``webhook-timestamp`` and ``webhook-signature: v1,<base64 HMAC-SHA256 of
  "<webhook-id>.<timestamp>.<body>">``. A ``whsec_``-prefixed secret is base64-decoded first,
  as Standard Webhooks libraries do; any other secret is used as its UTF-8 bytes.

With ``installations: True`` (instead of ``url``), each post goes to its container's own URL,
signed with that container's own secret: `Destinations(source).set(container_id, url,
secret=...)` stores them, sealed, in the app's database (incoming webhooks of Teams Workflows,
Mattermost, Discord and Google Chat are one URL per channel). A container without one fails
its posts at once (`Refused`, the reason naming it), and no request is made. Every such URL
is a credential: reasons and httpx's request lines never show it (nor its secret).

A reply queued with `thread_of` carries its parent in its JSON: the outbox sets the body's
``thread_of`` key to ``{"post_id": <the parent's post id>, "message_ref": <the id the receiver
answered for it>, "thread_id": <the thread: the parent's own, else its message_ref>}``, and adds
an ``X-Outbox-Thread-Of`` header (the parent's post id). A parent that got no ``id`` from the
receiver has no message to reply to: its replies fail, naming it.

``lookup_url`` (optional) lets `find_sent` ask the receiver whether it has a post: a GET to
the URL with ``{post_id}`` replaced by the URL-quoted post id, or, without a placeholder, with
a ``post_id`` query parameter. 200 means found (the ref is the JSON ``id``, else the post
id), 404 means not there, anything else means ask again later.

Both forms, one plan (connectors/http.py): run_outbox awaits `asend` and `afind_sent` on the
loop's async client; `send` and `find_sent` carry out the same requests and mapping through
the blocking client. A destination read from the database is read off the loop.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import httpx
from django.core import checks
from django.utils.translation import gettext

from django_connector_outbox import __version__
from django_connector_outbox.connectors.base import (
    CannotCheck,
    CheckLater,
    Delivered,
    MaybeSent,
    Outcome,
    RateLimited,
    Refused,
    RetryLater,
)
from django_connector_outbox.connectors.http import (
    DEFAULT_TIMEOUT,
    REQUEST_LINES,
    HttpConnector,
    LostReply,
    NotSent,
    Plan,
    TransportError,
    http,
    json_or_none,
    parse_retry_after,
)
from django_connector_outbox.connectors.plans import cached_or
from django_connector_outbox.connectors.text import is_header_token, is_header_value, scrub
from django_connector_outbox.connectors.webhook_render import render_webhook
from django_connector_outbox.installations.destinations import Destinations, NoDestination, Target
from django_connector_outbox.installations.sealing import CannotOpen
from django_connector_outbox.message import Message
from django_connector_outbox.posts import ClaimedPost, Kind

# A 429 without Retry-After: hold the container this long rather than guess lower.
DEFAULT_RATE_LIMIT_WAIT = 30.0


class WebhookConnector(HttpConnector):
    """POSTs each post's body to one URL; optionally signed, optionally looked up."""

    kinds = frozenset({Kind.MESSAGE, Kind.STATUS})
    user_agent = f"django-connector-outbox-webhook/{__version__}"

    def __init__(
        self,
        source: str,
        *,
        url: Any = None,
        secret: Any = None,
        headers: Any = None,
        timeout: Any = DEFAULT_TIMEOUT,
        lookup_url: Any = None,
        installations: Any = False,
    ) -> None:
        super().__init__(source, timeout=timeout)
        self.url = url
        self.installations = installations
        # Built lazily: the connector is built for the system checks too, before any query.
        self._destinations: Destinations | None = None
        self._secret = secret
        # Surrounding whitespace is no part of a header value (RFC 9110 §5.5), and a value read
        # from a secrets file ends with a newline that httpx would refuse to send.
        self.headers = (
            {k: v.strip() if isinstance(v, str) else v for k, v in headers.items()}
            if isinstance(headers, dict)
            else {}
        )
        self._headers_option = headers
        self.lookup_url = lookup_url

    def __repr__(self) -> str:  # the URL may itself hold a token, the secret surely does
        return f"<WebhookConnector source={self.source!r}>"

    def secrets(self) -> list[str]:
        # The URLs too: a hook's URL often carries its own token (Slack's, Discord's webhooks).
        values = [self._secret, self.url, self.lookup_url, *self.headers.values()]
        return [v for v in values if isinstance(v, str)]

    @property
    def destinations(self) -> Destinations:
        """Where each container's posts go, with ``installations: True``."""
        if self._destinations is None:
            self._destinations = Destinations(self.source)
        return self._destinations

    def render(self, message: Message) -> dict[str, Any]:
        return render_webhook(message)

    # -- the two forms, one plan each (connectors/http.py)

    def send(self, post: ClaimedPost) -> Outcome:
        return self._run(self._send_plan(post))

    async def asend(self, post: ClaimedPost) -> Outcome:
        return await self._arun(self._send_plan(post))

    def find_sent(self, post: ClaimedPost) -> str | None:
        """Ask ``lookup_url``: 200 -> the ref, 404 -> None, else CheckLater.

        Raises CannotCheck when no ``lookup_url`` is configured: a plain webhook cannot
        say what it received.
        """
        return self._run(self._find_plan(post))

    async def afind_sent(self, post: ClaimedPost) -> str | None:
        return await self._arun(self._find_plan(post))

    def _send_plan(self, post: ClaimedPost) -> Plan[Outcome]:
        if post.kind not in self.kinds:
            return Refused(f"webhook cannot send a {post.kind!r} post")
        if self.installations is not True:
            return (yield from self._send(post, str(self.url), self._secret, []))
        try:
            # The destinations' cache, or the database on a miss: off the loop.
            target = yield from cached_or(
                self.destinations.cached(post.container_id), self.destinations.target, post.container_id
            )
        except (NoDestination, CannotOpen) as exc:
            # No request: the reason names the container (or the row), never a URL.
            return Refused(str(exc))
        return (yield from self._send(post, target.url, target.secret, _secrets_of(target)))

    def _send(self, post: ClaimedPost, url: str, secret: str | None, secrets: Sequence[str]) -> Plan[Outcome]:
        """POST `post` to `url`, signed with `secret`; `secrets`: the destination's, to scrub."""
        body = post.body
        if post.parent is not None:  # a reply: where it goes (see the module)
            parent = post.parent
            place = {
                "post_id": parent.post_id,
                "message_ref": parent.message_ref,
                "thread_id": post.thread_id,
            }
            body = {**body, "thread_of": place}
        payload = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
        key = _header_safe(post.post_id if post.kind == Kind.MESSAGE else f"{post.post_id}:{post.rev}")
        headers = {
            **self._extra_headers(),
            "Content-Type": "application/json",
            "Idempotency-Key": _sf_string(key),
            "webhook-id": key,
            "X-Outbox-Post-Id": _header_safe(post.post_id),
            "X-Outbox-Kind": post.kind,
            "X-Outbox-Rev": str(post.rev),
        }
        if post.message_ref:
            headers["X-Outbox-Message-Ref"] = _header_safe(post.message_ref)
        if post.parent is not None:
            headers["X-Outbox-Thread-Of"] = _header_safe(post.parent.post_id)
        if secret:
            timestamp = str(int(time.time()))
            headers["webhook-timestamp"] = timestamp
            headers["webhook-signature"] = "v1," + sign(secret, key, timestamp, payload)
        try:
            response = yield from http("POST", url, content=payload, headers=headers)
        except NotSent as exc:
            return RetryLater(scrub(str(exc), secrets))
        except LostReply as exc:
            # The receiver may have acted on it; after the lease the post is looked up
            # (lookup_url), or becomes uncertain when there is no way to look.
            return MaybeSent(scrub(str(exc), secrets))
        return self._outcome(response, secrets)

    def _outcome(self, response: httpx.Response, secrets: Sequence[str]) -> Outcome:
        status = response.status_code
        retry_after = parse_retry_after(response.headers.get("Retry-After"))
        reason = f"webhook HTTP {status}{self._detail(response, secrets)}"
        if 200 <= status < 300:
            data = json_or_none(response)
            ref = data.get("id") if isinstance(data, dict) else None
            return Delivered(str(ref) if ref not in (None, "") else None)
        if status == 429:
            return RateLimited(retry_after if retry_after is not None else DEFAULT_RATE_LIMIT_WAIT, reason)
        if status == 503 and retry_after is not None:
            return RateLimited(retry_after, reason)
        # 408 and 425 say "send it again"; 409 is the Idempotency-Key draft's "the first
        # request with this key is still being processed", where "no correction is required".
        # 5xx: every retry carries the same Idempotency-Key and webhook-id, so a receiver that
        # honours either (as both specs ask) does not act twice; see docs/connectors/webhook.md.
        if status in (408, 409, 425) or status >= 500:
            return RetryLater(reason, retry_after)
        # 3xx (redirects are never followed: a moved hook is a configuration change), 410 Gone
        # and every other 4xx: the same request would get the same answer.
        return Refused(reason)

    def _detail(self, response: httpx.Response, secrets: Sequence[str] = ()) -> str:
        """A short hint from the receiver's error body (its `error`/`message`/`code`)."""
        data = json_or_none(response)
        if not isinstance(data, dict):
            return ""
        parts = [
            str(data[k]) for k in ("code", "error", "message", "detail") if data.get(k) not in (None, "")
        ]
        # A receiver may echo what it was given: never let the secret or a header value
        # (an Authorization token, say) through into a reason.
        detail = scrub(self.scrub(" ".join(parts)), secrets)[:200]
        return f" {detail}" if detail else ""

    def _find_plan(self, post: ClaimedPost) -> Plan[str | None]:
        if not self.lookup_url:
            raise CannotCheck("webhook has no lookup_url to look posts up")
        url = str(self.lookup_url)
        params: dict[str, str] = {}
        if "{post_id}" in url:
            url = url.replace("{post_id}", quote(post.post_id, safe=""))
        else:
            params["post_id"] = post.post_id
        headers = {**self._extra_headers(), "X-Outbox-Post-Id": _header_safe(post.post_id)}
        try:
            response = yield from http("GET", url, params=params, headers=headers)
        except TransportError as exc:
            raise CheckLater(f"webhook lookup: {exc}") from exc
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise CheckLater(f"webhook lookup HTTP {response.status_code}{self._detail(response)}")
        data = json_or_none(response)
        ref = data.get("id") if isinstance(data, dict) else None
        # Found, even when the receiver gives no id: the post id then stands for the ref,
        # so that "found" can never be mistaken for "not there".
        return str(ref) if ref not in (None, "") else post.post_id

    def _extra_headers(self) -> dict[str, str]:
        return {str(k): str(v) for k, v in self.headers.items()}

    def check(self) -> list[checks.CheckMessage]:
        """connector_outbox.E211 url, E212 secret, E213 headers, E214 timeout, E215 lookup_url,
        E216 installations (with url, or neither, or with a secret of the source's own).

        An unknown option name is a TypeError when the connector is built (E005).
        """
        errors: list[checks.CheckMessage] = []
        source = {"source": self.source}
        if self.installations not in (True, False):
            errors.append(
                checks.Error(
                    gettext(
                        "CONNECTOR_OUTBOX source %(source)r: OPTIONS['installations'] must be True or False."
                    )
                    % source,
                    id="connector_outbox.E216",
                )
            )
        elif self.installations and self.url is not None:
            errors.append(
                checks.Error(
                    gettext(
                        "CONNECTOR_OUTBOX source %(source)r: OPTIONS has both 'url' and 'installations': give "
                        "'url' for one destination, or 'installations': True for a URL per container "
                        "(Destinations)."
                    )
                    % source,
                    id="connector_outbox.E216",
                )
            )
        elif self.installations and self._secret is not None:
            errors.append(
                checks.Error(
                    gettext(
                        "CONNECTOR_OUTBOX source %(source)r: with 'installations', each destination has its own "
                        "secret (Destinations(source).set(container_id, url, secret=...)): remove "
                        "OPTIONS['secret']."
                    )
                    % source,
                    id="connector_outbox.E216",
                )
            )
        elif not self.installations and self.url is None:
            errors.append(
                checks.Error(
                    gettext(
                        "CONNECTOR_OUTBOX source %(source)r: the webhook needs OPTIONS['url'] (one destination), "
                        "or OPTIONS['installations']: True (a URL per container, from Destinations)."
                    )
                    % source,
                    id="connector_outbox.E216",
                )
            )
        elif not self.installations:
            errors += self.check_http_url(
                "url",
                self.url,
                "connector_outbox.E211",
                needs=gettext("the webhook needs an http(s) URL in OPTIONS['url']"),
                secret=True,
            )
        if self._secret is not None:
            if not isinstance(self._secret, str) or not self._secret:
                errors.append(
                    checks.Error(
                        gettext(
                            "CONNECTOR_OUTBOX source %(source)r: OPTIONS['secret'] must be a non-empty string."
                        )
                        % source,
                        id="connector_outbox.E212",
                    )
                )
            elif self._secret != self._secret.strip():
                errors.append(
                    checks.Error(
                        gettext(
                            "CONNECTOR_OUTBOX source %(source)r: OPTIONS['secret'] starts or ends with whitespace "
                            "(a newline read from a file?); it would be part of the signing key, so strip it."
                        )
                        % source,
                        id="connector_outbox.E212",
                    )
                )
            elif self._secret.startswith("whsec_") and _whsec_key(self._secret) is None:
                errors.append(
                    checks.Error(
                        gettext(
                            "CONNECTOR_OUTBOX source %(source)r: OPTIONS['secret'] starts with 'whsec_' but the "
                            "rest is not base64."
                        )
                        % source,
                        id="connector_outbox.E212",
                    )
                )
        if self._headers_option is not None and not (
            isinstance(self._headers_option, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in self._headers_option.items())
        ):
            errors.append(
                checks.Error(
                    gettext(
                        "CONNECTOR_OUTBOX source %(source)r: OPTIONS['headers'] must be a dict of header names "
                        "to string values."
                    )
                    % source,
                    id="connector_outbox.E213",
                )
            )
        else:
            errors += self._check_header_text()
        errors += self.check_timeout("connector_outbox.E214")
        if self.lookup_url is not None:
            errors += self.check_http_url("lookup_url", self.lookup_url, "connector_outbox.E215", secret=True)
        return errors

    def _check_header_text(self) -> list[checks.CheckMessage]:
        """E213 for each header that HTTP (or httpx) cannot carry as it is; the value is not shown."""
        return [
            checks.Error(
                gettext(
                    "CONNECTOR_OUTBOX source %(source)r: OPTIONS['headers'][%(name)r] must be a header name "
                    "(a token) with a value of printable ASCII; this one cannot be sent."
                )
                % {"source": self.source, "name": name},
                id="connector_outbox.E213",
            )
            for name, value in self.headers.items()
            if not (name and is_header_token(name) and ":" not in name and is_header_value(value))
        ]


def _secrets_of(target: Target) -> list[str]:
    """A destination's URL and secret, to scrub from its reasons; its URL is hidden from httpx's
    request lines from now on (the whole URL: it is the credential)."""
    REQUEST_LINES.add_url(target.url)
    return [value for value in (target.url, target.secret) if value]


def sign(secret: str, msg_id: str, timestamp: str, payload: bytes) -> str:
    """Standard Webhooks v1 signature: base64 HMAC-SHA256 of ``id.timestamp.payload``."""
    key = _whsec_key(secret) if secret.startswith("whsec_") else None
    key = key if key is not None else secret.encode()
    digest = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + payload, hashlib.sha256).digest()
    return base64.b64encode(digest).decode()


def _whsec_key(secret: str) -> bytes | None:
    try:
        return base64.b64decode(secret.removeprefix("whsec_"), validate=True)
    except (binascii.Error, ValueError):
        return None


def _header_safe(value: str) -> str:
    """`value` if it is printable ASCII, else percent-encoded (header values are ASCII)."""
    if value.isascii() and value.isprintable():
        return value
    return quote(value, safe="")


def _sf_string(value: str) -> str:
    """An RFC 8941 sf-string: quoted, with backslash and quote escaped."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
