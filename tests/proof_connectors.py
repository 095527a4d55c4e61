"""Connectors for the sender processes that tests start, and a helper to start those processes.

`FilePlatformConnector` is a chat platform that lives outside the sender processes: a file
that every sender (and every thread of each) appends to under an exclusive `flock`, one JSON
line per thing the platform did. Killing a sender cannot undo a line, so at the end the file
says what reached the platform, how many times and in which order.

`GateConnector` blocks each send on a socket owned by the test: the test sees "a send
started" as an event (its `accept()` returns) and decides when and how the send ends.

`SenderProcess` runs ``python -m django run_outbox`` against the test database, with the
outbox settings given as JSON in the environment (see tests/proof_settings.py), and keeps
its stderr for the assertion messages.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

from django_connector_outbox.connectors.base import (
    CannotCheck,
    Connector,
    Delivered,
    MaybeSent,
    Outcome,
    RateLimited,
    RetryLater,
)
from django_connector_outbox.posts import ClaimedPost, Kind

ROOT = Path(__file__).resolve().parent.parent
SETTINGS_ENV = "OUTBOX_PROOF_SETTINGS"


# -- the platform in a file -----------------------------------------------------------------------


def platform_lines(path: str | Path) -> list[dict[str, Any]]:
    """Every line the platform file holds, in the order they were appended."""
    path = Path(path)
    if not path.exists():
        return []
    with path.open("rb") as f:
        fcntl.flock(f, fcntl.LOCK_SH)
        try:
            data = f.read()
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
    return [json.loads(line) for line in data.splitlines() if line]


class NotesClaims:
    """A mixin for a connector class: notes in a file (OPTIONS ``claims``) when each post it
    is handed was claimed, one JSON line a send, whichever sender process or thread sends it.

    A claim is kept on its lane only while it lasts (models.py): once a post is delivered, no
    row says when it was claimed, and pacing is about claim times. `claimed_at` reads them.
    """

    def __init__(self, source: str, *, claims: str, **options: Any) -> None:
        super().__init__(source, **options)  # type: ignore[call-arg]
        self.claims = claims

    def send(self, post: Any) -> Outcome:
        self._note(post)
        outcome: Outcome = super().send(post)  # type: ignore[misc]
        return outcome

    async def asend(self, post: Any) -> Outcome:
        """The same for a coroutine connector (what run_outbox awaits): noted, then sent."""
        self._note(post)
        outcome: Outcome = await super().asend(post)  # type: ignore[misc]
        return outcome

    def _note(self, post: Any) -> None:
        line = json.dumps({"post_id": post.post_id, "sent_at": post.sent_at.isoformat()}) + "\n"
        out = os.open(self.claims, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(out, line.encode())  # one write of one line: lines never interleave
        finally:
            os.close(out)


def claimed_at(path: str | Path) -> dict[str, datetime]:
    """When each post noted by `NotesClaims` was claimed (its latest send's claim)."""
    return {line["post_id"]: datetime.fromisoformat(line["sent_at"]) for line in platform_lines(path)}


class FilePlatformConnector(Connector):
    """A platform whose history is a file shared by every sender process.

    Each line is a JSON object with ``op``:

    - ``create``: a new message (message, status without a ref, reaction, ephemeral), with
      ``post_id``, ``container``, ``kind``, ``seq`` (the body's, if any), ``rev``, ``ref``
      and ``lost`` (True when the reply to it was lost: `send` answered MaybeSent);
    - ``edit``: a status with a message_ref, edited in place (same fields);
    - ``rate_limited``: a send refused with a Retry-After; nothing was posted.

    OPTIONS: ``path`` (the file), ``lose_rate`` (chance that a delivered post's reply is
    lost), ``rate_limit_rate`` (chance that a send is rate-limited instead), ``seed`` (mixed
    with the process id, so that each sender process draws its own sequence), ``latency``
    (seconds each send takes, so that kills catch sends in flight), ``timeout`` (the most a
    send may take, as a real connector's request timeout).
    """

    def __init__(
        self,
        source: str,
        *,
        path: str,
        lose_rate: float = 0.0,
        rate_limit_rate: float = 0.0,
        seed: int = 0,
        latency: float = 0.0,
        retry_after: float = 0.05,
        timeout: float | None = None,
    ) -> None:
        super().__init__(source)
        self.timeout = timeout
        self.path = path
        self.lose_rate = lose_rate
        self.rate_limit_rate = rate_limit_rate
        self.latency = latency
        self.retry_after = retry_after
        self._random = random.Random(f"{seed}:{os.getpid()}")
        self._lock = threading.Lock()

    def _roll(self) -> float:
        with self._lock:
            return self._random.random()

    def _append(self, record: dict[str, Any]) -> None:
        line = (json.dumps(record, sort_keys=True) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, line)  # one write of one line: a SIGKILL cannot leave half of it
        finally:
            os.close(fd)  # closing drops the lock too

    def send(self, post: ClaimedPost) -> Outcome:
        if self.latency:
            time.sleep(self.latency)  # the platform's own latency, not a retry
        if self._roll() < self.rate_limit_rate:
            self._append({"op": "rate_limited", "post_id": post.post_id, "pid": os.getpid()})
            return RateLimited(self.retry_after, "rate limited (file platform)")
        edit = post.kind == Kind.STATUS and bool(post.message_ref)
        ref = post.message_ref if edit else f"{post.container_id}:{post.post_id}"
        lost = self._roll() < self.lose_rate
        self._append(
            {
                "op": "edit" if edit else "create", "post_id": post.post_id, "container": post.container_id,
                "kind": post.kind, "seq": post.body.get("seq"), "rev": post.rev, "ref": ref, "lost": lost,
                "pid": os.getpid(),
            }
        )  # fmt: skip
        if lost:
            return MaybeSent("reply lost (file platform)")
        return Delivered(None if post.kind == Kind.EPHEMERAL else ref)

    def find_sent(self, post: ClaimedPost) -> str | None:
        if post.kind == Kind.EPHEMERAL:
            raise CannotCheck("ephemeral posts leave no trace to look up")
        for line in platform_lines(self.path):
            if line["op"] == "create" and line["post_id"] == post.post_id:
                return str(line["ref"])
        return None


class StallingPlatformConnector(FilePlatformConnector):
    """The file platform behind an async client, and a platform that can stop answering.

    Each `asend` reaches the platform at once (its line is written), then, while the file
    named by OPTIONS ``stall`` exists, waits for the answer: for up to ``timeout`` seconds,
    after which it ends as a lost reply, as an HTTP client's read timeout does. One watcher
    task per connector looks for the file, however many sends wait.
    """

    def __init__(self, source: str, *, stall: str, **options: Any) -> None:
        super().__init__(source, **options)
        self.stall = stall
        self._answering: asyncio.Event | None = None

    async def _platform_answers(self) -> None:
        if self._answering is None:
            self._answering = asyncio.Event()
            asyncio.get_running_loop().create_task(self._watch(self._answering))
        await self._answering.wait()

    async def _watch(self, answering: asyncio.Event) -> None:
        while os.path.exists(self.stall):
            await asyncio.sleep(0.05)
        answering.set()

    async def asend(self, post: ClaimedPost) -> Outcome:
        outcome = self.send(post)  # it reached the platform: one line, appended at once
        if os.path.exists(self.stall):
            try:
                await asyncio.wait_for(self._platform_answers(), self.timeout)
            except TimeoutError:
                return MaybeSent("read timed out: the platform stopped answering")
        return outcome

    async def afind_sent(self, post: ClaimedPost) -> str | None:
        return self.find_sent(post)


# -- a send the test can watch and release -------------------------------------------------------


class GateConnector(Connector):
    """Each send connects to the test's socket, writes the post id and waits for the answer.

    OPTIONS: ``address``, a unix socket path or ``127.0.0.1:PORT``. Answers: ``D`` ->
    Delivered, ``L`` -> MaybeSent, ``R`` (or the test closing the socket) -> RetryLater.
    """

    def __init__(self, source: str, *, address: str) -> None:
        super().__init__(source)
        self.address = address

    def _connect(self) -> socket.socket:
        if ":" in self.address and not self.address.startswith("/"):
            host, port = self.address.rsplit(":", 1)
            return socket.create_connection((host, int(port)))
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(self.address)
        return sock

    def send(self, post: ClaimedPost) -> Outcome:
        with self._connect() as sock:
            sock.sendall(f"{post.post_id}\n".encode())
            answer = sock.recv(1)
        if answer == b"D":
            return Delivered(f"gate:{post.post_id}")
        if answer == b"L":
            return MaybeSent("reply lost (gate)")
        return RetryLater(f"gate answered {answer!r}")

    def find_sent(self, post: ClaimedPost) -> str | None:
        return None


class Gate:
    """The test's side of a GateConnector: a listening unix socket; each send is an accept()."""

    def __init__(self, path: str | Path) -> None:
        self.address = str(path)
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(self.address)
        self._server.listen(16)
        self._open: list[socket.socket] = []

    def accept(self, timeout: float = 10.0) -> tuple[str, socket.socket, float]:
        """Wait for the next send to start: (post id, its socket, perf_counter when it came)."""
        self._server.settimeout(timeout)
        conn, _ = self._server.accept()
        started = time.perf_counter()
        self._open.append(conn)
        conn.settimeout(timeout)
        post_id = b""
        while not post_id.endswith(b"\n"):
            chunk = conn.recv(256)
            if not chunk:
                break
            post_id += chunk
        return post_id.decode().strip(), conn, started

    @staticmethod
    def answer(conn: socket.socket, reply: bytes = b"D") -> None:
        conn.sendall(reply)
        conn.close()

    def close(self) -> None:
        for conn in self._open:
            conn.close()
        self._server.close()
        Path(self.address).unlink(missing_ok=True)


# -- sender processes ------------------------------------------------------------------------------


class SenderProcess:
    """One ``run_outbox`` process; its stderr is read by a thread and kept, line by line."""

    def __init__(
        self, args: list[str], env: dict[str, str], name: str, program: list[str] | None = None
    ) -> None:
        self.name = name
        self.args = args
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self.proc = subprocess.Popen(
            [*(program or [sys.executable, "-m", "django", "run_outbox"]), *args],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, name=f"stderr-{name}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_for_line(self, pattern: str, timeout: float = 20.0, start: int = 0) -> str:
        """Block until a stderr line (from index `start`) matches `pattern`; the line."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        seen = start
        with self._changed:
            while True:
                for line in self.lines[seen:]:
                    if regex.search(line):
                        return line
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if left <= 0 or (not self._reader.is_alive() and seen == len(self.lines)):
                    raise AssertionError(
                        f"{self.name}: no line matching {pattern!r} within {timeout}s\n{self.stderr}"
                    )
                self._changed.wait(min(left, 0.5))

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def wait(self, timeout: float = 30.0) -> int:
        """The exit code, once the process has exited (AssertionError with its stderr if it did not)."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} still running after {timeout}s\n{self.stderr}") from None
        self._reader.join(5)
        return code

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, and the exit code."""
        if self.alive():
            self.signal(signal.SIGTERM)
        return self.wait(timeout)

    def close(self) -> None:
        if self.alive():
            self.kill()
        self._reader.join(5)
        if self.proc.stderr is not None:
            self.proc.stderr.close()

    @property
    def stderr(self) -> str:
        with self._changed:
            text = "\n".join(self.lines)
        return f"--- stderr of {self.name} (pid {self.pid}, exit {self.proc.returncode}) ---\n{text}\n"


class Senders:
    """Starts sender processes against the test database; the `senders` fixture closes them."""

    def __init__(self, database_name: str) -> None:
        self.database_name = database_name
        self.started: list[SenderProcess] = []

    def env(self, outbox_settings: dict[str, Any]) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            DJANGO_SETTINGS_MODULE="tests.proof_settings",
            TEST_DATABASE_NAME=self.database_name,
            PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
            PYTHONUNBUFFERED="1",
        )
        env[SETTINGS_ENV] = json.dumps(outbox_settings)
        return env

    def start(
        self,
        outbox_settings: dict[str, Any],
        *args: str,
        name: str | None = None,
        program: list[str] | None = None,
    ) -> SenderProcess:
        """Start ``run_outbox *args`` (or `program` *args) with these outbox settings."""
        name = name or f"sender-{len(self.started) + 1}"
        process = SenderProcess(list(args), self.env(outbox_settings), name, program)
        self.started.append(process)
        return process

    def start_many(
        self, count: int, outbox_settings: dict[str, Any], *args: str, prefix: str = "sender"
    ) -> None:
        """Start `count` alike senders, named `prefix`-1, `prefix`-2 ..."""
        for n in range(count):
            self.start(outbox_settings, *args, name=f"{prefix}-{n + 1}")

    def wait_until_finished(
        self,
        what: str,
        *,
        source: str | None = None,
        post_ids: Iterable[str] | None = None,
        timeout: float = 60.0,
    ) -> None:
        """Poll the database (no event says "the senders recorded it") until no post (of `source`,
        of `post_ids`) is queued or sending; every sender must stay alive meanwhile."""
        from django_connector_outbox.models import Post

        posts = Post.objects.all()
        if source is not None:
            posts = posts.filter(source=source)
        if post_ids is not None:
            posts = posts.filter(post_id__in=list(post_ids))
        unfinished = posts.in_states(("queued", "sending"))
        deadline = time.monotonic() + timeout
        while unfinished.exists():
            if time.monotonic() > deadline:
                left = list(unfinished.values_list("source", "post_id", "last_error")[:20])
                raise AssertionError(f"timed out waiting for {what}; unfinished: {left}\n{self.stderr()}")
            for process in self.started:
                assert process.alive(), f"{process.name} exited while waiting for {what}\n{self.stderr()}"
            time.sleep(0.05)

    def stop_all(self) -> None:
        """SIGTERM each sender; each must exit 0, without a traceback."""
        for process in self.started:
            assert process.stop() == 0, process.stderr
            assert "Traceback" not in process.stderr, process.stderr

    def stderr(self) -> str:
        """Every started process's stderr, for an assertion message."""
        return "\n".join(process.stderr for process in self.started)

    def close(self) -> None:
        for process in self.started:
            process.close()


def file_platform(path: str | Path, **options: Any) -> dict[str, Any]:
    return {
        "BACKEND": "tests.proof_connectors.FilePlatformConnector",
        "OPTIONS": {"path": str(path), **options},
    }


def gate(address: str) -> dict[str, Any]:
    return {"BACKEND": "tests.proof_connectors.GateConnector", "OPTIONS": {"address": address}}
