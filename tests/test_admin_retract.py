"""The admin's retract: the bulk action `retract_posts` and a post's "Retract post" button, with
cancel's permission (`cancel_post`) and rules (no confirmation page; what does not apply is
skipped, and the message says how many and why)."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.test import override_settings
from django.urls import reverse

from django_connector_outbox.models import Post
from django_connector_outbox.posts import Kind, State
from tests.test_admin import CHANGELIST, act, change_url, make, messages_of, staff, states
from tests.test_admin_post_page import buttons

pytestmark = pytest.mark.django_db


def retract_url(post: Post) -> str:
    return reverse("admin:django_connector_outbox_post_retract", args=[post.pk])


def deletes() -> list[tuple[str, str, str | None]]:
    rows = Post.objects.filter(kind=Kind.DELETE).order_by("post_id")
    return list(rows.values_list("post_id", "thread_of", "message_ref"))


def test_retract_queues_a_delete_of_each_posted_post_and_skips_the_rest(admin_client, admin_user):
    posted = [make("d1", State.POSTED), make("d2", State.POSTED)]
    queued, failed, cancelled = make("q1"), make("f1", State.FAILED), make("c1", State.CANCELLED)
    response = act(admin_client, "retract_posts", [*posted, queued, failed, cancelled])
    assert messages_of(response) == [
        "2 retracted; 3 skipped: only posted posts can be retracted (1 queued, 1 failed, 1 cancelled)"
    ]
    assert deletes() == [
        ("d1:delete", "d1", "C-d1:1700000000.0001"),
        ("d2:delete", "d2", "C-d2:1700000000.0001"),
    ]
    assert states(queued, failed, cancelled) == ["queued", "failed", "cancelled"]  # left alone
    entries = LogEntry.objects.filter(action_flag=CHANGE)
    assert {(e.object_id, e.user_id, e.change_message) for e in entries} == {
        (
            str(post.pk),
            admin_user.pk,
            "Retracted: its delete queued, from posted (admin action retract_posts).",
        )
        for post in posted
    }


def test_a_sending_post_is_retracted_its_delete_waiting_behind_it(admin_client):
    sending = make("s1", State.SENDING)
    assert messages_of(act(admin_client, "retract_posts", [sending])) == ["1 retracted"]
    assert states(sending) == ["sending"]  # the send in flight goes on
    assert deletes() == [("s1:delete", "s1", None)]


def test_a_second_retract_is_skipped_and_queues_nothing(admin_client):
    posted = make("d1", State.POSTED)
    act(admin_client, "retract_posts", [posted])
    response = act(admin_client, "retract_posts", [posted])
    assert messages_of(response) == [
        "0 retracted; 1 skipped: only posted posts can be retracted (1 retracted already, or without a message)"
    ]
    assert len(deletes()) == 1


def test_a_posted_post_without_a_message_is_skipped(admin_client):
    reaction = make(
        "r1", State.POSTED, kind="reaction", body={"name": "eyes", "timestamp": "1.2"}, message_ref=None
    )
    response = act(admin_client, "retract_posts", [reaction])
    assert messages_of(response) == [
        "0 retracted; 1 skipped: only posted posts can be retracted (1 retracted already, or without a message)"
    ]
    assert deletes() == []


def test_a_source_that_cannot_delete_is_skipped(admin_client, settings):
    posted = make("d1", State.POSTED)
    memory = settings.CONNECTOR_OUTBOX["CONNECTORS"]["memory"] | {"OPTIONS": {"kinds": ["message", "status"]}}
    with override_settings(
        CONNECTOR_OUTBOX=settings.CONNECTOR_OUTBOX
        | {"CONNECTORS": settings.CONNECTOR_OUTBOX["CONNECTORS"] | {"memory": memory}}
    ):
        response = act(admin_client, "retract_posts", [posted])
        assert buttons(admin_client, posted) == []
    assert messages_of(response) == [
        "0 retracted; 1 skipped: only posted posts can be retracted (1 of a source that cannot delete)"
    ]
    assert deletes() == []


# -- permission: cancel's -------------------------------------------------------------------------


def test_staff_without_the_cancel_permission_can_neither_see_nor_run_retract(client, django_user_model):
    client.force_login(staff(django_user_model, "view_post", "retry_post"))
    posted = make("d1", State.POSTED)
    choices = [
        name
        for name, _ in client.get(f"{CHANGELIST}?state=all").context["action_form"].fields["action"].choices
    ]
    assert "retract_posts" not in choices
    assert messages_of(act(client, "retract_posts", [posted])) == ["No action selected."]
    assert buttons(client, posted) == []
    assert client.post(retract_url(posted)).status_code == 403
    assert deletes() == []


def test_staff_with_the_cancel_permission_retracts(client, django_user_model):
    client.force_login(staff(django_user_model, "view_post", "cancel_post"))
    posted = make("d1", State.POSTED)
    choices = [
        name
        for name, _ in client.get(f"{CHANGELIST}?state=all").context["action_form"].fields["action"].choices
    ]
    assert "retract_posts" in choices
    assert messages_of(act(client, "retract_posts", [posted])) == ["1 retracted"]
    assert deletes() == [("d1:delete", "d1", "C-d1:1700000000.0001")]


# -- the button --------------------------------------------------------------------------------------


def test_the_button_retracts_the_post_and_goes_back_to_its_page(admin_client):
    posted = make("d1", State.POSTED)
    assert buttons(admin_client, posted) == ["retract"]
    response = admin_client.post(retract_url(posted), follow=True)
    assert response.redirect_chain[-1][0] == change_url(posted)
    assert messages_of(response) == ["1 retracted"]
    assert deletes() == [("d1:delete", "d1", "C-d1:1700000000.0001")]
    assert buttons(admin_client, posted) == []  # retracted already: no second button


def test_the_button_is_a_post_form(admin_client):
    posted = make("d1", State.POSTED)
    assert admin_client.get(retract_url(posted)).status_code == 405
    assert deletes() == []


def test_the_delete_links_to_the_post_it_deletes(admin_client):
    posted = make("d1", State.POSTED)
    admin_client.post(retract_url(posted))
    delete = Post.objects.get(post_id="d1:delete")
    page = admin_client.get(change_url(delete)).content.decode()
    assert f'delete of <a href="{change_url(posted)}">d1</a>' in page
    assert buttons(admin_client, delete) == ["cancel"]  # a queued delete may be cancelled as any post
