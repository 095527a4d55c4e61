"""Random sequences of Outbox calls on the real database, checked step by step against tests/model.py.

Each Hypothesis example starts from empty tables: it runs in a transaction of its own that is
rolled back at its end (the cheapest fresh state on every backend; savepoints of one long
transaction instead bloat PostgreSQL's tables tenfold), so every Outbox method runs in a
caller's transaction, as an outbox is meant to be used.
After every step the rows of both sources are compared with the model field by field; each
method's return value and each claim handed out are compared where they happen.

Small alphabets of ids, places and bodies make collisions (same id, same container, same
body, same instant) common. Settings are deterministic: RETRY_JITTER 0, a 30 s lease.
`HYPOTHESIS_PROFILE=long` runs far more examples (see tests/conftest.py).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import transaction
from django.test import override_settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    multiple,
    rule,
    run_state_machine_as_test,
)

from django_connector_outbox import InvalidPost, Outbox, PostState
from django_connector_outbox.models import Post
from django_connector_outbox.posts import Finish
from tests.conftest import FakeClock
from tests.model import Claim, Config, Model

pytestmark = pytest.mark.django_db(transaction=True)

CONFIG = Config(
    lease=30,
    max_attempts=3,
    retry_base=2,
    retry_max=60,
    claim_batch=3,
    retention=7 * 24 * 3600,
    max_hold=3600,
    attention_retention=14 * 24 * 3600,
)
OUTBOX_SETTINGS = {
    "LEASE": CONFIG.lease, "MAX_ATTEMPTS": CONFIG.max_attempts, "RETRY_BASE": CONFIG.retry_base,
    "RETRY_MAX": CONFIG.retry_max, "RETRY_JITTER": 0, "CLAIM_BATCH": CONFIG.claim_batch,
    "RETENTION": CONFIG.retention, "MAX_HOLD": CONFIG.max_hold,
    "ATTENTION_RETENTION": CONFIG.attention_retention,
}  # fmt: skip

# Inputs the code cannot take yet: each stays out of the draw until it can.
PENDING: frozenset[str] = frozenset()

SOURCES = ("memory", "other")
POST_IDS = ("p1", "p1 ", "p2", "p3", "reply:1", "reply:2", "s1", "s2")  # "p1 ": ids compare exactly
WORKSPACES = ("T1", "T2")
CONTAINERS = ("C1", "C2", "C1 ")
THREADS = ("", "t1")
BODIES = ({"text": "a"}, {"text": "b"}, {"text": "c", "n": [1, 2.5, None, True]})
WAITS = (0, 1, 5, 30, 100, timedelta(seconds=45)) + (() if "max_hold" in PENDING else (7200,))
SCOPES = ({},) if "hold_scope" in PENDING else ({}, {"scope": "workspace"}, {"scope": "source"})
REASONS = ("", "flaky", "rate limited")

sources = st.sampled_from((*SOURCES[:1] * 3, *SOURCES[1:]))  # mostly one, to fill its queues
post_ids = st.sampled_from(POST_IDS)
places = st.fixed_dictionaries(
    {"workspace_id": st.sampled_from(WORKSPACES), "container_id": st.sampled_from(CONTAINERS)},
    optional={"thread_id": st.sampled_from(THREADS)},
)
bodies = st.sampled_from(BODIES)
new_posts = st.builds(
    lambda post_id, place, extra: {"post_id": post_id, **place, **extra},
    post_ids,
    places,
    st.fixed_dictionaries(
        {"body": bodies},
        optional={
            "kind": st.sampled_from(("message", "reaction", "ephemeral")),
            "turn_key": st.sampled_from((None, "k1", "k2")),
            "delay": st.sampled_from((None, 0, 1, 30, timedelta(seconds=5))),
            # A reply into the thread of an earlier post, or one refused.
            "thread_of": st.sampled_from(POST_IDS),
        },
    ),
)
reasons = st.sampled_from(REASONS)
# One finish of a claim: (method, its arguments after the claim, keyword arguments), the same
# for the Outbox and the model.
finishes = st.one_of(
    st.tuples(st.just("posted"), st.tuples(st.sampled_from((None, "m1", "m2"))), st.just({})),
    st.tuples(st.just("found"), st.tuples(st.sampled_from(("m1", "m2"))), st.just({})),
    st.tuples(st.just("retry"), st.tuples(st.sampled_from((None, *WAITS)), reasons), st.just({})),
    st.tuples(st.just("hold"), st.tuples(st.sampled_from(WAITS), reasons), st.sampled_from(SCOPES)),
    st.tuples(
        st.just("settle"), st.tuples(st.sampled_from(("failed", "uncertain", "posted")), reasons), st.just({})
    ),
)
# One field that makes a post invalid (InvalidPost, nothing written).
invalid_fields = st.sampled_from(
    (
        {"kind": "status"}, {"kind": "bogus"}, {"container_id": ""}, {"workspace_id": "w" * 256},
        {"body": ["not", "an", "object"]}, {"body": {"x": {1, 2}}}, {"delay": -1}, {"thread_id": None},
    )
)  # fmt: skip


def sender_form(finish: tuple[str, tuple[Any, ...], dict[str, str]]) -> bool:
    """Whether finish_many takes it: not a scoped hold, nor a settle to a wrong state."""
    method, args, kwargs = finish
    return not kwargs and (method != "settle" or args[0] in ("failed", "uncertain"))


def as_finish(claim: Any, method: str, args: tuple[Any, ...]) -> Finish:
    """The sender's form of one finish method call."""
    token = (claim.post_id, claim.lease_token)
    if method in ("posted", "found"):
        return Finish(*token, action=method, message_ref=args[0])
    if method == "settle":
        return Finish(*token, action=method, state=args[0], reason=args[1])
    wait = secs(args[0])
    if "mixed_waits" in PENDING and wait is not None:
        wait = float(wait)
    return Finish(*token, action=method, wait=wait, reason=args[1])


