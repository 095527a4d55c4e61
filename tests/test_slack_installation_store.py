"""SlackInstallationStore is slack-sdk's InstallationStore: tested with slack-sdk's own
Installation and Bot objects, and with a Bolt app that authorizes its requests through it and
forwards its uninstall events, so that Bolt and the outbox share one table."""

from __future__ import annotations

import json
import time

import pytest
from slack_bolt import App, BoltRequest
from slack_sdk import WebClient
from slack_sdk.oauth.installation_store import Installation

from django_connector_outbox.fakes.slack import FakeSlack
from django_connector_outbox.installations import Installations, NotInstalled, SlackInstallationStore
from django_connector_outbox.models import Installation as Row

pytestmark = pytest.mark.django_db


def team_install(team: str = "T1", token: str = "xoxb-t1", **overrides) -> Installation:
    values = {
        "app_id": "A1",
        "team_id": team,
        "team_name": "Acme",
        "bot_token": token,
        "bot_id": "B1",
        "bot_user_id": "UBOT",
        "bot_scopes": ["chat:write", "reactions:write"],
        "user_id": "U1",
        "user_token": "xoxp-u1",
        "user_scopes": ["search:read"],
        "incoming_webhook_url": "https://hooks.slack.test/T1/secret",
        "incoming_webhook_channel_id": "C1",
        "token_type": "bot",
        "installed_at": 1_760_000_000.0,
    }
    return Installation(**{**values, **overrides})


def test_a_saved_installation_is_found_whole():
    store = SlackInstallationStore("slack")
    store.save(team_install())
    found = store.find_installation(enterprise_id=None, team_id="T1")
    assert found is not None
    assert (found.bot_token, found.user_token, found.incoming_webhook_url) == (
        "xoxb-t1",
        "xoxp-u1",
        "https://hooks.slack.test/T1/secret",
    )
    assert (found.team_id, found.team_name, found.bot_user_id, found.user_id) == ("T1", "Acme", "UBOT", "U1")
    assert found.bot_scopes == ["chat:write", "reactions:write"]
    assert found.incoming_webhook_channel_id == "C1"


def test_the_bot_is_found_and_the_outbox_sends_with_its_token():
    store = SlackInstallationStore("slack")
    store.save(team_install())
    bot = store.find_bot(enterprise_id=None, team_id="T1")
    assert bot is not None and bot.bot_token == "xoxb-t1"
    assert Installations("slack").credentials("T1").token == "xoxb-t1"


def test_no_secret_is_stored_in_the_clear():
    SlackInstallationStore("slack").save(team_install(bot_refresh_token="xoxe-1-refresh"))
    stored = json.dumps(list(Row.objects.values()), default=str)
    for secret in ("xoxb-t1", "xoxp-u1", "hooks.slack.test", "xoxe-1-refresh"):
        assert secret not in stored


def test_another_user_s_installation_is_not_kept():
    store = SlackInstallationStore("slack")
    store.save(team_install())
    assert store.find_installation(enterprise_id=None, team_id="T1", user_id="U1") is not None
    assert store.find_installation(enterprise_id=None, team_id="T1", user_id="U2") is None


def test_an_unknown_team_finds_nothing():
    assert SlackInstallationStore("slack").find_bot(enterprise_id=None, team_id="T404") is None


def test_rotation_fields_round_trip():
    store = SlackInstallationStore("slack")
    expires_at = int(time.time()) + 43_200
    store.save(team_install(bot_refresh_token="xoxe-1-r", bot_token_expires_at=expires_at))
    bot = store.find_bot(enterprise_id=None, team_id="T1")
    assert bot is not None
    assert (bot.bot_refresh_token, bot.bot_token_expires_at) == ("xoxe-1-r", expires_at)
    credentials = Installations("slack").credentials("T1")
    assert credentials.refresh_token == "xoxe-1-r"
    assert credentials.expires_at is not None and int(credentials.expires_at.timestamp()) == expires_at


def test_save_bot_replaces_the_bot_token_and_keeps_the_user_token():
    store = SlackInstallationStore("slack")
    store.save(team_install())
    bot = store.find_bot(enterprise_id=None, team_id="T1")
    assert bot is not None
    bot.bot_token = "xoxb-rotated"
    store.save_bot(bot)
    found = store.find_installation(enterprise_id=None, team_id="T1")
    assert found is not None and (found.bot_token, found.user_token) == ("xoxb-rotated", "xoxp-u1")


def org_install() -> Installation:
    return team_install(
        team="",
        team_id=None,
        enterprise_id="E1",
        enterprise_name="Grid",
        is_enterprise_install=True,
        token="xoxb-org",
    )


