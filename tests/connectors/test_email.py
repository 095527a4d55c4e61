"""The email connector through Django's SMTP backend to a fake SMTP server, over real sockets
(no database); other backends (locmem, an anymail-like one) in-process."""

from __future__ import annotations

import smtplib
import socket
import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from django.core import checks, mail
from django.core.mail.backends.base import BaseEmailBackend
from django.core.mail.backends.smtp import EmailBackend as SmtpBackend

from django_connector_outbox.connectors import (
    CannotCheck,
    Delivered,
    MaybeSent,
    RateLimited,
    Refused,
    RetryLater,
)
from django_connector_outbox.connectors.email import EmailConnector, message_id
from django_connector_outbox.posts import ClaimedPost, Parent, Scope
from tests.connectors.helpers import claimed_post
from tests.fakes.smtp import FakeSmtp

TO = "ada@example.org"
FROM = "Outbox <outbox@example.com>"
BODY = {"subject": "Deploy finished", "text": "All green."}
SMTP = "django.core.mail.backends.smtp.EmailBackend"


# Django 6.1 configures mail with MAILERS (the EMAIL_* settings and get_connection are deprecated).
MAILERS = hasattr(mail, "mailers")
LEGACY_NAMES = {"host": "EMAIL_HOST", "port": "EMAIL_PORT", "password": "EMAIL_HOST_PASSWORD"}


def use_mail(settings: Any, backend: str, **options: Any) -> None:
    """Django's default mail backend is `backend` with `options`, as this Django configures it."""
    if MAILERS:
        settings.MAILERS = {"default": {"BACKEND": backend, "OPTIONS": options}}
        return
    settings.EMAIL_BACKEND = backend
    for name, value in options.items():
        setattr(settings, LEGACY_NAMES[name], value)


def smtp_at(settings: Any, port: int) -> None:
    use_mail(settings, SMTP, host="127.0.0.1", port=port)


@pytest.fixture
def fake(settings: Any) -> Iterator[FakeSmtp]:
    with FakeSmtp() as server:
        smtp_at(settings, server.port)
        yield server


@pytest.fixture
def connector() -> EmailConnector:
    return EmailConnector(source="mail", from_email=FROM, timeout=2)


def post(
    body: dict[str, Any] | None = None, *, post_id: str = "p1", to: str = TO, thread: str = ""
) -> ClaimedPost:
    return claimed_post(
        "mail", post_id, dict(BODY) if body is None else body, container_id=to, thread_id=thread
    )


def mid(post_id: str) -> str:
    return message_id("mail", post_id, "example.com")


# -- delivery -------------------------------------------------------------------------------------


def test_a_message_reaches_the_server_once_with_its_derived_message_id(fake, connector):
    body = {
        **BODY,
        "html": "<p>All <b>green</b>.</p>",
        "reply_to": "ops@example.com",
        "headers": {"X-Deploy": "42"},
    }
    outcome = connector.send(post(body))

    assert outcome == Delivered(mid("p1"))
    [received] = fake.messages
    assert received.message_id == mid("p1")
    assert (received.to, received.subject, received.text.strip()) == ((TO,), "Deploy finished", "All green.")
    assert received.html is not None and "<b>green</b>" in received.html
    assert received.mail_from == "outbox@example.com"
    assert received.headers["Reply-To"] == "ops@example.com"
    assert received.headers["X-Deploy"] == "42"


def test_the_message_id_is_the_same_for_every_send_of_a_post_and_differs_between_posts(fake, connector):
    first, again, other = connector.send(post()), connector.send(post()), connector.send(post(post_id="p2"))

    assert first == again == Delivered(mid("p1"))
    assert other == Delivered(mid("p2")) != first
    assert mid("p1").startswith("<") and mid("p1").endswith("@example.com>")
    assert len(mid("p1").split("@")[0]) == 33  # "<" and 32 hex digits


def test_the_message_id_domain_is_the_host_name_when_the_sender_has_none(fake, monkeypatch):
    monkeypatch.setattr("django_connector_outbox.connectors.email.DNS_NAME", "mail.host.test")
    connector = EmailConnector(source="mail", from_email="outbox")

    assert connector.domain == "mail.host.test"


