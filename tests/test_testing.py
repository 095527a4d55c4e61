"""django_connector_outbox.testing and its pytest fixtures, as a project's tests use them."""

from __future__ import annotations

import subprocess
import sys
import threading
import tomllib
from datetime import UTC, datetime, timedelta
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from django.conf import settings
from django.test import TestCase, override_settings

from django_connector_outbox import Outbox, signals
from django_connector_outbox.connectors import connectors
from django_connector_outbox.connectors.memory import MemoryConnector
from django_connector_outbox.connectors.slack import SlackConnector
from django_connector_outbox.connectors.webhook import WebhookConnector
from django_connector_outbox.fakes.webhook import FakeWebhook
from django_connector_outbox.sender import Sender
from django_connector_outbox.testing import (
    DeliveredPost,
    TestClock,
    deliver_due,
    memory_connectors,
    queued,
)

ROOT = Path(__file__).resolve().parent.parent
SLACK = {"BACKEND": "django_connector_outbox.connectors.slack.SlackConnector", "OPTIONS": {"token": "xoxb-1"}}
PLACE = {"workspace_id": "T1", "container_id": "C1"}


def texts(posts):
    return [p.body["text"] for p in posts]


# -- deliver_due --------------------------------------------------------------------------------


def test_deliver_due_returns_what_each_source_received_in_order(db):
    Outbox("memory").queue("m1", **PLACE, body={"text": "one"})
    Outbox("other").queue("o1", **PLACE, body={"text": "elsewhere"})
    Outbox("memory").queue("m2", **PLACE, body={"text": "two"})

    delivered = deliver_due()

    assert texts(delivered["memory"]) == ["one", "two"]
    assert delivered["other"] == [
        DeliveredPost("other", "o1", "message", "T1", "C1", "", {"text": "elsewhere"}, "C1:1")
    ]
    assert delivered["nobody"] == []
    assert texts(connectors["memory"].messages("C1")) == ["one", "two"]
    assert Outbox("memory").find("m2").state == "posted"
    assert deliver_due() == {}  # nothing is due any more


def test_deliver_due_serves_only_the_sources_it_is_given(db):
    Outbox("memory").queue("m1", **PLACE, body={"text": "one"})
    Outbox("other").queue("o1", **PLACE, body={"text": "elsewhere"})

    assert list(deliver_due("other")) == ["other"]
    assert [p.post_id for p in queued()] == ["m1"]


def test_deliver_due_delivers_only_what_is_due_on_its_clock(db):
    clock = TestClock()
    Outbox("memory").queue("later", **PLACE, body={"text": "in an hour"}, delay=3600)

    assert deliver_due(clock=clock) == {}
    clock.advance(timedelta(hours=1, seconds=1))
    assert texts(deliver_due(clock=clock)["memory"]) == ["in an hour"]


def test_deliver_due_goes_through_the_outbox_retries_and_lost_replies(db, outbox_memory, outbox_clock):
    platform = outbox_memory["memory"]
    platform.fail_next("boom")
    Outbox("memory").queue("p1", **PLACE, body={"text": "hi"})

    assert deliver_due(clock=outbox_clock) == {}
    [waiting] = queued()
    assert (waiting.post_id, waiting.attempts, waiting.last_error) == ("p1", 1, "boom")

    outbox_clock.advance(61)  # past RETRY_MAX
    platform.lose_next_reply()
    assert deliver_due(clock=outbox_clock) == {}  # stored by the platform, reply lost
    assert queued() == []  # still sending: it is looked up once its lease ends

    outbox_clock.advance(121)  # past LEASE
    [found] = deliver_due(clock=outbox_clock)["memory"]
    assert found.post_id == "p1" and found.message_ref == "C1:1"
    assert texts(platform.messages("C1")) == ["hi"]  # looked up, not sent twice
    assert len(platform.sent) == 2


def test_deliver_due_uses_whatever_connector_is_configured(db):
    with FakeWebhook.running() as receiver:
        hooks = {"BACKEND": "django_connector_outbox.connectors.webhook.WebhookConnector", "OPTIONS": {}}
        hooks["OPTIONS"]["url"] = receiver.url
        with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"hooks": hooks}}):
            assert isinstance(connectors["hooks"], WebhookConnector)
            Outbox("hooks").queue("h1", **PLACE, body={"event": "order.placed"})

            [delivered] = deliver_due()["hooks"]

    assert delivered.post_id == "h1"
    assert [d.body for d in receiver.deliveries] == [{"event": "order.placed"}]
    assert delivered.message_ref == receiver.deliveries[0].id


