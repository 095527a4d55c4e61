"""The admin's installations and destinations: read-only, without a secret, posts waiting for
each installation counted in the list's one query, times in Django's one format; revoking through
Installations, with the permission only."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import formats, timezone

from django_connector_outbox import Outbox
from django_connector_outbox.installations import Destinations, Installations, NotInstalled
from django_connector_outbox.models import Destination, Installation

pytestmark = pytest.mark.django_db

INSTALLATIONS = reverse("admin:django_connector_outbox_installation_changelist")
DESTINATIONS = reverse("admin:django_connector_outbox_destination_changelist")
TOKEN = "xoxb-admin-token-do-not-show"
REFRESH = "xoxe-admin-refresh-do-not-show"
HOOK = "https://hooks.example.com/workflows/adminHookToken12345"
SIGNING = "whsec-admin-signing-do-not-show"


@pytest.fixture
def installed() -> dict[str, Installation]:
    """T1 live with 2 posts queued, 1 failed of a gone channel and 1 posted (neither waits for
    it); T2 expiring and failing to refresh; T3 revoked, with 1 post failed for want of it.
    Another source's posts in T1 count for that source only."""
    slack = Installations("memory")
    rows = {
        team: slack.save(
            team,
            secrets={"bot_token": f"{TOKEN}-{team}", "bot_refresh_token": REFRESH},
            team_name=f"Team {team}",
            bot_user_id=f"U{team}",
            bot_scopes="chat:write,reactions:write",
            token_expires_at=timezone.now() + timedelta(hours=12) if team == "T2" else None,
        )
        for team in ("T1", "T2", "T3")
    }
    Installation.objects.filter(workspace_id="T2").update(refresh_error="slack error invalid_refresh_token")
    slack.revoke("T3", "token_revoked")
    outbox = Outbox("memory")
    for n in range(4):
        assert outbox.queue(f"p{n}", workspace_id="T1", container_id=f"C{n}", body={"text": "x"})
    assert outbox.queue("r0", workspace_id="T3", container_id="C0", body={"text": "x"})
    claims = {claim.post_id: claim for claim in outbox.claim()}
    assert outbox.settle(claims["p0"], "failed", "channel_not_found")
    assert outbox.posted(claims["p1"], "C1:1")
    with pytest.raises(NotInstalled) as revoked:
        slack.credentials("T3")
    assert outbox.settle(claims["r0"], "failed", str(revoked.value))  # as a connector refuses it
    assert Outbox("other").queue("o1", workspace_id="T1", container_id="C1", body={"text": "x"})
    Installations("other").save("T1", secrets={"bot_token": f"{TOKEN}-other"})
    return rows


@pytest.fixture
def hooks() -> None:
    Destinations("hooks").set("C1", HOOK, workspace_id="W1", secret=SIGNING)


def assert_no_secret(html: str) -> None:
    for secret in (TOKEN, REFRESH, HOOK, "adminHookToken", "hooks.example.com", SIGNING, "gAAAA"):
        assert secret not in html


def rows_of(response: Any) -> dict[tuple[str, str], Any]:
    assert response.status_code == 200
    return {(row.source, row.workspace_id): row for row in response.context["cl"].result_list}


def test_the_list_shows_each_installation_with_its_posts_waiting_and_no_secret(admin_client, installed):
    response = admin_client.get(INSTALLATIONS)

    rows = rows_of(response)
    # T1: its queued posts, not the one failed of another cause; T3: the one failed for want of it.
    assert {key: row.posts_waiting for key, row in rows.items()} == {
        ("memory", "T1"): 2, ("memory", "T2"): 0, ("memory", "T3"): 1, ("other", "T1"): 1,
    }  # fmt: skip
    html = response.content.decode()
    assert "Team T1" in html and "UT2" in html and "chat:write, reactions:write" in html
    assert "slack error invalid_refresh_token" in html
    assert_no_secret(html)


def test_posts_waiting_are_counted_in_the_list_query_not_one_query_per_row(admin_client, installed):
    admin_client.get(INSTALLATIONS)  # sessions, content types: warm
    with CaptureQueriesContext(connection) as one_page:
        admin_client.get(INSTALLATIONS)
    for n in range(20):
        Installations("memory").save(f"X{n}", secrets={"bot_token": TOKEN})
    with CaptureQueriesContext(connection) as bigger_page:
        admin_client.get(INSTALLATIONS)
    assert len(bigger_page.captured_queries) == len(one_page.captured_queries)


def in_admin_format(moment: datetime) -> str:
    """`moment` as Django's admin shows a model's datetime (display_for_field)."""
    return formats.localize(timezone.template_localtime(moment))