def secs(value: float | timedelta | None) -> float | None:
    return value.total_seconds() if isinstance(value, timedelta) else value


def delay_in_seconds(post: dict[str, Any]) -> dict[str, Any]:
    return {**post, "delay": secs(post.get("delay"))}


class OutboxMachine(RuleBasedStateMachine):
    """Two sources' outboxes and their models, one shared clock, every claim ever handed out."""

    claims = Bundle("claims")

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.outboxes = {source: Outbox(source, clock=self.clock) for source in SOURCES}
        self.models = {source: Model(CONFIG) for source in SOURCES}
        self.savepoint = transaction.atomic()
        self.savepoint.__enter__()

    def teardown(self) -> None:
        transaction.set_rollback(True)
        self.savepoint.__exit__(None, None, None)

    # -- producers ------------------------------------------------------------------------

    @rule(source=sources, post=new_posts, bad=st.none() | st.none() | invalid_fields)
    def queue(self, source, post, bad):
        if bad is not None:
            with pytest.raises(InvalidPost):
                self.outboxes[source].queue(**{**post, **bad})
            return
        if refused := self.models[source].refused_reply(self.clock.now, [delay_in_seconds(post)]):
            with pytest.raises(InvalidPost, match=f"post {refused!r}: thread_o"):
                self.outboxes[source].queue(**post)
            return
        got = self.outboxes[source].queue(**post)
        assert got == self.models[source].queue(self.clock.now, delay_in_seconds(post))

    @rule(source=sources, posts=st.lists(new_posts, max_size=4), bad=st.none() | invalid_fields)
    def queue_many(self, source, posts, bad):
        if bad is not None and posts:
            # The first post with a bad field is named: a reply's own fields of an earlier one,
            # else the last one's.
            first = self.models[source].refused_reply_fields(posts[:-1]) or posts[-1]["post_id"]
            posts = [*posts[:-1], {**posts[-1], **bad}]
            with pytest.raises(InvalidPost, match=repr(first)):
                self.outboxes[source].queue_many(posts)
            return
        if refused := self.models[source].refused_reply(self.clock.now, [delay_in_seconds(p) for p in posts]):
            with pytest.raises(InvalidPost, match=f"post {refused!r}: thread_o"):
                self.outboxes[source].queue_many(posts)
            return
        got = self.outboxes[source].queue_many(posts)
        assert got == self.models[source].queue_many(self.clock.now, [delay_in_seconds(p) for p in posts])

    @rule(source=sources, post_id=post_ids, place=places, body=bodies)
    def set_status(self, source, post_id, place, body):
        post = {"post_id": post_id, **place, "body": body}
        model = self.models[source]
        if model.set_status_refused(post):
            if "set_status_misuse" in PENDING:
                return
            with pytest.raises(InvalidPost):
                self.outboxes[source].set_status(**post)
            return
        assert self.outboxes[source].set_status(**post) is None
        model.set_status(self.clock.now, post)

    @rule(
        source=sources, post_id=post_ids, operation=st.sampled_from(("cancel_queued", "requeue", "retract"))
    )
    def cancel_or_requeue(self, source, post_id, operation):
        got = getattr(self.outboxes[source], operation)(post_id)
        assert got == getattr(self.models[source], operation)(self.clock.now, post_id)

    # -- readers --------------------------------------------------------------------------

    @rule(
        source=sources,
        post_id=st.sampled_from((*POST_IDS, "nope")),
        turn_key=st.sampled_from(("k1", "k2")),
        prefix=st.sampled_from(("reply:", "p")),
    )
    def read(self, source, post_id, turn_key, prefix):
        """find, has_reply_for_turn, and every due head in order as a claim would take them."""
        model, outbox = self.models[source], self.outboxes[source]
        expected = model.find(post_id)
        assert outbox.find(post_id) == (PostState(*expected) if expected else None)
        assert outbox.has_reply_for_turn(turn_key, prefix=prefix) == model.has_reply_for_turn(
            turn_key, prefix
        )
        with transaction.atomic():
            heads = outbox.claim(100, worker="peek")
            transaction.set_rollback(True)
        self.check_claim_choice(model, heads, 100)

    # -- senders --------------------------------------------------------------------------

    @rule(target=claims, source=sources, limit=st.sampled_from((None, 1, 2, 10)))
    def claim(self, source, limit):
        model = self.models[source]
        got = self.outboxes[source].claim(limit, worker="model")
        chosen = self.check_claim_choice(model, got, CONFIG.claim_batch if limit is None else limit)
        expected = model.claim(self.clock.now, chosen)
        for real, claim in zip(got, expected, strict=True):
            assert_claim(real, claim, source)
        return multiple(*((source, real, claim) for real, claim in zip(got, expected, strict=True)))

    def check_claim_choice(self, model: Model, got: list[Any], limit: int) -> list[str]:
        """'up to limit due heads, oldest next_at first': which ones, when dues tie, is free."""
        due = {c.post_id: c.due for c in model.due_heads(self.clock.now)}
        ids = [c.post_id for c in got]
        assert len(ids) == len(set(ids)) == min(limit, len(due)), (ids, due)
        assert set(ids) <= set(due), (ids, due)
        dues = [due[i] for i in ids]
        assert dues == sorted(dues), "not oldest due first"
        if ids:
            assert all(i in ids for i, at in due.items() if at < dues[-1]), "skipped an older due head"
        return ids

    @rule(claim=claims, finish=finishes)
    def finish(self, claim, finish):
        """posted, found, retry, hold or settle, fenced by a claim that may no longer be current."""
        source, real, expected = claim
        method, args, kwargs = finish
        if method == "settle" and args[0] not in ("failed", "uncertain"):
            with pytest.raises(ValueError):
                self.outboxes[source].settle(real, *args)
            return
        got = getattr(self.outboxes[source], method)(real, *args, **kwargs)
        now = self.clock.now
        assert got == getattr(self.models[source], method)(now, expected, *map(secs, args), **kwargs)

    @rule(batch=st.lists(st.tuples(claims, finishes), max_size=3, unique_by=lambda f: f[0][1].post_id))
    def finish_many(self, batch):
        """The senders' batch of finishes (one statement on PostgreSQL): each as its own method."""
        for source in SOURCES:
            mine = [(c, f) for c, f in batch if c[0] == source and sender_form(f)]
            if not mine:
                continue
            got = [
                recorded is not None
                for recorded in self.outboxes[source].finish_many(
                    [(c[1], as_finish(c[1], *f[:2])) for c, f in mine]
                )
            ]
            model, now = self.models[source], self.clock.now
            expected = [getattr(model, m)(now, c[2], *map(secs, args), **kw) for c, (m, args, kw) in mine]
            assert got == expected

    # -- time and housekeeping ------------------------------------------------------------

    @rule(seconds=st.sampled_from((0.5, 1, 5, 29, 30, 31, 100, 3600, 7 * 24 * 3600 + 1)))
    def advance(self, seconds):
        self.clock.advance(seconds)

    @rule(source=sources, retention=st.sampled_from((None, 0, 30, 3600)))
    def prune_finished(self, source, retention):
        got = self.outboxes[source].prune_finished(retention)
        assert got == self.models[source].prune_finished(self.clock.now, retention)

    # -- after every step -----------------------------------------------------------------

    @invariant()
    def rows_match_the_model(self):
        """Every post of both sources as the model has it, and never two sending in one container."""
        rows: dict[str, dict[str, dict[str, Any]]] = {source: {} for source in SOURCES}
        for row in Post.objects.with_claim().values():
            # What a user observes: a claimed post is sending, at the claim's attempt.
            rows[row["source"]][row["post_id"]] = row | {
                "state": row["current_state"],
                "attempts": row["current_attempts"],
            }
        for source, model in self.models.items():
            assert set(rows[source]) == set(model.posts), source
            for post_id, post in model.posts.items():
                assert_row(rows[source][post_id], post)
            sending = [
                (r["workspace_id"], r["container_id"])
                for r in rows[source].values()
                if r["state"] == "sending"
            ]
            assert len(sending) == len(set(sending)), sending


