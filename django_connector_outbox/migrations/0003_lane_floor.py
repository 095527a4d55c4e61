"""A lane's floor: where PostgreSQL's finish starts looking for the next head (models.Lane).

Null means unknown (look from the start), so existing lanes need no data migration: the next
finish of each sets its floor.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_connector_outbox", "0002_exact_ids_on_mysql"),
    ]

    operations = [
        migrations.AddField(
            model_name="lane",
            name="floor_post_id",
            field=models.CharField(blank=True, max_length=255, null=True),
        ),
        migrations.AddField(
            model_name="lane",
            name="floor_queued_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
