"""A database without the outbox's tables is a deployment error: the commands say "run migrate".

`run_outbox` used to retry such a database for ever, `--once` too ("database unavailable,
retrying in 5.0s ... no such table" on SQLite), and `outbox_status` printed a traceback. The
commands run in a subprocess against a database of this test's server that has no table at all
(SQLite: a new file).
"""

from __future__ import annotations

import pytest
from django.db import OperationalError, ProgrammingError, connection

from django_connector_outbox import Outbox
from django_connector_outbox.health import NotMigrated
from django_connector_outbox.sender import Sender
from tests.harness import manage

SAYS = (
    "CommandError: database 'default' has no table django_connector_outbox_attempt, "
    "django_connector_outbox_destination, django_connector_outbox_gate, django_connector_outbox_heartbeat, "
    "django_connector_outbox_installation, django_connector_outbox_lane, django_connector_outbox_oauthstate, "
    "django_connector_outbox_post: the app django_connector_outbox is not migrated there; run `manage.py migrate`"
)


@pytest.fixture
def unmigrated(tmp_path):
    """The name of a database without any table, on this test's database server."""
    if connection.vendor == "sqlite":
        yield str(tmp_path / "empty.sqlite3")
        return
    name = connection.ops.quote_name(f"{connection.settings_dict['NAME']}_unmigrated")
    with connection.cursor() as cursor:
        cursor.execute(f"DROP DATABASE IF EXISTS {name}")
        cursor.execute(f"CREATE DATABASE {name}")
    yield name.strip('`"')
    with connection.cursor() as cursor:
        cursor.execute(f"DROP DATABASE IF EXISTS {name}")


# transaction=True: CREATE DATABASE cannot run in a transaction.
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "args",
    [
        ["run_outbox", "--once"],
        ["run_outbox"],  # not only --once: a sender that would wait for ever
        ["outbox_status"],
        ["outbox_prune"],
        ["outbox_cancel", "--all"],
        ["outbox_retry", "--all"],
    ],
    ids=" ".join,
)
def test_a_command_on_a_database_never_migrated_says_run_migrate_and_exits_1(unmigrated, args):
    done = manage(unmigrated, *args)
    stderr = done.stderr.decode()
    assert done.returncode == 1, stderr
    assert stderr.strip().splitlines()[-1] == SAYS
    assert "Traceback" not in stderr
    assert "retrying" not in stderr


@pytest.mark.django_db
@pytest.mark.parametrize(
    "error",
    [
        OperationalError("no such table: django_connector_outbox_lane"),  # SQLite
        ProgrammingError('relation "django_connector_outbox_lane" does not exist'),  # PostgreSQL, MySQL
    ],
    ids=["operational", "programming"],
)
def test_a_database_that_answers_without_the_tables_mid_run_stops_the_sender(clock, monkeypatch, error):
    # The database was away when the sender started (nothing to check then), and came back
    # without the tables: the failing claim makes the sender look, and stop.
    def claim(*args, **kwargs):
        raise error

    sender = Sender(["memory"], once=True, clock=clock)
    monkeypatch.setattr(Outbox, "claim", claim)
    monkeypatch.setattr(Outbox, "finish_and_claim", claim)  # a turn's claim
    monkeypatch.setattr(
        "django_connector_outbox.sender.missing_tables", lambda using: ["django_connector_outbox_lane"]
    )
    with pytest.raises(NotMigrated, match="run `manage.py migrate`"):
        sender.turn()
