"""The values that cross the outbox boundary: kinds, states, outcomes, claims and errors.

Kept free of models so that connectors can import them without the app registry.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import models
from django.utils.translation import gettext_lazy as _

from django_connector_outbox.message import Message


class Kind(models.TextChoices):
    # A new post in the container (or in a thread of it).
    MESSAGE = "message", _("Message")
    # Posted once, then edited in place; only the latest body is ever sent.
    STATUS = "status", _("Status")
    # A reaction on a person's message (the body names the message).
    REACTION = "reaction", _("Reaction")
    # Seen by one person only: the platform keeps no id, so it can never be looked up.
    EPHEMERAL = "ephemeral", _("Ephemeral")
    # The platform's delete of a posted post (`message_ref`), queued by Outbox.retract behind
    # it in its container, never by a caller: a source takes it only if it lists it in kinds.
    DELETE = "delete", _("Delete")


class State(models.TextChoices):
    # Waiting for its turn (or for its due time) in its container.
    QUEUED = "queued", _("Queued")
    # Claimed by a sender that holds a lease on it.
    SENDING = "sending", _("Sending")
    # Delivered; the platform's id is in message_ref where it has one.
    POSTED = "posted", _("Posted")
    # Refused by the platform, or out of attempts.
    FAILED = "failed", _("Failed")
    # May have been posted, could not be checked: never retried automatically.
    UNCERTAIN = "uncertain", _("Uncertain")
    # Cancelled by a caller or an operator before it was sent.
    CANCELLED = "cancelled", _("Cancelled")


class Scope(models.TextChoices):
    """How far a rate limit or a pace reaches: the places that wait together."""

    # One container (a channel): the platform's per-channel limit.
    CONTAINER = "container", _("Container")
    # Every container of one workspace (a Slack team, a Discord guild) of the source.
    WORKSPACE = "workspace", _("Workspace")
    # Every container of the source: a limit of the whole token or bot.
    SOURCE = "source", _("Source")


@dataclass(frozen=True, slots=True)
class Pace:
    """At most `count` claims at once after a quiet spell, refilled at `count` per `seconds`."""

    count: int
    seconds: float


ACTIVE_STATES = (State.QUEUED, State.SENDING)
# The kinds whose post is a message of its own, which a retract deletes (Outbox.retract): a
# reaction goes on a person's message, an ephemeral leaves no id.
MESSAGE_KINDS = (Kind.MESSAGE, Kind.STATUS)
FINISHED_STATES = (State.POSTED, State.FAILED, State.UNCERTAIN, State.CANCELLED)
# What an operator may send back to the queue: a sender has given up on them.
RETRYABLE_STATES = (State.FAILED, State.UNCERTAIN)
# What an operator retracts (the admin's retract_posts, outbox_cancel --retract): a post on the
# platform, or on its way there. A queued one is cancelled instead, as Outbox.retract would.
RETRACTABLE_STATES = (State.POSTED, State.SENDING)
# What an operator should look at: anything not yet delivered nor cancelled.
ATTENTION_STATES = (State.QUEUED, State.SENDING, State.FAILED, State.UNCERTAIN)
# What waits for a workspace's installation: queued (a post being sent is queued in its own
# row) and failed (an uninstalled workspace's posts fail; a re-install lets them be retried).
# Of the failed, only those that failed for want of an installation wait for one
# (PostQuerySet.waiting_for_installation); the partial index of migration 0016 has both states.
WAITING_STATES = (State.QUEUED, State.FAILED)
# The advice that ends the reason of every post failed for want of a usable installation
# (installations.NotInstalled), after ": ", whether the workspace never installed the app or
# its installation was revoked (CONTRACT: "says to install the app again"). It is how such a
# failure is told from the others (PostQuerySet.failed_for_installation): the reason is the
# only record of why a post failed.
INSTALL_AGAIN = "install the app again"


class InvalidPost(ValueError):
    """A post that cannot be queued; the message names the post id and the field."""


@dataclass(frozen=True)
class PostState:
    """What `Outbox.find` tells of a post; `message`: the Message it was queued with while its
    body is kept (a posted one-off drops it), else None."""

    state: str
    message_ref: str | None
    message: Message | None = None


@dataclass(frozen=True)
class ClaimedPost:
    """One post handed to a sender, under a lease until `lease_until`.

    `parent`: for a post queued with `thread_of`, that post as it ended (the container's order
    finishes it first). A connector sends such a post with `thread_id` set to
    `Connector.reply_thread(parent)`: the sender resolves it before `send` and `find_sent`.
    For a delete (Outbox.retract), the post whose message it deletes: the sender sends it
    with that post's `message_ref` (and thread), or drops it when there is none.
    """

    source: str
    post_id: str
    workspace_id: str
    container_id: str
    thread_id: str
    kind: str
    body: dict[str, Any]
    rev: int
    attempts: int
    message_ref: str | None
    turn_key: str | None
    stale: bool
    sent_at: datetime
    lease_until: datetime
    # Which claim this is: every finish names it, so that a sender whose lease was taken
    # back changes nothing (lease_until alone can repeat under a frozen test clock).
    lease_token: str = ""
    parent: Parent | None = None


@dataclass(frozen=True)
class Parent:
    """The post that a reply was queued into the thread of (`thread_of`), as it ended.

    `state` "" means that it is gone: pruned before its reply was sent (a reply delayed past
    RETENTION)."""

    post_id: str
    state: str
    message_ref: str | None
    thread_id: str


@dataclass(frozen=True, slots=True)
class NewPost:
    """A validated post, ready to be written (by the ORM or by store/postgres.py)."""

    post_id: str
    workspace_id: str
    container_id: str
    thread_id: str
    kind: str
    body_json: str  # its body's compact JSON encoding (validation.clean_body)
    turn_key: str | None
    due: datetime
    # The post whose thread it goes into (`thread_of`), checked by Outbox.check_parents.
    thread_of: str | None = None

    @property
    def body(self) -> dict[str, Any]:
        """The body as it is stored (a JSON round trip), decoded where a store needs the dict:
        PostgreSQL's statements take the text."""
        body: dict[str, Any] = json.loads(self.body_json)
        return body


