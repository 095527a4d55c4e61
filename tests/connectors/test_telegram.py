"""The Telegram connector against the fake Bot API, over real sockets (no database). The tests
that take `telegram` or `form` run through both forms: the blocking methods and the coroutines."""

from __future__ import annotations

import logging
from collections.abc import Iterator
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
from django_connector_outbox.connectors.telegram import GROUP_INTERVAL, TelegramConnector
from django_connector_outbox.fakes import telegram as ft
from django_connector_outbox.fakes.base import Limit
from django_connector_outbox.posts import ClaimedPost, Parent, Scope
from tests.connectors.helpers import claimed_post, in_form

TOKEN = "123456789:AAH-secret-telegram-token_Xy"
PRIVATE = 1001
GROUP = -1002003004005
FORUM = -1009009009009


@pytest.fixture
def fake() -> Iterator[ft.FakeTelegram]:
    with ft.running(token=TOKEN, chats=(str(PRIVATE), str(GROUP))) as server:
        server.add_chat(FORUM, forum=True)
        yield server


@pytest.fixture
def telegram(fake: ft.FakeTelegram, form: str) -> Iterator[TelegramConnector]:
    connector = in_form(
        form, TelegramConnector(source="telegram", token=TOKEN, base_url=fake.base_url, timeout=1)
    )
    yield connector
    connector.close()


def post(
    kind: str = "message",
    body: dict[str, Any] | None = None,
    *,
    post_id: str = "post-1",
    chat: int | str = PRIVATE,
    thread: str = "",
    ref: str | None = None,
    parent: Parent | None = None,
) -> ClaimedPost:
    claim = claimed_post(
        "telegram",
        post_id,
        {"text": "hello"} if body is None else body,
        kind=kind,
        workspace_id="outbox_bot",
        container_id=str(chat),
        thread_id=thread,
        message_ref=ref,
    )
    if parent is None:
        return claim
    return replace(claim, parent=parent)


# -- message -------------------------------------------------------------------------


def test_a_message_is_sent_to_its_chat_and_its_ref_is_chat_and_message_id(telegram, fake):
    outcome = telegram.send(post(body={"text": "hello", "parse_mode": "HTML"}))
    assert outcome == Delivered(f"{PRIVATE}:1")
    [call] = fake.calls_of("sendMessage")
    assert call.args == {"chat_id": PRIVATE, "text": "hello", "parse_mode": "HTML"}
    assert [m.text for m in fake.messages(PRIVATE)] == ["hello"]


def test_a_message_to_a_group_holds_the_chat_for_the_group_limit(telegram, fake):
    outcome = telegram.send(post(chat=GROUP))
    assert outcome == Delivered(
        f"{GROUP}:1", Hold(GROUP_INTERVAL, "telegram group: at most 20 messages a minute")
    )


def test_a_message_in_a_forum_topic_carries_its_message_thread_id(telegram, fake):
    topic = fake.add_topic(FORUM)
    outcome = telegram.send(post(chat=FORUM, thread=str(topic)))
    assert isinstance(outcome, Delivered)
    [message] = [m for m in fake.messages(FORUM) if m.text == "hello"]
    assert message.thread_id == topic


def test_a_reply_goes_to_the_parents_topic_and_replies_to_its_message(telegram, fake):
    topic = fake.add_topic(FORUM)
    first = telegram.send(post(chat=FORUM, thread=str(topic), post_id="parent"))
    assert isinstance(first, Delivered) and first.message_ref
    parent = Parent(post_id="parent", state="posted", message_ref=first.message_ref, thread_id=str(topic))
    thread = telegram.reply_thread(parent)
    assert thread == str(topic)
    outcome = telegram.send(
        post(chat=FORUM, thread=thread, post_id="reply", parent=parent, body={"text": "re"})
    )
    assert isinstance(outcome, Delivered)
    [reply] = [m for m in fake.messages(FORUM) if m.text == "re"]
    assert (reply.thread_id, reply.reply_to) == (topic, int(first.message_ref.split(":")[1]))


