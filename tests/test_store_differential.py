"""The PostgreSQL store against the ORM store: the same operations, the same results.

The ORM store is the specification; the PostgreSQL store writes the same rules again as SQL.
Hypothesis draws sequences of operations (queue, queue_many, set_status, replies with
`thread_of` and the parents their claims carry, claim, every finish
alone and in batches, a sender's turn (finishes and a claim in one call, `finish_and_claim`),
cancel, requeue, retract (and the deletes it queues), prune, time passing, a producer whose clock is behind)
and runs each on two outboxes on the same PostgreSQL database: source "memory" through the
ORM store, source "other" through the PostgreSQL store. After every step the return values
must be equal, and so must the rows: every post's fields, every lane's head and due time and
the history (models.Attempt: a row per finish that did not deliver) (ids compared by post id,
lease tokens by which claim they belong to). Paced sources (every scope, alone and
combined, with holds) compare the claims and every lane's and gate's pace time (tat) too: the
PostgreSQL store restates the GCRA of store/pacing.py in SQL. Each lane's floor may
differ between the two (each keeps a lower bound of its own), but must stay a lower bound of
its queued posts.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings
from hypothesis import example, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from django_connector_outbox import Outbox
from django_connector_outbox.models import Attempt, Gate, Lane, Post
from django_connector_outbox.posts import Action, Finish
from django_connector_outbox.store import OrmStore, PostgresStore
from tests.conftest import FakeClock

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(
        not settings.DATABASES["default"]["ENGINE"].endswith("postgresql"),
        reason="the PostgreSQL store runs on PostgreSQL only; run with DATABASE_URL pointing at PostgreSQL",
    ),
]

SOURCES = {"memory": OrmStore, "other": PostgresStore}
POST_IDS = [f"p{n}" for n in range(6)]
STATUS_IDS = ["s0", "s1"]
CONTAINERS = ["C0", "C1", "C2"]

post = st.fixed_dictionaries(
    {
        "post_id": st.sampled_from(POST_IDS),
        "workspace_id": st.just("W"),
        "container_id": st.sampled_from(CONTAINERS),
        "body": st.sampled_from([{"text": "a"}, {"text": "b"}]),
        "delay": st.sampled_from([None, 0, 5]),
        # A reply into the thread of an earlier post (or one that is refused: both alike).
        "thread_of": st.sampled_from([None, None, None, "p0", "p1", "s0"]),
    }
)
# A parent and its reply in one batch, and replies to whatever came before in one container.
thread = st.builds(
    lambda parent, reply, container, delay: [
        {"post_id": parent, "workspace_id": "W", "container_id": container, "body": {"text": "p"}},
        {"post_id": reply, "workspace_id": "W", "container_id": container, "body": {"text": "r"},
         "thread_of": parent, "delay": delay},
    ],  # fmt: skip
    st.sampled_from(POST_IDS), st.sampled_from(POST_IDS), st.sampled_from(CONTAINERS[:1]), st.sampled_from([None, 5]),
)  # fmt: skip
reply = st.fixed_dictionaries(
    {
        "post_id": st.sampled_from(POST_IDS),
        "workspace_id": st.just("W"),
        "container_id": st.just(CONTAINERS[0]),
        "body": st.just({"text": "r"}),
        "thread_of": st.sampled_from(POST_IDS + STATUS_IDS),
    }
)
finish = st.tuples(
    st.sampled_from(list(Action)),
    st.sampled_from([None, 0, 5, 10_000]),  # a wait (a retry's None: the backoff)
    st.sampled_from(["failed", "uncertain"]),  # a settle's state
    st.sampled_from(["", "workspace", "source"]),  # a hold's scope
)
operation = st.one_of(
    st.tuples(st.just("queue"), post),
    # A producer whose clock read 40 s earlier (before it waited for the lane, say): its post
    # sorts before posts queued, claimed or finished since, and must lower the floor.
    st.tuples(st.just("queue_late"), post, st.just(40)),
    st.tuples(st.just("queue_many"), st.lists(post, min_size=1, max_size=4)),
    st.tuples(st.just("queue_many"), thread),
    st.tuples(st.just("queue"), reply),
    st.tuples(
        st.just("set_status"),
        st.sampled_from(STATUS_IDS),
        st.sampled_from(CONTAINERS[:2]),
        st.sampled_from([{"text": "x"}, {"text": "y"}]),
        st.sampled_from([None, None, "p0"]),
    ),
    # Every due head at once: among heads due at the same instant, which ones a smaller claim
    # takes is not specified (the stores may differ).
    st.tuples(st.just("claim"), st.just(len(CONTAINERS))),
    st.tuples(st.just("finish"), st.lists(st.tuples(st.integers(0, 20), finish), min_size=1, max_size=3)),
    # A sender's turn: finishes (none, too) and a claim of every due head (or none) in one call.
    st.tuples(
        st.just("finish_and_claim"),
        st.lists(st.tuples(st.integers(0, 20), finish), min_size=0, max_size=3),
        st.sampled_from([0, len(CONTAINERS)]),
    ),
    st.tuples(st.just("cancel"), st.sampled_from(POST_IDS)),
    st.tuples(st.just("requeue"), st.sampled_from(POST_IDS + STATUS_IDS)),
    # A retract of a post in any state (and of its delete), whose delete is then claimed,
    # finished (a DROP too) and pruned like any post.
    st.tuples(st.just("retract"), st.sampled_from(POST_IDS + STATUS_IDS + ["p0:delete"])),
    st.tuples(st.just("advance"), st.sampled_from([1, 30, 121, 4000])),
    st.tuples(st.just("prune"), st.sampled_from([0, 3600])),
)


class Twin:
    """One source's outbox through one store, and the claims it handed out (its tokens)."""

    def __init__(self, source: str, clock: FakeClock) -> None:
        self.outbox = Outbox(source, clock=clock)
        self.outbox.store = SOURCES[source](source, "default")
        self.clock = clock
        self.claims: list = []

    def run(self, op: tuple):
        outbox = self.outbox
        match op:
            case ("queue", p):
                return outbox.queue(**p)
            case ("queue_late", p, lag):
                late = Outbox(outbox.source, clock=lambda: self.clock() - timedelta(seconds=lag))
                late.store = outbox.store
                return late.queue(**p)
            case ("queue_many", posts):
                return outbox.queue_many(posts)
            case ("set_status", post_id, container, body, thread_of):
                return outbox.set_status(
                    post_id, workspace_id="W", container_id=container, body=body, thread_of=thread_of
                )
            case ("claim", limit):
                claims = outbox.claim(limit, worker="w")
                self.claims += claims
                return [self.comparable(c) for c in claims]
            case ("finish", picks):
                chosen = self.chosen(picks)
                return self.comparable_recorded(chosen, outbox.finish_many(chosen))
            case ("finish_and_claim", picks, limit):
                chosen = self.chosen(picks)
                recorded, claims = outbox.finish_and_claim(chosen, limit, worker="w")
                self.claims += claims
                return self.comparable_recorded(chosen, recorded), [self.comparable(c) for c in claims]
            case ("cancel", post_id):
                return outbox.cancel_queued(post_id)
            case ("requeue", post_id):
                return outbox.requeue(post_id)
            case ("retract", post_id):
                return outbox.retract(post_id)
            case ("prune", retention):
                return outbox.prune_finished(retention)
        raise AssertionError(op)

    def chosen(self, picks):
        """The finishes of the claims that `picks` choose (one per post: the last pick of it)."""
        chosen = {}
        for index, (action, wait, state, scope) in picks:
            if self.claims:
                claim = self.claims[index % len(self.claims)]
                chosen[claim.post_id] = (claim, self.as_finish(claim, action, wait, state, scope))
        return list(chosen.values())

    def comparable_recorded(self, chosen, recorded):
        return [(c.post_id, self.comparable_finish(f)) for (c, _), f in zip(chosen, recorded, strict=True)]

    @staticmethod
    def as_finish(claim, action, wait, state, scope):
        if action == Action.SETTLE:
            return Finish(claim.post_id, claim.lease_token, action, state=state, reason="settled")
        if action == Action.RETRY:
            return Finish(claim.post_id, claim.lease_token, action, wait=wait)
        if action == Action.HOLD:
            return Finish(claim.post_id, claim.lease_token, action, wait=wait or 0, reason="429", scope=scope)
        # A reply is recorded with the thread it went into (the sender's resolved thread_id).
        thread = None if claim.parent is None else f"thread-{claim.parent.post_id}"
        return Finish(
            claim.post_id, claim.lease_token, action, message_ref=f"ref-{claim.post_id}", reason="r",
            thread_id=thread,
        )  # fmt: skip

    def token(self, token: str) -> int | str:
        """Which claim a lease token belongs to (tokens are random; their order is not)."""
        for n, claim in enumerate(self.claims):
            if claim.lease_token == token:
                return n
        return token

    def comparable(self, claim):
        fields = {k: v for k, v in vars(claim).items() if k not in ("source", "lease_token")}
        return fields | {"lease_token": self.token(claim.lease_token)}

    @staticmethod
    def comparable_finish(f):
        return None if f is None else (f.action, f.state, f.message_ref, f.wait, f.reason)

    def rows(self):
        source = self.outbox.source
        posts = [
            {k: v for k, v in row.items() if k not in ("id", "source", "lane_id")}
            | {"lease_token": self.token(row["lease_token"])}
            for row in Post.objects.filter(source=source).with_claim().order_by("post_id").values()
        ]
        heads = dict(Post.objects.filter(source=source).values_list("pk", "post_id"))
        # Lanes of posts only: PostgreSQL's insert makes the lane of each place of a batch
        # before it knows which ids are new, so a lane may exist without posts (no head, never
        # due: claims cannot see it).
        lanes = [
            (w, c, heads.get(head), due)
            for w, c, head, due, tat in Lane.objects.filter(source=source, posts__isnull=False)
            .distinct()
            .order_by("workspace_id", "container_id")
            .values_list("workspace_id", "container_id", "head_id", "due_at", "pace_tat")
        ]
        gates = sorted(
            Gate.objects.filter(source=source).values_list(
                "scope", "workspace_id", "container_id", "held_until", "pace_tat"
            )
        )
        # The history: a row per finish that did not deliver (a batch's in any order).
        history = sorted(
            Attempt.objects.filter(post__source=source).values_list(
                "post__post_id", "at", "attempt", "outcome", "reason", "worker"
            )
        )
        return posts, lanes, gates, history

    def floors_are_lower_bounds(self) -> bool:
        """No queued post of a lane sorts before its floor (where the floor is known)."""
        for lane in Lane.objects.filter(source=self.outbox.source, floor_queued_at__isnull=False):
            queued = Post.objects.filter(lane=lane, state="queued").values_list("queued_at", "pk")
            if any((at, pk) < (lane.floor_queued_at, lane.floor_id) for at, pk in queued):
                return False
        return True