def test_the_list_and_the_change_page_show_every_time_in_django_s_one_format(admin_client, clock):
    slack = Installations("memory", clock=clock)
    clock.advance(3600)
    slack.save("T1", secrets={"bot_token": TOKEN}, token_expires_at=clock() + timedelta(days=3))
    clock.advance(3600 + 17 * 60)
    slack.save("T2", secrets={"bot_token": TOKEN})
    clock.advance(3600 + 29 * 60)
    slack.revoke("T2", "token_revoked")
    live, revoked = Installation.objects.order_by("workspace_id")
    assert live.token_expires_at is not None and revoked.revoked_at is not None
    times = {
        live: [live.installed_at, live.token_expires_at, live.updated_at],
        revoked: [revoked.installed_at, revoked.revoked_at],
    }
    listed = [live.installed_at, live.token_expires_at, revoked.installed_at, revoked.revoked_at]
    assert len({in_admin_format(moment) for moment in listed}) == 4  # each told apart

    pages = {"list": admin_client.get(INSTALLATIONS).content.decode()}
    for row in times:
        change = reverse("admin:django_connector_outbox_installation_change", args=[row.pk])
        pages[row.workspace_id] = admin_client.get(change).content.decode()

    assert [in_admin_format(moment) in pages["list"] for moment in listed] == [True] * 4
    for row, moments in times.items():
        assert [in_admin_format(moment) in pages[row.workspace_id] for moment in moments] == [True] * len(
            moments
        )
    for html in pages.values():
        assert re.findall(r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}", html) == []  # no second, ISO-like format


def test_the_list_shows_when_a_workspace_was_last_installed(admin_client, clock):
    slack = Installations("memory", clock=clock)
    slack.save("T1", secrets={"bot_token": TOKEN})
    slack.revoke("T1", "token_revoked")
    clock.advance(86400 * 3)
    slack.save("T1", secrets={"bot_token": f"{TOKEN}-again"})

    listed = admin_client.get(INSTALLATIONS).content.decode()
    assert in_admin_format(clock()) in listed
    assert in_admin_format(clock() - timedelta(days=3)) not in listed


def test_the_filters_show_revoked_live_and_failing_installations(admin_client, installed):
    def listed(value: str) -> set[str]:
        return {w for s, w in rows_of(admin_client.get(INSTALLATIONS, {"revoked": value})) if s == "memory"}

    assert listed("yes") == {"T3"}
    assert listed("no") == {"T1", "T2"}
    assert listed("failing") == {"T2"}


def test_the_change_page_is_read_only_and_shows_no_secret(admin_client, installed):
    response = admin_client.get(
        reverse("admin:django_connector_outbox_installation_change", args=[installed["T1"].pk])
    )
    assert response.status_code == 200
    html = response.content.decode()
    assert "Team T1" in html and 'name="secrets"' not in html and "<form" in html
    assert 'name="team_name"' not in html  # nothing editable
    assert_no_secret(html)
    posted = admin_client.post(
        reverse("admin:django_connector_outbox_installation_change", args=[installed["T1"].pk]),
        {"team_name": "changed", "secrets": "x"},
    )
    assert posted.status_code == 403
    assert Installation.objects.get(pk=installed["T1"].pk).team_name == "Team T1"
    assert admin_client.get(reverse("admin:django_connector_outbox_installation_add")).status_code == 403
    assert (
        admin_client.get(
            reverse("admin:django_connector_outbox_installation_delete", args=[installed["T1"].pk])
        ).status_code
        == 403
    )


def test_the_revoke_action_erases_the_tokens_through_installations(admin_client, installed):
    data = {"action": "revoke_installations", "_selected_action": [r.pk for r in installed.values()]}
    response = admin_client.post(INSTALLATIONS, data, follow=True)

    assert [str(m) for m in response.context["messages"]] == ["2 installation(s) revoked."]
    revoked = {r.workspace_id: r for r in Installation.objects.filter(source="memory")}
    assert all(r.revoked_at is not None and r.secrets == "" for r in revoked.values())
    assert revoked["T1"].revoked_reason == "revoked in the admin by admin"
    assert revoked["T3"].revoked_reason == "token_revoked"  # already revoked: left as it was
    assert Installation.objects.get(source="other").revoked_at is None


def test_revoking_needs_the_change_permission(client, django_user_model, installed):
    user = django_user_model.objects.create_user("operator", password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename="view_installation"))
    client.force_login(user)

    response = client.get(INSTALLATIONS)
    assert response.status_code == 200
    assert "revoke_installations" not in response.content.decode()
    client.post(INSTALLATIONS, {"action": "revoke_installations", "_selected_action": [installed["T1"].pk]})
    assert Installation.objects.get(pk=installed["T1"].pk).revoked_at is None

    user.user_permissions.add(Permission.objects.get(codename="change_installation"))
    client.post(INSTALLATIONS, {"action": "revoke_installations", "_selected_action": [installed["T1"].pk]})
    assert Installation.objects.get(pk=installed["T1"].pk).revoked_at is not None


def test_destinations_are_listed_without_anything_of_their_url(admin_client, hooks):
    response = admin_client.get(DESTINATIONS)
    assert response.status_code == 200
    assert [(d.source, d.container_id, d.workspace_id) for d in response.context["cl"].result_list] == [
        ("hooks", "C1", "W1")
    ]
    assert_no_secret(response.content.decode())
    row = Destination.objects.get()
    change = admin_client.get(reverse("admin:django_connector_outbox_destination_change", args=[row.pk]))
    assert change.status_code == 200
    assert "W1" in change.content.decode()
    assert_no_secret(change.content.decode())
    assert admin_client.get(reverse("admin:django_connector_outbox_destination_add")).status_code == 403