def test_deliver_due_reports_only_the_deliveries_of_its_own_sender(db):
    def echo(*, claim, **kwargs):
        if threading.current_thread() is threading.main_thread():  # a sender elsewhere posts too
            kwargs = {"sender": Sender, "claim": claim, "message_ref": "elsewhere"}
            elsewhere = threading.Thread(target=signals.post_posted.send, kwargs=kwargs)
            elsewhere.start()
            elsewhere.join()

    signals.post_posted.connect(echo, sender=Sender, weak=False, dispatch_uid="echo")
    try:
        Outbox("memory").queue("m1", **PLACE, body={"text": "one"})
        [delivered] = deliver_due()["memory"]
    finally:
        signals.post_posted.disconnect(sender=Sender, dispatch_uid="echo")
    assert delivered.message_ref == "C1:1"


# -- queued ------------------------------------------------------------------------------------


def test_queued_lists_waiting_posts_in_queue_order_without_sending(db):
    clock = TestClock(datetime(2026, 1, 1, tzinfo=UTC), tick=False)
    Outbox("memory", clock=clock).queue("b", **PLACE, body={"text": "first"})
    clock.advance(1)
    Outbox("other", clock=clock).queue("a", workspace_id="T1", container_id="C2", body={"text": "second"})
    Outbox("memory", clock=clock).queue("c", **PLACE, kind="reaction", body={"name": "eyes"}, delay=60)

    posts = queued()

    assert [(p.source, p.post_id, p.kind) for p in posts] == [
        ("memory", "b", "message"),
        ("other", "a", "message"),
        ("memory", "c", "reaction"),
    ]
    assert posts[2].due_at == datetime(2026, 1, 1, 0, 1, 1, tzinfo=UTC)
    assert [p.post_id for p in queued("other")] == ["a"]
    assert connectors["memory"].sent == []


def test_queued_leaves_out_what_is_delivered_or_cancelled(db):
    outbox = Outbox("memory")
    outbox.queue("sent", **PLACE, body={"text": "x"})
    deliver_due()
    outbox.queue("cancelled", **PLACE, body={"text": "y"})
    outbox.cancel_queued("cancelled")
    outbox.queue("waiting", **PLACE, body={"text": "z"})

    assert [p.post_id for p in queued()] == ["waiting"]


# -- TestClock ---------------------------------------------------------------------------------


def test_a_test_clock_ticks_from_now_and_moves_forward():
    before = datetime.now(UTC)
    clock = TestClock()
    clock.advance(3600)
    assert before + timedelta(hours=1) <= clock() <= datetime.now(UTC) + timedelta(hours=1)
    first = clock()
    assert clock() >= first


def test_a_frozen_test_clock_moves_only_when_told():
    start = datetime(2026, 5, 1, 9, 0, tzinfo=UTC)
    clock = TestClock(start, tick=False)
    assert clock() == start
    clock.advance(timedelta(minutes=5))
    assert clock() == start + timedelta(minutes=5)
    clock.move_to(start)
    assert clock() == start


def test_a_test_clock_refuses_a_naive_datetime():
    with pytest.raises(ValueError, match="aware datetime"):
        TestClock(datetime(2026, 1, 1))


# -- memory_connectors -------------------------------------------------------------------------


@override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"slack": {**SLACK, "PACE": {}}}, "LEASE": 30})
def test_memory_connectors_swaps_the_configured_connectors_and_restores_them():
    assert isinstance(connectors["slack"], SlackConnector)

    with memory_connectors() as platforms:
        assert isinstance(platforms["slack"], MemoryConnector)
        assert platforms["slack"] is connectors["slack"]
        assert settings.CONNECTOR_OUTBOX == {
            "CONNECTORS": {
                "slack": {
                    "PACE": {},
                    "BACKEND": "django_connector_outbox.connectors.memory.MemoryConnector",
                    # What the outbox reads of Slack's connector: its kinds, timeout, lookup
                    # pages, and (from its class, with its OPTIONS) its limits for a Message.
                    "OPTIONS": {
                        "kinds": ["delete", "ephemeral", "message", "reaction", "status"],
                        "timeout": 10.0,
                        "lookup_requests": 5,
                        "messages_like": SLACK,
                    },
                }
            },
            "LEASE": 30,
        }

    assert isinstance(connectors["slack"], SlackConnector)


