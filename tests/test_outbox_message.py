"""A Message as a post's body: stored as its JSON, refused at queue time when the source
cannot show it, and rendered by the connector at send time (`connectors.base.native`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.db import transaction
from django.test import TestCase, override_settings

from django_connector_outbox import InvalidPost, Link, Message, Outbox, PostState, signals
from django_connector_outbox.connectors import connectors
from django_connector_outbox.connectors.memory import MemoryConnector
from django_connector_outbox.connectors.text_render import plain_text
from django_connector_outbox.models import Post
from django_connector_outbox.sender import Sender
from django_connector_outbox.testing import deliver_due, queued

pytestmark = pytest.mark.django_db

PLACE = {"workspace_id": "T1", "container_id": "C1"}
ALERT = Message(
    "**Disk** at _91%_ on `db1`",
    title="Disk alert",
    fields=[("Host", "db1"), ("Used", "91%")],
    actions=[Link("Runbook", "https://wiki.example.com/disk")],
    context="from cron",
)


class ShortConnector(MemoryConnector):
    """A platform that shows at most 20 characters of text, and renders in capitals."""

    @classmethod
    def message_problem(cls, message: Message, options: Mapping[str, Any]) -> str | None:
        if len(message.text) > 20:
            return f"text is {len(message.text):,} characters, over Short's 20"
        return None

    def render(self, message: Message) -> dict[str, Any]:
        return {"text": message.text.upper(), "title": message.title}


class BrokenRenderConnector(MemoryConnector):
    def render(self, message: Message) -> dict[str, Any]:
        raise RuntimeError("no renderer today")


SHORT = {
    "CONNECTORS": {
        "memory": {"BACKEND": "django_connector_outbox.connectors.memory.MemoryConnector"},
        "short": {"BACKEND": "tests.test_outbox_message.ShortConnector"},
        "broken": {"BACKEND": "tests.test_outbox_message.BrokenRenderConnector"},
    }
}


def stored(post_id: str, source: str = "memory") -> dict[str, Any]:
    return Post.objects.get(source=source, post_id=post_id).body


def test_a_message_is_stored_as_its_json():
    assert Outbox("memory").queue("m1", **PLACE, body=ALERT)
    assert stored("m1") == ALERT.as_body()
    [waiting] = queued()
    assert (waiting.body, waiting.message) == (ALERT.as_body(), ALERT)
    assert stored("m1")["$message"]["fields"] == [["Host", "db1"], ["Used", "91%"]]


def test_a_stored_message_body_is_taken_back_as_a_message():
    assert Outbox("memory").queue("m1", **PLACE, body=ALERT.as_body())
    assert stored("m1") == ALERT.as_body()


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (
            {"$message": {"text": "x"}, "text": "y"},
            "body key '$message' holds a Message and must be the only key",
        ),
        ({"$message": {"title": "no text"}}, "body['$message'] is not a Message's JSON (KeyError('text'))"),
        ({"$message": "text"}, "body['$message'] is not a Message's JSON"),
    ],
)
def test_a_body_that_misuses_the_message_key_is_refused(body, error):
    with pytest.raises(InvalidPost, match=r"^post 'm1': " + __import__("re").escape(error)):
        Outbox("memory").queue("m1", **PLACE, body=body)
    assert not Post.objects.exists()


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (Message(42), "Message text must be a string, not int"),  # type: ignore[arg-type]
        (Message("x", title=""), "Message title must be a non-empty string or None, not ''"),
        (Message("x", context=3), "Message context must be a non-empty string or None, not 3"),  # type: ignore[arg-type]
        (Message("x", fields=[("", "v")]), "Message fields[0] has an empty label"),
        (Message("x", actions=[("a", "https://e.com")]), "Message actions[0] must be a Link, not tuple"),  # type: ignore[list-item]
        (
            Message("x", actions=[Link("", "https://e.com")]),
            "Message actions[0] label must be a non-empty string",
        ),
        (
            Message("x", actions=[Link("a", "javascript:alert(1)")]),
            "Message actions[0] url must be an http(s) URL",
        ),
        (Message("x", actions=[Link("a", "https://")]), "Message actions[0] url must be an http(s) URL"),
        (Message("x", image_url="/logo.png"), "Message image_url must be an http(s) URL, not '/logo.png'"),
        (Message("  \n"), "Message has nothing to show: no text, title, fields or image"),
        (Message("nul \x00"), "body['$message']['text'] contains a NUL character"),
    ],
)
def test_a_message_no_platform_could_show_is_refused(message, error):
    with pytest.raises(InvalidPost, match=r"^post 'm1': " + __import__("re").escape(error)):
        Outbox("memory").queue("m1", **PLACE, body=message)
    assert not Post.objects.exists()


def test_a_message_with_only_a_title_or_an_image_is_fine():
    assert Outbox("memory").queue("m1", **PLACE, body=Message("", title="Deployed"))
    assert Outbox("memory").queue("m2", **PLACE, body=Message("", image_url="http://e.com/a.png"))


@override_settings(CONNECTOR_OUTBOX=SHORT)
def test_a_message_over_the_sources_limit_is_refused_naming_field_and_limit():
    with pytest.raises(InvalidPost, match=r"^post 'm1': text is 26 characters, over Short's 20$"):
        Outbox("short").queue("m1", **PLACE, body=Message("x" * 26))
    assert Outbox("memory").queue("m1", **PLACE, body=Message("x" * 26))  # no limit there
    assert list(Post.objects.values_list("source", flat=True)) == ["memory"]


@override_settings(CONNECTOR_OUTBOX=SHORT)
def test_queue_many_writes_nothing_when_one_message_is_over_the_limit():
    outbox = Outbox("short")
    posts = [
        {"post_id": "ok", **PLACE, "body": Message("fine")},
        {"post_id": "dict", **PLACE, "body": {"text": "x" * 100}},  # a platform body: not its business
        {"post_id": "long", **PLACE, "body": Message("y" * 21)},
    ]
    with pytest.raises(InvalidPost, match=r"^post 'long': text is 21 characters, over Short's 20$"):
        outbox.queue_many(posts)
    assert not Post.objects.exists()
    assert outbox.queue_many(posts[:2]) == 2


@override_settings(CONNECTOR_OUTBOX=SHORT)
def test_set_status_refuses_a_message_over_the_limit_and_keeps_the_status():
    outbox = Outbox("short")
    outbox.set_status("s1", **PLACE, body=Message("v1"))
    with pytest.raises(InvalidPost, match="over Short's 20"):
        outbox.set_status("s1", **PLACE, body=Message("v2 " * 10))
    assert stored("s1", "short") == Message("v1").as_body()


def test_the_callers_transaction_stays_usable_after_a_refused_message():
    with transaction.atomic():
        Outbox("memory").queue("m1", **PLACE, body=ALERT)
        with pytest.raises(InvalidPost):
            Outbox("memory").queue("m2", **PLACE, body=Message(""))
        Outbox("memory").queue("m3", **PLACE, body=Message("three"))
    assert sorted(Post.objects.values_list("post_id", flat=True)) == ["m1", "m3"]


def test_the_async_twins_take_a_message():
    outbox = Outbox("memory")
    assert async_to_sync(outbox.aqueue)("m1", **PLACE, body=ALERT)
    assert async_to_sync(outbox.aqueue_many)([{"post_id": "m2", **PLACE, "body": Message("two")}]) == 1
    async_to_sync(outbox.aset_status)("s1", **PLACE, body=Message("status"))
    assert [stored(p)["$message"]["text"] for p in ("m1", "m2", "s1")] == [ALERT.text, "two", "status"]


def test_a_message_is_delivered_as_the_connectors_rendering():
    Outbox("memory").queue("m1", **PLACE, body=ALERT)
    delivered = deliver_due()
    [message] = connectors["memory"].messages("C1")
    assert message.body == {"text": plain_text(ALERT)}
    assert message.body["text"].startswith("Disk alert\n\nDisk at 91% on db1\n\nHost: db1\nUsed: 91%")
    assert delivered["memory"][0].body == {"text": plain_text(ALERT)}  # as it was sent
    assert delivered["memory"][0].message == ALERT
    assert Outbox("memory").find("m1").state == "posted"


@override_settings(CONNECTOR_OUTBOX=SHORT)
def test_the_lookup_and_the_send_see_the_rendering_and_post_sent_too(clock):
    outbox = Outbox("short", clock=clock)
    outbox.queue("m1", **PLACE, body=Message("hello", title="Hi"))
    platform = connectors["short"]
    seen, looked_up = [], []
    real_lookup = platform.find_sent
    platform.find_sent = lambda post: looked_up.append(post.body) or real_lookup(post)  # type: ignore[method-assign]
    signals.post_sent.connect(lambda claim, **kw: seen.append(claim.body), weak=False, dispatch_uid="t")
    try:
        platform.lose_next_reply()
        deliver_due(clock=clock)
        clock.advance(200)  # the lease ends: claimed back stale, and looked up
        deliver_due(clock=clock)
    finally:
        signals.post_sent.disconnect(dispatch_uid="t")
    rendered = {"text": "HELLO", "title": "Hi"}
    assert [p.body for p in platform.sent] == [rendered]
    assert looked_up == [rendered]
    assert seen == [rendered]
    assert outbox.find("m1").state == "posted"


def test_a_status_edited_with_messages_is_edited_with_the_latest_rendering():
    outbox = Outbox("memory")
    outbox.set_status("s1", **PLACE, body=Message("Deploy _started_"))
    deliver_due()
    rev = Post.objects.get(post_id="s1").rev
    outbox.set_status("s1", **PLACE, body=Message("Deploy _started_"))  # the same Message: nothing
    assert Post.objects.get(post_id="s1").rev == rev
    outbox.set_status("s1", **PLACE, body=Message("Deploy **done**", fields=[("Took", "3 min")]))
    outbox.set_status("s1", **PLACE, body=Message("Deploy **done**", fields=[("Took", "4 min")]))
    deliver_due()
    [status] = connectors["memory"].messages("C1")
    assert status.history == [{"text": "Deploy started"}]
    assert (status.body, status.edits) == ({"text": "Deploy done\n\nTook: 4 min"}, 1)


@override_settings(CONNECTOR_OUTBOX=SHORT)
def test_a_render_that_raises_is_a_retry_with_its_reason(clock):
    outbox = Outbox("broken", clock=clock)
    outbox.queue("m1", **PLACE, body=Message("x"))
    Sender(["broken"], once=True, clock=clock).run()
    post = Post.objects.get(post_id="m1")
    assert (post.state, post.attempts) == ("queued", 1)
    assert post.last_error == "render raised RuntimeError('no renderer today')"
    assert connectors["broken"].sent == []


@override_settings(CONNECTOR_OUTBOX=SHORT)
def test_a_stale_claim_whose_render_raises_is_never_sent_blind(clock):
    outbox = Outbox("broken", clock=clock)
    outbox.queue("m1", **PLACE, body=Message("x"))
    outbox.claim()  # a sender that died with it
    clock.advance(200)
    Sender(["broken"], once=True, clock=clock).run()
    post = Post.objects.with_claim().get(post_id="m1")
    assert post.current_state == "sending"  # left, to be looked up again after its lease
    assert "render raised, will look again: RuntimeError('no renderer today')" in post.last_error
    assert connectors["broken"].sent == []


def test_find_shows_the_message_while_the_post_keeps_it():
    outbox = Outbox("memory")
    outbox.queue("m1", **PLACE, body=ALERT)
    outbox.queue("d1", **PLACE, body={"text": "a platform body"})
    outbox.set_status("s1", **PLACE, body=Message("building"))
    assert outbox.find("m1") == PostState("queued", None, ALERT)
    assert outbox.find("d1") == PostState("queued", None)
    deliver_due()
    assert outbox.find("m1") == PostState("posted", "C1:1")  # a posted one-off drops its body
    assert outbox.find("s1") == PostState("posted", "C1:3", Message("building"))  # a status keeps it
    assert async_to_sync(outbox.afind)("s1").message == Message("building")


class ImmediateDeliveryTests(TestCase):
    @override_settings(CONNECTOR_OUTBOX={**settings.CONNECTOR_OUTBOX, "DELIVERY": "immediate"})
    def test_a_message_delivered_immediately_is_rendered_too(self):
        with self.captureOnCommitCallbacks(execute=True):
            Outbox("memory").queue("m1", **PLACE, body=Message("Hi **all**", title="News"))
        assert [m.body for m in connectors["memory"].messages("C1")] == [{"text": "News\n\nHi all"}]
