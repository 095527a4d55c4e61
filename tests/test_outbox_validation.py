"""Bad input is refused with InvalidPost naming the post and the field, and writes nothing."""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from typing import Any
from unittest import mock

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_connector_outbox import InvalidPost, Outbox
from django_connector_outbox.connectors.memory import MemoryConnector
from django_connector_outbox.models import Lane, Post
from django_connector_outbox.validation import MAX_BODY_DEPTH

pytestmark = pytest.mark.django_db


class MessagesOnlyConnector(MemoryConnector):
    """A source that takes messages only (as a webhook takes no reactions)."""

    kinds = frozenset({"message", "status"})


@pytest.fixture
def outbox(clock):
    return Outbox("memory", clock=clock)


def settings_with(**values):
    return override_settings(CONNECTOR_OUTBOX={**settings.CONNECTOR_OUTBOX, **values})


def good(**overrides):
    return {"post_id": "p1", "workspace_id": "T1", "container_id": "C1", "body": {"text": "hi"}, **overrides}


def nothing_written():
    return not Post.objects.exists() and not Lane.objects.exists()


def test_invalid_post_is_a_value_error():
    assert issubclass(InvalidPost, ValueError)


# -- ids --------------------------------------------------------------------------------------

REQUIRED_IDS = ["post_id", "workspace_id", "container_id"]
OPTIONAL_IDS = ["thread_id", "turn_key"]


@pytest.mark.parametrize("field", REQUIRED_IDS)
@pytest.mark.parametrize(
    "value", ["", "x" * 256, 5, b"bytes", ["C1"]], ids=["empty", "256", "int", "bytes", "list"]
)
def test_a_required_id_must_be_a_non_empty_string_of_at_most_255(outbox, field, value):
    with pytest.raises(InvalidPost, match=field):
        outbox.queue(**good(**{field: value}))
    assert nothing_written()


@pytest.mark.parametrize("field", REQUIRED_IDS)
def test_a_required_id_may_not_be_none(outbox, field):
    with pytest.raises(InvalidPost, match=field):
        outbox.queue(**good(**{field: None}))
    assert nothing_written()


@pytest.mark.parametrize("field", OPTIONAL_IDS)
@pytest.mark.parametrize("value", ["x" * 256, 5, b"bytes"], ids=["256", "int", "bytes"])
def test_an_optional_id_must_be_a_string_of_at_most_255(outbox, field, value):
    with pytest.raises(InvalidPost, match=field):
        outbox.queue(**good(**{field: value}))
    assert nothing_written()


def test_thread_id_may_not_be_none(outbox):
    with pytest.raises(InvalidPost, match="thread_id"):
        outbox.queue(**good(thread_id=None))


@pytest.mark.parametrize("field", REQUIRED_IDS + OPTIONAL_IDS)
def test_an_id_of_255_characters_is_accepted_and_kept_whole(outbox, field):
    value = ("é" if field == "thread_id" else "x") * 255
    assert outbox.queue(**good(**{field: value})) is True
    assert getattr(Post.objects.get(), field) == value


@pytest.mark.parametrize("field", OPTIONAL_IDS)
def test_thread_id_and_turn_key_may_be_empty(outbox, field):
    assert outbox.queue(**good(**{field: ""})) is True


def test_the_error_names_the_post_id(outbox):
    with pytest.raises(InvalidPost, match=r"'p-42'.*container_id"):
        outbox.queue(**good(post_id="p-42", container_id=""))


@pytest.mark.parametrize("field", REQUIRED_IDS[1:] + ["thread_id"])
def test_set_status_checks_ids_too(outbox, field):
    fields = {"post_id": "s1", "workspace_id": "T1", "container_id": "C1", "thread_id": "", field: "x" * 256}
    with pytest.raises(InvalidPost, match=field):
        outbox.set_status(fields.pop("post_id"), body={}, **fields)
    assert nothing_written()


# Text that the databases do not store alike (issue 9, hole 14): PostgreSQL refuses NUL, the
# others store it; a lone surrogate is not UTF-8.
NUL = "\x00"
SURROGATE = "\ud800"
BAD_TEXT = {
    "nul": ("a" + NUL + "b", "contains a NUL character (\\x00), which PostgreSQL cannot store"),
    "surrogate": ("a" + SURROGATE, "contains a lone surrogate ('\\ud800'), which is not UTF-8"),
}


