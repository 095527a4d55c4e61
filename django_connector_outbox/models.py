"""The outbox tables: one row per post, and one row per container (its lane).

Why a lane table: a claimer must find due *heads* without walking the posts queued behind
them. Each lane records its head and when that head is next due (its `next_at` while queued,
its lease end while sending), so a claim is an index range scan over `Lane.due_at` whatever
the backlog. Every write that can change a lane's head locks the lane row first; claimers
lock lanes with SKIP LOCKED, so the lane row is also what keeps one post per container in
flight.

Why the lease is on the lane: a claim is written where it is made, so that a delivered post
is written once, when it is finished (the claim used to rewrite the post too: a second
non-HOT update of a row with six indexes). A post is `sending` while it is its lane's head
and the lane holds a lease (`Lane.lease_token`); its own `state` column then still says
`queued`, which is what it goes back to if the claim is given back. `PostQuerySet.with_claim`
and `in_state` read a post's state with its lane's lease: read posts through them.

The rule book: every rule about rows is defined here once, by name, in the querysets
(`PostQuerySet`, `LaneQuerySet`, `GateQuerySet`) and the expressions beside them (`leased`,
`sending`, `head_rule`, `floor_rule`, `place`): which lanes are due, leased, unheld or let
through by their pace, which posts are sending, what a lane's head is, which gates reach a
place. The store applies them; the SQL of store/postgres.py restates them in fragments named
after them (tests/test_rule_book.py runs each against its rule); everything else reads rows
through them or the Outbox, and no other module names the columns they are about
(`lease_token`, `head_id`, `pace_tat`: the same test).

Queue order: a container's posts go by (queued_at, id), `QUEUE_ORDER`. The id is the
insertion sequence (every insert assigns ids in the order of its rows, on every database),
so posts queued at one instant (a `queue_many` batch shares its `queued_at`, as do `queue`
calls under a clock that did not move) keep the order they were queued in; never the post
ids' alphabetical order. A post that rejoins the back of its queue (`set_status` of a
finished post, an operator's retry) takes a new `queued_at` and keeps its id: it goes behind
the posts queued at earlier instants, but among posts that share its instant (a clock that
did not move) by its first insertion.

Pruning (Outbox.prune_finished, housekeeping): finished posts go after their retention
(`PostQuerySet.prunable`), and then a lane left with no post at all goes too
(`LaneQuerySet.prunable`), unless its pace still counts. A lane has no "idle since" column: a
post leaves the table only by pruning, which deletes posts unchanged since its cutoff, so a
lane without posts has been idle since before the cutoff of the pruning that emptied it (a
status post's, when STATUS_RETENTION is shorter). Its one timed state of its own, the pace, is
checked against the cutoff as a gate's is: a lane paced since then is kept, so that deleting
it never gives its container a burst that its pace would not. Its floor is only a hint, and a
lease or a head needs a post. A lane recreated later (the next post of its container) starts
fresh: no pace, no floor. A column set when a lane loses its last head would be written by
every finish that empties a lane, for no lane pruned sooner than the cutoff allows anyway.

Deleting a lane is safe against producers (store/__init__.py): a post is inserted only into a
lane the producer holds locked, the pruner locks the lanes it deletes with SKIP LOCKED and
deletes them in the next statement only if they still have no post, and a producer whose lane
was deleted between its read and its lock creates it again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.db.models import BooleanField, Case, Exists, Expression, F, OuterRef, Q, Subquery, Value, When
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from django_connector_outbox.posts import (
    ACTIVE_STATES,
    ATTENTION_STATES,
    FINISHED_STATES,
    HISTORY_OUTCOMES,
    INSTALL_AGAIN,
    MESSAGE_KINDS,
    RETRYABLE_STATES,
    WAITING_STATES,
    Kind,
    Scope,
    State,
)

ID_LENGTH = 255
# The order of a container's posts (see the module): every ORDER BY of queue order uses it.
QUEUE_ORDER = ("queued_at", "id")
# Finished posts that wait for no one, pruned after RETENTION; failed and uncertain ones
# (RETRYABLE_STATES) wait for a person and are kept for ATTENTION_RETENTION.
DONE_STATES = (State.POSTED, State.CANCELLED)


def leased(prefix: str = "") -> Q:
    """The rule "a claim is on it": a lane that holds a lease (`prefix`: the path to the lane,
    "lane__" from a post). Its head is `sending`; every read of "sending" is built on this."""
    return ~Q(**{f"{prefix}lease_token": ""})


def sending() -> Q:
    """The rule "sending", read from a post row: it is its lane's head and the lane is leased
    (its own state column still says queued: see the module)."""
    return Q(state=State.QUEUED, lane__head_id=F("pk")) & leased("lane__")


def failed_for_installation() -> Q:
    """The rule "it failed for want of an installation", read from a post row: failed, with a
    reason that ends with posts.INSTALL_AGAIN."""
    return Q(state=State.FAILED, last_error__endswith=f": {INSTALL_AGAIN}")


class PostQuerySet(models.QuerySet["Post"]):
    def active(self) -> PostQuerySet:
        return self.filter(state__in=ACTIVE_STATES)

    def in_state(self, state: str) -> PostQuerySet:
        return self.in_states([state])

    def in_states(self, states: Iterable[str]) -> PostQuerySet:
        """The posts in any of `states`, `sending` being read from their lanes' leases (see the
        module): the leased heads, which their own rows still call `queued`."""
        wanted = set(states)
        leased = Lane.objects.using(self.db).leased().head_ids()
        match = Q(state__in=sorted(wanted - {State.QUEUED, State.SENDING}))
        if State.QUEUED in wanted:
            match |= Q(state=State.QUEUED) & ~Q(pk__in=leased)
        if State.SENDING in wanted:
            match |= Q(state=State.QUEUED, pk__in=leased)
        return self.filter(match)

    def with_claim(self) -> PostQuerySet:
        """Each post with what a claim makes of it: `current_state` (`sending` while its lane's
        lease is on it, else its state), and while sending `current_attempts` (this claim's
        attempt), `lease_token`, `lease_until`, `worker` and `sent_at`; the lease fields are
        None otherwise, and `current_attempts` is its attempts."""
        leased = sending()

        def while_leased(field: str) -> Case:
            return Case(When(leased, then=F(f"lane__{field}")), default=None)

        return self.annotate(
            current_state=Case(When(leased, then=Value(State.SENDING)), default=F("state")),
            current_attempts=Case(When(leased, then=F("lane__attempts")), default=F("attempts")),
            lease_token=while_leased("lease_token"),
            lease_until=while_leased("due_at"),
            worker=while_leased("worker"),
            sent_at=while_leased("sent_at"),
        )

    def prunable(
        self, cutoff: datetime, attention_cutoff: datetime, status_cutoff: datetime | None = None
    ) -> PostQuerySet:
        """The posts that pruning deletes: those `finished_before` the cutoffs, less any that a
        lane names as its head (a head is never finished, but a lane that drifted, after a
        manual UPDATE or a restore, may name one, and its foreign key would refuse the delete;
        repair puts the lane right and the post goes at a later prune)."""
        named = Lane.objects.naming_head(OuterRef("pk"))
        return self.filter(finished_before(cutoff, attention_cutoff, status_cutoff)).exclude(Exists(named))

    def outliving(
        self, cutoff: datetime, attention_cutoff: datetime, status_cutoff: datetime | None = None
    ) -> PostQuerySet:
        """The posts that pruning at these cutoffs keeps (what a dry run counts lanes by)."""
        return self.exclude(finished_before(cutoff, attention_cutoff, status_cutoff))

    def finished(self) -> PostQuerySet:
        return self.filter(state__in=FINISHED_STATES)

    def deleting(self, post_id: str) -> PostQuerySet:
        """The delete that a retract queued for the post `post_id` (kind delete, `thread_of`
        naming it), whatever became of it: at most one, under one of `delete_ids(post_id)`, so
        a second retract finds it by the unique index of post ids."""
        return self.filter(post_id__in=delete_ids(post_id), kind=Kind.DELETE, thread_of=post_id)

    def waiting_for_installation(self) -> PostQuerySet:
        """Posts that wait for their workspace's installation: the queued ones, which it will
        send, and those that failed for want of it (`failed_for_installation`), which a
        re-install lets an operator retry; never those that failed of another cause (a gone
        channel, a refused body), which no installation will help.

        Counted per row of the installations' admin list by the partial index
        connector_outbox_post_waiting (migration 0016: WHERE state IN WAITING_STATES, by
        (source, workspace_id); without it, a scan of every queued and failed post of the
        source per row, 2 s a page at 10 million posts in bench/soak.py). Posted posts, most of
        the table, are not in it. MySQL/MariaDB have no partial indexes: none there. So the
        query states the index's condition whole, and narrows the failed ones after it.

        The index asks for a named workspace too (`workspace_id > ''`: every post names one),
        so that only a query that says so can use it: with the state alone in its condition,
        a probe of a lane's queued posts could, and after an ANALYZE that saw an empty queue
        the planner chose to scan the whole index, "a page of nothing", over the lane's key,
        then scanned the whole backlog once per lane (migration 0017; tests/test_plans.py)."""
        return self.filter(state__in=WAITING_STATES, workspace_id__gt="").filter(
            Q(state=State.QUEUED) | failed_for_installation()
        )

    def failed_for_installation(self) -> PostQuerySet:
        """Failed posts whose workspace had no usable installation (none, revoked, no token):
        their reason ends with the advice of installations.NotInstalled (posts.INSTALL_AGAIN), which is the only record of why a post failed."""
        return self.filter(failed_for_installation())

    def retryable(self) -> PostQuerySet:
        """Failed and uncertain posts: what waits for a person (an operator's retry)."""
        return self.filter(state__in=RETRYABLE_STATES)

    def sent_back(self, now: datetime) -> PostQuerySet:
        """Queued posts that wait past `now` after a retry or a hold: past the place they keep
        (a delayed post waits too, but in its place: its queue time is its due time)."""
        return self.in_state(State.QUEUED).filter(next_at__gt=now).filter(next_at__gt=F("queued_at"))

    def needing_attention(self) -> PostQuerySet:
        return self.filter(state__in=ATTENTION_STATES)

    def oldest_due(self, now: datetime) -> PostQuerySet:
        """Queued posts that are due, the longest waiting first: "oldest due" for the admin's
        health header and the sender's summary line alike."""
        return self.in_state(State.QUEUED).filter(next_at__lte=now).order_by(*QUEUE_ORDER)


# The suffix of the post id of a retract's delete: "p1" is deleted by "p1:delete".
DELETE_SUFFIX = ":delete"


def delete_ids(post_id: str) -> list[str]:
    """The post ids a retract's delete of `post_id` may take, the first free one: "p1:delete",
    then "p1:delete:2", ... (a caller may have queued one of these itself). An id too long to
    take the suffix keeps a digest of itself instead of its tail, so that two long ids that
    share their start never share their deletes' ids."""
    base = post_id + DELETE_SUFFIX
    if len(base) > ID_LENGTH - 2:  # room for the ":2" .. ":5" of ids taken already
        digest = hashlib.sha256(post_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        tail = f":{digest}{DELETE_SUFFIX}"
        base = post_id[: ID_LENGTH - 2 - len(tail)] + tail
    return [base, *(f"{base}:{n}" for n in range(2, 6))]


class Retraction(NamedTuple):
    """What a retract does to a post (`retraction`)."""

    cancel: bool  # it is cancelled (as cancel_queued): never sent, or never edited again
    delete: bool  # a delete of its message is queued behind it


def retraction(kind: str, state: str, message_ref: str | None) -> Retraction:
    """The rule of retracting a post of `kind`, in `state` (its current state: sending read
    from its lane), with `message_ref`: a queued post is cancelled; a message of its own
    (posts.MESSAGE_KINDS) that is, or may soon be, on the platform gets a delete: one being
    sent (its ref comes when it finishes), and one with a ref, in any state but cancelled (a
    posted one; a status whose edit is queued, failed or uncertain: its message is there all
    the same). Nothing else: a post ended without a message, a reaction or an ephemeral sent,
    a cancelled post, a delete."""
    if kind == Kind.DELETE or state == State.CANCELLED:
        return Retraction(cancel=False, delete=False)
    has_message = kind in MESSAGE_KINDS and (state == State.SENDING or bool(message_ref))
    return Retraction(cancel=state == State.QUEUED, delete=has_message)


def finished_before(cutoff: datetime, attention_cutoff: datetime, status_cutoff: datetime | None) -> Q:
    """The age rule of pruning: one-off posts posted or cancelled before `cutoff` (RETENTION),
    failed or uncertain before `attention_cutoff` (they wait for a person); status posts, in
    any finished state, before `status_cutoff` (STATUS_RETENTION); None: never, since
    set_status may edit them again for as long as they are kept."""
    one_off = Q(state__in=DONE_STATES, updated_at__lt=cutoff) | Q(
        state__in=RETRYABLE_STATES, updated_at__lt=attention_cutoff
    )
    old = one_off & ~Q(kind=Kind.STATUS)
    if status_cutoff is not None:
        old |= Q(kind=Kind.STATUS, state__in=FINISHED_STATES, updated_at__lt=status_cutoff)
    return old


class LaneQuerySet(models.QuerySet["Lane"]):
    """The rules about lanes, by name: the store's claim, finish and repair, and the SQL of
    store/postgres.py, which restates them (tests/test_rule_book.py holds the two together)."""

    def of_source(self, source: str) -> LaneQuerySet:
        return self.filter(source=source)

    def leased(self) -> LaneQuerySet:
        """Lanes a claim is on (see `leased`)."""
        return self.filter(leased())

    def due(self, now: datetime) -> LaneQuerySet:
        """Lanes whose head may be claimed at `now`: a queued head that is due, or a lease that
        has ended (its head is taken back stale)."""
        return self.filter(due_at__lte=now)

    def in_claim_order(self) -> LaneQuerySet:
        """By due time, and among lanes due at one instant by head, the head queued first first
        (the lane index's order: see Lane.Meta)."""
        return self.order_by("due_at", "head_id")

    def unheld(self, now: datetime) -> LaneQuerySet:
        """Lanes that no hold in force reaches: not their container's, workspace's or source's
        (GateQuerySet.reaching_lanes)."""
        holds = Gate.objects.using(self.db).reaching_lanes().holding(now)
        return self.exclude(Exists(holds))

    def pace_allows(self, now: datetime, tolerance: timedelta) -> LaneQuerySet:
        """Lanes whose container pace lets a claim through at `now`: never paced, or a pace
        time within the burst tolerance (store/pacing.py: allowed while now >= tat - tolerance)."""
        return self.filter(Q(pace_tat__isnull=True) | Q(pace_tat__lte=now + tolerance))

    def head_ids(self) -> models.QuerySet[Lane, Any]:
        """The posts these lanes name as their heads (a subquery)."""
        return self.filter(head__isnull=False).values("head_id")

    def naming_head(self, post: Any) -> LaneQuerySet:
        """Lanes that name `post` (a pk, or OuterRef("pk")) as their head."""
        return self.filter(head_id=post)

    def held_by(self, token: str) -> LaneQuerySet:
        """Lanes under this very lease (fencing: a lease once replaced never comes back)."""
        return self.filter(lease_token=token)

    def held_by_any(self, tokens: Iterable[str]) -> LaneQuerySet:
        """Lanes under any of these leases (`held_by`)."""
        return self.filter(lease_token__in=list(tokens))

    def running(self, now: datetime) -> LaneQuerySet:
        """Leased lanes whose lease has not ended at `now` (of leased lanes, those not `due`)."""
        return self.leased().filter(due_at__gt=now)

    def prunable(self, cutoff: datetime, posts: models.QuerySet[Post, Any] | None = None) -> LaneQuerySet:
        """The lanes that pruning deletes (see the module): no post at all, hence no head and
        no lease, and no pace time since `cutoff`. `posts`: the posts that count (all of them;
        a dry run passes those that would outlive it, `PostQuerySet.outliving`)."""
        unpaced = Q(pace_tat__isnull=True) | Q(pace_tat__lt=cutoff)
        return self.filter(unpaced, head__isnull=True, lease_token="").postless(posts)

    def postless(self, posts: models.QuerySet[Post, Any] | None = None) -> LaneQuerySet:
        """Lanes with no post (of `posts`, all of them by default): the part of `prunable` that
        a lane's lock does not freeze for its holder's snapshot (a producer that held the lane
        and committed may have added one), read again by the statement that deletes."""
        posts = Post.objects.all() if posts is None else posts
        return self.exclude(Exists(posts.filter(lane_id=OuterRef("pk"))))

    def refresh_heads(self, *, release: bool = False) -> int:
        """Point each lane (locked by the caller) at its head and the head's due time, by
        `head_rule`, and its floor, by `floor_rule`; `release`: the lease it held has ended, and
        it is freed. One statement however many lanes."""
        if release:
            return self.update(lease_token="", **head_rule(leased=False), **floor_rule())
        return self.update(**head_rule(), **floor_rule())


# The fields of a lane that `head_rule` decides.
HEAD_FIELDS = ("head_id", "due_at", "lease_token")


class _QueuedOf(Expression):
    """`state = 'queued'` of a post of lane `lane`; on PostgreSQL, as the row comparisons
    (lane_id, state) >= (lane, 'queued') AND (lane_id, state) <= (lane, 'queued'), which only
    an index that starts with (lane, state) can serve (see `queued_in_lane`)."""

    output_field = BooleanField()
    conditional = True

    def __init__(self, lane: Any) -> None:
        super().__init__()
        lane = lane if hasattr(lane, "resolve_expression") else Value(lane)
        self.parts: list[Any] = [F("lane_id"), F("state"), lane, Value(State.QUEUED)]

    def get_source_expressions(self) -> list[Any]:
        return self.parts

    def set_source_expressions(self, exprs: Sequence[Any]) -> None:
        self.parts = list(exprs)

    def as_sql(self, compiler: Any, connection: Any) -> Any:
        _, state, _, queued = (compiler.compile(part) for part in self.parts)
        return f"{state[0]} = {queued[0]}", (*state[1], *queued[1])

    def as_postgresql(self, compiler: Any, connection: Any) -> Any:
        lane_id, state, lane, queued = (compiler.compile(part) for part in self.parts)
        columns, values = f"ROW({lane_id[0]}, {state[0]})", f"ROW({lane[0]}, {queued[0]})"
        params = (*lane_id[1], *state[1], *lane[1], *queued[1])
        return f"({columns} >= {values} AND {columns} <= {values})", params * 2


def queued_in_lane(lane: Any) -> Q:
    """The rule "a queued post of this lane" (`lane`: an id or an expression, OuterRef("pk") from
    a lane), probed by the lane's key on connector_outbox_post_order whatever the statistics.

    With `state = 'queued'` in it, PostgreSQL's planner may read it through an index that
    starts with the state (connector_outbox_post_state) instead: after an ANALYZE that saw no
    queued post, both probes are estimated at one row, and that index's is the cheaper; then
    a backlog comes, and every probe walks it whole (bench/soak.py --sustain stalled a sender
    for a minute, tests/test_plans.py). Stated by row comparisons that start with the lane, the
    state is no condition of its own there, and only (lane, state, ...) can serve it.
    MySQL/MariaDB estimate from the index itself, and SQLite has no such statistics: the plain
    form there."""
    return Q(lane_id=lane) & Q(_QueuedOf(lane))


def first_in_queue() -> PostQuerySet:
    """The queued posts of the lane of an outer query (OuterRef("pk")) in queue order: its
    first is the head of a lane without a lease, and its floor."""
    return Post.objects.filter(queued_in_lane(OuterRef("pk"))).order_by(*QUEUE_ORDER)


def head_rule(*, leased: bool = True) -> dict[str, Any]:
    """What a lane's head_id, due_at and lease_token must be, as expressions over the lane row.

    The one definition of a head: the post its lease is on while it holds one (one post per
    container is in flight, whatever was queued meanwhile), due when the lease ends; else its
    first `queued` post in queue order (QUEUE_ORDER), due at its next_at; no head, no due
    time. Each part is one seek on connector_outbox_post_order, however long the queue behind
    the head. `leased=False`: for a lane whose lease is being released in the same UPDATE.

    A lease is never dropped while the lane has a queued post: if its head is not a queued
    post of the lane (a bug, a manual UPDATE), the lane's oldest queued post takes its place
    under the lease, so that when the lease ends it is taken back stale and looked up before
    anything is sent: the post that was in flight may have been that one.
    """

    def first(field: str) -> Subquery:
        return Subquery(first_in_queue().values(field)[:1])

    if not leased:
        return {"head_id": first("pk"), "due_at": first("next_at")}
    holds_lease = ~Q(lease_token="") & Q(Exists(Post.objects.filter(queued_in_lane(OuterRef("pk")))))
    head_queued = Exists(Post.objects.filter(queued_in_lane(OuterRef("pk")), pk=OuterRef("head_id")))
    return {
        "head_id": Case(When(holds_lease & Q(head_queued), then=F("head_id")), default=first("pk")),
        "due_at": Case(When(holds_lease, then=F("due_at")), default=first("next_at")),
        "lease_token": Case(When(holds_lease, then=F("lease_token")), default=Value("")),
    }


def floor_rule() -> dict[str, Any]:
    """A lane's floor (Lane): its first queued post's place, or unknown without one."""
    return {
        "floor_queued_at": Subquery(first_in_queue().values("queued_at")[:1]),
        "floor_id": Subquery(first_in_queue().values("pk")[:1]),
    }


class Lane(models.Model):
    """One container's queue: which post is its head and when that head is due."""

    source = models.CharField(max_length=100)
    workspace_id = models.CharField(max_length=ID_LENGTH)
    container_id = models.CharField(max_length=ID_LENGTH)
    # DO_NOTHING: a head is never finished, so pruning never deletes one (the FK would say).
    head = models.ForeignKey("Post", null=True, blank=True, on_delete=models.DO_NOTHING, related_name="+")
    # The head's next_at while queued, its lease end while sending; null without a head.
    due_at = models.DateTimeField(null=True, blank=True)
    # No queued post of the lane sorts before (floor_queued_at, floor_id) in queue order (see
    # the module); both null: unknown.
    # PostgreSQL's finish looks for the next head from there, so that a busy container's next
    # head is one index seek, not a walk over the entries of every post it has sent (they stay
    # in the index until vacuum). Writers keep it a lower bound: a post queued before it lowers it.
    floor_queued_at = models.DateTimeField(null=True, blank=True)
    # A post's id, not a foreign key: the post may be finished and pruned since.
    floor_id = models.BigIntegerField(null=True, blank=True)
    # The container's pace (PACE "container"): the GCRA's theoretical arrival time of its next
    # claim; null: never claimed under a pace.
    pace_tat = models.DateTimeField(null=True, blank=True)
    # The claim of its head, "" while nobody holds one: which claim it is (fencing), who holds
    # it, the head's attempt under it (counting this one, and any taken back stale) and when
    # the first of a run of claims was made (kept while the head is taken back stale). The
    # lease ends at due_at.
    lease_token = models.CharField(max_length=32, blank=True, default="")
    worker = models.CharField(max_length=200, blank=True, default="")
    attempts = models.PositiveIntegerField(default=0)
    sent_at = models.DateTimeField(null=True, blank=True)

    objects = LaneQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["source", "workspace_id", "container_id"], name="connector_outbox_lane_place"
            )
        ]
        # Claims read due lanes in this order: by due time, and among lanes due at the same
        # instant (a batch queued in one statement) by head, the head queued first first, so
        # that the channels of a burst take turns instead of some draining before the others.
        indexes = [models.Index(fields=["source", "due_at", "head"], name="connector_outbox_lane_due")]

    def __str__(self) -> str:
        return f"{self.source}:{self.workspace_id}/{self.container_id}"


