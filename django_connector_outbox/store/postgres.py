"""The PostgreSQL store: the hot paths of `protocol.Store`, one round trip per batch.

Same rules as the ORM store (`orm.OrmStore`, the specification: lane lock first, the lease on
the lane, fencing by lease token, head = the leased post or else the oldest queued one), written as data-modifying
CTEs so that a post costs a few microseconds of database time, not a handful of round trips;
differential tests (tests/test_store_differential.py) hold the two to the same results. The
rare writes (requeue, cancel, repair, prune) are the ORM store's. Whatever waits
for a lane lock (queue, finish) takes it in a statement of its own, and decides in the next
one: a statement reads a snapshot taken when it started, so a decision made in the statement
that waited would miss what the lock holder committed. The statements of one call are sent
together in a pipeline (one round trip; the server still runs them one after the other, each
in its own snapshot): a sender's turn, its finishes and its next claim, is one round trip and
its commit (`finish_and_claim`). Each function takes a cursor of the caller's transaction, from `cursor()`, which
raises Django's database exceptions (`django.db.OperationalError`, ...), never psycopg's: a
caller's `except DatabaseError` holds on these paths as on the ORM's.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import connections

from django_connector_outbox.conf import NOTIFY_CHANNEL, conf
from django_connector_outbox.models import Attempt, Gate, Lane, Post
from django_connector_outbox.posts import (
    FINISHED_STATES,
    Action,
    ClaimedPost,
    Finish,
    NewPost,
    Pace,
    Scope,
    State,
)
from django_connector_outbox.store import pacing
from django_connector_outbox.store.orm import OrmStore
from django_connector_outbox.store.protocol import LaneRepair, claimed_post

if TYPE_CHECKING:  # psycopg is installed only where PostgreSQL is used
    import psycopg

POST = Post._meta.db_table
LANE = Lane._meta.db_table
GATE = Gate._meta.db_table
ATTEMPT = Attempt._meta.db_table


# The rules about rows that these statements restate, each named after the queryset rule of
# models.py it restates (tests/test_rule_book.py runs each against its queryset on drawn rows;
# the differential tests cover the statements they make up).


def lane_due(lane: str = "lane") -> str:
    """LaneQuerySet.due(now)."""
    return f"{lane}.due_at <= %(now)s"


def lane_leased(lane: str = "lane") -> str:
    """LaneQuerySet.leased()."""
    return f"{lane}.lease_token <> ''"


def lane_unheld(lane: str = "lane") -> str:
    """LaneQuerySet.unheld(now), by GateQuerySet.reaching_lanes: the whole source (checked
    once), the lane's workspace or the lane itself (a probe of the gate's unique index per lane
    read). Scalar subqueries, not NOT EXISTS over the three: an anti-join would read every lane
    and every hold, then sort; this stays one range scan of due lanes that stops at the limit,
    whatever the number of holds."""
    return f"""NOT EXISTS (SELECT 1 FROM {GATE} WHERE source = %(source)s AND scope = 'source' AND workspace_id = ''
                      AND container_id = '' AND held_until > %(now)s)
      AND NOT coalesce((SELECT g.held_until > %(now)s FROM {GATE} g WHERE g.source = %(source)s
                        AND g.scope = 'workspace' AND g.workspace_id = {lane}.workspace_id AND g.container_id = ''), false)
      AND NOT coalesce((SELECT g.held_until > %(now)s FROM {GATE} g WHERE g.source = %(source)s
                        AND g.scope = 'container' AND g.workspace_id = {lane}.workspace_id
                        AND g.container_id = {lane}.container_id), false)"""


def post_sending(post: str = "post", lane: str = "lane") -> str:
    """models.sending(): on a post row, with its lane joined as `lane`."""
    return f"{post}.state = 'queued' AND {lane}.head_id = {post}.id AND {lane_leased(lane)}"


def lane_pace_allows(lane: str = "lane") -> str:
    """LaneQuerySet.pace_allows(now, tolerance), with %(container_ready)s = now + tolerance."""
    return f"({lane}.pace_tat IS NULL OR {lane}.pace_tat <= %(container_ready)s::timestamptz)"


def lanes_in_claim_order(lane: str = "lane") -> str:
    """LaneQuerySet.in_claim_order()."""
    return f"{lane}.due_at, {lane}.head_id"


# models.QUEUE_ORDER, as a row value and an ORDER BY list.
QUEUE_ORDER_SQL = "queued_at, id"


def queued_in_lane(lane: str) -> str:
    """Restates models.queued_in_lane: a queued post of the lane `lane`, by row comparisons
    that only connector_outbox_post_order (lane, state, ...) can serve, whatever the
    statistics say about the state."""
    return f"lane_id = {lane} AND (lane_id, state) >= ({lane}, 'queued') AND (lane_id, state) <= ({lane}, 'queued')"


# Where LOCK_PLACES and QUEUE read their posts from: a batch's arrays, or one post's own
# parameters (`queue()` in a loop): psycopg sends a scalar for a fraction of what an array of
# one costs it. Each statement is one text with either source, so its rules are written once.
# Arrays are passed in binary (`%(name)b`): psycopg dumps a text array element by element,
# escaping each with regular expressions, a fifth of queue_many's time.
BATCH_PLACES = "SELECT DISTINCT w, c FROM unnest(%(workspaces)b::text[], %(containers)b::text[]) AS p(w, c)"
ONE_PLACE = "SELECT %(workspace_id)s::text AS w, %(container_id)s::text AS c"
BATCH_POSTS = """
    SELECT * FROM unnest(%(post_ids)b::text[], %(workspaces)b::text[], %(containers)b::text[],
                         %(threads)b::text[], %(kinds)b::text[], %(bodies)b::text[], %(turn_keys)b::text[],
                         %(dues)b::timestamptz[], %(thread_ofs)b::text[])
        WITH ORDINALITY AS d(post_id, workspace_id, container_id, thread_id, kind, body, turn_key, due, thread_of,
                             ord)"""
ONE_POST = """
    SELECT %(post_id)s::text AS post_id, %(workspace_id)s::text AS workspace_id,
           %(container_id)s::text AS container_id, %(thread_id)s::text AS thread_id, %(kind)s::text AS kind,
           %(body)s::text AS body, %(turn_key)s::text AS turn_key, %(due)s::timestamptz AS due,
           %(thread_of)s::text AS thread_of, 1::bigint AS ord"""

# How LOCK_PLACES and QUEUE find the lane of a place, (w, c) in their text. A batch's
# statements are planned at each execution (custom plans): the planner knows the batch's size
# and the lanes' statistics, and picks a join (or a probe per post) by them. One post's
# statements are prepared, and their generic plan is kept however the lanes table grows, so
# they probe the place index whatever the statistics say: the first lane of the source at or
# after the place in that index's order (a LATERAL subquery that its LIMIT keeps from being
# flattened into a join), checked to be that very place. A plain equality probe was not
# enough: without statistics (a table just created or truncated) every index that starts with
# `source` looked as cheap, and a generic plan went down the due index, reading all the
# source's lanes at every call; the order of the place index is one that no other gives
# without a sort.
JOIN_LANE = (
    "JOIN {LANE} lane ON lane.source = %(source)s AND lane.workspace_id = {w} AND lane.container_id = {c}"
)
PROBE_LANE = (
    "JOIN LATERAL (SELECT id, workspace_id, container_id FROM {LANE}"
    " WHERE source = %(source)s AND (workspace_id, container_id) >= ({w}, {c})"
    " ORDER BY workspace_id, container_id LIMIT 1) lane ON lane.workspace_id = {w} AND lane.container_id = {c}"
)


def lock_places(places: str, lane: str) -> str:
    """LOCK_PLACES, on the places that `places` selects (columns w, c; no two alike), each
    found by `lane` (JOIN_LANE, PROBE_LANE).

    The lanes of a batch, locked in id order by a statement of their own before QUEUE decides
    on their heads. In one statement the decision would read a snapshot taken before the locks
    were waited for (a head that another producer or a claimer changed meanwhile would be
    missed); as the next statement of a READ COMMITTED transaction, QUEUE sees all that was
    committed. Missing lanes are created here too, once the existing ones are locked, by an
    upsert (as orm.OrmStore.lock_places): a lane that another producer created meanwhile,
    unseen by this statement's snapshot, is locked all the same. QUEUE must find no lane it
    does not hold: its later snapshot shows lanes committed while this one waited, and a post
    inserted into one of those unlocked was missed by a finish there, which moved the lane
    past it. And it must find a lane for every place: QUEUE inserts a post only where it joins
    one. A lane that pruning deleted while `found` waited for it is skipped there (a row deleted
    by the transaction it waited for), so every place not found is inserted, whatever the probe
    saw: the deleted lane's key conflicts no more, and the lane is made again.
    """
    lane_of_place = lane.format(LANE=LANE, w="place.w", c="place.c").replace("JOIN", "LEFT JOIN", 1)
    return f"""
