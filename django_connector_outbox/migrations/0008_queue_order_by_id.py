"""A container's posts go by (queued_at, id), not (queued_at, post_id) (models.QUEUE_ORDER).

The posts of one `queue_many` batch share their queued_at, and they went by post id: a batch
of p-0 .. p-39 was sent p-0, p-1, p-10, ... The id is the insertion sequence, so the index
of the next head ends in it, and a lane's floor names a post by its id.

The new index is made before the old one goes: on MySQL the lane foreign key needs an index
that starts with it at every moment (else Django adds one of its own, which a fresh install
would not have). Floors are forgotten (null: unknown, allowed at any time); the next finish
of each lane sets its floor again.
"""

from typing import Any

from django.db import migrations, models


def forget_floors(apps: Any, schema_editor: Any) -> None:
    Lane = apps.get_model("django_connector_outbox", "Lane")
    Lane.objects.using(schema_editor.connection.alias).update(floor_queued_at=None)


class Migration(migrations.Migration):
    dependencies = [
        ("django_connector_outbox", "0007_lease_on_lane"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="post",
            index=models.Index(
                fields=["lane", "state", "queued_at", "id"], name="connector_outbox_post_order"
            ),
        ),
        migrations.RemoveIndex(model_name="post", name="connector_outbox_post_lane"),
        migrations.AddField(
            model_name="lane", name="floor_id", field=models.BigIntegerField(blank=True, null=True)
        ),
        migrations.RemoveField(model_name="lane", name="floor_post_id"),
        migrations.RunPython(forget_floors, forget_floors, elidable=True),
    ]