class Post(models.Model):
    """One post to deliver, from queueing until it is pruned."""

    source = models.CharField(_("source"), max_length=100)
    post_id = models.CharField(_("post id"), max_length=ID_LENGTH)
    # No index of its own: connector_outbox_post_order starts with it.
    lane = models.ForeignKey(
        Lane, verbose_name=_("lane"), on_delete=models.PROTECT, related_name="posts", db_index=False
    )
    workspace_id = models.CharField(_("workspace id"), max_length=ID_LENGTH)
    container_id = models.CharField(_("container id"), max_length=ID_LENGTH)
    thread_id = models.CharField(_("thread id"), max_length=ID_LENGTH, blank=True, default="")
    # The post_id of the earlier post of its container whose thread it goes into (queue's
    # `thread_of`): its thread_id is resolved from that post when it is sent, and kept once
    # it is delivered. An id, not a foreign key: the parent may be pruned first. For a delete
    # (Outbox.retract), the post whose message it deletes: its claim carries that post as its
    # parent, with the message ref it ended with.
    thread_of = models.CharField(_("thread of"), max_length=ID_LENGTH, null=True, blank=True)  # noqa: DJ001 - None: no parent
    kind = models.CharField(_("kind"), max_length=16, choices=Kind.choices, default=Kind.MESSAGE)
    # Dropped (null) once a one-off post is delivered or cancelled; status rows keep theirs.
    body = models.JSONField(_("body"), null=True, blank=True, encoder=DjangoJSONEncoder)
    rev = models.PositiveIntegerField(_("rev"), default=0)
    turn_key = models.CharField(_("turn key"), max_length=ID_LENGTH, null=True, blank=True)  # noqa: DJ001 - None: no turn key

    # `sending` is never stored: a claimed post stays `queued` here (see the module docstring).
    state = models.CharField(_("state"), max_length=16, choices=State.choices, default=State.QUEUED)
    # The tries used up to its latest finish; a claim's own attempt is on its lane.
    attempts = models.PositiveIntegerField(_("attempts"), default=0)
    # The attempt that delivered it (its claim's number, from 1), 0 until then: `attempts`
    # goes back to 0 when it is delivered (the contract), so the admin shows this instead.
    # A database default too: the SQL of store/postgres.py inserts posts without naming it.
    delivered_attempt = models.PositiveIntegerField(_("delivered attempt"), default=0, db_default=0)
    # Its place in the container's queue: (queued_at, id) orders the container (QUEUE_ORDER).
    queued_at = models.DateTimeField(_("queued at"))
    # When it may be claimed next (a delay, a backoff or a Retry-After).
    next_at = models.DateTimeField(_("next at"))
    created_at = models.DateTimeField(_("created at"), default=timezone.now)
    updated_at = models.DateTimeField(_("updated at"))

    message_ref = models.CharField(_("message ref"), max_length=ID_LENGTH, null=True, blank=True)  # noqa: DJ001 - None: no ref yet
    last_error = models.TextField(_("last error"), blank=True, default="")

    objects = PostQuerySet.as_manager()

    class Meta:
        verbose_name = _("post")
        verbose_name_plural = _("posts")
        constraints = [
            models.UniqueConstraint(fields=["source", "post_id"], name="connector_outbox_post_source_post_id")
        ]
        indexes = [
            # The next head of a lane: its first queued post in queue order.
            models.Index(fields=["lane", "state", *QUEUE_ORDER], name="connector_outbox_post_order"),
            # Pruning and the admin's default view, by state and age.
            models.Index(fields=["state", "updated_at"], name="connector_outbox_post_state"),
            models.Index(fields=["source", "state", "queued_at"], name="connector_outbox_post_queue"),
            models.Index(fields=["source", "turn_key"], name="connector_outbox_post_turn"),
            # The admin's list of all states, newest change first (ORDER BY updated_at DESC,
            # id DESC LIMIT 50), and its updated_at range: without it, a seq scan and a sort of
            # the whole table (0.5 s at a million posts). It costs an entry per post write.
            models.Index(fields=["updated_at", "id"], name="connector_outbox_post_updated"),
            # And connector_outbox_post_waiting, a partial index made by migration 0016 where the
            # database has them (PostgreSQL, SQLite): see PostQuerySet.waiting. Not declared here:
            # Django would warn on MySQL/MariaDB at every command (models.W037).
        ]
        permissions = [
            ("cancel_post", _("Can cancel queued posts")),
            ("retry_post", _("Can retry failed and uncertain posts")),
        ]

    def __str__(self) -> str:
        return f"{self.source}:{self.post_id}"


