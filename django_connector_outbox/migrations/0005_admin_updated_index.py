"""The admin's own index: posts by (updated_at, id), for its list of all states (models.Post).

The changelist shows the newest change first. Per state, (state, updated_at) serves that order;
over all states nothing did, and PostgreSQL read and sorted the whole table for each page (0.5 s
at a million posts, bench/admin_changelist.py). With it the page is an index range of 50 entries,
and the updated_at range filter one range. It costs one index entry per post write (every write
of a post changes updated_at), which is why it is the only index the admin has.

Building it blocks writes to the post table for a few seconds per million posts. On a large
PostgreSQL table, build it first without blocking, then record the migration as applied:
`CREATE INDEX CONCURRENTLY connector_outbox_post_updated ON django_connector_outbox_post
(updated_at, id)`, then `manage.py migrate django_connector_outbox 0005 --fake`.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_connector_outbox", "0004_gates"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="post",
            index=models.Index(fields=["updated_at", "id"], name="connector_outbox_post_updated"),
        ),
    ]
