"""The Google Chat app's credentials: its service account's key, and the access token that a
JWT signed with it buys from Google's token endpoint (developers.google.com/identity/protocols/
oauth2/service-account).

google-auth signs the JWT and reads the answer, and it is blocking: every exchange runs in a
thread (`blocking`), never on the event loop, one at a time and once per expiry (`AppToken`).
Its own retries of a token request are turned off by the transport it is given
(`TokenTransport` raises at the first failure): every outcome goes back to the outbox.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from google.auth.exceptions import GoogleAuthError
from google.oauth2 import service_account

from django_connector_outbox.connectors.base import blocking
from django_connector_outbox.connectors.http import json_or_none, parse_retry_after
from django_connector_outbox.connectors.text import scrub

#: "App authentication with the authorization scope: https://www.googleapis.com/auth/chat.bot"
#: (spaces.messages.create, patch, get, delete).
SCOPE = "https://www.googleapis.com/auth/chat.bot"
#: A token is renewed this long before it expires (or at half its life, if shorter).
RENEW_AHEAD = 300.0


class TokenError(Exception):
    """No access token: the token endpoint refused the service account, or could not be reached."""

    def __init__(self, reason: str, after: float | None = None) -> None:
        super().__init__(reason)
        self.reason, self.after = reason, after


class AppToken:
    """The Chat app's access token, shared by every send: fetched in a thread (google-auth is
    blocking), by one thread at a time, kept until `RENEW_AHEAD` before it expires, renewed
    at once when Google refuses the one a send used (401)."""

    def __init__(self, fetch: Callable[[], tuple[str, float]], clock: Callable[[], float] = time.monotonic):
        self._fetch, self._clock = fetch, clock
        self._lock = threading.Lock()
        self._current: tuple[str, float] | None = None  # (token, renew at), replaced whole

    @property
    def value(self) -> str | None:
        return self._current[0] if self._current else None

    async def get(self) -> str:
        current = self._current
        if current is not None and self._clock() < current[1]:
            return current[0]  # no thread for the common case
        return await blocking(self._renew, None)

    async def renew(self, used: str) -> str:
        """A token other than `used` (refused by Google): the one another send got since, or new."""
        return await blocking(self._renew, used)

    def _renew(self, used: str | None) -> str:
        with self._lock:
            current = self._current
            if current is not None and current[0] != used and self._clock() < current[1]:
                return current[0]  # another thread renewed it while this one waited
            now = self._clock()
            token, lifetime = self._fetch()
            self._current = (token, now + lifetime - min(RENEW_AHEAD, lifetime / 2))
            return token


class TokenTransport:
    """google-auth's `Request` over a blocking httpx client, that never retries: any answer but
    a 200 raises `TokenError` at once, which stops google-auth's own retry loop."""

    def __init__(self, client: httpx.Client, secrets: Callable[[], list[str]]) -> None:
        self._client, self._secrets = client, secrets

    def __call__(
        self,
        url: str,
        method: str = "GET",
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> TokenResponse:
        try:
            response = self._client.request(method, url, content=body, headers=dict(headers or {}))
        except httpx.HTTPError as exc:
            # A token request posts nothing: whatever happened, asking again is harmless.
            raise TokenError(scrub(f"google chat token: {type(exc).__name__}", self._secrets())) from None
        if response.status_code != 200:
            # {"error": "invalid_grant", "error_description": "Invalid JWT Signature."}
            data = json_or_none(response)
            data = data if isinstance(data, dict) else {}
            code = str(data.get("error") or response.reason_phrase)[:100]
            description = str(data.get("error_description") or "")[:200]
            reason = f"google chat token: HTTP {response.status_code} {code} {description}".strip()
            raise TokenError(
                scrub(reason, self._secrets()), parse_retry_after(response.headers.get("Retry-After"))
            )
        return TokenResponse(response)


class TokenResponse:
    """google-auth's `Response` of a token request."""

    def __init__(self, response: httpx.Response) -> None:
        self.status = response.status_code
        self.headers = response.headers
        self.data = response.content


class ServiceAccount:
    """The service account of OPTIONS (``service_account_file`` or ``service_account_info``):
    its key, read once when first needed, and the exchange of a signed JWT for a token."""

    def __init__(self, *, file: Any, info: Any, token_uri: Any, timeout: float, user_agent: str) -> None:
        self.file, self.info, self.token_uri = file, info, token_uri
        self._timeout, self._user_agent = timeout, user_agent
        self._credentials: service_account.Credentials | None = None
        self.private_key: str | None = None  # once read: a secret, like the token
        self._client: httpx.Client | None = None

    def credentials(self) -> service_account.Credentials:
        """google-auth's credentials of the key (ValueError, or OSError for a file, when the key
        cannot be used)."""
        if self._credentials is None:
            info = key_info(self.file, self.info)
            key = info.get("private_key")
            self.private_key = key if isinstance(key, str) else None
            self._credentials = _load_credentials(info, self.token_uri)
        return self._credentials

    def fetch_token(self, secrets: Callable[[], list[str]]) -> tuple[str, float]:
        """A new access token and its lifetime in seconds (blocking). Raises `TokenError`, its
        reason scrubbed of `secrets()`."""
        try:
            credentials = self.credentials()
        except (OSError, ValueError) as exc:
            raise TokenError(f"google chat service account: {key_problem(exc)}") from None
        if self._client is None:
            self._client = httpx.Client(
                timeout=httpx.Timeout(self._timeout),
                follow_redirects=False,  # an answer to read, never a second request
                trust_env=False,  # no proxy, CA bundle or netrc from the environment
                headers={"User-Agent": self._user_agent},
            )
        try:
            # google-auth is untyped (no py.typed): its calls are checked by the tests.
            credentials.refresh(TokenTransport(self._client, secrets))  # type: ignore[no-untyped-call]
        except (GoogleAuthError, ValueError, TypeError, KeyError) as exc:
            # A 200 that is not a token's JSON (a proxy's page), a key it cannot sign with.
            raise TokenError(
                scrub(f"google chat token: {type(exc).__name__}: {exc}"[:300], secrets())
            ) from None
        token, expiry = credentials.token, credentials.expiry
        if not isinstance(token, str) or not token:
            raise TokenError("google chat token: the answer had no access token")
        # google-auth keeps the expiry as a naive UTC datetime.
        lifetime = (expiry.replace(tzinfo=UTC) - datetime.now(UTC)).total_seconds() if expiry else 3599.0
        return token, max(lifetime, 1.0)

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()


def key_info(file: Any, info: Any) -> Mapping[str, Any]:
    """The service account's JSON key, from the file or as given; ValueError (or OSError, for
    a file) when it cannot be read."""
    if file is not None:
        if not isinstance(file, (str, Path)):
            raise ValueError("OPTIONS['service_account_file'] must be a path")
        info = json.loads(Path(file).read_text(encoding="utf-8"))
    elif isinstance(info, str):  # the key's JSON, as an environment variable holds it
        info = json.loads(info)
    if not isinstance(info, Mapping):
        raise ValueError("the key must be a service account's JSON object")
    if info.get("type", "service_account") != "service_account":
        raise ValueError(f"the key is of type {info.get('type')!r}, not 'service_account'")
    return info


def _load_credentials(info: Mapping[str, Any], token_uri: Any) -> service_account.Credentials:
    """google-auth's service-account credentials with the Chat app's scope (ValueError for a
    key it cannot use)."""
    credentials: service_account.Credentials = service_account.Credentials.from_service_account_info(  # type: ignore[no-untyped-call]
        dict(info), scopes=[SCOPE]
    )
    if token_uri is not None:
        credentials = credentials.with_token_uri(str(token_uri))
    return credentials


def key_problem(exc: Exception) -> str:
    """What is wrong with a key, without quoting it (a JSON error's position, a missing field)."""
    if isinstance(exc, json.JSONDecodeError):
        return f"it is not JSON ({exc.msg})"
    if isinstance(exc, OSError):
        return f"it cannot be read ({exc.strerror or type(exc).__name__})"
    return str(exc)[:200] or type(exc).__name__