class Attempt(models.Model):
    """One attempt of a post that did not deliver it, and why (posts.HISTORY_OUTCOMES): retried,
    held (rate-limited), failed, uncertain or lost_reply. Written by the finish that records it,
    in the same statement (PostgreSQL) or transaction, and deleted with its post; a delivery
    writes none, so the history costs nothing while posts go out."""

    # The FK's index is the one the history is read and pruned through (a post's rows).
    post = models.ForeignKey(Post, verbose_name=_("post"), on_delete=models.CASCADE, related_name="history")
    at = models.DateTimeField(_("at"))
    # The claim's attempt number (ClaimedPost.attempts); a held one is not counted, and the
    # next claim has the same number.
    attempt = models.PositiveIntegerField(_("attempt"))
    outcome = models.CharField(
        _("outcome"), max_length=16, choices=[(o.value, o.label) for o in HISTORY_OUTCOMES]
    )
    reason = models.TextField(_("reason"), blank=True, default="")
    worker = models.CharField(_("worker"), max_length=200, blank=True, default="")

    class Meta:
        verbose_name = _("attempt")
        verbose_name_plural = _("attempts")
        # Pruning the history of posts that stay (status posts) by age.
        indexes = [models.Index(fields=["at"], name="connector_outbox_attempt_at")]

    def __str__(self) -> str:
        return f"attempt {self.attempt}: {self.outcome}"