def test_messages_through_the_default_backend_use_settings(settings):
    use_mail(settings, "django.core.mail.backends.locmem.EmailBackend")
    settings.DEFAULT_FROM_EMAIL = "default@example.net"
    connector = EmailConnector(source="mail")

    outcome = connector.send(post())

    assert outcome == Delivered(message_id("mail", "p1", "example.net"))
    [sent] = mail.outbox
    assert (sent.to, sent.from_email, sent.extra_headers["Message-ID"]) == (
        [TO],
        "default@example.net",
        outcome.message_ref,
    )


# -- bad posts are refused, never sent ------------------------------------------------------------


@pytest.mark.parametrize("to", ["not-an-address", "Ada <ada@example.org>", "ada@", "a@b.c, d@e.f"])
def test_a_container_that_is_not_an_address_is_refused(fake, connector, to):
    outcome = connector.send(post(to=to))

    assert isinstance(outcome, Refused) and "not an email address" in outcome.reason
    assert fake.messages == []


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"text": "no subject"}, "'subject'"),
        ({"subject": "no text"}, "'text'"),
        ({**BODY, "html": 3}, "'html'"),
        ({**BODY, "reply_to": [1]}, "'reply_to'"),
        ({**BODY, "headers": {"message-ID": "<x@y>"}}, "may not set message-ID"),
        ({**BODY, "headers": {"From": "boss@example.com", "To": "x@example.com"}}, "may not set From, To"),
        ({**BODY, "headers": {"X-Evil": "a\r\nBcc: victim@example.com"}}, "cannot be built"),
        ({**BODY, "subject": "Hi\nBcc: victim@example.com"}, "cannot be built"),
    ],
)
def test_a_bad_body_is_refused_and_nothing_is_sent(fake, connector, body, words):
    outcome = connector.send(post(body))

    assert isinstance(outcome, Refused), outcome
    assert words in outcome.reason
    assert fake.messages == []


# -- threads --------------------------------------------------------------------------------------


def test_a_reply_answers_its_parent_and_names_the_whole_thread(fake, connector):
    root = connector.send(post(post_id="root"))
    assert isinstance(root, Delivered) and root.message_ref
    reply = connector.send(post(post_id="reply-1", thread=root.message_ref))
    assert isinstance(reply, Delivered) and reply.message_ref
    parent = Parent(
        post_id="reply-1", state="posted", message_ref=reply.message_ref, thread_id=root.message_ref
    )
    thread = connector.reply_thread(parent)
    nested = replace(post(post_id="reply-2", thread=thread), parent=parent)

    assert thread == reply.message_ref
    assert connector.send(nested) == Delivered(mid("reply-2"))
    _, first, second = fake.messages
    assert (first.in_reply_to, first.references, first.subject) == (
        root.message_ref,
        root.message_ref,
        "Re: Deploy finished",
    )
    assert second.in_reply_to == reply.message_ref
    assert second.references.split() == [root.message_ref, reply.message_ref]


def test_a_reply_keeps_a_subject_that_already_says_re(fake, connector):
    connector.send(post({**BODY, "subject": "RE: Deploy"}, thread=mid("root")))

    assert fake.messages[0].subject == "RE: Deploy"


def test_a_thread_that_is_not_a_message_id_is_refused(fake, connector):
    outcome = connector.send(post(thread="C0123 not a message id"))

    assert isinstance(outcome, Refused) and "not a Message-ID" in outcome.reason
    assert fake.messages == []


# -- SMTP answers ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("action", "outcome_class", "code"),
    [
        ("rcpt_4xx", RetryLater, "450"),
        ("rcpt_5xx", Refused, "550"),
        ("data_4xx", RetryLater, "451"),
        ("data_5xx", Refused, "554"),
    ],
)
def test_coded_answers_are_transient_when_4xx_and_permanent_when_5xx(
    fake, connector, action, outcome_class, code
):
    fake.script(TO, action)

    outcome = connector.send(post())

    assert type(outcome) is outcome_class
    assert code in outcome.reason
    assert fake.messages == []
    assert connector.send(post()) == Delivered(mid("p1")), "the script answered one message only"


