"""A tiny chat platform in memory, for development and for your own tests.

It keeps what it was sent per container, the way a platform would: messages with ids,
status posts edited in place, reactions, ephemerals. Its history makes `find_sent` work, and
it can be told to fail, rate-limit or lose the next replies, so an app's tests can watch the
outbox recover. Reach the instance of a source through the registry::

    from django_connector_outbox.connectors import connectors

    platform = connectors["slack"]          # with BACKEND ...memory.MemoryConnector
    platform.lose_next_reply()
    assert [m.body["text"] for m in platform.messages("C1")] == ["hello"]

A reply queued with `thread_of` is stored with the thread it was resolved into (by default the
parent's own thread, else its ref): `Message.thread_id`. A delete (`Outbox.retract`) takes its
message out of `messages(container)`; the message it took is kept in `deleted`.
"""

from __future__ import annotations

import itertools
import threading
from collections import defaultdict, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.utils.module_loading import import_string

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
from django_connector_outbox.message import Message as BodyMessage
from django_connector_outbox.posts import ClaimedPost, Kind, Scope


@dataclass
class Message:
    """One message as the platform holds it."""

    ref: str
    post_id: str
    kind: str
    workspace_id: str
    container_id: str
    thread_id: str
    body: dict[str, Any]
    edits: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)