def place(scope: str, workspace_id: Any = "", container_id: Any = "") -> dict[str, Any]:
    """A gate's place keys: "" where its scope does not reach (a source's gate is
    (source, "source", "", ""), a workspace's (source, "workspace", w, ""))."""
    return {
        "scope": scope,
        "workspace_id": "" if scope == Scope.SOURCE else workspace_id,
        "container_id": container_id if scope == Scope.CONTAINER else "",
    }


# The gates' locking order within their source's (store/__init__.py): the source's, then
# workspaces', then containers'.
SCOPE_RANK = {Scope.SOURCE: 0, Scope.WORKSPACE: 1, Scope.CONTAINER: 2}


def gate_order(*, scope: str, workspace_id: str, container_id: str, **_: Any) -> tuple[int, str, str]:
    return SCOPE_RANK[Scope(scope)], workspace_id, container_id


class GateQuerySet(models.QuerySet["Gate"]):
    def of_source(self, source: str) -> GateQuerySet:
        return self.filter(source=source)

    def at(self, scope: str, workspace_id: Any = "", container_id: Any = "") -> GateQuerySet:
        """The gate of one place (see `place`)."""
        return self.filter(**place(scope, workspace_id, container_id))

    def holding(self, now: datetime) -> GateQuerySet:
        """The gates whose hold is in force at `now`: the one rule the claim, the idle wait
        and the operators' views (outbox_status, metrics, the admin) share."""
        return self.filter(held_until__gt=now)

    def reaching(self, places: Iterable[tuple[str, str]]) -> GateQuerySet:
        """The gates whose place covers any of these (workspace, container) places: their
        source's, their workspace's, their container's (`Gate.reaches` says which place)."""
        places = sorted(set(places))
        containers = Q(*(Q(workspace_id=w, container_id=c) for w, c in places), _connector=Q.OR)
        return self.filter(
            Q(scope=Scope.SOURCE)
            | Q(scope=Scope.WORKSPACE, workspace_id__in=sorted({w for w, _ in places}))
            | (Q(scope=Scope.CONTAINER) & containers)
        )

    def reaching_lanes(self) -> GateQuerySet:
        """The gates whose place covers the lane of an outer query (OuterRef): the same rule as
        `reaching`, for a subquery per lane."""
        lane = {name: OuterRef(name) for name in ("workspace_id", "container_id")}
        return self.filter(source=OuterRef("source")).filter(
            Q(scope=Scope.SOURCE)
            | Q(scope=Scope.WORKSPACE, workspace_id=lane["workspace_id"])
            | Q(scope=Scope.CONTAINER, **lane)
        )