WITH place AS MATERIALIZED ({places}),
probe AS MATERIALIZED (  -- each place and its lane's id, NULL for a lane not seen
    SELECT place.w, place.c, lane.id FROM place {lane_of_place}
),
found AS (
    SELECT lane.id, probe.w, probe.c FROM probe JOIN {LANE} lane ON lane.id = probe.id
    ORDER BY lane.id FOR UPDATE OF lane
),
created AS (  -- found first (its count), so that its locks come before these
    INSERT INTO {LANE} (source, workspace_id, container_id, lease_token, worker, attempts)
    SELECT %(source)s, w, c, '', '', 0 FROM probe
    WHERE (SELECT count(*) FROM found) < (SELECT count(*) FROM probe)
      AND NOT EXISTS (SELECT 1 FROM found WHERE found.w = probe.w AND found.c = probe.c)
    ORDER BY w, c
    ON CONFLICT (source, workspace_id, container_id) DO UPDATE SET source = EXCLUDED.source
    RETURNING id
)
SELECT id FROM found UNION ALL SELECT id FROM created
"""


def joined_lanes(joined: str) -> str:
    """The CTEs that move the lanes that the posts of the CTE `joined` (id, lane_id, queued_at,
    next_at: posts queued just now, new or back) joined, under their locks: restates
    OrmStore.refresh_heads (head_rule, floor_rule) for posts that join a lane whose head and
    floor were right before. A lane's head moves to its first joined post when that comes
    before its head (or it had none) and no lease holds the lane; its floor, when that post
    comes before a known floor (an unknown one stays unknown).

    Tables, not CTEs, on the inner side of every join: CTE row estimates are 1, and a nested
    loop over two CTEs of a 1,000-post batch is a million comparisons. Each lane is read by its
    key (a LATERAL subquery, kept whole by its LIMIT): as a join, a generic plan without
    statistics hashed the table and read every lane for one post.
    """
    return f"""first AS (SELECT DISTINCT ON (lane_id) * FROM {joined} ORDER BY lane_id, {QUEUE_ORDER_SQL}),
placed AS (
    SELECT first.*,
        (lane.head_id IS NULL OR lane.lease_token = '' AND coalesce((
            SELECT head.state = 'queued' AND (head.queued_at, head.id) > (first.queued_at, first.id)
            FROM {POST} head WHERE head.id = lane.head_id), false)) AS heads,
        ((first.queued_at, first.id) < (lane.floor_queued_at, lane.floor_id)) IS TRUE AS lowers
    FROM first CROSS JOIN LATERAL (SELECT * FROM {LANE} WHERE id = first.lane_id LIMIT 1) lane
),
heads AS (
    UPDATE {LANE} lane SET
        head_id = CASE WHEN placed.heads THEN placed.id ELSE lane.head_id END,
        due_at = CASE WHEN placed.heads THEN placed.next_at ELSE lane.due_at END,
        floor_queued_at = CASE WHEN placed.lowers THEN placed.queued_at ELSE lane.floor_queued_at END,
        floor_id = CASE WHEN placed.lowers THEN placed.id ELSE lane.floor_id END
    FROM placed WHERE lane.id = placed.lane_id AND (placed.heads OR placed.lowers)
)"""


def queue(posts: str, lane: str) -> str:
    """QUEUE, of the posts that `posts` selects (as BATCH_POSTS: their fields and `ord`, their
    place in the list), each placed in the lane that `lane` finds (JOIN_LANE, PROBE_LANE).

    Run with every lane of the batch locked (LOCK_PLACES). A container's posts go by
    (queued_at, id) (models.QUEUE_ORDER), and a batch shares its queued_at: ids must follow the
    list. The rows reach the insert in whatever order its plan gives (a merge join sorted them
    by place, and not stably), hence ORDER BY d.ord: the id column's nextval() is evaluated
    above that sort, row after row (tests/test_outbox_queue.py forces a merge join).
    """
    lane_of_post = lane.format(LANE=LANE, w="d.workspace_id", c="d.container_id")
    return f"""
