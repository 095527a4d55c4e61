"""A post's `thread_of`: the post_id of the earlier post of its container whose thread it goes
into, resolved when it is sent (queue(..., thread_of=)).

On MySQL/MariaDB it gets the NO PAD binary collation of 0002, so that it compares exactly,
alike with the post ids it names.
"""

from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps


def exact_ids(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    connection = schema_editor.connection
    if connection.vendor == "mysql":
        collation = "utf8mb4_nopad_bin" if connection.mysql_is_mariadb else "utf8mb4_0900_bin"  # type: ignore[attr-defined]
        schema_editor.execute(
            "ALTER TABLE `django_connector_outbox_post` MODIFY `thread_of` "
            f"VARCHAR(255) CHARACTER SET utf8mb4 COLLATE {collation} NULL"
        )


class Migration(migrations.Migration):
    dependencies = [
        ("django_connector_outbox", "0011_senders"),
    ]

    operations = [
        migrations.AddField(
            model_name="post",
            name="thread_of",
            field=models.CharField(blank=True, max_length=255, null=True),
        ),
        # Removing the column undoes it: nothing to do backwards.
        migrations.RunPython(exact_ids, migrations.RunPython.noop, atomic=False, elidable=False),
    ]
