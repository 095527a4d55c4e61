"""Email, through Django's own mail API, so that every EMAIL_BACKEND works (SMTP, django-anymail's
ESP backends, the console and locmem backends of development and tests).

Place: ``container_id`` is the recipient's address (posts to one recipient go in queue order),
``workspace_id`` is free (the project's own grouping), ``thread_id`` the Message-ID that a reply
answers, and ``message_ref`` the post's Message-ID. A body is ``subject``, ``text``, optional
``html``, ``reply_to`` (an address or a list) and ``headers`` (that may not set Message-ID,
From or To). A Message is rendered as text and HTML, its title the subject (email_render.py).

Each post's Message-ID is derived from its source and post id (`message_id`): the same post
sent twice carries the same Message-ID, which a receiving server or mailbox may use to drop the
second copy. It is not a lookup: no mail API tells a sender whether a message was delivered,
so `find_sent` raises `CannotCheck`, and a message whose SMTP connection dropped after it was
handed over (smtp.py) ends `uncertain`, never sent twice.
"""

from __future__ import annotations

import hashlib
import logging
import math
from dataclasses import replace
from datetime import timedelta
from email.utils import parseaddr
from typing import Any

from django.conf import settings
from django.core import checks, mail
from django.core.exceptions import ValidationError
from django.core.mail import EmailMultiAlternatives
from django.core.mail.backends.base import BaseEmailBackend
from django.core.mail.backends.smtp import EmailBackend as SmtpBackend
from django.core.mail.utils import DNS_NAME
from django.core.validators import validate_email
from django.utils.module_loading import import_string
from django.utils.translation import gettext

from django_connector_outbox.connectors.base import (
    CannotCheck,
    Connector,
    Delivered,
    MaybeSent,
    Outcome,
    RateLimited,
    Refused,
    RetryLater,
)
from django_connector_outbox.connectors.email_render import render_email
from django_connector_outbox.connectors.smtp import MAX_REPLY, HandOver, smtp_outcome
from django_connector_outbox.connectors.text import scrub
from django_connector_outbox.message import Message
from django_connector_outbox.posts import ClaimedPost, Kind, Parent, Scope

logger = logging.getLogger("django_connector_outbox.connectors")

# Seconds each SMTP command (connect, EHLO, ..., the final reply to DATA) may wait, as
# EMAIL_TIMEOUT: Django's default (None) would let a silent server hold a sender for ever.
DEFAULT_TIMEOUT = 30.0
# Headers that make the message what the outbox says it is: its identity and its place.
RESERVED_HEADERS = frozenset({"message-id", "from", "to"})
# The name of a backend attribute that holds a credential (EMAIL_HOST_PASSWORD, an ESP's key).
SECRET_WORDS = ("password", "key", "token", "secret")


def message_id(source: str, post_id: str, domain: str) -> str:
    """``<32 hex digits@domain>``: the same for every send of one post (RFC 5322 §3.6.4)."""
    digest = hashlib.sha256(f"{source}:{post_id}".encode()).hexdigest()[:32]
    return f"<{digest}@{domain}>"


def _domain(from_email: str) -> str:
    """The domain of `from_email` in ASCII (IDNA), else this host's name as Django's own
    Message-IDs use it."""
    _, address = parseaddr(from_email)
    _, at, domain = address.rpartition("@")
    domain = domain.strip() if at else ""
    try:
        return domain.encode("idna").decode("ascii") if domain else str(DNS_NAME)
    except UnicodeError:
        return str(DNS_NAME)


