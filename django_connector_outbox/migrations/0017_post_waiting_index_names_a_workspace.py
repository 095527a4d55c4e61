# The index of waiting posts (0016) asks for a named workspace too (`workspace_id > ''`, true
# of every post), so that no probe of a lane's queued posts can use it: with the state alone
# in its condition, after an ANALYZE that saw an empty queue, the planner read a lane's queued
# posts by scanning the whole index, then the whole backlog once per lane (bench/soak.py
# --sustain: a sender stalled for a minute). PostQuerySet.waiting states the same condition.
# The index holds only the queued and failed posts: rebuilding it is short.

from collections.abc import Callable

from django.apps.registry import Apps
from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

from django_connector_outbox.posts import WAITING_STATES

NAME = "connector_outbox_post_waiting"


def rebuild(condition: str) -> Callable[[Apps, BaseDatabaseSchemaEditor], None]:
    """The index again, with this condition after the states'."""

    def run(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
        if schema_editor.connection.features.supports_partial_indexes:
            post = apps.get_model("django_connector_outbox", "Post")._meta.db_table
            states = ", ".join(f"'{state}'" for state in WAITING_STATES)
            schema_editor.execute(f"DROP INDEX {NAME}")
            schema_editor.execute(
                f"CREATE INDEX {NAME} ON {post} (source, workspace_id) WHERE state IN ({states}){condition}"
            )

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("django_connector_outbox", "0016_post_waiting_index"),
    ]

    operations = [
        migrations.RunPython(rebuild(" AND workspace_id > ''"), rebuild(""), elidable=False),
    ]
