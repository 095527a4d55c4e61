"""Scoped holds and pacing: Lane.pace_tat (a container's pace) and Gate (a workspace's or a
source's hold and pace). On MySQL/MariaDB the gate's ids get the NO PAD binary collation of
0002, so that they compare exactly, and alike with the lanes' ids they are compared to.
"""

import django.utils.timezone
from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

GATE_IDS = {
    "source": "VARCHAR(100) NOT NULL",
    "workspace_id": "VARCHAR(255) NOT NULL",
    "container_id": "VARCHAR(255) NOT NULL",
}


def exact_gate_ids(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    connection = schema_editor.connection
    if connection.vendor == "mysql":
        collation = "utf8mb4_nopad_bin" if connection.mysql_is_mariadb else "utf8mb4_0900_bin"  # type: ignore[attr-defined]
        modify = ", ".join(
            f"MODIFY `{name}` {kind.replace(' ', f' CHARACTER SET utf8mb4 COLLATE {collation} ', 1)}"
            for name, kind in GATE_IDS.items()
        )
        schema_editor.execute(f"ALTER TABLE `django_connector_outbox_gate` {modify}")


class Migration(migrations.Migration):
    dependencies = [
        ("django_connector_outbox", "0003_lane_floor"),
    ]

    operations = [
        migrations.AddField(
            model_name="lane",
            name="pace_tat",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.CreateModel(
            name="Gate",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("source", models.CharField(max_length=100)),
                (
                    "scope",
                    models.CharField(
                        choices=[
                            ("container", "Container"),
                            ("workspace", "Workspace"),
                            ("source", "Source"),
                        ],
                        max_length=16,
                    ),
                ),
                ("workspace_id", models.CharField(blank=True, default="", max_length=255)),
                ("container_id", models.CharField(blank=True, default="", max_length=255)),
                ("held_until", models.DateTimeField(blank=True, null=True)),
                ("hold_reason", models.TextField(blank=True, default="")),
                ("pace_tat", models.DateTimeField(blank=True, null=True)),
                ("updated_at", models.DateTimeField(default=django.utils.timezone.now)),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("source", "scope", "workspace_id", "container_id"),
                        name="connector_outbox_gate_place",
                    )
                ],
            },
        ),
        migrations.RunPython(exact_gate_ids, migrations.RunPython.noop, atomic=False, elidable=False),
    ]