def test_memory_connectors_adds_a_named_source_and_leaves_the_others():
    with memory_connectors("discord") as platforms:
        assert list(platforms) == ["discord"]
        assert sorted(settings.CONNECTOR_OUTBOX["CONNECTORS"]) == ["discord", "memory", "other"]
    assert "discord" not in settings.CONNECTOR_OUTBOX["CONNECTORS"]


def test_memory_connectors_starts_empty_each_time(db):
    with memory_connectors("memory") as platforms:
        Outbox("memory").queue("p1", **PLACE, body={"text": "x"})
        deliver_due()
        assert len(platforms["memory"].sent) == 1
    with memory_connectors("memory") as platforms:
        assert platforms["memory"].sent == []


@override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"slack": SLACK}})
@memory_connectors()
def test_memory_connectors_decorates_a_test_function():
    assert isinstance(connectors["slack"], MemoryConnector)


@override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"slack": SLACK}})
def test_memory_connectors_hands_a_decorated_function_its_connectors():
    @memory_connectors(kwarg_name="platforms")
    def platform(platforms):
        return platforms["slack"]

    assert isinstance(platform(), MemoryConnector)
    assert isinstance(connectors["slack"], SlackConnector)


@override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"slack": SLACK}})
@memory_connectors("slack", attr_name="platforms")
class MemoryConnectorsOnATestCase(TestCase):
    def test_the_test_case_gets_memory_connectors(self):
        Outbox("slack").queue("p1", **PLACE, body={"text": "from a TestCase"})
        [delivered] = deliver_due()["slack"]
        assert delivered.body == {"text": "from a TestCase"}
        assert texts(self.platforms["slack"].messages("C1")) == ["from a TestCase"]


# -- the pytest plugin -------------------------------------------------------------------------


def test_the_deliver_fixture_runs_on_the_clock_fixture(db, outbox_deliver, outbox_clock):
    Outbox("memory").queue("p1", **PLACE, body={"text": "later"}, delay=600)
    assert outbox_deliver() == {}
    outbox_clock.advance(601)
    assert texts(outbox_deliver()["memory"]) == ["later"]


@pytest.fixture
def slack_configured(settings):
    settings.CONNECTOR_OUTBOX = {"CONNECTORS": {"slack": SLACK}}


def test_the_memory_fixture_swaps_every_configured_source(slack_configured, outbox_memory):
    assert list(outbox_memory) == ["slack"]
    assert isinstance(connectors["slack"], MemoryConnector)


PROJECT_TESTS = """
from django_connector_outbox.connectors import connectors


def test_a_project_test_gets_the_fixtures(outbox_memory, outbox_clock, outbox_deliver):
    assert outbox_memory["memory"] is connectors["memory"]


def test_a_test_leaves_something_in_a_connector():
    connectors["memory"].reactions.append({"name": "eyes"})


def test_the_next_test_starts_with_empty_connectors():
    assert connectors["memory"].reactions == []
"""


def test_a_project_loading_the_plugin_gets_its_fixtures_and_fresh_connectors(tmp_path):
    (tmp_path / "test_project.py").write_text(PROJECT_TESTS)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "tests.settings"}
    # Installed (tox), the plugin comes through its entry point; from a checkout, with -p.
    installed = bool(entry_points(group="pytest11", name="django_connector_outbox"))
    plugin = [] if installed else ["-p", "django_connector_outbox.pytest_plugin"]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", *plugin, "-p", "no:cacheprovider", "-q", "test_project.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "3 passed" in run.stdout


def test_the_plugin_is_registered_through_a_pytest11_entry_point():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["pytest11"] == {
        "django_connector_outbox": "django_connector_outbox.pytest_plugin"
    }


def test_the_plugin_imports_without_a_django_project():
    # pytest loads it in every run where the package is installed, Django configured or not.
    code = (
        "import sys, django_connector_outbox.pytest_plugin\n"
        "from django.conf import settings\n"
        "assert not settings.configured\n"
        "assert 'django_connector_outbox.testing' not in sys.modules\n"
    )
    env = {"PATH": "/usr/bin:/bin"}
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True)
