"""What a user reads when a call is wrong, by its exact text: plain values (never an enum's or a
type's Python repr), the unknown key named with the known ones, the missing field named."""

from __future__ import annotations

import pytest
from django.test import override_settings

from django_connector_outbox import InvalidPost, Outbox
from django_connector_outbox.connectors.memory import MemoryConnector
from django_connector_outbox.posts import Kind, State

pytestmark = pytest.mark.django_db

KNOWN = "known: post_id, workspace_id, container_id, thread_id, kind, body, turn_key, delay, thread_of"


class MessagesOnly(MemoryConnector):
    kinds = frozenset({"message"})


def good(**overrides):
    return {"post_id": "p1", "workspace_id": "T1", "container_id": "C1", "body": {"text": "hi"}, **overrides}


def refused(call, *args, **kwargs) -> str:
    with pytest.raises(InvalidPost) as caught:
        call(*args, **kwargs)
    return str(caught.value)


@override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"hook": {"BACKEND": f"{__name__}.MessagesOnly"}}})
def test_a_kind_the_source_does_not_take_is_named_by_its_value_with_the_kinds_it_takes():
    outbox = Outbox("hook")
    assert refused(outbox.set_status, "s1", workspace_id="T1", container_id="C1", body={}) == (
        "post 's1': kind 'status' is not supported by this source's connector (it takes message)"
    )
    assert refused(outbox.queue, **good(kind=Kind.REACTION)) == (
        "post 'p1': kind 'reaction' is not supported by this source's connector (it takes message)"
    )


def test_an_unknown_kind_is_named_with_the_known_ones():
    assert refused(Outbox("memory").queue, **good(kind="poll")) == (
        "post 'p1': kind 'poll' is unknown; use one of message, status, reaction, ephemeral"
    )
    assert refused(Outbox("memory").queue, **good(kind=["message"])) == (
        "post 'p1': kind ['message'] is unknown; use one of message, status, reaction, ephemeral"
    )


def test_an_empty_workspace_id_is_refused_where_the_platform_names_workspaces():
    assert refused(Outbox("memory").queue, **good(workspace_id="")) == (
        "post 'p1': workspace_id must not be empty"
    )


def test_a_delete_is_never_queued_directly():
    for queue in (Outbox("memory").queue, lambda **post: Outbox("memory").queue_many([post])):
        assert refused(queue, **good(kind="delete")) == (
            "post 'p1': a delete is never queued; retract the post instead"
        )


def test_a_mistyped_key_in_queue_many_is_named_with_the_known_keys():
    post = good()
    post["workspace"] = post.pop("workspace_id")
    assert refused(Outbox("memory").queue_many, [good(post_id="p0"), post]) == (
        f"post 'p1': unknown field workspace; {KNOWN}"
    )
    assert refused(Outbox("memory").queue_many, [good(colour="red", size=2)]) == (
        f"post 'p1': unknown fields colour, size; {KNOWN}"
    )


def test_missing_keys_in_queue_many_are_named():
    assert refused(Outbox("memory").queue_many, [{"post_id": "p1", "body": {}}]) == (
        "post 'p1': workspace_id, container_id are required"
    )
    assert refused(
        Outbox("memory").queue_many, [{"workspace_id": "T1", "container_id": "C1", "body": {}}]
    ) == ("post None: post_id is required")


def test_an_unknown_keyword_of_queue_is_named():
    # Python 3.13 adds ". Did you mean 'workspace_id'?" to its own message.
    with pytest.raises(
        TypeError,
        match=r"^Outbox.queue\(\) got an unexpected keyword argument 'workspace'(\. Did you mean 'workspace_id'\?)?$",
    ):
        Outbox("memory").queue("p1", workspace="T1", container_id="C1", body={})  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("field", "value", "text"),
    [
        ("workspace_id", None, "post 'p1': workspace_id must be a string, not None"),
        ("container_id", 5, "post 'p1': container_id must be a string, not int"),
        ("body", None, "post 'p1': body must be a JSON object (a dict), not None"),
        ("body", [1], "post 'p1': body must be a JSON object (a dict), not list"),
    ],
)
def test_a_value_of_the_wrong_type_is_named_by_its_type_never_nonetype(field, value, text):
    assert refused(Outbox("memory").queue, **good(**{field: value})) == text


def test_settle_names_a_wrong_state_by_its_value():
    outbox = Outbox("memory")
    assert outbox.queue(**good())
    [claim] = outbox.claim()
    with pytest.raises(ValueError) as caught:
        outbox.settle(claim, State.POSTED)
    assert str(caught.value) == "settle() takes 'failed' or 'uncertain', not 'posted'"


def test_a_status_given_to_queue_is_sent_to_set_status_by_its_value():
    assert refused(Outbox("memory").queue, **good(kind=Kind.STATUS)) == (
        "post 'p1': kind 'status' is queued with set_status(), not queue()"
    )


def test_hold_names_an_unknown_scope_with_the_known_ones():
    outbox = Outbox("memory")
    assert outbox.queue(**good())
    [claim] = outbox.claim()
    with pytest.raises(ValueError) as caught:
        outbox.hold(claim, 1, scope="everywhere")
    assert str(caught.value) == "a hold's scope is one of container, workspace, source, not 'everywhere'"