class Gate(models.Model):
    """What holds back the claims of a place wider than a post: a workspace or a whole source
    (or a container, for a wait announced with a success), for all senders at once.

    `held_until`: a scoped hold (a 429 of the workspace or the bot, Outbox.hold(scope=...)):
    no container of the place is claimed before then; its posts keep their place and attempts.
    `pace_tat`: the place's pace (PACE), one GCRA timestamp. Keys are "" where the scope does
    not reach: a source's gate is (source, "source", "", "").
    """

    source = models.CharField(_("source"), max_length=100)
    scope = models.CharField(_("scope"), max_length=16, choices=Scope.choices)
    workspace_id = models.CharField(_("workspace id"), max_length=ID_LENGTH, blank=True, default="")
    container_id = models.CharField(_("container id"), max_length=ID_LENGTH, blank=True, default="")
    held_until = models.DateTimeField(_("held until"), null=True, blank=True)
    hold_reason = models.TextField(_("hold reason"), blank=True, default="")
    pace_tat = models.DateTimeField(_("pace tat"), null=True, blank=True)
    updated_at = models.DateTimeField(_("updated at"), default=timezone.now)

    objects = GateQuerySet.as_manager()

    class Meta:
        verbose_name = _("gate")
        verbose_name_plural = _("gates")
        constraints = [
            models.UniqueConstraint(
                fields=["source", "scope", "workspace_id", "container_id"], name="connector_outbox_gate_place"
            )
        ]

    def __str__(self) -> str:
        place = "/".join(p for p in (self.workspace_id, self.container_id) if p)
        return f"{self.source}:{self.scope}{':' + place if place else ''}"

    @property
    def pace_state(self) -> datetime | None:
        """The place's pace: the GCRA's theoretical arrival time of its next claim (store/pacing.py),
        None if it was never paced; what the admin shows."""
        return self.pace_tat

    def reaches(self, workspace_id: str, container_id: str) -> bool:
        """Whether this gate's place covers a container's (GateQuerySet.reaching)."""
        return self.scope == Scope.SOURCE or (
            self.workspace_id == workspace_id
            and (self.scope == Scope.WORKSPACE or self.container_id == container_id)
        )


