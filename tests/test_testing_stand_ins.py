"""The memory stand-ins of `testing.memory_connectors` refuse what the connector they replace
refuses, and time their leases alike: a test fails where production would."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_connector_outbox import InvalidPost, Message, Outbox
from django_connector_outbox.connectors import Connector
from django_connector_outbox.connectors.email import EmailConnector
from django_connector_outbox.connectors.memory import MemoryConnector
from django_connector_outbox.testing import deliver_due, memory_connectors

PLACE = {"workspace_id": "T1", "container_id": "C1"}
WEBHOOK = {
    "BACKEND": "django_connector_outbox.connectors.webhook.WebhookConnector",
    "OPTIONS": {"url": "https://hooks.example.com/x", "timeout": 3},
}
EMAIL = {
    "BACKEND": "django_connector_outbox.connectors.email.EmailConnector",
    "OPTIONS": {"from_email": "bot@example.com"},
}
SOURCES = {"CONNECTOR_OUTBOX": {"CONNECTORS": {"hook": WEBHOOK, "mail": EMAIL}}}


@override_settings(**SOURCES)
def test_a_stand_in_refuses_a_kind_its_connector_refuses(db):
    with memory_connectors("hook") as platforms:
        with pytest.raises(InvalidPost) as refused:
            Outbox("hook").queue("r1", **PLACE, kind="reaction", body={"name": "eyes", "timestamp": "1.2"})
        assert (
            str(refused.value)
            == "post 'r1': kind 'reaction' is not supported by this source's connector (it takes message, status)"
        )

        assert Outbox("hook").queue("m1", **PLACE, body={"text": "hi"})
        assert [p.post_id for p in deliver_due("hook")["hook"]] == ["m1"]
        assert platforms["hook"].kinds == {"message", "status"}


@override_settings(**SOURCES)
def test_a_stand_in_keeps_its_connectors_timeout_and_lookup_requests(db):
    with memory_connectors() as platforms:
        hook, mail = platforms["hook"], platforms["mail"]

        assert isinstance(hook, MemoryConnector)
        assert (hook.kinds, hook.timeout, hook.lookup_requests) == ({"message", "status"}, 3.0, 1)
        assert (mail.kinds, mail.timeout, mail.lookup_requests) == (
            EmailConnector.kinds,
            EmailConnector("mail", from_email="bot@example.com").timeout,
            0,
        )


def test_a_source_added_by_name_takes_every_kind(db):
    with memory_connectors("new") as platforms:
        assert platforms["new"].kinds == {"message", "status", "reaction", "ephemeral", "delete"}
        assert Outbox("new").queue("e1", **PLACE, kind="ephemeral", body={"user": "U1", "text": "psst"})


@override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"hook": {**WEBHOOK, "OPTIONS": {"nope": 1}}}})
def test_a_source_that_production_could_not_build_cannot_be_stood_in_for():
    with pytest.raises(ImproperlyConfigured) as raised, memory_connectors("hook"):
        pass
    assert str(raised.value).startswith(
        "CONNECTOR_OUTBOX['CONNECTORS']['hook']: the connector cannot be built from its OPTIONS: "
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"kinds": ["message", "poll"]},
            "kinds must be a list of message, status, reaction, ephemeral, delete, not ['message', 'poll']",
        ),
        ({"kinds": "message"}, "kinds must be a list of message, status, reaction, ephemeral, delete, not 'message'"),
        ({"timeout": 0}, "timeout must be a positive number of seconds or None, not 0"),
        ({"timeout": True}, "timeout must be a positive number of seconds or None, not True"),
        ({"lookup_requests": -1}, "lookup_requests must be an int of at least 0, not -1"),
    ],
)
def test_a_memory_connector_refuses_bad_stand_in_options(options, message):
    with pytest.raises(ValueError) as raised:
        MemoryConnector("m", **options)
    assert str(raised.value) == message


class TerseConnector(Connector):
    """A platform whose Message limit follows an option, as a connector's may."""

    def __init__(self, source: str, *, most: int) -> None:
        super().__init__(source)

    @classmethod
    def message_problem(cls, message: Message, options: Mapping[str, Any]) -> str | None:
        if len(message.text) > options["most"]:
            return f"text is {len(message.text)} characters, over Terse's {options['most']}"
        return None


@override_settings(
    CONNECTOR_OUTBOX={
        "CONNECTORS": {"terse": {"BACKEND": f"{__name__}.TerseConnector", "OPTIONS": {"most": 5}}}
    }
)
def test_a_stand_in_refuses_a_message_its_connector_refuses(db):
    with memory_connectors("terse") as platforms:
        with pytest.raises(InvalidPost, match=r"^post 'm1': text is 6 characters, over Terse's 5$"):
            Outbox("terse").queue("m1", **PLACE, body=Message("sixsix"))
        assert Outbox("terse").queue("m2", **PLACE, body=Message("five5"))
        [delivered] = deliver_due()["terse"]
    assert delivered.body == {"text": "five5"}  # rendered as text, as the memory connector does
    assert platforms["terse"].messages("C1")[0].body == {"text": "five5"}


def test_a_memory_connector_refuses_a_stand_in_entry_without_a_backend():
    with pytest.raises(
        ValueError, match=r"^messages_like must be a source's entry with a BACKEND path, not \{\}$"
    ):
        MemoryConnector("m", messages_like={})
