"""The PostgreSQL hot paths (postgres.py) under what only PostgreSQL can do to them.

Two real connections race on one lane, and a connection is dropped under an Outbox. These
tests run against PostgreSQL only: elsewhere those paths are the ORM's.
"""

from __future__ import annotations

import pytest
from django.db import DatabaseError, InterfaceError, OperationalError, connection, connections

from django_connector_outbox import Outbox
from django_connector_outbox.posts import Finish

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql",
        reason="the raw-SQL paths run on PostgreSQL only; run with DATABASE_URL pointing at PostgreSQL",
    ),
]


@pytest.fixture
def outbox(clock):
    yield Outbox("memory", clock=clock)
    connection.close()  # it may have been dropped: the next user reconnects


def queue(outbox, post_id, container_id="C1", **fields):
    return outbox.queue(post_id, workspace_id="T1", container_id=container_id, body={"n": post_id}, **fields)


def drop_connection() -> None:
    """Terminate the server backend of this test's own connection, and wait until it is gone."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        [pid] = cursor.fetchone()
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity "
                "WHERE pid = %s AND datname = current_database()",
                [pid],
            )
            assert cursor.fetchone() == (True,)
    finally:
        other.close()


# -- a dropped connection -----------------------------------------------------------------------


def claim_then_finish(outbox):
    [claim] = outbox.claim()
    drop_connection()
    outbox.finish_many([(claim, Finish(claim.post_id, claim.lease_token, "posted"))])


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda outbox: (drop_connection(), outbox.claim()), id="claim"),
        pytest.param(lambda outbox: (drop_connection(), queue(outbox, "p2")), id="queue"),
        pytest.param(claim_then_finish, id="finish_many"),
    ],
)
def test_a_dropped_connection_raises_djangos_database_error(outbox, call):
    queue(outbox, "p1")
    with pytest.raises(DatabaseError) as raised:
        call(outbox)
    assert isinstance(raised.value, OperationalError | InterfaceError)
