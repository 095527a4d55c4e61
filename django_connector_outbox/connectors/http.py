"""Shared HTTP plumbing for connectors that talk to a platform over HTTP.

Two clients per connector, each built lazily: an `httpx.Client` shared by the threads of the
blocking methods (`request`), and an aiohttp `ClientSession` per event loop for the coroutines
(`arequest`): a session's pool belongs to the loop that opened it (run_outbox has one loop;
in-process deliveries keep one per thread), and its connection limit is the sender's
concurrency (`base.in_flight_limit`), so that no request waits for a connection inside its
timeout. Requests are built by httpx in both forms (the same headers and body, byte for byte)
and answered as `httpx.Response`; only the coroutine form sends them with aiohttp, because
httpx's async pool (httpcore 1.0) is the limit at a sender's concurrency: it looks over every
connection of the pool, polling each idle socket, for each request it assigns (encode/httpcore
#1035), and took 10-16 ms of CPU per request with 100-1,000 in flight where aiohttp takes
0.13-0.19 ms (bench/README.md, "webhook over HTTP"). Both forms have the ``timeout`` option's
timeouts, no redirects, nothing from the environment, and sort transport failures the same
way, by whether the request can have reached the platform. A subclass builds requests, reads
responses and maps them to outcomes; it never sees an httpx or aiohttp exception, only
`NotSent` and `LostReply`.

One code path for both forms: a shipped connector writes what a post does once, as a plan
(`Plan`: a generator that yields each request, `http(...)`, and each piece of work that may
block, `offload(...)`, such as a database read of its installations), and has it carried out
by `_run` (its blocking `send`, `find_sent`: requests through the blocking client, work in
place) or `_arun` (its `asend`, `afind_sent`: requests awaited on the loop's client, work in a
thread through `blocking`). The request plan and the mapping of answers to outcomes are
therefore the same in both; only the driver differs.

Secrets (a token, a signing secret, header values, a URL that holds a token) never reach a
reason or a log line: every text built from an exception or a platform's answer goes through
`scrub`, a request that cannot even be built (a header value that is not ASCII, say) is
reported by the class of its error alone, and httpx's own INFO line about each request
("HTTP Request: POST <url> ...") shows a URL that holds a secret as its scheme and host only
(`RequestLineFilter`). A filter on the "httpx" logger, rather than a higher level for it: the
level is the project's to set (its own requests' lines stay as they are, ours keep their
method, host and status), and no level could tell our clients' requests from the project's.

Public API, for connectors of your own (docs/connectors/your-own.md): the names of `__all__`.
They follow the package's version scheme (RELEASING.md): within a 0.x series they change only
in a new minor version, with a CHANGELOG note. Stable on `HttpConnector`: the constructor
``(source, *, timeout=DEFAULT_TIMEOUT)``, `timeout`, `user_agent`, `client`, `request`,
`arequest`, `secrets`, `scrub`, `check_timeout`, `close` and `aclose`. Everything else here is
internal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import weakref
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any, TypeVar

import httpx
from django.core import checks
from django.utils.translation import gettext

from django_connector_outbox import __version__
from django_connector_outbox.connectors.base import Connector, blocking, in_flight_limit
from django_connector_outbox.connectors.plans import Driven, Offload
from django_connector_outbox.connectors.text import is_header_token, is_header_value, scrub

if TYPE_CHECKING:  # the coroutine form's client, imported where it is first used
    import aiohttp

__all__ = [
    "DEFAULT_TIMEOUT",
    "HttpConnector",
    "LostReply",
    "NotSent",
    "TransportError",
    "json_or_none",
    "parse_retry_after",
]

#: Seconds, when a source's OPTIONS give no ``timeout``.
DEFAULT_TIMEOUT = 10.0
#: Connections of a loop's session where no sender set `base.in_flight_limit` (an in-process
#: delivery, a test's own loop): httpx's (and aiohttp's) own default.
DEFAULT_CONNECTIONS = 100

T = TypeVar("T")


class TransportError(Exception):
    """No HTTP response came back. The message is safe to show: no URL, no header."""


class NotSent(TransportError):
    """The request never left: connect error, DNS failure, connect/pool timeout."""


class LostReply(TransportError):
    """The request was (or may have been) sent, but no reply came back: outcome unknown."""


# Failures that happen before a single byte of the request reaches the server. h11 raises
# LocalProtocolError while it serializes the request line and headers (an illegal header
# value, such as a token read from a file with its trailing newline), before writing them.
_NOT_SENT = (
    httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol,
    httpx.LocalProtocolError,
)  # fmt: skip


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> float | None:
    """Seconds to wait from a Retry-After header, or None if absent or unreadable.

    RFC 9110 §10.2.3: either delay-seconds or an HTTP-date. A fractional number is accepted
    too (some platforms send one); a date in the past means "now" (0).
    """
    if value is None or not value.strip():
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(seconds, 0.0) if math.isfinite(seconds) else None
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # "-0000" dates parse naive; HTTP-dates are always GMT
        when = when.replace(tzinfo=UTC)
    return max((when - (now or datetime.now(UTC))).total_seconds(), 0.0)


class RequestLineFilter(logging.Filter):
    """Rewrites httpx's records so that a URL holding a connector's secret shows as
    ``scheme://host/***``; installed once on the "httpx" logger, fed by every HttpConnector."""

    def __init__(self) -> None:
        super().__init__()
        # Replaced whole, never changed in place: the filter runs on every sender thread.
        self.secrets: frozenset[str] = frozenset()
        # URLs that are credentials whole (a destination's, one per channel): looked up by
        # equality, so that thousands of them cost a set lookup per line, not a scrub each.
        self.urls: set[str] = set()
        self._adding = threading.Lock()

    def add(self, secrets: list[str]) -> None:
        with self._adding:
            self.secrets = self.secrets | {s for s in secrets if s}

    def add_url(self, url: str) -> None:
        """Show `url` as its scheme and host only (as httpx writes it: normalized)."""
        try:
            shown = str(httpx.URL(url))
        except httpx.InvalidURL:
            return  # never requested either: httpx cannot build a request for it
        if shown not in self.urls:
            with self._adding:
                self.urls.add(shown)

    def filter(self, record: logging.LogRecord) -> bool:
        if (self.secrets or self.urls) and isinstance(record.args, tuple):
            record.args = tuple(self._redact(arg) for arg in record.args)
        return True

    def _redact(self, arg: object) -> object:
        if not isinstance(arg, httpx.URL):
            return arg
        url, secrets = str(arg), self.secrets
        if url not in self.urls and scrub(url, secrets) == url:
            return arg
        port = f":{arg.port}" if arg.port is not None else ""
        host = f"[{arg.host}]" if ":" in arg.host else arg.host  # an IPv6 address
        return scrub(f"{arg.scheme}://{host}{port}/***", secrets)


