"""The connector contract: what a platform integration implements, and what it may answer.

A connector turns one claimed post into one platform call and reports what happened as an
outcome. It never retries, sleeps or touches the database: every outcome goes back to the
outbox, which owns backoff, holds, lookups and fencing.

Its calls come in two forms: coroutines (`asend`, `afind_sent`, `aclose`), which the sender's
event loop awaits, and blocking methods (`send`, `find_sent`, `close`). A connector defines
either or both; each coroutine's default runs its blocking twin through `blocking`, on the
sender's bounded pool of threads, so a connector written before coroutines works unchanged,
and the sender never calls a blocking method a connector did not define.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from django.core import checks

from django_connector_outbox.connectors.text_render import plain_text
from django_connector_outbox.message import Message, message_of
from django_connector_outbox.posts import ClaimedPost, Kind, Parent, Scope

logger = logging.getLogger("django_connector_outbox.connectors")

T = TypeVar("T")

#: How the coroutines' defaults run a blocking method: None for the running loop's default
#: executor (the sender's bounded pool), or a runner the delivery sets for its own context
#: (a test's delivery on the caller's thread, so that it sees the test's transaction).
run_blocking: contextvars.ContextVar[Callable[[Callable[[], Any]], Awaitable[Any]] | None] = (
    contextvars.ContextVar("run_blocking", default=None)
)


#: The most sends in flight at once on this task's loop (run_outbox's ``--concurrency``), set
#: by the sender's engine for each delivery; None elsewhere. A coroutine connector sizes its
#: client's connection pool by it (connectors/http.py).
in_flight_limit: contextvars.ContextVar[int | None] = contextvars.ContextVar("in_flight_limit", default=None)


class NotStarted(Exception):
    """Raised by a `run_blocking` runner for a blocking call it refused to start (the sender
    is stopping): nothing of it reached the platform, and its claim is given back."""


async def blocking(call: Callable[..., T], /, *args: Any) -> T:
    """`call(*args)` off the event loop: through `run_blocking` where a delivery set one, else
    on the loop's default executor (asyncio.to_thread, which copies the context)."""
    bound = functools.partial(call, *args)
    runner = run_blocking.get()
    if runner is not None:
        result: T = await runner(bound)
        return result
    return await asyncio.to_thread(bound)


def sends_in_threads(connector: Connector) -> bool:
    """Whether `connector`'s sends run its blocking `send` (it did not define `asend`): each
    then holds a thread of the sender's pool while it runs."""
    return type(connector).asend is Connector.asend


def native(connector: Connector, post: ClaimedPost) -> ClaimedPost:
    """`post` as `connector` is handed it: a stored Message replaced by `connector.render`'s
    native body (once per delivery, for the lookup and the send alike); any other post as it is.
    Raises what `render` raises."""
    message = message_of(post.body)
    if message is None:
        return post
    return dataclasses.replace(post, body=connector.render(message))


def _known_scope(outcome: Hold | RateLimited) -> None:
    """Make `outcome.scope` a `Scope`; an unknown one (a third-party connector's typo) holds
    the container, the narrowest wait, and says so in the reason rather than stop a sender."""
    try:
        scope = Scope(outcome.scope)
    except ValueError:
        logger.warning("unknown rate-limit scope %r from a connector: held the container", outcome.scope)
        note = f"(unknown scope {outcome.scope!r}: held the container)"
        object.__setattr__(outcome, "reason", f"{outcome.reason} {note}" if outcome.reason else note)
        scope = Scope.CONTAINER
    object.__setattr__(outcome, "scope", scope)


@dataclass(frozen=True)
class Hold:
    """Wait `after` seconds before the next request of `scope` (a Scope): the platform said
    so along with a success (Discord's ``X-RateLimit-Remaining: 0``), before any refusal."""

    after: float
    reason: str = ""
    scope: str = Scope.CONTAINER

    def __post_init__(self) -> None:
        _known_scope(self)


@dataclass(frozen=True)
class Delivered:
    """The platform took the post; `message_ref` is its id there, if it gives one.

    `hold`, when set, is a wait the platform announced with its answer: the post is posted,
    and then its container (workspace, source: `hold.scope`) waits `hold.after` seconds.
    """

    message_ref: str | None = None
    hold: Hold | None = None


@dataclass(frozen=True)
class RetryLater:
    """Not delivered, for a reason that may pass: retried after `after` seconds or the backoff."""

    reason: str = ""
    after: float | None = None


@dataclass(frozen=True)
class RateLimited:
    """The platform asked to wait `after` seconds; no attempt is spent.

    `scope` (a `Scope`) is how far the limit reaches: the post's container, every container
    of its workspace, or the whole source. An unknown scope holds the container (and the
    reason says so), so a connector's mistake never stops a sender.
    """

    after: float
    reason: str = ""
    scope: str = Scope.CONTAINER

    def __post_init__(self) -> None:
        _known_scope(self)


@dataclass(frozen=True)
class Refused:
    """The platform refused the post for good (bad payload, no access, gone channel)."""

    reason: str


@dataclass(frozen=True)
class MaybeSent:
    """The reply was lost after the request left: the post may be in the platform.

    The claim is left as it is; once its lease ends it is claimed back as stale and looked up
    with `find_sent` before anything is sent again.
    """

    reason: str = ""


Outcome = Delivered | RetryLater | RateLimited | Refused | MaybeSent


class CannotCheck(Exception):
    """The platform can never tell whether this post is there (the post becomes uncertain)."""


