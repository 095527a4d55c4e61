"""The "Add to Slack" flow (installations/slack_views.py) with Django's test client and the fake
Slack: the redirect to Slack's authorize page with a one-time state, the code exchange, the
saved installation, and every way it is refused without saving anything."""

from __future__ import annotations

import logging
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from html.parser import HTMLParser
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.template import Context, Template
from django.test import Client
from django.utils import timezone, translation
from django.utils.html import escape
from slack_sdk import WebClient

from django_connector_outbox.fakes.slack import FakeSlack, error, html
from django_connector_outbox.fakes.slack_teams import CLIENT_ID, CLIENT_SECRET
from django_connector_outbox.installations import SlackInstallationStore
from django_connector_outbox.installations.slack_views import STATE_COOKIE, STATE_SECONDS, SlackApp
from django_connector_outbox.models import Installation, OAuthState

SLACK = "django_connector_outbox.connectors.slack.SlackConnector"
SCOPES = ["chat:write", "channels:history"]
WRONG_SECRET = "not-the-secret-9f8e7d6c"

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def fake() -> Iterator[FakeSlack]:
    with FakeSlack(channels=()) as server:
        server.add_team("T1", name="Acme", install=False)
        server.add_team("T2", name="Rotating", rotation=True, expires_in=43200, install=False)
        server.add_enterprise("E1", name="Initech", teams=["T7", "T8"])
        yield server


@pytest.fixture(autouse=True)
def sources(settings: Any, fake: FakeSlack) -> None:
    app = {
        "installations": True,
        "client_id": CLIENT_ID,
        "client_secret": CLIENT_SECRET,
        "scopes": SCOPES,
        "base_url": fake.base_url,
        "timeout": 2,
    }
    settings.CONNECTOR_OUTBOX = {
        "CONNECTORS": {
            "slackapp": {"BACKEND": SLACK, "OPTIONS": app},
            "welcome": {"BACKEND": SLACK, "OPTIONS": {**app, "success_url": "/welcome/"}},
            "wrongsecret": {"BACKEND": SLACK, "OPTIONS": {**app, "client_secret": WRONG_SECRET}},
            "down": {
                "BACKEND": SLACK,
                "OPTIONS": {**app, "base_url": f"http://127.0.0.1:{_closed_port()}/api/"},
            },
            "nosecret": {"BACKEND": SLACK, "OPTIONS": {k: v for k, v in app.items() if k != "client_secret"}},
            "plain": {"BACKEND": SLACK, "OPTIONS": {"token": "xoxb-plain"}},
            "memory": {"BACKEND": "django_connector_outbox.connectors.memory.MemoryConnector"},
        }
    }


def begin(client: Client, source: str = "slackapp") -> tuple[str, dict[str, str]]:
    """GET install/<source>/: Slack's authorize URL (Location) and its parameters."""
    response = client.get(f"/slack/install/{source}/")
    assert response.status_code == 302, response.content
    location = response["Location"]
    return location, {k: v[0] for k, v in parse_qs(urlsplit(location).query).items()}


def through_slack(location: str) -> str:
    """What the fake's authorize page redirects the browser to: our redirect URL (path and query)."""
    opener = urllib.request.build_opener(_NoRedirect)
    with pytest.raises(urllib.error.HTTPError) as caught:
        opener.open(location)
    caught.value.close()
    assert caught.value.code == 302
    back = urlsplit(caught.value.headers["Location"])
    return f"{back.path}?{back.query}"


def install(client: Client, source: str = "slackapp") -> Any:
    location, _ = begin(client, source)
    return client.get(through_slack(location))


def nothing_saved() -> bool:
    return not Installation.objects.exists()


def test_install_redirects_to_slacks_authorize_page_with_a_one_time_state(
    client: Client, fake: FakeSlack
) -> None:
    location, params = begin(client)

    assert location.startswith(f"http://127.0.0.1:{fake.port}/oauth/v2/authorize?")
    assert params["client_id"] == CLIENT_ID
    assert params["scope"] == "chat:write,channels:history"
    assert params["redirect_uri"] == "http://testserver/slack/oauth_redirect/slackapp/"
    state = params["state"]
    assert len(state) == 64
    row = OAuthState.objects.get()
    assert (row.state, row.source) == (state, "slackapp")
    assert row.expires_at - row.created_at == timedelta(seconds=STATE_SECONDS)
    cookie = client.cookies[STATE_COOKIE]
    assert (cookie.value, cookie["path"], cookie["httponly"]) == (
        state,
        "/slack/oauth_redirect/slackapp/",
        True,
    )
    assert begin(client)[1]["state"] != state