class Installation(models.Model):
    """A source's app installed in one workspace (a Slack team, or an Enterprise Grid org for an
    org-wide install): the credentials its posts are sent with, for `"installations": True`.

    `workspace_id` is what posts name: the team id, or the enterprise id of an org-wide install
    (which also serves every team of its enterprise: `extra["team_ids"]`). The secrets (tokens,
    refresh tokens, webhook URLs) live only in `secrets`, one Fernet token of a JSON object
    (installations/sealing.py); every other column is safe to show. A revoked installation
    keeps its row with its secrets erased, so its posts fail with a reason and a re-install
    clears it.
    """

    source = models.CharField(_("source"), max_length=100)
    workspace_id = models.CharField(_("workspace id"), max_length=ID_LENGTH)
    enterprise_id = models.CharField(_("enterprise id"), max_length=ID_LENGTH, blank=True, default="")
    is_enterprise_install = models.BooleanField(_("is enterprise install"), default=False)
    team_name = models.CharField(_("team name"), max_length=255, blank=True, default="")
    enterprise_name = models.CharField(_("enterprise name"), max_length=255, blank=True, default="")
    app_id = models.CharField(_("app id"), max_length=ID_LENGTH, blank=True, default="")
    bot_id = models.CharField(_("bot id"), max_length=ID_LENGTH, blank=True, default="")
    bot_user_id = models.CharField(_("bot user id"), max_length=ID_LENGTH, blank=True, default="")
    bot_scopes = models.TextField(_("bot scopes"), blank=True, default="")
    installer_user_id = models.CharField(_("installer user id"), max_length=ID_LENGTH, blank=True, default="")
    user_scopes = models.TextField(_("user scopes"), blank=True, default="")
    token_type = models.CharField(_("token type"), max_length=32, blank=True, default="")
    secrets = models.TextField(_("secrets"), blank=True, default="")
    # When the bot token was obtained and when it expires (token rotation); null: it does not.
    token_issued_at = models.DateTimeField(_("token issued at"), null=True, blank=True)
    token_expires_at = models.DateTimeField(_("token expires at"), null=True, blank=True)
    # What the platform gave that is not secret: a Teams service URL, an org's teams, ...
    extra = models.JSONField(_("extra"), default=dict, blank=True, encoder=DjangoJSONEncoder)
    installed_at = models.DateTimeField(_("installed at"), default=timezone.now)
    updated_at = models.DateTimeField(_("updated at"), default=timezone.now)
    revoked_at = models.DateTimeField(_("revoked at"), null=True, blank=True)
    revoked_reason = models.TextField(_("revoked reason"), blank=True, default="")
    # The last token refresh that failed ("" once one succeeds): what outbox_status shows.
    refresh_error = models.TextField(_("refresh error"), blank=True, default="")

    class Meta:
        verbose_name = _("installation")
        verbose_name_plural = _("installations")
        constraints = [
            models.UniqueConstraint(
                fields=["source", "workspace_id"], name="connector_outbox_installation_place"
            )
        ]

    def __str__(self) -> str:
        return f"{self.source}:{self.workspace_id}"


