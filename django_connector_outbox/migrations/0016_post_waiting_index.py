# The posts waiting for a workspace's installation (PostQuerySet.waiting), counted per row of the
# installations' admin list (issue 22's soak: 2 s a page at 10 million posts without it). A
# partial index, made only where the database has them (PostgreSQL, SQLite): declared in the
# model, Django would warn on MySQL/MariaDB at every command (models.W037), so it is SQL here.

from django.apps.registry import Apps
from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

from django_connector_outbox.posts import WAITING_STATES

NAME = "connector_outbox_post_waiting"


def create(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    if schema_editor.connection.features.supports_partial_indexes:
        post = apps.get_model("django_connector_outbox", "Post")._meta.db_table
        states = ", ".join(f"'{state}'" for state in WAITING_STATES)
        schema_editor.execute(
            f"CREATE INDEX {NAME} ON {post} (source, workspace_id) WHERE state IN ({states})"
        )


def drop(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    if schema_editor.connection.features.supports_partial_indexes:
        schema_editor.execute(f"DROP INDEX {NAME}")


class Migration(migrations.Migration):
    dependencies = [
        ("django_connector_outbox", "0015_outcome_lost_reply"),
    ]

    operations = [migrations.RunPython(create, drop, elidable=False)]