@pytest.mark.parametrize(
    ("base_url", "authorize_url"),
    [
        ("https://slack.com/api/", "https://slack.com/oauth/v2/authorize"),
        ("https://slack-gov.com/api", "https://slack-gov.com/oauth/v2/authorize"),
        ("http://127.0.0.1:8000/api/", "http://127.0.0.1:8000/oauth/v2/authorize"),
    ],
)
def test_the_authorize_page_is_next_to_the_web_api(base_url: str, authorize_url: str) -> None:
    app = SlackApp("s", "id", "secret", "chat:write", "", base_url, 10.0, "")

    assert app.authorize_url == authorize_url


def test_a_team_install_is_saved_and_its_token_works(client: Client, fake: FakeSlack) -> None:
    fake.authorize_as(team="T1", user="UADMIN1")

    response = install(client)

    assert response.status_code == 200
    assert b"Acme" in response.content
    saved = SlackInstallationStore("slackapp").find_installation(enterprise_id=None, team_id="T1")
    assert saved is not None
    assert (saved.team_name, saved.bot_id, saved.bot_user_id, saved.user_id) == (
        "Acme",
        "BB1",
        "UB1",
        "UADMIN1",
    )
    assert saved.bot_scopes == SCOPES
    assert (saved.is_enterprise_install, saved.enterprise_id, saved.bot_refresh_token) == (False, None, None)
    assert saved.bot_token is not None
    assert WebClient(saved.bot_token, base_url=fake.base_url).auth_test()["team_id"] == "T1"
    assert not OAuthState.objects.exists()  # used up
    assert client.cookies[STATE_COOKIE].value == ""  # and forgotten by the browser


def test_a_rotating_install_keeps_its_refresh_token_and_expiry(client: Client, fake: FakeSlack) -> None:
    fake.authorize_as(team="T2")
    before = timezone.now()

    assert install(client).status_code == 200

    bot = SlackInstallationStore("slackapp").find_bot(enterprise_id=None, team_id="T2")
    assert bot is not None and bot.bot_token is not None and bot.bot_refresh_token is not None
    assert bot.bot_token.startswith("xoxe.xoxb-") and bot.bot_refresh_token.startswith("xoxe-1-")
    assert bot.bot_token_expires_at is not None
    assert abs(bot.bot_token_expires_at - (before.timestamp() + 43200)) < 5
    row = Installation.objects.get()
    assert row.token_expires_at is not None


def test_an_org_wide_install_serves_the_teams_of_its_enterprise(client: Client, fake: FakeSlack) -> None:
    fake.authorize_as(team="T7", enterprise=True)

    response = install(client)

    assert response.status_code == 200
    assert b"Initech" in response.content
    saved = SlackInstallationStore("slackapp").find_installation(
        enterprise_id="E1", team_id=None, is_enterprise_install=True
    )
    assert saved is not None
    assert (saved.team_id, saved.enterprise_name, saved.is_enterprise_install) == (None, "Initech", True)
    assert saved.enterprise_url == "https://e1.enterprise.slack.com/"
    row = Installation.objects.get()
    assert (row.workspace_id, row.extra["team_ids"]) == ("E1", ["T7", "T8"])
    # Bolt's lookup for a team of the org finds the org-wide installation.
    assert SlackInstallationStore("slackapp").find_bot(enterprise_id="E1", team_id="T8") is not None


def test_success_url_is_where_an_install_ends(client: Client, fake: FakeSlack) -> None:
    fake.authorize_as(team="T1")

    response = install(client, "welcome")

    assert (response.status_code, response["Location"]) == (302, "/welcome/")
    assert Installation.objects.filter(source="welcome", workspace_id="T1").exists()


def test_a_cancelled_install_says_so_and_uses_up_the_state(client: Client, fake: FakeSlack) -> None:
    fake.authorize_as(deny=True)

    response = install(client)

    assert response.status_code == 400
    assert b"cancelled" in response.content
    assert nothing_saved() and not OAuthState.objects.exists()
    assert fake.calls_of("oauth.v2.access") == []


def test_a_state_is_used_once(client: Client, fake: FakeSlack) -> None:
    fake.authorize_as(team="T1")
    location, params = begin(client)
    back = through_slack(location)
    assert client.get(back).status_code == 200
    Installation.objects.all().delete()

    client.cookies[STATE_COOKIE] = params["state"]  # even the browser that started it
    replay = client.get(back)

    assert replay.status_code == 400
    assert b"expired or was already used" in replay.content
    assert nothing_saved()
    assert len(fake.calls_of("oauth.v2.access")) == 1


