"""The admin shows what a wider hold keeps waiting: the post's "due / held until", and the holds.

The list reads the holds over its page's places in one query, however many rows are held.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_connector_outbox import Outbox
from django_connector_outbox.models import Gate, Post
from django_connector_outbox.posts import Action, Finish

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:django_connector_outbox_post_changelist")


def when(moment):
    return f"{timezone.localtime(moment):%Y-%m-%d %H:%M:%S %Z}"


def queue(outbox, post_id, workspace_id, container_id):
    assert outbox.queue(post_id, workspace_id=workspace_id, container_id=container_id, body={"text": post_id})


def announce(outbox, claim, after, reason):
    """Posted, with a wait the platform announced: its container is held (a gate)."""
    wait = Finish(
        claim.post_id, claim.lease_token, Action.POSTED, wait=after, reason=reason, scope="container"
    )
    assert outbox.finish_many([(claim, wait)]) != [None]


def gate_queries(captured):
    return [q["sql"] for q in captured.captured_queries if Gate._meta.db_table in q["sql"]]


def test_a_post_of_a_held_workspace_shows_until_when_and_why(admin_client):
    outbox = Outbox("memory")
    for post_id, container in (("a1", "C1"), ("a2", "C2")):
        outbox.queue(post_id, workspace_id="T1", container_id=container, body={"text": post_id})
    first, second = outbox.claim()
    outbox.posted(second)
    outbox.queue("a3", workspace_id="T1", container_id="C2", body={"text": "a3"})
    outbox.hold(first, 600, "429 on chat.postMessage in 2 channels", scope="workspace")

    page = admin_client.get(CHANGELIST).content.decode()
    assert page.count("with its workspace: 429 on chat.postMessage in 2 channels") == 2  # a1 and a3

    holds = admin_client.get(reverse("admin:django_connector_outbox_gate_changelist")).content.decode()
    assert "429 on chat.postMessage in 2 channels" in holds
    assert "T1" in holds


def test_each_held_row_says_which_hold_ends_last_and_why_from_one_query_for_the_page(admin_client):
    memory, other = Outbox("memory"), Outbox("other")
    for post_id, workspace_id, container_id in [
        ("w1", "T1", "C1"),
        ("x1", "T1", "C2"),
        ("c1", "T2", "C3"),
        ("p1", "T3", "C4"),
    ]:
        queue(memory, post_id, workspace_id, container_id)
    queue(other, "o1", "T9", "C9")
    claims = {c.post_id: c for c in memory.claim()} | {c.post_id: c for c in other.claim()}
    announce(memory, claims["x1"], 900, "bucket of C2 empty")
    announce(memory, claims["c1"], 300, "bucket of C3 empty")
    assert memory.hold(claims["w1"], 600, "429 of team T1", scope="workspace")
    assert memory.hold(claims["p1"], 120, "429 of channel C4")  # the post waits; no place is held
    assert other.hold(claims["o1"], 60, "global rate limit", scope="source")
    for post_id, workspace_id, container_id in [("x2", "T1", "C2"), ("c2", "T2", "C3"), ("p2", "T3", "C4")]:
        queue(memory, post_id, workspace_id, container_id)
    queue(other, "o2", "T8", "C8")
    until = {(g.source, g.scope, g.workspace_id): when(g.held_until) for g in Gate.objects.all()}

    with CaptureQueriesContext(connection) as captured:
        page = admin_client.get(CHANGELIST).content.decode()

    assert len(gate_queries(captured)) == 1  # not one per held row
    p1 = Post.objects.get(post_id="p1")
    expected = {
        "w1": f"held until {until['memory', 'workspace', 'T1']} with its workspace: 429 of team T1",
        # the container's wait ends after its workspace's hold: the later one is why it waits
        "x2": f"held until {until['memory', 'container', 'T1']} with its container: bucket of C2 empty",
        "c2": f"held until {until['memory', 'container', 'T2']} with its container: bucket of C3 empty",
        "p1": f"held until {when(p1.next_at)}: 429 of channel C4",
        "p2": f'waits behind <a href="{reverse("admin:django_connector_outbox_post_change", args=[p1.pk])}">p1</a> (queued)',
        "o1": f"held until {until['other', 'source', '']} with its source: global rate limit",
        "o2": f"held until {until['other', 'source', '']} with its source: global rate limit",
    }
    for post_id, text in expected.items():
        assert text in page, post_id
    assert page.count("with its source: global rate limit") == 2


def test_the_list_reads_the_holds_once_however_many_rows_are_held(admin_client):
    outbox = Outbox("memory")

    def hold_workspaces(numbers):
        for n in numbers:
            queue(outbox, f"h{n}", f"T{n}", "C1")
            queue(outbox, f"b{n}", f"T{n}", "C2")  # a head of its own, held with its workspace
        for claim in outbox.claim():
            assert outbox.hold(claim, 600, f"429 of team {claim.workspace_id}", scope="workspace")

    def queries():
        with CaptureQueriesContext(connection) as captured:
            response = admin_client.get(CHANGELIST)
        assert response.status_code == 200
        return (
            len(captured),
            len(gate_queries(captured)),
            response.content.decode().count("with its workspace"),
        )

    hold_workspaces(range(2))
    few = queries()
    hold_workspaces(range(2, 10))
    many = queries()
    assert few == (few[0], 1, 4)
    assert many == (few[0], 1, 20)


def test_the_detail_page_of_a_held_post_says_until_when_and_why(admin_client):
    outbox = Outbox("memory")
    queue(outbox, "a1", "T1", "C1")
    [claim] = outbox.claim()
    assert outbox.hold(claim, 600, "429 of team T1", scope="workspace")
    gate = Gate.objects.get(scope="workspace")
    post = Post.objects.get(post_id="a1")
    page = admin_client.get(
        reverse("admin:django_connector_outbox_post_change", args=[post.pk])
    ).content.decode()
    assert f"held until {when(gate.held_until)} with its workspace: 429 of team T1" in page
