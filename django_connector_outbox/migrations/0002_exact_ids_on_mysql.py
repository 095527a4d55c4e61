"""Ids compare exactly on MySQL/MariaDB too: a NO PAD binary collation for every id column.

0001 gave the id columns `utf8mb4_bin`, which is case-sensitive but PAD SPACE: "p1" and
"p1 " compare equal, so a second id collided with the first (an IntegrityError that the queue
retried for ever, a lane looked up under another container's id, a status overwriting another
one's). The NO PAD binary collations (MySQL 8: `utf8mb4_0900_bin`, MariaDB: `utf8mb4_nopad_bin`)
compare the exact characters, trailing spaces included, as PostgreSQL and SQLite do. Other
backends are left alone, so `makemigrations --check` sees no change.
"""

from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

ID_COLUMNS = {
    "django_connector_outbox_post": {
        "source": "VARCHAR(100) NOT NULL", "post_id": "VARCHAR(255) NOT NULL",
        "workspace_id": "VARCHAR(255) NOT NULL", "container_id": "VARCHAR(255) NOT NULL",
        "thread_id": "VARCHAR(255) NOT NULL", "turn_key": "VARCHAR(255) NULL",
        "message_ref": "VARCHAR(255) NULL",
    },
    "django_connector_outbox_lane": {
        "source": "VARCHAR(100) NOT NULL", "workspace_id": "VARCHAR(255) NOT NULL",
        "container_id": "VARCHAR(255) NOT NULL",
    },
}  # fmt: skip


def _collate(schema_editor: BaseDatabaseSchemaEditor, collation: str) -> None:
    for table, columns in ID_COLUMNS.items():
        modify = ", ".join(
            f"MODIFY `{name}` {kind.replace(' ', f' CHARACTER SET utf8mb4 COLLATE {collation} ', 1)}"
            for name, kind in columns.items()
        )
        schema_editor.execute(f"ALTER TABLE `{table}` {modify}")


def exact_ids(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    connection = schema_editor.connection
    if connection.vendor == "mysql":
        _collate(schema_editor, "utf8mb4_nopad_bin" if connection.mysql_is_mariadb else "utf8mb4_0900_bin")  # type: ignore[attr-defined]


def padded_ids(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    """Back to 0001's collation (fails if two ids now differ only by trailing spaces)."""
    if schema_editor.connection.vendor == "mysql":
        _collate(schema_editor, "utf8mb4_bin")


class Migration(migrations.Migration):
    dependencies = [("django_connector_outbox", "0001_initial")]

    operations = [migrations.RunPython(exact_ids, padded_ids, atomic=False, elidable=False)]
