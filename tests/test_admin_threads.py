"""The admin and replies queued with `thread_of`: the list and the detail page say which post a
reply goes into the thread of, linked to its page, for the same queries however many replies."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_connector_outbox.models import Post
from django_connector_outbox.outbox import Outbox

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:django_connector_outbox_post_changelist")


def change_url(pk: int) -> str:
    return reverse("admin:django_connector_outbox_post_change", args=[pk])


def queue_thread(parent: str, replies: int, container: str) -> None:
    outbox = Outbox("memory")
    place = {"workspace_id": "T1", "container_id": container}
    outbox.queue_many(
        [{"post_id": parent, "body": {"text": parent}, **place}]
        + [
            {"post_id": f"{parent}-r{n}", "body": {"text": "r"}, "thread_of": parent, **place}
            for n in range(replies)
        ]
    )


def test_a_reply_links_to_its_parent_in_the_list_and_on_its_page(admin_client):
    queue_thread("p1", 1, "C1")
    parent = Post.objects.get(post_id="p1")
    reply = Post.objects.get(post_id="p1-r0")
    link = f'reply to <a href="{change_url(parent.pk)}">p1</a>'

    assert link in admin_client.get(CHANGELIST).content.decode()
    page = admin_client.get(change_url(reply.pk)).content.decode()
    assert "Reply to" in page and link in page
    assert "reply to" not in admin_client.get(change_url(parent.pk)).content.decode()


def test_a_reply_whose_parent_was_pruned_says_so(admin_client):
    queue_thread("p1", 1, "C1")
    outbox = Outbox("memory")
    [claim] = outbox.claim()
    outbox.posted(claim, "C1:1")
    Post.objects.filter(post_id="p1").delete()

    assert "reply to p1 (pruned)" in admin_client.get(CHANGELIST).content.decode()


def test_the_list_costs_the_same_queries_however_many_replies_it_shows(admin_client):
    def page_with(parents):
        for n in parents:
            queue_thread(f"p{n}", 2, f"C{n}")
        with CaptureQueriesContext(connection) as captured:
            page = admin_client.get(CHANGELIST).content.decode()
        return len(captured), page.count("reply to <a href")

    few = page_with(range(1))
    many = page_with(range(1, 8))
    assert few == (few[0], 2)
    assert many == (few[0], 16)