WITH data AS ({posts}
),
ins AS (
    INSERT INTO {POST} (source, post_id, lane_id, workspace_id, container_id, thread_id, kind, body, rev,
                        turn_key, thread_of, state, attempts, queued_at, next_at, created_at, updated_at,
                        last_error)
    SELECT %(source)s, d.post_id, lane.id, d.workspace_id, d.container_id, d.thread_id, d.kind, d.body::jsonb,
           0, d.turn_key, d.thread_of, 'queued', 0, d.due, d.due, %(now)s, %(now)s, ''
    FROM data d {lane_of_post}
    ORDER BY d.ord
    ON CONFLICT (source, post_id) DO NOTHING
    RETURNING id, lane_id, queued_at, next_at
),
{joined_lanes("ins")}
SELECT (SELECT count(*) FROM ins),
       CASE WHEN EXISTS (SELECT 1 FROM ins) THEN pg_notify('{NOTIFY_CHANNEL}', %(source)s) END
"""


LOCK_PLACES = lock_places(BATCH_PLACES, JOIN_LANE)
QUEUE = queue(BATCH_POSTS, JOIN_LANE)
# `queue()`, and a `queue_many` of one post: prepared.
LOCK_PLACE = lock_places(ONE_PLACE, PROBE_LANE)
QUEUE_ONE = queue(ONE_POST, PROBE_LANE)


def pace_params(paces: dict[Scope, Pace], now: datetime) -> dict[str, Any]:
    """PACED_CLAIM's parameters for these paces (None where a scope is not paced)."""
    params: dict[str, Any] = {
        "epsilon": pacing.EPSILON,
        "gated": Scope.SOURCE in paces or Scope.WORKSPACE in paces,
    }
    for scope in Scope:
        pace = paces.get(scope)
        params[f"{scope.value}_count"] = pace.count if pace else None
        params[f"{scope.value}_step"] = pace.seconds / pace.count if pace else None  # as pacing.allowed()
        params[f"{scope.value}_interval"] = (
            pacing.interval(pace) // timedelta(microseconds=1) if pace else None
        )
    container = paces.get(Scope.CONTAINER)
    # As OrmStore.claim: a lane whose tat is at most the burst tolerance ahead is ready.
    params["container_ready"] = (
        now + pacing.interval(container) * (container.count - 1) if container else None
    )
    return params


@contextmanager
def cursor(using: str) -> Iterator[psycopg.Cursor[Any]]:
    """A psycopg cursor on Django's connection, inside its transaction.

    Django's own cursors bind parameters client-side, so every execution is parsed and planned
    again: for these CTEs that is most of their cost. These statements are executed on a
    server-side binding cursor instead, with `prepare=True` (see `preparing`; PgBouncer in
    transaction mode needs `max_prepared_statements` for that, from version 1.21). Django's
    error wrapper turns psycopg's errors into its own, and marks the connection for its
    usability check, as its own cursors do.
    """
    import psycopg

    connection = connections[using]
    if connection.connection is None:  # ensure_connection() costs a call of queue() 5%
        connection.ensure_connection()
    with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as raw:
        yield raw


# psycopg's prepare threshold while `preparing`: a count that no statement reaches, so that
# only what is executed with `prepare=True` is prepared.
PREPARE_WHEN_ASKED = 1 << 62


@contextmanager
def preparing(raw_connection: psycopg.Connection[Any]) -> Iterator[None]:
    """Statements executed with `prepare=True` in this block are prepared on the server.

    Django leaves psycopg's `prepare_threshold` at None unless OPTIONS set it (for poolers),
    and then psycopg ignores `prepare=True`. Only the statements of one post are prepared
    (LOCK_PLACE, QUEUE_ONE: planning took four times their execution); a batch's are
    planned for its size, and CLAIM and FINISH as before, until their generic plans are
    checked. Django's own cursors bind client-side and are never prepared.
    """
    threshold = raw_connection.prepare_threshold
    if threshold is None:
        raw_connection.prepare_threshold = PREPARE_WHEN_ASKED
    try:
        yield
    finally:
        raw_connection.prepare_threshold = threshold


# Lanes first (SKIP LOCKED: other claimers take other lanes), then their heads, which only
# lane holders ever change; the lease is written into the lane, and the post is only read. A
# lane that holds a lease is due when it has ended: its head is taken back stale, keeps the
# sent_at of the first claim of its run, and takes its turn by when its lease ended (heads due
# at one instant by id, as the lanes were read: the head queued first first). CLAIM and
# PACED_CLAIM are built from the fragments below, each named after the rule it restates.

# Restates OrmStore.claim's heads: a lane's head is claimed when the lane holds a lease that
# has ended (taken back stale, its attempt and first sent_at kept) or when it is queued and due.
DUE_HEADS = f"""
    SELECT lanes.stale, post.*,
        CASE WHEN lanes.stale THEN lanes.due_at ELSE post.next_at END AS due,
        CASE WHEN lanes.stale THEN lanes.attempts ELSE post.attempts END + 1 AS attempt,
        CASE WHEN lanes.stale THEN coalesce(lanes.sent_at, %(now)s) ELSE %(now)s END AS first_sent_at
    FROM lanes JOIN {POST} post ON post.id = lanes.head_id
    WHERE lanes.stale OR (post.state = 'queued' AND post.next_at <= %(now)s)"""

# Restates OrmStore.claim's leases (LEASE_FIELDS): the claim is written into the lane.
LEASE = """lease_token = %(token)s, worker = %(worker)s, due_at = %(lease_until)s,
        attempts = {claimed}.attempt, sent_at = {claimed}.first_sent_at"""

# Restates OrmStore._read_parents: a reply's parent as it is now (one probe of the unique
# (source, post_id) index), finished before its reply is a head (the container's order): its
# row's state is its state. A LATERAL subquery, kept whole by its LIMIT (as in FINISH): as a
# join, a planner without statistics (tables just filled) scanned every post of the source
# for each head, then filtered on post_id: 4,000,000 rows and half a second for a claim of
# 1,000 heads over 4,000 posts.
CLAIMED_POSTS = """{claimed}.post_id, {claimed}.workspace_id, {claimed}.container_id, {claimed}.thread_id,
       {claimed}.kind, {claimed}.body::text, {claimed}.rev, {claimed}.attempt, {claimed}.message_ref,
       {claimed}.turn_key, {claimed}.stale, {claimed}.first_sent_at, {claimed}.thread_of,
       parent.state, parent.message_ref, parent.thread_id"""