def outcome(twin: Twin, op: tuple):
    """What the operation returned, or the error it raised (both stores must raise alike)."""
    try:
        return twin.run(op)
    except Exception as e:
        return ("raised", type(e).__name__, str(e))


# Replies and their parents, more densely than `operation` draws them: parents posted, failed,
# cancelled or pruned before their replies are claimed.
claim_all = st.tuples(st.just("claim"), st.just(len(CONTAINERS)))
thread_operation = st.one_of(
    st.tuples(st.just("queue_many"), thread),
    st.tuples(st.just("queue"), reply),
    claim_all,
    claim_all,
    # The latest claim, mostly delivered, so that the replies behind it are claimed next.
    st.tuples(
        st.just("finish"),
        st.lists(
            st.tuples(
                st.just(-1),
                st.tuples(
                    st.sampled_from(
                        [Action.POSTED, Action.POSTED, Action.FOUND, Action.SETTLE, Action.RETRY]
                    ),
                    st.just(0),
                    st.sampled_from(["failed", "uncertain"]),
                    st.just(""),
                ),
            ),
            min_size=1,
            max_size=1,
        ),
    ),
    st.tuples(st.just("finish"), st.just([(-1, (Action.POSTED, 0, "failed", ""))])),
    # The latest claim delivered, and the reply behind it claimed in the same turn.
    st.tuples(
        st.just("finish_and_claim"),
        st.just([(-1, (Action.POSTED, 0, "failed", ""))]),
        st.just(len(CONTAINERS)),
    ),
    st.tuples(st.just("cancel"), st.sampled_from(POST_IDS)),
    st.tuples(st.just("advance"), st.sampled_from([1, 121])),
    st.tuples(st.just("prune"), st.just(0)),
)