class CheckLater(Exception):
    """The platform cannot tell now (the lookup failed or was rate-limited); ask again later."""


class Connector:
    """Base class of every connector; subclass it and implement `send` (and `find_sent`).

    A connector is built once per configured source as ``BACKEND(source=NAME, **OPTIONS)``
    and shared by every send in flight: its coroutines run on the sender's one event loop, its
    blocking methods on the sender's pool of threads, so those must be thread-safe. Define
    `asend` (and `afind_sent`, `aclose`) for a platform reached through an async client, or
    `send` (and `find_sent`, `close`) for a blocking one; each coroutine defaults to its
    blocking twin run in a thread.
    """

    #: The post kinds this source can take; `Outbox.queue` refuses any other kind (it reads
    #: them through `kinds_for`, from the class). "delete" (a retract's delete of a posted
    #: post) is left out by default: a connector lists it only once its send can delete.
    kinds: ClassVar[frozenset[str]] = frozenset(Kind.values) - {Kind.DELETE}

    #: Whether a post's `workspace_id` must be non-empty (CONTRACT). False for a platform whose
    #: places name no workspace (Google Chat: "the Google Workspace customer or \"\""), where
    #: `Outbox.queue` takes "" too.
    workspace_required: ClassVar[bool] = True

    #: Seconds one request may take at most, or None when the connector makes no requests.
    #: A system check requires the LEASE to be longer than this.
    timeout: float | None = None

    #: Default pacing per scope ("container", "workspace", "source") -> (count, seconds): at
    #: most `count` claims at once after a quiet spell, refilled at `count` per `seconds`.
    #: A source's "PACE" setting replaces it; the base class paces nothing.
    pace: ClassVar[dict[str, tuple[int, float]]] = {}

    #: The most requests one `find_sent` may make, each up to `timeout`. A lookup starts only
    #: while the claim's lease outlives them all, and the LEASE check covers a lookup plus a send.
    lookup_requests: int = 1

    @classmethod
    def kinds_for(cls, options: Mapping[str, Any]) -> frozenset[str]:
        """The kinds a source built from `options` (its OPTIONS) takes, read without building
        one: `Outbox.queue` checks each post against it, and producers have no use for a
        connector's client or its token checks. The class's `kinds` by default; a connector
        whose kinds follow an option overrides this, and its instances' `kinds` must agree
        (system check E021). Raises ValueError for options it cannot read them from."""
        return cls.kinds

    @classmethod
    def message_problem(cls, message: Message, options: Mapping[str, Any]) -> str | None:
        """Why a source built from `options` cannot show `message`, or None if it can.

        Read without building a connector, like `kinds_for`: `Outbox.queue` and `set_status`
        refuse a Message with a problem (InvalidPost), so that a Message over a platform's
        documented limit fails at queue time, not as a failed post. Name the field and the
        limit, e.g. "text is 4,210 characters, over Telegram's 4,096". None by default."""
        return None

    def __init__(self, source: str, **options: Any) -> None:
        if options:
            raise TypeError(f"{type(self).__name__} takes no options, got {', '.join(sorted(options))}")
        self.source = source

    def render(self, message: Message) -> dict[str, Any]:
        """The native body that `send` takes for `message`: the same dict a user could have
        queued for this platform. The sender calls it at send time for a post queued with a
        Message, so `send` and `find_sent` only ever see native bodies. By default the whole
        Message as plain text, ``{"text": ...}``; a platform overrides it with its own markup.
        May raise like `send` (it counts as RetryLater)."""
        return {"text": plain_text(message)}

    def send(self, post: ClaimedPost) -> Outcome:
        """Deliver `post` once and say what happened.

        Returns one of the outcomes of this module. Any exception raised counts as
        `RetryLater` (logged with its traceback), so raise only for the unexpected.
        """
        raise NotImplementedError

    def find_sent(self, post: ClaimedPost) -> str | None:
        """Look `post` up in the platform after a lost reply or a dead sender.

        Returns the message ref if the post is already there, None if it is certainly not.
        Raises `CannotCheck` when the platform can never tell (the default) and `CheckLater`
        when it cannot tell now. Never returns None for "I could not look".
        """
        raise CannotCheck(f"{type(self).__name__} cannot look posts up")

    def reply_thread(self, parent: Parent) -> str:
        """The `thread_id` of a reply to `parent` (a post queued with `thread_of`): the parent's
        own thread if it is itself a reply, else a thread on the parent's message, by default
        its `message_ref`. Called only for a parent with a message ref, before `send` and
        `find_sent`, from the send threads; a platform that must start the thread (Discord)
        does so here, and may raise like `send`, which then counts as `RetryLater`."""
        return parent.thread_id or parent.message_ref or ""

    async def asend(self, post: ClaimedPost) -> Outcome:
        """`send` as a coroutine: what the sender awaits. By default `send` in a thread."""
        return await blocking(self.send, post)

    async def afind_sent(self, post: ClaimedPost) -> str | None:
        """`find_sent` as a coroutine: what the sender awaits. By default `find_sent` in a thread."""
        return await blocking(self.find_sent, post)

    async def aclose(self) -> None:
        """`close` as a coroutine, awaited when the sender stops. By default `close` in a thread."""
        await blocking(self.close)

    def check(self) -> list[checks.CheckMessage]:
        """Configuration problems to report through `manage.py check` (none by default)."""
        return []

    def close(self) -> None:
        """Release clients and sockets; called when the sender stops or settings change."""
