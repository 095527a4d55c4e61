"""The Outbox contract (CONTRACT.md, "Python API") as a small pure-Python model.

It keeps what a user can observe of each post and decides what every method must return and
leave behind; tests/test_outbox_model.py runs random sequences against the real Outbox and
this model side by side. It models one source: posts of another source are another model.

Invariants it holds (and so demands of the real code):
- a container's head is its `sending` post if it has one, else its first queued post in
  queue order: by queued_at, then the order they were queued in (`seq`, as the rows' ids),
  never by post id; only heads are claimed, so one post per container is sending;
- a claim is current while its post is `sending` under that very claim (fencing); every
  finish of a claim that is not current returns False and changes nothing;
- `changed_at` is when a post last changed (what prune_finished measures).

Where the contract is silent the model follows the code, and says so at that line.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

FINISHED = ("posted", "failed", "uncertain", "cancelled")


@dataclass(frozen=True)
class Config:
    """The settings the model runs under (the state machine overrides the same values)."""

    lease: float
    max_attempts: int
    retry_base: float
    retry_max: float
    claim_batch: int
    retention: float
    max_hold: float
    attention_retention: float = 30 * 24 * 3600

    def backoff(self, attempts: int) -> float:
        """'min(RETRY_BASE * 2 ** (attempts - 1), RETRY_MAX)', with RETRY_JITTER 0."""
        return min(self.retry_base * 2 ** (attempts - 1), self.retry_max)


@dataclass
class Post:
    post_id: str
    workspace_id: str
    container_id: str
    thread_id: str
    kind: str
    body: dict[str, Any] | None
    turn_key: str | None
    queued_at: datetime
    next_at: datetime
    changed_at: datetime
    state: str = "queued"
    rev: int = 0
    attempts: int = 0
    message_ref: str | None = None
    last_error: str = ""
    last_error_cut: bool = False  # the wait was cut to MAX_HOLD: 'and the reason says so'
    claim: int | None = None  # the current claim's number while sending
    lease_until: datetime | None = None
    sent_at: datetime | None = None  # while sending: the first claim of its run of take-backs
    seq: int = 0  # the order it was queued in, among all posts (the row's id)
    thread_of: str | None = None  # the post whose thread it goes into (queue's thread_of)

    @property
    def container(self) -> tuple[str, str]:
        return (self.workspace_id, self.container_id)

    @property
    def key(self) -> tuple[datetime, int]:
        """A post's place in its container: queue order, by queued_at, then as queued ('the same
        as calling queue for each dict': a batch's list order); a rejoin keeps its seq."""
        return (self.queued_at, self.seq)


@dataclass(frozen=True)
class Claim:
    """What `claim` must hand out for one head (ClaimedPost's fields, less the source/token)."""

    number: int
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
    due: datetime  # its place in claim order: next_at, or the end of the lease taken back
    seq: int  # among heads due at one instant, the one queued first first
    # A reply's parent as it is when claimed: (post_id, state, message_ref, thread_id), the
    # state "" when it is gone (pruned); None for a post that is no reply.
    parent: tuple[str, str, str | None, str] | None = None


@dataclass
class Model:
    """One source's posts, and the holds of wider scopes (hold(scope=...))."""

    config: Config
    posts: dict[str, Post] = field(default_factory=dict)
    # hold(scope="workspace"/"source"): no post of these is claimed before the instant.
    workspace_holds: dict[str, datetime] = field(default_factory=dict)
    source_hold: datetime | None = None
    _claims: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _seqs: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    # -- producers ------------------------------------------------------------------------

    def queue(self, now: datetime, p: dict[str, Any]) -> bool:
        """'a post id that exists in any state queues nothing and returns False'."""
        if p["post_id"] in self.posts:
            return False
        due = now + timedelta(seconds=p.get("delay") or 0)  # 'queued_at is that same instant'
        self.posts[p["post_id"]] = Post(
            p["post_id"], p["workspace_id"], p["container_id"], p.get("thread_id", ""),
            p.get("kind", "message"), dict(p["body"]), p.get("turn_key"), due, due, now, seq=next(self._seqs),
            thread_of=p.get("thread_of"),
        )  # fmt: skip
        return True

    def refused_reply_fields(self, posts: list[dict[str, Any]]) -> str | None:
        """The id of the first post whose own reply fields are invalid (see refused_reply)."""
        for p in posts:
            thread_of = p.get("thread_of")
            if thread_of is not None and (
                thread_of == p["post_id"] or p.get("thread_id") or p.get("kind") == "reaction"
            ):
                return str(p["post_id"])
        return None

    def refused_reply(self, now: datetime, posts: list[dict[str, Any]]) -> str | None:
        """The id of the first post of a queue_many that its `thread_of` makes invalid, or None.

        'A thread_of naming no post of this source and container (queued before it, or earlier
        in the same queue_many), or given with thread_id, is refused'. Where the contract is
        silent the model follows the code: a post cannot reply to itself, a reaction is no
        reply, a reaction or an ephemeral has no thread, a parent still waiting in its queue
        must not be due after its reply, and a post whose id exists is not checked against its
        parent (it is not queued again). Each post's own fields are checked before any parent
        (as every field of every post is, before anything is written)."""
        if refused := self.refused_reply_fields(posts):
            return refused
        earlier: dict[str, tuple[tuple[str, str], str, str, datetime]] = {}
        for p in posts:
            post_id, thread_of = p["post_id"], p.get("thread_of")
            due = now + timedelta(seconds=p.get("delay") or 0)
            if thread_of is not None and post_id not in self.posts:
                row = self.posts.get(thread_of)
                parent = earlier.get(thread_of) or (
                    row and (row.container, row.kind, row.state, row.queued_at)
                )
                if (
                    parent is None
                    or parent[0] != (p["workspace_id"], p["container_id"])
                    or parent[1] in ("reaction", "ephemeral")
                    or (parent[2] in ("queued", "sending") and parent[3] > due)
                ):
                    return str(post_id)
            if post_id not in self.posts:
                earlier.setdefault(
                    post_id, ((p["workspace_id"], p["container_id"]), p.get("kind", "message"), "queued", due)
                )
        return None

    def queue_many(self, now: datetime, posts: list[dict[str, Any]]) -> int:
        """'the same as calling queue(**p) for each dict'."""
        return sum(self.queue(now, p) for p in posts)

    def set_status(self, now: datetime, p: dict[str, Any]) -> None:
        """Upsert of a status post (the contract's set_status paragraph)."""
        row = self.posts.get(p["post_id"])
        if row is None:
            self.queue(now, {**p, "kind": "status"})
            return
        if row.state == "uncertain" or row.body == p["body"]:
            return
        row.body, row.rev, row.changed_at = dict(p["body"]), row.rev + 1, now
        if row.state in FINISHED:
            self._rejoin(row, now)
        elif row.state == "queued":
            row.attempts = 0

    def set_status_refused(self, p: dict[str, Any]) -> bool:
        """Whether set_status must raise InvalidPost: an existing id that is not a status of
        this place. The contract is silent; the code refuses (issue 9, item 12)."""
        row = self.posts.get(p["post_id"])
        if row is None:
            return False
        place = (p["workspace_id"], p["container_id"], p.get("thread_id", ""))
        return row.kind != "status" or (row.workspace_id, row.container_id, row.thread_id) != place

    def cancel_queued(self, now: datetime, post_id: str) -> bool:
        """'a queued post becomes cancelled and its body is dropped'."""
        row = self.posts.get(post_id)
        if row is None or row.state != "queued":
            return False
        row.state, row.body, row.changed_at = "cancelled", None, now
        return True

    def retract(self, now: datetime, post_id: str) -> bool:
        """CONTRACT "Retracting a post" (both sources list "delete"): 'a queued post becomes
        cancelled (as cancel_queued); a posted one (or a sending one, which then finishes
        first) gets a post of kind delete queued behind it in its container'; False for one
        that does not exist, is cancelled, 'ended without a message', and for a second retract.

        Where the contract is silent the model follows the code (models.retraction): a message
        of its own (a message or a status) has a message while sending or with a ref, in any
        state but cancelled (a status whose edit is queued is cancelled and deleted both); a
        reaction or an ephemeral sent has none to delete. The delete carries the post's place
        and ref, `thread_of` naming it, under the id "<post_id>:delete"."""
        row = self.posts.get(post_id)
        if row is None or row.kind == "delete" or row.state == "cancelled":
            return False
        if any(r.kind == "delete" and r.thread_of == post_id for r in self.posts.values()):
            return False  # 'a second one returns False and queues nothing'
        cancel = row.state == "queued"
        delete = row.kind in ("message", "status") and (row.state == "sending" or row.message_ref is not None)
        if not (cancel or delete):
            return False
        if cancel:
            row.state, row.body, row.changed_at = "cancelled", None, now
        if delete:
            delete_id = next(
                i
                for i in (f"{post_id}:delete", *(f"{post_id}:delete:{n}" for n in range(2, 6)))
                if i not in self.posts
            )
            self.posts[delete_id] = Post(
                delete_id, row.workspace_id, row.container_id, row.thread_id, "delete", {}, None, now, now, now,
                message_ref=row.message_ref, seq=next(self._seqs), thread_of=post_id,
            )  # fmt: skip
        return True

    def requeue(self, now: datetime, post_id: str) -> bool:
        """Outbox.requeue (the admin's retry_posts): failed/uncertain to the back, attempts 0."""
        row = self.posts.get(post_id)
        if row is None or row.state not in ("failed", "uncertain") or row.body is None:
            return False
        self._rejoin(row, now)
        return True

    def _rejoin(self, row: Post, now: datetime) -> None:
        """'rejoins the back of its container's queue as queued with attempts 0'."""
        row.state, row.attempts, row.queued_at, row.next_at, row.changed_at = "queued", 0, now, now, now
        row.claim = row.lease_until = None

    def has_reply_for_turn(self, turn_key: str, prefix: str) -> bool:
        return any(r.turn_key == turn_key and r.post_id.startswith(prefix) for r in self.posts.values())

    def find(self, post_id: str) -> tuple[str, str | None] | None:
        row = self.posts.get(post_id)
        return (row.state, row.message_ref) if row else None

    # -- claims ---------------------------------------------------------------------------

    def heads(self) -> dict[tuple[str, str], Post]:
        """Each container's head: its sending post, else its first queued post in queue order.

        The contract defines the head as the first active post; a sending post stays the
        head even when a post queued later sorts before it (an older queued_at), since
        'no container ever has two posts sending' (the code does the same).
        """
        heads: dict[tuple[str, str], Post] = {}
        for row in self.posts.values():
            best = heads.get(row.container)
            if row.state not in ("queued", "sending") or (best is not None and best.state == "sending"):
                continue
            if best is None or row.state == "sending" or row.key < best.key:
                heads[row.container] = row
        return heads

    def due_heads(self, now: datetime) -> list[Claim]:
        """What a claim may take now, oldest due first, with the ClaimedPost each becomes.

        'queued ones whose next_at <= now, and sending ones whose lease has ended
        (stale=True)'; a hold of a wider scope keeps a whole workspace or source waiting.
        """
        due = []
        for row in self.heads().values():
            if self._held(row, now):
                continue
            if row.state == "queued" and row.next_at <= now:
                due.append(self._claim_of(row, now, stale=False, due=row.next_at))
            elif row.state == "sending" and row.lease_until is not None and row.lease_until <= now:
                due.append(self._claim_of(row, now, stale=True, due=row.lease_until))
        return sorted(due, key=lambda c: (c.due, c.seq))

    def _held(self, row: Post, now: datetime) -> bool:
        holds = [self.workspace_holds.get(row.workspace_id), self.source_hold]
        return any(until is not None and now < until for until in holds)

    def _claim_of(self, row: Post, now: datetime, *, stale: bool, due: datetime) -> Claim:
        """'attempts + 1, leased until now + LEASE'; sent_at: now, or the run's first claim."""
        sent_at = row.sent_at if stale and row.sent_at is not None else now
        parent = None
        if row.thread_of is not None:
            found = self.posts.get(row.thread_of)
            parent = (
                (found.post_id, found.state, found.message_ref, found.thread_id)
                if found
                else (row.thread_of, "", None, "")
            )
        return Claim(
            0, row.post_id, row.workspace_id, row.container_id, row.thread_id, row.kind, dict(row.body or {}),
            row.rev, row.attempts + 1, row.message_ref, row.turn_key, stale, sent_at,
            now + timedelta(seconds=self.config.lease), due, row.seq, parent,
        )  # fmt: skip

    def claim(self, now: datetime, post_ids: list[str]) -> list[Claim]:
        """Take these due heads (the caller checked they are a valid choice); their claims."""
        by_id = {c.post_id: c for c in self.due_heads(now)}
        claims = []
        for post_id in post_ids:
            claim = replace(by_id[post_id], number=next(self._claims))
            row = self.posts[post_id]
            row.state, row.attempts, row.claim = "sending", claim.attempts, claim.number
            # changed_at stays: a claim is written on its lane, not on the post (the contract is
            # silent; pruning measures finished posts only).
            row.lease_until, row.sent_at = claim.lease_until, claim.sent_at
            claims.append(claim)
        return claims

    # -- finishing a claim ----------------------------------------------------------------

    def current(self, claim: Claim) -> Post | None:
        """'change the row only while it is still this claim's (sending, same lease)'."""
        row = self.posts.get(claim.post_id)
        return row if row is not None and row.state == "sending" and row.claim == claim.number else None

    def posted(self, now: datetime, claim: Claim, message_ref: str | None) -> bool:
        """'if the row still holds the claimed rev: posted; otherwise back to queued for one
        more edit, at the back'; attempts 0, a one-off's body dropped, the ref kept if None."""
        row = self.current(claim)
        if row is None:
            return False
        self._release(row, now, "posted")
        row.attempts = 0
        if message_ref is not None:
            row.message_ref = message_ref
        if row.kind != "status":
            row.body = None
        if row.rev != claim.rev:
            row.state, row.queued_at, row.next_at = "queued", now, now
        return True

    def found(self, now: datetime, claim: Claim, message_ref: str) -> bool:
        """'A status goes back to queued (same place, attempts 0, ref recorded) for one edit'."""
        if claim.kind != "status":
            return self.posted(now, claim, message_ref)
        row = self.current(claim)
        if row is None:
            return False
        self._release(row, now, "queued")
        row.next_at, row.attempts, row.message_ref = now, 0, message_ref
        return True

    def retry(self, now: datetime, claim: Claim, after: float | None, reason: str) -> bool:
        """'out of attempts (claim.attempts >= MAX_ATTEMPTS) it is settle(claim, "failed")';
        otherwise queued, due after `after` or the backoff (cut to MAX_HOLD)."""
        if claim.attempts >= self.config.max_attempts:
            return self.settle(now, claim, "failed", reason)
        row = self.current(claim)
        if row is None:
            return False
        wait = self.config.backoff(claim.attempts) if after is None else after
        self._wait(row, now, wait, reason)
        return True

    def hold(self, now: datetime, claim: Claim, after: float, reason: str, scope: str = "container") -> bool:
        """'back to queued, due after `after`, and this attempt is not counted'; a wider scope
        holds every container of the workspace or source until the same instant."""
        row = self.current(claim)
        if row is None:
            return False
        until = self._wait(row, now, after, reason)
        row.attempts -= 1
        # Of two holds of one place, the later end stands (a short 429 never cuts a long one).
        if scope == "workspace":
            self.workspace_holds[row.workspace_id] = max(
                until, self.workspace_holds.get(row.workspace_id, until)
            )
        elif scope == "source":
            self.source_hold = max(until, self.source_hold or until)
        return True

    def settle(self, now: datetime, claim: Claim, state: str, reason: str = "") -> bool:
        """'failed' or 'uncertain'; the body is kept. Attempts stay (silent; the code keeps them)."""
        row = self.current(claim)
        if row is None:
            return False
        self._release(row, now, state)
        row.last_error, row.last_error_cut = reason, False
        return True

    def _wait(self, row: Post, now: datetime, wait: float, reason: str) -> datetime:
        """Back to the queue in the same place; 'a wait longer than MAX_HOLD is cut to MAX_HOLD'."""
        self._release(row, now, "queued")
        row.next_at = now + timedelta(seconds=min(wait, self.config.max_hold))
        row.last_error, row.last_error_cut = reason, wait > self.config.max_hold
        return row.next_at

    def _release(self, row: Post, now: datetime, state: str) -> None:
        row.state, row.claim, row.lease_until, row.changed_at = state, None, None, now

    # -- housekeeping ---------------------------------------------------------------------

    def prune_finished(self, now: datetime, retention: float | None) -> int:
        """'deletes finished non-status posts last changed before now - retention'; failed and
        uncertain ones before now - max(ATTENTION_RETENTION, retention)."""
        keep = self.config.retention if retention is None else retention
        cutoff = now - timedelta(seconds=keep)
        attention_cutoff = now - timedelta(seconds=max(self.config.attention_retention, keep))
        old = [
            r.post_id
            for r in self.posts.values()
            if r.state in FINISHED
            and r.kind != "status"
            and r.changed_at < (attention_cutoff if r.state in ("failed", "uncertain") else cutoff)
        ]
        for post_id in old:
            del self.posts[post_id]
        return len(old)
