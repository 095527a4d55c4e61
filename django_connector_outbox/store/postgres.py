"""The PostgreSQL store: the hot paths of `protocol.Store`, one round trip per batch.

Same rules as the ORM store (`orm.OrmStore`, the specification: lane lock first, the lease on
the lane, fencing by lease token, head = the leased post or else the oldest queued one), written as data-modifying
CTEs so that a post costs a few microseconds of database time, not a handful of round trips;
differential tests (tests/test_store_differential.py) hold the two to the same results. The
rare writes (set_status, requeue, cancel, repair, prune) are the ORM store's. Whatever waits
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
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import connections

from django_connector_outbox.conf import conf
from django_connector_outbox.models import Attempt, Gate, Lane, Post
from django_connector_outbox.posts import Action, ClaimedPost, Finish, NewPost, Scope
from django_connector_outbox.store.orm import OrmStore
from django_connector_outbox.store.protocol import NOTIFY_CHANNEL, LaneRepair, claimed_post

if TYPE_CHECKING:  # psycopg is installed only where PostgreSQL is used
    import psycopg

POST = Post._meta.db_table
LANE = Lane._meta.db_table
GATE = Gate._meta.db_table
ATTEMPT = Attempt._meta.db_table


# The lanes of a batch, locked in id order by a statement of their own before QUEUE decides on
# their heads. In one statement the decision would read a snapshot taken before the locks were
# waited for (a head that another producer or a claimer changed meanwhile would be missed); as
# the next statement of a READ COMMITTED transaction, QUEUE sees all that was committed.
# Missing lanes are created here too, once the existing ones are locked, by an upsert (as
# store.OrmStore.lock_places): a lane that another producer created meanwhile, unseen by this
# statement's snapshot, is locked all the same. QUEUE must find no lane it does not hold: its
# later snapshot shows lanes committed while this one waited, and a post inserted into one of
# those unlocked was missed by a finish there, which moved the lane past it.
LOCK_PLACES = f"""
WITH place AS MATERIALIZED (
    SELECT DISTINCT w, c FROM unnest(%(workspaces)b::text[], %(containers)b::text[]) AS p(w, c)
),
found AS (
    SELECT lane.id FROM place
    JOIN {LANE} lane ON lane.source = %(source)s AND lane.workspace_id = place.w AND lane.container_id = place.c
    ORDER BY lane.id FOR UPDATE OF lane
),
created AS (  -- found first (its count), so that its locks come before these
    INSERT INTO {LANE} (source, workspace_id, container_id, lease_token, worker, attempts)
    SELECT %(source)s, w, c, '', '', 0 FROM place
    WHERE (SELECT count(*) FROM found) < (SELECT count(*) FROM place) AND NOT EXISTS (
        SELECT 1 FROM {LANE} lane
        WHERE lane.source = %(source)s AND lane.workspace_id = place.w AND lane.container_id = place.c
    )
    ORDER BY w, c
    ON CONFLICT (source, workspace_id, container_id) DO UPDATE SET source = EXCLUDED.source
    RETURNING id
)
SELECT id FROM found UNION ALL SELECT id FROM created
"""

# Run with every lane of the batch locked (LOCK_PLACES). A container's posts go by (queued_at,
# id) (models.QUEUE_ORDER), and a batch shares its queued_at: ids must follow the list. The
# join to the lanes emits rows in whatever order its plan gives (a merge join sorts them by
# place, and not stably), hence ORDER BY d.ord: the id column's nextval() is evaluated above
# that sort, row after row (tests/test_outbox_queue.py forces a merge join).
QUEUE = f"""
WITH data AS (
    SELECT * FROM unnest(%(post_ids)b::text[], %(workspaces)b::text[], %(containers)b::text[],
                         %(threads)b::text[], %(kinds)b::text[], %(bodies)b::text[], %(turn_keys)b::text[],
                         %(dues)b::timestamptz[], %(thread_ofs)b::text[])
        WITH ORDINALITY AS d(post_id, workspace_id, container_id, thread_id, kind, body, turn_key, due, thread_of,
                             ord)
),
ins AS (
    INSERT INTO {POST} (source, post_id, lane_id, workspace_id, container_id, thread_id, kind, body, rev,
                        turn_key, thread_of, state, attempts, queued_at, next_at, created_at, updated_at,
                        last_error)
    SELECT %(source)s, d.post_id, lane.id, d.workspace_id, d.container_id, d.thread_id, d.kind, d.body::jsonb,
           0, d.turn_key, d.thread_of, 'queued', 0, d.due, d.due, %(now)s, %(now)s, ''
    FROM data d
    JOIN {LANE} lane ON lane.source = %(source)s AND lane.workspace_id = d.workspace_id
                    AND lane.container_id = d.container_id
    ORDER BY d.ord
    ON CONFLICT (source, post_id) DO NOTHING
    RETURNING id, lane_id, queued_at, next_at
),
first AS (SELECT DISTINCT ON (lane_id) * FROM ins ORDER BY lane_id, queued_at, id),
-- Tables, not CTEs, on the inner side of every join: CTE row estimates are 1, and a nested
-- loop over two CTEs of a 1,000-post batch is a million comparisons. A lane changes when its
-- first new post comes before its head (or it had none), or before its floor (a known floor
-- only: an unknown one stays unknown).
placed AS (
    SELECT first.*,
        (lane.head_id IS NULL OR lane.lease_token = '' AND coalesce((
            SELECT head.state = 'queued' AND (head.queued_at, head.id) > (first.queued_at, first.id)
            FROM {POST} head WHERE head.id = lane.head_id), false)) AS heads,
        ((first.queued_at, first.id) < (lane.floor_queued_at, lane.floor_id)) IS TRUE AS lowers
    FROM first JOIN {LANE} lane ON lane.id = first.lane_id
),
heads AS (
    UPDATE {LANE} lane SET
        head_id = CASE WHEN placed.heads THEN placed.id ELSE lane.head_id END,
        due_at = CASE WHEN placed.heads THEN placed.next_at ELSE lane.due_at END,
        floor_queued_at = CASE WHEN placed.lowers THEN placed.queued_at ELSE lane.floor_queued_at END,
        floor_id = CASE WHEN placed.lowers THEN placed.id ELSE lane.floor_id END
    FROM placed WHERE lane.id = placed.lane_id AND (placed.heads OR placed.lowers)
)
SELECT (SELECT count(*) FROM ins),
       CASE WHEN EXISTS (SELECT 1 FROM ins) THEN pg_notify('{NOTIFY_CHANNEL}', %(source)s) END
