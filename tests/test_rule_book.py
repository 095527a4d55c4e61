"""The rule book: every rule about rows is defined once, by name, in the model layer's querysets
(models.py), and read through them everywhere else.

Two things hold it: no module outside the model layer and the store names the columns that
carry those rules (a claim's lease, a lane's head, a pace), so the admin, the commands,
`testing` and the metrics can only read them through the querysets; and each SQL fragment of
the PostgreSQL store, named after the queryset rule it restates, selects what that rule selects
on drawn rows (the differential tests, tests/test_store_differential.py, cover the statements
the fragments make up).
"""

from __future__ import annotations

import ast
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from django_connector_outbox import Outbox
from django_connector_outbox.models import QUEUE_ORDER, Gate, Lane, Post, place, queued_in_lane, sending
from django_connector_outbox.posts import Scope, State
from django_connector_outbox.store import postgres

PACKAGE = Path(__file__).resolve().parent.parent / "django_connector_outbox"
# The columns that carry the rules of a claim (its lease), a lane's head and a pace.
RULE_COLUMNS = ("lease_token", "head_id", "pace_tat")
# Where they may be named: the model layer, the store, the migrations.
RULE_HOMES = ("models.py", "store/", "migrations/")
# A claim's (ClaimedPost, Finish) own field: the contract's, not the lane's column.
CLAIM_FIELD = "lease_token"


def names_of_rule_columns(path: Path, root: Path = PACKAGE) -> list[str]:
    """Where a module names a rule column: in a string (a field name, a lookup), a keyword (a
    filter, an update) or an attribute of a row (`.head_id`, `.pace_tat`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            words = node.value.replace("__", " ").replace('"', " ").split()
            hits = [w for w in words if w in RULE_COLUMNS]
        elif isinstance(node, ast.keyword) and node.arg:
            hits = [w for w in node.arg.split("__") if w in RULE_COLUMNS]
        elif isinstance(node, ast.Attribute):
            hits = [node.attr] if node.attr in RULE_COLUMNS and node.attr != CLAIM_FIELD else []
        else:
            continue
        found += [f"{path.relative_to(root)}:{node.lineno}: {hit}" for hit in hits]
    return found


def test_only_the_model_layer_and_the_store_name_the_columns_of_the_rules():
    modules = [
        path
        for path in sorted(PACKAGE.rglob("*.py"))
        if not str(path.relative_to(PACKAGE)).startswith(RULE_HOMES)
    ]
    assert len(modules) > 40
    found = [hit for path in modules for hit in names_of_rule_columns(path)]
    templates = [
        f"{path.relative_to(PACKAGE)}: {column}"
        for path in sorted((PACKAGE / "templates").rglob("*.html"))
        for column in RULE_COLUMNS
        if column in path.read_text(encoding="utf-8")
    ]
    assert found + templates == []


def test_the_scan_finds_a_rule_column_where_it_is_named(tmp_path):
    module = tmp_path / "module.py"
    module.write_text(
        "Lane.objects.filter(lease_token='')\nx = lane.head_id\nfields = ('pace_tat',)\n"
        "Post.objects.filter(lane__lease_token='')\nclaim.lease_token\n"
    )
    hits = [hit.split(": ")[1] for hit in names_of_rule_columns(module, tmp_path)]
    assert sorted(hits) == ["head_id", "lease_token", "lease_token", "pace_tat"]


on_postgresql = pytest.mark.skipif(
    not settings.DATABASES["default"]["ENGINE"].endswith("postgresql"),
    reason="the SQL fragments are PostgreSQL's; run with DATABASE_URL pointing at PostgreSQL",
)
SOURCE = "memory"
PLACES = [("W0", "C0"), ("W0", "C1"), ("W1", "C2"), ("W1", "C3")]
OFFSETS = st.sampled_from([None, -60, -1, 0, 1, 60])
lane_state = st.fixed_dictionaries({"due": OFFSETS, "leased": st.booleans(), "pace": OFFSETS})
TOLERANCE = timedelta(seconds=1)
gate = st.tuples(
    st.sampled_from([Scope.SOURCE, Scope.WORKSPACE, Scope.CONTAINER]),
    st.sampled_from(PLACES),
    st.sampled_from([None, -5, 0, 5]),
)


def fragment_ids(where: str = "TRUE", order: str = "lane.id") -> list[int]:
    """The ids of the source's lanes that a fragment selects, in an order."""
    sql = f"SELECT lane.id FROM {postgres.LANE} lane WHERE lane.source = %(source)s AND {where} ORDER BY {order}"
    with connection.cursor() as cursor:
        cursor.execute(sql, {"source": SOURCE, "now": NOW, "container_ready": NOW + TOLERANCE})
        return [row[0] for row in cursor.fetchall()]


