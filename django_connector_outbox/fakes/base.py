"""The plumbing the fake platforms share: this package's webhook.py, and the test suite's
Slack, Discord, Mattermost, Telegram and Teams fakes (django_connector_outbox/fakes/).

`FakeServer` runs a threaded HTTP server on 127.0.0.1 in the test's process, records every
request in `calls` and keeps the actions scripted for the next calls of each route; `FakeHandler`
reads bodies, sends JSON, serves ``GET /_fake/state`` and ``POST /_fake/script`` and carries out
the scripted actions every fake knows (a dropped connection before or after the work, a reset, a
delayed reply, a proxy's HTML page), leaving the platform's own (an error code, a rate limit ...) to the fake.
`CommonActions` builds the actions the handler carries out, `match_route` and `parse_json` read
a REST request.

``python -m django_connector_outbox.fakes.NAME``: `command_line` is every fake's, so that each
takes ``--host``, ``--port`` (0: a free one) and ``--source`` alike and prints what a user needs
before serving: the URL to give the connector on the first line (for scripts), then the
``CONNECTOR_OUTBOX`` settings to paste (`FakeServer.connector_settings`, which a test may use as
well) and the fake's own notes (`FakeServer.guide`). A fake declares its own options
(`add_arguments`, `add_chat_arguments` for a chat platform's token, channels and limits) and how
they build it (`from_options`).

Rate limits: a fake enforces the `Limit`s it is given (none by default) as the platform does,
Slack with token buckets (`Bucket`), Discord with fixed windows (`Window`, as its
X-RateLimit-Remaining/Reset-After headers describe). Every fake counts each HTTP status it
answers (`statuses`: `statuses[429]` is every 429, scripted or enforced) and logs each accepted
write with its time (`accepted`), so a test can check a container's rate with `within_pace`.

Latency: `latency` (seconds, 0 by default; ``--latency`` of ``python -m``) holds each answer
of the platform's work (not a refusal of a request it cannot authorize) that long, as a round
trip does, so that a benchmark or a test has sends in flight as against the real service
(bench/many_workspaces.py).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import signal
import socket
import struct
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Self, TypeVar
from urllib.parse import unquote

JSON = dict[str, Any]
Answer = tuple[int, Any]  # (HTTP status, JSON body or None)

CallT = TypeVar("CallT")
ActionT = TypeVar("ActionT")


@dataclass(frozen=True)
class Limit:
    """At most `count` requests per `seconds` (a platform's limit, as a fake enforces it)."""

    count: int
    seconds: float

    @classmethod
    def parse(cls, text: str) -> Limit:
        """``"COUNT/SECONDS"``, as the ``--limit`` option gives it."""
        count, _, per = text.partition("/")
        return cls(int(count), float(per))


class Bucket:
    """A token bucket (GCRA): `count` at once after a quiet spell, refilled at count/seconds."""

    def __init__(self, limit: Limit) -> None:
        self.interval = limit.seconds / limit.count
        self.tolerance = limit.seconds - self.interval
        self.tat = -math.inf  # the theoretical arrival time of the next request

    def wait(self, now: float) -> float:
        """Seconds until a request is allowed (0: now)."""
        return max(self.tat - self.tolerance - now, 0.0)

    def take(self, now: float) -> None:
        self.tat = max(self.tat, now) + self.interval


class Window:
    """A fixed window opened by its first request: `count` requests until it resets `seconds`
    later (Discord's buckets: X-RateLimit-Limit, -Remaining, -Reset-After)."""

    def __init__(self, limit: Limit) -> None:
        self.limit = limit
        self.reset_at = -math.inf
        self.used = 0

    def wait(self, now: float) -> float:
        return 0.0 if now >= self.reset_at or self.used < self.limit.count else self.reset_at - now

    def take(self, now: float) -> None:
        if now >= self.reset_at:
            self.reset_at, self.used = now + self.limit.seconds, 0
        self.used += 1

    def remaining(self) -> int:
        return self.limit.count - self.used


@dataclass(frozen=True)
class Accepted:
    """One write the fake platform accepted: when, by which route or method, in which channel."""

    at: float
    route: str
    channel: str


def within_pace(times: Iterable[float], count: int, seconds: float, *, tolerance: float = 0.0) -> bool:
    """Whether requests at `times` conform to a pace of `count` per `seconds` (a token bucket:
    `count` at once after a quiet spell, refilled at count/seconds), each allowed to come up
    to `tolerance` seconds early."""
    interval = seconds / count
    tat = -math.inf
    for at in sorted(times):
        if at < tat - (seconds - interval) - tolerance:
            return False
        tat = max(tat, at) + interval
    return True


class CommonActions:
    """The constructors of the scripted actions `FakeHandler` carries out for every fake: a mixin
    of each fake's `Action` dataclass (which has the fields `kind`, `status` and `seconds`)."""

    if TYPE_CHECKING:

        def __init__(self, kind: str, *, status: int = ..., seconds: float = 0.0) -> None: ...

    @classmethod
    def drop(cls, *, after_store: bool = True) -> Self:
        return cls("drop" if after_store else "drop_before")

    @classmethod
    def reset(cls) -> Self:
        return cls("reset")

    @classmethod
    def delay(cls, seconds: float) -> Self:
        return cls("delay", seconds=seconds)

    @classmethod
    def html(cls, status: int = 502) -> Self:
        """An HTML error page with `status`, as a proxy in front of the platform sends."""
        return cls("html", status=status)


class FakeServer(Generic[CallT, ActionT]):
    """A fake platform's server. Thread-safe: the HTTP handlers and the test share it under one lock."""

    handler_class: ClassVar[type[FakeHandler]]
    action_class: ClassVar[type[Any]]  # what POST /_fake/script builds from its "action"
    thread_name: ClassVar[str]
    routes: ClassVar[frozenset[str] | None] = None  # the routes script() takes; None: any
    route_field: ClassVar[str] = "route"  # the field of a call that names its route, for calls_of()
    # What connector_settings() and python -m say: the platform, the source and its BACKEND.
    platform: ClassVar[str] = ""
    source_name: ClassVar[str] = ""
    backend: ClassVar[str] = ""
    #: Seconds each unscripted answer waits after the work, as a platform's round trip.
    latency: float = 0.0

    def __init__(
        self, *, clock: Callable[[], float] = time.time, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self.clock = clock
        self._address = (host, port)
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self.calls: list[CallT] = []
        self.statuses: Counter[int] = Counter()  # HTTP status -> how many answers had it
        self.accepted: list[Accepted] = []
        self._script: dict[str, list[ActionT]] = {}
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- life cycle

    def start(self) -> Self:
        handler = type("Handler", (self.handler_class,), {"fake": self})
        server_class = _Server6 if ":" in self._address[0] else _Server
        self._server = server_class(self._address, handler)
        self._stopping.clear()
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name=self.thread_name, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # ends scripted delays at once
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @classmethod
    @contextmanager
    def running(cls, **kwargs: Any) -> Iterator[Self]:
        fake = cls(**kwargs).start()
        try:
            yield fake
        finally:
            fake.stop()

    @property
    def port(self) -> int:
        assert self._server is not None, "the fake is not started"
        return int(self._server.server_address[1])

    @property
    def origin(self) -> str:
        """``http://host:port`` of the started fake: what a client on this machine connects to
        (127.0.0.1 when it listens on every address)."""
        host = self._address[0]
        host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    # -- what a source delivered to this fake is given

    @property
    def address(self) -> str:
        """The URL the connector is given (its `base_url`, `url` or `login_url`): the first line
        ``python -m`` prints."""
        return self.origin

    def connector_options(self) -> JSON:
        """The OPTIONS of a source that this fake delivers (its URL and credentials)."""
        raise NotImplementedError(f"{type(self).__name__} does not say its connector's OPTIONS")

    def connector_settings(self) -> JSON:
        """One source of ``CONNECTOR_OUTBOX["CONNECTORS"]``, delivered by this fake: its BACKEND
        and OPTIONS, for ``python -m`` to print and for a test's ``settings``."""
        return {"BACKEND": self.backend, "OPTIONS": self.connector_options()}

    def guide(self, source: str) -> str:
        """What ``python -m`` prints after the settings: the ids to queue posts to, other settings
        and the fake's own endpoints, so that nobody has to read the source ("" for nothing)."""
        return ""

    # -- python -m (see command_line)

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Add the fake's own options (its credentials, channels, limits) to `parser`, which
        has ``--host``, ``--port`` and ``--source`` already."""

    @classmethod
    def from_options(cls, options: argparse.Namespace) -> Self:
        """The fake that the parsed `options` describe, not started; ``options.host`` and
        ``options.port`` are where it listens."""
        raise NotImplementedError(f"{cls.__name__} does not run as python -m")

    # -- scripting and records

    def script(self, route: str, *actions: ActionT, times: int = 1) -> None:
        """Answer the next calls of `route` with `actions` (each repeated `times`), in order."""
        assert self.routes is None or route in self.routes, route
        with self._lock:
            self._script.setdefault(route, []).extend(a for a in actions for _ in range(times))

    def _next_action(self, route: str) -> ActionT | None:
        with self._lock:
            queue = self._script.get(route)
            return queue.pop(0) if queue else None

    def calls_of(self, route: str) -> list[CallT]:
        with self._lock:
            return [c for c in self.calls if getattr(c, self.route_field) == route]

    def record(self, call: CallT) -> None:
        with self._lock:
            self.calls.append(call)

    def accept(self, route: str, channel: str) -> None:
        """Log a write the platform accepted, at the fake's clock."""
        with self._lock:
            self.accepted.append(Accepted(self.clock(), route, channel))

    def accepted_times(self, channel: str | None = None, *, route: str | None = None) -> list[float]:
        """When writes were accepted (of one channel, one route), oldest first."""
        with self._lock:
            return sorted(
                a.at for a in self.accepted if channel in (None, a.channel) and route in (None, a.route)
            )

    def counted(self, status: int) -> None:
        with self._lock:
            self.statuses[status] += 1

    def records(self) -> JSON:
        """The rate-limit records for `state()`: statuses answered, writes accepted."""
        with self._lock:
            return {
                "statuses": {str(k): v for k, v in self.statuses.items()},
                "accepted": [[a.at, a.route, a.channel] for a in self.accepted],
            }

    def state(self) -> JSON:
        """Everything held and received, as JSON (for other processes, via /_fake/state)."""
        raise NotImplementedError


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a handler in a scripted delay must not keep the process alive
    block_on_close = False
    # A sender connects for up to its concurrency's sends at once (1,000 by default); the
    # default backlog of 5 drops their SYNs and each dropped one waits a second for its
    # retransmission. The kernel caps it at net.core.somaxconn (4096 by default).
    request_queue_size = 1024


class _Server6(_Server):
    address_family = socket.AF_INET6  # for --host ::1 (the base class binds IPv4 only)


class FakeHandler(BaseHTTPRequestHandler):
    fake: Any  # the FakeServer, set by its start()
    script_field: ClassVar[str] = "route"  # what names the route in POST /_fake/script
    normal_kind: ClassVar[str | None] = None  # a scripted action that answers normally
    json_type: ClassVar[str] = "application/json"
    html_title: ClassVar[str] = "Bad Gateway"  # of the page a scripted "html" action sends

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        pass  # quiet: tests read the records instead

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _read_json(self) -> JSON:
        data = json.loads(self._read_body() or b"{}")
        assert isinstance(data, dict)
        return data

    def _control(self, path: str) -> bool:
        """Serve ``GET /_fake/state`` and ``POST /_fake/script``; False for any other request."""
        if self.command == "GET" and path == "/_fake/state":
            self._reply(200, self.fake.state())
        elif self.command == "POST" and path == "/_fake/script":
            spec = self._read_json()
            action = self.fake.action_class(**spec["action"])
            self.fake.script(spec[self.script_field], action, times=int(spec.get("times", 1)))
            self._reply(200, {"ok": True})
        else:
            return False
        return True

    def _answer(self, action: Any, work: Callable[[], Answer]) -> None:
        """Answer a call as the scripted `action` says; `work` does what the platform does.

        No action (or `normal_kind`): reply with what `work` answers, after the fake's
        `latency`. "drop_before": close
        without working; "html": an HTML page with `action.status`, without working; "drop"
        and "reset": work, then close without a reply (a lost reply), "reset" with an RST;
        "delay": work, then reply after `action.seconds`. Any other kind goes to `_answer_own`.
        """
        if action is None or action.kind == self.normal_kind:
            status, body = work()
            if self.fake.latency:
                self.fake._stopping.wait(self.fake.latency)
            self._reply(status, body)
        elif action.kind == "html":
            self._html(action.status, self.html_title)
        elif action.kind == "drop_before":
            self.close_connection = True
        elif action.kind in ("drop", "reset"):
            work()  # the platform did the work...
            self.close_connection = True  # ...and the reply never leaves
            if action.kind == "reset":
                # SO_LINGER 0: close with an RST, which the client reads as ConnectionResetError.
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        elif action.kind == "delay":
            status, body = work()
            self.fake._stopping.wait(action.seconds)
            self._reply(status, body)
        else:
            self._answer_own(action, work)

    def _answer_own(self, action: Any, work: Callable[[], Answer]) -> None:
        """The fake's own kinds of scripted action (an error, a rate limit ...)."""
        raise ValueError(f"unknown scripted action {action.kind!r}")

    def _reply(self, status: int, body: Any, *, headers: dict[str, str] | None = None) -> None:
        """`body` as JSON; None sends no body."""
        data = b"" if body is None else json.dumps(body).encode()
        self._send(status, data, self.json_type if data else "", headers)

    def _html(self, status: int, title: str) -> None:
        """An HTML error page, as a proxy in front of the platform sends."""
        self._send(status, f"<html><body><h1>{status} {title}</h1></body></html>".encode(), "text/html")

    def _send(
        self, status: int, data: bytes, content_type: str, headers: dict[str, str] | None = None
    ) -> None:
        self.fake.counted(status)
        try:
            self.send_response(status)
            if content_type:
                self.send_header("Content-Type", content_type)
            if status != 204 and not 100 <= status < 200:
                self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client gave up (a scripted delay past its timeout)


Route = tuple[str, re.Pattern[str], str]  # (HTTP method, path pattern, route name)


def match_route(routes: Iterable[Route], method: str, path: str) -> tuple[str, dict[str, str]] | None:
    """The name of the first route of `method` whose pattern matches `path`, and its named
    groups (percent-decoded); None if none does."""
    for verb, pattern, name in routes:
        match = pattern.match(path)
        if match and verb == method:
            return name, {k: unquote(v) for k, v in match.groupdict().items()}
    return None


def parse_json(raw: bytes, *, empty: Any = None, invalid: Any = ...) -> Any:
    """A request body as JSON: `empty` when there is none, `invalid` when it is not JSON."""
    if not raw:
        return empty
    try:
        return json.loads(raw)
    except ValueError:
        return invalid


def add_chat_arguments(
    parser: argparse.ArgumentParser, *, token: str, channel: str, limits: str = ""
) -> None:
    """A chat platform's options: --token (default `token`), --channel (repeatable; `channel`
    when none is given) and --limit NAME=COUNT/SECONDS (repeatable; the names are the fake's
    own, `limits` says which). `chat_limits` reads the limits back."""
    parser.add_argument("--token", default=token, help=f"the bot token it accepts (default {token})")
    parser.add_argument(
        "--channel",
        action="append",
        default=[],
        help=f"a channel it has (repeatable; default {channel})",
    )
    parser.set_defaults(default_channel=channel)
    parser.add_argument(
        "--limit",
        action="append",
        default=[],
        help=f"a rate limit, NAME=COUNT/SECONDS (repeatable; NAME: {limits or 'the fake says'})",
    )


def chat_channels(options: argparse.Namespace) -> tuple[str, ...]:
    """The channels of `add_chat_arguments`' options: those given, else its default."""
    return tuple(options.channel) or (options.default_channel,)


def chat_limits(options: argparse.Namespace) -> dict[str, Limit]:
    """The limits of `add_chat_arguments`' options: NAME -> Limit."""
    return {name: Limit.parse(spec) for name, _, spec in (x.partition("=") for x in options.limit)}


SERVING = "Serving until Ctrl-C (or SIGTERM)."  # the last line python -m prints before serving


def command_line(fake_class: type[FakeServer[Any, Any]], argv: list[str] | None = None) -> None:
    """``python -m`` of every fake: parse --host, --port, --source and the fake's own options,
    start it, print its `address` (the first line), the settings to paste and its `guide`, and
    serve until SIGTERM or SIGINT."""
    module = sys.modules[fake_class.__module__]
    parser = argparse.ArgumentParser(
        prog=f"python -m {module_name(fake_class)}",
        description=(module.__doc__ or "").split("\n\n")[0].replace("\n", " ") or None,
    )
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="the port to listen on (default 0: a free one)")
    parser.add_argument(
        "--source",
        default=fake_class.source_name,
        help=f"the source named in the printed settings (default {fake_class.source_name})",
    )
    parser.add_argument(
        "--latency",
        type=float,
        default=0.0,
        help="seconds each answer waits, as a platform's round trip (default 0)",
    )
    fake_class.add_arguments(parser)
    options = parser.parse_args(argv)
    fake = fake_class.from_options(options)
    fake.latency = max(0.0, options.latency)
    fake.start()
    serve_until_signalled(fake, fake.address, usage(fake, options.source))


def module_name(fake_class: type[FakeServer[Any, Any]]) -> str:
    """The module of `fake_class`, by its name even when ``python -m`` runs it as __main__."""
    spec = getattr(sys.modules[fake_class.__module__], "__spec__", None)
    return spec.name if spec is not None else fake_class.__module__


def usage(fake: FakeServer[Any, Any], source: str) -> str:
    """What ``python -m`` prints after the first line: where the fake is, the settings of a
    source it delivers, ready to paste, and its `guide`."""
    settings = {"CONNECTORS": {source: fake.connector_settings()}}
    parts = [
        f"A fake {fake.platform} is serving at {fake.origin}.\n"
        f"GET {fake.origin}/_fake/state shows what it holds and received; POST /_fake/script\n"
        f"scripts failures (how: python -m pydoc {module_name(type(fake))}).",
        f'Paste into your settings, to deliver the source "{source}" to it:',
        f"CONNECTOR_OUTBOX = {python_literal(settings)}",
        fake.guide(source),
        SERVING,
    ]
    return "\n\n".join(part for part in parts if part)


def python_literal(value: Any, indent: int = 0) -> str:
    """`value` (dicts, lists, strings, numbers, booleans, None) as Python source, laid out as
    settings.py has it: one key a line, four spaces a level, double quotes."""
    if isinstance(value, dict) and value:
        pad = "    " * (indent + 1)
        items = "".join(
            f"{pad}{python_literal(k)}: {python_literal(v, indent + 1)},\n" for k, v in value.items()
        )
        return "{\n" + items + "    " * indent + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(python_literal(v, indent) for v in value) + "]"
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a Python string literal
    return repr(value)


def serve_until_signalled(fake: FakeServer[Any, Any], url: str, text: str = "") -> None:
    """The end of each fake's ``python -m``: print `url` (of the started `fake`) on the first
    line of stdout and `text` after it, serve until SIGTERM or SIGINT, then stop."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    print(url, flush=True)
    if text:
        print(f"\n{text}", flush=True)
    stop.wait()
    fake.stop()