def assert_row(row: dict[str, Any], post: Any) -> None:
    fields = (
        "workspace_id", "container_id", "thread_id", "kind", "body", "turn_key", "state", "rev", "attempts",
        "message_ref", "last_error", "thread_of",
    )  # fmt: skip
    got = {f: row[f] for f in fields}
    expected = {f: getattr(post, f) for f in fields}
    got["changed_at"], expected["changed_at"] = row["updated_at"], post.changed_at
    if post.state in ("queued", "sending"):
        got["queued_at"], expected["queued_at"] = row["queued_at"], post.queued_at
    if post.state == "queued":
        got["next_at"], expected["next_at"] = row["next_at"], post.next_at
    if post.last_error_cut:
        assert post.last_error in got["last_error"] != post.last_error, "the reason does not say it was cut"
        got["last_error"] = post.last_error
    assert got == expected, post.post_id


def assert_claim(real: Any, claim: Claim, source: str) -> None:
    fields = (
        "post_id", "workspace_id", "container_id", "thread_id", "kind", "body", "rev", "attempts",
        "message_ref", "turn_key", "stale", "sent_at", "lease_until",
    )  # fmt: skip
    assert real.source == source
    assert {f: getattr(real, f) for f in fields} == {f: getattr(claim, f) for f in fields}
    parent = real.parent and (
        real.parent.post_id,
        real.parent.state,
        real.parent.message_ref,
        real.parent.thread_id,
    )
    assert parent == claim.parent