def test_an_expired_state_is_refused(client: Client, fake: FakeSlack) -> None:
    fake.authorize_as(team="T1")
    location, _ = begin(client)
    OAuthState.objects.update(expires_at=timezone.now() - timedelta(seconds=1))

    response = client.get(through_slack(location))

    assert response.status_code == 400
    assert b"expired or was already used" in response.content
    assert nothing_saved() and fake.calls_of("oauth.v2.access") == []


def test_a_state_of_another_source_is_refused(client: Client, fake: FakeSlack) -> None:
    fake.authorize_as(team="T1")
    location, params = begin(client, "welcome")
    back = through_slack(location).replace("/welcome/", "/slackapp/")
    client.cookies[STATE_COOKIE] = params["state"]

    response = client.get(back)

    assert response.status_code == 400
    assert nothing_saved() and OAuthState.objects.filter(source="welcome").exists()


def test_a_redirect_to_another_browser_is_refused(client: Client, fake: FakeSlack) -> None:
    fake.authorize_as(team="T1")
    location, _ = begin(client)
    back = through_slack(location)

    response = Client().get(back)  # a victim's browser, sent the attacker's link

    assert response.status_code == 400
    assert b"not started in this browser" in response.content
    assert nothing_saved() and OAuthState.objects.exists()


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("state={state}", b"carries no code"),
        ("state={state}&code=", b"carries no code"),
        ("state={state}&code=1.not-a-code", b"invalid_code"),
        ("code=1.not-a-code", b"not started in this browser"),
        ("state=&code=1.not-a-code", b"not started in this browser"),
        ("state={state}&error=server_error", b"server_error"),
    ],
)
def test_a_bad_redirect_is_refused(client: Client, fake: FakeSlack, query: str, expected: bytes) -> None:
    _, params = begin(client)

    response = client.get("/slack/oauth_redirect/slackapp/?" + query.format(state=params["state"]))

    assert response.status_code == 400
    assert expected in response.content
    assert nothing_saved()


@pytest.mark.parametrize(
    ("source", "status", "expected"),
    [
        ("wrongsecret", 400, b"bad_client_secret"),
        ("down", 502, b"could not be reached"),
    ],
)
def test_a_failed_exchange_is_refused(
    client: Client, fake: FakeSlack, source: str, status: int, expected: bytes
) -> None:
    fake.authorize_as(team="T1")
    location, params = begin(client, source)
    # The fake issues the code whatever the source's base_url: Slack's page is the same.
    code = fake.issue_code(team="T1", redirect_uri=params["redirect_uri"])

    response = client.get(f"/slack/oauth_redirect/{source}/?state={params['state']}&code={code}")

    assert response.status_code == status
    assert expected in response.content
    assert WRONG_SECRET.encode() not in response.content
    assert nothing_saved()


@pytest.mark.parametrize(
    ("method", "action", "status", "expected"),
    [
        ("oauth.v2.access", html(503), 502, b"HTTP 503"),
        ("oauth.v2.access", error("invalid_code"), 400, b"invalid_code"),
        ("auth.test", error("invalid_auth"), 400, b"invalid_auth"),
        ("auth.teams.list", html(500), 502, b"HTTP 500"),
    ],
)
def test_slack_failing_midway_saves_nothing(
    client: Client, fake: FakeSlack, method: str, action: Any, status: int, expected: bytes
) -> None:
    fake.authorize_as(team="T7", enterprise=True)
    fake.script(method, action)

    response = install(client)

    assert response.status_code == status
    assert expected in response.content
    assert nothing_saved()


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("nowhere", b"no source"),
        ("memory", b"not a Slack connector"),
        ("plain", b"does not take installations"),
        ("nosecret", b"no OPTIONS &#x27;client_secret&#x27;"),
    ],
)
def test_a_source_that_cannot_be_installed_is_refused(client: Client, source: str, expected: bytes) -> None:
    for url in (f"/slack/install/{source}/", f"/slack/oauth_redirect/{source}/?state=s&code=c"):
        response = client.get(url)
        assert response.status_code == 400
        assert expected in response.content
    assert not OAuthState.objects.exists() and nothing_saved()


def test_the_views_take_only_get(client: Client) -> None:
    assert client.post("/slack/install/slackapp/").status_code == 405
    assert client.post("/slack/oauth_redirect/slackapp/").status_code == 405


def test_starting_an_install_forgets_the_states_nobody_came_back_for(client: Client) -> None:
    begin(client)
    OAuthState.objects.update(expires_at=timezone.now() - timedelta(seconds=1))

    _, params = begin(client)

    assert list(OAuthState.objects.values_list("state", flat=True)) == [params["state"]]


def test_a_state_is_consumed_by_one_request_only() -> None:
    now = timezone.now()
    OAuthState.objects.create(state="a" * 64, source="slackapp", expires_at=now + timedelta(minutes=1))

    assert not OAuthState.objects.consume("a" * 64, "welcome", now)
    assert OAuthState.objects.consume("a" * 64, "slackapp", now)
    assert not OAuthState.objects.consume("a" * 64, "slackapp", now)