class EmailConnector(Connector):
    """One email per post, to the post's container (an address), through a Django mail backend."""

    kinds = frozenset({Kind.MESSAGE})
    # No lookup: find_sent makes no request.
    lookup_requests = 0
    # None: SMTP providers' limits differ by plan and account (messages per second, per day,
    # recipients per hour); set the source's PACE to your provider's.

    def __init__(
        self,
        source: str,
        *,
        from_email: Any = None,
        connection: Any = None,
        timeout: Any = DEFAULT_TIMEOUT,
    ) -> None:
        super().__init__(source)
        self._from_option = from_email
        self.from_email = str(from_email or settings.DEFAULT_FROM_EMAIL)
        self.connection = connection
        self._timeout_option = timeout
        # A bad value is reported by check(); until then the default keeps the connector usable.
        self.timeout = _positive_seconds(timeout) or DEFAULT_TIMEOUT
        self.domain = _domain(self.from_email)

    def __repr__(self) -> str:
        return f"<EmailConnector source={self.source!r} connection={self.connection!r}>"

    # -- sending ----------------------------------------------------------------------

    def render(self, message: Message) -> dict[str, Any]:
        return render_email(message)

    def send(self, post: ClaimedPost) -> Outcome:
        if post.kind != Kind.MESSAGE:
            return Refused(f"email cannot send a {post.kind!r} post")
        built = self.build_message(post)
        if isinstance(built, Refused):
            return built
        try:
            built.message()  # rendered once first: a header Python's email refuses is this post's fault
        except (ValueError, TypeError) as exc:  # Django < 6.0: BadHeaderError, a ValueError
            return Refused(f"email message cannot be built: {type(exc).__name__}: {str(exc)[:MAX_REPLY]}")
        backend = self.open_backend()
        ref = built.extra_headers["Message-ID"]
        watch = HandOver()
        try:
            if isinstance(backend, SmtpBackend):
                backend.open()  # connect, STARTTLS, AUTH: nothing handed over yet
                if backend.connection is not None:
                    watch.watch(backend.connection)
            sent = backend.send_messages([built])
        except Exception as exc:
            outcome = self._outcome(exc, backend, watch)
            if outcome is None:
                raise
            return outcome
        finally:
            _close(backend)
        if not sent:
            return RetryLater(f"email backend {type(backend).__name__} sent nothing and raised nothing")
        return Delivered(ref)

    def open_backend(self) -> BaseEmailBackend:
        """A new backend instance (one per send: an SMTP connection is not shared by threads).

        Django 6.1+ with MAILERS: `connection` is a mailer's alias ("default" unless given).
        Otherwise `connection` is a backend's dotted path; without one, Django's default
        (EMAIL_BACKEND, or Django 6.1's default mailer).
        An SMTP backend gets this connector's `timeout`, which the LEASE accounts for.
        """
        backend: BaseEmailBackend
        if hasattr(mail, "mailers") and (self.connection is None or _uses_mailers()):
            # Without MAILERS, Django 6.1 builds its default mailer from the EMAIL_* settings.
            backend = mail.mailers[self.connection or "default"]
        else:
            backend = mail.get_connection(backend=self.connection, fail_silently=False, timeout=self.timeout)
        if isinstance(backend, SmtpBackend):
            backend.timeout = self.timeout
        return backend

    def build_message(self, post: ClaimedPost) -> EmailMultiAlternatives | Refused:
        """The email of `post`, or why it cannot be one (a bad body is refused, never sent)."""
        to = post.container_id
        try:
            validate_email(to)
        except ValidationError:
            return Refused(f"email container_id {to[:100]!r} is not an email address")
        body = post.body
        subject, text, html = body.get("subject"), body.get("text"), body.get("html")
        if not isinstance(subject, str) or not subject.strip() or not isinstance(text, str):
            return Refused("email body needs a non-empty 'subject' and a 'text' (strings)")
        if html is not None and not isinstance(html, str):
            return Refused("email body 'html' must be a string")
        reply_to = body.get("reply_to") or []
        reply_to = [reply_to] if isinstance(reply_to, str) else reply_to
        if not isinstance(reply_to, list) or not all(isinstance(a, str) for a in reply_to):
            return Refused("email body 'reply_to' must be an address or a list of addresses")
        headers = body.get("headers") or {}
        if not isinstance(headers, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
        ):
            return Refused("email body 'headers' must map header names to strings")
        reserved = sorted(k for k in headers if k.strip().lower() in RESERVED_HEADERS)
        if reserved:
            return Refused(f"email body 'headers' may not set {', '.join(reserved)}: the outbox sets them")
        headers = dict(headers)
        if post.thread_id:
            references = _references(post.thread_id, post.parent)
            if references is None:
                return Refused(f"email thread_id {post.thread_id[:100]!r} is not a Message-ID")
            headers["In-Reply-To"] = post.thread_id
            headers["References"] = references
            if not subject.lower().startswith("re:"):
                subject = f"Re: {subject}"
        headers["Message-ID"] = message_id(self.source, post.post_id, self.domain)
        message = EmailMultiAlternatives(
            subject=subject,
            body=text,
            from_email=self.from_email,
            to=[to],
            reply_to=reply_to,
            headers=headers,
        )
        if html is not None:
            message.attach_alternative(html, "text/html")
        return message

    def _outcome(self, exc: Exception, backend: BaseEmailBackend, watch: HandOver) -> Outcome | None:
        """`exc` as an outcome, its text scrubbed of the backend's credentials."""
        if isinstance(backend, SmtpBackend):
            outcome = smtp_outcome(exc, handed_over=watch.handed_over)
        else:
            outcome = anymail_outcome(exc)
        if outcome is None:
            return None
        if isinstance(outcome, Delivered):  # never: errors are not deliveries
            return outcome
        return replace(outcome, reason=scrub(outcome.reason, _backend_secrets(backend)))

    def find_sent(self, post: ClaimedPost) -> str | None:
        # SMTP has no way to ask whether a message was taken (the server answers once, to the
        # final dot), and no mail API keeps a history that a sender can search by Message-ID.
        raise CannotCheck("email cannot look a message up: no mail backend can tell whether it was taken")

    def reply_thread(self, parent: Parent) -> str:
        """The parent's Message-ID: a reply answers that message (In-Reply-To), even when the
        parent is itself a reply (References then names both)."""
        return parent.message_ref or ""

    # -- configuration ----------------------------------------------------------------

    def check(self) -> list[checks.CheckMessage]:
        """connector_outbox.E261 from_email, E262 connection, E263 timeout."""
        errors: list[checks.CheckMessage] = []
        _, address = parseaddr(self.from_email)
        try:
            if not isinstance(self._from_option, (str, type(None))):
                raise ValidationError("not a string")
            validate_email(address)
        except ValidationError:
            errors.append(
                checks.Error(
                    gettext(
                        "CONNECTOR_OUTBOX source %(source)r: the email sender %(sender)r is not an email address."
                    )
                    % {"source": self.source, "sender": self.from_email[:100]},
                    hint=gettext(
                        "Set OPTIONS['from_email'] (or DEFAULT_FROM_EMAIL) to 'name@example.com' or "
                        "'Name <name@example.com>'."
                    ),
                    id="connector_outbox.E261",
                )
            )
        errors += self._check_connection()
        if _positive_seconds(self._timeout_option) is None:
            errors.append(
                checks.Error(
                    gettext(
                        "CONNECTOR_OUTBOX source %(source)r: OPTIONS['timeout'] must be a positive number of "
                        "seconds (or a timedelta), not %(value)r."
                    )
                    % {"source": self.source, "value": self._timeout_option},
                    id="connector_outbox.E263",
                )
            )
        return errors

    def _check_connection(self) -> list[checks.CheckMessage]:
        option = self.connection
        problem = hint = None
        error = ""
        if not isinstance(option, (str, type(None))):
            problem = gettext(
                "CONNECTOR_OUTBOX source %(source)r: the email connection %(connection)r must be a string."
            )
        elif option is None:
            pass  # Django's default mailer: Django checks its own settings
        elif _uses_mailers():
            if option not in getattr(settings, "MAILERS", {}):
                problem = gettext(
                    "CONNECTOR_OUTBOX source %(source)r: the email connection %(connection)r is not an alias of "
                    "MAILERS."
                )
                hint = gettext(
                    "With MAILERS (Django 6.1+), name one of its aliases, or leave it out for 'default'."
                )
        else:
            try:
                backend = import_string(option)
            except Exception as exc:  # noqa: BLE001 - ImportError, or whatever the module raises
                problem = gettext(
                    "CONNECTOR_OUTBOX source %(source)r: the email connection %(connection)r cannot be "
                    "imported: %(error)s."
                )
                error = str(exc)
            else:
                if not (isinstance(backend, type) and issubclass(backend, BaseEmailBackend)):
                    problem = gettext(
                        "CONNECTOR_OUTBOX source %(source)r: the email connection %(connection)r is not a Django "
                        "email backend (a BaseEmailBackend subclass)."
                    )
            hint = gettext(
                "Leave OPTIONS['connection'] out to use EMAIL_BACKEND, or name a backend such as "
                "'django.core.mail.backends.smtp.EmailBackend'."
            )
        if problem is None:
            return []
        return [
            checks.Error(
                problem % {"source": self.source, "connection": option, "error": error},
                hint=hint,
                id="connector_outbox.E262",
            )
        ]


