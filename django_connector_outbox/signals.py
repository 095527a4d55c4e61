"""Signals sent by the sender after it has recorded what happened to a post, and by the
installations when a token was refreshed or an installation revoked.

Every post signal is sent with ``sender=Sender`` class, ``claim`` (the ClaimedPost) and, where
there is one, ``reason``. ``post_posted`` also has ``message_ref``; ``post_sent`` has
``duration``. The installation signals are sent with ``sender=Installations`` class,
``source`` and ``workspace_id``; ``installation_revoked`` also has ``reason``; never a token.
The package's own log lines are receivers of these signals, so an app can add its own alongside.

Each post signal but `post_sent` stands for one outcome (posts.Outcome, `OUTCOME_SIGNALS`); its
log line starts "post <outcome>" and carries the outcome as the record's `outcome` attribute.
"""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal, receiver

from django_connector_outbox.posts import ClaimedPost, Outcome

logger = logging.getLogger("django_connector_outbox")

# use_caching: each is sent once or twice per post, always with sender=Sender; the receivers
# are looked up once per sender (as for Django's model signals), not on every send.
post_posted = Signal(use_caching=True)  # delivered (or found already delivered); message_ref
post_retried = Signal(use_caching=True)  # a failed try, queued again after a backoff; reason
post_held = Signal(use_caching=True)  # the platform asked to wait; reason, after (seconds), scope (a Scope)
post_failed = Signal(use_caching=True)  # refused, or out of attempts; reason
post_uncertain = Signal(use_caching=True)  # may have been posted and could not be checked; reason
post_lost_reply = Signal(use_caching=True)  # sent, reply lost: left to be looked up after its lease; reason
# A send call returned (or raised); duration (seconds). Sent from the send thread, before the
# outcome is recorded: for timing (the metrics' histogram), not for deciding anything.
post_sent = Signal(use_caching=True)
# A workspace's token was refreshed and the new one saved (once per refresh, by the sender
# that made it), after the transaction that saved it.
installation_refreshed = Signal(use_caching=True)
# An installation was revoked (an answer, a failed refresh, delete_installation); reason.
installation_revoked = Signal(use_caching=True)
# Posts of a source were queued (or a status post's body replaced) in the transaction of
# `using`: sender=Outbox class, source, using. The seam of DELIVERY "immediate" (immediate.py,
# connected when the app is ready), which drains the source once that transaction commits:
# the outbox does not import what delivers.
posts_queued = Signal(use_caching=True)

# The signal the sender sends for each outcome it reports, once the outcome is recorded (a post
# found in the source is reported as posted; a claim given back is not reported): what the
# metrics count and `run_outbox --max-posts` counts, by these outcomes.
OUTCOME_SIGNALS: dict[Outcome, Signal] = {
    Outcome.POSTED: post_posted,
    Outcome.RETRIED: post_retried,
    Outcome.HELD: post_held,
    Outcome.FAILED: post_failed,
    Outcome.UNCERTAIN: post_uncertain,
    Outcome.LOST_REPLY: post_lost_reply,
}


def announce_sent(sender: type, claim: ClaimedPost, duration: float) -> None:
    """Send `post_sent`; a receiver that raises is logged, and never turns a send into a retry."""
    for _, error in post_sent.send_robust(sender=sender, claim=claim, duration=duration):
        if isinstance(error, Exception):
            logger.error("post_sent receiver raised post_id=%s error=%r", claim.post_id, error)


def _place(claim: ClaimedPost) -> str:
    return f"{claim.source}:{claim.workspace_id}/{claim.container_id}"


def _fields(claim: ClaimedPost, outcome: Outcome, **more: Any) -> dict[str, Any]:
    """The line's key=value fields as record attributes too (``extra=``), for JSON formatters."""
    return {
        "outcome": outcome.value,
        "post_id": claim.post_id,
        "source": claim.source,
        "workspace_id": claim.workspace_id,
        "container_id": claim.container_id,
        "kind": claim.kind,
        "attempts": claim.attempts,
        **more,
    }


# Each line starts "post <outcome>", the outcome spelled as everywhere else (posts.Outcome).


@receiver(post_posted)
def log_posted(*, claim: ClaimedPost, message_ref: str | None, **kwargs: Any) -> None:
    if not logger.isEnabledFor(logging.DEBUG):  # once per post: its fields are not built for nothing
        return
    logger.debug(
        "post %s post_id=%s place=%s kind=%s attempts=%d message_ref=%s",
        Outcome.POSTED.value, claim.post_id, _place(claim), claim.kind, claim.attempts, message_ref,
        extra=_fields(claim, Outcome.POSTED, message_ref=message_ref),
    )  # fmt: skip


@receiver(post_retried)
def log_retried(*, claim: ClaimedPost, reason: str, **kwargs: Any) -> None:
    logger.info(
        "post %s post_id=%s place=%s attempts=%d reason=%r",
        Outcome.RETRIED.value, claim.post_id, _place(claim), claim.attempts, reason,
        extra=_fields(claim, Outcome.RETRIED, reason=reason),
    )  # fmt: skip


@receiver(post_held)
def log_held(*, claim: ClaimedPost, reason: str, after: float, **kwargs: Any) -> None:
    logger.info(
        "post %s post_id=%s place=%s after=%.3fs reason=%r",
        Outcome.HELD.value, claim.post_id, _place(claim), after, reason,
        extra=_fields(claim, Outcome.HELD, after=after, reason=reason),
    )  # fmt: skip


@receiver(post_failed)
def log_failed(*, claim: ClaimedPost, reason: str, **kwargs: Any) -> None:
    logger.warning(
        "post %s post_id=%s place=%s attempts=%d reason=%r",
        Outcome.FAILED.value, claim.post_id, _place(claim), claim.attempts, reason,
        extra=_fields(claim, Outcome.FAILED, reason=reason),
    )  # fmt: skip


@receiver(post_uncertain)
def log_uncertain(*, claim: ClaimedPost, reason: str, **kwargs: Any) -> None:
    logger.warning(
        "post %s post_id=%s place=%s reason=%r",
        Outcome.UNCERTAIN.value, claim.post_id, _place(claim), reason,
        extra=_fields(claim, Outcome.UNCERTAIN, reason=reason),
    )  # fmt: skip


@receiver(post_lost_reply)
def log_lost_reply(*, claim: ClaimedPost, reason: str, **kwargs: Any) -> None:
    logger.warning(
        "post %s post_id=%s place=%s reason=%r",
        Outcome.LOST_REPLY.value, claim.post_id, _place(claim), reason,
        extra=_fields(claim, Outcome.LOST_REPLY, reason=reason),
    )  # fmt: skip
