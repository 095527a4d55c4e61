"""The lease moves from the post to its lane: a claim writes the lane only.

A delivered post used to be written twice (claimed, then finished), each a non-HOT update of
a row with six indexes; now the claim is kept where it is made, on the lane that already
changed with it, and the post is written once, when it is finished. A post is `sending` while
its lane holds a lease on it; its own state column says `queued` (models.py).

Posts that are `sending` when this runs hand their lease to their lane, and go back the same
way when it is unapplied.
"""

from typing import Any

from django.db import migrations, models


def leases_to_lanes(apps: Any, schema_editor: Any) -> None:
    Post = apps.get_model("django_connector_outbox", "Post")
    Lane = apps.get_model("django_connector_outbox", "Lane")
    db = schema_editor.connection.alias
    for post in Post.objects.using(db).filter(state="sending").iterator():
        Lane.objects.using(db).filter(pk=post.lane_id).update(
            head_id=post.pk, due_at=post.lease_until, lease_token=post.lease_token or "migrated",
            worker=post.worker, attempts=post.attempts, sent_at=post.sent_at,
        )  # fmt: skip
        Post.objects.using(db).filter(pk=post.pk).update(state="queued", attempts=max(post.attempts - 1, 0))


def leases_to_posts(apps: Any, schema_editor: Any) -> None:
    Post = apps.get_model("django_connector_outbox", "Post")
    Lane = apps.get_model("django_connector_outbox", "Lane")
    db = schema_editor.connection.alias
    for lane in Lane.objects.using(db).exclude(lease_token="").filter(head__isnull=False).iterator():
        Post.objects.using(db).filter(pk=lane.head_id).update(
            state="sending", lease_token=lane.lease_token, lease_until=lane.due_at, worker=lane.worker,
            attempts=lane.attempts, sent_at=lane.sent_at,
        )  # fmt: skip


class Migration(migrations.Migration):
    dependencies = [
        ("django_connector_outbox", "0006_lane_due_head"),
    ]

    operations = [
        migrations.AddField(
            model_name="lane",
            name="lease_token",
            field=models.CharField(blank=True, default="", max_length=32),
        ),
        migrations.AddField(
            model_name="lane",
            name="worker",
            field=models.CharField(blank=True, default="", max_length=200),
        ),
        migrations.AddField(
            model_name="lane",
            name="attempts",
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="lane",
            name="sent_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.RunPython(leases_to_lanes, leases_to_posts, elidable=True),
        migrations.RemoveField(model_name="post", name="lease_token"),
        migrations.RemoveField(model_name="post", name="lease_until"),
        migrations.RemoveField(model_name="post", name="sent_at"),
        migrations.RemoveField(model_name="post", name="worker"),
    ]