def test_a_reply_outside_forums_is_in_its_parents_chain_and_sends_no_topic(telegram, fake):
    first = telegram.send(post(post_id="parent"))
    assert isinstance(first, Delivered) and first.message_ref
    parent = Parent(post_id="parent", state="posted", message_ref=first.message_ref, thread_id="")
    # Not "" (the sender retries a reply without a thread): the chain's first message.
    thread = telegram.reply_thread(parent)
    assert thread == first.message_ref
    outcome = telegram.send(post(thread=thread, post_id="reply", parent=parent, body={"text": "re"}))
    assert isinstance(outcome, Delivered)
    [reply] = [m for m in fake.messages(PRIVATE) if m.text == "re"]
    assert (reply.thread_id, reply.reply_to) == (None, int(first.message_ref.split(":")[1]))
    assert "message_thread_id" not in fake.calls_of("sendMessage")[-1].args


def test_a_reply_to_a_deleted_parent_is_refused_not_posted_outside_its_thread(telegram, fake):
    parent = Parent(post_id="p", state="posted", message_ref=f"{PRIVATE}:99", thread_id="")
    outcome = telegram.send(post(parent=parent))
    assert outcome == Refused("telegram 400 Bad Request: message to be replied not found")
    assert fake.messages(PRIVATE) == []


@pytest.mark.parametrize("key", ["chat_id", "message_thread_id"])
def test_a_body_that_sets_the_place_is_refused(telegram, fake, key):
    outcome = telegram.send(post(body={"text": "x", key: 5}))
    assert outcome == Refused(f"telegram body may not set {key}: the outbox sets it from the post")
    assert fake.calls == []


# -- status --------------------------------------------------------------------------


def test_a_status_is_created_then_edited_in_place(telegram, fake):
    created = telegram.send(post("status", {"text": "deploying", "disable_notification": True}))
    assert created == Delivered(f"{PRIVATE}:1")
    edited = telegram.send(
        post("status", {"text": "deployed", "disable_notification": True}, ref=f"{PRIVATE}:1")
    )
    assert edited == Delivered(f"{PRIVATE}:1")
    [call] = fake.calls_of("editMessageText")
    assert call.args == {"chat_id": PRIVATE, "message_id": 1, "text": "deployed"}
    assert [(m.text, m.edited) for m in fake.messages(PRIVATE)] == [("deployed", True)]


def test_an_edit_that_changes_nothing_is_delivered(telegram, fake):
    telegram.send(post("status", {"text": "same"}))
    outcome = telegram.send(post("status", {"text": "same"}, ref=f"{PRIVATE}:1"))
    assert outcome == Delivered(f"{PRIVATE}:1")
    assert fake.statuses[400] == 1  # "message is not modified", which is a success here


def test_a_status_is_edited_with_bot_api_10s_rich_message_in_place_of_its_text(telegram, fake):
    telegram.send(post("status", {"text": "deploying"}))
    long_form = "# Deployed\n\n" + "All checks passed. " * 400  # past sendMessage's 4,096
    edited = telegram.send(post("status", {"rich_message": {"markdown": long_form}}, ref=f"{PRIVATE}:1"))

    assert edited == Delivered(f"{PRIVATE}:1")
    [call] = fake.calls_of("editMessageText")
    assert call.args == {"chat_id": PRIVATE, "message_id": 1, "rich_message": {"markdown": long_form}}
    assert [(m.text, m.edited) for m in fake.messages(PRIVATE)] == [(long_form, True)]


@pytest.mark.parametrize(
    ("rich", "why"),
    [
        ({"markdown": "a", "html": "<b>a</b>"}, "exactly one of markdown, html or blocks"),
        ({"html": "x" * 32_769}, "rich message is too long"),
        ({"blocks": [{"type": "paragraph"}] * 501}, "too many rich message blocks"),
    ],
)
def test_a_rich_message_the_bot_api_refuses_is_refused(telegram, fake, rich, why):
    telegram.send(post("status", {"text": "deploying"}))
    outcome = telegram.send(post("status", {"rich_message": rich}, ref=f"{PRIVATE}:1"))
    assert isinstance(outcome, Refused) and why in outcome.reason


