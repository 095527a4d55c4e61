"""0001 to 0019 in one migration, for the first release: the schema 0019 left, made at once.

A new database applies this one alone; a database migrated from main before the release goes on
through the replaced migrations it has not applied (`replaces`), and then has this one recorded
as applied. The replaced files stay until every database of a release before this one is past
0019. Their data moves (0007's
leases, 0008's floors, 0015's outcomes) have nothing to move in a new database and are left
out; the SQL that models cannot say is kept: NO PAD binary collations for every id column on
MySQL/MariaDB (0002, 0004, 0009, 0012: ids compare exactly, trailing spaces included, as on
PostgreSQL and SQLite) and the partial index of waiting posts (0016, 0017).
"""

import django.core.serializers.json
import django.db.models.deletion
import django.utils.timezone
from django.apps.registry import Apps
from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

from django_connector_outbox.posts import WAITING_STATES

ID_COLUMNS = {
    "django_connector_outbox_post": {
        "source": "VARCHAR(100) NOT NULL", "post_id": "VARCHAR(255) NOT NULL",
        "workspace_id": "VARCHAR(255) NOT NULL", "container_id": "VARCHAR(255) NOT NULL",
        "thread_id": "VARCHAR(255) NOT NULL", "turn_key": "VARCHAR(255) NULL",
        "message_ref": "VARCHAR(255) NULL", "thread_of": "VARCHAR(255) NULL",
    },
    "django_connector_outbox_lane": {
        "source": "VARCHAR(100) NOT NULL", "workspace_id": "VARCHAR(255) NOT NULL",
        "container_id": "VARCHAR(255) NOT NULL",
    },
    "django_connector_outbox_gate": {
        "source": "VARCHAR(100) NOT NULL", "workspace_id": "VARCHAR(255) NOT NULL",
        "container_id": "VARCHAR(255) NOT NULL",
    },
    "django_connector_outbox_installation": {
        "source": "VARCHAR(100) NOT NULL", "workspace_id": "VARCHAR(255) NOT NULL",
        "enterprise_id": "VARCHAR(255) NOT NULL",
    },
    "django_connector_outbox_destination": {
        "source": "VARCHAR(100) NOT NULL", "container_id": "VARCHAR(255) NOT NULL",
        "workspace_id": "VARCHAR(255) NOT NULL",
    },
}  # fmt: skip


