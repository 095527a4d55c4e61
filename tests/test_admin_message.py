"""A post queued with a Message, on its admin page: its parts readable, and its rendering."""

from __future__ import annotations

import json

import pytest
from django.test import override_settings

from django_connector_outbox import Link, Message
from django_connector_outbox.connectors.text_render import plain_text
from django_connector_outbox.models import Post
from tests.test_admin import change_url, make

pytestmark = pytest.mark.django_db

MESSAGE = Message(
    "**Deploy** <b>failed</b>\nsee log",
    title="Deploy & co",
    fields=[("Env", "<prod>")],
    actions=[Link("Logs", "https://ci.example.com/1?a=1&b=2")],
    image_url="https://ci.example.com/1.png",
    context="_by ana_",
)


def body_of(page: str) -> str:
    start = page.index('<div class="form-row field-pretty_body">')
    return page[start : page.index("</fieldset>", start)]


def test_a_message_is_shown_part_by_part_and_as_its_source_renders_it(admin_client):
    post = make("m1", body=MESSAGE.as_body())
    shown = body_of(admin_client.get(change_url(post)).content.decode())
    assert "$message" not in shown
    assert "<th>Title</th><td>Deploy &amp; co</td>" in shown
    assert (
        '<th>Text</th><td><pre class="outbox-pre">**Deploy** &lt;b&gt;failed&lt;/b&gt;\nsee log</pre>'
        in shown
    )
    assert "<table><tr><th>Env</th><td>&lt;prod&gt;</td></tr></table>" in shown
    assert "Logs &rarr; <code>https://ci.example.com/1?a=1&amp;b=2</code>" in shown
    assert "<th>Image</th><td><code>https://ci.example.com/1.png</code></td>" in shown
    assert '<th>Context</th><td><pre class="outbox-pre">_by ana_</pre>' in shown
    assert "<a " not in shown  # no link of a post is made clickable
    rendered = json.dumps({"text": plain_text(MESSAGE)}, indent=2, ensure_ascii=False)
    assert "<strong>Rendered for memory</strong>" in shown
    assert (
        rendered.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
        in shown
    )


def test_a_platform_body_is_still_shown_as_json(admin_client):
    post = make("d1", body={"text": "plain <dict>"})
    shown = body_of(admin_client.get(change_url(post)).content.decode())
    assert "&quot;text&quot;: &quot;plain &lt;dict&gt;&quot;" in shown
    assert "outbox-message" not in shown


def test_a_message_of_a_source_no_longer_configured_is_still_shown(admin_client):
    post = make("m2", body=Message("hello").as_body())
    Post.objects.filter(pk=post.pk).update(source="gone")
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"memory": {"BACKEND": "x.Y"}}}):
        page = admin_client.get(change_url(post))
    shown = body_of(page.content.decode())
    assert '<th>Text</th><td><pre class="outbox-pre">hello</pre>' in shown
    assert "Rendered for" not in shown
