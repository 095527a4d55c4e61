"""The first release's one migration, 0001_squashed_0019_first_release, and the 19 it replaces.

A new database applies the squashed migration alone; a database that applied some of 0001-0019
before the release (from main, up to 0017 here) goes on with the replaced ones it lacks, its
rows kept, and then has the squashed one recorded as applied. Both roads end at the same schema: every column (type, null, default,
collation: the NO PAD ids on MySQL/MariaDB) and every index and constraint, the partial index
of waiting posts included.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.loader import MigrationLoader

from django_connector_outbox import Outbox

pytestmark = pytest.mark.django_db(transaction=True)

APP = "django_connector_outbox"
SQUASHED = (APP, "0001_squashed_0019_first_release")
LAST_REPLACED = (APP, "0019_heartbeat_in_flight_loop_lag")
FROM_MAIN = (APP, "0017_post_waiting_index_names_a_workspace")  # where a database of main stood
AFTER_MAIN = [(APP, "0018_post_kind_delete"), LAST_REPLACED]
PLACE = {"workspace_id": "T1", "container_id": "C1"}


def latest() -> list[tuple[str, str]]:
    return MigrationLoader(connection).graph.leaf_nodes(APP)


def migrate(*targets: tuple[str, str | None], replaced: bool = False) -> None:
    """Migrate to `targets`; `replaced`: through the migrations the squashed one replaces, as a
    database migrated from main did (Django before 6.0 leaves them out of its graph once none
    is applied, so they are named only through a loader that keeps them)."""
    executor = MigrationExecutor(connection)
    if replaced:
        executor.loader = MigrationLoader(connection, replace_migrations=False)
    executor.migrate(list(targets))


def plan_to_latest() -> list[tuple[str, str]]:
    executor = MigrationExecutor(connection)
    return [(m.app_label, m.name) for m, _ in executor.migration_plan(latest())]


def applied() -> set[tuple[str, str]]:
    return {key for key in MigrationLoader(connection).applied_migrations if key[0] == APP}


def schema() -> dict[str, Any]:
    """The app's tables as the database describes them, in an order that does not matter."""
    with connection.cursor() as cursor:
        tables = sorted(t for t in connection.introspection.table_names(cursor) if t.startswith(APP))
        described = {}
        for table in tables:
            columns = sorted(
                (c.name, str(c.type_code), c.null_ok, str(c.default), getattr(c, "collation", None))
                for c in connection.introspection.get_table_description(cursor, table)
            )
            constraints = connection.introspection.get_constraints(cursor, table)
            # SQLite names its column CHECKs by position ("__unnamed_constraint_N__").
            shapes = sorted(
                (
                    "" if name.startswith("__unnamed") else name,
                    tuple(c["columns"] or ()), bool(c["unique"]), bool(c["index"]),
                    bool(c["primary_key"]), str(c["foreign_key"]), bool(c["check"]),
                )
                for name, c in constraints.items()
            )  # fmt: skip
            described[table] = {
                "columns": columns,
                "constraints": shapes,
                "indexes": index_sql(cursor, table),
            }
    return described


def index_sql(cursor: Any, table: str) -> list[tuple[str, str]]:
    """Each index's definition, where it says more than its columns (a partial index's WHERE)."""
    if connection.vendor == "postgresql":
        cursor.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s", [table])
    elif connection.vendor == "sqlite":
        cursor.execute("SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = %s", [table])
    else:  # MySQL/MariaDB: no partial indexes; the columns and constraints say it all
        return []
    return sorted((name, " ".join(str(sql).split())) for name, sql in cursor.fetchall())


@pytest.fixture
def fresh_schema():
    """The schema of a new database (the test database: the squashed migration alone); the
    tables of the later tests are back at the end, whatever the test did."""
    migrate(*[(APP, None)])
    assert plan_to_latest() == [SQUASHED]
    migrate(*latest())
    yield schema()
    migrate(*latest())


def test_a_new_database_applies_the_squashed_migration_and_records_what_it_replaces(fresh_schema):
    assert {SQUASHED, LAST_REPLACED, FROM_MAIN, (APP, "0001_initial")} <= applied()
    if connection.features.supports_partial_indexes:
        assert "connector_outbox_post_waiting" in {
            shape[0] for shape in fresh_schema[f"{APP}_post"]["constraints"]
        }
    assert plan_to_latest() == []


def test_a_database_at_0017_goes_on_with_the_replaced_migrations_it_lacks_and_keeps_its_rows(fresh_schema):
    migrate(*[(APP, None)])
    migrate(FROM_MAIN, replaced=True)  # 0001-0017 one by one, as a database migrated from main
    Outbox("memory").queue("from-main", **PLACE, body={"text": "queued before the release"})

    assert SQUASHED not in applied()
    assert plan_to_latest() == AFTER_MAIN
    migrate(*latest())

    assert SQUASHED in applied()
    assert Outbox("memory").find("from-main").state == "queued"
    assert schema() == fresh_schema