def test_no_secret_reaches_a_page_or_a_log_line(
    client: Client, fake: FakeSlack, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    fake.authorize_as(team="T2")
    pages = [install(client).content, install(client, "wrongsecret").content]
    fake.script("auth.test", html(503))
    pages.append(install(client).content)

    bot = SlackInstallationStore("slackapp").find_bot(enterprise_id=None, team_id="T2")
    assert bot is not None and bot.bot_token and bot.bot_refresh_token
    for secret in (CLIENT_SECRET, WRONG_SECRET, bot.bot_token, bot.bot_refresh_token):
        assert all(secret.encode() not in page for page in pages)
        assert secret not in caplog.text
    assert "slack app installed source=slackapp workspace=T2" in caplog.text


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def locale_middleware(settings: Any) -> Iterator[None]:
    """Pages in the browser's language (Accept-Language), as a project with LocaleMiddleware has them.
    The middleware leaves the request's language active in the thread: put the default back."""
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "django.middleware.locale.LocaleMiddleware"]
    yield
    translation.deactivate()


@pytest.mark.usefixtures("locale_middleware")
def test_the_installed_page_speaks_the_browsers_language(fake: FakeSlack) -> None:
    french = Client(headers={"accept-language": "fr"})
    fake.authorize_as(team="T1", user="UADMIN1")

    page = install(french).content.decode()

    assert '<html lang="fr">' in page
    assert "<title>Installée dans Slack</title>" in page
    assert "<h1>L’application est installée</h1>" in page
    assert "Elle est installée dans <strong>Acme</strong>." in page
    assert "Vous pouvez fermer cette page et revenir à Slack." in page


@pytest.mark.usefixtures("locale_middleware")
def test_a_refusal_speaks_the_browsers_language_and_is_logged_in_english(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="django_connector_outbox.installations")
    french = Client(headers={"accept-language": "fr"})

    response = french.get("/slack/install/plain/")

    assert response.status_code == 400
    page = response.content.decode()
    assert "<h1>L’application n’a pas été installée</h1>" in page
    assert escape("La source 'plain' ne prend pas d’installations (OPTIONS 'installations').") in page
    assert "reason=The source 'plain' does not take installations (OPTIONS 'installations')." in caplog.text


def test_the_pages_stay_english_by_default(client: Client, fake: FakeSlack) -> None:
    fake.authorize_as(team="T1", user="UADMIN1")
    page = install(client).content.decode()
    assert '<html lang="en-us">' in page
    assert "<h1>The app is installed</h1>" in page and "It is installed in <strong>Acme</strong>." in page


#: A project's URLconf that forgot the install view.
urlpatterns: list[Any] = []
BUTTON = Template('{% load connector_outbox %}{% add_to_slack_button "slackapp" %}')


def test_the_add_to_slack_button_links_to_the_install_view_with_slacks_official_images() -> None:
    page = button_attributes(BUTTON.render(Context()))

    assert page["href"] == "/slack/install/slackapp/"
    assert page["alt"] == "Add to Slack"
    assert (page["width"], page["height"]) == ("139", "40")
    assert page["src"] == "https://platform.slack-edge.com/img/add_to_slack.png"
    assert page["srcset"].endswith("https://platform.slack-edge.com/img/add_to_slack@2x.png 2x")


def test_the_add_to_slack_button_installs_the_workspace_the_user_picks(client: Client, fake: FakeSlack) -> None:
    fake.authorize_as(team="T2", user="UADMIN2")
    href = button_attributes(BUTTON.render(Context()))["href"]
    location = client.get(href)["Location"]

    assert client.get(through_slack(location)).status_code == 200
    assert Installation.objects.get().workspace_id == "T2"


def test_the_add_to_slack_buttons_words_speak_the_pages_language() -> None:
    with translation.override("de"):
        assert button_attributes(BUTTON.render(Context()))["alt"] == "Zu Slack hinzufügen"


def test_the_add_to_slack_button_without_the_install_view_says_what_to_route(settings: Any) -> None:
    settings.ROOT_URLCONF = __name__  # a URLconf without the install view
    with pytest.raises(ImproperlyConfigured, match="django_connector_outbox.installations.slack_urls"):
        BUTTON.render(Context())


def button_attributes(markup: str) -> dict[str, str]:
    """The attributes of the button's link and image, one dict (the stdlib's HTML parser)."""
    found: dict[str, str] = {}

    class Parser(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            found.update({name: value or "" for name, value in attrs})

    Parser().feed(markup)
    return found
