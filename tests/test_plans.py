"""Plans that statistics taken at the wrong moment must not turn (PostgreSQL's planner).

The sustained soak (bench/soak.py --sustain) stalled its sender for a minute: the last ANALYZE
had seen an empty queue, so the partial index of waiting posts (migration 0016) looked like a
page of nothing, and the planner read a lane's queued posts by scanning that whole index
rather than probing the lane's key. Then a backlog came, and every lane of a reconcile batch
(and of a FINISH) scanned the whole backlog: 36 s for one batch, while the backlog grew. The
index now asks for a named workspace too (migration 0017), which no lane probe states; and
with it gone, the planner read the probes through connector_outbox_post_state (state,
updated_at), estimated at the same one row, even a probe by primary key, until the probes
stated the state by row comparisons that start with the lane (models.queued_in_lane), which
only connector_outbox_post_order can serve.

Here: an ANALYZE that sees only posted posts, then a backlog in every lane, and then what a
sender and a producer do, with the plan of every statement they run (auto_explain, sent to
the client): each reads the posts table by a key only.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import connection

from django_connector_outbox import Outbox
from django_connector_outbox.installations.admin import posts_waiting
from django_connector_outbox.models import Installation, Lane, Post
from django_connector_outbox.posts import Action, Finish

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's planner"),
]

LANES = 200
POSTED = 100  # per lane, when the statistics are taken
BACKLOG = 100  # per lane, queued after
# The posts table's indexes that probe by a key: its primary key, (source, post_id), a lane's
# queue (lane, state, queued_at, id) and a turn's posts (source, turn_key).
KEYS = {
    "django_connector_outbox_post_pkey",
    "connector_outbox_post_source_post_id",
    "connector_outbox_post_order",
    "connector_outbox_post_turn",
}


def insert_posts(state: str, per_lane: int, first: int) -> None:
    """`per_lane` posts in each lane, by SQL: tens of thousands of rows in a second."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {Post._meta.db_table} (source, post_id, lane_id, workspace_id, container_id,
                thread_id, kind, body, rev, state, attempts, delivered_attempt, last_error,
                queued_at, next_at, updated_at, created_at)
            SELECT 'memory', 'p' || lane.id || '-' || n, lane.id, lane.workspace_id, lane.container_id,
                '', 'message', '{{}}', 0, %s, 0, 0, '', now(), now(), now(), now()
            FROM {Lane._meta.db_table} lane, generate_series(%s, %s) n
            """,
            [state, first, first + per_lane - 1],
        )


def analyzed_with_an_empty_queue_then_a_backlog() -> None:
    """LANES lanes of POSTED posted posts each, analyzed; then BACKLOG queued ones each, not."""
    Lane.objects.bulk_create(
        Lane(source="memory", workspace_id="W", container_id=f"C{n}") for n in range(LANES)
    )
    insert_posts("posted", POSTED, 0)
    with connection.cursor() as cursor:
        for table in (Lane._meta.db_table, Post._meta.db_table):
            cursor.execute(f"VACUUM ANALYZE {table}")
    insert_posts("queued", BACKLOG, POSTED)


@contextmanager
def plans() -> Iterator[list[str]]:
    """The plan of every statement run inside (auto_explain at NOTICE level, nested ones too)."""
    seen: list[str] = []
    connection.ensure_connection()
    raw = connection.connection

    def keep(diagnostic: object) -> None:
        seen.append(str(getattr(diagnostic, "message_primary", "")))

    raw.add_notice_handler(keep)
    settings = {"log_min_duration": "0", "log_level": "notice", "log_nested_statements": "on"}
    with connection.cursor() as cursor:
        cursor.execute("LOAD 'auto_explain'")
        for name, value in settings.items():
            cursor.execute(f"SET auto_explain.{name} = '{value}'")
    try:
        yield seen
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET auto_explain.log_min_duration = '-1'")
        raw.remove_notice_handler(keep)


def post_indexes(plan: str) -> set[str]:
    """The indexes of the posts table that a plan reads ("Seq Scan" for none)."""
    scans = re.findall(r"(?:using|Index Scan on) (\w+)(?: on django_connector_outbox_post\b|)", plan)
    tables = re.findall(r"Seq Scan on django_connector_outbox_post\b", plan)
    return {
        name for name in scans if name.startswith(("connector_outbox_post", "django_connector_outbox_post"))
    } | ({"Seq Scan"} if tables else set())


def test_after_an_analyze_of_an_empty_queue_every_statement_of_a_turn_probes_by_a_key():
    analyzed_with_an_empty_queue_then_a_backlog()
    outbox = Outbox("memory")
    with plans() as seen:
        outbox.repair_lanes(limit=LANES)  # a reconcile batch: gives the lanes their heads
        outbox.queue("new", workspace_id="W", container_id="C1", body={})
        outbox.queue_many(
            [
                {"post_id": f"many{n}", "workspace_id": "W", "container_id": f"C{n}", "body": {}}
                for n in range(3)
            ]
        )
        outbox.set_status("status", workspace_id="W", container_id="C2", body={"text": "a"})
        outbox.set_status("status", workspace_id="W", container_id="C2", body={"text": "b"})
        claims = outbox.claim(limit=20)
        finishes = [(claim, Finish(claim.post_id, claim.lease_token, Action.POSTED)) for claim in claims]
        _, claims = outbox.finish_and_claim(finishes, limit=20)
        assert claims
        assert outbox.posted(claims[0])
        assert outbox.retry(claims[1], after=0)
    statements = [plan for plan in seen if "django_connector_outbox_post" in plan]
    assert len(statements) >= 8
    for plan in statements:
        assert post_indexes(plan) <= KEYS, plan
    assert any("connector_outbox_post_order" in plan for plan in statements)


def test_the_installations_page_still_counts_waiting_posts_through_their_index():
    analyzed_with_an_empty_queue_then_a_backlog()
    Installation.objects.create(source="memory", workspace_id="W")
    page = Installation.objects.annotate(waiting=posts_waiting())
    assert "connector_outbox_post_waiting" in page.explain()
    assert page.get().waiting == LANES * BACKLOG