class Destination(models.Model):
    """Where a container's posts go when a source sends to one URL per channel (incoming
    webhooks of Teams Workflows, Mattermost, Discord, Google Chat): its URL and signing secret,
    sealed in `secrets` like an installation's."""

    source = models.CharField(_("source"), max_length=100)
    container_id = models.CharField(_("container id"), max_length=ID_LENGTH)
    workspace_id = models.CharField(_("workspace id"), max_length=ID_LENGTH, blank=True, default="")
    secrets = models.TextField(_("secrets"))
    created_at = models.DateTimeField(_("created at"), default=timezone.now)
    updated_at = models.DateTimeField(_("updated at"), default=timezone.now)

    class Meta:
        verbose_name = _("destination")
        verbose_name_plural = _("destinations")
        constraints = [
            models.UniqueConstraint(
                fields=["source", "container_id"], name="connector_outbox_destination_place"
            )
        ]

    def __str__(self) -> str:
        return f"{self.source}:{self.container_id}"


class OAuthStateQuerySet(models.QuerySet["OAuthState"]):
    def live(self, now: datetime) -> OAuthStateQuerySet:
        return self.filter(expires_at__gt=now)

    def expired(self, now: datetime) -> OAuthStateQuerySet:
        return self.filter(expires_at__lte=now)

    def consume(self, state: str, source: str, now: datetime) -> bool:
        """Whether `state` was issued for `source` and is live, using it up: one conditional
        DELETE, so of two requests bearing it, exactly one gets True."""
        deleted, _ = self.live(now).filter(state=state, source=source).delete()
        return deleted == 1


