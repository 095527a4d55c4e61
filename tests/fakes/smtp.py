"""A fake SMTP server on 127.0.0.1 for the email connector's tests (aiosmtpd, in a thread).

It takes every message, keeps what it took in `messages` (with Message-ID, subject and
threading headers), and answers the next messages to a recipient as scripted (`script`):

- ``pass``: as usual (the message is taken);
- ``rcpt_4xx`` / ``rcpt_5xx``: RCPT TO answered 450 / 550 (nothing taken);
- ``data_4xx`` / ``data_5xx``: the message read, then 451 / 554 (nothing taken);
- ``drop_before_data``: the connection closed at RCPT TO, before DATA (nothing taken);
- ``drop_after_data``: the message read and taken, then the connection closed before the
  final reply: the lost reply that the sender cannot tell from a message never taken.

Actions are per recipient, so that several sender processes sending to many recipients at once
still meet them in a known order. `statuses` counts every scripted answer by its code (0 for
a dropped connection). aiosmtpd rather than a hand-written server: the stdlib's smtpd is gone
(Python 3.12), and aiosmtpd is its maintained successor (aio-libs), a test dependency only.
"""

from __future__ import annotations

import email
import email.policy
import threading
from collections import Counter, defaultdict, deque
from dataclasses import dataclass
from typing import Any, Self

from aiosmtpd.controller import Controller

ACTIONS = {
    "pass": "",  # answered as usual: to script a later message of the recipient
    "rcpt_4xx": "450 4.2.1 Mailbox busy, try again later",
    "rcpt_5xx": "550 5.1.1 No such user here",
    "data_4xx": "451 4.3.0 Temporary failure, try again later",
    "data_5xx": "554 5.7.1 Message rejected as spam",
    "drop_before_data": "",
    "drop_after_data": "",
}


@dataclass(frozen=True)
class Received:
    """One message the server took."""

    mail_from: str
    to: tuple[str, ...]
    message_id: str
    subject: str
    in_reply_to: str
    references: str
    text: str
    html: str | None
    headers: dict[str, str]


class _Handler:
    def __init__(self, fake: FakeSmtp) -> None:
        self.fake = fake

    async def handle_RCPT(self, server: Any, session: Any, envelope: Any, address: str, options: Any) -> str:
        action = self.fake.next_action(address)
        envelope.fake_action = action
        if action in ("rcpt_4xx", "rcpt_5xx"):
            return self.fake.answer(ACTIONS[action])
        if action == "drop_before_data":
            self.fake.answer("")
            server.transport.close()
            return "250 OK"  # written to a closed transport: never read
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        action = getattr(envelope, "fake_action", None)
        if action in ("data_4xx", "data_5xx"):
            return self.fake.answer(ACTIONS[action])
        self.fake.take(envelope)
        if action == "drop_after_data":
            self.fake.answer("")
            server.transport.close()
        return "250 2.0.0 Ok: queued"


class _Controller(Controller):
    def _trigger_server(self) -> None:
        # Bound to port 0: learn the port the system chose before aiosmtpd connects to it.
        self.port = self.server.sockets[0].getsockname()[1]
        super()._trigger_server()


class FakeSmtp:
    """The server; use as a context manager (it listens while inside)."""

    def __init__(self) -> None:
        self.messages: list[Received] = []
        self.statuses: Counter[int] = Counter()
        self._scripts: defaultdict[str, deque[str]] = defaultdict(deque)
        self._lock = threading.Lock()
        self._controller = _Controller(_Handler(self), hostname="127.0.0.1", port=0)

    @property
    def port(self) -> int:
        return int(self._controller.port)

    def __enter__(self) -> Self:
        self._controller.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._controller.stop()

    def script(self, recipient: str, *actions: str) -> None:
        """Answer the next messages to `recipient` with `actions`, one each, in order."""
        unknown = set(actions) - set(ACTIONS)
        if unknown:
            raise ValueError(f"unknown fake SMTP actions: {sorted(unknown)}")
        with self._lock:
            self._scripts[recipient.lower()].extend(actions)

    def next_action(self, recipient: str) -> str | None:
        with self._lock:
            queue = self._scripts.get(recipient.lower())
            return queue.popleft() if queue else None

    def answer(self, status: str) -> str:
        with self._lock:
            self.statuses[int(status[:3]) if status else 0] += 1
        return status

    def take(self, envelope: Any) -> None:
        message = email.message_from_bytes(envelope.content, policy=email.policy.default)
        plain = message.get_body(("plain",))
        html = message.get_body(("html",))
        received = Received(
            mail_from=envelope.mail_from,
            to=tuple(envelope.rcpt_tos),
            message_id=str(message["Message-ID"] or ""),
            subject=str(message["Subject"] or ""),
            in_reply_to=str(message["In-Reply-To"] or ""),
            references=str(message["References"] or ""),
            text=plain.get_content() if plain is not None else "",  # type: ignore[attr-defined]
            html=html.get_content() if html is not None else None,  # type: ignore[attr-defined]
            headers={k: str(v) for k, v in message.items()},
        )
        with self._lock:
            self.messages.append(received)

    def copies(self, message_id: str) -> list[Received]:
        with self._lock:
            return [m for m in self.messages if m.message_id == message_id]

    def to(self, recipient: str) -> list[Received]:
        """The messages taken for `recipient`, in the order they were taken."""
        with self._lock:
            return [m for m in self.messages if recipient.lower() in (t.lower() for t in m.to)]