def status(post_id: str, container: str, text: str) -> tuple:
    return ("set_status", post_id, container, {"text": text}, None)


def finish_last(action: Action, state: str = "") -> tuple:
    return ("finish", [(-1, (action, 0, state, ""))])


@hypothesis_settings(max_examples=150)
@given(operations=st.lists(operation, min_size=1, max_size=40))
# A status post replaced in each state: sending (its claim goes on, its attempts kept), queued
# after a retry (its attempts start again), and back into its queue from posted (its lane had
# no head left), failed and cancelled: REPLACE_STATUS against OrmStore.replace_status.
@example(
    operations=[status("s0", "C0", "x"), ("claim", 3), finish_last(Action.RETRY), ("advance", 4000),
                ("claim", 3), status("s0", "C0", "y"), finish_last(Action.RETRY), ("advance", 4000),
                status("s0", "C0", "x"), ("claim", 3), finish_last(Action.POSTED), status("s0", "C0", "y"),
                ("claim", 3)],
)  # fmt: skip
@example(
    operations=[status("s1", "C1", "x"), ("claim", 3), finish_last(Action.SETTLE, "failed"),
                status("s1", "C1", "y"), ("cancel", "s1"), status("s1", "C1", "x"), ("claim", 3)],
)  # fmt: skip
# Retracts: of a posted post (its delete claimed and posted), of a sending one whose send then
# fails (its delete dropped), of a queued status edit (cancelled, and its message deleted).
@example(
    operations=[("queue", {"post_id": "p0", "workspace_id": "W", "container_id": "C0", "body": {"text": "a"},
                           "delay": None, "thread_of": None}),
                ("claim", 3), finish_last(Action.POSTED), ("retract", "p0"), ("retract", "p0"), ("claim", 3),
                finish_last(Action.POSTED), ("retract", "p0:delete"),
                ("queue", {"post_id": "p1", "workspace_id": "W", "container_id": "C1", "body": {"text": "b"},
                           "delay": None, "thread_of": None}),
                ("claim", 3), ("retract", "p1"), finish_last(Action.SETTLE, "failed"), ("claim", 3),
                finish_last(Action.DROP), ("retract", "p1"),
                status("s0", "C2", "x"), ("claim", 3), finish_last(Action.POSTED), status("s0", "C2", "y"),
                ("retract", "s0"), ("claim", 3), finish_last(Action.POSTED), ("advance", 4000), ("prune", 0)],
)  # fmt: skip
def test_the_postgresql_store_does_what_the_orm_store_does(operations):
    run_twins(operations)