class OAuthState(models.Model):
    """The one-time `state` of an "Add to Slack" flow (installations/slack_views.py): issued
    when the install view redirects to Slack, consumed when Slack redirects back, expiring
    (`expires_at`) if Slack never does. It proves the redirect answers an install this site
    started, for this source."""

    state = models.CharField(max_length=64)
    source = models.CharField(max_length=100)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()

    objects = OAuthStateQuerySet.as_manager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["state"], name="connector_outbox_oauth_state")]

    def __str__(self) -> str:
        return f"{self.source}: state until {self.expires_at:%Y-%m-%d %H:%M:%S}"


class Heartbeat(models.Model):
    """A running sender (`run_outbox`), as it last said it was alive (heartbeat.py): made when
    it starts, its `last_seen` moved every few seconds, deleted when it stops cleanly. A row
    whose `last_seen` is older than LEASE is a sender that died or hangs."""

    worker = models.CharField(_("worker"), max_length=200)
    host = models.CharField(_("host"), max_length=255)
    pid = models.PositiveIntegerField(_("pid"))
    sources = models.JSONField(_("sources"), default=list)
    started_at = models.DateTimeField(_("started at"))
    last_seen = models.DateTimeField(_("last seen"))
    # Posts delivered (posted, or found already there) since it started.
    sent = models.PositiveBigIntegerField(_("posts sent"), default=0)
    # Sends and lookups started and not yet recorded, at its last beat.
    in_flight = models.PositiveIntegerField(_("sends in flight"), default=0)
    # The longest its event loop was held since the beat before (seconds); None without a loop.
    loop_lag = models.FloatField(_("loop lag"), null=True, blank=True)

    class Meta:
        verbose_name = _("sender")
        verbose_name_plural = _("senders")

    def __str__(self) -> str:
        return f"{self.worker} ({self.host}, pid {self.pid})"
