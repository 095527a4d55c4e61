"""A post's change page: its retry and cancel buttons, its history, its attempts, its empty values.

The buttons run the bulk actions on one post, with their permissions, messages and (for an
uncertain post's retry) confirmation page; they show only where they apply.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.urls import reverse
from django.utils import timezone, translation

from django_connector_outbox.models import Post
from django_connector_outbox.outbox import Outbox
from django_connector_outbox.posts import State
from tests.test_admin import change_url, make, messages_of, readonly, staff, states

pytestmark = pytest.mark.django_db

RETRY_BUTTON = '<button type="submit" class="outbox-tool">Retry post</button>'
CANCEL_BUTTON = '<button type="submit" class="outbox-tool">Cancel post</button>'
RETRACT_BUTTON = '<button type="submit" class="outbox-tool">Retract post</button>'


def retry_url(post: Post) -> str:
    return reverse("admin:django_connector_outbox_post_retry", args=[post.pk])


def cancel_url(post: Post) -> str:
    return reverse("admin:django_connector_outbox_post_cancel", args=[post.pk])


def buttons(client: Any, post: Post) -> list[str]:
    page = client.get(change_url(post))
    assert page.status_code == 200
    html = page.content.decode()
    shown = (("retry", RETRY_BUTTON), ("cancel", CANCEL_BUTTON), ("retract", RETRACT_BUTTON))
    return [name for name, button in shown if button in html]


# -- the buttons --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        (State.QUEUED, ["cancel"]),
        (State.SENDING, ["retract"]),  # its delete goes out once the send is posted
        (State.POSTED, ["retract"]),
        (State.FAILED, ["retry"]),
        (State.UNCERTAIN, ["retry"]),
        (State.CANCELLED, []),
    ],
)
def test_the_buttons_follow_the_state(admin_client, state, expected):
    assert buttons(admin_client, make(f"p-{state}", state)) == expected


def test_a_failed_post_without_a_body_has_no_retry_button(admin_client):
    failed = make("nobody", State.FAILED)
    Post.objects.filter(pk=failed.pk).update(body=None)
    assert buttons(admin_client, failed) == []


@pytest.mark.parametrize(
    ("codenames", "failed_buttons", "queued_buttons"),
    [
        (["view_post"], [], []),
        (["view_post", "retry_post"], ["retry"], []),
        (["view_post", "cancel_post"], [], ["cancel"]),
        (["view_post", "retry_post", "cancel_post"], ["retry"], ["cancel"]),
    ],
)
def test_the_buttons_need_the_actions_permissions(
    client, django_user_model, codenames, failed_buttons, queued_buttons
):
    client.force_login(staff(django_user_model, *codenames))
    assert buttons(client, make("f", State.FAILED)) == failed_buttons
    assert buttons(client, make("q", State.QUEUED)) == queued_buttons


@pytest.mark.parametrize(("codenames", "url"), [(["view_post"], retry_url), (["view_post", "retry_post"], cancel_url),
                                                (["view_post", "cancel_post"], retry_url), (["retry_post"], retry_url)])  # fmt: skip
def test_a_post_without_the_permission_is_refused(client, django_user_model, codenames, url):
    client.force_login(staff(django_user_model, *codenames))
    post = make("p", State.FAILED if url is retry_url else State.QUEUED)
    before = Post.objects.filter(pk=post.pk).values().get()
    assert client.post(url(post)).status_code == 403
    assert Post.objects.filter(pk=post.pk).values().get() == before
    assert not LogEntry.objects.exists()


def test_a_get_changes_nothing(admin_client):
    post = make("f", State.FAILED)
    response = admin_client.get(retry_url(post))
    assert response.status_code == 405
    assert states(post) == ["failed"]


def test_an_unknown_post_is_not_found(admin_client):
    assert (
        admin_client.post(reverse("admin:django_connector_outbox_post_retry", args=[999_999])).status_code
        == 404
    )


def test_retry_puts_a_failed_post_back_and_returns_to_its_page(admin_client):
    failed = make("f", State.FAILED)
    response = admin_client.post(retry_url(failed))
    assert response.status_code == 302 and response["Location"] == change_url(failed)
    page = admin_client.get(response["Location"])
    assert messages_of(page) == ["1 retried"]
    row = Post.objects.with_claim().get(pk=failed.pk)
    assert (row.current_state, row.attempts) == ("queued", 0)
    assert LogEntry.objects.get(object_id=str(failed.pk)).change_message == (
        "Retried: back to the queue from failed (admin action retry_posts)."
    )
    assert buttons(admin_client, failed) == ["cancel"]  # queued now


def test_retry_of_an_uncertain_post_asks_first(admin_client):
    uncertain = make("u1", State.UNCERTAIN)
    response = admin_client.post(retry_url(uncertain))
    assert response.status_code == 200
    assert response.templates[0].name == "admin/django_connector_outbox/post/retry_confirmation.html"
    page = response.content.decode()
    assert re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", page.split('<p class="outbox-warning">')[1].split("</p>")[0])) == (
        "1 of the selected posts is uncertain: a sender may have delivered it and lost the reply, and could not"
        " check. If it was delivered, retrying will make it appear twice. Look in the source first if you can."
    )  # fmt: skip
    assert f'<a class="button cancel-link" href="{change_url(uncertain)}">No, take me back</a>' in page
    assert states(uncertain) == ["uncertain"]  # nothing yet
    assert not LogEntry.objects.exists()

    # The confirmation form posts back to the button's URL.
    assert '<form method="post">' in page and 'name="confirm" value="yes"' in page
    response = admin_client.post(retry_url(uncertain), {"confirm": "yes"}, follow=True)
    assert response.redirect_chain == [(change_url(uncertain), 302)]
    assert messages_of(response) == ["1 retried"]
    assert states(uncertain) == ["queued"]
    assert LogEntry.objects.get(object_id=str(uncertain.pk)).change_message == (
        "Retried: back to the queue from uncertain (admin action retry_posts). It may appear twice: it was uncertain."
    )


def test_cancel_cancels_a_queued_post(admin_client):
    queued = make("q", State.QUEUED)
    response = admin_client.post(cancel_url(queued), follow=True)
    assert response.redirect_chain == [(change_url(queued), 302)]
    assert messages_of(response) == ["1 cancelled"]
    assert states(queued) == ["cancelled"]
    assert Post.objects.get(pk=queued.pk).body is None
    assert buttons(admin_client, queued) == []


def test_a_button_on_a_post_that_moved_on_meanwhile_says_why_nothing_happened(admin_client):
    # The page was shown while it was queued; a sender took it before the click.
    queued = make("q", State.SENDING)
    response = admin_client.post(cancel_url(queued), follow=True)
    assert messages_of(response) == ["0 cancelled; 1 skipped: only queued posts can be cancelled (1 sending)"]
    assert states(queued) == ["sending"]


# -- attempts, history, empty values --------------------------------------------------------


def field_of(client: Any, post: Post, field: str) -> str:
    return readonly(client.get(change_url(post)).content.decode(), field)


def test_a_post_delivered_on_its_first_try_shows_one_attempt(admin_client):
    outbox = Outbox("memory")
    assert outbox.queue("first", workspace_id="T1", container_id="C1", body={"text": "x"})
    [claim] = outbox.claim()
    assert outbox.posted(claim, "C1:1")
    post = Post.objects.get(post_id="first")
    assert post.attempts == 0  # stored as the contract says
    assert field_of(admin_client, post, "attempts_") == "1"
    listing = admin_client.get(reverse("admin:django_connector_outbox_post_changelist"), {"state": "posted"})
    assert '<td class="field-attempts_">1</td>' in listing.content.decode()


def test_a_post_delivered_after_a_retry_shows_two_attempts_and_its_history(admin_client):
    outbox = Outbox("memory")
    assert outbox.queue("second", workspace_id="T1", container_id="C1", body={"text": "x"})
    [claim] = outbox.claim(worker="host-1:4242")
    assert outbox.retry(claim, after=0, reason="HTTP 503 <Service Unavailable>")
    [claim] = outbox.claim(worker="host-2:99")
    assert outbox.posted(claim, "C1:1")
    post = Post.objects.get(post_id="second")
    assert field_of(admin_client, post, "attempts_") == "2"
    [when] = post.history.values_list("at", flat=True)
    history = field_of(admin_client, post, "history_")
    assert history == (
        '<table class="outbox-history"><thead><tr><th>when</th><th>attempt</th><th>outcome</th>'
        "<th>reason</th><th>worker</th></tr></thead><tbody>"
        f'<tr><td class="nowrap">{timezone.localtime(when):%Y-%m-%d %H:%M:%S %Z}</td><td>1</td><td>retried</td>'
        '<td><pre class="outbox-pre">HTTP 503 &lt;Service Unavailable&gt;</pre></td><td>host-1:4242</td></tr>'
        "</tbody></table>"
    )


def test_each_outcome_of_the_history_is_written_in_the_operators_language(admin_client, clock):
    outbox = Outbox("memory", clock=clock)
    assert outbox.queue("lost", workspace_id="T1", container_id="C1", body={"text": "x"})
    [claim] = outbox.claim()
    assert outbox.leave(claim, reason="reply lost")
    clock.advance(121)  # the lease ends: taken back stale
    [claim] = outbox.claim()
    assert outbox.hold(claim, 0, reason="429")
    post = Post.objects.get(post_id="lost")
    outcomes = re.compile(r"<td>\d+</td><td>([^<]*)</td>")
    assert outcomes.findall(field_of(admin_client, post, "history_")) == ["held", "lost reply"]
    with translation.override("de"):
        german = field_of(admin_client, post, "history_")
    assert outcomes.findall(german) == ["zurückgehalten", "Antwort verloren"]


def test_a_queued_post_shows_no_attempt_and_empty_values_as_the_list(admin_client):
    post = make("fresh", delay=60)
    Post.objects.filter(pk=post.pk).update(message_ref=None, turn_key=None)
    page = admin_client.get(change_url(post)).content.decode()
    assert readonly(page, "attempts_") == "0"
    for field in ("history_", "error", "holder", "lease_until_", "sent_at_", "message_ref", "turn_key"):
        assert readonly(page, field) == "—", field
    assert ">None<" not in page


def test_a_finished_post_shows_no_due_time(admin_client):
    post = make("done", State.POSTED)
    assert field_of(admin_client, post, "due") == "—"  # the list's empty value, not "None"


def test_a_long_history_shows_its_latest_rows(admin_client, clock):
    outbox = Outbox("memory", clock=clock)
    assert outbox.queue("busy", workspace_id="T1", container_id="C1", body={"text": "x"})
    for n in range(52):
        [claim] = outbox.claim()
        assert outbox.hold(claim, 0, reason=f"429 number {n}")
        clock.advance(1)
    post = Post.objects.get(post_id="busy")
    history = field_of(admin_client, post, "history_")
    assert history.count("<tr><td") == 50
    assert "429 number 51" in history and "429 number 2<" in history and "429 number 1<" not in history
    assert history.endswith('<p class="outbox-more">the latest 50 shown</p>')


def test_a_post_being_sent_shows_its_claims_attempt(admin_client):
    post = make("out", State.SENDING, attempts=3, lease_until=timezone.now() + timedelta(seconds=60))
    assert field_of(admin_client, post, "attempts_") == "3"
