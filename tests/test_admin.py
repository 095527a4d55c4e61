"""The operators' console: what the Post changelist shows, its actions and who may use them.

Posts are made through the Outbox API (so lanes and heads are right), then moved to the
state a test needs with the same writes a sender would make: a post is `sending` while its
lane holds a lease on it (its own row still says `queued`), so the lease goes on the lane.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.auth.models import Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_connector_outbox.admin import EstimatingPaginator, OutboxHealth, PostAdmin
from django_connector_outbox.models import Lane, Post
from django_connector_outbox.outbox import Outbox
from django_connector_outbox.posts import State

pytestmark = pytest.mark.django_db
postgresql_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the estimate is PostgreSQL's (DATABASE_URL=postgres://...)"
)
without_estimate = pytest.mark.skipif(
    connection.vendor == "postgresql", reason="PostgreSQL estimates instead of capping"
)

CHANGELIST = reverse("admin:django_connector_outbox_post_changelist")


def change_url(post: Post) -> str:
    return reverse("admin:django_connector_outbox_post_change", args=[post.pk])


def make(
    post_id: str,
    state: str = State.QUEUED,
    *,
    source: str = "memory",
    container: str | None = None,
    thread: str = "",
    kind: str = "message",
    body: dict[str, Any] | None = None,
    delay: float | None = None,
    **fields: Any,
) -> Post:
    """A post in `state`, alone in its container unless `container` is given, read with its
    claim (PostQuerySet.with_claim: `current_state`, `lease_until`, `worker`, `sent_at`, ...).

    `sending`: a claim's lease on its lane, as Outbox.claim writes it (the post must be its
    container's head); `fields` named in LEASE go to the lane, the others to the post."""
    outbox = Outbox(source)
    body = body if body is not None else {"text": f"text of {post_id}"}
    place = dict(workspace_id="T1", container_id=container or f"C-{post_id}", thread_id=thread)
    if kind == "status":
        outbox.set_status(post_id, body=body, **place)
    else:
        assert outbox.queue(post_id, kind=kind, body=body, delay=delay, **place)
    post = Post.objects.get(source=source, post_id=post_id)
    now = timezone.now()
    if state == State.SENDING:
        lease = dict(attempts=1, worker="host-1:4242", lease_token="t" * 32, lease_until=now + timedelta(seconds=120),
                     sent_at=now)  # fmt: skip
        lease.update({name: fields.pop(name) for name in LEASE if name in fields})
        lease["due_at"] = lease.pop("lease_until")  # a leased lane is due when its lease ends
        assert Lane.objects.filter(pk=post.lane_id, head=post, lease_token="").update(**lease) == 1
        Post.objects.filter(pk=post.pk).update(**fields)
        return Post.objects.with_claim().get(pk=post.pk)
    changes: dict[str, Any] = {
        State.QUEUED: {},
        State.POSTED: dict(body=None, message_ref=f"{place['container_id']}:1700000000.0001"),
        State.FAILED: dict(attempts=5, last_error="channel_not_found"),
        State.UNCERTAIN: dict(attempts=1, last_error="cannot check: ephemeral"),
        State.CANCELLED: dict(body=None),
    }[state]
    changes.update(fields)
    Post.objects.filter(pk=post.pk).update(state=state, updated_at=now, **changes)
    if state != State.QUEUED:
        Lane.objects.filter(pk=post.lane_id).refresh_heads()
    return Post.objects.with_claim().get(pk=post.pk)


# What make() puts on the lane of a post that is sending: the claim's.
LEASE = ("attempts", "worker", "lease_token", "lease_until", "sent_at")


def one_of_each() -> dict[str, Post]:
    return {state: make(f"p-{state}", state) for state in State}


def listed(response: Any) -> set[str]:
    assert response.status_code == 200
    return {post.post_id for post in response.context["cl"].result_list}


def messages_of(response: Any) -> list[str]:
    return [str(message) for message in response.context["messages"]]


def act(client: Any, action: str, posts: list[Post], **extra: str) -> Any:
    """Run an action from the list of all states (the default list hides posted and cancelled)."""
    data = {"action": action, "_selected_action": [post.pk for post in posts], **extra}
    return client.post(f"{CHANGELIST}?state=all", data, follow=True)


def states(*posts: Post) -> list[str]:
    """Their real states: `sending` read from their lanes' leases."""
    return [Post.objects.with_claim().get(pk=post.pk).current_state for post in posts]