@pytest.mark.parametrize("field", REQUIRED_IDS + OPTIONAL_IDS)
@pytest.mark.parametrize("text", BAD_TEXT)
def test_an_id_with_text_the_databases_do_not_store_alike_is_refused(outbox, field, text):
    value, refusal = BAD_TEXT[text]
    with pytest.raises(InvalidPost) as refused:
        outbox.queue(**good(**{field: value}))
    assert str(refused.value) == f"post {value if field == 'post_id' else 'p1'!r}: {field} {refusal}"
    assert nothing_written()


@pytest.mark.parametrize("field", ["post_id", "workspace_id", "container_id", "thread_id"])
def test_set_status_refuses_a_nul_in_an_id_too(outbox, field):
    fields = {"post_id": "s1", "workspace_id": "T1", "container_id": "C1", "thread_id": "", field: "x" + NUL}
    with pytest.raises(InvalidPost, match=f"{field} contains a NUL character"):
        outbox.set_status(**fields, body={})
    assert nothing_written()


# -- kinds ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["poll", "", "MESSAGE", None, 1])
def test_an_unknown_kind_is_refused(outbox, kind):
    with pytest.raises(InvalidPost, match=r"'p1'.*kind"):
        outbox.queue(**good(kind=kind))
    assert nothing_written()


@pytest.mark.parametrize("kind", ["message", "reaction", "ephemeral"])
def test_every_one_off_kind_is_queued_where_the_connector_takes_it(outbox, kind):
    assert outbox.queue(**good(kind=kind)) is True


@override_settings(
    CONNECTOR_OUTBOX={"CONNECTORS": {"hook": {"BACKEND": f"{__name__}.MessagesOnlyConnector"}}},
)
@pytest.mark.parametrize("kind", ["reaction", "ephemeral"])
def test_a_kind_the_sources_connector_does_not_take_is_refused(clock, kind):
    outbox = Outbox("hook", clock=clock)
    with pytest.raises(InvalidPost, match=rf"'p1'.*kind.*{kind}"):
        outbox.queue(**good(kind=kind))
    with pytest.raises(InvalidPost, match="kind"):
        outbox.queue_many([good(post_id="ok"), good(kind=kind)])
    assert nothing_written()
    assert outbox.queue(**good()) is True


SLACK = {"BACKEND": "django_connector_outbox.connectors.slack.SlackConnector", "OPTIONS": {"token": "xoxb-1"}}


@override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"slack": SLACK}})
def test_queue_reads_the_kinds_from_the_connector_class_and_builds_no_connector(clock):
    # Producers check kinds only: building Slack's connector would build its WebClient.
    slack_sdk = pytest.importorskip("slack_sdk")
    from django_connector_outbox.connectors.slack import SlackConnector

    refused = AssertionError("a connector was built on the producer's path")
    with (
        mock.patch.object(slack_sdk.WebClient, "__init__", side_effect=refused),
        mock.patch.object(SlackConnector, "__init__", side_effect=refused),
    ):
        outbox = Outbox("slack", clock=clock)
        assert outbox.queue(**good(kind="reaction")) is True
        assert outbox.queue_many([good(post_id="p2"), good(post_id="p3", kind="ephemeral")]) == 2
        with pytest.raises(InvalidPost, match="kind 'poll' is unknown"):
            outbox.queue(**good(post_id="p4", kind="poll"))
    assert Post.objects.count() == 3


@override_settings(
    CONNECTOR_OUTBOX={
        "CONNECTORS": {
            "hook": {
                "BACKEND": "django_connector_outbox.connectors.memory.MemoryConnector",
                "OPTIONS": {"kinds": ["message"]},
            }
        }
    },
)
def test_kinds_that_follow_an_option_are_read_for_that_option(clock):
    outbox = Outbox("hook", clock=clock)
    with pytest.raises(InvalidPost, match=r"kind 'reaction' is not supported .* \(it takes message\)"):
        outbox.queue(**good(kind="reaction"))
    assert outbox.queue(**good()) is True


# -- bodies -----------------------------------------------------------------------------------


