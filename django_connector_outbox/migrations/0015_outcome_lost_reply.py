# One outcome vocabulary (issue 22, posts.Outcome): the history's outcome takes its choices from
# it, and the rows written as "lost" are renamed "lost_reply", the one spelling of that outcome
# (back to "lost" when unapplied). The words are written out here, never read from posts.Outcome:
# a migration keeps the values of its day.

from typing import Any

from django.db import migrations, models

RENAMED = ("lost", "lost_reply")  # (before, after)


def rename(apps: Any, schema_editor: Any, before: str, after: str) -> None:
    Attempt = apps.get_model("django_connector_outbox", "Attempt")
    Attempt.objects.using(schema_editor.connection.alias).filter(outcome=before).update(outcome=after)


def forwards(apps: Any, schema_editor: Any) -> None:
    rename(apps, schema_editor, *RENAMED)


def backwards(apps: Any, schema_editor: Any) -> None:
    rename(apps, schema_editor, *reversed(RENAMED))


class Migration(migrations.Migration):
    dependencies = [
        ("django_connector_outbox", "0014_verbose_names"),
    ]

    operations = [
        migrations.RunPython(forwards, backwards),
        migrations.AlterField(
            model_name="attempt",
            name="outcome",
            field=models.CharField(
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
    ]
