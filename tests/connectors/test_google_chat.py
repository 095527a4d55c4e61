"""The Google Chat connector against the fake Google Chat (its token endpoint and the Chat API),
over real sockets (no database). The connector is a coroutine connector: the tests await it on
anyio's asyncio loop."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from django.core import checks

from django_connector_outbox.connectors import (
    CheckLater,
    Delivered,
    MaybeSent,
    RateLimited,
    Refused,
    RetryLater,
)
from django_connector_outbox.connectors.google_chat import (
    DEFAULT_WAIT,
    GoogleChatConnector,
    message_id_for,
)
from django_connector_outbox.fakes import google_chat as fg
from django_connector_outbox.posts import ClaimedPost, Kind, Parent, Scope
from tests.connectors.helpers import claimed_post

pytestmark = pytest.mark.anyio

SPACE = fg.SPACE
OTHER = "spaces/BBBBotherSp"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def fake() -> Iterator[fg.FakeGoogleChat]:
    with fg.running(spaces=(SPACE, OTHER)) as server:
        yield server


@pytest.fixture
async def chat(fake: fg.FakeGoogleChat) -> AsyncIterator[GoogleChatConnector]:
    connector = GoogleChatConnector(source="gchat", **fake.connector_options(), timeout=2)
    yield connector
    await connector.aclose()


def post(
    kind: str = "message",
    body: dict[str, Any] | None = None,
    *,
    post_id: str = "post-1",
    space: str = SPACE,
    thread: str = "",
    ref: str | None = None,
    stale: bool = False,
) -> ClaimedPost:
    return claimed_post(
        "gchat",
        post_id,
        {"text": "hello"} if body is None else body,
        kind=kind,
        workspace_id="C01abcdef",
        container_id=space,
        thread_id=thread,
        message_ref=ref,
        stale=stale,
    )


# -- the client-assigned message id ---------------------------------------------------


def test_the_message_id_is_client_assigned_deterministic_and_within_googles_rules():
    made = message_id_for("gchat", "order-42/shipped")

    assert made == message_id_for("gchat", "order-42/shipped")
    assert re.fullmatch(r"client-[a-z0-9-]+", made) and len(made) <= 63
    # Ids are compared exactly: case and source tell posts apart.
    assert (
        len({made, message_id_for("gchat", "ORDER-42/shipped"), message_id_for("other", "order-42/shipped")})
        == 3
    )
    assert len(message_id_for("gchat", "x" * 255)) == len(made)


# -- message --------------------------------------------------------------------------


async def test_a_message_is_created_with_its_client_assigned_id_and_the_apps_token(fake, chat):
    outcome = await chat.asend(post(body={"text": "hello", "cardsV2": []}))

    [message] = fake.messages(SPACE)
    assert outcome == Delivered(message.name)
    assert message.name.startswith(f"{SPACE}/messages/") and message.text == "hello"
    assert message.client_id == message_id_for("gchat", "post-1")
    [call] = fake.calls_of("create_message")
    assert call.authorized and call.path == f"/v1/{SPACE}/messages"
    assert call.query == {"messageId": message_id_for("gchat", "post-1")}
    assert call.body == {"text": "hello", "cardsV2": []}


async def test_a_post_in_a_thread_goes_by_thread_key_into_one_thread(fake, chat):
    first = await chat.asend(post(post_id="a", thread="order-42"))
    second = await chat.asend(post(post_id="b", thread="order-42", body={"text": "again"}))

    messages = fake.messages(SPACE)
    assert [first, second] == [Delivered(m.name) for m in messages]
    assert messages[0].thread == messages[1].thread
    [call, _] = fake.calls_of("create_message")
    assert call.body["thread"] == {"threadKey": "order-42"}  # thread.threadKey: the parameter is deprecated
    assert call.query["messageReplyOption"] == "REPLY_MESSAGE_FALLBACK_TO_NEW_THREAD"
    assert "threadKey" not in call.query


async def test_a_reply_to_a_message_without_a_thread_key_goes_into_that_messages_thread(fake, chat):
    parent_ref = (await chat.asend(post(post_id="parent"))).message_ref
    parent = Parent(post_id="parent", state="posted", message_ref=parent_ref, thread_id="")

    thread = chat.reply_thread(parent)
    outcome = await chat.asend(post(post_id="reply", thread=thread, body={"text": "a reply"}))

    first, reply = fake.messages(SPACE)
    assert thread == parent_ref and outcome == Delivered(reply.name)
    assert reply.thread == first.thread
    assert fake.calls_of("create_message")[1].body["thread"] == {"name": first.thread}
    assert chat.reply_thread(Parent("p", "posted", parent_ref, "order-42")) == "order-42"


async def test_a_body_that_sets_the_place_is_refused_without_a_request(fake, chat):
    outcome = await chat.asend(post(body={"text": "x", "thread": {"threadKey": "elsewhere"}}))

    assert outcome == Refused("google chat body may not set thread: the outbox sets it from the post")
    assert fake.calls_of("create_message") == []


# -- status and delete ----------------------------------------------------------------


async def test_a_status_with_a_ref_is_patched_in_place_text_and_cards_together(fake, chat):
    card = {"cardId": "c", "card": {"sections": [{"widgets": [{"textParagraph": {"text": "v1"}}]}]}}
    ref = (await chat.asend(post("status", {"text": "v1", "cardsV2": [card]}))).message_ref

    outcome = await chat.asend(post("status", {"text": "v2"}, ref=ref))

    [message] = fake.messages(SPACE)
    assert outcome == Delivered(ref)
    assert (message.text, message.cards_v2) == ("v2", [])  # a part the new body lacks is cleared
    [call] = fake.calls_of("update_message")
    assert call.path == f"/v1/{ref}" and call.query == {"updateMask": "text,cardsV2"}
    assert call.body == {"text": "v2"}


async def test_a_delete_deletes_the_message_its_ref_names_and_a_second_one_counts_as_done(fake, chat):
    ref = (await chat.asend(post())).message_ref

    first = await chat.asend(post(Kind.DELETE, {}, post_id="delete-1", ref=ref))
    again = await chat.asend(post(Kind.DELETE, {}, post_id="delete-1", ref=ref))

    assert first == again == Delivered(ref)
    assert fake.messages(SPACE) == []
    assert [c.path for c in fake.calls_of("delete_message")] == [f"/v1/{ref}"] * 2


async def test_a_delete_without_a_ref_is_refused(fake, chat):
    outcome = await chat.asend(post(Kind.DELETE, {}))

    assert isinstance(outcome, Refused) and "message_ref" in outcome.reason
    assert fake.calls == []


# -- lost replies: looked up exactly, never posted twice ------------------------------


async def test_a_lost_reply_may_be_sent_and_is_then_looked_up_exactly_by_its_id(fake, chat):
    fake.script("create_message", fg.drop())

    lost = await chat.asend(post())
    found = await chat.afind_sent(post(stale=True))

    [message] = fake.messages(SPACE)
    assert isinstance(lost, MaybeSent)
    assert found == message.name
    [lookup] = fake.calls_of("get_message")
    assert lookup.path == f"/v1/{SPACE}/messages/{message_id_for('gchat', 'post-1')}"


async def test_a_lost_reply_in_a_thread_is_found_by_the_same_id(fake, chat):
    fake.script("create_message", fg.drop())
    await chat.asend(post(thread="order-42"))

    [message] = fake.messages(SPACE)
    assert await chat.afind_sent(post(thread="order-42", stale=True)) == message.name


async def test_no_key_or_token_in_any_log_line_or_reason(fake, chat, caplog):
    caplog.set_level(logging.DEBUG)
    fake.script("create_message", fg.error(400, "INVALID_ARGUMENT", "Invalid card."))

    refused = await chat.asend(post())
    await chat.asend(post(post_id="p2"))
    fake.expire_tokens()
    await chat.asend(post(post_id="p3"))  # a 401, then a new token

    secrets = [*fake.tokens, *fake.service_account_info["private_key"].splitlines()[1:3]]
    assert len(fake.tokens) == 2
    logged = caplog.text + refused.reason
    assert "HTTP Request: POST" in caplog.text  # httpx's lines are there, without the secrets
    assert [s for s in secrets if s in logged] == []


async def test_a_post_never_created_is_not_found(fake, chat):
    assert await chat.afind_sent(post(post_id="never", stale=True)) is None


@pytest.mark.parametrize("answer", [fg.server_error(503), fg.ratelimit(), fg.drop(after_store=False)])
async def test_a_lookup_that_cannot_tell_now_is_checked_later(fake, chat, answer):
    fake.script("get_message", answer)

    with pytest.raises(CheckLater, match="google chat lookup"):
        await chat.afind_sent(post(stale=True))


async def test_a_create_sent_again_after_it_was_stored_finds_the_first_message_instead_of_a_second(
    fake, chat
):
    fake.script("create_message", fg.drop())
    await chat.asend(post())

    again = await chat.asend(post())  # a retry that was not looked up first

    [message] = fake.messages(SPACE)
    assert again == Delivered(message.name)
    assert fake.statuses[409] == 1


async def test_a_status_created_before_a_lost_reply_is_brought_up_to_date_when_sent_again(fake, chat):
    fake.script("create_message", fg.drop())
    await chat.asend(post("status", {"text": "v1"}))

    outcome = await chat.asend(post("status", {"text": "v2"}))

    [message] = fake.messages(SPACE)
    assert outcome == Delivered(message.name) and message.text == "v2"


# -- answers mapped to outcomes -------------------------------------------------------


async def test_a_space_quota_429_holds_the_space_and_a_project_quota_429_the_source(fake, chat):
    fake.script("create_message", fg.ratelimit(), fg.ratelimit(project=True), fg.ratelimit(retry_after=7))

    space, project, told = [await chat.asend(post()) for _ in range(3)]

    assert space == RateLimited(DEFAULT_WAIT, space.reason, Scope.CONTAINER)
    assert "google chat 429 RESOURCE_EXHAUSTED: Quota exceeded" in space.reason
    assert isinstance(project, RateLimited) and project.scope == Scope.SOURCE
    assert isinstance(told, RateLimited) and told.after == 7
    assert fake.messages(SPACE) == []


async def test_the_fakes_enforced_space_limit_is_a_429_of_the_space(chat):
    with fg.running(space_limit=fg.Limit(2, 60)) as limited:
        connector = GoogleChatConnector(source="gchat", **limited.connector_options(), timeout=2)
        try:
            outcomes = [await connector.asend(post(post_id=f"p{n}")) for n in range(3)]
        finally:
            await connector.aclose()
    assert [type(o) for o in outcomes] == [Delivered, Delivered, RateLimited]
    assert outcomes[2].scope == Scope.CONTAINER


async def test_5xx_is_retried_later_and_the_retry_posts_once(fake, chat):
    fake.script("create_message", fg.server_error(503))

    first = await chat.asend(post())
    second = await chat.asend(post())

    assert isinstance(first, RetryLater) and "google chat 503 UNAVAILABLE" in first.reason
    assert isinstance(second, Delivered) and len(fake.messages(SPACE)) == 1


async def test_refusals_carry_googles_status_and_message(fake, chat):
    fake.add_space("spaces/CCCCnotMembr", member=False)
    bad_card = {"cardsV2": [{"cardId": "c", "card": {"sections": [{"widgets": [{"image": {}}]}]}}]}

    not_member = await chat.asend(post(space="spaces/CCCCnotMembr"))
    unknown = await chat.asend(post(space="spaces/DDDDunknown0"))
    invalid = await chat.asend(post(body=bad_card))

    assert not_member == Refused(
        "google chat 403 PERMISSION_DENIED: This Chat app is not a member of this space."
    )
    assert unknown == Refused("google chat 404 NOT_FOUND: Requested entity was not found.")
    assert isinstance(invalid, Refused) and invalid.reason.startswith("google chat 400 INVALID_ARGUMENT: ")
    assert "imageUrl" in invalid.reason


async def test_a_proxys_html_page_is_mapped_by_its_status(fake, chat):
    fake.script("create_message", fg.html(502))

    outcome = await chat.asend(post())

    assert isinstance(outcome, RetryLater) and "502" in outcome.reason


# -- the token ------------------------------------------------------------------------


async def test_the_token_is_fetched_once_for_many_sends_at_once_and_off_the_loop(fake, chat):
    fetched_on: list[threading.Thread] = []
    fetch = chat.token._fetch

    def recording() -> tuple[str, float]:
        fetched_on.append(threading.current_thread())
        return fetch()

    chat.token._fetch = recording
    outcomes = await asyncio.gather(*(chat.asend(post(post_id=f"p{n}")) for n in range(10)))

    assert all(isinstance(o, Delivered) for o in outcomes)
    assert fake.token_requests == 1
    assert fetched_on != [threading.current_thread()] and len(fetched_on) == 1
    [call] = fake.calls_of("token")
    assert call.body == {"grant_type": "urn:ietf:params:oauth:grant-type:jwt-bearer"}


async def test_a_token_refused_by_the_api_is_renewed_once_within_the_send(fake, chat):
    await chat.asend(post(post_id="p1"))
    fake.expire_tokens()

    outcome = await chat.asend(post(post_id="p2"))

    assert isinstance(outcome, Delivered)
    assert fake.token_requests == 2
    assert [c.authorized for c in fake.calls_of("create_message")] == [True, False, True]


async def test_an_expired_token_is_renewed_before_the_next_send():
    now = [0.0]
    with fg.running(token_lifetime=600) as fake:
        connector = GoogleChatConnector(source="gchat", **fake.connector_options(), timeout=2)
        connector.token._clock = lambda: now[0]
        try:
            await connector.asend(post(post_id="p1"))
            now[0] = 299.0  # within its life less RENEW_AHEAD (300 s)
            await connector.asend(post(post_id="p2"))
            assert fake.token_requests == 1
            now[0] = 301.0
            await connector.asend(post(post_id="p3"))
            assert fake.token_requests == 2
        finally:
            await connector.aclose()


async def test_a_key_that_is_not_the_accounts_gets_no_token_and_is_retried_later_without_showing_it(fake):
    other_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    info = {**fake.service_account_info, "private_key": fg.service_account_key(other_key)["private_key"]}
    connector = GoogleChatConnector(
        source="gchat", service_account_info=info, base_url=fake.origin, token_uri=fake.token_uri, timeout=2
    )
    try:
        outcome = await connector.asend(post())
    finally:
        await connector.aclose()

    assert outcome == RetryLater("google chat token: HTTP 400 invalid_grant Invalid JWT Signature.")
    assert fake.calls_of("create_message") == []


async def test_a_token_endpoint_failure_is_asked_once_not_retried_by_google_auth(fake, chat):
    fake.script("token", fg.server_error(503))

    outcome = await chat.asend(post())

    assert isinstance(outcome, RetryLater) and "google chat token: HTTP 503" in outcome.reason
    assert fake.token_requests == 0 and len(fake.calls_of("token")) == 1  # google-auth retries 503s itself
    assert isinstance(await chat.asend(post()), Delivered)


async def test_a_token_answer_that_is_not_a_token_is_retried_later(fake, chat):
    fake.script("token", fg.html(200))  # a portal's page, with a 200

    outcome = await chat.asend(post())

    assert isinstance(outcome, RetryLater) and outcome.reason.startswith("google chat token: ")
    assert fake.calls_of("create_message") == []


async def test_a_lookup_without_a_token_is_checked_later(fake, chat):
    fake.script("token", fg.drop(after_store=False))

    with pytest.raises(CheckLater, match="google chat token"):
        await chat.afind_sent(post(stale=True))


# -- rendering: what the fake (Google's rules) accepts --------------------------------


async def test_a_rendered_message_is_accepted_as_text_and_a_card(fake, chat):
    from django_connector_outbox.message import Link, Message

    message = Message(
        "**Deploy** of `api` _done_ [log](https://ci.example/1)",
        title="Deploy <prod>",
        fields=[("Env", "prod & eu"), ("By", "ana")],
        actions=[Link("Open", "https://ci.example/1")],
        image_url="https://ci.example/chart.png",
        context="took ~~5~~ 4 min",
    )

    outcome = await chat.asend(post(body=chat.render(message)))

    [stored] = fake.messages(SPACE)
    assert outcome == Delivered(stored.name)
    assert stored.text == "*Deploy* of `api` _done_ <https://ci.example/1|log>"
    card = stored.cards_v2[0]["card"]
    assert card["header"] == {"title": "Deploy <prod>"}
    assert card["sections"][0]["widgets"][0]["decoratedText"]["text"] == "prod &amp; eu"
    assert card["sections"][3]["widgets"] == [{"textParagraph": {"text": "took <s>5</s> 4 min"}}]


# -- checks ---------------------------------------------------------------------------


def check_ids(**options: Any) -> list[tuple[str, str]]:
    return [
        (m.id, m.msg) for m in GoogleChatConnector(source="gc", **options).check() if m.level >= checks.ERROR
    ]


KEY = fg.service_account_key(rsa.generate_private_key(public_exponent=65537, key_size=2048))
WHERE = "CONNECTOR_OUTBOX source 'gc'"


def test_checks_accept_a_key_given_as_info_as_its_json_or_as_a_file(tmp_path):
    key_file = tmp_path / "key.json"
    key_file.write_text(json.dumps(KEY))

    assert check_ids(service_account_info=KEY) == []
    assert check_ids(service_account_info=json.dumps(KEY)) == []
    assert (
        check_ids(service_account_file=str(key_file), token_uri="http://127.0.0.1:1/token", timeout=3) == []
    )


def test_checks_report_a_missing_or_doubled_key():
    assert check_ids() == [
        (
            "connector_outbox.E271",
            f"{WHERE}: Google Chat needs the Chat app's service account key in "
            "OPTIONS['service_account_file'] or OPTIONS['service_account_info'].",
        )
    ]
    assert check_ids(service_account_info=KEY, service_account_file="/k.json") == [
        (
            "connector_outbox.E271",
            f"{WHERE}: give OPTIONS['service_account_file'] or OPTIONS['service_account_info'], not both.",
        )
    ]


def test_checks_report_a_key_that_cannot_be_used_without_quoting_it(tmp_path):
    broken = {**KEY, "private_key": "-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n"}

    [(unreadable_id, unreadable)] = check_ids(service_account_file=str(tmp_path / "missing.json"))
    [(_, not_json)] = check_ids(service_account_info="{not json")
    [(_, no_email)] = check_ids(service_account_info={k: v for k, v in KEY.items() if k != "client_email"})
    [(_, bad_key)] = check_ids(service_account_info=broken)
    [(_, wrong_type)] = check_ids(service_account_info={**KEY, "type": "authorized_user"})

    assert unreadable_id == "connector_outbox.E271"
    assert (
        unreadable
        == f"{WHERE}: the service account key cannot be used: it cannot be read (No such file or directory)."
    )
    assert (
        not_json
        == f"{WHERE}: the service account key cannot be used: it is not JSON (Expecting property name enclosed in double quotes)."
    )
    assert "client_email" in no_email
    assert "not a key" not in bad_key and bad_key.startswith(
        f"{WHERE}: the service account key cannot be used: "
    )
    assert wrong_type.endswith("the key is of type 'authorized_user', not 'service_account'.")


def test_checks_report_each_bad_url_and_timeout():
    assert check_ids(
        service_account_info=KEY, base_url="chat.googleapis.com", token_uri="ftp://x", timeout=0
    ) == [
        (
            "connector_outbox.E272",
            f"{WHERE}: OPTIONS['base_url'] must be an http(s) URL, not 'chat.googleapis.com'.",
        ),
        ("connector_outbox.E273", f"{WHERE}: OPTIONS['token_uri'] must be an http(s) URL, not 'ftp://x'."),
        (
            "connector_outbox.E274",
            f"{WHERE}: OPTIONS['timeout'] must be a positive number of seconds (or a timedelta), not 0.",
        ),
    ]


def test_kinds_and_pace_follow_the_platform():
    assert GoogleChatConnector.kinds == {"message", "status", "delete"}
    assert GoogleChatConnector.kinds_for({}) == GoogleChatConnector.kinds
    # 60 writes a minute per space, 3000 per project: never more in any 60 s.
    for scope, (count, seconds), quota in (
        ("container", GoogleChatConnector.pace["container"], 60),
        ("source", GoogleChatConnector.pace["source"], 3000),
    ):
        assert count + 60 / (seconds / count) < quota, scope
    assert "private" not in repr(GoogleChatConnector(source="gc", service_account_info=KEY))


def test_the_checks_speak_the_operators_language():
    from django.utils import translation

    with translation.override("de"):
        [(_, said)] = check_ids()
    assert said.startswith("CONNECTOR_OUTBOX-Quelle 'gc': Google Chat braucht den Schlüssel des Dienstkontos")


def test_the_settings_printed_by_the_fake_in_its_own_process_deliver_a_post():
    from tests.test_fakes_command_line import build, fake_process, state

    with fake_process("google_chat", "--space", OTHER) as printed:
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", printed.url)
        [settings] = printed.settings()
        connector = build(settings, "google_chat")

        async def send() -> Any:
            try:
                return await connector.asend(post(space=OTHER))
            finally:
                await connector.aclose()

        outcome = asyncio.run(send())
        assert isinstance(outcome, Delivered), outcome
        assert [m["text"] for m in state(printed.url)["spaces"][OTHER]] == ["hello"]
    assert "POST " in printed.text and "/_fake/spaces" in printed.text