def row_and_lane(post: Post) -> tuple[dict[str, Any], dict[str, Any]]:
    """A post's row and its lane's, as stored: what an action must leave alone."""
    return Post.objects.filter(pk=post.pk).values().get(), Lane.objects.filter(pk=post.lane_id).values().get()


def readonly(page: str, field: str) -> str:
    """The text a read-only field of a change page shows."""
    match = re.search(rf'<div class="[^"]*field-{field}\b.*?<div class="readonly">(.*?)</div>', page, re.S)
    assert match, field
    return match[1].strip()


def staff(django_user_model: Any, *codenames: str) -> Any:
    user = django_user_model.objects.create_user("operator", password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="django_connector_outbox", codename__in=codenames)
    )
    return user


# -- the list ---------------------------------------------------------------------------


def test_default_view_lists_what_needs_attention(admin_client):
    one_of_each()
    assert listed(admin_client.get(CHANGELIST)) == {"p-queued", "p-sending", "p-failed", "p-uncertain"}


@pytest.mark.parametrize("state", list(State))
def test_a_state_filter_shows_that_state(admin_client, state):
    one_of_each()
    assert listed(admin_client.get(CHANGELIST, {"state": state})) == {f"p-{state}"}


def test_all_states(admin_client):
    one_of_each()
    assert len(listed(admin_client.get(CHANGELIST, {"state": "all"}))) == 6


def test_source_and_kind_filters(admin_client):
    make("a-memory")
    make("b-other", source="other")
    make("c-reaction", kind="reaction", body={"name": "eyes", "timestamp": "1.2"})
    assert listed(admin_client.get(CHANGELIST, {"source": "other"})) == {"b-other"}
    assert listed(admin_client.get(CHANGELIST, {"kind": "reaction"})) == {"c-reaction"}
    assert listed(admin_client.get(CHANGELIST, {"source": "memory", "kind": "message"})) == {"a-memory"}


def test_date_range_filters(admin_client):
    old = make("old")
    new = make("new")
    long_ago = timezone.now() - timedelta(days=10)
    Post.objects.filter(pk=old.pk).update(queued_at=long_ago, updated_at=long_ago)
    since = (timezone.now() - timedelta(days=1)).date().isoformat()
    assert listed(admin_client.get(CHANGELIST, {"queued_at__range__gte": since})) == {new.post_id}
    until = (timezone.now() - timedelta(days=5)).date().isoformat()
    params = {"updated_at__range__lte_0": until, "updated_at__range__lte_1": "00:00:00"}
    assert listed(admin_client.get(CHANGELIST, params)) == {old.post_id}


@pytest.mark.parametrize(
    ("term", "expected"),
    [("find-me", {"find-me"}), ("C-42", {"in-c42"}), ("1700.5", {"in-thread"}), ("C9:99.1", {"with-ref"})],
)
def test_search_by_post_id_container_thread_and_message_ref(admin_client, term, expected):
    make("find-me")
    make("in-c42", container="C-42")
    make("in-thread", thread="1700.5")
    make("with-ref", State.FAILED, message_ref="C9:99.1")
    assert listed(admin_client.get(CHANGELIST, {"q": term})) == expected
    assert listed(admin_client.get(CHANGELIST, {"q": term, "state": "all"})) == expected


def test_a_search_for_a_post_id_or_a_container_does_not_look_at_threads_or_refs(admin_client):
    make("by-id")
    make("in-c7", container="C7")
    for term, expected in (("by-id", {"by-id"}), ("C7", {"in-c7"})):
        with CaptureQueriesContext(connection) as captured:
            assert listed(admin_client.get(CHANGELIST, {"q": term, "state": "all"})) == expected
        assert not [sql for sql in post_queries(captured) if 'thread_id" =' in sql or 'message_ref" =' in sql]


def test_a_search_finds_a_thread_and_the_post_that_started_it(admin_client):
    # Discord: a thread started from a message has that message's id.
    make("parent", State.POSTED, message_ref="1180000000000000001")
    make("reply", thread="1180000000000000001")
    assert listed(admin_client.get(CHANGELIST, {"q": "1180000000000000001", "state": "all"})) == {
        "parent",
        "reply",
    }


def test_a_search_finds_a_post_of_a_source_no_longer_configured(admin_client, settings):
    make("orphan", State.FAILED, source="other")
    settings.CONNECTOR_OUTBOX = {"CONNECTORS": {"memory": settings.CONNECTOR_OUTBOX["CONNECTORS"]["memory"]}}
    assert listed(admin_client.get(CHANGELIST, {"q": "orphan"})) == {"orphan"}