@pytest.mark.parametrize("body", [None, [], ["a"], "text", 1, b"{}", ({"a": 1},)], ids=repr)
def test_a_body_must_be_a_dict(outbox, body):
    with pytest.raises(InvalidPost, match=r"'p1'.*body"):
        outbox.queue(**good(body=body))
    assert nothing_written()


@pytest.mark.parametrize(
    "body",
    [
        {"x": object()}, {"x": {1, 2}}, {("a", "b"): 1},
        {"x": float("nan")}, {"x": float("inf")}, {"x": -float("inf")},
    ],
    ids=["object", "set", "tuple key", "nan", "inf", "-inf"],
)  # fmt: skip
def test_a_body_that_json_refuses_is_refused(outbox, body):
    with pytest.raises(InvalidPost, match=r"'p1'.*body"):
        outbox.queue(**good(body=body))
    assert nothing_written()


def test_a_body_json_takes_with_djangos_encoder_is_accepted(outbox):
    from datetime import datetime
    from decimal import Decimal
    from uuid import UUID

    body = {"at": datetime(2026, 1, 1, 12, 0), "amount": Decimal("1.50"), "id": UUID(int=1)}
    assert outbox.queue(**good(body=body)) is True
    assert Post.objects.get().body == {
        "at": "2026-01-01T12:00:00", "amount": "1.50", "id": "00000000-0000-0000-0000-000000000001",
    }  # fmt: skip


def body_of_size(size):
    """A body whose compact JSON encoding is exactly `size` bytes."""
    body = {"text": ""}
    body["text"] = "x" * (size - len(json.dumps(body, separators=(",", ":"))))
    assert len(json.dumps(body, separators=(",", ":")).encode()) == size
    return body


def test_a_body_of_max_body_bytes_is_accepted_and_one_byte_more_is_refused(outbox):
    with settings_with(MAX_BODY_BYTES=100):
        assert outbox.queue(**good(post_id="fits", body=body_of_size(100))) is True
        with pytest.raises(InvalidPost, match=r"'big'.*body.*MAX_BODY_BYTES"):
            outbox.queue(**good(post_id="big", body=body_of_size(101)))
    assert list(Post.objects.values_list("post_id", flat=True)) == ["fits"]


def test_max_body_bytes_defaults_to_256_kib(outbox):
    assert outbox.queue(**good(post_id="fits", body=body_of_size(256 * 1024))) is True
    with pytest.raises(InvalidPost, match="body"):
        outbox.queue(**good(post_id="big", body=body_of_size(256 * 1024 + 1)))


def test_the_body_size_is_that_of_the_compact_encoding(outbox):
    # With ", " and ": " separators this body would be over 100 bytes; compact, it is not.
    body = {f"k{i}": i for i in range(12)}
    assert len(json.dumps(body, separators=(",", ":"))) <= 100 < len(json.dumps(body))
    with settings_with(MAX_BODY_BYTES=100):
        assert outbox.queue(**good(body=body)) is True


def test_set_status_checks_the_body_size_too(outbox):
    with settings_with(MAX_BODY_BYTES=100), pytest.raises(InvalidPost, match="body"):
        outbox.set_status("s1", workspace_id="T1", container_id="C1", body=body_of_size(101))
    assert nothing_written()


@pytest.mark.parametrize("text", BAD_TEXT)
@pytest.mark.parametrize(
    ("body", "where"),
    [
        (lambda t: {"text": t}, "body['text']"),
        (
            lambda t: {"blocks": [{"type": "section", "text": {"text": t}}]},
            "body['blocks'][0]['text']['text']",
        ),
        (lambda t: {t: 1}, "the key {key} of body"),
        (lambda t: {"a": [1, {t: True}]}, "the key {key} of body['a'][1]"),
    ],
    ids=["value", "nested-value", "key", "nested-key"],
)
def test_a_body_with_text_the_databases_do_not_store_alike_is_refused_naming_where(outbox, text, body, where):
    value, refusal = BAD_TEXT[text]
    expected = f"post 'p1': {where.format(key=repr(value))} {refusal}"
    with pytest.raises(InvalidPost) as refused:
        outbox.queue(**good(body=body(value)))
    assert str(refused.value) == expected
    assert nothing_written()


