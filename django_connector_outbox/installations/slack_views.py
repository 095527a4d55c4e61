"""The "Add to Slack" flow: `install` sends the browser to Slack's authorize page with a one-time
state; `oauth_redirect` checks the state, exchanges the code (`oauth.v2.access`, against the
connector's `base_url`) and saves the installation in the source's `SlackInstallationStore`.

Invariants:
- A state is issued for one source, lives `STATE_SECONDS`, and is used up by one conditional
  DELETE (`OAuthState.objects.consume`): a reused, expired, foreign or missing state is a 400.
- The browser that started the install carries its state in a cookie (as Bolt does), so a
  redirect bearing a state this browser was not given is refused: nobody can complete an
  install started elsewhere by sending a link.
- Nothing is saved unless the whole exchange succeeded (the code, `auth.test`, and for an
  org-wide install `auth.teams.list`); a refusal is a page with a 400 (502 when Slack could not
  be reached or failed), never a traceback.
- The client secret and the tokens never reach a page, a log line or an exception text: pages
  say what failed in fixed words and Slack's error code, and the slack-sdk client used here
  does not log at DEBUG (where slack-sdk prints response bodies, tokens included).
- The pages speak the request's language (gettext, under Django's LocaleMiddleware); the log
  lines stay English, as Django's own.

Reads the source's OPTIONS: `installations` (True), `client_id`, `client_secret`, `scopes` (a
list or a comma-separated string), optional `user_scopes`, `base_url`, `timeout` and
`success_url` (a URL or URL name to redirect to once installed; else a page says so).
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode, urljoin

from django.db import router, transaction
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.module_loading import import_string
from django.utils.translation import gettext, gettext_noop
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.oauth.installation_store import Installation

from django_connector_outbox.conf import conf, seconds
from django_connector_outbox.connectors.slack import DEFAULT_BASE_URL, DEFAULT_TIMEOUT, SlackConnector
from django_connector_outbox.installations.slack import SlackInstallationStore
from django_connector_outbox.models import Installation as InstallationRow
from django_connector_outbox.models import OAuthState

logger = logging.getLogger("django_connector_outbox.installations")

#: How long an install may take between the redirect to Slack and the one back.
STATE_SECONDS = 600
#: The cookie that binds a state to the browser that started the install.
STATE_COOKIE = "connector_outbox_slack_state"
#: At most this many pages of auth.teams.list (100 teams each) for an org-wide install.
TEAM_PAGES = 100

# slack-sdk logs every request and response at DEBUG when its logger's own level allows it,
# bodies included: the answer of oauth.v2.access holds the new tokens. This client's logger
# never goes below INFO, so those lines are never written.
_sdk_logger = logging.getLogger("django_connector_outbox.installations.slack_sdk")
_sdk_logger.setLevel(logging.INFO)


class Refused(Exception):
    """An install that cannot go on: shown to the user in their language (`shown`) and logged in
    English (`message`), so it never holds a secret. `text` is an English template marked with
    `gettext_noop`, filled with `values` once translated."""

    def __init__(self, text: str, status: int = 400, **values: Any) -> None:
        self.text = text
        self.values = values
        self.message = text % values
        super().__init__(self.message)
        self.status = status

    def shown(self) -> str:
        """The message in the active language (the request's, under LocaleMiddleware)."""
        return gettext(self.text) % self.values


@dataclass(frozen=True)
class SlackApp:
    """What the flow needs of a source's OPTIONS."""

    source: str
    client_id: str
    client_secret: str = field(repr=False)
    scopes: str
    user_scopes: str
    base_url: str
    timeout: float
    success_url: str

    @property
    def authorize_url(self) -> str:
        """Slack's authorize page next to its Web API: https://slack.com/api/ ->
        https://slack.com/oauth/v2/authorize (and a fake's or GovSlack's alike)."""
        base = self.base_url if self.base_url.endswith("/") else self.base_url + "/"
        return urljoin(base, "../oauth/v2/authorize")

    def client(self) -> WebClient:
        # retry_handlers=[]: a code is single-use, so a re-sent exchange could only fail.
        return WebClient(
            base_url=self.base_url, timeout=int(self.timeout), retry_handlers=[], logger=_sdk_logger
        )


def slack_app(source: str) -> SlackApp:
    """The source's app settings, or Refused saying what is missing (never a value)."""
    config = conf.CONNECTORS.get(source)
    if config is None:
        raise Refused(gettext_noop("There is no source %(source)r."), source=source)
    try:
        backend = import_string(config["BACKEND"])
    except ImportError:
        backend = None
    if not (isinstance(backend, type) and issubclass(backend, SlackConnector)):
        raise Refused(gettext_noop("The source %(source)r is not a Slack connector."), source=source)
    options: dict[str, Any] = config.get("OPTIONS", {})
    if options.get("installations") is not True:
        raise Refused(
            gettext_noop("The source %(source)r does not take installations (OPTIONS 'installations')."),
            source=source,
        )
    client_id, client_secret = options.get("client_id"), options.get("client_secret")
    for name, value in (("client_id", client_id), ("client_secret", client_secret)):
        if not isinstance(value, str) or not value.strip():
            raise Refused(
                gettext_noop("The source %(source)r has no OPTIONS %(name)r: the app cannot be installed."),
                source=source,
                name=name,
            )
    scopes = _scopes(source, "scopes", options.get("scopes"))
    if not scopes:
        raise Refused(
            gettext_noop("The source %(source)r has no OPTIONS 'scopes': the app cannot be installed."),
            source=source,
        )
    base_url = options.get("base_url", DEFAULT_BASE_URL)
    success_url = options.get("success_url", "")
    if not isinstance(base_url, str) or not isinstance(success_url, str):
        raise Refused(
            gettext_noop("The source %(source)r has a 'base_url' or 'success_url' that is not a string."),
            source=source,
        )
    try:
        timeout = seconds(options.get("timeout", DEFAULT_TIMEOUT))
    except TypeError:
        timeout = DEFAULT_TIMEOUT
    return SlackApp(
        source=source,
        client_id=str(client_id).strip(),
        client_secret=str(client_secret).strip(),
        scopes=scopes,
        user_scopes=_scopes(source, "user_scopes", options.get("user_scopes")),
        base_url=base_url,
        timeout=max(timeout, 1.0),
        success_url=success_url,
    )


@never_cache
@require_GET
def install(request: HttpRequest, source: str) -> HttpResponse:
    """Redirect to Slack's authorize page with a new one-time state (also set in a cookie)."""
    try:
        app = slack_app(source)
    except Refused as refused:
        return _refusal(request, source, refused)
    now = timezone.now()
    OAuthState.objects.expired(now).delete()  # what nobody came back for
    state = secrets.token_hex(32)
    OAuthState.objects.create(
        state=state, source=source, created_at=now, expires_at=now + timedelta(seconds=STATE_SECONDS)
    )
    query = {"client_id": app.client_id, "scope": app.scopes}
    if app.user_scopes:
        query["user_scope"] = app.user_scopes
    query.update(redirect_uri=_redirect_uri(request, source), state=state)
    response = HttpResponseRedirect(f"{app.authorize_url}?{urlencode(query)}")
    response.set_cookie(
        STATE_COOKIE,
        state,
        max_age=STATE_SECONDS,
        path=_redirect_path(source),
        secure=request.is_secure(),
        httponly=True,
        samesite="Lax",  # sent on Slack's redirect back, a top-level GET from another site
    )
    return response


@never_cache
@require_GET
def oauth_redirect(request: HttpRequest, source: str) -> HttpResponse:
    """Slack's redirect back: check the state, exchange the code, save the installation."""
    try:
        app = slack_app(source)
        installation = _complete(request, app)
    except Refused as refused:
        response = _refusal(request, source, refused)
    else:
        logger.info(
            "slack app installed source=%s workspace=%s enterprise=%s org_wide=%s",
            source,
            installation.team_id or "",
            installation.enterprise_id or "",
            installation.is_enterprise_install,
        )
        if app.success_url:
            response = redirect(app.success_url)
        else:
            response = render(
                request,
                "django_connector_outbox/slack/installed.html",
                {
                    "source": source,
                    "team_name": installation.team_name or installation.enterprise_name or "",
                    "org_wide": installation.is_enterprise_install,
                },
            )
    response.delete_cookie(STATE_COOKIE, path=_redirect_path(source))
    return response


def _complete(request: HttpRequest, app: SlackApp) -> Installation:
    error = request.GET.get("error")
    state = request.GET.get("state", "")
    if error is not None:
        if state and request.COOKIES.get(STATE_COOKIE) == state:
            OAuthState.objects.consume(state, app.source, timezone.now())
        if error == "access_denied":
            raise Refused(
                gettext_noop(
                    "The installation was cancelled in Slack (access_denied): nothing was installed."
                )
            )
        raise Refused(
            gettext_noop("Slack did not complete the installation (%(error)s): nothing was installed."),
            error=error[:100],
        )
    if not state or request.COOKIES.get(STATE_COOKIE) != state:
        raise Refused(
            gettext_noop(
                "This installation was not started in this browser (its state does not match): "
                "start again from the install link."
            )
        )
    if not OAuthState.objects.consume(state, app.source, timezone.now()):
        raise Refused(
            gettext_noop(
                "This installation link has expired or was already used: start again from the install link."
            )
        )
    code = request.GET.get("code", "")
    if not code:
        raise Refused(gettext_noop("Slack's redirect carries no code: start again from the install link."))
    installation, team_ids = _exchange(app, code, _redirect_uri(request, app.source))
    store = SlackInstallationStore(app.source)
    with transaction.atomic(using=router.db_for_write(InstallationRow)):
        store.save(installation)
        if installation.is_enterprise_install and installation.enterprise_id:
            store.installations.set_teams(installation.enterprise_id, team_ids)
    return installation


def _exchange(app: SlackApp, code: str, redirect_uri: str) -> tuple[Installation, list[str]]:
    """oauth.v2.access, then auth.test (and auth.teams.list for an org-wide install), mapped to
    slack-sdk's Installation as Bolt's OAuthFlow.run_installation maps them."""
    client = app.client()
    try:
        answer = client.oauth_v2_access(
            client_id=app.client_id, client_secret=app.client_secret, code=code, redirect_uri=redirect_uri
        )
        bot_token = answer.get("access_token")
        if not isinstance(bot_token, str) or answer.get("token_type") != "bot":
            raise Refused(
                gettext_noop("Slack granted no bot token: the app's OPTIONS 'scopes' must name bot scopes.")
            )
        is_enterprise_install = bool(answer.get("is_enterprise_install"))
        # oauth.v2.access does not give the bot id; auth.test with the new token does.
        identity = client.auth_test(token=bot_token)
        team_ids = _org_teams(client, bot_token) if is_enterprise_install else []
    except SlackApiError as e:
        raise _answered(e) from None
    except (SlackClientError, OSError, ValueError) as e:
        # Unreachable, timed out, or an answer that is not Slack's JSON. The exception's text
        # is not shown: it may quote a request.
        logger.warning("slack install: Slack unreachable source=%s error=%s", app.source, type(e).__name__)
        raise Refused(
            gettext_noop("Slack could not be reached to complete the installation: try again."), 502
        ) from None
    enterprise: dict[str, Any] = answer.get("enterprise") or {}
    team: dict[str, Any] = answer.get("team") or {}
    installer: dict[str, Any] = answer.get("authed_user") or {}
    incoming_webhook: dict[str, Any] = answer.get("incoming_webhook") or {}
    installation = Installation(
        app_id=answer.get("app_id"),
        enterprise_id=enterprise.get("id"),
        enterprise_name=enterprise.get("name"),
        enterprise_url=identity.get("url") if is_enterprise_install else None,
        team_id=team.get("id"),
        team_name=team.get("name"),
        bot_token=bot_token,
        bot_id=identity.get("bot_id"),
        bot_user_id=answer.get("bot_user_id"),
        bot_scopes=answer.get("scope") or "",
        bot_refresh_token=answer.get("refresh_token"),
        bot_token_expires_in=answer.get("expires_in"),
        user_id=installer.get("id") or "",
        user_token=installer.get("access_token"),
        user_scopes=installer.get("scope") or "",
        user_refresh_token=installer.get("refresh_token"),
        user_token_expires_in=installer.get("expires_in"),
        incoming_webhook_url=incoming_webhook.get("url"),
        incoming_webhook_channel=incoming_webhook.get("channel"),
        incoming_webhook_channel_id=incoming_webhook.get("channel_id"),
        incoming_webhook_configuration_url=incoming_webhook.get("configuration_url"),
        is_enterprise_install=is_enterprise_install,
        token_type=answer.get("token_type"),
    )
    if not (installation.team_id or (is_enterprise_install and installation.enterprise_id)):
        raise Refused(gettext_noop("Slack's answer names no workspace: nothing was installed."), 502)
    return installation, team_ids


def _org_teams(client: WebClient, token: str) -> list[str]:
    """The teams an org-wide installation serves (auth.teams.list, every page)."""
    teams: list[str] = []
    cursor = None
    for _ in range(TEAM_PAGES):
        page = client.auth_teams_list(token=token, cursor=cursor, limit=100)
        teams.extend(str(t["id"]) for t in page.get("teams") or () if t.get("id"))
        cursor = (page.get("response_metadata") or {}).get("next_cursor")
        if not cursor:
            break
    return teams


def _answered(error: SlackApiError) -> Refused:
    """Slack's refusal as a page: its error code (a 400), or a 502 for a failure of Slack's."""
    response = error.response
    code = response.get("error") if isinstance(response.data, dict) else None
    if response.status_code >= 500 or not isinstance(code, str):
        return Refused(
            gettext_noop("Slack failed to complete the installation (HTTP %(http)s): try again."),
            502,
            http=response.status_code,
        )
    return Refused(
        gettext_noop("Slack refused the installation (%(code)s): start again from the install link."),
        code=code[:100],
    )


def _scopes(source: str, name: str, value: Any) -> str:
    """A list of scopes or a comma-separated string, as Slack's `scope` takes them."""
    if value is None:
        return ""
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, (list, tuple)) or not all(isinstance(s, str) for s in value):
        raise Refused(
            gettext_noop("The source %(source)r has OPTIONS %(name)r that are not a list of scopes."),
            source=source,
            name=name,
        )
    return ",".join(s.strip() for s in value if s.strip())


def _redirect_path(source: str) -> str:
    return reverse("connector_outbox_slack:oauth_redirect", args=[source])


def _redirect_uri(request: HttpRequest, source: str) -> str:
    """Absolute, from the request: the same in the authorize request and in the exchange, as
    Slack requires."""
    return request.build_absolute_uri(_redirect_path(source))


def _refusal(request: HttpRequest, source: str, refused: Refused) -> HttpResponse:
    logger.warning(
        "slack install refused source=%s status=%s reason=%s", source, refused.status, refused.message
    )
    return render(
        request,
        "django_connector_outbox/slack/refused.html",
        {"source": source, "message": refused.shown()},
        status=refused.status,
    )