def test_columns(admin_client):
    make("cols", State.FAILED, thread="1700.5", last_error="channel_not_found: the channel is gone")
    post = Post.objects.get(post_id="cols")
    page = admin_client.get(CHANGELIST).content.decode()
    updated = f"{timezone.localtime(post.updated_at):%Y-%m-%d %H:%M:%S %Z}"
    for text in (
        "cols",
        "memory",
        "message",
        "failed",
        "T1 / C-cols › 1700.5",
        "channel_not_found: the",
        updated,
    ):
        assert text in page
    assert "Show counts" not in page  # facets would count the table once per filter choice


def post_queries(captured: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in captured.captured_queries if "django_connector_outbox_post" in q["sql"]]


def analyze_posts() -> None:
    """Fresh statistics, as autovacuum keeps them: PostgreSQL's estimate reads them."""
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE django_connector_outbox_post")


def test_under_the_cap_the_count_is_exact(admin_client):
    for n in range(3):
        make(f"few-{n}")
    response = admin_client.get(CHANGELIST)
    cl = response.context["cl"]
    assert cl.full_result_count is None  # show_full_result_count = False: no count of the table
    assert cl.result_count == 3
    assert not cl.paginator.estimated
    assert "3 posts" in response.content.decode()


@without_estimate
def test_over_the_cap_the_count_stops_at_the_cap(admin_client, monkeypatch):
    for n in range(4):
        make(f"many-{n}")
    monkeypatch.setattr(EstimatingPaginator, "cap", 2)
    response = admin_client.get(CHANGELIST)
    cl = response.context["cl"]
    assert cl.result_count == 3  # counting stopped at cap + 1
    assert not cl.paginator.estimated
    assert "more than 2 posts" in response.content.decode()


@postgresql_only
def test_over_the_cap_the_list_shows_postgresqls_estimate(admin_client, monkeypatch):
    for n in range(6):
        make(f"many-{n}")
    analyze_posts()
    monkeypatch.setattr(EstimatingPaginator, "cap", 2)
    with CaptureQueriesContext(connection) as captured:
        response = admin_client.get(CHANGELIST)
    cl = response.context["cl"]
    assert cl.paginator.estimated
    assert cl.result_count == 6  # the planner's figure, exact here with fresh statistics
    assert "about 6 posts (estimated" in response.content.decode()
    # The list counted nothing (the header's counts, capped at 10,000, are its own).
    assert not [sql for sql in post_queries(captured) if "COUNT(" in sql and "LIMIT 3)" in sql]
    assert len(listed(response)) == 6


@pytest.mark.parametrize(("count", "shown"), [(6, "6"), (19_533, "20,000"), (1_000_017, "1,000,000")])
def test_an_estimate_is_shown_to_two_significant_figures(count, shown):
    paginator = EstimatingPaginator(Post.objects.none(), 50)
    paginator.estimated = True
    paginator.count = count  # what the estimate said (count is a cached property)
    assert paginator.count_display == shown


@postgresql_only
def test_a_search_under_the_cap_counts_with_its_page_in_one_query_on_postgresql(admin_client):
    for n in range(3):
        make(f"few-{n}", thread="T-7")
    analyze_posts()
    with CaptureQueriesContext(connection) as captured:
        response = admin_client.get(CHANGELIST, {"state": "all", "q": "T-7"})  # a thread id: no index
    assert response.context["cl"].result_count == 3
    assert not response.context["cl"].paginator.estimated
    lists = [sql for sql in post_queries(captured) if sql.startswith("SELECT") and "LIMIT 50" in sql]
    assert len(lists) == 1 and "OVER ()" in lists[0]  # the page and its count, nothing else
    assert len(listed(response)) == 3


@postgresql_only
def test_a_filter_under_the_cap_counts_apart_from_its_page_on_postgresql(admin_client):
    # With a window over a filter, the planner walked the whole newest-first index to count.
    for n in range(3):
        make(f"few-{n}")
    analyze_posts()
    with CaptureQueriesContext(connection) as captured:
        response = admin_client.get(CHANGELIST, {"state": "all"})
    assert response.context["cl"].result_count == 3
    assert not response.context["cl"].paginator.estimated
    assert not [sql for sql in post_queries(captured) if "OVER ()" in sql]
    assert len(listed(response)) == 3