@pytest.mark.budget  # 30-60 s a backend: the newest Django runs it on PostgreSQL and MariaDB
def test_every_sequence_of_calls_matches_the_model():
    with override_settings(CONNECTOR_OUTBOX={**settings.CONNECTOR_OUTBOX, **OUTBOX_SETTINGS}):
        run_state_machine_as_test(OutboxMachine)


# -- defects the machine found, shrunk to plain tests -----------------------------------------


def test_a_status_that_cannot_move_is_refused_and_the_callers_transaction_goes_on(clock):
    outbox = Outbox("memory", clock=clock)
    with transaction.atomic():
        outbox.set_status("s1", workspace_id="T1", container_id="C1", body={"text": "a"})
        with pytest.raises(InvalidPost, match="container_id"):
            outbox.set_status("s1", workspace_id="T1", container_id="C2", body={"text": "a"})
        assert outbox.find("s1") == PostState("queued", None)


def test_a_batch_of_finishes_records_whole_and_fractional_waits_together(clock):
    outbox = Outbox("memory", clock=clock)
    for post_id, container_id in (("p1", "C1"), ("p2", "C2")):
        outbox.queue(post_id, workspace_id="T1", container_id=container_id, body={"text": post_id})
    first, second = outbox.claim()
    finishes = [
        (first, Finish(first.post_id, first.lease_token, "posted")),
        (second, Finish(second.post_id, second.lease_token, "retry", wait=1)),
    ]
    assert [f is not None for f in outbox.finish_many(finishes)] == [True, True]
    assert [outbox.find(p).state for p in ("p1", "p2")] == ["posted", "queued"]


def test_a_hold_longer_than_max_hold_is_cut_to_it_and_says_so(clock):
    outbox = Outbox("memory", clock=clock)
    outbox.queue("p1", workspace_id="T1", container_id="C1", body={"text": "a"})
    [claim] = outbox.claim()
    with override_settings(CONNECTOR_OUTBOX={**settings.CONNECTOR_OUTBOX, "MAX_HOLD": 3600}):
        assert outbox.hold(claim, 7200, "429") is True
    post = Post.objects.get(post_id="p1")
    assert post.next_at == clock.now + timedelta(seconds=3600)
    assert "429" in post.last_error != "429"
