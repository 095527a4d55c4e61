"""End to end, in process: `Outbox.retract` of a post the sender posted to the fake Teams (its
tenant's installation in the database) queues its delete, which the sender (`outbox_deliver`, on
the test's clock) sends as the Bot Connector's ``DELETE …/activities/{id}`` in its place in the
conversation's queue: the activity is gone (a reply's from its reply chain), and one deleted in
Teams first makes the delete done (a 404)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import httpx
import pytest

from django_connector_outbox import Outbox
from django_connector_outbox.fakes import teams as ft
from django_connector_outbox.installations.teams import TeamsInstallations
from tests.delivering import deliver_all

pytestmark = pytest.mark.django_db

TENANT, CHANNEL = ft.TENANT, ft.CHANNEL


@pytest.fixture
def fake(fake_teams: Any, settings: Any) -> Any:
    settings.CONNECTOR_OUTBOX = {
        "CONNECTORS": {"teams": fake_teams.connector_settings()},
        "RETRY_JITTER": 0,
    }
    TeamsInstallations("teams").save(TENANT, service_url=fake_teams.service_url)
    return fake_teams


def queue(post_id: str, **fields: Any) -> None:
    assert Outbox("teams").queue(
        post_id, workspace_id=TENANT, container_id=CHANNEL, body={"text": post_id}, **fields
    )


def texts(fake: Any) -> list[str]:
    return [a.text for a in fake.activities(CHANNEL)]


def test_a_retracted_post_is_deleted_in_its_place_in_the_conversations_queue(
    fake, outbox_deliver, outbox_clock
):
    queue("p1")
    assert deliver_all(outbox_deliver, outbox_clock, "teams") == ["p1"]
    ref = Outbox("teams").find("p1").message_ref
    queue("before")
    assert Outbox("teams").retract("p1") is True
    queue("after")

    assert deliver_all(outbox_deliver, outbox_clock, "teams") == ["before", "p1:delete", "after"]

    assert texts(fake) == ["before", "after"]
    assert [c.route for c in fake.calls if c.route in ("create", "delete")] == [
        "create",
        "create",
        "delete",
        "create",
    ]
    assert fake.calls_of("delete")[0].activity_id == ref
    assert Outbox("teams").find("p1:delete").state == "posted"
    assert Outbox("teams").retract("p1") is False  # idempotent: nothing more queued


def test_a_reply_retracted_is_deleted_from_its_reply_chain(fake, outbox_deliver, outbox_clock):
    queue("root")
    queue("reply", thread_of="root")
    assert deliver_all(outbox_deliver, outbox_clock, "teams") == ["root", "reply"]
    root = Outbox("teams").find("root").message_ref

    assert Outbox("teams").retract("reply") is True
    assert deliver_all(outbox_deliver, outbox_clock, "teams") == ["reply:delete"]

    assert texts(fake) == ["root"]
    assert fake.calls_of("delete")[0].conversation == f"{CHANNEL};messageid={root}"


def test_an_activity_deleted_in_teams_first_makes_the_delete_done(fake, outbox_deliver, outbox_clock):
    queue("p1")
    deliver_all(outbox_deliver, outbox_clock, "teams")
    ref = Outbox("teams").find("p1").message_ref
    # Deleted in Teams first, by the bot's own app (a person, another of its processes):
    form = {"grant_type": "client_credentials", "client_id": ft.APP_ID, "client_secret": ft.APP_PASSWORD}
    token = httpx.post(
        f"{fake.login_url}/botframework.com/oauth2/v2.0/token", data={**form, "scope": ft.SCOPE}
    )
    url = f"{fake.service_url}v3/conversations/{quote(CHANNEL, safe='')}/activities/{ref}"
    headers = {"Authorization": f"Bearer {token.json()['access_token']}"}
    assert httpx.delete(url, headers=headers).status_code == 200

    assert Outbox("teams").retract("p1") is True
    assert deliver_all(outbox_deliver, outbox_clock, "teams") == ["p1:delete"]  # the 404: done
    assert Outbox("teams").find("p1:delete").state == "posted"
    assert [c.authorized for c in fake.calls_of("delete")] == [True, True]