PARENTS = f"""LEFT JOIN LATERAL (
    SELECT state, message_ref, thread_id FROM {POST}
    WHERE {{claimed}}.thread_of IS NOT NULL AND source = %(source)s AND post_id = {{claimed}}.thread_of LIMIT 1
) parent ON true"""

CLAIM = f"""
WITH lanes AS (
    SELECT id, head_id, due_at, {lane_leased()} AS stale, attempts, sent_at FROM {LANE} lane
    WHERE source = %(source)s AND {lane_due()} AND {lane_unheld()}
    ORDER BY {lanes_in_claim_order()} LIMIT %(limit)s FOR UPDATE OF lane SKIP LOCKED
),
heads AS ({DUE_HEADS}
),
leased AS (
    UPDATE {LANE} lane SET {LEASE.format(claimed="heads")}
    FROM heads WHERE lane.id = heads.lane_id
)
SELECT {CLAIMED_POSTS.format(claimed="heads")}
FROM heads {PARENTS.format(claimed="heads")}
ORDER BY heads.due, heads.id
"""

# A sender's turn's claim after FINISH_HANDING_OFF (same transaction, a later snapshot): the
# lanes that it leased to this claim (its token, their lease's end: one range of the due
# index) count against the limit, and come back with CLAIM's, in claim order.
CLAIM_AFTER_HAND_OFF = f"""
WITH handed AS (
    SELECT false AS stale, post.*, post.next_at AS due, lane.attempts AS attempt, lane.sent_at AS first_sent_at
    FROM {LANE} lane JOIN {POST} post ON post.id = lane.head_id
    WHERE lane.source = %(source)s AND lane.due_at = %(lease_until)s AND lane.lease_token = %(token)s
),
lanes AS (
    SELECT id, head_id, due_at, {lane_leased()} AS stale, attempts, sent_at FROM {LANE} lane
    WHERE source = %(source)s AND {lane_due()} AND {lane_unheld()}
    ORDER BY {lanes_in_claim_order()} LIMIT greatest(%(limit)s - (SELECT count(*) FROM handed), 0)
    FOR UPDATE OF lane SKIP LOCKED
),
heads AS ({DUE_HEADS}
),
leased AS (
    UPDATE {LANE} lane SET {LEASE.format(claimed="heads")}
    FROM heads WHERE lane.id = heads.lane_id
),
claimed AS (SELECT * FROM heads UNION ALL SELECT * FROM handed)
SELECT {CLAIMED_POSTS.format(claimed="claimed")}
FROM claimed {PARENTS.format(claimed="claimed")}
ORDER BY claimed.due, claimed.id
"""

CLAIM_COLUMNS = (
    "post_id", "workspace_id", "container_id", "thread_id", "kind", "body", "rev", "attempts", "message_ref",
    "turn_key", "stale", "sent_at", "thread_of", "parent_state", "parent_ref", "parent_thread",
)  # fmt: skip


def gcra_allowed(tat: str, scope: str) -> str:
    """Restates store/pacing.py allowed(): how many claims the `scope` pace (its %(scope_count)s
    and %(scope_step)s, seconds / count as a float) lets through at %(now)s, for a place whose
    tat is the SQL expression `tat`. The same float operations in the same order as Python's
    (float8 is IEEE double; extract(epoch) is exact, as timedelta.total_seconds() is correctly
    rounded), and trunc(), not floor() nor a cast, for int()."""
    count, step = f"%({scope}_count)s::int", f"%({scope}_step)s::float8"
    slack = f"(extract(epoch FROM %(now)s - {tat})::float8 + {step} * ({count} - 1))"
    return f"""CASE WHEN {tat} IS NULL OR {tat} <= %(now)s THEN {count}
        WHEN {slack} < -%(epsilon)s::float8 THEN 0
        ELSE least({count}, trunc({slack} / {step} + %(epsilon)s::float8)::int + 1) END"""


def gcra_after(tat: str, scope: str, claims: str) -> str:
    """Restates store/pacing.py after(): the tat once `claims` (> 0) claims went through at
    %(now)s, from max(tat, now), by the `scope` pace's interval (%(scope_interval)s, whole
    microseconds, as pacing.interval() rounds it): exact arithmetic, as timedelta's."""
    return f"greatest({tat}, %(now)s) + interval '1 microsecond' * (%({scope}_interval)s::bigint * {claims})"