def test_an_edit_of_a_message_that_is_gone_is_refused(telegram):
    outcome = telegram.send(post("status", {"text": "x"}, ref=f"{PRIVATE}:42"))
    assert outcome == Refused("telegram 400 Bad Request: message to edit not found")


# -- reaction ------------------------------------------------------------------------


def test_a_reaction_is_set_on_a_message(telegram, fake):
    target = fake.add_message(PRIVATE)
    reaction = [{"type": "emoji", "emoji": "👍"}]
    assert telegram.send(post("reaction", {"message_id": target, "reaction": reaction})) == Delivered(None)
    assert fake.messages(PRIVATE)[0].reactions == reaction


def test_a_reaction_may_be_one_emoji(telegram, fake):
    target = fake.add_message(PRIVATE)
    assert telegram.send(post("reaction", {"message_id": str(target), "reaction": "🔥"})) == Delivered(None)
    assert fake.messages(PRIVATE)[0].reactions == [{"type": "emoji", "emoji": "🔥"}]


def test_a_reaction_without_message_id_is_refused_before_any_request(telegram, fake):
    outcome = telegram.send(post("reaction", {"reaction": "🔥"}))
    assert outcome == Refused(
        "telegram reaction body needs 'message_id' and 'reaction' (a list, or one emoji)"
    )
    assert fake.calls == []


# -- delete --------------------------------------------------------------------------


def test_a_delete_removes_the_message_of_its_ref(telegram, fake):
    sent = telegram.send(post())
    kept = telegram.send(post(post_id="other", body={"text": "kept"}))
    assert isinstance(sent, Delivered) and isinstance(kept, Delivered)

    assert telegram.send(post("delete", {}, post_id="d", ref=sent.message_ref)) == Delivered(sent.message_ref)

    assert [m.text for m in fake.messages(PRIVATE)] == ["kept"]
    [call] = fake.calls_of("deleteMessage")
    assert call.args == {"chat_id": PRIVATE, "message_id": 1}


def test_a_delete_in_a_group_holds_the_chat_as_any_write(telegram, fake):
    sent = telegram.send(post(chat=GROUP))
    outcome = telegram.send(post("delete", {}, post_id="d", chat=GROUP, ref=sent.message_ref))
    assert outcome == Delivered(
        sent.message_ref, Hold(GROUP_INTERVAL, "telegram group: at most 20 messages a minute")
    )
    assert fake.messages(GROUP) == []


def test_a_delete_of_a_message_gone_already_is_done(telegram, fake):
    sent = telegram.send(post())
    delete = post("delete", {}, post_id="d", ref=sent.message_ref)
    assert telegram.send(delete) == Delivered(sent.message_ref)
    assert telegram.send(delete) == Delivered(sent.message_ref)  # "message to delete not found"
    assert len(fake.calls_of("deleteMessage")) == 2
    assert fake.statuses[400] == 1


def test_a_delete_whose_reply_is_lost_is_retried_and_never_looked_up(telegram, fake):
    sent = telegram.send(post())
    fake.script("deleteMessage", ft.drop())
    delete = post("delete", {}, post_id="d", ref=sent.message_ref)

    assert isinstance(telegram.send(delete), RetryLater)
    assert fake.messages(PRIVATE) == []  # deleted before the reply was lost
    assert telegram.find_sent(delete) is None
    assert telegram.send(delete) == Delivered(sent.message_ref)


def test_a_delete_of_a_message_older_than_48_hours_is_refused_with_why(telegram, fake):
    sent = telegram.send(post(chat=GROUP))
    now = fake.clock()
    fake.clock = lambda: now + 48 * 3600

    outcome = telegram.send(post("delete", {}, post_id="d", chat=GROUP, ref=sent.message_ref))

    assert isinstance(outcome, Refused)
    assert outcome.reason.startswith("telegram 400 Bad Request: message can't be deleted (")
    assert "within 48 hours" in outcome.reason
    assert len(fake.messages(GROUP)) == 1