class Action(models.TextChoices):
    """What a sender asks the outbox to record for one claim (`Finish.action`)."""

    # Delivered (Outbox.posted).
    POSTED = "posted"
    # Already in the source after a lost reply or a dead sender (Outbox.found).
    FOUND = "found"
    # A failed try (Outbox.retry): back to the queue, or failed when out of attempts.
    RETRY = "retry"
    # The source asked to wait (Outbox.hold): the attempt is not counted.
    HOLD = "hold"
    # Finished as `state`, failed or uncertain (Outbox.settle).
    SETTLE = "settle"
    # May be in the source, or on its way: left `sending` (holding its container) until its
    # lease ends, then looked up (Outbox.leave).
    LEAVE = "leave"
    # Not started: back to where it was, a stale claim still stale (Outbox.give_back).
    GIVE_BACK = "give_back"
    # A retract's delete whose post ended without a message to delete: cancelled, unsent.
    DROP = "drop"


class Outcome(models.TextChoices):
    """What recording a finish did to its post (`Finish.recorded`): the one spelling of each
    outcome, used by the history (models.Attempt.outcome), the sender's summary line and
    counters, its signals (signals.OUTCOME_SIGNALS), the metrics' `outcome` label, the log
    lines and the admin. (Not `connectors.Outcome`, what a connector's `send` returns.)"""

    # Delivered (Outbox.posted).
    POSTED = "posted", _("posted")
    # Found already in the source after a lost reply or a dead sender (Outbox.found): reported
    # as posted (the summary line, post_posted, the metrics).
    FOUND = "found", _("found")
    # A failed try, back to the queue after a backoff (Outbox.retry).
    RETRIED = "retried", _("retried")
    # The source asked to wait (Outbox.hold). How far the hold reaches is its `scope` (a Scope),
    # never another word: the summary line counts the wider ones apart (sender.held_counter).
    HELD = "held", _("held")
    # Refused, or out of attempts (Outbox.settle, Outbox.retry on the last attempt).
    FAILED = "failed", _("failed")
    # May have been posted and could not be checked (Outbox.settle).
    UNCERTAIN = "uncertain", _("uncertain")
    # Sent and the reply lost, or a lookup that could not tell: left sending, looked up after
    # its lease (Outbox.leave).
    LOST_REPLY = "lost_reply", _("lost reply")
    # Not started: back to where it was (Outbox.give_back).
    GIVEN_BACK = "given_back", _("given back")
    # A retract's delete left unsent, cancelled: its post ended without a message (a send
    # that failed, or left no ref), so there is nothing to delete.
    DROPPED = "dropped", _("dropped")


@dataclass(frozen=True, slots=True)
class Finish:
    """One fenced finish of the claim (`post_id`, `lease_token`): what the outbox records."""

    post_id: str
    lease_token: str
    action: str  # an Action
    claimed_rev: int = 0
    message_ref: str | None = None
    wait: float | None = None  # seconds; for a retry, None means the backoff
    reason: str = ""
    state: str = ""  # for a settle: failed or uncertain
    # For a hold: how far it reaches (a Scope; "" is the container). For a posted finish with a
    # `wait`: a wait the platform announced with its success, of the container or wider.
    scope: str = ""
    # For a posted or found reply (`thread_of`): the thread it was sent into, kept on its row.
    thread_id: str | None = None

    @property
    def holds_place(self) -> bool:
        """Whether recording it also holds a place wider than the post (a Gate)."""
        if self.action == Action.HOLD:
            return self.scope not in ("", Scope.CONTAINER)
        return self.action == Action.POSTED and bool(self.wait)

    @property
    def recorded(self) -> Outcome:
        """What a resolved finish (Outbox.resolve) does to the post, in one word."""
        if self.action == Action.SETTLE:
            return Outcome(self.state)
        return RECORDED[self.action]


# What the per-attempt history (models.Attempt) keeps a row of: the finishes that did not
# deliver and say why (a plain delivery, a found post and a claim given back keep none).
HISTORY_OUTCOMES = (Outcome.RETRIED, Outcome.HELD, Outcome.FAILED, Outcome.UNCERTAIN, Outcome.LOST_REPLY)

RECORDED: dict[str, Outcome] = {
    Action.POSTED: Outcome.POSTED,
    Action.FOUND: Outcome.FOUND,
    Action.RETRY: Outcome.RETRIED,
    Action.HOLD: Outcome.HELD,
    Action.LEAVE: Outcome.LOST_REPLY,
    Action.GIVE_BACK: Outcome.GIVEN_BACK,
    Action.DROP: Outcome.DROPPED,
}