# A paced source's claim, in one statement: CLAIM with the paces of OrmStore.claim and
# OrmStore._within_paces. The container's pace leaves out of the range scan the lanes whose tat
# is more than its burst tolerance ahead (%(container_ready)s: now + interval * (count - 1), the
# ORM's filter) and moves the tat of each lane it leases. The workspace and source paces are
# gates (models.Gate), locked after every lane is read (count(*): the package's order, lanes
# before gates), the source's first (the InitPlan of `workspace_gates`: a one-time filter below
# its lock), then the workspaces' by id; FOR UPDATE returns a row's latest version, so their
# tats are current. A gate that this snapshot does not show (never made, pruned, or made by a
# claimer this one waited for) cannot be locked here: the statement then claims nothing and
# says so (`gates_missing`), and PostgresStore.claim has the ORM store make and lock the gates
# (OrmStore.lock_gates, an upsert) before it runs the statement again, in a snapshot that
# shows them. Each gate lets through at most its allowance among the due heads in claim order:
# a head goes when it is among the first `allowed` of its workspace and, of those, among the
# first `allowed` of the source, which is what the ORM's budget loop comes to (a head refused
# by its workspace uses nothing; one refused by the source leaves none for those after it).
PACED_CLAIM = f"""
WITH lanes AS (
    SELECT id, head_id, due_at, {lane_leased()} AS stale, attempts, sent_at FROM {LANE} lane
    WHERE source = %(source)s AND {lane_due()} AND {lane_unheld()}
      AND (%(container_ready)s::timestamptz IS NULL OR {lane_pace_allows()})
    ORDER BY {lanes_in_claim_order()} LIMIT %(limit)s FOR UPDATE OF lane SKIP LOCKED
),
heads AS ({DUE_HEADS}
),
source_gate AS (  -- restates OrmStore.lock_source_gate (found, not made)
    SELECT id, pace_tat FROM {GATE}
    WHERE source = %(source)s AND scope = 'source' AND workspace_id = '' AND container_id = ''
      AND %(gated)s::boolean AND (SELECT count(*) FROM heads) > 0
    FOR UPDATE
),
workspace_gates AS (  -- restates OrmStore.lock_gates (found, not made)
    SELECT id, workspace_id, pace_tat FROM {GATE}
    WHERE source = %(source)s AND scope = 'workspace' AND container_id = '' AND %(workspace_count)s::int IS NOT NULL
      AND workspace_id IN (SELECT workspace_id FROM heads) AND EXISTS (SELECT FROM source_gate)
    ORDER BY workspace_id FOR UPDATE
),
found AS (  -- the gates OrmStore._within_paces locks: the source's, and its heads' workspaces'
    SELECT (SELECT count(*) FROM source_gate) + (SELECT count(*) FROM workspace_gates) < CASE
               WHEN NOT %(gated)s::boolean OR NOT EXISTS (SELECT FROM heads) THEN 0
               WHEN %(workspace_count)s::int IS NULL THEN 1
               ELSE 1 + (SELECT count(DISTINCT workspace_id) FROM heads) END AS gates_missing,
           ARRAY(SELECT DISTINCT workspace_id FROM heads ORDER BY 1) AS workspaces
),
in_workspace AS (  -- restates OrmStore._within_paces: the workspace's allowance
    SELECT heads.*, row_number() OVER (PARTITION BY heads.workspace_id ORDER BY heads.due, heads.id) AS nth,
           {gcra_allowed("workspace_gates.pace_tat", "workspace")} AS allowed
    FROM heads LEFT JOIN workspace_gates ON workspace_gates.workspace_id = heads.workspace_id
),
in_source AS (  -- restates OrmStore._within_paces: the source's allowance, among those
    SELECT in_workspace.*, row_number() OVER (ORDER BY due, id) AS nth_of_source FROM in_workspace
    WHERE %(workspace_count)s::int IS NULL OR nth <= allowed
),
through AS (
    SELECT * FROM in_source
    WHERE NOT (SELECT gates_missing FROM found)
      AND (%(source_count)s::int IS NULL
           OR nth_of_source <= (SELECT {gcra_allowed("source_gate.pace_tat", "source")} FROM source_gate))
),
used AS (  -- restates the end of OrmStore._within_paces: each gate moves by the claims it let through
    SELECT source_gate.id, {gcra_after("source_gate.pace_tat", "source", "(SELECT count(*) FROM through)")} AS tat
    FROM source_gate WHERE %(source_count)s::int IS NOT NULL AND EXISTS (SELECT FROM through)
    UNION ALL
    SELECT workspace_gates.id, {gcra_after("workspace_gates.pace_tat", "workspace", "mine.claims")}
    FROM workspace_gates JOIN (SELECT workspace_id, count(*) AS claims FROM through GROUP BY workspace_id) mine
      ON mine.workspace_id = workspace_gates.workspace_id
),
paced AS (
    UPDATE {GATE} gate SET pace_tat = used.tat, updated_at = %(now)s FROM used WHERE gate.id = used.id
),
leased AS (
    UPDATE {LANE} lane SET {LEASE.format(claimed="through")},
        -- restates OrmStore.claim: pacing.after(container pace, the lane's tat, now, 1)
        pace_tat = CASE WHEN %(container_ready)s::timestamptz IS NULL THEN lane.pace_tat
                        ELSE {gcra_after("lane.pace_tat", "container", "1")} END
    FROM through WHERE lane.id = through.lane_id
)
SELECT found.gates_missing, found.workspaces, {CLAIMED_POSTS.format(claimed="through")}
FROM found LEFT JOIN through ON true {PARENTS.format(claimed="through")}
ORDER BY through.due, through.id
"""


# Posts (and, in FINISH, their lanes) are found one index probe each, by a LATERAL subquery
# that its LIMIT keeps from being flattened into a join: as a join, a planner without
# statistics (a new table, autovacuum off) took `source = %s` for a few rows and scanned every
# post of the source, sent ones included, for each batch (3-5 ms at 20,000 posts, growing with
# them); FINISH hashed every lane to match a batch's one lease token (64 x 64 rows for a batch
# of 64, a third of its time). The unique keys make LIMIT 1 exact.
LOCK_LANES_OF_POSTS = f"""
SELECT lane.id FROM unnest(%(post_ids)b::text[]) AS v(post_id)
CROSS JOIN LATERAL (SELECT lane_id FROM {POST} WHERE source = %(source)s AND post_id = v.post_id LIMIT 1) post
JOIN {LANE} lane ON lane.id = post.lane_id
ORDER BY lane.id FOR UPDATE OF lane
"""

