"""What one SMTP conversation says about a message: whether the server was handed it, and
what smtplib's errors mean for the outbox.

Invariant: a message counts as possibly sent (`MaybeSent`) only once the server has answered
``354`` to ``DATA``, since only then may its bytes reach the server; every failure before that
point (connect, ``EHLO``, ``STARTTLS``, ``AUTH``, ``MAIL``, ``RCPT``, or ``DATA`` itself) left
nothing the server could deliver, so the message may be sent again (`RetryLater`). A coded
reply is never ambiguous: RFC 5321 §4.2.1, 4yz "transient negative", 5yz "permanent negative".

How "handed over" is told apart: Django's SMTP backend sends through
``smtplib.SMTP.sendmail``, whose ``data()`` writes ``DATA``, reads the reply (it must be 354),
then writes the whole message with its final ``<CRLF>.<CRLF>`` and reads the final reply. `HandOver`
wraps ``data`` and ``getreply`` of that one connection object (not the class): the first reply
read inside ``data`` is the answer to ``DATA``, and a 354 there marks the message as handed
over. A dropped connection or a timeout after that mark (while the body is written, or while
the final reply is awaited) may follow a server that took the message: RFC 1047 ("Duplicate
messages and SMTP") describes this gap between the final dot and its 250, and the duplicates
that a sender re-sending after it makes.
"""

from __future__ import annotations

import smtplib
from collections.abc import Callable
from typing import Any

from django_connector_outbox.connectors.base import MaybeSent, Outcome, Refused, RetryLater

# Reply texts are the server's: cut short, a reason is a line in the admin, not a transcript.
MAX_REPLY = 200


class HandOver:
    """Watches one ``smtplib.SMTP`` connection for the moment a message body may reach the
    server (the ``354`` answer to ``DATA``). One per send: it is not shared between threads."""

    def __init__(self) -> None:
        self.handed_over = False
        self._answer_to_data = False

    def watch(self, smtp: smtplib.SMTP) -> None:
        """Wrap `smtp`'s ``data`` and ``getreply`` (on this instance only)."""
        data: Callable[[Any], tuple[int, bytes]] = smtp.data
        getreply: Callable[[], tuple[int, bytes]] = smtp.getreply

        def watched_data(msg: Any) -> tuple[int, bytes]:
            self._answer_to_data = True  # the next reply read answers DATA
            try:
                return data(msg)
            finally:
                self._answer_to_data = False

        def watched_getreply() -> tuple[int, bytes]:
            reply = getreply()  # raises SMTPServerDisconnected on EOF, reset or timeout
            if self._answer_to_data:
                self._answer_to_data = False
                self.handed_over = reply[0] == 354
            return reply

        smtp.data = watched_data  # type: ignore[method-assign]
        smtp.getreply = watched_getreply  # type: ignore[method-assign]


def smtp_outcome(exc: BaseException, *, handed_over: bool) -> Outcome | None:
    """The outcome of an error raised while sending through smtplib, or None if it is not one
    of smtplib's (or a socket's)."""
    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        # One recipient per post: its own code says which it is.
        codes = [code for code, _ in exc.recipients.values()] or [0]
        replies = "; ".join(f"{code} {_text(text)}" for code, text in exc.recipients.values())
        reason = f"smtp recipient refused: {replies}"
        return Refused(reason) if all(500 <= code < 600 for code in codes) else RetryLater(reason)
    if isinstance(exc, smtplib.SMTPResponseException):
        return coded_outcome(exc.smtp_code, exc.smtp_error, type(exc).__name__)
    if isinstance(exc, smtplib.SMTPServerDisconnected) or (
        isinstance(exc, OSError) and not isinstance(exc, smtplib.SMTPException)
    ):
        # smtplib turns a reset, EOF or timeout while reading into SMTPServerDisconnected; a
        # bare OSError (SMTPException is one too) is a refused connection, DNS, TLS, a reset
        # while writing.
        what = f"{type(exc).__name__}: {str(exc)[:MAX_REPLY]}".rstrip(": ")
        if handed_over:
            return MaybeSent(f"smtp connection lost after the message was handed over ({what})")
        return RetryLater(f"smtp connection lost before the message was handed over ({what})")
    if isinstance(exc, smtplib.SMTPException):
        # SMTPNotSupportedError (no STARTTLS, no AUTH, no SMTPUTF8) and the like: a server
        # that cannot take this message yet nothing was handed over.
        return RetryLater(f"smtp {type(exc).__name__}: {str(exc)[:MAX_REPLY]}")
    return None


def coded_outcome(code: int, text: bytes | str, name: str = "") -> Outcome:
    """A reply code's outcome: 4yz transient, 5yz permanent (RFC 5321 §4.2.1); any other
    code where an error was expected (a server speaking nonsense): transient."""
    reason = f"smtp {code} {_text(text)}".strip()
    if name:
        reason = f"{reason} ({name})"
    if 500 <= code < 600:
        return Refused(reason)
    return RetryLater(reason)


def _text(text: bytes | str) -> str:
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    return " ".join(text.split())[:MAX_REPLY]