def test_an_org_wide_installation_is_found_for_its_enterprise_and_its_teams():
    store = SlackInstallationStore("slack")
    store.save(org_install())
    org = store.find_bot(enterprise_id="E1", team_id=None, is_enterprise_install=True)
    assert org is not None and org.bot_token == "xoxb-org" and org.is_enterprise_install
    in_a_team = store.find_bot(enterprise_id="E1", team_id="T7", is_enterprise_install=False)
    assert in_a_team is not None and in_a_team.bot_token == "xoxb-org"
    assert Row.objects.get().workspace_id == "E1"


def test_installed_at_is_the_latest_install_never_a_token_rotation():
    store = SlackInstallationStore("slack")
    store.save(team_install(installed_at=1_760_000_000.0))
    bot = store.find_bot(enterprise_id=None, team_id="T1")
    assert bot is not None
    bot.bot_token = "xoxb-rotated"
    store.save_bot(bot)  # Bolt's rotation of a bot
    found = store.find_installation(enterprise_id=None, team_id="T1")
    assert found is not None
    rotated = Installation(**found.to_dict_for_copying())  # Bolt's rotation of an installation
    rotated.bot_token = "xoxb-rotated-again"
    store.save(rotated)
    store.delete_installation(enterprise_id=None, team_id="T1", user_id="U1")  # a user's token goes
    assert Row.objects.get().installed_at.timestamp() == 1_760_000_000.0
    store.delete_installation(enterprise_id=None, team_id="T1")
    store.save(team_install(token="xoxb-again", installed_at=1_770_000_000.0))  # installed again
    assert Row.objects.get().installed_at.timestamp() == 1_770_000_000.0


def test_delete_installation_revokes_the_workspace_for_the_outbox():
    store = SlackInstallationStore("slack")
    store.save(team_install())
    store.delete_installation(enterprise_id=None, team_id="T1")
    assert store.find_installation(enterprise_id=None, team_id="T1") is None
    with pytest.raises(NotInstalled, match="workspace T1 was revoked .*: install the app again"):
        Installations("slack").credentials("T1")
    store.save(team_install(token="xoxb-again"))
    assert Installations("slack").credentials("T1").token == "xoxb-again"


def test_a_user_s_revoked_token_leaves_the_bot_installed():
    store = SlackInstallationStore("slack")
    store.save(team_install())
    store.delete_installation(enterprise_id=None, team_id="T1", user_id="U1")
    found = store.find_installation(enterprise_id=None, team_id="T1")
    assert found is not None and found.bot_token == "xoxb-t1" and found.user_token is None


def test_an_installation_without_team_or_enterprise_is_refused_and_nothing_saved():
    with pytest.raises(ValueError, match="needs a team_id"):
        SlackInstallationStore("slack").save(team_install(team_id=None))
    assert not Row.objects.exists()


@pytest.fixture
def slack():
    with FakeSlack(token="xoxb-t1", team_id="T1") as fake:
        yield fake


def bolt_app(store: SlackInstallationStore, slack: FakeSlack) -> App:
    """A Bolt app whose Web API is the fake (Bolt calls auth.test as it authorizes)."""
    return App(
        client=WebClient(base_url=slack.base_url),
        installation_store=store,
        signing_secret="unused",
        request_verification_enabled=False,
        # Listeners run before the answer (not on Bolt's thread pool): this test's transaction.
        process_before_response=True,
    )


def event(kind: str, team: str = "T1", **fields) -> BoltRequest:
    body = {
        "type": "event_callback",
        "team_id": team,
        "api_app_id": "A1",
        "event": {"type": kind, **fields},
        "authorizations": [
            {"team_id": team, "user_id": "UBOT", "is_bot": True, "is_enterprise_install": False}
        ],
        "event_id": "Ev1",
        "event_time": 1_760_000_000,
    }
    return BoltRequest(body=json.dumps(body), headers={"content-type": ["application/json"]})


def test_a_bolt_app_authorizes_its_requests_with_the_shared_installation(slack):
    store = SlackInstallationStore("slack")
    store.save(team_install())
    app = bolt_app(store, slack)
    seen = {}

    @app.event("app_mention")
    def mentioned(context, ack):  # noqa: ANN001 - Bolt's listener arguments
        seen["token"] = context.bot_token
        ack()

    response = app.dispatch(event("app_mention", user="U9", text="hi", channel="C1", ts="1.2"))
    assert response.status == 200
    assert seen == {"token": "xoxb-t1"}


def test_a_bolt_app_s_uninstall_event_revokes_the_workspace_for_the_outbox(slack):
    store = SlackInstallationStore("slack")
    store.save(team_install())
    store.save(team_install(team="T2", token="xoxb-t2"))
    app = bolt_app(store, slack)
    app.enable_token_revocation_listeners()
    assert app.dispatch(event("app_uninstalled")).status == 200
    with pytest.raises(NotInstalled, match="T1"):
        Installations("slack").credentials("T1")
    assert Installations("slack").credentials("T2").token == "xoxb-t2"