@pytest.mark.parametrize("page", [1, 2, 3])
def test_pages_list_the_newest_changes_first(admin_client, monkeypatch, page):
    posts = [make(f"paged-{n}") for n in range(5)]
    now = timezone.now()
    for n, post in enumerate(posts):  # paged-4 changed last
        Post.objects.filter(pk=post.pk).update(updated_at=now - timedelta(minutes=10 - n))
    monkeypatch.setattr(PostAdmin, "list_per_page", 2)
    response = admin_client.get(CHANGELIST, {"p": page})
    assert [post.post_id for post in response.context["cl"].result_list] == [
        f"paged-{n}" for n in (4, 3, 2, 1, 0)[(page - 1) * 2 : page * 2]
    ]
    assert response.context["cl"].result_count == 5


def test_pages_stop_at_the_cap(admin_client, monkeypatch):
    for n in range(6):
        make(f"deep-{n}")
    if connection.vendor == "postgresql":
        analyze_posts()
    monkeypatch.setattr(PostAdmin, "list_per_page", 1)
    monkeypatch.setattr(EstimatingPaginator, "cap", 2)
    assert len(listed(admin_client.get(CHANGELIST, {"p": 3}))) == 1  # up to cap + 1 rows
    response = admin_client.get(CHANGELIST, {"p": 4})
    assert response.status_code == 302 and "e=1" in response["Location"]  # Django's "invalid page"


# -- the header -------------------------------------------------------------------------


def test_header_counts_per_state(admin_client):
    one_of_each()
    make("p-failed-2", State.FAILED)
    health = admin_client.get(CHANGELIST).context["outbox_health"]
    counts = {row["state"]: row["count"] for row in health.states}
    assert counts == {
        "queued": "1",
        "sending": "1",
        "posted": "1",
        "failed": "2",
        "uncertain": "1",
        "cancelled": "1",
    }
    assert {row["state"] for row in health.states if row["alert"]} == {"failed", "uncertain"}


def test_header_counts_are_capped(admin_client, monkeypatch):
    for n in range(3):
        make(f"f-{n}", State.FAILED)
    monkeypatch.setattr(OutboxHealth, "cap", 2)
    response = admin_client.get(CHANGELIST)
    counts = {row["state"]: row["count"] for row in response.context["outbox_health"].states}
    assert counts["failed"] == "2+"
    assert counts["queued"] == "0"


def test_header_oldest_due_post_per_source(admin_client):
    oldest = make("waiting-long")
    make("waiting-less")
    make("later", delay=600)
    Post.objects.filter(pk=oldest.pk).update(queued_at=timezone.now() - timedelta(minutes=5))
    response = admin_client.get(CHANGELIST)
    rows = {row["source"]: row for row in response.context["outbox_health"].sources}
    assert rows["memory"]["post_id"] == "waiting-long"
    assert rows["memory"]["age"].startswith("5\xa0minutes")
    assert rows["other"]["post_id"] is None
    page = response.content.decode()
    assert "nothing due" in page and "waiting 5\xa0minutes" in page


# -- holds ------------------------------------------------------------------------------


def test_a_held_head_shows_until_when_and_why_and_the_rest_wait_behind_it(admin_client):
    outbox = Outbox("memory")
    outbox.queue("head", workspace_id="T1", container_id="C1", body={"text": "first"})
    outbox.queue("behind", workspace_id="T1", container_id="C1", body={"text": "second"})
    [claim] = outbox.claim(worker="w1")
    assert outbox.hold(claim, 90, reason="rate_limited (Retry-After 90)")
    head = Post.objects.get(post_id="head")
    response = admin_client.get(CHANGELIST)
    page = response.content.decode()
    until = f"{timezone.localtime(head.next_at):%Y-%m-%d %H:%M:%S %Z}"
    assert f"held until {until}: rate_limited (Retry-After 90)" in page
    assert f'waits behind <a href="{change_url(head)}">head</a> (queued)' in page


def test_a_sending_post_shows_its_sender_and_lease(admin_client):
    post = make("in-flight", State.SENDING)
    page = admin_client.get(CHANGELIST).content.decode()
    assert f"sending by host-1:4242 until {timezone.localtime(post.lease_until):%Y-%m-%d %H:%M:%S %Z}" in page