REQUEST_LINES = RequestLineFilter()
HTTPX_LOG = logging.getLogger("httpx")
HTTPX_LOG.addFilter(REQUEST_LINES)


@dataclass(frozen=True)
class Request:
    """One request of a plan: the arguments of `HttpConnector.request`."""

    method: str
    url: str
    options: Mapping[str, Any]


#: What a send or a lookup does, written once for both forms: a generator that yields its
#: steps, is sent each step's answer (or has its exception thrown in), and returns the result.
Plan = Generator[Request | Offload, Any, T]


def http(method: str, url: str, **options: Any) -> Plan[httpx.Response]:
    """``response = yield from http(...)`` in a plan: the response, whatever its status, or
    `NotSent` / `LostReply` raised (see `HttpConnector.request`)."""
    response: httpx.Response = yield Request(method, url, options)
    return response


class HttpConnector(Connector):
    """Base of HTTP connectors: owns the client and the transport error classification.

    Subclasses call `request()` and map its response (or `NotSent` / `LostReply`) to outcomes:
    a `NotSent` is safe to retry (`RetryLater`), a `LostReply` of a create is `MaybeSent`
    (of an idempotent edit, `RetryLater`). A subclass taking options of its own passes
    ``timeout`` on to ``super().__init__`` and names its secrets in `secrets()`.
    """

    #: Sent on every request; a platform may require its own format (Discord does).
    user_agent = f"django-connector-outbox/{__version__}"
    #: Seconds of each phase of a request: the ``timeout`` option, or DEFAULT_TIMEOUT.
    timeout: float

    def __init__(self, source: str, *, timeout: Any = DEFAULT_TIMEOUT) -> None:
        super().__init__(source)
        self._timeout_option = timeout
        # A bad value is reported by check(); until then fall back to the default so that
        # building the connector (which check() itself needs) never raises.
        self.timeout = _positive_seconds(timeout) or DEFAULT_TIMEOUT
        self._client: httpx.Client | None = None
        self._client_lock = threading.Lock()
        self._aclients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aiohttp.ClientSession] = (
            weakref.WeakKeyDictionary()
        )

    @property
    def client(self) -> httpx.Client:
        """The shared client; httpx.Client and its connection pool are thread-safe."""
        client = self._client
        if client is None:
            with self._client_lock:
                if self._client is None:
                    self._client = self._build_client()
                client = self._client
        return client

    def _build_client(self) -> httpx.Client:
        REQUEST_LINES.add(self.secrets())
        return httpx.Client(**self._client_options())

    def _client_options(self) -> dict[str, Any]:
        return {
            # httpx timeouts apply per phase (connect, write, each read, pool wait), so one
            # request can take a few times `timeout`; the LEASE check leaves room for that.
            "timeout": httpx.Timeout(self.timeout),
            # A redirect is an answer to map (a webhook 3xx is refused), never a second POST.
            "follow_redirects": False,
            # Ignore HTTP(S)_PROXY, NO_PROXY, SSL_CERT_FILE and ~/.netrc from the environment:
            # every sender process then talks to the platform the same way, a proxy's 502
            # cannot pass for the platform's, and no netrc credentials are added to requests.
            "trust_env": False,
            "headers": {"User-Agent": self.user_agent},
        }

    def async_client(self) -> aiohttp.ClientSession:
        """The running loop's session, made at its first request there. Its pool takes as many
        connections as the sender has sends in flight (`base.in_flight_limit`, else
        DEFAULT_CONNECTIONS), each kept alive: a smaller pool would queue requests inside
        their timeout, and a connection closed after each request would cost a handshake per
        send. Like the blocking client: nothing from the environment, and no cookies kept
        (one source's calls for many workspaces share it); bodies are left as they came, for
        httpx to decode as it does the blocking client's."""
        import aiohttp

        loop = asyncio.get_running_loop()
        session = self._aclients.get(loop)
        if session is None:
            with self._client_lock:
                session = self._aclients.get(loop)
                if session is None:
                    connections = in_flight_limit.get() or DEFAULT_CONNECTIONS
                    session = aiohttp.ClientSession(
                        connector=aiohttp.TCPConnector(limit=connections),
                        cookie_jar=aiohttp.DummyCookieJar(),
                        trust_env=False,
                        auto_decompress=False,
                        timeout=aiohttp.ClientTimeout(
                            total=None,
                            connect=self.timeout,
                            sock_connect=self.timeout,
                            sock_read=self.timeout,
                        ),
                    )
                    # aiohttp sends a GET, PUT or DELETE again, unasked, when a kept-alive
                    # connection breaks before the answer: a resend that the outbox must decide
                    # (a lost reply is looked up first). No public option turns it off; this
                    # attribute is the one aiohttp's own test client clears, and the tests of
                    # each connector's lost replies (the fakes' drop()) hold it to that.
                    session._retry_connection = False
                    self._aclients[loop] = session
        return session

    def secrets(self) -> list[str]:
        """The option values that no reason or log line may show; a subclass adds its own."""
        return []

    def scrub(self, text: str) -> str:
        """`text` without this connector's secrets (see `scrub`)."""
        return scrub(text, self.secrets())

    def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        """Send one request and return its response, whatever its status code.

        Raises `NotSent` when the request cannot have reached the server (it could not be
        built, or failed before its first byte left) and `LostReply` when it may have (read
        timeout, connection reset or closed after sending, protocol error). The messages are
        scrubbed of the connector's secrets, and the httpx error is not chained (its message
        may hold a header value). Never retries: every outcome goes back to the outbox.
        """
        client = self.client
        built = self._built(client, method, url, kwargs)
        try:
            return client.send(built)
        except httpx.TransportError as exc:
            raise self._failure(exc) from None

    async def arequest(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        """`request` on the running loop's `async_client`: the request that `request` would
        send (built by the blocking client: its headers, its body), the same `NotSent` and
        `LostReply`, scrubbed alike, and the answer as an `httpx.Response`."""
        import aiohttp
        import yarl

        built = self._built(self.client, method, url, kwargs)
        session = self.async_client()
        try:
            body = built.read()
            async with session.request(
                built.method,
                yarl.URL(str(built.url), encoded=True),  # as httpx encoded it (Discord's %3A)
                headers=[
                    (name.decode("latin-1"), value.decode("latin-1")) for name, value in built.headers.raw
                ],
                data=body or None,
                allow_redirects=False,
            ) as answer:
                content = await answer.read()
                version = (
                    f"HTTP/{answer.version.major}.{answer.version.minor}" if answer.version else "HTTP/1.1"
                )
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise self._failure(_as_httpx_error(exc)) from None
        response = httpx.Response(
            answer.status, headers=list(answer.raw_headers), content=content, request=built,
            extensions={"http_version": version.encode("ascii"), "reason_phrase": (answer.reason or "").encode("latin-1")},
        )  # fmt: skip
        # httpx's own line about each request, as the blocking client logs it (RequestLineFilter).
        HTTPX_LOG.info(
            'HTTP Request: %s %s "%s %d %s"',
            built.method,
            built.url,
            version,
            answer.status,
            response.reason_phrase,
        )
        return response

    def _built(
        self, client: httpx.Client | httpx.AsyncClient, method: str, url: str, kwargs: Mapping[str, Any]
    ) -> httpx.Request:
        # Checked here rather than left to h11, whose error (and httpcore's debug log of it)
        # quotes the value: a token with a newline or a non-ASCII character, say.
        for name, value in (kwargs.get("headers") or {}).items():
            if not is_header_value(value):
                raise NotSent(f"not sent: the value of header {name!r} is not printable ASCII")
        try:
            return client.build_request(method, url, **kwargs)
        except Exception as exc:  # noqa: BLE001 - whatever it is, nothing left: report its class only
            # Its message may quote a header value (UnicodeEncodeError of a non-ASCII token).
            raise NotSent(f"not sent: the request could not be built ({type(exc).__name__})") from None

    def _failure(self, exc: httpx.TransportError) -> TransportError:
        if isinstance(exc, _NOT_SENT):
            return NotSent(f"not sent: {self.scrub(_describe(exc))}")
        # Read timeout, RemoteProtocolError ("server disconnected without sending a
        # response"), reset during read, and also write errors: once bytes have left,
        # the server may have acted on a complete request, so the outcome is unknown.
        return LostReply(f"no reply: {self.scrub(_describe(exc))}")

    def _run(self, plan: Plan[T]) -> T:
        """Carry `plan` out on this thread: its requests through `request`, its work in place."""
        driven: Driven[Request | Offload, T] = Driven(plan)
        while (step := driven.next_step()) is not None:
            try:
                if isinstance(step, Request):
                    driven.answer = self.request(step.method, step.url, **step.options)
                else:
                    driven.answer = step.call()
            except Exception as error:  # noqa: BLE001 - thrown into the plan, which decides
                driven.failure = error
        result: T = driven.result
        return result

    async def _arun(self, plan: Plan[T]) -> T:
        """Carry `plan` out on the running loop: its requests through `arequest`, its work in a
        thread (`blocking`: a stopping sender's `NotStarted` goes through the plan and out)."""
        driven: Driven[Request | Offload, T] = Driven(plan)
        while (step := driven.next_step()) is not None:
            try:
                if isinstance(step, Request):
                    driven.answer = await self.arequest(step.method, step.url, **step.options)
                else:
                    driven.answer = await blocking(step.call)
            except Exception as error:  # noqa: BLE001 - thrown into the plan, which decides
                driven.failure = error
        result: T = driven.result
        return result

    def close(self) -> None:
        """Close the blocking client, and the async clients of loops that are idle (an
        in-process delivery's); a running loop's is the sender's, closed by its `aclose`. A
        later request builds new ones."""
        self._close_blocking()
        with self._client_lock:
            idle = [(loop, c) for loop, c in self._aclients.items() if not loop.is_running()]
            for loop, _ in idle:
                del self._aclients[loop]
        for loop, session in idle:
            if not loop.is_closed():
                # RuntimeError: called from a thread whose own loop runs; the sockets then go
                # with the session.
                with contextlib.suppress(RuntimeError):
                    loop.run_until_complete(session.close())

    async def aclose(self) -> None:
        """Close this loop's client and the blocking one (`aclose_clients`); a later request
        builds new ones. A subclass's own `close` is run too, in a thread (it may release
        more), unless the subclass has an `aclose` of its own."""
        await self.aclose_clients()
        if type(self).close is not HttpConnector.close:
            await blocking(self.close)

    async def aclose_clients(self) -> None:
        """Close this loop's client and the blocking one, on the loop: closing a pool that is
        idle (the sender's sends have ended) only closes its sockets."""
        with self._client_lock:
            session = self._aclients.pop(asyncio.get_running_loop(), None)
        if session is not None:
            await session.close()
        self._close_blocking()

    def _close_blocking(self) -> None:
        with self._client_lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def check_timeout(self, check_id: str) -> list[checks.CheckMessage]:
        """An error with `check_id` if the ``timeout`` option is not a positive number."""
        if _positive_seconds(self._timeout_option) is not None:
            return []
        return [
            checks.Error(
                gettext(
                    "CONNECTOR_OUTBOX source %(source)r: OPTIONS['timeout'] must be a positive number of "
                    "seconds (or a timedelta), not %(value)r."
                )
                % {"source": self.source, "value": self._timeout_option},
                id=check_id,
            )
        ]

    def check_http_url(
        self,
        option: str,
        value: Any,
        check_id: str,
        *,
        needs: str = "",
        secret: bool = False,
        hint: str | None = None,
    ) -> list[checks.CheckMessage]:
        """An error with `check_id` unless `value` (of OPTIONS[`option`]) is an http(s) URL with a
        host. `needs` words the error in the platform's terms (translated by the caller, like
        `hint`); a `secret` URL is not shown."""
        if is_http_url(value):
            return []
        if needs:
            says = (
                gettext("CONNECTOR_OUTBOX source %(source)r: %(needs)s.")
                if secret
                else gettext("CONNECTOR_OUTBOX source %(source)r: %(needs)s, not %(value)r.")
            )
        elif secret:
            says = gettext("CONNECTOR_OUTBOX source %(source)r: OPTIONS[%(option)r] must be an http(s) URL.")
        else:
            says = gettext(
                "CONNECTOR_OUTBOX source %(source)r: OPTIONS[%(option)r] must be an http(s) URL, not %(value)r."
            )
        shown = says % {"source": self.source, "needs": needs, "option": option, "value": value}
        return [checks.Error(shown, hint=hint, id=check_id)]

    def check_header_token(
        self, option: str, value: Any, check_id: str, *, missing: str, hint: str | None = None
    ) -> list[checks.CheckMessage]:
        """An error with `check_id` if `value` (of OPTIONS[`option`]) is empty (`missing` says what
        it should be, translated by the caller) or cannot be sent in an HTTP header as one word;
        the value is never shown."""
        if not isinstance(value, str) or not value:
            says = gettext("CONNECTOR_OUTBOX source %(source)r: %(missing)s.")
        elif not is_header_token(value):
            says = gettext(
                "CONNECTOR_OUTBOX source %(source)r: OPTIONS[%(option)r] must be printable ASCII without "
                "spaces; this one cannot be sent in an HTTP header."
            )
        else:
            return []
        shown = says % {"source": self.source, "missing": missing, "option": option}
        return [checks.Error(shown, hint=hint, id=check_id)]


def is_http_url(value: Any) -> bool:
    """Whether `value` is an http(s) URL with a host."""
    if not isinstance(value, str) or not value.startswith(("https://", "http://")):
        return False
    try:
        return bool(httpx.URL(value).host)
    except httpx.InvalidURL:
        return False


def _positive_seconds(value: Any) -> float | None:
    """`value` (seconds as int/float, or a timedelta) as positive seconds, else None."""
    if isinstance(value, timedelta):
        value = value.total_seconds()
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def _as_httpx_error(exc: Exception) -> httpx.TransportError:
    """The httpx error that stands for an aiohttp one, so that both forms sort failures by
    one rule (`_failure`) and word them alike: no connection (refused, DNS, TLS, a connect or
    pool wait that timed out) or a URL that cannot be requested, the request never left; any
    failure once connected (a read timeout, a disconnect, a broken answer) may come after it."""
    import aiohttp

    message = str(exc)
    if isinstance(exc, aiohttp.ConnectionTimeoutError):  # before the timeouts it is one of
        return httpx.ConnectTimeout(message)
    if isinstance(exc, aiohttp.ClientConnectorError):
        return httpx.ConnectError(message)
    if isinstance(exc, aiohttp.InvalidURL):
        return httpx.UnsupportedProtocol(message)
    if isinstance(exc, TimeoutError):
        return httpx.ReadTimeout(message)
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return httpx.RemoteProtocolError("Server disconnected without sending a response.")
    if isinstance(exc, (aiohttp.ClientPayloadError, aiohttp.ClientResponseError)):
        return httpx.RemoteProtocolError(message)
    return httpx.ReadError(message)


def _describe(exc: Exception) -> str:
    # The class name says what happened; httpx's and aiohttp's messages are OS/protocol errors
    # that carry no URL path or header, but are cut short in case a platform echoes something long.
    message = str(exc).strip()
    name = type(exc).__name__
    return f"{name}: {message[:200]}" if message else name


def json_or_none(response: httpx.Response) -> Any:
    """The response's JSON, or None if the body is not JSON."""
    try:
        return response.json()
    except ValueError:
        return None
