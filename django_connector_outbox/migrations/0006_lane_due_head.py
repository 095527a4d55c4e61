"""The claim's index gains the lane's head: due lanes are read by (due_at, head_id).

Lanes due at the same instant (the posts of one `queue_many` batch share their queue time)
were read in whatever order the index kept its equal keys, so some channels of a burst drained
before the others, and the last seconds of a paced drain went at one channel's pace. With the
head in the index they take turns, the head queued first first, in the same single range scan.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_connector_outbox", "0005_admin_updated_index"),
    ]

    operations = [
        migrations.RemoveIndex(model_name="lane", name="connector_outbox_lane_due"),
        migrations.AddIndex(
            model_name="lane",
            index=models.Index(fields=["source", "due_at", "head"], name="connector_outbox_lane_due"),
        ),
    ]