def test_a_claimed_post_is_sending_with_its_lanes_claim(admin_client):
    # Through Outbox.claim, not make(): the lease the admin reads is the one a sender writes.
    outbox = Outbox("memory")
    outbox.queue("claimed", workspace_id="T1", container_id="C1", body={"text": "hi"})
    outbox.queue("next", workspace_id="T1", container_id="C1", body={"text": "then"})
    [claim] = outbox.claim(worker="sender-9:77")
    assert Post.objects.get(post_id="claimed").state == State.QUEUED  # its row: the lease is on the lane
    page = admin_client.get(CHANGELIST).content.decode()
    until = f"{timezone.localtime(claim.lease_until):%Y-%m-%d %H:%M:%S %Z}"
    assert f"sending by sender-9:77 until {until}" in page
    assert '<span class="outbox-state outbox-state-sending">sending</span>' in page
    claimed = Post.objects.get(post_id="claimed")
    assert f'waits behind <a href="{change_url(claimed)}">claimed</a> (sending)' in page
    assert listed(admin_client.get(CHANGELIST, {"state": "sending"})) == {"claimed"}
    assert listed(admin_client.get(CHANGELIST, {"state": "queued"})) == {"next"}
    health = admin_client.get(CHANGELIST).context["outbox_health"]
    counts = {row["state"]: row["count"] for row in health.states}
    assert (counts["queued"], counts["sending"]) == ("1", "1")


def test_a_sending_post_shows_the_attempt_of_its_claim(admin_client):
    make("retried", State.SENDING, attempts=3)  # the lane's: the claim's attempt, counting this one
    make("waiting")
    assert Post.objects.get(post_id="retried").attempts == 0  # its row counts tries up to its last finish
    page = admin_client.get(CHANGELIST).content.decode()
    assert '<td class="field-attempts_">3</td>' in page
    assert '<td class="field-attempts_">0</td>' in page  # the queued one


def test_a_stale_lease_says_it_is_to_be_taken_back(admin_client):
    post = make("stale", State.SENDING, worker="gone:1", lease_until=timezone.now() - timedelta(seconds=5))
    page = admin_client.get(CHANGELIST).content.decode()
    until = f"{timezone.localtime(post.lease_until):%Y-%m-%d %H:%M:%S %Z}"
    assert f"lease of gone:1 ended {until}: to be taken back" in page


def test_a_finished_post_has_no_holder_lease_or_send_time(admin_client):
    # The claim is the lane's: once finished, the lane has moved on and the post keeps none of it.
    outbox = Outbox("memory")
    outbox.queue("done", workspace_id="T1", container_id="C1", body={"text": "hi"})
    [claim] = outbox.claim(worker="sender-9:77")
    assert outbox.posted(claim, "C1:1.1")
    page = admin_client.get(change_url(Post.objects.get(post_id="done"))).content.decode()
    assert "sender-9:77" not in page
    # Empty, as the list shows an empty value (PostAdmin.empty_value_display).
    for field in ("holder", "lease_until_", "sent_at_", "due"):
        assert readonly(page, field) == "—", field
    assert "None" not in page
    assert "not in the queue" in page


def test_the_list_costs_the_same_queries_however_many_posts_are_sending(admin_client):
    def page_with(numbers):
        for n in numbers:
            make(f"s{n}", State.SENDING, container=f"C{n}")
            make(f"w{n}", container=f"C{n}")  # waits behind it
        with CaptureQueriesContext(connection) as captured:
            response = admin_client.get(CHANGELIST)
        page = response.content.decode()
        return len(captured), page.count('outbox-state-sending">sending'), page.count("waits behind")

    few = page_with(range(2))
    many = page_with(range(2, 12))
    assert few == (few[0], 2, 2)
    assert many == (few[0], 12, 12)


def test_a_delayed_post_is_due_at_its_time(admin_client):
    post = make("delayed", delay=3600)
    page = admin_client.get(CHANGELIST).content.decode()
    assert f"due at {timezone.localtime(post.next_at):%Y-%m-%d %H:%M:%S %Z}" in page


# -- the detail page --------------------------------------------------------------------


