"""The base connector's rendering of a Message (plain text) and its default limits (none)."""

from __future__ import annotations

from django_connector_outbox.connectors.base import Connector
from django_connector_outbox.connectors.console import ConsoleConnector
from django_connector_outbox.connectors.memory import MemoryConnector
from django_connector_outbox.connectors.text_render import plain_text
from django_connector_outbox.message import Link, Message

FULL = Message(
    "**Deploy** of `api` [failed](https://ci.example.com/1)",
    title="Deploy #12",
    fields=[("Env", "prod"), ("By", "ana")],
    actions=[Link("Logs", "https://ci.example.com/1/logs"), Link("Retry", "https://ci.example.com/1/retry")],
    image_url="https://ci.example.com/1.png",
    context="_at 12:00_",
)


def test_plain_text_shows_every_part() -> None:
    assert plain_text(FULL) == (
        "Deploy #12\n\n"
        "Deploy of api failed (https://ci.example.com/1)\n\n"
        "Env: prod\nBy: ana\n\n"
        "Logs: https://ci.example.com/1/logs\nRetry: https://ci.example.com/1/retry\n\n"
        "https://ci.example.com/1.png\n\n"
        "at 12:00"
    )


def test_plain_text_of_a_bare_message_is_its_text() -> None:
    assert plain_text(Message("hello _there_")) == "hello there"
    assert plain_text(Message("", title="Only a title")) == "Only a title"


def test_the_base_connector_renders_plain_text_and_takes_any_message() -> None:
    assert Connector("x").render(FULL) == {"text": plain_text(FULL)}
    assert Connector.message_problem(Message("x" * 1_000_000), {}) is None


def test_console_and_memory_show_a_message_as_text() -> None:
    assert ConsoleConnector("c").render(FULL) == {"text": plain_text(FULL)}
    assert MemoryConnector("m").render(FULL) == {"text": plain_text(FULL)}