def test_a_connection_dropped_before_data_is_retried_since_nothing_was_handed_over(fake, connector):
    fake.script(TO, "drop_before_data")

    outcome = connector.send(post())

    assert isinstance(outcome, RetryLater) and "before the message was handed over" in outcome.reason
    assert fake.messages == []


def test_a_connection_dropped_after_data_may_have_sent_the_message(fake, connector):
    fake.script(TO, "drop_after_data")

    outcome = connector.send(post())

    assert isinstance(outcome, MaybeSent) and "after the message was handed over" in outcome.reason
    assert len(fake.copies(mid("p1"))) == 1


def test_no_server_listening_is_retried(settings, connector):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        smtp_at(settings, closed.getsockname()[1])

    outcome = connector.send(post())

    assert isinstance(outcome, RetryLater) and "ConnectionRefusedError" in outcome.reason


class ScriptedServer:
    """A raw SMTP peer for the moments aiosmtpd's hooks cannot reach: it answers the commands
    up to DATA, then does what `at_data` says: "close" (no 354), or "silent" (354, reads the
    whole message, then never answers)."""

    def __init__(self, at_data: str) -> None:
        self.at_data = at_data
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.got_body = threading.Event()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn, conn.makefile("rb") as lines:
            conn.sendall(b"220 scripted ESMTP\r\n")
            for line in lines:
                verb = line[:4].upper()
                if verb == b"DATA":
                    if self.at_data == "close":
                        return
                    conn.sendall(b"354 End data with <CR><LF>.<CR><LF>\r\n")
                    for body_line in lines:
                        if body_line == b".\r\n":
                            self.got_body.set()
                            break
                    self.done.wait(10)  # silent: the client times out waiting for the reply
                    return
                conn.sendall(b"221 bye\r\n" if verb == b"QUIT" else b"250 ok\r\n")

    def close(self) -> None:
        self.done.set()
        self.thread.join(10)
        self.listener.close()


@pytest.mark.parametrize(
    ("at_data", "expected", "handed_over"),
    [("close", RetryLater, False), ("silent", MaybeSent, True)],
)
def test_the_hand_over_is_the_354_answer_to_data(settings, at_data, expected, handed_over):
    server = ScriptedServer(at_data)
    smtp_at(settings, server.port)
    connector = EmailConnector(source="mail", from_email=FROM, timeout=0.5)
    try:
        outcome = connector.send(post())
    finally:
        server.close()

    assert type(outcome) is expected, outcome
    assert server.got_body.is_set() is handed_over


def test_find_sent_cannot_check(connector):
    with pytest.raises(CannotCheck, match="cannot look a message up"):
        connector.find_sent(replace(post(), stale=True))


# -- other backends -------------------------------------------------------------------------------


class AnymailError(Exception):  # the names anymail's exceptions have: matched by name
    def __init__(self, *args: Any, status_code: int | None = None, response: Any = None) -> None:
        super().__init__(*args)
        self.status_code, self.response, self.esp_name = status_code, response, "Fakemail"


class AnymailAPIError(AnymailError):
    pass


class AnymailRecipientsRefused(AnymailError):
    pass


class NewConnectionError(Exception):
    pass


class ReadTimeout(Exception):
    pass


class Response:
    def __init__(self, headers: dict[str, str]) -> None:
        self.headers = headers


class RaisingBackend(BaseEmailBackend):
    """Raises `error` from every send, as an ESP backend does; holds an API key."""

    error: BaseException | None = None

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.api_key = "fakemail-API-KEY-93fd1c"

    def send_messages(self, email_messages: Any) -> int:
        assert self.error is not None
        raise self.error


