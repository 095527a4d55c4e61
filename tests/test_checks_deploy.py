"""DELIVERY (E013) and what ``check --deploy`` warns of (W003-W005), by exact equality."""

from __future__ import annotations

import io

import pytest
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from django_connector_outbox.conf import conf
from django_connector_outbox.connectors.memory import MemoryConnector

MEMORY = {"BACKEND": "django_connector_outbox.connectors.memory.MemoryConnector"}
CONSOLE = {"BACKEND": "django_connector_outbox.connectors.console.ConsoleConnector"}
SLACK = {"BACKEND": "django_connector_outbox.connectors.slack.SlackConnector", "OPTIONS": {"token": "xoxb-1"}}


def webhook(**options):
    return {"BACKEND": "django_connector_outbox.connectors.webhook.WebhookConnector", "OPTIONS": options}


class MyMemory(MemoryConnector):
    """A project's own connector built on the memory one."""


def outbox_checks(*, deploy: bool) -> list[checks.CheckMessage]:
    messages = checks.run_checks(include_deployment_checks=deploy, databases=[])
    return [m for m in messages if (m.id or "").startswith("connector_outbox.")]


W003 = checks.Warning(
    "CONNECTOR_OUTBOX['DELIVERY'] is \"immediate\": each post is delivered by the process that commits it, "
    "and a retried post waits for the next commit.",
    hint='It is for development. In production leave DELIVERY at "sender" and run manage.py run_outbox.',
    id="connector_outbox.W003",
)


def w004(source: str, name: str) -> checks.Warning:
    return checks.Warning(
        f"CONNECTOR_OUTBOX source {source!r} uses the {name} connector: its posts never reach a chat platform.",
        hint="It is for development and tests; give the source a platform's connector in production.",
        id="connector_outbox.W004",
    )


def w005(source: str, what: str) -> checks.Warning:
    return checks.Warning(
        f"CONNECTOR_OUTBOX source {source!r}: the webhook's {what} plain http://: posts, signatures and "
        "answers travel unencrypted.",
        hint="Use an https:// URL.",
        id="connector_outbox.W005",
    )


@pytest.mark.parametrize("value", ["eager", "", None, 1, "IMMEDIATE"])
def test_a_bad_delivery_is_e013_and_refused_at_run_time(value):
    message = f'CONNECTOR_OUTBOX[\'DELIVERY\'] must be "sender" or "immediate", not {value!r}.'
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"chat": SLACK}, "DELIVERY": value}):
        assert outbox_checks(deploy=False) == [checks.Error(message, id="connector_outbox.E013")]
        with pytest.raises(ImproperlyConfigured) as raised:
            conf.DELIVERY  # noqa: B018
        assert str(raised.value) == message


def test_a_production_configuration_has_no_deploy_warnings():
    sources = {
        "slack": SLACK,
        "hook": webhook(url="https://hooks.example.com/x", lookup_url="https://x/{post_id}"),
    }
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": sources}):
        assert outbox_checks(deploy=True) == []


def test_immediate_delivery_is_a_deploy_warning_only():
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"slack": SLACK}, "DELIVERY": "immediate"}):
        assert outbox_checks(deploy=False) == []
        assert outbox_checks(deploy=True) == [W003]


def test_memory_and_console_sources_are_deploy_warnings():
    sources = {"mem": MEMORY, "out": CONSOLE, "slack": SLACK}
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": sources}):
        assert outbox_checks(deploy=False) == []
        assert outbox_checks(deploy=True) == [w004("mem", "memory"), w004("out", "console")]


def test_a_subclass_of_the_memory_connector_is_a_deploy_warning_too():
    sources = {"mem": {"BACKEND": "tests.test_checks_deploy.MyMemory"}}
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": sources}):
        assert outbox_checks(deploy=True) == [w004("mem", "memory")]


def test_a_plain_http_webhook_is_a_deploy_warning_that_does_not_show_the_url():
    sources = {
        "a": webhook(url="http://hooks.example.com/T0K3N"),
        "b": webhook(url="http://hooks.example.com/x", lookup_url="http://x/{post_id}"),
        "c": webhook(url="https://hooks.example.com/x", lookup_url="http://x/{post_id}"),
    }
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": sources}):
        assert outbox_checks(deploy=False) == []
        warnings = outbox_checks(deploy=True)
        assert warnings == [
            w005("a", "url is"),
            w005("b", "url and lookup_url are"),
            w005("c", "lookup_url is"),
        ]
        assert "T0K3N" not in str(warnings)


def test_check_deploy_prints_the_warnings():
    out = io.StringIO()
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"mem": MEMORY}, "DELIVERY": "immediate"}):
        call_command("check", deploy=True, stdout=out, stderr=out, databases=[])
    assert "connector_outbox.W003" in out.getvalue()
    assert "connector_outbox.W004" in out.getvalue()


def test_autoreload_and_once_are_refused_together():
    with pytest.raises(CommandError) as raised:
        call_command("run_outbox", "--autoreload", "--once")
    assert str(raised.value) == "--autoreload and --once cannot be combined: --once exits when nothing is due"