def exact_ids_on_mysql(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    connection = schema_editor.connection
    if connection.vendor != "mysql":
        return
    collation = "utf8mb4_nopad_bin" if connection.mysql_is_mariadb else "utf8mb4_0900_bin"  # type: ignore[attr-defined]
    for table, columns in ID_COLUMNS.items():
        modify = ", ".join(
            f"MODIFY `{name}` {kind.replace(' ', f' CHARACTER SET utf8mb4 COLLATE {collation} ', 1)}"
            for name, kind in columns.items()
        )
        schema_editor.execute(f"ALTER TABLE `{table}` {modify}")


def waiting_index(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    """0017's index of the waiting posts (PostQuerySet.waiting); where partial indexes exist."""
    if schema_editor.connection.features.supports_partial_indexes:
        post = apps.get_model("django_connector_outbox", "Post")._meta.db_table
        states = ", ".join(f"'{state}'" for state in WAITING_STATES)
        schema_editor.execute(
            "CREATE INDEX connector_outbox_post_waiting ON "
            f"{post} (source, workspace_id) WHERE state IN ({states}) AND workspace_id > ''"
        )


class Migration(migrations.Migration):
    initial = True

    replaces = [
        ("django_connector_outbox", "0001_initial"),
        ("django_connector_outbox", "0002_exact_ids_on_mysql"),
        ("django_connector_outbox", "0003_lane_floor"),
        ("django_connector_outbox", "0004_gates"),
        ("django_connector_outbox", "0005_admin_updated_index"),
        ("django_connector_outbox", "0006_lane_due_head"),
        ("django_connector_outbox", "0007_lease_on_lane"),
        ("django_connector_outbox", "0008_queue_order_by_id"),
        ("django_connector_outbox", "0009_installations"),
        ("django_connector_outbox", "0010_oauth_state"),
        ("django_connector_outbox", "0011_senders"),
        ("django_connector_outbox", "0012_thread_of"),
        ("django_connector_outbox", "0013_history"),
        ("django_connector_outbox", "0014_verbose_names"),
        ("django_connector_outbox", "0015_outcome_lost_reply"),
        ("django_connector_outbox", "0016_post_waiting_index"),
        ("django_connector_outbox", "0017_post_waiting_index_names_a_workspace"),
        ("django_connector_outbox", "0018_post_kind_delete"),
        ("django_connector_outbox", "0019_heartbeat_in_flight_loop_lag"),
    ]

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="Heartbeat",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("worker", models.CharField(max_length=200, verbose_name="worker")),
                ("host", models.CharField(max_length=255, verbose_name="host")),
                ("pid", models.PositiveIntegerField(verbose_name="pid")),
                ("sources", models.JSONField(default=list, verbose_name="sources")),
                ("started_at", models.DateTimeField(verbose_name="started at")),
                ("last_seen", models.DateTimeField(verbose_name="last seen")),
                ("sent", models.PositiveBigIntegerField(default=0, verbose_name="posts sent")),
                ("in_flight", models.PositiveIntegerField(default=0, verbose_name="sends in flight")),
                ("loop_lag", models.FloatField(blank=True, null=True, verbose_name="loop lag")),
            ],
            options={
                "verbose_name": "sender",
                "verbose_name_plural": "senders",
            },
        ),
        migrations.CreateModel(
            name="Lane",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("source", models.CharField(max_length=100)),
                ("workspace_id", models.CharField(max_length=255)),
                ("container_id", models.CharField(max_length=255)),
                ("due_at", models.DateTimeField(blank=True, null=True)),
                ("floor_queued_at", models.DateTimeField(blank=True, null=True)),
                ("floor_id", models.BigIntegerField(blank=True, null=True)),
                ("pace_tat", models.DateTimeField(blank=True, null=True)),
                ("lease_token", models.CharField(blank=True, default="", max_length=32)),
                ("worker", models.CharField(blank=True, default="", max_length=200)),
                ("attempts", models.PositiveIntegerField(default=0)),
                ("sent_at", models.DateTimeField(blank=True, null=True)),
            ],
        ),
        migrations.CreateModel(
            name="Destination",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("source", models.CharField(max_length=100, verbose_name="source")),
                ("container_id", models.CharField(max_length=255, verbose_name="container id")),
                (
                    "workspace_id",
                    models.CharField(blank=True, default="", max_length=255, verbose_name="workspace id"),
                ),
                ("secrets", models.TextField(verbose_name="secrets")),
                (
                    "created_at",
                    models.DateTimeField(default=django.utils.timezone.now, verbose_name="created at"),
                ),
                (
                    "updated_at",
                    models.DateTimeField(default=django.utils.timezone.now, verbose_name="updated at"),
                ),
            ],
            options={
                "verbose_name": "destination",
                "verbose_name_plural": "destinations",
                "constraints": [
                    models.UniqueConstraint(
                        fields=("source", "container_id"), name="connector_outbox_destination_place"
                    )
                ],
            },
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
                ("source", models.CharField(max_length=100, verbose_name="source")),
                (
                    "scope",
                    models.CharField(
                        choices=[
                            ("container", "Container"),
                            ("workspace", "Workspace"),
                            ("source", "Source"),
                        ],
                        max_length=16,
                        verbose_name="scope",
                    ),
                ),
                (
                    "workspace_id",
                    models.CharField(blank=True, default="", max_length=255, verbose_name="workspace id"),
                ),
                (
                    "container_id",
                    models.CharField(blank=True, default="", max_length=255, verbose_name="container id"),
                ),
                ("held_until", models.DateTimeField(blank=True, null=True, verbose_name="held until")),
                ("hold_reason", models.TextField(blank=True, default="", verbose_name="hold reason")),
                ("pace_tat", models.DateTimeField(blank=True, null=True, verbose_name="pace tat")),
                (
                    "updated_at",
                    models.DateTimeField(default=django.utils.timezone.now, verbose_name="updated at"),
                ),
            ],
            options={
                "verbose_name": "gate",
                "verbose_name_plural": "gates",
                "constraints": [
                    models.UniqueConstraint(
                        fields=("source", "scope", "workspace_id", "container_id"),
                        name="connector_outbox_gate_place",
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
                ("source", models.CharField(max_length=100, verbose_name="source")),
                ("workspace_id", models.CharField(max_length=255, verbose_name="workspace id")),
                (
                    "enterprise_id",
                    models.CharField(blank=True, default="", max_length=255, verbose_name="enterprise id"),
                ),
                (
                    "is_enterprise_install",
                    models.BooleanField(default=False, verbose_name="is enterprise install"),
                ),
                (
                    "team_name",
                    models.CharField(blank=True, default="", max_length=255, verbose_name="team name"),
                ),
                (
                    "enterprise_name",
                    models.CharField(blank=True, default="", max_length=255, verbose_name="enterprise name"),
                ),
                ("app_id", models.CharField(blank=True, default="", max_length=255, verbose_name="app id")),
                ("bot_id", models.CharField(blank=True, default="", max_length=255, verbose_name="bot id")),
                (
                    "bot_user_id",
                    models.CharField(blank=True, default="", max_length=255, verbose_name="bot user id"),
                ),
                ("bot_scopes", models.TextField(blank=True, default="", verbose_name="bot scopes")),
                (
                    "installer_user_id",
                    models.CharField(
                        blank=True, default="", max_length=255, verbose_name="installer user id"
                    ),
                ),
                ("user_scopes", models.TextField(blank=True, default="", verbose_name="user scopes")),
                (
                    "token_type",
                    models.CharField(blank=True, default="", max_length=32, verbose_name="token type"),
                ),
                ("secrets", models.TextField(blank=True, default="", verbose_name="secrets")),
                (
                    "token_issued_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="token issued at"),
                ),
                (
                    "token_expires_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="token expires at"),
                ),
                (
                    "extra",
                    models.JSONField(
                        blank=True,
                        default=dict,
                        encoder=django.core.serializers.json.DjangoJSONEncoder,
                        verbose_name="extra",
                    ),
                ),
                (
                    "installed_at",
                    models.DateTimeField(default=django.utils.timezone.now, verbose_name="installed at"),
                ),
                (
                    "updated_at",
                    models.DateTimeField(default=django.utils.timezone.now, verbose_name="updated at"),
                ),
                ("revoked_at", models.DateTimeField(blank=True, null=True, verbose_name="revoked at")),
                ("revoked_reason", models.TextField(blank=True, default="", verbose_name="revoked reason")),
                ("refresh_error", models.TextField(blank=True, default="", verbose_name="refresh error")),
            ],
            options={
                "verbose_name": "installation",
                "verbose_name_plural": "installations",
                "constraints": [
                    models.UniqueConstraint(
                        fields=("source", "workspace_id"), name="connector_outbox_installation_place"
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="OAuthState",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("state", models.CharField(max_length=64)),
                ("source", models.CharField(max_length=100)),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                ("expires_at", models.DateTimeField()),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(fields=("state",), name="connector_outbox_oauth_state")
                ],
            },
        ),
        migrations.CreateModel(
            name="Post",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("source", models.CharField(max_length=100, verbose_name="source")),
                ("post_id", models.CharField(max_length=255, verbose_name="post id")),
                ("workspace_id", models.CharField(max_length=255, verbose_name="workspace id")),
                ("container_id", models.CharField(max_length=255, verbose_name="container id")),
                (
                    "thread_id",
                    models.CharField(blank=True, default="", max_length=255, verbose_name="thread id"),
                ),
                (
                    "thread_of",
                    models.CharField(blank=True, max_length=255, null=True, verbose_name="thread of"),
                ),
                (
                    "kind",
                    models.CharField(
                        choices=[
                            ("message", "Message"),
                            ("status", "Status"),
                            ("reaction", "Reaction"),
                            ("ephemeral", "Ephemeral"),
                            ("delete", "Delete"),
                        ],
                        default="message",
                        max_length=16,
                        verbose_name="kind",
                    ),
                ),
                (
                    "body",
                    models.JSONField(
                        blank=True,
                        encoder=django.core.serializers.json.DjangoJSONEncoder,
                        null=True,
                        verbose_name="body",
                    ),
                ),
                ("rev", models.PositiveIntegerField(default=0, verbose_name="rev")),
                (
                    "turn_key",
                    models.CharField(blank=True, max_length=255, null=True, verbose_name="turn key"),
                ),
                (
                    "state",
                    models.CharField(
                        choices=[
                            ("queued", "Queued"),
                            ("sending", "Sending"),
                            ("posted", "Posted"),
                            ("failed", "Failed"),
                            ("uncertain", "Uncertain"),
                            ("cancelled", "Cancelled"),
                        ],
                        default="queued",
                        max_length=16,
                        verbose_name="state",
                    ),
                ),
                ("attempts", models.PositiveIntegerField(default=0, verbose_name="attempts")),
                (
                    "delivered_attempt",
                    models.PositiveIntegerField(db_default=0, default=0, verbose_name="delivered attempt"),
                ),
                ("queued_at", models.DateTimeField(verbose_name="queued at")),
                ("next_at", models.DateTimeField(verbose_name="next at")),
                (
                    "created_at",
                    models.DateTimeField(default=django.utils.timezone.now, verbose_name="created at"),
                ),
                ("updated_at", models.DateTimeField(verbose_name="updated at")),
                (
                    "message_ref",
                    models.CharField(blank=True, max_length=255, null=True, verbose_name="message ref"),
                ),
                ("last_error", models.TextField(blank=True, default="", verbose_name="last error")),
                (
                    "lane",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="posts",
                        to="django_connector_outbox.lane",
                        verbose_name="lane",
                    ),
                ),
            ],
            options={
                "verbose_name": "post",
                "verbose_name_plural": "posts",
                "permissions": [
                    ("cancel_post", "Can cancel queued posts"),
                    ("retry_post", "Can retry failed and uncertain posts"),
                ],
            },
        ),
        migrations.AddField(
            model_name="lane",
            name="head",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.DO_NOTHING,
                related_name="+",
                to="django_connector_outbox.post",
            ),
        ),
        migrations.CreateModel(
            name="Attempt",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("at", models.DateTimeField(verbose_name="at")),
                ("attempt", models.PositiveIntegerField(verbose_name="attempt")),
                (
                    "outcome",
                    models.CharField(
                        choices=[
                            ("retried", "retried"),
                            ("held", "held"),
                            ("failed", "failed"),
                            ("uncertain", "uncertain"),
                            ("lost_reply", "lost reply"),
                        ],
                        max_length=16,
                        verbose_name="outcome",
                    ),
                ),
                ("reason", models.TextField(blank=True, default="", verbose_name="reason")),
                ("worker", models.CharField(blank=True, default="", max_length=200, verbose_name="worker")),
                (
                    "post",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="history",
                        to="django_connector_outbox.post",
                        verbose_name="post",
                    ),
                ),
            ],
            options={
                "verbose_name": "attempt",
                "verbose_name_plural": "attempts",
            },
        ),
        migrations.AddIndex(
            model_name="post",
            index=models.Index(
                fields=["lane", "state", "queued_at", "id"], name="connector_outbox_post_order"
            ),
        ),
        migrations.AddIndex(
            model_name="post",
            index=models.Index(fields=["state", "updated_at"], name="connector_outbox_post_state"),
        ),
        migrations.AddIndex(
            model_name="post",
            index=models.Index(fields=["source", "state", "queued_at"], name="connector_outbox_post_queue"),
        ),
        migrations.AddIndex(
            model_name="post",
            index=models.Index(fields=["source", "turn_key"], name="connector_outbox_post_turn"),
        ),
        migrations.AddIndex(
            model_name="post",
            index=models.Index(fields=["updated_at", "id"], name="connector_outbox_post_updated"),
        ),
        migrations.AddConstraint(
            model_name="post",
            constraint=models.UniqueConstraint(
                fields=("source", "post_id"), name="connector_outbox_post_source_post_id"
            ),
        ),
        migrations.AddIndex(
            model_name="lane",
            index=models.Index(fields=["source", "due_at", "head"], name="connector_outbox_lane_due"),
        ),
        migrations.AddConstraint(
            model_name="lane",
            constraint=models.UniqueConstraint(
                fields=("source", "workspace_id", "container_id"), name="connector_outbox_lane_place"
            ),
        ),
        migrations.AddIndex(
            model_name="attempt",
            index=models.Index(fields=["at"], name="connector_outbox_attempt_at"),
        ),
        migrations.RunPython(exact_ids_on_mysql, migrations.RunPython.noop, atomic=False, elidable=False),
        migrations.RunPython(waiting_index, migrations.RunPython.noop, elidable=False),
    ]
