"""adeliver_due and the outbox_adeliver fixture, as a project's async tests use them.

Two shapes of async test: Django's TestCase runs an ``async def`` test on an event loop in a
thread of its own; pytest-asyncio and anyio (here anyio's plugin, which comes with httpx, the
same shape as pytest-asyncio's) run it on the thread whose connection holds the test's
transaction. The delivery must see that transaction in both, and leave no connection behind.
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from django.db import connection
from django.test import TestCase

from django_connector_outbox import Outbox
from django_connector_outbox.connectors import connectors
from django_connector_outbox.testing import adeliver_due

ROOT = Path(__file__).resolve().parent.parent
PLACE = {"workspace_id": "T1", "container_id": "C1"}


class AdeliverDueInADjangoAsyncTestCase(TestCase):
    async def test_a_post_queued_in_the_test_is_delivered(self):
        await Outbox("memory").aqueue("a1", **PLACE, body={"text": "from an async test"})

        delivered = await adeliver_due()

        assert [p.post_id for p in delivered["memory"]] == ["a1"]
        assert [m.body["text"] for m in connectors["memory"].messages("C1")] == ["from an async test"]
        assert (await Outbox("memory").afind("a1")).state == "posted"
        assert await adeliver_due() == {}


@pytest.fixture
def queued_in_the_test_transaction(db):
    # Queued by sync code on the test's connection, inside pytest-django's transaction: not
    # committed, so only that connection sees it.
    Outbox("memory").queue("p1", **PLACE, body={"text": "one"})
    Outbox("other").queue("o1", **PLACE, body={"text": "elsewhere"})
    yield
    assert not connection.allow_thread_sharing  # lent for the delivery only


@pytest.mark.anyio
async def test_the_async_fixture_delivers_what_the_test_transaction_holds(
    queued_in_the_test_transaction, outbox_adeliver
):
    delivered = await outbox_adeliver("memory")

    assert [p.post_id for p in delivered["memory"]] == ["p1"]
    assert delivered["other"] == []
    assert [m.body["text"] for m in connectors["memory"].messages("C1")] == ["one"]


@pytest.fixture
def queued_for_later(db):
    Outbox("memory").queue("later", **PLACE, body={"text": "in ten minutes"}, delay=600)


@pytest.mark.anyio
async def test_the_async_fixture_runs_on_the_clock_fixture(queued_for_later, outbox_adeliver, outbox_clock):
    assert await outbox_adeliver() == {}
    outbox_clock.advance(601)
    assert [p.post_id for p in (await outbox_adeliver())["memory"]] == ["later"]


PROJECT_TESTS = """
import pytest
from django.test import TestCase

from django_connector_outbox import Outbox
from django_connector_outbox.testing import adeliver_due

PLACE = {"workspace_id": "T1", "container_id": "C1"}


@pytest.fixture
def queued(db):
    Outbox("memory").queue("p1", **PLACE, body={"text": "hi"})


@pytest.fixture
def committed(transactional_db):
    Outbox("memory").queue("p1", **PLACE, body={"text": "hi"})


@pytest.mark.anyio
async def test_in_the_test_transaction(queued, outbox_adeliver):
    assert [p.post_id for p in (await outbox_adeliver())["memory"]] == ["p1"]


@pytest.mark.anyio
async def test_committed(committed, outbox_adeliver):
    assert [p.post_id for p in (await outbox_adeliver())["memory"]] == ["p1"]


class DjangoAsync(TestCase):
    async def test_in_a_django_test_case(self):
        await Outbox("memory").aqueue("p1", **PLACE, body={"text": "hi"})
        assert [p.post_id for p in (await adeliver_due())["memory"]] == ["p1"]
"""


@pytest.mark.slow
def test_the_test_database_is_dropped_after_async_tests_that_deliver(tmp_path, db):
    # PostgreSQL refuses to drop a database that a connection still uses ("being accessed by
    # other users"): what a connection opened by the delivery's thread and left open causes.
    (tmp_path / "test_project.py").write_text(PROJECT_TESTS)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "tests.settings"}
    if connection.vendor == "sqlite":
        env["DATABASE_URL"] = f"sqlite:///{tmp_path / 'project.sqlite3'}"
        env["SQLITE_TEST_NAME"] = str(tmp_path / "test-project.sqlite3")
    else:  # the server of this run; a test database of its own, named after this run's
        env["DATABASE_URL"] = os.environ["DATABASE_URL"]
        env["TEST_DATABASE_NAME"] = f"{connection.settings_dict['NAME']}_async"
    installed = bool(entry_points(group="pytest11", name="django_connector_outbox"))
    plugin = [] if installed else ["-p", "django_connector_outbox.pytest_plugin"]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", *plugin, "-p", "no:cacheprovider", "-q", "-W", "error", "test_project.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    assert "3 passed" in run.stdout, output
    assert "being accessed by other users" not in output
    assert "Error when trying to teardown test databases" not in output