def connection_error(kind: type[Exception]) -> AnymailAPIError:
    error = AnymailAPIError("Error posting to https://api.fakemail.test/send")
    error.__cause__ = kind("boom")
    return error


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (AnymailAPIError("slow down", status_code=429, response=Response({"Retry-After": "7"})), RateLimited),
        (AnymailAPIError("unavailable", status_code=503), RetryLater),
        (AnymailAPIError("bad gateway", status_code=502), MaybeSent),
        (AnymailAPIError("bad request", status_code=400), Refused),
        (AnymailRecipientsRefused("All message recipients were rejected"), Refused),
        (connection_error(NewConnectionError), RetryLater),
        (connection_error(ReadTimeout), MaybeSent),
    ],
)
def test_anymail_errors_are_mapped_by_their_status(settings, monkeypatch, error, expected):
    monkeypatch.setattr(RaisingBackend, "error", error)
    use_mail(settings, f"{__name__}.RaisingBackend")
    connector = EmailConnector(source="mail", from_email=FROM)

    outcome = connector.send(post())

    assert type(outcome) is expected, outcome
    assert "Fakemail" in outcome.reason
    if isinstance(outcome, RateLimited):
        assert (outcome.after, outcome.scope) == (7.0, Scope.SOURCE)


def test_an_unknown_backend_error_is_raised_for_the_sender_to_retry(settings, monkeypatch):
    monkeypatch.setattr(RaisingBackend, "error", KeyError("surprise"))
    use_mail(settings, f"{__name__}.RaisingBackend")
    connector = EmailConnector(source="mail", from_email=FROM)

    with pytest.raises(KeyError):
        connector.send(post())


class EchoingSmtpBackend(SmtpBackend):
    """An SMTP backend whose server echoes the password in its refusal."""

    def open(self) -> bool:
        raise smtplib.SMTPAuthenticationError(535, f"5.7.8 bad credentials {self.password}".encode())


def test_no_credential_of_the_backend_is_in_a_reason(settings):
    use_mail(settings, f"{__name__}.EchoingSmtpBackend", host="127.0.0.1", password="smtp-PASSWORD-5b1e77d0")
    connector = EmailConnector(source="mail", from_email=FROM)

    outcome = connector.send(post())

    assert isinstance(outcome, Refused) and "535" in outcome.reason
    assert "smtp-PASSWORD-5b1e77d0" not in outcome.reason


# -- configuration --------------------------------------------------------------------------------


def test_a_good_configuration_has_no_check_messages(settings, connector):
    smtp_at(settings, 25)

    assert connector.check() == []
    assert EmailConnector.pace == {}
    assert EmailConnector.kinds == frozenset({"message"})


def test_bad_options_are_reported_by_their_checks(settings):
    smtp_at(settings, 25)
    connector = EmailConnector(
        source="mail", from_email="not an address", connection="no.such.Backend", timeout=-1
    )
    where = "CONNECTOR_OUTBOX source 'mail'"
    if MAILERS:
        connection = checks.Error(
            f"{where}: the email connection 'no.such.Backend' is not an alias of MAILERS.",
            hint="With MAILERS (Django 6.1+), name one of its aliases, or leave it out for 'default'.",
            id="connector_outbox.E262",
        )
    else:
        connection = checks.Error(
            f"{where}: the email connection 'no.such.Backend' cannot be imported: No module named 'no'.",
            hint="Leave OPTIONS['connection'] out to use EMAIL_BACKEND, or name a backend such as "
            "'django.core.mail.backends.smtp.EmailBackend'.",
            id="connector_outbox.E262",
        )

    assert connector.check() == [
        checks.Error(
            f"{where}: the email sender 'not an address' is not an email address.",
            hint="Set OPTIONS['from_email'] (or DEFAULT_FROM_EMAIL) to 'name@example.com' "
            "or 'Name <name@example.com>'.",
            id="connector_outbox.E261",
        ),
        connection,
        checks.Error(
            f"{where}: OPTIONS['timeout'] must be a positive number of seconds (or a timedelta), not -1.",
            id="connector_outbox.E263",
        ),
    ]


@pytest.mark.skipif(MAILERS, reason="with MAILERS the connection is an alias, not a class")
def test_a_connection_that_is_not_an_email_backend_is_reported():
    connector = EmailConnector(source="mail", from_email=FROM, connection="collections.OrderedDict")

    [error] = connector.check()

    assert error.id == "connector_outbox.E262"
    assert "is not a Django email backend" in error.msg
