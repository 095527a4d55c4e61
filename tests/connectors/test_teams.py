"""The Teams connector against the fake Azure AD and Bot Connector, over real sockets, with its
tenants' installations in the database. The tests that take `teams` or `form` run through both
forms: the blocking methods and the coroutines (the installation and a due token off the loop)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import pytest
from django.core import checks

from django_connector_outbox.connectors import (
    CannotCheck,
    Delivered,
    Hold,
    MaybeSent,
    RateLimited,
    Refused,
    RetryLater,
)
from django_connector_outbox.connectors.teams import PERSONAL_INTERVAL, AppToken, TeamsConnector
from django_connector_outbox.fakes import teams as ft
from django_connector_outbox.fakes.base import Limit
from django_connector_outbox.installations import Installations, NotInstalled
from django_connector_outbox.installations.teams import TeamsInstallations
from django_connector_outbox.posts import ClaimedPost, Parent, Scope
from tests.connectors.helpers import claimed_post, in_form

pytestmark = pytest.mark.django_db

TENANT = ft.TENANT
CHANNEL = ft.CHANNEL
GROUP = "19:groupchat0000000000000000000@thread.v2"
PERSONAL = "a:1personal-chat-id"
PASSWORD = ft.APP_PASSWORD


@pytest.fixture
def fake() -> Iterator[ft.FakeTeams]:
    with ft.running(conversations=(CHANNEL, GROUP, PERSONAL)) as server:
        yield server


@pytest.fixture
def teams(fake: ft.FakeTeams, form: str) -> Iterator[TeamsConnector]:
    TeamsInstallations("teams").save(TENANT, service_url=fake.service_url, team_name="Contoso")
    connector = in_form(form, connect(fake))
    yield connector
    connector.close()


def connect(fake: ft.FakeTeams, **options: Any) -> TeamsConnector:
    return TeamsConnector(
        source="teams",
        **{
            "app_id": ft.APP_ID,
            "app_password": PASSWORD,
            "login_url": fake.login_url,
            "timeout": 1,
            **options,
        },
    )


def post(
    kind: str = "message",
    body: dict[str, Any] | None = None,
    *,
    post_id: str = "post-1",
    conversation: str = CHANNEL,
    tenant: str = TENANT,
    thread: str = "",
    ref: str | None = None,
    parent: Parent | None = None,
) -> ClaimedPost:
    claim = claimed_post(
        "teams",
        post_id,
        {"text": "hello"} if body is None else body,
        kind=kind,
        workspace_id=tenant,
        container_id=conversation,
        thread_id=thread,
        message_ref=ref,
    )
    return claim if parent is None else replace(claim, parent=parent)


# -- message and status ----------------------------------------------------------------


def test_a_message_is_an_activity_posted_to_its_conversation_and_its_ref_is_the_activity_id(teams, fake):
    card = {
        "contentType": "application/vnd.microsoft.card.adaptive",
        "content": {"type": "AdaptiveCard", "version": "1.5", "body": []},
    }
    outcome = teams.send(post(body={"text": "hello", "textFormat": "markdown", "attachments": [card]}))
    [activity] = fake.activities(CHANNEL)
    assert outcome == Delivered(activity.id)
    [call] = fake.calls_of("create")
    assert call.conversation == CHANNEL
    assert call.body == {"type": "message", "text": "hello", "textFormat": "markdown", "attachments": [card]}
    assert [c.body["tenant"] for c in fake.calls_of("token")] == ["botframework.com"]


def test_a_status_is_created_once_then_updated_in_place(teams, fake):
    created = teams.send(post("status", {"text": "deploying"}))
    assert isinstance(created, Delivered) and created.message_ref
    edited = teams.send(post("status", {"text": "deployed"}, ref=created.message_ref))
    assert edited == Delivered(created.message_ref)
    [activity] = fake.activities(CHANNEL)
    assert (activity.text, activity.edits) == ("deployed", 1)
    [update] = fake.calls_of("update")
    assert update.activity_id == created.message_ref and update.body["id"] == created.message_ref


def test_a_reply_goes_to_the_parents_reply_chain(teams, fake):
    root = teams.send(post(post_id="root"))
    assert isinstance(root, Delivered) and root.message_ref
    parent = Parent(post_id="root", state="posted", message_ref=root.message_ref, thread_id="")
    thread = teams.reply_thread(parent)
    assert thread == root.message_ref
    assert isinstance(teams.send(post(post_id="reply", thread=thread, parent=parent)), Delivered)
    reply_of_reply = Parent(post_id="reply", state="posted", message_ref="999", thread_id=thread)
    assert teams.reply_thread(reply_of_reply) == thread  # a reply to a reply stays in the chain
    [_, reply] = fake.activities(CHANNEL)
    assert reply.reply_to == root.message_ref
    assert fake.calls_of("create")[1].conversation == f"{CHANNEL};messageid={root.message_ref}"


def test_a_personal_chat_holds_its_conversation_after_each_write(teams):
    outcome = teams.send(post(conversation=PERSONAL))
    assert isinstance(outcome, Delivered)
    assert outcome.hold == Hold(PERSONAL_INTERVAL, "teams personal chat: at most 1800 messages an hour")
    assert teams.send(post(conversation=GROUP)).hold is None


def test_a_body_that_sets_the_place_is_refused_without_a_request(teams, fake):
    outcome = teams.send(post(body={"text": "x", "conversation": {"id": "elsewhere"}}))
    assert outcome == Refused("teams body may not set conversation: the outbox sets it from the post")
    assert fake.calls == []


# -- installations ---------------------------------------------------------------------


def test_a_tenant_without_an_installation_fails_its_posts_without_a_request(teams, fake):
    outcome = teams.send(post(tenant="other-tenant"))
    assert outcome == Refused(
        "workspace other-tenant has no installation of source 'teams': install the app again"
    )
    assert fake.calls == []


def test_a_removed_tenant_fails_its_posts_and_saving_it_again_restores_it(teams, fake):
    assert TeamsInstallations("teams").remove(TENANT)
    teams.installations.forget()
    outcome = teams.send(post())
    assert isinstance(outcome, Refused) and "was revoked (the bot was removed)" in outcome.reason
    TeamsInstallations("teams").save(TENANT, service_url=fake.service_url)
    teams.installations.forget()
    assert isinstance(teams.send(post()), Delivered)


def test_an_installation_is_recorded_from_the_bots_install_activity(fake):
    activity = {
        "type": "conversationUpdate",
        "serviceUrl": fake.service_url,
        "conversation": {"id": CHANNEL, "tenantId": TENANT},
        "channelData": {
            "tenant": {"id": TENANT},
            "team": {"id": CHANNEL, "name": "Contoso"},
            "eventType": "teamMemberAdded",
        },
    }
    row = TeamsInstallations("teams").save_activity(activity)
    assert (row.workspace_id, row.team_name, row.extra, row.secrets != "") == (
        TENANT, "Contoso", {"service_url": fake.service_url}, True,
    )  # fmt: skip
    credentials = Installations("teams", needs_token=False).credentials(TENANT)
    assert (credentials.token, credentials.extra["service_url"]) == ("", fake.service_url)


def test_an_installation_needs_a_tenant_and_an_http_service_url():
    with pytest.raises(ValueError, match="tenant id"):
        TeamsInstallations("teams").save_activity({"serviceUrl": "https://smba.trafficmanager.net/teams/"})
    with pytest.raises(ValueError, match="http"):
        TeamsInstallations("teams").save(TENANT, service_url="smba.trafficmanager.net")


def test_installations_without_a_token_are_refused_unless_the_platform_needs_none():
    Installations("slack").save("T1", secrets={})
    with pytest.raises(NotInstalled, match="has no token"):
        Installations("slack").credentials("T1")
    assert Installations("slack", needs_token=False).credentials("T1").token == ""


# -- the token -------------------------------------------------------------------------


def test_the_token_is_fetched_once_and_reused(teams, fake):
    for n in range(3):
        assert isinstance(teams.send(post(post_id=f"p{n}")), Delivered)
    assert len(fake.calls_of("token")) == 1


def test_a_refused_token_is_renewed_once_within_the_send(teams, fake):
    assert isinstance(teams.send(post(post_id="p1")), Delivered)
    fake.expire_tokens()
    assert isinstance(teams.send(post(post_id="p2")), Delivered)
    assert len(fake.calls_of("token")) == 2
    assert [c.authorized for c in fake.calls_of("create")] == [True, False, True]
    assert len(fake.activities(CHANNEL)) == 2


def test_a_token_refused_twice_is_refused(teams, fake):
    fake.script("create", ft.error(401, "Unauthorized"), times=2)
    outcome = teams.send(post())
    assert outcome == Refused("teams 401 Unauthorized: scripted Unauthorized")
    assert len(fake.calls_of("token")) == 2


def test_a_token_is_renewed_before_it_expires():
    now = [0.0]
    fetched: list[int] = []

    def fetch() -> tuple[str, float]:
        fetched.append(1)
        return f"t{len(fetched)}", 3600.0

    token = AppToken(fetch, clock=lambda: now[0])
    assert token.get() == "t1"
    now[0] = 3600 - 301
    assert token.get() == "t1"
    now[0] = 3600 - 299
    assert token.get() == "t2"


def test_one_thread_fetches_the_token_while_the_others_wait_for_it(fake):
    connector = connect(fake)
    fake.script("token", ft.delay(0.3))
    start = threading.Barrier(8)

    def get(_: int) -> str:
        start.wait()
        return connector.token.get()

    with ThreadPoolExecutor(8) as pool:
        tokens = set(pool.map(get, range(8)))
    assert len(tokens) == 1 and len(fake.calls_of("token")) == 1
    connector.close()


def test_a_bad_app_password_is_a_retry_whose_reason_names_azure_ads_error(fake, form):
    TeamsInstallations("teams").save(TENANT, service_url=fake.service_url)
    connector = in_form(form, connect(fake, app_password="wrong-password-0123456789"))
    outcome = connector.send(post())
    assert outcome == RetryLater(
        "teams token: HTTP 401 invalid_client AADSTS7000215: Invalid client secret provided."
    )
    assert fake.calls_of("create") == []
    connector.close()


def test_a_single_tenant_bot_asks_its_own_tenant(teams, fake):
    connector = connect(fake, tenant_id=TENANT)
    assert isinstance(connector.send(post()), Delivered)
    assert fake.calls_of("token")[-1].body["tenant"] == TENANT
    connector.close()


# -- delete ----------------------------------------------------------------------------


def test_a_delete_removes_the_activity_of_its_ref(teams, fake):
    sent = teams.send(post())
    kept = teams.send(post(post_id="other", body={"text": "kept"}))
    assert isinstance(sent, Delivered) and isinstance(kept, Delivered)

    assert teams.send(post("delete", {}, post_id="d", ref=sent.message_ref)) == Delivered(sent.message_ref)

    assert [a.text for a in fake.activities(CHANNEL)] == ["kept"]
    [call] = fake.calls_of("delete")
    assert (call.conversation, call.activity_id, call.body) == (CHANNEL, sent.message_ref, None)


def test_a_reply_is_deleted_in_its_reply_chain_and_a_root_deleted_keeps_its_chain(teams, fake):
    root = teams.send(post(post_id="root"))
    reply = teams.send(post(post_id="reply", thread=root.message_ref))
    assert isinstance(root, Delivered) and isinstance(reply, Delivered)

    assert teams.send(post("delete", {}, post_id="d1", ref=root.message_ref)) == Delivered(root.message_ref)
    assert [a.text for a in fake.activities(CHANNEL)] == ["hello"]  # the reply stays
    delete = post("delete", {}, post_id="d2", thread=root.message_ref, ref=reply.message_ref)
    assert teams.send(delete) == Delivered(reply.message_ref)

    assert fake.activities(CHANNEL) == []
    assert fake.calls_of("delete")[1].conversation == f"{CHANNEL};messageid={root.message_ref}"


def test_a_delete_of_an_activity_gone_already_is_done(teams, fake):
    sent = teams.send(post())
    delete = post("delete", {}, post_id="d", ref=sent.message_ref)
    assert teams.send(delete) == Delivered(sent.message_ref)
    assert teams.send(delete) == Delivered(sent.message_ref)  # the 404 of a second try
    assert fake.statuses[404] == 1


def test_a_404_that_is_not_the_bot_connectors_is_no_delete(teams, fake):
    sent = teams.send(post())
    fake.script("delete", ft.html(404))
    outcome = teams.send(post("delete", {}, post_id="d", ref=sent.message_ref))
    assert isinstance(outcome, Refused)
    assert len(fake.activities(CHANNEL)) == 1


def test_a_delete_whose_reply_is_lost_is_retried_and_never_looked_up(teams, fake):
    sent = teams.send(post())
    fake.script("delete", ft.drop())
    delete = post("delete", {}, post_id="d", ref=sent.message_ref)

    assert isinstance(teams.send(delete), RetryLater)
    assert fake.activities(CHANNEL) == []  # deleted before the reply was lost
    assert teams.find_sent(delete) is None
    assert teams.send(delete) == Delivered(sent.message_ref)


def test_a_delete_with_a_refused_token_renews_it_once(teams, fake):
    sent = teams.send(post())
    fake.expire_tokens()
    assert teams.send(post("delete", {}, post_id="d", ref=sent.message_ref)) == Delivered(sent.message_ref)
    assert [c.authorized for c in fake.calls_of("delete")] == [False, True]


def test_a_delete_in_a_conversation_the_bot_left_is_refused(teams, fake):
    sent = teams.send(post())
    fake.conversations[CHANNEL].bot_member = False
    outcome = teams.send(post("delete", {}, post_id="d", ref=sent.message_ref))
    assert outcome == Refused(
        "teams 403 BotNotInConversationRoster: The bot is not part of the conversation roster."
    )
    assert len(fake.activities(CHANNEL)) == 1


def test_a_rate_limited_delete_waits_its_retry_after(teams, fake):
    sent = teams.send(post())
    fake.script("delete", ft.ratelimit(3))
    outcome = teams.send(post("delete", {}, post_id="d", ref=sent.message_ref))
    assert outcome == RateLimited(3.0, "teams 429 TooManyRequests: Too many requests.", Scope.CONTAINER)


def test_a_delete_without_a_message_ref_is_refused_without_a_request(teams, fake):
    assert isinstance(teams.send(post("delete", {}, post_id="d")), Refused)
    assert fake.calls == []


# -- errors ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "code"),
    [(400, "BadArgument"), (403, "BotNotInConversationRoster"), (404, "ConversationNotFound")],
)
def test_permanent_errors_are_refused_with_teams_code(teams, fake, status, code):
    fake.script("create", ft.error(status, code))
    assert teams.send(post()) == Refused(f"teams {status} {code}: scripted {code}")


def test_a_conversation_the_bot_left_is_refused(teams, fake):
    fake.add_conversation("19:left@thread.tacv2", bot_member=False)
    outcome = teams.send(post(conversation="19:left@thread.tacv2"))
    assert outcome == Refused(
        "teams 403 BotNotInConversationRoster: The bot is not part of the conversation roster."
    )


def test_a_429_waits_its_retry_after_in_its_conversation(teams, fake):
    fake.script("create", ft.ratelimit(3))
    assert teams.send(post()) == RateLimited(
        3.0, "teams 429 TooManyRequests: Too many requests.", Scope.CONTAINER
    )


def test_429s_from_two_conversations_of_a_tenant_hold_the_tenant(teams, fake):
    fake.script("create", ft.ratelimit(1), times=2)
    assert teams.send(post(conversation=CHANNEL)).scope == Scope.CONTAINER
    outcome = teams.send(post(conversation=GROUP))
    assert isinstance(outcome, RateLimited) and outcome.scope == Scope.WORKSPACE
    assert "the tenant's limit" in outcome.reason


def test_a_429_without_retry_after_waits_a_default(fake, form):
    fake.retry_after_header = False
    TeamsInstallations("teams").save(TENANT, service_url=fake.service_url)
    connector = in_form(form, connect(fake))
    fake.script("create", ft.ratelimit())
    outcome = connector.send(post())
    assert isinstance(outcome, RateLimited) and outcome.after == 2.0
    connector.close()


def test_the_fakes_thread_limits_answer_429_past_seven_a_second(teams, fake):
    fake.thread_limits = ft.THREAD_LIMITS
    outcomes = [teams.send(post(post_id=f"p{n}")) for n in range(8)]
    assert all(isinstance(o, Delivered) for o in outcomes[:7])
    assert isinstance(outcomes[7], RateLimited) and outcomes[7].after >= 1


def test_a_503_with_retry_after_is_a_rate_limit_and_without_it_may_have_posted(teams, fake):
    fake.script("create", ft.unavailable(5), ft.html(503))
    assert teams.send(post()) == RateLimited(5.0, "teams 503 ServiceUnavailable: scripted ServiceUnavailable")
    assert teams.send(post()) == MaybeSent("teams 503 Service Unavailable")


def test_412_is_retried(teams, fake):
    fake.script("create", ft.error(412, "PreconditionFailed"))
    assert teams.send(post()) == RetryLater("teams 412 PreconditionFailed: scripted PreconditionFailed")


def test_a_5xx_on_a_create_may_have_posted_and_on_an_update_is_retried(teams, fake):
    fake.script("create", ft.html(502))
    assert teams.send(post()) == MaybeSent("teams 502 Bad Gateway")
    created = teams.send(post("status", {"text": "v1"}))
    fake.script("update", ft.error(500, "InternalServerError"))
    assert teams.send(post("status", {"text": "v2"}, ref=created.message_ref)) == RetryLater(
        "teams 500 InternalServerError: scripted InternalServerError"
    )


def test_a_lost_reply_on_a_create_is_maybe_sent_and_reached_teams_once(teams, fake):
    fake.script("create", ft.drop())
    assert isinstance(teams.send(post()), MaybeSent)
    assert len(fake.calls_of("create")) == 1 and len(fake.activities(CHANNEL)) == 1


def test_a_lost_reply_on_an_update_is_a_retry(teams, fake):
    created = teams.send(post("status", {"text": "v1"}))
    fake.script("update", ft.drop())
    assert isinstance(teams.send(post("status", {"text": "v2"}, ref=created.message_ref)), RetryLater)


def test_a_request_that_never_left_is_a_retry(fake, form):
    TeamsInstallations("teams").save(TENANT, service_url="http://127.0.0.1:9/teams/")
    connector = in_form(form, connect(fake))
    connector.token.get()
    assert isinstance(connector.send(post()), RetryLater)
    connector.close()


def test_an_update_of_a_gone_activity_is_refused(teams, fake):
    outcome = teams.send(post("status", {"text": "v2"}, ref="1234"))
    assert outcome == Refused("teams 404 ActivityNotFound: Activity not found.")


def test_posts_cannot_be_looked_up(teams):
    with pytest.raises(CannotCheck, match="only Microsoft Graph can"):
        teams.find_sent(post())


# -- secrets and checks ----------------------------------------------------------------


def test_the_password_and_token_are_in_no_reason_or_log_line(teams, fake, caplog):
    caplog.set_level(logging.DEBUG)
    assert isinstance(teams.send(post()), Delivered)
    token = teams.token.value
    assert token
    fake.script("create", ft.error(400, f"echo {PASSWORD} {token}"))
    outcome = teams.send(post())
    assert isinstance(outcome, Refused) and PASSWORD not in outcome.reason and token not in outcome.reason
    texts = [r.getMessage() for r in caplog.records]
    assert texts and all(PASSWORD not in t and token not in t for t in texts)
    assert PASSWORD not in repr(teams)


def check_ids(**options: Any) -> list[tuple[str, str]]:
    return [(m.id, m.msg) for m in TeamsConnector(source="t", **options).check() if m.level >= checks.ERROR]


def test_checks_accept_a_good_configuration():
    assert check_ids(app_id=ft.APP_ID, app_password=PASSWORD) == []
    assert check_ids(app_id=ft.APP_ID, app_password=PASSWORD, tenant_id=TENANT) == []


def test_checks_report_each_bad_option():
    where = "CONNECTOR_OUTBOX source 't'"
    assert check_ids() == [
        ("connector_outbox.E241", f"{where}: Teams needs the bot's Microsoft App ID in OPTIONS['app_id']."),
        (
            "connector_outbox.E242",
            f"{where}: Teams needs the bot's client secret in OPTIONS['app_password'].",
        ),
    ]
    good = {"app_id": ft.APP_ID, "app_password": PASSWORD}
    assert check_ids(**good, tenant_id="") == [
        (
            "connector_outbox.E243",
            f"{where}: OPTIONS['tenant_id'] must be the bot's tenant id (a single-tenant bot) or "
            "'botframework.com' (a multi-tenant bot), not ''.",
        )
    ]
    assert check_ids(**good, login_url="login.microsoftonline.com") == [
        (
            "connector_outbox.E244",
            f"{where}: OPTIONS['login_url'] must be an http(s) URL, not 'login.microsoftonline.com'.",
        )
    ]
    assert check_ids(**good, timeout=-1) == [
        (
            "connector_outbox.E245",
            f"{where}: OPTIONS['timeout'] must be a positive number of seconds (or a timedelta), not -1.",
        )
    ]


def test_values_read_with_their_newline_are_stripped(fake):
    connector = connect(fake, app_password=PASSWORD + "\n", app_id=ft.APP_ID + "\n")
    assert connector.check() == []
    assert connector.token.get()
    connector.close()


def test_the_limits_record_accepted_writes(teams, fake):
    fake.thread_limits = (Limit(2, 1.0),)
    teams.send(post(post_id="a"))
    teams.send(post(post_id="b"))
    assert isinstance(teams.send(post(post_id="c")), RateLimited)
    assert len(fake.accepted_times(CHANNEL)) == 2 and fake.statuses[429] == 1


def test_the_fake_runs_in_a_process_of_its_own_and_shows_its_state():
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "django_connector_outbox.fakes.teams",
            "--conversation",
            GROUP,
            "--documented-limits",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        login_url = process.stdout.readline().strip()
        form = urllib.parse.urlencode(
            {
                "grant_type": "client_credentials",
                "client_id": ft.APP_ID,
                "client_secret": PASSWORD,
                "scope": ft.SCOPE,
            }
        ).encode()
        with urllib.request.urlopen(
            f"{login_url}/botframework.com/oauth2/v2.0/token", form, timeout=5
        ) as reply:
            assert json.load(reply)["token_type"] == "Bearer"
        with urllib.request.urlopen(f"{login_url}/_fake/state", timeout=5) as reply:
            state = json.load(reply)
        assert state["token_requests"] == ["botframework.com"] and list(state["conversations"]) == [GROUP]
    finally:
        process.terminate()
        assert process.wait(timeout=10) == 0
        assert process.stdout is not None
        process.stdout.close()