def test_detail_page_is_read_only_and_complete(admin_client):
    post = make("detail", State.SENDING, turn_key="turn-7", message_ref="C1:1.1", last_error="timeout")
    response = admin_client.get(change_url(post))
    assert response.status_code == 200
    page = response.content.decode()
    assert 'name="_save"' not in page and 'name="_continue"' not in page
    assert 'name="post_id"' not in page and "<textarea" not in page  # no field is editable
    for text in ("detail", "turn-7", "C1:1.1", "timeout", "host-1:4242", "Lease until", "Sent at", "Next at",
                 "Queued at", "Updated at", "Rev", "Attempts", "head of its container: being sent",
                 '<span class="outbox-state outbox-state-sending">sending</span>'):  # fmt: skip
        assert text in page, text
    for moment in (
        post.lease_until,
        post.sent_at,
        post.queued_at,
        post.next_at,
        post.created_at,
        post.updated_at,
    ):
        assert f"{timezone.localtime(moment):%Y-%m-%d %H:%M:%S %Z}" in page
    assert "t" * 32 not in page  # the lease token is internal


def test_body_is_pretty_printed_and_escaped(admin_client):
    post = make(
        "xss", State.FAILED, body={"text": "<script>alert('x')</script>", "blocks": [{"type": "section"}]}
    )
    page = admin_client.get(change_url(post)).content.decode()
    assert "<script>alert(" not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert "  &quot;blocks&quot;: [\n    {\n      &quot;type&quot;: &quot;section&quot;" in page


def test_a_dropped_body_says_so(admin_client):
    post = make("gone", State.POSTED)
    assert (
        "dropped once the post was delivered or cancelled"
        in admin_client.get(change_url(post)).content.decode()
    )


def test_nobody_adds_or_edits(admin_client):
    post = make("ro", State.FAILED)
    assert admin_client.get(reverse("admin:django_connector_outbox_post_add")).status_code == 403
    response = admin_client.post(change_url(post), {"post_id": "changed", "state": "queued", "_save": "Save"})
    assert response.status_code == 403
    assert Post.objects.get(pk=post.pk).post_id == "ro"


# -- cancel_posts -----------------------------------------------------------------------


def test_cancel_mixed_selection(admin_client, admin_user):
    queued = [make("q1"), make("q2")]
    sending = make("s1", State.SENDING)
    posted = [make("d1", State.POSTED), make("d2", State.POSTED)]
    before = row_and_lane(sending)
    response = act(admin_client, "cancel_posts", [*queued, sending, *posted])
    assert messages_of(response) == [
        "2 cancelled; 3 skipped: only queued posts can be cancelled (1 sending, 2 posted)"
    ]
    assert states(*queued) == ["cancelled", "cancelled"]
    assert row_and_lane(sending) == before  # never touched, nor its lease
    assert states(sending) == ["sending"]
    assert states(*posted) == ["posted", "posted"]
    assert Post.objects.get(pk=queued[0].pk).body is None  # as cancel_queued does
    entries = LogEntry.objects.filter(action_flag=CHANGE)
    # As a set: object ids are text ("100" sorts before "99").
    assert {(e.object_id, e.user_id, e.change_message) for e in entries} == {
        (str(post.pk), admin_user.pk, "Cancelled (admin action cancel_posts).") for post in queued
    }
    assert len(entries) == len(queued)


def test_cancel_all_queued(admin_client):
    response = act(admin_client, "cancel_posts", [make("only")])
    assert messages_of(response) == ["1 cancelled"]


def test_cancelling_a_head_moves_the_container_on(admin_client):
    head = make("h", container="C1")
    nxt = make("n", container="C1")
    act(admin_client, "cancel_posts", [head])
    assert Lane.objects.get(pk=head.lane_id).head_id == nxt.pk


# -- retry_posts ------------------------------------------------------------------------


def test_retry_failed_posts_and_skip_the_rest(admin_client, admin_user):
    failed = [make("f1", State.FAILED), make("f2", State.FAILED)]
    sending = make("s1", State.SENDING)
    queued = make("q1")
    posted = make("d1", State.POSTED)
    before = row_and_lane(sending)
    response = act(admin_client, "retry_posts", [*failed, sending, queued, posted])
    assert messages_of(response) == [
        "2 retried; 3 skipped: only failed and uncertain posts can be retried (1 queued, 1 sending, 1 posted)"
    ]
    for post in failed:
        row = Post.objects.get(pk=post.pk)
        assert (row.state, row.attempts, row.body) == ("queued", 0, {"text": f"text of {post.post_id}"})
        assert row.queued_at > post.queued_at and row.next_at == row.queued_at
        assert row.last_error == "channel_not_found"  # kept: why it had stopped
        assert Lane.objects.get(pk=row.lane_id).head_id == row.pk
    assert row_and_lane(sending) == before
    assert states(sending, queued, posted) == ["sending", "queued", "posted"]
    assert LogEntry.objects.filter(action_flag=CHANGE, user=admin_user).count() == 2


