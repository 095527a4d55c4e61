"""A simulated chat platform: what it accepted, and how it answers each call.

Every source of a simulated world is a `SimConnector` backed by the world's one `Platform`.
The platform keeps each message it accepted (creations per container in order, status edits
with their bodies), answers lookups truthfully from that record, and answers each call as
the schedule's event says (`Behaviour`): accept; accept and lose the reply; lose the request;
RetryLater; Refused; RateLimited; raise; a lookup that must wait or raises; a call that takes
up to the connector's timeout of virtual time.

It also checks, at each call, what the outbox promises about the claim it was handed: the
claim is current (its row is `sending` under its token, its lease not ended), it is its
container's only post in flight, nothing older is waiting in its container, and it has been
handed to `send` at most MAX_ATTEMPTS times; and of a reply (`thread_of`) that it is created
after its parent's message, in its parent's thread (the parent's own thread when the parent
is itself a reply). Its lookups look in the post's thread only, as a platform's do: a reply
looked up outside the thread it went into is not found (and would be sent twice). A broken promise is kept in `violations` (not
raised: `deliver` would swallow it as a failed send).
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar

from django_connector_outbox.conf import conf
from django_connector_outbox.connectors.base import (
    CannotCheck,
    CheckLater,
    Connector,
    Delivered,
    MaybeSent,
    Outcome,
    RateLimited,
    Refused,
    RetryLater,
)
from django_connector_outbox.models import Post
from django_connector_outbox.posts import ACTIVE_STATES, ClaimedPost, Kind, State
from tests.conftest import FakeClock

TIMEOUT = 2.0  # the simulated connector's timeout, in virtual seconds
LOOKUP_REQUESTS = 2

# How a send is answered, by `Behaviour.send` (the weights are the ranges' widths, of 100).
SEND_MODES = (
    (40, "accept"),
    (12, "accept_lose_reply"),  # accepted, then the reply is lost: MaybeSent
    (5, "lose_request"),  # the request never arrived, the client cannot tell: MaybeSent
    (15, "retry_later"),
    (5, "refused"),
    (13, "rate_limited"),
    (10, "raise"),
)
LOOKUP_MODES = ((70, "truthful"), (20, "check_later"), (10, "raise"))
DURATIONS = (0.0, 0.0, 0.5, 1.0)  # fractions of the timeout a call takes
RATE_LIMIT_AFTERS = (0.5, 5.0, 40.0)  # the last one outlives a lease
RETRY_AFTERS = (None, 3.0)


def pick(table: tuple[tuple[int, str], ...], n: int) -> str:
    n %= sum(weight for weight, _ in table)
    for weight, name in table:
        if n < weight:
            return name
        n -= weight
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class Behaviour:
    """How the platform answers the calls of one delivery (a lookup, then a send)."""

    send: str = "accept"
    lookup: str = "truthful"
    duration: float = 0.0  # virtual seconds each call takes
    rate_limit_after: float = 5.0
    retry_after: float | None = None

    @classmethod
    def from_numbers(cls, a: int, b: int) -> Behaviour:
        return cls(
            send=pick(SEND_MODES, a),
            lookup=pick(LOOKUP_MODES, a // 100),
            duration=DURATIONS[b % len(DURATIONS)] * TIMEOUT,
            rate_limit_after=RATE_LIMIT_AFTERS[(b // 4) % len(RATE_LIMIT_AFTERS)],
            retry_after=RETRY_AFTERS[(b // 16) % len(RETRY_AFTERS)],
        )


COOPERATIVE = Behaviour()


@dataclass
class Message:
    """One message as the platform holds it."""

    source: str
    post_id: str
    kind: str
    container: tuple[str, str]  # (workspace_id, container_id)
    ref: str
    body: dict[str, Any]
    # The post's place in its container's queue order when it was created here: (queued_at,
    # id) (models.QUEUE_ORDER).
    place: tuple[datetime, int]
    step: int  # the schedule's event during which it was created
    since: int  # the step at which the run of claims that created it began
    edits: int = 0
    thread_id: str = ""  # the thread it went into ("" at the top level)


@dataclass
class Platform:
    """Everything the simulated platform accepted, and the promises it saw broken."""

    clock: FakeClock
    behaviour: Behaviour = COOPERATIVE
    messages: list[Message] = field(default_factory=list)  # creations, in order
    created: Counter[tuple[str, str]] = field(default_factory=Counter)  # (source, post_id)
    # Handed to send and not answered RateLimited, since the attempts were last reset.
    sends: Counter[tuple[str, str]] = field(default_factory=Counter)
    total_sends: int = 0
    # (source, workspace, container) -> (post_id, lease_until) of a send whose reply was lost:
    # it may still be in flight at the platform until its lease ends.
    maybe_in_flight: dict[tuple[str, str, str], tuple[str, datetime]] = field(default_factory=dict)
    # (invariant, detail, the known defect it is or None): see explorer.KNOWN_DEFECTS.
    violations: list[tuple[str, str, str | None]] = field(default_factory=list)
    trace: list[str] | None = None  # what happened, when asked (a replay)
    place: tuple[datetime, int] | None = None  # of the claim last checked (the one being sent)
    lease_until: datetime | None = None  # the lease of the claim last checked, as its row holds it
    stats: Counter[str] = field(default_factory=Counter)  # calls, by what they answered
    phase: str = ""  # "drain " while draining
    step: int = 0  # the schedule's current event (the drain counts on from the last)
    # The step at which each post last joined its queue (queued, or a finished status set
    # again), and at which each `sending` post's run of claims began.
    queued_step: dict[tuple[str, str], int] = field(default_factory=dict)
    sending_since: dict[tuple[str, str], int] = field(default_factory=dict)
    _refs: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def note(self, line: str) -> None:
        if self.trace is not None:
            self.trace.append(line)

    def violate(self, invariant: str, detail: str, known: str | None = None) -> None:
        self.violations.append((invariant, detail, known))

    def message(self, source: str, post_id: str) -> Message | None:
        return next((m for m in self.messages if (m.source, m.post_id) == (source, post_id)), None)

    # -- the calls ------------------------------------------------------------------------

    def send(self, post: ClaimedPost) -> Outcome:
        self._check_claim(post, "send")
        mode = self.behaviour.send
        if mode != "rate_limited":
            key = (post.source, post.post_id)
            self.sends[key] += 1
            self.total_sends += 1
            if self.sends[key] > conf.MAX_ATTEMPTS:
                self.violate(
                    "sends per post <= MAX_ATTEMPTS",
                    f"{post.source}:{post.post_id} handed to send {self.sends[key]} times "
                    f"(MAX_ATTEMPTS {conf.MAX_ATTEMPTS})",
                )
        self.clock.advance(self.behaviour.duration)
        self.note(f"  send {post.source}:{post.post_id} attempt {post.attempts} stale={post.stale}: {mode}")
        self.stats[f"{self.phase}send {mode}"] += 1
        match mode:
            case "accept":
                return Delivered(self._accept(post))
            case "accept_lose_reply":
                self._accept(post)
                self._maybe_in_flight(post)
                return MaybeSent("reply lost (simulated)")
            case "lose_request":
                self._maybe_in_flight(post)
                return MaybeSent("request lost (simulated)")
            case "retry_later":
                return RetryLater("503 (simulated)", after=self.behaviour.retry_after)
            case "refused":
                return Refused("channel_not_found (simulated)")
            case "rate_limited":
                return RateLimited(self.behaviour.rate_limit_after, "429 (simulated)")
        raise RuntimeError("connection reset (simulated)")

    def find_sent(self, post: ClaimedPost) -> str | None:
        self._check_claim(post, "lookup")
        self.clock.advance(self.behaviour.duration * LOOKUP_REQUESTS)
        self.note(f"  lookup {post.source}:{post.post_id} attempt {post.attempts}: {self.behaviour.lookup}")
        self.stats[
            f"{self.phase}lookup {'cannot check' if post.kind == Kind.EPHEMERAL else self.behaviour.lookup}"
        ] += 1
        if post.kind == Kind.EPHEMERAL:
            raise CannotCheck("ephemeral posts leave no trace (simulated)")
        match self.behaviour.lookup:
            case "check_later":
                raise CheckLater("history rate-limited (simulated)")
            case "raise":
                raise RuntimeError("history lookup crashed (simulated)")
        found = self.message(post.source, post.post_id)
        return found.ref if found and found.thread_id == post.thread_id else None

    def _accept(self, post: ClaimedPost) -> str | None:
        if post.kind == Kind.STATUS and post.message_ref:
            edited = next((m for m in self.messages if m.ref == post.message_ref), None)
            if edited is None:
                self.violate("a status edit names a message the platform has", f"{post}")
                return None
            edited.body, edited.edits = dict(post.body), edited.edits + 1
            return edited.ref
        key = (post.source, post.post_id)
        self.created[key] += 1
        if self.created[key] > 1:
            self.violate(
                "no post accepted twice by the platform", f"{post.source}:{post.post_id} ({post.kind})"
            )
        if post.parent is not None:
            self._check_reply(post)
        ref = f"{post.container_id}:{next(self._refs)}"
        self.messages.append(
            Message(
                post.source, post.post_id, post.kind, (post.workspace_id, post.container_id), ref,
                dict(post.body), self.place, self.step, self.sending_since.get(key, self.step),
                thread_id=post.thread_id,
            )
        )  # fmt: skip
        return None if post.kind == Kind.EPHEMERAL else ref

    def _check_reply(self, post: ClaimedPost) -> None:
        """A reply is created after its parent's message, in the parent's thread."""
        assert post.parent is not None
        parent = self.message(post.source, post.parent.post_id)
        where = f"{post.source}:{post.post_id} (a reply to {post.parent.post_id})"
        self.stats[f"{self.phase}reply created"] += 1
        if parent is None:
            self.violate("a reply never lands before its parent", f"{where}: the parent has no message")
            return
        thread = parent.thread_id or parent.ref
        if post.thread_id != thread:
            self.violate(
                "a reply never lands outside its thread", f"{where}: in {post.thread_id!r}, not {thread!r}"
            )

    def _maybe_in_flight(self, post: ClaimedPost) -> None:
        self.maybe_in_flight[(post.source, post.workspace_id, post.container_id)] = (
            post.post_id,
            self.lease_until or post.lease_until,
        )

    # -- what the outbox promises about each claim it hands over ----------------------------

    def _check_claim(self, post: ClaimedPost, call: str) -> None:
        """Check what the outbox promises about `post` (one query: its container's posts)."""
        now, self.lease_until = self.clock(), None
        where = f"{call} of {post.source}:{post.post_id} (attempt {post.attempts}, stale={post.stale})"
        container = {
            p["post_id"]: p
            for p in Post.objects.filter(
                source=post.source, workspace_id=post.workspace_id, container_id=post.container_id
            )
            .with_claim()
            .values("post_id", "pk", "lease_token", "lease_until", "queued_at", "current_state")
        }
        row = container.get(post.post_id)
        if row is None or row["current_state"] != State.SENDING or row["lease_token"] != post.lease_token:
            state = None if row is None else (row["current_state"], row["lease_token"] == post.lease_token)
            self.violate("a claim is used only while it is current", f"{where}: row is {state}")
            return
        # The lease that fences is the row's: the claim's `lease_until` is where it began, and
        # the sender renews a lease in flight (leases.py).
        self.lease_until = row["lease_until"]
        if now >= self.lease_until:
            self.violate(
                "a claim is never used after its lease", f"{where} at {now}, lease until {self.lease_until}"
            )
        self.place = place = (row["queued_at"], row["pk"])
        others = [p for p in container.values() if p is not row and p["current_state"] in ACTIVE_STATES]
        if any(p["current_state"] == State.SENDING for p in others):
            self.violate("never two posts of one container in flight", f"{where}: another is sending")
        # Before it in queue order, and already queued when this run of claims of the post began
        # (with a producer clock behind, a post queued since may carry an older queued_at: it
        # waits its turn).
        since = self.sending_since.get((post.source, post.post_id), self.step)
        older = [
            p["post_id"]
            for p in others
            if (p["queued_at"], p["pk"]) < place
            and self.queued_step.get((post.source, p["post_id"]), 0) < since
        ]
        if older:
            self.violate("a container sends only its head", f"{where}: older active posts {older}")
        other = self.maybe_in_flight.get((post.source, post.workspace_id, post.container_id))
        if other and other[0] != post.post_id and now < other[1]:
            state = container[other[0]]["current_state"]
            self.violate(
                "never two posts of one container in flight",
                f"{where}: {other[0]} may still be in flight (reply lost, lease until {other[1]}; now {state})",
                "last-lost-reply-releases-container" if state == State.UNCERTAIN else None,
            )


class SimConnector(Connector):
    """A source of the simulated platform (the world sets `platform` before building it)."""

    platform: ClassVar[Platform | None] = None
    timeout = TIMEOUT
    lookup_requests = LOOKUP_REQUESTS

    def send(self, post: ClaimedPost) -> Outcome:
        assert self.platform is not None
        return self.platform.send(post)

    def find_sent(self, post: ClaimedPost) -> str | None:
        assert self.platform is not None
        return self.platform.find_sent(post)
