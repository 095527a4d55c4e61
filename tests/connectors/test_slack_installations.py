"""The Slack connector with installations: each workspace's token, its refresh and its revocation,
against the fake Slack serving several teams (django_connector_outbox/fakes/slack_teams.py) and a real database."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from django.core import checks
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client import REGISTRY

import django_connector_outbox.metrics  # noqa: F401 - connects the installation counters
from django_connector_outbox.connectors import slack as slack_module
from django_connector_outbox.connectors.base import (
    CannotCheck,
    Delivered,
    Outcome,
    RateLimited,
    Refused,
    RetryLater,
)
from django_connector_outbox.connectors.slack import SlackConnector
from django_connector_outbox.connectors.slack_installations import TEAMS_INTERVAL, Clients
from django_connector_outbox.fakes.slack import FakeSlack, error
from django_connector_outbox.fakes.slack_teams import CLIENT_ID, CLIENT_SECRET
from django_connector_outbox.installations import Installations
from django_connector_outbox.installations.sealing import seal
from django_connector_outbox.installations.store import REFRESH_TOKEN, TOKEN
from django_connector_outbox.models import Installation
from django_connector_outbox.posts import ClaimedPost, Scope
from tests.connectors.helpers import CoroutineForm, claimed_post

SOURCE = "slack-many"
TEAMS = {"T0000000A01": "C00000000A1", "T0000000B02": "C00000000B2", "T0000000C03": "C00000000C3"}
TA, TB, TC = TEAMS


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSlack]:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    server = FakeSlack(channels=()).start()
    yield server
    server.stop()


def connect(fake: FakeSlack, **options: Any) -> SlackConnector:
    return SlackConnector(
        source=SOURCE,
        installations=True,
        client_id=CLIENT_ID,
        client_secret=CLIENT_SECRET,
        **{"base_url": fake.base_url, "timeout": 3, **options},
    )


@pytest.fixture
def connector(fake: FakeSlack) -> SlackConnector:
    return connect(fake)


def save(
    answer: dict[str, Any], workspace_id: str, *, expires_in: float | None = None, **fields: Any
) -> None:
    """Save what oauth.v2.access answered as the workspace's installation; `expires_in`
    (seconds from now) overrides when the database thinks the token expires."""
    now = timezone.now()
    lifetime = answer.get("expires_in")
    Installations(SOURCE).save(
        workspace_id,
        secrets={TOKEN: answer["access_token"], REFRESH_TOKEN: answer.get("refresh_token", "")},
        token_issued_at=now
        if lifetime is None
        else now - timedelta(seconds=lifetime - (expires_in or lifetime)),
        token_expires_at=None if lifetime is None else now + timedelta(seconds=expires_in or lifetime),
        **fields,
    )


def install(
    fake: FakeSlack, team: str, *, rotation: bool = False, expires_in: float | None = None
) -> dict[str, Any]:
    answer = fake.add_team(team, rotation=rotation, channels=(TEAMS[team],))
    assert answer is not None
    save(answer, team, expires_in=expires_in)
    return answer


def post(team: str, post_id: str = "p1", **more: Any) -> ClaimedPost:
    return claimed_post(
        SOURCE, post_id, {"text": f"hello {post_id}"}, workspace_id=team, container_id=TEAMS[team], **more
    )


def row(team: str) -> Installation:
    return Installation.objects.get(source=SOURCE, workspace_id=team)


def counter(name: str) -> float:
    return REGISTRY.get_sample_value(f"connector_outbox_installation_{name}_total", {"source": SOURCE}) or 0.0


# -- each workspace's own token


@pytest.mark.django_db
def test_each_post_is_sent_with_its_own_workspaces_token(fake: FakeSlack, connector: SlackConnector) -> None:
    for team in TEAMS:
        install(fake, team)
    outcomes = [connector.send(post(team, f"p-{team}")) for team in TEAMS for _ in range(2)]
    assert all(isinstance(o, Delivered) for o in outcomes), outcomes
    assert fake.tokens_used("chat.postMessage") == {team: {f"{team}/1"} for team in TEAMS}
    assert fake.wrong_team_calls == []
    assert len(connector.tokens.clients) == 3  # type: ignore[union-attr]


@pytest.mark.django_db
def test_a_workspace_without_installation_is_refused_without_a_request(
    fake: FakeSlack, connector: SlackConnector
) -> None:
    fake.add_team(TA, channels=(TEAMS[TA],), install=False)
    outcome = connector.send(post(TA))
    assert outcome == Refused(
        f"workspace {TA} has no installation of source {SOURCE!r}: install the app again"
    )
    assert fake.calls == []


def test_the_client_cache_keeps_one_client_per_token_and_drops_the_least_recently_used() -> None:
    made: list[str] = []
    clients = Clients(lambda token: made.append(token) or object(), size=2)  # type: ignore[arg-type, func-returns-value]
    first = clients.get("a")
    assert clients.get("a") is first
    clients.get("b")
    clients.get("a")  # "b" is now the least recently used
    clients.get("c")
    assert "b" not in clients and "a" in clients and "c" in clients
    assert made == ["a", "b", "c"]


def test_the_client_cache_is_thread_safe() -> None:
    clients = Clients(lambda token: object(), size=50)  # type: ignore[arg-type, return-value]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda i: clients.get(f"t{i % 100}"), range(5_000)))
    assert len(clients) == 50 and len(got) == 5_000


# -- rotation


@pytest.mark.django_db
def test_a_due_token_is_refreshed_before_the_call_and_replaces_its_client(
    fake: FakeSlack, connector: SlackConnector
) -> None:
    before = counter("refreshes")
    old = install(fake, TA, rotation=True, expires_in=3600)  # Slack: valid 12 h; due within 2 h
    assert isinstance(connector.send(post(TA, "p1")), Delivered)
    assert fake.refreshes[TA] == 1
    assert fake.tokens_used("chat.postMessage") == {TA: {f"{TA}/2"}}
    assert old["access_token"] not in connector.tokens.clients  # type: ignore[union-attr]
    saved = Installations(SOURCE).credentials(TA)
    assert saved.token != old["access_token"] and saved.refresh_token != old["refresh_token"]
    assert saved.expires_at is not None and saved.expires_at > timezone.now() + timedelta(hours=11)
    assert isinstance(connector.send(post(TA, "p2")), Delivered)
    assert fake.refreshes[TA] == 1
    assert counter("refreshes") == before + 1


@pytest.mark.django_db
def test_token_expired_refreshes_and_retries_the_same_call_once(
    fake: FakeSlack, connector: SlackConnector
) -> None:
    install(fake, TA, rotation=True)
    assert isinstance(connector.send(post(TA, "p1")), Delivered)
    fake.expire(TA)  # Slack expired it earlier than the database says
    outcome = connector.send(post(TA, "p2"))
    assert isinstance(outcome, Delivered), outcome
    assert fake.refreshes[TA] == 1
    assert [m.text for m in fake.messages(TEAMS[TA])] == ["hello p1", "hello p2"]
    assert [c["method"] for c in fake.state()["calls"]] == [
        "chat.postMessage",
        "chat.postMessage",  # token_expired
        "oauth.v2.access",
        "chat.postMessage",
    ]


@pytest.mark.django_db
def test_a_refresh_that_fails_for_now_holds_the_workspace_with_the_reason(
    fake: FakeSlack, connector: SlackConnector
) -> None:
    install(fake, TA, rotation=True, expires_in=600)
    install(fake, TB)
    fake.script("oauth.v2.access", error("internal_error"))
    outcome = connector.send(post(TA))
    assert outcome == RateLimited(
        after=60.0,
        scope=Scope.WORKSPACE,
        reason=f"token refresh for workspace {TA} failed: slack error internal_error on oauth.v2.access",
    )
    assert row(TA).refresh_error == "slack error internal_error on oauth.v2.access"
    assert fake.calls_of("chat.postMessage") == []
    assert isinstance(connector.send(post(TB)), Delivered)  # other workspaces go on
    assert isinstance(connector.send(post(TA, "p2")), Delivered)  # and it passes
    assert row(TA).refresh_error == ""


@pytest.mark.django_db
def test_a_refused_refresh_revokes_the_installation(fake: FakeSlack, connector: SlackConnector) -> None:
    before = counter("revocations")
    install(fake, TA, rotation=True, expires_in=600)
    fake.revoke(TA)  # its refresh token answers invalid_refresh_token
    outcome = connector.send(post(TA))
    assert isinstance(outcome, Refused)
    assert f"workspace {TA}" in outcome.reason and outcome.reason.endswith("install the app again")
    assert "invalid_refresh_token" in outcome.reason
    assert row(TA).revoked_at is not None and row(TA).secrets == ""
    assert fake.calls_of("chat.postMessage") == []
    assert counter("revocations") == before + 1


def _refresh_together(fake: FakeSlack, connectors: list[SlackConnector], threads: int) -> list[Outcome]:
    barrier = threading.Barrier(threads)

    def send(i: int) -> Outcome:
        barrier.wait()
        return connectors[i % len(connectors)].send(post(TA, f"p{i}"))

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(send, range(threads)))


@pytest.mark.django_db(transaction=True)
def test_four_threads_of_one_connector_make_one_refresh(fake: FakeSlack, connector: SlackConnector) -> None:
    install(fake, TA, rotation=True, expires_in=600)
    outcomes = _refresh_together(fake, [connector], 4)
    assert all(isinstance(o, Delivered) for o in outcomes), outcomes
    assert fake.refreshes[TA] == 1
    assert fake.tokens_used("chat.postMessage") == {TA: {f"{TA}/2"}}


@pytest.mark.django_db(transaction=True)
def test_two_senders_make_one_refresh_and_use_the_saved_token(fake: FakeSlack) -> None:
    install(fake, TA, rotation=True, expires_in=600)
    outcomes = _refresh_together(fake, [connect(fake), connect(fake)], 4)
    assert all(isinstance(o, Delivered) for o in outcomes), outcomes
    assert fake.refreshes[TA] == 1
    assert fake.tokens_used("chat.postMessage") == {TA: {f"{TA}/2"}}
    assert fake.expired_token_calls == [] and fake.stale_token_calls == []


@pytest.mark.django_db(transaction=True)
def test_token_expired_in_two_senders_makes_one_refresh(fake: FakeSlack) -> None:
    install(fake, TA, rotation=True)
    senders = [connect(fake), connect(fake)]
    for i, sender in enumerate(senders):  # both hold the token in their caches
        assert isinstance(sender.send(post(TA, f"warm{i}")), Delivered)
    fake.expire(TA)
    outcomes = _refresh_together(fake, senders, 4)
    assert all(isinstance(o, Delivered) for o in outcomes), outcomes
    assert fake.refreshes[TA] == 1


# -- revocation


@pytest.mark.django_db
@pytest.mark.parametrize("code", ["token_revoked", "account_inactive", "invalid_auth"])
def test_a_revoked_answer_revokes_the_installation_and_later_posts_make_no_request(
    fake: FakeSlack, connector: SlackConnector, code: str
) -> None:
    before = counter("revocations")
    install(fake, TA)
    install(fake, TB)
    fake.script("chat.postMessage", error(code))
    outcome = connector.send(post(TA))
    reason = (
        f"the installation of source {SOURCE!r} in workspace {TA} was revoked "
        f"(slack error {code} on chat.postMessage): install the app again"
    )
    assert outcome == Refused(reason)
    assert row(TA).revoked_at is not None and row(TA).secrets == ""
    assert row(TA).revoked_reason == f"slack error {code} on chat.postMessage"
    calls = len(fake.calls)
    assert connector.send(post(TA, "p2")) == Refused(reason)
    assert len(fake.calls) == calls  # no request for a revoked workspace
    assert isinstance(connector.send(post(TB)), Delivered)  # the others go on
    assert counter("revocations") == before + 1


@pytest.mark.django_db
def test_an_old_tokens_revoked_answer_after_a_reinstall_does_not_revoke(
    fake: FakeSlack, connector: SlackConnector
) -> None:
    install(fake, TA)
    assert isinstance(connector.send(post(TA, "p1")), Delivered)  # its token is cached
    fake.uninstall(TA)
    save(fake.install(TA), TA)  # installed again (by another process: this one's cache is stale)
    outcome = connector.send(post(TA, "p2"))
    assert isinstance(outcome, Delivered), outcome
    assert row(TA).revoked_at is None
    assert fake.tokens_used("chat.postMessage") == {TA: {f"{TA}/1", f"{TA}/2"}}


@pytest.mark.django_db
def test_a_revoked_installation_is_refused_without_a_request_and_a_reinstall_clears_it(
    fake: FakeSlack, connector: SlackConnector
) -> None:
    answer = install(fake, TA)
    Installations(SOURCE).revoke(TA, "app_uninstalled event")
    outcome = connector.send(post(TA))
    assert outcome == Refused(
        f"the installation of source {SOURCE!r} in workspace {TA} was revoked (app_uninstalled event): "
        "install the app again"
    )
    assert fake.calls == []
    save(answer, TA)
    connector.tokens.installations.forget()  # type: ignore[union-attr]  # the cache's 10 s
    assert isinstance(connector.send(post(TA, "p2")), Delivered)


@pytest.mark.django_db
def test_a_lookup_of_a_revoked_workspace_cannot_check(fake: FakeSlack, connector: SlackConnector) -> None:
    install(fake, TA)
    sent = post(TA, "p1", stale=True)
    delivered = connector.send(sent)
    assert isinstance(delivered, Delivered)
    assert connector.find_sent(sent) == delivered.message_ref  # with the workspace's token
    fake.revoke(TA)
    with pytest.raises(
        CannotCheck, match=f"lookup impossible: the installation .* workspace {TA} was revoked"
    ):
        connector.find_sent(sent)
    assert row(TA).revoked_at is not None


# -- Enterprise Grid


@pytest.mark.django_db
def test_a_team_of_an_org_wide_installation_is_found_with_auth_teams_list(
    fake: FakeSlack, connector: SlackConnector, monkeypatch: pytest.MonkeyPatch
) -> None:
    org = "E0000000001"
    fake.add_team(TA, channels=(TEAMS[TA],), install=False)
    answer = fake.add_enterprise(org, teams=(TA,), install=True)
    assert answer is not None
    save(answer, org, is_enterprise_install=True, enterprise_id=org)
    assert isinstance(connector.send(post(TA)), Delivered)
    assert fake.tokens_used("chat.postMessage") == {org: {f"{org}/1"}}
    assert row(org).extra["team_ids"] == [TA]
    # A team missed since the org's listing waits for its next listing (it may have joined)...
    fake.add_team(TB, channels=(TEAMS[TB],), install=False)
    fake.add_enterprise(org, teams=(TC,))
    fake.add_channel(TEAMS[TC], team=TC)
    for team in (TB, TC):
        outcome = connector.send(post(team))
        assert isinstance(outcome, RateLimited) and outcome.scope == Scope.WORKSPACE
        assert outcome.reason.startswith(f"workspace {team} has no installation of source {SOURCE!r}")
        assert outcome.reason.endswith("; the teams of org-wide installations are listed again in 60s")
    assert len(fake.calls_of("auth.teams.list")) == 1
    # ... and then one that joined is found, one that is in no org fails.
    tokens = connector.tokens
    assert tokens is not None
    monkeypatch.setattr(tokens, "monotonic", lambda: tokens._listed[org] + TEAMS_INTERVAL)
    assert isinstance(connector.send(post(TC)), Delivered)
    assert connector.send(post(TB)) == Refused(
        f"workspace {TB} has no installation of source {SOURCE!r}: install the app again"
    )
    assert len(fake.calls_of("auth.teams.list")) == 2
    assert fake.wrong_team_calls == []


# -- 10,000 installations


@pytest.mark.django_db
def test_with_ten_thousand_installations_a_second_send_reads_nothing(
    fake: FakeSlack, connector: SlackConnector
) -> None:
    filler = seal({TOKEN: "xoxb-filler"})
    Installation.objects.bulk_create(
        [Installation(source=SOURCE, workspace_id=f"T{i:09d}", secrets=filler) for i in range(10_000)],
        batch_size=2_000,
    )
    install(fake, TA)
    assert isinstance(connector.send(post(TA, "p1")), Delivered)
    with CaptureQueriesContext(connection) as queries:
        assert isinstance(connector.send(post(TA, "p2")), Delivered)
    assert len(queries) == 0


# -- secrets


@pytest.mark.django_db
def test_no_token_refresh_token_or_client_secret_shows_in_reasons_or_logs(
    fake: FakeSlack, connector: SlackConnector, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    a = install(fake, TA, rotation=True, expires_in=600)
    b = install(fake, TB)
    outcomes: list[Any] = [connector.send(post(TA, "p1"))]  # a refresh (oauth.v2.access at DEBUG)
    fake.script("oauth.v2.access", error("internal_error"))
    fake.expire(TA)
    outcomes.append(connector.send(post(TA, "p2")))
    fake.script("chat.postMessage", error("token_revoked"))
    outcomes.append(connector.send(post(TB, "p3")))
    dead = connect(fake, base_url="http://127.0.0.1:9/api/")
    outcomes.append(dead.send(post(TA, "p4")))
    secrets = {a["access_token"], a["refresh_token"], b["access_token"], CLIENT_SECRET}
    secrets |= {
        Installations(SOURCE).credentials(TA).token,
        Installations(SOURCE).credentials(TA).refresh_token,
    }
    text = caplog.text + repr(outcomes) + repr(list(Installation.objects.values()))
    assert [type(o) for o in outcomes] == [Delivered, RateLimited, Refused, RetryLater]
    assert not [s for s in secrets if s in text]


# -- checks


def check(**options: Any) -> list[str]:
    return [m.id or "" for m in SlackConnector(source=SOURCE, **options).check()]


def test_checks_of_the_installations_options() -> None:
    oauth = {"client_id": CLIENT_ID, "client_secret": CLIENT_SECRET}
    assert check(installations=True, **oauth) == []
    assert (
        check(installations=True, scopes=["chat:write", "channels:history"], success_url="/done/", **oauth)
        == []
    )
    assert check() == ["connector_outbox.E101"]
    assert check(token="xoxb-1", installations=True, **oauth) == ["connector_outbox.E104"]
    assert check(installations="yes", **oauth) == ["connector_outbox.E105"]
    comma = check(
        installations=True, scopes="chat:write,channels:history", user_scopes=["search:read"], **oauth
    )
    assert comma == []
    assert check(installations=True, scopes=["chat:write", ""], **oauth) == ["connector_outbox.E107"]
    assert check(installations=True, user_scopes={"chat:write"}, **oauth) == ["connector_outbox.E107"]
    assert check(installations=True, success_url=3, **oauth) == ["connector_outbox.E108"]
    assert check(token="xoxb-1", client_id=CLIENT_ID) == ["connector_outbox.E109"]


def test_installations_without_client_id_or_secret_says_which() -> None:
    [message] = SlackConnector(source=SOURCE, installations=True, client_id=CLIENT_ID).check()
    assert message == checks.Error(
        f"Connector outbox source {SOURCE!r}: the Slack OPTIONS with 'installations' need 'client_secret': "
        "token refresh and the install flow authenticate with them.",
        hint="Copy them from the app's Basic Information page at api.slack.com/apps.",
        id="connector_outbox.E106",
    )
    [both] = SlackConnector(source=SOURCE, installations=True).check()
    assert "need 'client_id' and 'client_secret'" in both.msg


@pytest.mark.django_db
def test_a_plain_token_works_as_before(fake: FakeSlack) -> None:
    built = SlackConnector(source="slack", token=fake.token, base_url=fake.base_url, timeout=2)
    fake.add_channel("C0000000009")
    assert built.tokens is None
    outcome = built.send(
        claimed_post("slack", "p1", {"text": "hi"}, workspace_id=fake.team_id, container_id="C0000000009")
    )
    assert isinstance(outcome, Delivered)
    assert not Installation.objects.exists()


@pytest.mark.django_db
def test_a_coroutine_send_whose_token_is_cached_takes_no_thread(
    fake: FakeSlack, connector: SlackConnector, monkeypatch: pytest.MonkeyPatch
) -> None:
    handed: list[object] = []
    blocking = slack_module.blocking

    async def counted(call: Any, /, *args: Any) -> Any:
        handed.append(call)
        return await blocking(call, *args)

    monkeypatch.setattr(slack_module, "blocking", counted)
    install(fake, TA)
    form = CoroutineForm(connector)
    first = form.send(post(TA, "p1"))
    read = len(handed)
    second = form.send(post(TA, "p2"))
    form.close()

    assert isinstance(first, Delivered) and isinstance(second, Delivered)
    assert read == 1  # the first send read the installation, off the loop
    assert len(handed) == read  # the second found its token in the cache: no thread