# Run with the lanes locked (LOCK_LANES_OF_POSTS), so that its snapshot has their latest rows.
# Each action's changes, as in Outbox.posted/found/retry/hold/settle (store.finish_changes):
# the post is written once, and its lane is released and gets its head again: the first queued
# post in queue order, (queued_at, id), among those finished back into the queue here and
# those queued before (the snapshot, less the posts finished here, which it still shows queued).
# A candidate's `head` is the post that becomes the head (none for the last resort), `id` the
# lane's new floor. `{hand_off}` is HAND_OFF in a sender's turn, empty in `finish`.
FINISH_WITH = f"""
WITH v AS MATERIALIZED (  -- each finish whose lane still holds its lease on it
    SELECT v.*, post.id AS pk, lane.id AS lane_id, lane.attempts AS attempt, lane.worker
    FROM unnest(%(post_ids)b::text[], %(tokens)b::text[], %(actions)b::text[], %(revs)b::int[],
                %(refs)b::text[], %(waits)b::float8[], %(reasons)b::text[], %(states)b::text[],
                %(threads)b::text[])
        AS v(post_id, token, action, claimed_rev, ref, wait, reason, state, thread)
    CROSS JOIN LATERAL (
        SELECT id, lane_id FROM {POST} WHERE source = %(source)s AND post_id = v.post_id LIMIT 1
    ) post
    CROSS JOIN LATERAL (  -- one probe of the lane's key each, as the post's
        SELECT id, attempts, worker FROM {LANE}
        WHERE id = post.lane_id AND head_id = post.id AND lease_token = v.token LIMIT 1
    ) lane
),
done AS (
    UPDATE {POST} post SET
        state = CASE v.action
            WHEN 'posted' THEN CASE WHEN post.rev = v.claimed_rev THEN 'posted' ELSE 'queued' END
            WHEN 'settle' THEN v.state
            ELSE 'queued' END,
        attempts = CASE v.action
            WHEN 'posted' THEN 0 WHEN 'found' THEN 0 WHEN 'hold' THEN v.attempt - 1 ELSE v.attempt END,
        delivered_attempt = CASE WHEN v.action = 'posted' THEN v.attempt ELSE post.delivered_attempt END,
        message_ref = CASE WHEN v.action IN ('posted', 'found') THEN coalesce(v.ref, post.message_ref)
                           ELSE post.message_ref END,
        thread_id = CASE WHEN v.action IN ('posted', 'found') THEN coalesce(v.thread, post.thread_id)
                         ELSE post.thread_id END,
        body = CASE WHEN v.action = 'posted' AND post.kind <> 'status' THEN NULL ELSE post.body END,
        queued_at = CASE WHEN v.action = 'posted' AND post.rev <> v.claimed_rev THEN %(now)s
                         ELSE post.queued_at END,
        next_at = CASE
            WHEN v.action = 'posted' AND post.rev <> v.claimed_rev THEN %(now)s
            WHEN v.action = 'found' THEN %(now)s
            WHEN v.action IN ('retry', 'hold') THEN %(now)s + v.wait * interval '1 second'
            ELSE post.next_at END,
        last_error = CASE WHEN v.action IN ('retry', 'hold', 'settle') THEN v.reason ELSE post.last_error END,
        updated_at = %(now)s
    FROM v WHERE post.id = v.pk
    RETURNING post.id, post.lane_id, post.post_id, v.token, post.state, post.queued_at, post.next_at
),
-- The history (models.Attempt): a row per finish that did not deliver, as store.finish_one
-- writes it; a batch of deliveries inserts nothing.
logged AS (
    INSERT INTO {ATTEMPT} (post_id, at, attempt, outcome, reason, worker)
    SELECT pk, %(now)s, attempt, CASE action WHEN 'retry' THEN 'retried' WHEN 'hold' THEN 'held' ELSE state END,
           reason, worker
    FROM v WHERE action IN ('retry', 'hold', 'settle')
),
touched AS (SELECT id AS lane_id, floor_queued_at, floor_id FROM {LANE} WHERE id IN (SELECT lane_id FROM done)),
candidates AS (
    SELECT lane_id, id AS head, queued_at, id, next_at, 0 AS last FROM done WHERE state = 'queued'
    UNION ALL  -- from the lane's floor: one seek past the posts it has sent
    SELECT touched.lane_id, nearest.id, nearest.*, 0 FROM touched CROSS JOIN LATERAL (
        SELECT queued_at, id, next_at FROM {POST}
        WHERE {queued_in_lane("touched.lane_id")}
          AND ({QUEUE_ORDER_SQL}) >= (coalesce(touched.floor_queued_at, '-infinity'), coalesce(touched.floor_id, 0))
          AND id NOT IN (SELECT pk FROM v)
        ORDER BY {QUEUE_ORDER_SQL} LIMIT 1
    ) nearest
    UNION ALL  -- no candidate at all: the lane has no head, and nothing queued is below the finished post
    SELECT lane_id, NULL, queued_at, id, NULL, 1 FROM done
),
best AS (
    SELECT DISTINCT ON (lane_id) lane_id, head, next_at, queued_at, id FROM candidates
    ORDER BY lane_id, last, {QUEUE_ORDER_SQL}
),{{hand_off}}
heads AS (
    UPDATE {LANE} lane SET lease_token = '', head_id = best.head, due_at = best.next_at,
        floor_queued_at = best.queued_at, floor_id = best.id
    FROM best WHERE lane.id = best.lane_id{{not_handed}}
)
SELECT post_id, token FROM done
"""

# A sender's turn, unpaced: a lane released by FINISH whose next head is due is leased to the
# same claim at once, in the lane's one write (restates OrmStore.finish then OrmStore.claim for
# that lane: released, then leased), so a post costs one lane write, not two. Only a head that
# this statement reads as it is: one not finished here (a post finished back into the queue
# has its new row in `done` only) and no reply (its parent may be one posted here). Among due
# heads, which ones a claim that cannot take them all takes is not specified: these go first,
# up to the claim's limit, in claim order. CLAIM_AFTER_HAND_OFF then claims the rest, and
# returns these too. The head and the lane are read one probe each (LATERAL, as in FINISH's
# `v`): as joins, a planner without statistics scanned every post for each lane.
HAND_OFF = f"""
handed AS (
    SELECT best.lane_id, head.attempts + 1 AS attempt, %(now)s::timestamptz AS first_sent_at FROM best
    CROSS JOIN LATERAL (SELECT attempts, thread_of FROM {POST} WHERE id = best.head LIMIT 1) head
    CROSS JOIN LATERAL (SELECT workspace_id, container_id FROM {LANE} WHERE id = best.lane_id LIMIT 1) lane
    WHERE best.head NOT IN (SELECT pk FROM v) AND head.thread_of IS NULL AND best.next_at <= %(now)s
      AND {lane_unheld()}
    ORDER BY best.next_at, best.head LIMIT %(limit)s
),
leased_again AS (
    UPDATE {LANE} lane SET head_id = best.head, floor_queued_at = best.queued_at, floor_id = best.id,
        {LEASE.format(claimed="handed")}
    FROM best JOIN handed ON handed.lane_id = best.lane_id WHERE lane.id = best.lane_id
),"""
FINISH = FINISH_WITH.replace("{hand_off}", "").replace("{not_handed}", "")
FINISH_HANDING_OFF = FINISH_WITH.replace("{hand_off}", HAND_OFF).replace(
    "{not_handed}", " AND best.lane_id NOT IN (SELECT lane_id FROM handed)"
)


# A status post's lane, locked before REPLACE_STATUS decides (as OrmStore.replace_status).
LOCK_LANE = f"SELECT id FROM {LANE} WHERE id = %(lane_id)s FOR UPDATE"

