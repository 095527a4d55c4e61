"""Installations (a source's credentials per workspace) and destinations (a URL per container).

On MySQL/MariaDB their ids get the NO PAD binary collation of 0002, so that they compare
exactly, alike with the posts' ids they are looked up by.
"""

import django.core.serializers.json
import django.utils.timezone
from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

ID_COLUMNS = {
    "django_connector_outbox_installation": {
        "source": "VARCHAR(100) NOT NULL", "workspace_id": "VARCHAR(255) NOT NULL",
        "enterprise_id": "VARCHAR(255) NOT NULL",
    },
    "django_connector_outbox_destination": {
        "source": "VARCHAR(100) NOT NULL", "container_id": "VARCHAR(255) NOT NULL",
        "workspace_id": "VARCHAR(255) NOT NULL",
    },
}  # fmt: skip


def exact_ids(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    connection = schema_editor.connection
    if connection.vendor == "mysql":
        collation = "utf8mb4_nopad_bin" if connection.mysql_is_mariadb else "utf8mb4_0900_bin"  # type: ignore[attr-defined]
        for table, columns in ID_COLUMNS.items():
            modify = ", ".join(
                f"MODIFY `{name}` {kind.replace(' ', f' CHARACTER SET utf8mb4 COLLATE {collation} ', 1)}"
                for name, kind in columns.items()
            )
            schema_editor.execute(f"ALTER TABLE `{table}` {modify}")


class Migration(migrations.Migration):
    dependencies = [
        ("django_connector_outbox", "0008_queue_order_by_id"),
    ]

    operations = [
        migrations.CreateModel(
            name="Destination",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("source", models.CharField(max_length=100)),
                ("container_id", models.CharField(max_length=255)),
                ("workspace_id", models.CharField(blank=True, default="", max_length=255)),
                ("secrets", models.TextField()),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                ("updated_at", models.DateTimeField(default=django.utils.timezone.now)),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("source", "container_id"), name="connector_outbox_destination_place"
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="Installation",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("source", models.CharField(max_length=100)),
                ("workspace_id", models.CharField(max_length=255)),
                ("enterprise_id", models.CharField(blank=True, default="", max_length=255)),
                ("is_enterprise_install", models.BooleanField(default=False)),
                ("team_name", models.CharField(blank=True, default="", max_length=255)),
                ("enterprise_name", models.CharField(blank=True, default="", max_length=255)),
                ("app_id", models.CharField(blank=True, default="", max_length=255)),
                ("bot_id", models.CharField(blank=True, default="", max_length=255)),
                ("bot_user_id", models.CharField(blank=True, default="", max_length=255)),
                ("bot_scopes", models.TextField(blank=True, default="")),
                ("installer_user_id", models.CharField(blank=True, default="", max_length=255)),
                ("user_scopes", models.TextField(blank=True, default="")),
                ("token_type", models.CharField(blank=True, default="", max_length=32)),
                ("secrets", models.TextField(blank=True, default="")),
                ("token_issued_at", models.DateTimeField(blank=True, null=True)),
                ("token_expires_at", models.DateTimeField(blank=True, null=True)),
                (
                    "extra",
                    models.JSONField(
                        blank=True, default=dict, encoder=django.core.serializers.json.DjangoJSONEncoder
                    ),
                ),
                ("installed_at", models.DateTimeField(default=django.utils.timezone.now)),
                ("updated_at", models.DateTimeField(default=django.utils.timezone.now)),
                ("revoked_at", models.DateTimeField(blank=True, null=True)),
                ("revoked_reason", models.TextField(blank=True, default="")),
                ("refresh_error", models.TextField(blank=True, default="")),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("source", "workspace_id"), name="connector_outbox_installation_place"
                    )
                ],
            },
        ),
        migrations.RunPython(exact_ids, migrations.RunPython.noop, atomic=False, elidable=False),
    ]