NOW = timezone.now().replace(microsecond=0)


@on_postgresql
@pytest.mark.django_db
@hypothesis_settings(max_examples=60, deadline=None)
@given(lanes=st.lists(lane_state, min_size=4, max_size=4), gates=st.lists(gate, max_size=4))
def test_each_sql_fragment_selects_what_its_queryset_rule_selects(lanes, gates):
    Post.objects.all().delete()
    Lane.objects.all().delete()
    Gate.objects.all().delete()
    outbox = Outbox(SOURCE)
    for n, (workspace, container) in enumerate(PLACES):
        outbox.queue(f"p{n}", workspace_id=workspace, container_id=container, body={"text": "a"})
        outbox.queue(
            f"q{n}", workspace_id=workspace, container_id=container, body={"text": "b"}
        )  # behind the head
    for (workspace, container), state in zip(PLACES, lanes, strict=True):
        due, tat = (None if state[k] is None else NOW + timedelta(seconds=state[k]) for k in ("due", "pace"))
        mine = Lane.objects.filter(source=SOURCE, workspace_id=workspace, container_id=container)
        mine.update(due_at=due, lease_token="t" if state["leased"] else "", pace_tat=tat)
    for scope, (workspace, container), held in gates:
        until = None if held is None else NOW + timedelta(seconds=held)
        Gate.objects.update_or_create(
            source=SOURCE, **place(scope, workspace, container), defaults={"held_until": until}
        )
    lanes_ = Lane.objects.of_source(SOURCE)

    def ids(queryset):
        return sorted(queryset.values_list("pk", flat=True))

    assert fragment_ids(postgres.lane_due()) == ids(lanes_.due(NOW))
    assert fragment_ids(postgres.lane_leased()) == ids(lanes_.leased())
    assert fragment_ids(postgres.lane_unheld()) == ids(lanes_.unheld(NOW))
    assert fragment_ids(postgres.lane_pace_allows()) == ids(lanes_.pace_allows(NOW, TOLERANCE))
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT post.id FROM {postgres.POST} post JOIN {postgres.LANE} lane ON lane.id = post.lane_id"
            f" WHERE post.source = %s AND {postgres.post_sending()} ORDER BY post.id",
            [SOURCE],
        )
        assert [row[0] for row in cursor.fetchall()] == ids(
            Post.objects.filter(source=SOURCE).filter(sending())
        )
    keys = {pk: (due, head) for pk, due, head in lanes_.values_list("pk", "due_at", "head_id")}
    by_rule = [keys[pk] for pk in lanes_.in_claim_order().values_list("pk", flat=True)]
    assert [keys[pk] for pk in fragment_ids(order=postgres.lanes_in_claim_order())] == by_rule


@on_postgresql
@pytest.mark.django_db
def test_the_sql_queue_order_is_the_models_queue_order():
    outbox = Outbox(SOURCE)
    outbox.queue_many(
        [
            {"post_id": f"b{n}", "workspace_id": "W", "container_id": "C", "body": {"text": "b"}}
            for n in (3, 1, 2)
        ]
    )
    outbox.queue("a0", workspace_id="W", container_id="C", body={"text": "a"})
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT post_id FROM {postgres.POST} ORDER BY {postgres.QUEUE_ORDER_SQL}")
        by_sql = [row[0] for row in cursor.fetchall()]
    assert by_sql == list(Post.objects.order_by(*QUEUE_ORDER).values_list("post_id", flat=True))


@pytest.mark.django_db
def test_a_queued_post_of_a_lane_is_one_with_its_lane_and_the_state_queued():
    # Every state, some sorting before 'queued' and some after (the row comparisons of
    # PostgreSQL's form), in two lanes.
    for state in State.values:
        for container in ("C0", "C1"):
            Outbox(SOURCE).queue(f"{state}-{container}", workspace_id="W", container_id=container, body={})
            Post.objects.filter(post_id=f"{state}-{container}").update(state=state)
    for lane in Lane.objects.all():
        plain = Post.objects.filter(lane_id=lane.pk, state=State.QUEUED)
        assert set(Post.objects.filter(queued_in_lane(lane.pk))) == set(plain)
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                where = postgres.queued_in_lane("%s")
                cursor.execute(f"SELECT id FROM {postgres.POST} WHERE {where}", [lane.pk] * where.count("%s"))
                assert {row[0] for row in cursor.fetchall()} == {post.pk for post in plain}