def test_a_retried_post_goes_to_the_back_of_its_container(admin_client):
    failed = make("f", State.FAILED, container="C1")
    waiting = make("w", container="C1")
    act(admin_client, "retry_posts", [failed])
    lane = Lane.objects.get(pk=failed.lane_id)
    assert lane.head_id == waiting.pk
    assert Post.objects.get(pk=failed.pk).queued_at > Post.objects.get(pk=waiting.pk).queued_at
    page = admin_client.get(CHANGELIST).content.decode()
    assert f'waits behind <a href="{change_url(waiting)}">w</a> (queued)' in page


def test_retry_behind_a_sending_head_waits_for_it(admin_client):
    sending = make("s", State.SENDING, container="C1")
    failed = make("f", State.FAILED, container="C1")
    act(admin_client, "retry_posts", [failed])
    assert Lane.objects.get(pk=sending.lane_id).head_id == sending.pk
    assert states(sending, failed) == ["sending", "queued"]


def test_retry_uncertain_asks_first(admin_client, admin_user):
    uncertain = make("u1", State.UNCERTAIN)
    failed = make("f1", State.FAILED)
    posted = make("d1", State.POSTED)
    response = act(admin_client, "retry_posts", [uncertain, failed, posted])
    assert response.status_code == 200
    assert [t.name for t in response.templates][
        0
    ] == "admin/django_connector_outbox/post/retry_confirmation.html"
    page = response.content.decode()
    assert "appear twice" in page and "u1" in page and "1 failed post of the selection" in page
    assert "1 posted" in page
    assert states(uncertain, failed, posted) == ["uncertain", "failed", "posted"]  # nothing yet
    assert not LogEntry.objects.exists()

    response = act(admin_client, "retry_posts", [uncertain, failed, posted], confirm="yes")
    assert messages_of(response) == [
        "2 retried; 1 skipped: only failed and uncertain posts can be retried (1 posted)"
    ]
    assert states(uncertain, failed, posted) == ["queued", "queued", "posted"]
    message = LogEntry.objects.get(object_id=str(uncertain.pk)).change_message
    assert message == (
        "Retried: back to the queue from uncertain (admin action retry_posts)."
        " It may appear twice: it was uncertain."
    )


def test_the_confirmation_form_posts_back_to_the_action(admin_client):
    uncertain = make("u1", State.UNCERTAIN)
    page = act(admin_client, "retry_posts", [uncertain]).content.decode()
    assert f'name="_selected_action" value="{uncertain.pk}"' in page
    assert 'name="action" value="retry_posts"' in page and 'name="confirm" value="yes"' in page
    assert 'name="index"' not in page


def test_retry_without_a_body_is_skipped(admin_client):
    failed = make("nobody", State.FAILED, body={"text": "x"})
    Post.objects.filter(pk=failed.pk).update(body=None)
    response = act(admin_client, "retry_posts", [failed])
    assert messages_of(response) == [
        "0 retried; 1 skipped: only failed and uncertain posts can be retried (1 without a body)"
    ]


def test_requeue_changes_only_failed_and_uncertain_posts():
    outbox = Outbox("memory")
    for state in State:
        make(f"r-{state}", state)
    moved = {state.value: outbox.requeue(f"r-{state}") for state in State}
    assert moved == {
        "queued": False, "sending": False, "posted": False,
        "failed": True, "uncertain": True, "cancelled": False,
    }  # fmt: skip
    assert not outbox.requeue("no-such-post")
    assert not Outbox("other").requeue("r-failed")  # another source's outbox sees none of these


def test_requeue_a_status_keeps_its_ref_and_rev():
    post = make("st", State.FAILED, kind="status", message_ref="C1:1.1", rev=3)
    assert Outbox("memory").requeue("st")
    row = Post.objects.get(pk=post.pk)
    assert (row.state, row.message_ref, row.rev, row.kind) == ("queued", "C1:1.1", 3, "status")


# -- delete -----------------------------------------------------------------------------