@hypothesis_settings(max_examples=40)
@given(operations=st.lists(thread_operation, min_size=12, max_size=24))
def test_replies_and_the_parents_their_claims_carry_are_alike(operations):
    run_twins(operations)


# Paced sources: bursts into four lanes of two workspaces, claims of every due head, the
# latest claims mostly delivered (so that the heads behind them meet their paces), clock steps
# that land on the paces' intervals (Discord's 3 per 0.063 s among them), holds of every scope
# (`finish`), and pruning, which deletes idle gates that a later claim must make again.
WORKSPACES = ["W0", "W1"]
PACED_CONTAINERS = CONTAINERS[:2]
paced_post = st.fixed_dictionaries(
    {
        "post_id": st.sampled_from(POST_IDS),
        "workspace_id": st.sampled_from(WORKSPACES),
        "container_id": st.sampled_from(PACED_CONTAINERS),
        "body": st.just({"text": "a"}),
        "delay": st.sampled_from([None, None, None, 1]),
    }
)
claim_every_lane = st.tuples(st.just("claim"), st.just(len(WORKSPACES) * len(PACED_CONTAINERS)))
deliver_latest = st.tuples(
    st.just("finish"),
    st.integers(1, 4).map(lambda n: [(-1 - i, (Action.POSTED, 0, "failed", "")) for i in range(n)]),
)
paced_operation = st.one_of(
    st.tuples(st.just("queue_many"), st.lists(paced_post, min_size=1, max_size=6)),
    st.tuples(st.just("queue"), paced_post),
    claim_every_lane,
    claim_every_lane,
    deliver_latest,
    deliver_latest,
    st.tuples(st.just("finish"), st.lists(st.tuples(st.integers(0, 20), finish), min_size=1, max_size=3)),
    st.tuples(st.just("advance"), st.sampled_from([0.021, 0.25, 0.5, 0.75, 1, 121])),
    st.tuples(st.just("advance"), st.sampled_from([0.021, 0.5, 121])),
    st.tuples(st.just("prune"), st.sampled_from([0, 3600])),
    st.tuples(st.just("cancel"), st.sampled_from(POST_IDS)),
)
pace = st.fixed_dictionaries(
    {},
    optional={
        "container": st.sampled_from([(1, 1.0), (2, 1.0), (3, 0.063)]),
        "workspace": st.sampled_from([(1, 0.5), (2, 1.0), (3, 0.063), (4, 3.0)]),
        "source": st.sampled_from([(1, 0.5), (3, 0.063), (5, 1.0)]),
    },
).filter(bool)