class MemoryConnector(Connector):
    """Delivers into memory; thread-safe, like every connector.

    As a stand-in for another connector (`testing.memory_connectors`), it takes that
    connector's `kinds`, `timeout` and `lookup_requests` as options, and as `messages_like` its
    BACKEND and OPTIONS, whose Message limits it applies, so that a test refuses what
    production refuses (a reaction to a message-only source, a Message too long for Telegram)
    and times its leases alike. It renders a Message as plain text whatever it stands in for.
    It takes every kind, "delete" too, unless its `kinds` option leaves some out.
    """

    kinds = frozenset(Kind.values)

    def __init__(
        self,
        source: str,
        *,
        kinds: Iterable[str] | None = None,
        timeout: float | None = None,
        lookup_requests: int | None = None,
        messages_like: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> None:
        super().__init__(source, **options)
        # `messages_like` is read from the OPTIONS by `message_problem`, as the outbox reads it.
        if messages_like is not None and not (
            isinstance(messages_like, Mapping) and isinstance(messages_like.get("BACKEND"), str)
        ):
            raise ValueError(
                f"messages_like must be a source's entry with a BACKEND path, not {messages_like!r}"
            )
        if kinds is not None:
            self.kinds = self.kinds_for({"kinds": kinds})  # type: ignore[misc]  # a class attribute elsewhere
        # None: the class's own (a subclass may set them).
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
                raise ValueError(f"timeout must be a positive number of seconds or None, not {timeout!r}")
            self.timeout = timeout
        if lookup_requests is not None:
            if (
                isinstance(lookup_requests, bool)
                or not isinstance(lookup_requests, int)
                or lookup_requests < 0
            ):
                raise ValueError(f"lookup_requests must be an int of at least 0, not {lookup_requests!r}")
            self.lookup_requests = lookup_requests
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._script: deque[Outcome | str] = deque()
        self._containers: dict[str, list[Message]] = defaultdict(list)
        self.reactions: list[dict[str, Any]] = []
        self.ephemerals: list[dict[str, Any]] = []
        self.deleted: list[Message] = []  # the messages deletes took, in order
        self.sent: list[ClaimedPost] = []  # every send call, in order, whatever its outcome

    @classmethod
    def kinds_for(cls, options: Mapping[str, Any]) -> frozenset[str]:
        """The ``kinds`` option (a list of kinds) if given, else the class's `kinds`."""
        kinds = options.get("kinds")
        if kinds is None:
            return cls.kinds
        if isinstance(kinds, str) or not isinstance(kinds, Iterable) or set(kinds) - set(Kind.values):
            raise ValueError(f"kinds must be a list of {', '.join(Kind.values)}, not {kinds!r}")
        return frozenset(kinds)

    @classmethod
    def message_problem(cls, message: BodyMessage, options: Mapping[str, Any]) -> str | None:
        """As a stand-in (`messages_like`), what the replaced connector's class finds; else none."""
        like = options.get("messages_like")
        if like is None:
            return None
        backend: type[Connector] = import_string(like["BACKEND"])
        return backend.message_problem(message, like.get("OPTIONS", {}))

    # -- what the platform holds ----------------------------------------------------------

    def messages(self, container_id: str) -> list[Message]:
        """The messages of a container, oldest first (status posts once each, as edited)."""
        with self._lock:
            return list(self._containers[container_id])

    def reset(self) -> None:
        """Forget everything (for the next test)."""
        with self._lock:
            self._script.clear()
            self._containers.clear()
            self.reactions.clear()
            self.ephemerals.clear()
            self.deleted.clear()
            self.sent.clear()

    # -- scripting failures ---------------------------------------------------------------

    def fail_next(self, reason: str = "scripted failure", *, permanent: bool = False, times: int = 1) -> None:
        """The next `times` sends fail: Refused when permanent, else RetryLater."""
        outcome: Outcome = Refused(reason) if permanent else RetryLater(reason)
        self._push(outcome, times)

    def rate_limit_next(self, after: float, *, times: int = 1, scope: str = Scope.CONTAINER) -> None:
        """The next `times` sends are refused with a Retry-After of `after` seconds, for `scope`."""
        self._push(RateLimited(after, "rate limited", scope), times)

    def lose_next_reply(self, *, times: int = 1) -> None:
        """The next `times` sends are stored, but the reply is lost (MaybeSent)."""
        self._push("lose", times)

    def _push(self, item: Outcome | str, times: int) -> None:
        with self._lock:
            self._script.extend([item] * times)

    # -- the connector --------------------------------------------------------------------

    def send(self, post: ClaimedPost) -> Outcome:
        with self._lock:
            self.sent.append(post)
            scripted = self._script.popleft() if self._script else None
            if scripted is not None and scripted != "lose":
                return scripted  # type: ignore[return-value]
            ref = self._store(post)
        return MaybeSent("reply lost (scripted)") if scripted == "lose" else Delivered(ref)

    def _store(self, post: ClaimedPost) -> str | None:
        if post.kind == Kind.DELETE:
            return self._delete(post)
        if post.kind == Kind.REACTION:
            reaction = {"post_id": post.post_id, "container_id": post.container_id, **post.body}
            if reaction not in self.reactions:  # adding a reaction twice is a no-op, as on Slack
                self.reactions.append(reaction)
            return None
        if post.kind == Kind.EPHEMERAL:
            self.ephemerals.append({"post_id": post.post_id, "container_id": post.container_id, **post.body})
            return None
        if post.kind == Kind.STATUS and post.message_ref:
            for message in self._containers[post.container_id]:
                if message.ref == post.message_ref:
                    message.history.append(message.body)
                    message.body, message.edits = dict(post.body), message.edits + 1
                    return message.ref
        ref = f"{post.container_id}:{next(self._ids)}"
        self._containers[post.container_id].append(
            Message(
                ref,
                post.post_id,
                post.kind,
                post.workspace_id,
                post.container_id,
                post.thread_id,
                dict(post.body),
            )
        )
        return ref

    def _delete(self, post: ClaimedPost) -> str | None:
        """Take the message of `post.message_ref` away. A message deleted already (or never
        here) is no error: deleting twice shows what deleting once does, as on the platforms
        whose "not found" a connector answers as done."""
        messages = self._containers[post.container_id]
        for message in messages:
            if message.ref == post.message_ref:
                messages.remove(message)
                self.deleted.append(message)
                break
        return post.message_ref

    def find_sent(self, post: ClaimedPost) -> str | None:
        if post.kind == Kind.EPHEMERAL:
            raise CannotCheck("ephemeral posts leave no trace to look up")
        with self._lock:
            if post.kind == Kind.REACTION:
                return next(
                    (f"reaction:{r['post_id']}" for r in self.reactions if r["post_id"] == post.post_id), None
                )
            # In the post's thread only, as a platform's lookup is (Slack reads a thread's
            # replies): a reply looked up outside the thread it was resolved into is not found.
            return next(
                (
                    m.ref
                    for m in self._containers[post.container_id]
                    if m.post_id == post.post_id and m.thread_id == post.thread_id
                ),
                None,
            )