# What OrmStore.replace_status writes, run with the post's lane locked (LOCK_LANE): the status
# post gets its new body and rev unless it is uncertain or has that body already; a queued one
# starts its attempts again (a sending one keeps them: its claim goes on, and finishes into the
# new rev), and a finished one goes back to the back of its queue (OrmStore.rejoin), moving its
# lane as a post queued there now would (joined_lanes). The first column: whether the post is
# still there (pruned since it was read: STATUS_RETENTION).
REJOINING = ", ".join(f"'{state}'" for state in FINISHED_STATES if state != State.UNCERTAIN)
REPLACE_STATUS = f"""
WITH old AS (
    SELECT post.id, post.state, post.rev, post.body = %(body)s::jsonb AS same, {post_sending()} AS sending,
           post.state IN ({REJOINING}) AS rejoins
    FROM {POST} post JOIN {LANE} lane ON lane.id = post.lane_id
    WHERE post.id = %(pk)s
    FOR UPDATE OF post
),
changed AS (
    UPDATE {POST} post SET body = %(body)s::jsonb, rev = old.rev + 1, updated_at = %(now)s,
        state = CASE WHEN old.rejoins THEN '{State.QUEUED}' ELSE post.state END,
        attempts = CASE WHEN old.sending THEN post.attempts ELSE 0 END,
        queued_at = CASE WHEN old.rejoins THEN %(now)s ELSE post.queued_at END,
        next_at = CASE WHEN old.rejoins THEN %(now)s ELSE post.next_at END
    FROM old WHERE post.id = old.id AND old.state <> '{State.UNCERTAIN}' AND old.same IS NOT TRUE
    RETURNING post.id, post.lane_id, post.queued_at, post.next_at, old.rejoins
),
rejoined AS (SELECT id, lane_id, queued_at, next_at FROM changed WHERE rejoins),
{joined_lanes("rejoined")}
SELECT EXISTS (SELECT FROM old),
       CASE WHEN EXISTS (SELECT FROM rejoined) THEN pg_notify('{NOTIFY_CHANNEL}', %(source)s) END
"""


# The actions that FINISH records; the others take the ORM store's.
FINISH_ACTIONS = frozenset({Action.POSTED, Action.FOUND, Action.RETRY, Action.HOLD, Action.SETTLE})