def _uses_mailers() -> bool:
    """Django 6.1+ with MAILERS set: mail goes through `mailers[alias]` (get_connection and the
    EMAIL_* settings are deprecated there, and get_connection refuses a backend path)."""
    return hasattr(mail, "mailers") and hasattr(settings, "MAILERS")


def anymail_outcome(exc: Exception) -> Outcome | None:
    """django-anymail's errors (matched by class name: anymail is not a dependency)."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    if "AnymailError" not in names:
        return None
    status = getattr(exc, "status_code", None)
    esp = getattr(exc, "esp_name", None) or "ESP"
    reason = f"{esp} {' '.join(str(exc).split())[:MAX_REPLY]}"
    if "AnymailAPIError" not in names:
        # Refused recipients, an invalid address, a feature the ESP lacks, data it cannot
        # serialize: this message will never go, whenever it is tried.
        return Refused(f"anymail {type(exc).__name__}: {reason}")
    if not isinstance(status, int):
        # No answer from the ESP's API: before the request left, or after?
        if _never_left(exc):
            return RetryLater(f"anymail: not sent: {reason}")
        return MaybeSent(f"anymail: no answer: {reason}")
    if status == 429:
        # An ESP's rate limit is its account's (or API key's): every recipient would get it.
        return RateLimited(_retry_after(exc), f"anymail HTTP 429: {reason}", Scope.SOURCE)
    if status in (502, 504):
        # A gateway lost the API's answer: the ESP may have queued the message.
        return MaybeSent(f"anymail HTTP {status}: {reason}")
    if status >= 500 or status == 408:
        return RetryLater(f"anymail HTTP {status}: {reason}")
    return Refused(f"anymail HTTP {status}: {reason}")


def _never_left(exc: BaseException) -> bool:
    """Whether requests' error under an anymail error failed to connect (urllib3's
    NewConnectionError, a name resolution or connect timeout): nothing reached the ESP."""
    not_sent = {"ConnectTimeout", "ConnectTimeoutError", "NewConnectionError", "NameResolutionError"}
    seen: set[int] = set()
    todo: list[Any] = [exc.__cause__, exc.__context__]
    while todo:
        error = todo.pop()
        if error is None or id(error) in seen:
            continue
        seen.add(id(error))
        if not_sent & {cls.__name__ for cls in type(error).__mro__}:
            return True
        todo += [getattr(error, "reason", None), getattr(error, "__cause__", None)]
        todo += [arg for arg in getattr(error, "args", ()) if isinstance(arg, BaseException)]
    return False


def _retry_after(exc: Exception) -> float:
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None) or {}
    try:
        after = float(headers.get("Retry-After", ""))
    except (TypeError, ValueError):
        return 60.0  # an ESP's limits are per minute or per second; wait one window
    return after if math.isfinite(after) and after >= 0 else 60.0


def _references(thread_id: str, parent: Parent | None) -> str | None:
    """The References header of a reply to `thread_id`: the parent's own parent first when
    it is a reply too (RFC 5322 §3.6.4), or None if `thread_id` is not a Message-ID."""
    ids = [parent.thread_id] if parent is not None and parent.thread_id else []
    ids.append(thread_id)
    if not all(_is_message_id(i) for i in ids):
        return None
    return " ".join(ids)


def _is_message_id(value: str) -> bool:
    return (
        value.startswith("<")
        and value.endswith(">")
        and "@" in value
        and value.isascii()
        and value.isprintable()
        and not any(c.isspace() for c in value)
    )


def _backend_secrets(backend: BaseEmailBackend) -> list[str]:
    return [
        value
        for name, value in vars(backend).items()
        if isinstance(value, str) and any(word in name.lower() for word in SECRET_WORDS)
    ]


def _close(backend: BaseEmailBackend) -> None:
    """Close the backend's connection; a failed QUIT changes nothing about the message."""
    try:
        backend.close()
    except Exception:  # noqa: BLE001 - the outcome is already known
        logger.debug("email backend close failed", exc_info=True)


def _positive_seconds(value: Any) -> float | None:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None