"""

# Arrays are passed in binary (`%(name)b`): psycopg dumps a text array element by element,
# escaping each with regular expressions, a fifth of queue_many's time.


@contextmanager
def cursor(using: str) -> Iterator[psycopg.Cursor[Any]]:
    """A psycopg cursor on Django's connection, inside its transaction.

    Django's own cursors bind parameters client-side, so every execution is parsed and planned
    again: for these CTEs that is most of their cost. These statements are executed with
    `prepare=True` on a server-side binding cursor instead (PgBouncer in transaction mode needs
    `max_prepared_statements` for that, from version 1.21). Django's error wrapper turns
    psycopg's errors into its own, and marks the connection for its usability check, as its
    own cursors do.
    """
    import psycopg

    connection = connections[using]
    connection.ensure_connection()
    with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as raw:
        yield raw


# Lanes first (SKIP LOCKED: other claimers take other lanes), then their heads, which only
# lane holders ever change; the lease is written into the lane, and the post is only read. A
# lane that holds a lease is due when it has ended: its head is taken back stale, keeps the
# sent_at of the first claim of its run, and takes its turn by when its lease ended (heads due
# at one instant by id, as the lanes were read: the head queued first first).
CLAIM = f"""
WITH lanes AS (
    SELECT id, head_id, due_at, lease_token, attempts, sent_at FROM {LANE} lane
    WHERE source = %(source)s AND due_at <= %(now)s
      -- Held places (a wider 429): the whole source (checked once), the lane's workspace or
      -- the lane itself (a probe of the gate's unique index per lane read). Scalar subqueries,
      -- not NOT EXISTS: an anti-join would read every lane and every hold, then sort; this
      -- stays one range scan of due lanes that stops at the limit, whatever the number of holds.
      AND NOT EXISTS (SELECT 1 FROM {GATE} WHERE source = %(source)s AND scope = 'source' AND workspace_id = ''
                      AND container_id = '' AND held_until > %(now)s)
      AND NOT coalesce((SELECT g.held_until > %(now)s FROM {GATE} g WHERE g.source = %(source)s
                        AND g.scope = 'workspace' AND g.workspace_id = lane.workspace_id AND g.container_id = ''), false)
      AND NOT coalesce((SELECT g.held_until > %(now)s FROM {GATE} g WHERE g.source = %(source)s
                        AND g.scope = 'container' AND g.workspace_id = lane.workspace_id
                        AND g.container_id = lane.container_id), false)
    ORDER BY due_at, head_id LIMIT %(limit)s FOR UPDATE OF lane SKIP LOCKED
),
heads AS (
    SELECT lanes.lease_token <> '' AS stale, post.*,
        CASE WHEN lanes.lease_token <> '' THEN lanes.due_at ELSE post.next_at END AS due,
        CASE WHEN lanes.lease_token <> '' THEN lanes.attempts ELSE post.attempts END + 1 AS attempt,
        CASE WHEN lanes.lease_token <> '' THEN coalesce(lanes.sent_at, %(now)s) ELSE %(now)s END AS first_sent_at
    FROM lanes JOIN {POST} post ON post.id = lanes.head_id
    WHERE lanes.lease_token <> '' OR (post.state = 'queued' AND post.next_at <= %(now)s)
),
leased AS (
    UPDATE {LANE} lane SET lease_token = %(token)s, worker = %(worker)s, due_at = %(lease_until)s,
        attempts = heads.attempt, sent_at = heads.first_sent_at
    FROM heads WHERE lane.id = heads.lane_id
)
-- A reply's parent as it is now (one probe of the unique (source, post_id) index), finished
-- before its reply is a head (the container's order): its row's state is its state.
SELECT heads.post_id, heads.workspace_id, heads.container_id, heads.thread_id, heads.kind, heads.body::text,
       heads.rev, heads.attempt, heads.message_ref, heads.turn_key, heads.stale, heads.first_sent_at,
       heads.thread_of, parent.state, parent.message_ref, parent.thread_id
FROM heads LEFT JOIN {POST} parent ON heads.thread_of IS NOT NULL AND parent.source = %(source)s
                                   AND parent.post_id = heads.thread_of
ORDER BY heads.due, heads.id
"""

CLAIM_COLUMNS = (
    "post_id", "workspace_id", "container_id", "thread_id", "kind", "body", "rev", "attempts", "message_ref",
    "turn_key", "stale", "sent_at", "thread_of", "parent_state", "parent_ref", "parent_thread",
)  # fmt: skip


# Posts are found one index probe each, by a LATERAL subquery that its LIMIT keeps from being
# flattened into a join: as a join, a planner without statistics (a new table, autovacuum off)
# took `source = %s` for a few rows and scanned every post of the source, sent ones included,
# for each batch (3-5 ms at 20,000 posts, growing with them). The unique key makes LIMIT 1 exact.
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
# lane's new floor.
FINISH = f"""
WITH v AS MATERIALIZED (  -- each finish whose lane still holds its lease on it
    SELECT v.*, post.id AS pk, lane.id AS lane_id, lane.attempts AS attempt, lane.worker
    FROM unnest(%(post_ids)b::text[], %(tokens)b::text[], %(actions)b::text[], %(revs)b::int[],
                %(refs)b::text[], %(waits)b::float8[], %(reasons)b::text[], %(states)b::text[],
                %(threads)b::text[])
        AS v(post_id, token, action, claimed_rev, ref, wait, reason, state, thread)
    CROSS JOIN LATERAL (
        SELECT id, lane_id FROM {POST} WHERE source = %(source)s AND post_id = v.post_id LIMIT 1
    ) post
    JOIN {LANE} lane ON lane.id = post.lane_id AND lane.head_id = post.id AND lane.lease_token = v.token
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
        WHERE lane_id = touched.lane_id AND state = 'queued'
          AND (queued_at, id) >= (coalesce(touched.floor_queued_at, '-infinity'), coalesce(touched.floor_id, 0))
          AND id NOT IN (SELECT pk FROM v)
        ORDER BY queued_at, id LIMIT 1
    ) nearest
    UNION ALL  -- no candidate at all: the lane has no head, and nothing queued is below the finished post
    SELECT lane_id, NULL, queued_at, id, NULL, 1 FROM done
),
best AS (
    SELECT DISTINCT ON (lane_id) lane_id, head, next_at, queued_at, id FROM candidates
    ORDER BY lane_id, last, queued_at, id
),
heads AS (
    UPDATE {LANE} lane SET lease_token = '', head_id = best.head, due_at = best.next_at,
        floor_queued_at = best.queued_at, floor_id = best.id
    FROM best WHERE lane.id = best.lane_id
)
SELECT post_id, token FROM done
"""


# The actions that FINISH records; the others take the ORM store's.
FINISH_ACTIONS = frozenset({Action.POSTED, Action.FOUND, Action.RETRY, Action.HOLD, Action.SETTLE})


class PostgresStore:
    """`protocol.Store` on PostgreSQL: insert, claim and finish as the SQL statements above.

    What it does not write in SQL it hands, by name, to the ORM store it holds (`orm`): the
    rare writes, and the finishes that keep a claim going (LEAVE, GIVE_BACK).
    """

    def __init__(self, source: str, using: str) -> None:
        self.source = source
        self.using = using
        self.orm = OrmStore(source, using)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.source!r} using={self.using!r}>"

    def insert(self, rows: Sequence[NewPost], now: datetime) -> int:
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
        with cursor(self.using) as lock, cursor(self.using) as queue, lock.connection.pipeline():
            # One round trip (a pipeline): the server still runs QUEUE after the locks are
            # taken, in a snapshot of its own.
            lock.execute(LOCK_PLACES, params, prepare=True)
            queue.execute(QUEUE, params, prepare=True)  # its NOTIFY is part of the statement
            row = queue.fetchone()
        assert row is not None  # QUEUE ends in a SELECT without FROM: always one row
        return int(row[0])

    def claim(
        self, limit: int, now: datetime, lease_until: datetime, token: str, worker: str
    ) -> list[ClaimedPost]:
        if not self.claims_in_sql():
            return self.orm.claim(limit, now, lease_until, token, worker)
        with cursor(self.using) as c:
            c.execute(CLAIM, self._claim_params(limit, now, lease_until, token, worker), prepare=True)
            return self._claimed(c.fetchall(), lease_until, token)

    def claims_in_sql(self) -> bool:
        """Whether CLAIM claims this source's heads. A paced source claims at the pace of its
        platform (tens a second): the ORM store's claim, which locks the shared paces, is plenty
        fast for it."""
        return not conf.pace(self.source)

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

        Finishes that keep a claim going (LEAVE, GIVE_BACK: the ORM store's), a paced source's
        claim (`claims_in_sql`), and a turn without finishes or without room take `finish`,
        then `claim`, as the ORM store does.
        """
        now = clock()
        in_one_trip = bool(finishes) and limit > 0 and self.claims_in_sql()
        if not in_one_trip or any(f.action not in FINISH_ACTIONS for f in finishes):
            done = self.finish(finishes, now)
            if limit <= 0:
                return done, []
            now = clock()
            return done, self.claim(limit, now, now + lease, token, worker)
        with (
            cursor(self.using) as lock,
            cursor(self.using) as finish,
            cursor(self.using) as claim,
            lock.connection.pipeline(),
        ):
            self._lock_and_finish(lock, finish, finishes, now)
            claim.execute(CLAIM, self._claim_params(limit, now, now + lease, token, worker), prepare=True)
            changed = set(finish.fetchall())
            rows = claim.fetchall()
        done = [(f.post_id, f.lease_token) in changed for f in finishes]
        return done, self._claimed(rows, now + lease, token)

    def _claim_params(
        self, limit: int, now: datetime, lease_until: datetime, token: str, worker: str
    ) -> dict[str, Any]:
        return dict(
            source=self.source, limit=limit, now=now, lease_until=lease_until, token=token, worker=worker
        )

    def _claimed(self, rows: list[tuple[Any, ...]], lease_until: datetime, token: str) -> list[ClaimedPost]:
        """The claims of CLAIM's rows."""
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

    def _lock_and_finish(
        self,
        lock: psycopg.Cursor[Any],
        finish: psycopg.Cursor[Any],
        finishes: Sequence[Finish],
        now: datetime,
    ) -> None:
        """Execute LOCK_LANES_OF_POSTS, then FINISH (in the caller's pipeline); `finish` then
        returns the (post id, lease token) of each finish whose claim was still current."""
        post_ids = [f.post_id for f in finishes]
        lock.execute(LOCK_LANES_OF_POSTS, {"source": self.source, "post_ids": post_ids}, prepare=True)
        finish.execute(
            FINISH,
            {
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

    def notify(self) -> None:
        with cursor(self.using) as c:
            c.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, self.source])

    # -- the ORM store's, by name ------------------------------------------------------------

    def hold_places(self, holds: Sequence[tuple[Scope, str, str, datetime, str]], now: datetime) -> None:
        self.orm.hold_places(holds, now)

    def next_due(self, now: datetime) -> datetime | None:
        return self.orm.next_due(now)

    def holds_in_force(self, now: datetime) -> Any:
        return self.orm.holds_in_force(now)

    def replace_status(self, now: datetime, pk: int, lane_id: int, body: dict[str, Any]) -> None:
        self.orm.replace_status(now, pk, lane_id, body)

    def requeue(self, now: datetime, post_id: str) -> bool:
        return self.orm.requeue(now, post_id)

    def cancel(self, now: datetime, post_id: str) -> bool:
        return self.orm.cancel(now, post_id)

    def prune(self, cutoff: datetime, attention_cutoff: datetime, limit: int) -> int:
        return self.orm.prune(cutoff, attention_cutoff, limit)

    def prunable(self, cutoff: datetime, attention_cutoff: datetime) -> Any:
        return self.orm.prunable(cutoff, attention_cutoff)

    def prune_gates(self, cutoff: datetime) -> int:
        return self.orm.prune_gates(cutoff)

    def prune_history(self, cutoff: datetime, limit: int) -> int:
        return self.orm.prune_history(cutoff, limit)

    def repair(self, after: int, limit: int) -> tuple[int | None, list[LaneRepair]]:
        return self.orm.repair(after, limit)