def test_a_rate_limited_delete_holds_the_chat(telegram, fake):
    sent = telegram.send(post())
    fake.script("deleteMessage", ft.ratelimit(4))
    outcome = telegram.send(post("delete", {}, post_id="d", ref=sent.message_ref))
    assert outcome == RateLimited(4.0, "telegram 429 Too Many Requests: retry after 4")
    assert len(fake.messages(PRIVATE)) == 1


def test_a_delete_without_a_message_ref_is_refused_without_a_request(telegram, fake):
    assert isinstance(telegram.send(post("delete", {}, post_id="d")), Refused)
    assert fake.calls == []


# -- errors --------------------------------------------------------------------------


def test_a_chat_that_does_not_exist_is_refused(telegram):
    assert telegram.send(post(chat=555)) == Refused("telegram 400 Bad Request: chat not found")


def test_a_user_who_blocked_the_bot_is_refused(telegram, fake):
    fake.add_chat(2002, blocked=True)
    assert telegram.send(post(chat=2002)) == Refused("telegram 403 Forbidden: bot was blocked by the user")


def test_a_group_that_became_a_supergroup_is_refused_with_its_new_id(telegram, fake):
    fake.add_chat(-77, migrate_to=-1007777)
    outcome = telegram.send(post(chat=-77))
    assert outcome == Refused(
        "telegram 400 Bad Request: group chat was upgraded to a supergroup chat: "
        "the group is now the supergroup -1007777; queue its posts there"
    )


def test_a_wrong_token_is_refused_and_not_shown(fake, form):
    connector = in_form(
        form,
        TelegramConnector(source="telegram", token="1:wrong-token-value", base_url=fake.base_url, timeout=1),
    )
    outcome = connector.send(post())
    connector.close()
    assert outcome == Refused("telegram 401 Unauthorized")


def test_a_429_holds_the_chat_for_its_retry_after(telegram, fake):
    fake.script("sendMessage", ft.ratelimit(7))
    outcome = telegram.send(post())
    assert outcome == RateLimited(7.0, "telegram 429 Too Many Requests: retry after 7")
    assert fake.messages(PRIVATE) == []


def test_429s_from_two_chats_hold_the_source(telegram, fake):
    fake.script("sendMessage", ft.ratelimit(3), times=2)
    first = telegram.send(post(chat=PRIVATE))
    second = telegram.send(post(chat=GROUP))
    assert isinstance(first, RateLimited) and first.scope == Scope.CONTAINER
    assert second == RateLimited(
        3.0,
        "telegram 429 Too Many Requests: retry after 3 (429s from 2 chats: the bot's limit)",
        Scope.SOURCE,
    )


def test_the_fakes_chat_limit_answers_a_429_the_connector_holds(fake, telegram):
    fake.chat_limit = Limit(1, 1.0)
    assert isinstance(telegram.send(post(post_id="a")), Delivered)
    outcome = telegram.send(post(post_id="b"))
    assert outcome == RateLimited(1.0, "telegram 429 Too Many Requests: retry after 1")
    assert fake.limited == {"chat": 1}


@pytest.mark.parametrize("kind", ["error", "html"])
def test_a_5xx_on_a_create_may_have_posted(telegram, fake, kind):
    action = ft.error(500, "Internal Server Error") if kind == "error" else ft.html(502)
    fake.script("sendMessage", action)
    outcome = telegram.send(post())
    assert isinstance(outcome, MaybeSent)
    assert outcome.reason in ("telegram 500 Internal Server Error", "telegram HTTP 502 Bad Gateway")


def test_a_5xx_on_an_edit_is_retried(telegram, fake):
    telegram.send(post("status", {"text": "a"}))
    fake.script("editMessageText", ft.html(502))
    assert telegram.send(post("status", {"text": "b"}, ref=f"{PRIVATE}:1")) == RetryLater(
        "telegram HTTP 502 Bad Gateway"
    )