def test_set_status_refuses_a_nul_in_the_body_and_keeps_the_status(outbox):
    outbox.set_status("s1", workspace_id="T1", container_id="C1", body={"text": "v1"})
    with pytest.raises(InvalidPost, match=r"body\['text'\] contains a NUL character"):
        outbox.set_status("s1", workspace_id="T1", container_id="C1", body={"text": NUL})
    assert Post.objects.get().body == {"text": "v1"}


def test_escaped_text_that_only_looks_like_a_nul_is_accepted(outbox):
    body = {"text": "\\u0000 is how JSON writes NUL", "\\u0000": "\\"}
    assert outbox.queue(**good(body=body)) is True
    assert Post.objects.get().body == body


def nested(depth):
    """A body of `depth` nested objects and arrays, the body itself included."""
    inner: Any = [1]  # the innermost level is an array
    for _ in range(depth - 2):
        inner = {"o": inner}
    return {"top": inner}


def test_a_body_nested_as_deep_as_every_database_takes_is_stored(outbox):
    body = nested(MAX_BODY_DEPTH)
    assert outbox.queue(**good(body=body)) is True
    assert Post.objects.get().body == body


def test_a_body_nested_deeper_than_mariadb_takes_is_refused_everywhere(outbox):
    with pytest.raises(
        InvalidPost, match=r"post 'p1': body\[.*\] is nested deeper than 31 objects and arrays"
    ):
        outbox.queue(**good(body=nested(MAX_BODY_DEPTH + 1)))
    assert nothing_written()


def test_a_body_nested_past_the_recursion_limit_is_refused(outbox):
    body: dict = {}
    for _ in range(sys.getrecursionlimit() * 2):
        body = {"a": body}
    # Python 3.11-3.12's encoder hits the recursion limit first; 3.13's reaches the depth check.
    too_deep = r"post 'p1': body(\[.*\])? is nested (too deeply to encode as JSON|deeper than 31 objects)"
    with pytest.raises(InvalidPost, match=too_deep):
        outbox.queue(**good(body=body))
    assert nothing_written()


# -- delays -----------------------------------------------------------------------------------


@pytest.mark.parametrize("delay", [-1, -0.001, timedelta(seconds=-1)], ids=repr)
def test_a_negative_delay_is_refused(outbox, delay):
    with pytest.raises(InvalidPost, match=r"'p1'.*delay"):
        outbox.queue(**good(delay=delay))
    assert nothing_written()


@pytest.mark.parametrize("delay", ["5", True, [5], float("nan"), float("inf"), 1e12], ids=repr)
def test_a_delay_that_is_not_a_duration_is_refused(outbox, delay):
    with pytest.raises(InvalidPost, match=r"'p1'.*delay"):
        outbox.queue(**good(delay=delay))
    assert nothing_written()


def test_a_delay_as_a_timedelta_is_accepted(outbox, clock):
    assert outbox.queue(**good(delay=timedelta(minutes=2))) is True
    assert Post.objects.get().next_at == clock.now + timedelta(minutes=2)


# -- queue_many -------------------------------------------------------------------------------


def test_queue_many_names_the_bad_post_and_writes_nothing(outbox):
    posts = [good(post_id="a"), good(post_id="b", container_id="C2"), good(post_id="bad", body="text")]
    with pytest.raises(InvalidPost, match=r"'bad'.*body"):
        outbox.queue_many(posts)
    assert nothing_written()


def test_queue_many_refuses_an_unknown_field(outbox):
    with pytest.raises(InvalidPost, match=r"'p1'.*colour"):
        outbox.queue_many([good(colour="red")])
    assert nothing_written()


def test_queue_many_refuses_a_post_without_a_body(outbox):
    post = good()
    del post["body"]
    with pytest.raises(InvalidPost, match=r"'p1'.*body"):
        outbox.queue_many([post])


# -- sources and settings ---------------------------------------------------------------------


def test_an_unknown_source_is_improperly_configured():
    with pytest.raises(ImproperlyConfigured, match="nope"):
        Outbox("nope")


def test_a_source_is_known_once_configured(clock):
    with pytest.raises(ImproperlyConfigured):
        Outbox("later")
    with settings_with(
        CONNECTORS={"later": {"BACKEND": "django_connector_outbox.connectors.memory.MemoryConnector"}}
    ):
        assert Outbox("later", clock=clock).queue(**good()) is True