def test_delete_only_finished_posts(admin_client):
    active = make("active")
    done = make("done", State.POSTED)
    delete = "admin:django_connector_outbox_post_delete"
    assert admin_client.get(reverse(delete, args=[active.pk])).status_code == 403
    assert admin_client.get(reverse(delete, args=[done.pk])).status_code == 200
    assert 'class="deletelink"' not in admin_client.get(change_url(active)).content.decode()
    response = admin_client.post(reverse(delete, args=[done.pk]), {"post": "yes"}, follow=True)
    assert response.status_code == 200
    assert not Post.objects.filter(pk=done.pk).exists()


def test_bulk_delete_skips_active_posts(admin_client):
    queued = make("q")
    sending = make("s", State.SENDING)
    posted = make("d", State.POSTED)
    failed = make("f", State.FAILED)
    response = act(admin_client, "delete_selected", [queued, sending, posted, failed])
    assert response.status_code == 200
    assert messages_of(response) == ["2 skipped: only finished posts can be deleted (1 queued, 1 sending)"]
    confirmation = response.content.decode()
    assert f'value="{posted.pk}"' in confirmation and f'value="{failed.pk}"' in confirmation
    assert f'value="{queued.pk}"' not in confirmation and f'value="{sending.pk}"' not in confirmation

    response = act(admin_client, "delete_selected", [posted, failed], post="yes")
    assert messages_of(response) == ["Successfully deleted 2 posts."]
    assert set(Post.objects.values_list("post_id", flat=True)) == {"q", "s"}
    assert LogEntry.objects.filter(action_flag=DELETION).count() == 2


def test_bulk_delete_of_active_posts_only_deletes_nothing(admin_client):
    queued = make("q")
    response = act(admin_client, "delete_selected", [queued])
    assert messages_of(response) == ["1 skipped: only finished posts can be deleted (1 queued)"]
    assert Post.objects.filter(pk=queued.pk).exists()


# -- permissions ------------------------------------------------------------------------


def test_a_user_who_is_not_staff_gets_nothing(client, django_user_model):
    user = django_user_model.objects.create_user("someone", password="pw")
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="django_connector_outbox"))
    client.force_login(user)
    post = make("p", State.FAILED)
    for url in (CHANGELIST, change_url(post)):
        response = client.get(url)
        assert response.status_code == 302 and "/login/" in response["Location"]
    response = act(client, "retry_posts", [post])
    assert states(post) == ["failed"]


def test_staff_with_only_the_view_permission_sees_but_cannot_act(client, django_user_model):
    client.force_login(staff(django_user_model, "view_post"))
    queued = make("q")
    failed = make("f", State.FAILED)
    posted = make("d", State.POSTED)
    response = client.get(CHANGELIST)
    assert listed(response) == {"q", "f"}
    assert response.context["action_form"] is None
    assert 'name="_selected_action"' not in response.content.decode()
    assert client.get(change_url(failed)).status_code == 200
    for action in ("cancel_posts", "retract_posts", "retry_posts", "delete_selected"):
        response = act(client, action, [queued, failed, posted])
    assert states(queued, failed, posted) == ["queued", "failed", "posted"]
    assert (
        client.get(reverse("admin:django_connector_outbox_post_delete", args=[posted.pk])).status_code == 403
    )


def test_staff_without_the_cancel_permission_can_neither_see_nor_run_cancel(client, django_user_model):
    client.force_login(staff(django_user_model, "view_post", "retry_post"))
    queued = make("q")
    response = client.get(CHANGELIST)
    choices = [name for name, _ in response.context["action_form"].fields["action"].choices]
    assert "retry_posts" in choices and "cancel_posts" not in choices
    response = act(client, "cancel_posts", [queued])
    assert states(queued) == ["queued"]
    assert messages_of(response) == ["No action selected."]


def test_staff_with_the_cancel_permission_cancels(client, django_user_model):
    client.force_login(staff(django_user_model, "view_post", "cancel_post"))
    queued = make("q")
    failed = make("f", State.FAILED)
    choices = [name for name, _ in client.get(CHANGELIST).context["action_form"].fields["action"].choices]
    assert "cancel_posts" in choices and "retry_posts" not in choices
    assert messages_of(act(client, "cancel_posts", [queued])) == ["1 cancelled"]
    act(client, "retry_posts", [failed])
    assert states(queued, failed) == ["cancelled", "failed"]


def test_staff_without_the_view_permission_is_refused(client, django_user_model):
    client.force_login(staff(django_user_model, "cancel_post", "retry_post"))
    queued = make("q")
    assert client.get(CHANGELIST).status_code == 403
    act(client, "cancel_posts", [queued])
    assert states(queued) == ["queued"]