def burst(*places: tuple[str, str]) -> tuple:
    return ("queue_many", [
        {"post_id": f"p{n}", "workspace_id": w, "container_id": c, "body": {"text": "a"}}
        for n, (w, c) in enumerate(places)
    ])  # fmt: skip


@hypothesis_settings(max_examples=60)  # drawn, beside the pinned examples below
@given(paces=pace, operations=st.lists(paced_operation, min_size=10, max_size=40))
# A container's second post, claimed at the instant its tat is exactly the burst tolerance ahead.
@example(
    paces={"container": (2, 1.0)},
    operations=[burst(("W0", "C0"), ("W0", "C0"), ("W0", "C0")), ("claim", 4), ("finish", [(-1, (Action.POSTED, 0, "", ""))]),
                ("claim", 4)],
)  # fmt: skip
# Discord's source pace one interval after a full burst: one more claim, not two.
@example(
    paces={"source": (3, 0.063)},
    operations=[burst(*[(w, c) for w in WORKSPACES for c in PACED_CONTAINERS] * 2), ("claim", 4),
                ("finish", [(-n, (Action.POSTED, 0, "", "")) for n in (1, 2, 3)]), ("advance", 0.021), ("claim", 4)],
)  # fmt: skip
def test_paced_claims_are_alike(paces, operations):
    run_twins(operations, paces)


def run_twins(operations, paces=None):
    assert connection.vendor == "postgresql"
    Post.objects.all().delete()
    Lane.objects.all().delete()
    Gate.objects.all().delete()
    clock = FakeClock()
    connectors = {
        name: config | ({} if paces is None else {"PACE": paces})
        for name, config in settings.CONNECTOR_OUTBOX["CONNECTORS"].items()
    }
    with override_settings(
        CONNECTOR_OUTBOX={
            **settings.CONNECTOR_OUTBOX, "RETRY_JITTER": 0, "MAX_ATTEMPTS": 3, "CONNECTORS": connectors
        }
    ):
        orm, sql = Twin("memory", clock), Twin("other", clock)
        for step, op in enumerate(operations):
            if op[0] == "advance":
                clock.advance(op[1])
                continue
            expected, got = outcome(orm, op), outcome(sql, op)
            assert got == expected, f"step {step}: {op}"
            assert sql.rows() == orm.rows(), f"rows after step {step}: {op}"
            for twin in (orm, sql):
                assert twin.floors_are_lower_bounds(), f"floors after step {step}: {op}"