class PostgresStore:
    """`protocol.Store` on PostgreSQL: insert, claim and finish as the SQL statements above.

    What it does not write in SQL it hands, by name, to the ORM store it holds (`orm`): the
    rare writes, the finishes that keep a claim going (LEAVE, GIVE_BACK) or drop a retract's
    delete (DROP), and the gates that a paced claim needs and could not lock because they were
    not there yet (OrmStore.lock_gates).
    """

    def __init__(self, source: str, using: str) -> None:
        self.source = source
        self.using = using
        self.orm = OrmStore(source, using)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.source!r} using={self.using!r}>"

    def insert(self, rows: Sequence[NewPost], now: datetime) -> int:
        if len(rows) == 1:  # queue(): the statements of one post, with scalar parameters
            (post,) = rows
            lock_sql, queue_sql = LOCK_PLACE, QUEUE_ONE
            params: dict[str, Any] = {
                "source": self.source,
                "now": now,
                "post_id": post.post_id,
                "workspace_id": post.workspace_id,
                "container_id": post.container_id,
                "thread_id": post.thread_id,
                "kind": post.kind,
                "body": post.body_json,
                "turn_key": post.turn_key,
                "due": post.due,
                "thread_of": post.thread_of,
            }
        else:
            lock_sql, queue_sql = LOCK_PLACES, QUEUE
            params = {
                "source": self.source,
                "now": now,
                "post_ids": [p.post_id for p in rows],
                "workspaces": [p.workspace_id for p in rows],
                "containers": [p.container_id for p in rows],
                "threads": [p.thread_id for p in rows],
                "kinds": [p.kind for p in rows],
                "bodies": [p.body_json for p in rows],
                "turn_keys": [p.turn_key for p in rows],
                "dues": [p.due for p in rows],
                "thread_ofs": [p.thread_of for p in rows],
            }
        one = len(rows) == 1
        with cursor(self.using) as lock, cursor(self.using) as queue:
            # One round trip (a pipeline): the server still runs QUEUE after the locks are
            # taken, in a snapshot of its own.
            with preparing(lock.connection) if one else nullcontext(), lock.connection.pipeline():
                lock.execute(lock_sql, params, prepare=one)
                queue.execute(queue_sql, params, prepare=one)  # its NOTIFY is part of the statement
            row = queue.fetchone()
        assert row is not None  # QUEUE ends in a SELECT without FROM: always one row
        return int(row[0])

    def claim(
        self, limit: int, now: datetime, lease_until: datetime, token: str, worker: str
    ) -> list[ClaimedPost]:
        statement, params = self._claim_statement(limit, now, lease_until, token, worker)
        with cursor(self.using) as c:
            c.execute(statement, params, prepare=True)
            rows = c.fetchall()
        return self._claimed(rows, params, lease_until, token)

    def _claim_statement(
        self, limit: int, now: datetime, lease_until: datetime, token: str, worker: str
    ) -> tuple[str, dict[str, Any]]:
        """CLAIM, or PACED_CLAIM for a paced source, and its parameters."""
        params = dict(
            source=self.source, limit=limit, now=now, lease_until=lease_until, token=token, worker=worker
        )
        if paces := conf.pace(self.source):
            return PACED_CLAIM, params | pace_params(paces, now)
        return CLAIM, params

    def _claimed(
        self, rows: list[tuple[Any, ...]], params: dict[str, Any], lease_until: datetime, token: str
    ) -> list[ClaimedPost]:
        """The claims of CLAIM's or PACED_CLAIM's rows. The gates that PACED_CLAIM could not
        lock (rarely: a workspace's first paced claim, or after pruning) are made and locked
        first by the ORM store, and it runs again."""
        paces = conf.pace(self.source)
        while paces:
            gates_missing, workspaces = rows[0][:2]  # `found` is one row, whatever was claimed
            if not gates_missing:
                rows = [row[2:] for row in rows if row[2] is not None]
                break
            keys = [(Scope.SOURCE, "")] if Scope.SOURCE in paces else []
            if Scope.WORKSPACE in paces:
                keys += [(Scope.WORKSPACE, workspace) for workspace in workspaces]
            self.orm.lock_gates(keys)
            with cursor(self.using) as c:
                c.execute(PACED_CLAIM, params, prepare=True)
                rows = c.fetchall()
        claims = []
        for values in rows:
            row = dict(zip(CLAIM_COLUMNS, values, strict=True))
            row["body"] = json.loads(row["body"]) if row["body"] else {}
            claims.append(
                claimed_post(
                    self.source,
                    row,
                    stale=row["stale"],
                    sent_at=row["sent_at"],
                    lease_until=lease_until,
                    token=token,
                )
            )
        return claims

    def finish(self, finishes: Sequence[Finish], now: datetime) -> list[bool]:
        batch = [f for f in finishes if f.action in FINISH_ACTIONS]
        changed: set[tuple[str, str]] = set()
        if batch:
            with cursor(self.using) as lock, cursor(self.using) as finish, lock.connection.pipeline():
                # One round trip: the server still runs FINISH after the locks are taken.
                self._lock_and_finish(lock, finish, batch, now)
                changed = set(finish.fetchall())
        return [
            (f.post_id, f.lease_token) in changed
            if f.action in FINISH_ACTIONS
            else self.orm.finish_one(f, now)
            for f in finishes
        ]

    def finish_and_claim(
        self,
        finishes: Sequence[Finish],
        clock: Callable[[], datetime],
        limit: int,
        lease: timedelta,
        token: str,
        worker: str,
    ) -> tuple[list[bool], list[ClaimedPost]]:
        """LOCK_LANES_OF_POSTS, FINISH and CLAIM in one round trip (a pipeline), each still a
        statement of its own: FINISH decides in a snapshot taken after the lane locks, and
        CLAIM in one that has FINISH's writes (the lanes it released are locked by this
        transaction, which SKIP LOCKED does not skip: their next heads may be claimed). Both
        are sent at one instant: a wait for a lane lock (a producer's transaction holds it)
        comes out of the leases claimed after it, as it would out of a lease claimed before.

        A paced source's claim is PACED_CLAIM (whose missing gates, rarely, take one more round
        trip: `_claimed`). Finishes that keep a claim going (LEAVE, GIVE_BACK: the ORM store's)
        and a turn without finishes or without room take `finish`, then `claim`, as the ORM
        store does.
        """
        now = clock()
        in_one_trip = bool(finishes) and limit > 0
        if not in_one_trip or any(f.action not in FINISH_ACTIONS for f in finishes):
            done = self.finish(finishes, now)
            if limit <= 0:
                return done, []
            now = clock()
            return done, self.claim(limit, now, now + lease, token, worker)
        statement, params = self._claim_statement(limit, now, now + lease, token, worker)
        hand_off = statement is CLAIM  # unpaced: FINISH leases the due heads it makes
        with (
            cursor(self.using) as lock,
            cursor(self.using) as finish,
            cursor(self.using) as claim,
            lock.connection.pipeline(),
        ):
            self._lock_and_finish(lock, finish, finishes, now, handing_off=params if hand_off else None)
            claim.execute(CLAIM_AFTER_HAND_OFF if hand_off else statement, params, prepare=True)
            changed = set(finish.fetchall())
            rows = claim.fetchall()
        done = [(f.post_id, f.lease_token) in changed for f in finishes]
        return done, self._claimed(rows, params, now + lease, token)

    def _lock_and_finish(
        self,
        lock: psycopg.Cursor[Any],
        finish: psycopg.Cursor[Any],
        finishes: Sequence[Finish],
        now: datetime,
        handing_off: dict[str, Any] | None = None,
    ) -> None:
        """Execute LOCK_LANES_OF_POSTS, then FINISH (in the caller's pipeline); `finish` then
        returns the (post id, lease token) of each finish whose claim was still current. With
        `handing_off` (CLAIM's parameters) FINISH_HANDING_OFF instead, which leases the due
        heads it makes to that claim."""
        post_ids = [f.post_id for f in finishes]
        lock.execute(LOCK_LANES_OF_POSTS, {"source": self.source, "post_ids": post_ids}, prepare=True)
        finish.execute(
            FINISH if handing_off is None else FINISH_HANDING_OFF,
            (handing_off or {})
            | {
                "source": self.source,
                "now": now,
                "post_ids": post_ids,
                "tokens": [f.lease_token for f in finishes],
                "actions": [f.action for f in finishes],
                "revs": [f.claimed_rev for f in finishes],
                "refs": [f.message_ref for f in finishes],
                # Floats all: an int among floats, psycopg refuses the mix.
                "waits": [float(f.wait or 0) for f in finishes],
                "reasons": [f.reason for f in finishes],
                "states": [f.state for f in finishes],
                "threads": [f.thread_id for f in finishes],
            },
            prepare=True,
        )

    def replace_status(self, now: datetime, pk: int, lane_id: int, body: dict[str, Any]) -> bool:
        """LOCK_LANE and REPLACE_STATUS in one round trip, both prepared: `set_status` of a
        status post that exists (the ORM store took ten times as long, building the head rule's
        statement at each call)."""
        params = {"source": self.source, "now": now, "pk": pk, "lane_id": lane_id, "body": json.dumps(body)}
        with cursor(self.using) as lock, cursor(self.using) as replace:
            with preparing(lock.connection), lock.connection.pipeline():
                lock.execute(LOCK_LANE, params, prepare=True)
                replace.execute(REPLACE_STATUS, params, prepare=True)
            row = replace.fetchone()
        assert row is not None  # REPLACE_STATUS ends in a SELECT without FROM: always one row
        return bool(row[0])

    def notify(self) -> None:
        with cursor(self.using) as c:
            c.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, self.source])

    # -- the ORM store's, by name ------------------------------------------------------------

    def hold_places(self, holds: Sequence[tuple[Scope, str, str, datetime, str]], now: datetime) -> None:
        self.orm.hold_places(holds, now)

    def next_due(self, now: datetime) -> datetime | None:
        return self.orm.next_due(now)

    def renew(self, now: datetime, tokens: Sequence[str], until: datetime) -> set[str]:
        return self.orm.renew(now, tokens, until)

    def requeue(self, now: datetime, post_id: str) -> bool:
        return self.orm.requeue(now, post_id)

    def cancel(self, now: datetime, post_id: str) -> bool:
        return self.orm.cancel(now, post_id)

    def retract(self, now: datetime, post_id: str) -> bool:
        return self.orm.retract(now, post_id)

    def prune(
        self, cutoff: datetime, attention_cutoff: datetime, status_cutoff: datetime | None, limit: int
    ) -> int:
        return self.orm.prune(cutoff, attention_cutoff, status_cutoff, limit)

    def prunable(self, cutoff: datetime, attention_cutoff: datetime, status_cutoff: datetime | None) -> Any:
        return self.orm.prunable(cutoff, attention_cutoff, status_cutoff)

    def prune_lanes(self, cutoff: datetime, after: int, limit: int) -> tuple[int | None, int]:
        return self.orm.prune_lanes(cutoff, after, limit)

    def prunable_lanes(
        self, cutoff: datetime, attention_cutoff: datetime, status_cutoff: datetime | None
    ) -> Any:
        return self.orm.prunable_lanes(cutoff, attention_cutoff, status_cutoff)

    def prune_gates(self, cutoff: datetime) -> int:
        return self.orm.prune_gates(cutoff)

    def prune_history(self, cutoff: datetime, limit: int) -> int:
        return self.orm.prune_history(cutoff, limit)

    def repair(self, after: int, limit: int) -> tuple[int | None, list[LaneRepair]]:
        return self.orm.repair(after, limit)
