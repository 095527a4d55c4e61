"""The fake Slack serving many teams: tokens per team, OAuth (code exchange, rotation), auth.test,
Enterprise Grid org installs, revocation, and its records, driven through slack-sdk."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from django_connector_outbox.fakes.slack import FakeSlack
from django_connector_outbox.fakes.slack_teams import CLIENT_ID, CLIENT_SECRET

TOKEN = "xoxb-default-token"
REDIRECT = "https://app.example/slack/oauth_redirect/slack/"


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def fake(clock: Clock) -> Iterator[FakeSlack]:
    with FakeSlack(TOKEN, channels=("C0",), clock=clock) as server:
        yield server


def client(fake: FakeSlack, token: str | None = None) -> WebClient:
    return WebClient(token=token, base_url=fake.base_url, retry_handlers=[])


def error_of(call: Any) -> str:
    with pytest.raises(SlackApiError) as caught:
        call()
    return str(caught.value.response["error"])


def exchange(fake: FakeSlack, code: str, **kwargs: Any) -> dict[str, Any]:
    answer = client(fake).oauth_v2_access(
        client_id=CLIENT_ID, client_secret=CLIENT_SECRET, code=code, **kwargs
    )
    return dict(answer.data)  # type: ignore[arg-type]


def refresh(fake: FakeSlack, refresh_token: str) -> dict[str, Any]:
    answer = client(fake).oauth_v2_access(
        client_id=CLIENT_ID,
        client_secret=CLIENT_SECRET,
        grant_type="refresh_token",
        refresh_token=refresh_token,
    )
    return dict(answer.data)  # type: ignore[arg-type]


def test_the_single_token_team_works_as_before_and_is_recorded_by_token_id(fake: FakeSlack) -> None:
    client(fake, TOKEN).chat_postMessage(channel="C0", text="hi")

    call = fake.calls[-1]
    assert (call.authorized, call.team, call.token_id) == (True, fake.team_id, f"{fake.team_id}/1")
    assert "token" not in call.args


def test_each_team_posts_with_its_own_token_and_a_foreign_channel_is_refused_and_recorded(
    fake: FakeSlack,
) -> None:
    one = fake.add_team("T1", name="Acme", channels=("C1",))
    two = fake.add_team("T2", name="Globex", channels=("C2",))
    assert one is not None and two is not None

    client(fake, one["access_token"]).chat_postMessage(channel="C1", text="to acme")
    client(fake, two["access_token"]).chat_postMessage(channel="C2", text="to globex")
    assert fake.wrong_team_calls == []

    assert error_of(lambda: client(fake, one["access_token"]).chat_postMessage(channel="C2", text="x")) == (
        "channel_not_found"
    )
    assert fake.wrong_team_calls == [
        {"method": "chat.postMessage", "channel": "C2", "channel_team": "T2", "token": "T1/1", "owner": "T1"}
    ]
    assert [m.text for m in fake.messages("C2")] == ["to globex"]
    assert fake.tokens_used("chat.postMessage") == {"T1": {"T1/1"}, "T2": {"T2/1"}}


def test_a_code_is_exchanged_once_for_the_v2_answer(fake: FakeSlack) -> None:
    fake.add_team("T1", name="Acme", install=False)
    code = fake.issue_code(team="T1", user="U1", redirect_uri=REDIRECT)

    answer = exchange(fake, code, redirect_uri=REDIRECT)

    assert answer["access_token"].startswith("xoxb-")
    assert {
        k: answer[k] for k in ("ok", "token_type", "app_id", "team", "enterprise", "is_enterprise_install")
    } == {
        "ok": True,
        "token_type": "bot",
        "app_id": "AFAKEAPP1",
        "team": {"id": "T1", "name": "Acme"},
        "enterprise": None,
        "is_enterprise_install": False,
    }
    assert answer["authed_user"] == {"id": "U1"}
    assert "chat:write" in answer["scope"].split(",")
    assert "refresh_token" not in answer and "expires_in" not in answer
    assert error_of(lambda: exchange(fake, code, redirect_uri=REDIRECT)) == "invalid_code"
    # The secret reached the fake in a Basic header, and is recorded nowhere.
    assert CLIENT_SECRET not in json.dumps(fake.state())


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"code": "123.not-issued"}, "invalid_code"),
        ({"client_secret": "wrong"}, "bad_client_secret"),
        ({"client_id": "999.999"}, "invalid_client_id"),
        ({"redirect_uri": "https://elsewhere.example/"}, "bad_redirect_uri"),
        ({"grant_type": "password"}, "invalid_grant_type"),
    ],
)
def test_a_bad_exchange_answers_slacks_error(fake: FakeSlack, change: dict[str, str], expected: str) -> None:
    code = fake.issue_code(team=fake.team_id, redirect_uri=REDIRECT)
    args = {
        "client_id": CLIENT_ID,
        "client_secret": CLIENT_SECRET,
        "code": code,
        "redirect_uri": REDIRECT,
        **change,
    }

    assert error_of(lambda: client(fake).oauth_v2_access(**args)) == expected


def test_a_code_expires_after_ten_minutes_and_credentials_may_come_in_the_form(
    fake: FakeSlack, clock: Clock
) -> None:
    late, timely = fake.issue_code(team=fake.team_id), fake.issue_code(team=fake.team_id)
    clock.now += 599
    body = urlencode({"client_id": CLIENT_ID, "client_secret": CLIENT_SECRET, "code": timely}).encode()
    with urllib.request.urlopen(fake.base_url + "oauth.v2.access", data=body) as response:
        assert json.load(response)["ok"] is True
    clock.now += 1

    assert error_of(lambda: exchange(fake, late)) == "invalid_code"


def test_rotation_gives_new_tokens_the_old_refresh_token_dies_the_old_access_token_lives_to_its_expiry(
    fake: FakeSlack, clock: Clock
) -> None:
    first = fake.add_team("T1", rotation=True, expires_in=3600, channels=("C1",))
    assert first is not None
    assert first["access_token"].startswith("xoxe.xoxb-") and first["refresh_token"].startswith("xoxe-1-")
    assert first["expires_in"] == 3600

    clock.now += 3000
    second = refresh(fake, first["refresh_token"])
    assert second["access_token"] != first["access_token"]
    assert second["refresh_token"] != first["refresh_token"]
    assert (second["token_type"], second["expires_in"], second["team"]) == (
        "bot",
        3600,
        {"id": "T1", "name": "Team T1"},
    )
    assert error_of(lambda: refresh(fake, first["refresh_token"])) == "invalid_refresh_token"
    assert fake.refreshes == {"T1": 1}

    # The replaced token still works until its own expiry (a stale use, recorded)...
    client(fake, first["access_token"]).chat_postMessage(channel="C1", text="old but valid")
    assert [c["token"] for c in fake.stale_token_calls] == ["T1/1"]
    clock.now += 600
    # ...then answers token_expired, and that use is recorded: a newer token existed.
    assert error_of(lambda: client(fake, first["access_token"]).chat_postMessage(channel="C1", text="x")) == (
        "token_expired"
    )
    assert [(c["token"], c["method"]) for c in fake.expired_token_calls] == [("T1/1", "chat.postMessage")]
    client(fake, second["access_token"]).chat_postMessage(channel="C1", text="new")


def test_an_expired_token_with_no_newer_one_is_not_a_violation(fake: FakeSlack) -> None:
    first = fake.add_team("T1", rotation=True, channels=("C1",))
    assert first is not None

    assert fake.expire("T1") == 1
    assert error_of(lambda: client(fake, first["access_token"]).auth_test()) == "token_expired"
    assert fake.expired_token_calls == []

    second = refresh(fake, first["refresh_token"])
    client(fake, second["access_token"]).auth_test()
    assert fake.expired_token_calls == []


def test_auth_test_describes_the_token(fake: FakeSlack) -> None:
    fake.add_enterprise("E1", name="Initech", teams=["T7"])
    installed = fake.add_team("T7", name="Initech East", enterprise_id="E1")
    assert installed is not None

    answer = client(fake, installed["access_token"]).auth_test()

    assert {
        k: answer[k]
        for k in ("team", "team_id", "user_id", "bot_id", "enterprise_id", "is_enterprise_install")
    } == {
        "team": "Initech East",
        "team_id": "T7",
        "user_id": installed["bot_user_id"],
        "bot_id": "BB7",
        "enterprise_id": "E1",
        "is_enterprise_install": False,
    }
    assert answer["url"].startswith("https://")


def test_an_org_wide_install_serves_every_team_of_its_enterprise_and_no_other(fake: FakeSlack) -> None:
    fake.add_enterprise("E1", name="Initech", teams=["T7", "T8"])
    fake.add_channel("C7", team="T7")
    fake.add_channel("C8", team="T8")
    code = fake.issue_code(team="T7", user="UADMIN", enterprise=True)

    org = exchange(fake, code)

    assert (org["team"], org["enterprise"], org["is_enterprise_install"]) == (
        None,
        {"id": "E1", "name": "Initech"},
        True,
    )
    web = client(fake, org["access_token"])
    web.chat_postMessage(channel="C7", text="east")
    web.chat_postMessage(channel="C8", text="west")
    assert error_of(lambda: web.chat_postMessage(channel="C0", text="x")) == "channel_not_found"
    assert [c["channel"] for c in fake.wrong_team_calls] == ["C0"]
    assert [t["id"] for t in web.auth_teams_list()["teams"]] == ["T7", "T8"]
    identity = web.auth_test()
    assert (identity["team_id"], identity["enterprise_id"], identity["is_enterprise_install"]) == (
        "E1",
        "E1",
        True,
    )
    assert fake.tokens_used("chat.postMessage") == {"E1": {"E1/1"}}


def test_revoked_uninstalled_inactive_and_unknown_tokens_answer_as_slack(fake: FakeSlack) -> None:
    one = fake.add_team("T1", channels=("C1",))
    two = fake.add_team("T2", channels=("C2",))
    three = fake.add_team("T3", channels=("C3",), rotation=True)
    assert one is not None and two is not None and three is not None

    assert fake.revoke("T1") == 1
    assert fake.revoke("T2", error="account_inactive") == 1
    assert fake.uninstall("T3") == 2  # its access and refresh tokens

    assert error_of(lambda: client(fake, one["access_token"]).auth_test()) == "token_revoked"
    assert error_of(lambda: client(fake, two["access_token"]).auth_test()) == "account_inactive"
    assert error_of(lambda: client(fake, three["access_token"]).auth_test()) == "token_revoked"
    assert error_of(lambda: refresh(fake, three["refresh_token"])) == "invalid_refresh_token"
    assert error_of(lambda: client(fake, "xoxb-never-issued").auth_test()) == "invalid_auth"
    assert error_of(lambda: client(fake, None).auth_test()) == "not_authed"
    # Installing again gives tokens that work.
    again = exchange(fake, fake.issue_code(team="T1"))
    client(fake, again["access_token"]).chat_postMessage(channel="C1", text="back")


def test_the_authorize_page_redirects_with_a_code_and_the_state(fake: FakeSlack) -> None:
    fake.add_team("T1", install=False)
    query = urlencode(
        {"client_id": CLIENT_ID, "scope": "chat:write", "redirect_uri": REDIRECT, "state": "s1", "team": "T1"}
    )

    location = _redirect(f"http://127.0.0.1:{fake.port}/oauth/v2/authorize?{query}")

    assert location.startswith(REDIRECT)
    answer = parse_qs(urlsplit(location).query)
    assert answer["state"] == ["s1"]
    installed = exchange(fake, answer["code"][0], redirect_uri=REDIRECT)
    assert (installed["team"]["id"], installed["scope"]) == ("T1", "chat:write")

    fake.authorize_as(deny=True)
    denied = parse_qs(urlsplit(_redirect(f"http://127.0.0.1:{fake.port}/oauth/v2/authorize?{query}")).query)
    assert denied == {"error": ["access_denied"], "state": ["s1"]}


def test_the_next_install_goes_to_the_workspace_posted_to_the_authorize_control(fake: FakeSlack) -> None:
    # As python -m's instructions say, with curl -d (which sends a form's content type).
    for what, spec in (
        ("teams", {"id": "T2", "channels": ["C2"], "install": False}),
        ("authorize", {"team": "T2"}),
    ):
        request = urllib.request.Request(
            f"http://127.0.0.1:{fake.port}/_fake/{what}", data=json.dumps(spec).encode()
        )
        with urllib.request.urlopen(request) as response:
            assert json.load(response)["ok"] is True
    query = urlencode(
        {"client_id": CLIENT_ID, "scope": "chat:write", "redirect_uri": REDIRECT, "state": "s2"}
    )

    location = _redirect(f"http://127.0.0.1:{fake.port}/oauth/v2/authorize?{query}")

    installed = exchange(fake, parse_qs(urlsplit(location).query)["code"][0], redirect_uri=REDIRECT)
    assert installed["team"]["id"] == "T2"


def test_other_processes_drive_it_through_the_control_endpoints(fake: FakeSlack) -> None:
    installed = _control(fake, "teams", {"id": "T1", "rotation": True, "expires_in": 60, "channels": ["C1"]})
    code = _control(fake, "codes", {"team": "T1"})["code"]
    assert exchange(fake, code)["team"]["id"] == "T1"
    refresh(fake, installed["install"]["refresh_token"])
    assert _control(fake, "expire", {"team": "T1"}) == {"ok": True, "expired": 3}
    assert _control(fake, "revoke", {"team": "T1"})["revoked"] > 0

    with urllib.request.urlopen(f"http://127.0.0.1:{fake.port}/_fake/state") as response:
        state = json.load(response)
    assert state["refreshes"] == {"T1": 1}
    assert state["channel_teams"] == {"C0": fake.team_id, "C1": "T1"}
    assert (state["wrong_team_calls"], state["expired_token_calls"]) == ([], [])
    assert installed["install"]["access_token"] not in json.dumps(state)


def _control(fake: FakeSlack, what: str, spec: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{fake.port}/_fake/{what}",
        data=json.dumps(spec).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request) as response:
        answer: dict[str, Any] = json.load(response)
    return answer


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _redirect(url: str) -> str:
    opener = urllib.request.build_opener(_NoRedirect)
    with pytest.raises(urllib.error.HTTPError) as caught:
        opener.open(url)
    caught.value.close()
    assert caught.value.code == 302
    return str(caught.value.headers["Location"])
