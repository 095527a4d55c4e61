"""The registry, and the console and memory connectors shipped for development and tests."""

from __future__ import annotations

import io
from datetime import UTC, datetime
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_connector_outbox.connectors import (
    CannotCheck,
    Delivered,
    MaybeSent,
    RateLimited,
    Refused,
    RetryLater,
    connectors,
)
from django_connector_outbox.connectors.console import ConsoleConnector
from django_connector_outbox.connectors.memory import MemoryConnector
from django_connector_outbox.posts import ClaimedPost
from tests.connectors.helpers import claimed_post

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def claim(post_id: str = "p1", kind: str = "message", body: dict | None = None, **fields: Any) -> ClaimedPost:
    return claimed_post(
        "memory",
        post_id,
        body if body is not None else {"text": post_id},
        kind=kind,
        workspace_id="W",
        container_id="C",
        sent_at=NOW,
        lease_until=NOW,
        **fields,
    )


def test_registry_builds_one_shared_instance_per_source() -> None:
    assert connectors["memory"] is connectors["memory"]
    assert connectors["memory"] is not connectors["other"]
    assert connectors["memory"].source == "memory"


def test_registry_rebuilds_when_settings_change() -> None:
    before = connectors["memory"]
    config = {
        "CONNECTORS": {"memory": {"BACKEND": "django_connector_outbox.connectors.console.ConsoleConnector"}}
    }
    with override_settings(CONNECTOR_OUTBOX=config):
        assert isinstance(connectors["memory"], ConsoleConnector)
    assert connectors["memory"] is not before
    assert isinstance(connectors["memory"], MemoryConnector)


def test_registry_unknown_source() -> None:
    with pytest.raises(
        ImproperlyConfigured, match="Unknown connector outbox source 'nope'; configured: memory, other"
    ):
        connectors["nope"]


def test_console_prints_each_post_readably() -> None:
    out = io.StringIO()
    console = ConsoleConnector("chat", stream=out)
    assert console.send(claim("p1", body={"text": "héllo"})) == Delivered("C:1")
    assert console.send(claim("s1", kind="status", message_ref="C:1", thread_id="T9")) == Delivered("C:1")
    assert console.send(claim("r1", kind="reaction", body={"name": "tada"})) == Delivered(None)
    assert out.getvalue().splitlines() == [
        "[chat] message p1 -> W/C (ref C:1)",
        '    {"text": "héllo"}',
        "[chat] edit s1 -> W/C thread T9 (ref C:1)",
        '    {"text": "s1"}',
        "[chat] reaction r1 -> W/C (ref C:2)",
        '    {"name": "tada"}',
    ]


def test_console_prints_a_delete_as_one_line_and_takes_every_kind() -> None:
    out = io.StringIO()
    console = ConsoleConnector("chat", stream=out)
    assert console.send(claim("p1:delete", kind="delete", body={}, message_ref="C:7")) == Delivered("C:7")
    assert out.getvalue().splitlines() == ["[chat] delete C:7 -> W/C (p1:delete)"]
    assert "delete" in ConsoleConnector.kinds


def test_memory_deletes_a_message_once_and_a_second_delete_is_done_too() -> None:
    platform = MemoryConnector("memory")
    kept, gone = platform.send(claim("m1")), platform.send(claim("m2"))
    assert isinstance(gone, Delivered) and isinstance(kept, Delivered)
    delete = claim("m2:delete", kind="delete", body={}, message_ref=gone.message_ref)
    assert platform.send(delete) == Delivered(gone.message_ref)
    assert platform.send(delete) == Delivered(gone.message_ref)  # gone already: done all the same
    assert [m.post_id for m in platform.messages("C")] == ["m1"]
    assert [m.post_id for m in platform.deleted] == ["m2"]
    assert "delete" in platform.kinds
    assert "delete" not in MemoryConnector("memory", kinds=["message", "status"]).kinds


def test_memory_keeps_messages_edits_reactions_and_ephemerals() -> None:
    platform = MemoryConnector("memory")
    first = platform.send(claim("m1"))
    status = platform.send(claim("s1", kind="status", body={"text": "v1"}))
    assert isinstance(status, Delivered)
    assert (
        platform.send(claim("s1", kind="status", body={"text": "v2"}, message_ref=status.message_ref))
        == status
    )
    reaction = claim("r1", kind="reaction", body={"name": "tada", "timestamp": "1.2"})
    assert platform.send(reaction) == Delivered(None)
    assert platform.send(reaction) == Delivered(None)  # adding it twice is a no-op
    platform.send(claim("e1", kind="ephemeral", body={"user": "U1", "text": "psst"}))
    assert first == Delivered("C:1")
    assert [(m.post_id, m.body, m.edits) for m in platform.messages("C")] == [
        ("m1", {"text": "m1"}, 0),
        ("s1", {"text": "v2"}, 1),
    ]
    assert platform.reactions == [{"post_id": "r1", "container_id": "C", "name": "tada", "timestamp": "1.2"}]
    assert platform.ephemerals == [{"post_id": "e1", "container_id": "C", "user": "U1", "text": "psst"}]
    assert len(platform.sent) == 6


def test_memory_scripted_failures_then_normal() -> None:
    platform = MemoryConnector("memory")
    platform.fail_next("boom")
    platform.fail_next("no such channel", permanent=True)
    platform.rate_limit_next(2.5)
    platform.lose_next_reply()
    assert platform.send(claim("a")) == RetryLater("boom")
    assert platform.send(claim("a")) == Refused("no such channel")
    assert platform.send(claim("a")) == RateLimited(2.5, "rate limited")
    assert platform.send(claim("a")) == MaybeSent("reply lost (scripted)")
    assert [m.post_id for m in platform.messages("C")] == ["a"]  # the lost reply's post is there
    assert platform.send(claim("b")) == Delivered("C:2")


def test_memory_history_makes_find_sent_work() -> None:
    platform = MemoryConnector("memory")
    platform.lose_next_reply()
    platform.send(claim("a"))
    platform.send(claim("r", kind="reaction", body={"name": "x", "timestamp": "1"}))
    assert platform.find_sent(claim("a", stale=True)) == "C:1"
    assert platform.find_sent(claim("b", stale=True)) is None
    assert platform.find_sent(claim("r", kind="reaction", stale=True)) == "reaction:r"
    with pytest.raises(CannotCheck):
        platform.find_sent(claim("e", kind="ephemeral", stale=True))


def test_memory_reset_forgets_everything() -> None:
    platform = MemoryConnector("memory")
    platform.fail_next()
    platform.reset()
    assert platform.send(claim("a")) == Delivered("C:1")
    platform.reset()
    assert platform.messages("C") == [] and platform.sent == []


def test_connectors_take_no_unknown_options() -> None:
    with pytest.raises(TypeError, match="MemoryConnector takes no options, got colour"):
        MemoryConnector("memory", colour="red")