def test_a_lost_reply_on_a_create_is_maybe_sent_and_reached_telegram_once(telegram, fake):
    fake.script("sendMessage", ft.drop())
    assert isinstance(telegram.send(post()), MaybeSent)
    assert [m.text for m in fake.messages(PRIVATE)] == ["hello"]


def test_a_lost_reply_on_an_edit_or_a_reaction_is_retried(telegram, fake):
    telegram.send(post("status", {"text": "a"}))
    fake.script("editMessageText", ft.drop())
    fake.script("setMessageReaction", ft.drop())
    assert isinstance(telegram.send(post("status", {"text": "b"}, ref=f"{PRIVATE}:1")), RetryLater)
    assert isinstance(telegram.send(post("reaction", {"message_id": 1, "reaction": "👍"})), RetryLater)


def test_a_slow_reply_past_the_timeout_is_maybe_sent(telegram, fake):
    fake.script("sendMessage", ft.delay(3))
    assert isinstance(telegram.send(post()), MaybeSent)


def test_a_refused_connection_is_retried(fake, form):
    connector = in_form(
        form, TelegramConnector(source="telegram", token=TOKEN, base_url="http://127.0.0.1:9", timeout=1)
    )
    outcome = connector.send(post())
    connector.close()
    assert isinstance(outcome, RetryLater) and outcome.reason.startswith("not sent:")


# -- lookup --------------------------------------------------------------------------


def test_a_message_or_a_status_cannot_be_looked_up(telegram):
    for kind in ("message", "status"):
        with pytest.raises(CannotCheck, match="cannot read a chat's history"):
            telegram.find_sent(post(kind))


def test_a_reaction_is_looked_up_as_not_there_since_setting_it_again_is_harmless(telegram):
    assert telegram.find_sent(post("reaction", {"message_id": 1, "reaction": "👍"})) is None


# -- secrets and checks ----------------------------------------------------------------


def test_the_token_is_in_no_reason_or_log_line(telegram, fake, caplog):
    caplog.set_level(logging.DEBUG)
    fake.script("sendMessage", ft.error(400, f"Bad Request: echo {TOKEN}"))
    outcome = telegram.send(post())
    assert isinstance(outcome, Refused) and TOKEN not in outcome.reason and "***" in outcome.reason
    telegram.send(post())
    assert caplog.records and all(TOKEN not in r.getMessage() for r in caplog.records)
    assert TOKEN not in repr(telegram)


def check_ids(**options: Any) -> list[tuple[str, str]]:
    return [
        (m.id, m.msg) for m in TelegramConnector(source="tg", **options).check() if m.level >= checks.ERROR
    ]


def test_checks_accept_a_good_configuration():
    assert check_ids(token=TOKEN) == []


def test_checks_report_each_bad_option():
    where = "CONNECTOR_OUTBOX source 'tg'"
    assert check_ids() == [
        ("connector_outbox.E251", f"{where}: Telegram needs a bot token in OPTIONS['token'].")
    ]
    token_error = (
        "connector_outbox.E251",
        f"{where}: OPTIONS['token'] is not a Telegram bot token (digits, ':', then letters, digits, "
        "'_' or '-'), without the 'bot' prefix of the URL.",
    )
    assert check_ids(token="bot" + TOKEN) == [token_error]
    assert check_ids(token="not a token") == [token_error]
    assert check_ids(token=TOKEN, base_url="ftp://x") == [
        ("connector_outbox.E252", f"{where}: OPTIONS['base_url'] must be an http(s) URL, not 'ftp://x'.")
    ]
    assert check_ids(token=TOKEN, timeout=0) == [
        (
            "connector_outbox.E253",
            f"{where}: OPTIONS['timeout'] must be a positive number of seconds (or a timedelta), not 0.",
        )
    ]


def test_a_token_read_with_its_newline_is_stripped(fake, form):
    connector = in_form(
        form, TelegramConnector(source="telegram", token=TOKEN + "\n", base_url=fake.base_url, timeout=1)
    )
    assert connector.check() == []
    assert isinstance(connector.send(post()), Delivered)
    connector.close()
