"""What a sender reports about a claim, made storable: recording an answer never fails on it.

A platform or a custom connector may answer anything: a 300-character id, an int, an
exception as a reason, a Retry-After of 1e12. Every finish passes through `storable` before it
is written, on the ORM path and on PostgreSQL's alike, so that afterwards:

- a message ref is None or a str that every backend stores as given (at most ID_LENGTH
  characters, no NUL, no lone surrogate); a ref that is not is refused (None: the post is
  recorded without it) and logged as a warning;
- a reason is text of at most MAX_REASON characters, without NUL or lone surrogates;
- the wait of a retry or hold is a number of seconds in [0, MAX_HOLD]: a negative or NaN wait
  is none, a longer one (inf included) is cut to MAX_HOLD and the reason says so. A wait past
  what a datetime can hold would crash the write, and one of years parks a container for good.
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace

from django_connector_outbox.conf import conf
from django_connector_outbox.models import ID_LENGTH
from django_connector_outbox.posts import Action, Finish

logger = logging.getLogger("django_connector_outbox")

# The longest reason kept on a post: enough for a platform's error and its context.
MAX_REASON = 2000


def storable(finish: Finish) -> Finish:
    """The finish with its ref, reason and wait made storable (see the module docstring)."""
    reason = reason_text(finish.reason)
    wait = finish.wait
    if finish.action in (Action.RETRY, Action.HOLD) or (finish.action == Action.POSTED and wait):
        # (a posted finish's wait: a hold the platform announced with its success)
        wait, reason = _bounded_wait(wait or 0.0, reason)
    ref = _ref(finish.post_id, finish.message_ref)
    if (ref, reason, wait) == (finish.message_ref, finish.reason, finish.wait):
        return finish  # storable as it is (nearly every finish): no copy
    return replace(finish, message_ref=ref, reason=reason, wait=wait)


def reason_text(reason: object, limit: int = MAX_REASON) -> str:
    """A reason as text every backend stores: str() of anything else, NUL and lone surrogates out."""
    text = reason if isinstance(reason, str) else str(reason) or type(reason).__name__
    text = text.replace("\x00", "").encode("utf-8", "ignore").decode("utf-8")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _bounded_wait(wait: float, reason: str) -> tuple[float, str]:
    if math.isnan(wait) or wait < 0:  # nothing to wait for
        return 0.0, reason
    limit = conf.MAX_HOLD
    if wait <= limit:
        return wait, reason
    asked = f"{wait:g}s" if math.isfinite(wait) else "inf"
    note = f"(wait cut from {asked} to MAX_HOLD {limit:g}s)"
    return limit, f"{reason_text(reason, MAX_REASON - len(note) - 1)} {note}".lstrip()


def _ref(post_id: str, ref: object) -> str | None:
    if ref is None:
        return None
    if isinstance(ref, str):
        problem = _str_ref_problem(ref)
        if problem is None:
            return ref
    else:
        problem = f"a {type(ref).__name__}, not a str"
    logger.warning("message_ref refused: post_id=%s problem=%s ref=%.100r", post_id, problem, ref)
    return None


def _str_ref_problem(ref: str) -> str | None:
    if len(ref) > ID_LENGTH:
        return f"{len(ref)} characters, over {ID_LENGTH}"
    if "\x00" in ref:
        return "contains NUL"
    try:
        ref.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone surrogate"
    return None
