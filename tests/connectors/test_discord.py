"""The Discord connector against the fake Discord API, over real sockets (no database). The tests
that take `discord` or `form` run through both forms: the blocking methods and the coroutines."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core import checks

from django_connector_outbox.connectors import (
    CheckLater,
    Delivered,
    MaybeSent,
    RateLimited,
    Refused,
    RetryLater,
)
from django_connector_outbox.connectors.discord import DiscordConnector, nonce_for
from django_connector_outbox.fakes import discord as fd
from django_connector_outbox.posts import ClaimedPost
from tests.connectors.helpers import claimed_post, in_form

TOKEN = "MTIz.secret-bot-token.XyZ"
GUILD = "900000000000000001"
CHANNEL = "111111111111111111"
THREAD = "111111111111111222"
OTHER = "111111111111111333"


@pytest.fixture
def fake() -> Iterator[fd.FakeDiscord]:
    with fd.running(token=TOKEN, channels=(CHANNEL, THREAD)) as server:
        yield server


@pytest.fixture
def discord(fake: fd.FakeDiscord, form: str) -> Iterator[DiscordConnector]:
    connector = in_form(
        form, DiscordConnector(source="discord", token=TOKEN, base_url=fake.base_url, timeout=1)
    )
    yield connector
    connector.close()


def post(
    kind: str = "message",
    body: dict[str, Any] | None = None,
    *,
    post_id: str = "post-1",
    container: str = CHANNEL,
    thread: str = "",
    ref: str | None = None,
    rev: int = 0,
    stale: bool = False,
    sent_at: datetime | None = None,
) -> ClaimedPost:
    return claimed_post(
        "discord",
        post_id,
        {"content": "hello"} if body is None else body,
        kind=kind,
        workspace_id=GUILD,
        container_id=container,
        thread_id=thread,
        rev=rev,
        message_ref=ref,
        stale=stale,
        sent_at=sent_at,
    )


def marker(post_id: str, source: str = "discord") -> str:
    return "outbox:" + nonce_for(source, post_id)


# -- message -------------------------------------------------------------------------


def test_message_is_created_with_nonce_and_marker(fake, discord):
    outcome = discord.send(post(body={"content": "hello", "allowed_mentions": {"parse": []}}))

    [message] = fake.messages(CHANNEL)
    assert outcome == Delivered(message.id)
    assert message.content == "hello"
    assert message.author_id == fake.bot_user["id"]
    assert message.embeds == [{"type": "rich", "footer": {"text": marker("post-1")}}]
    [call] = fake.calls_of("create_message")
    assert call.authorized
    assert call.user_agent.startswith("DiscordBot (https://")
    assert call.json["nonce"] == nonce_for("discord", "post-1")
    assert len(call.json["nonce"]) == 22
    assert call.json["enforce_nonce"] is True
    assert call.json["allowed_mentions"] == {"parse": []}


def test_marker_embed_comes_after_the_body_embeds(fake, discord):
    discord.send(post(body={"embeds": [{"title": "Deploy", "description": "done"}]}))

    [message] = fake.messages(CHANNEL)
    assert [e.get("title") for e in message.embeds] == ["Deploy", None]
    assert message.embeds[1]["footer"] == {"text": marker("post-1")}


def test_a_body_with_ten_embeds_is_refused_before_sending(fake, discord):
    outcome = discord.send(post(body={"embeds": [{"title": str(i)} for i in range(10)]}))

    assert isinstance(outcome, Refused)
    assert "10 embeds" in outcome.reason
    assert fake.calls_of("create_message") == []


def test_thread_post_goes_to_the_thread_channel(fake, discord):
    outcome = discord.send(post(thread=THREAD))

    [message] = fake.messages(THREAD)
    assert outcome == Delivered(message.id)
    assert fake.messages(CHANNEL) == []


def test_nonce_is_per_source_and_post():
    assert nonce_for("discord", "a") != nonce_for("discord", "b")
    assert nonce_for("discord", "a") != nonce_for("other", "a")
    assert nonce_for("discord", "x" * 255) == nonce_for("discord", "x" * 255)
    assert all(len(nonce_for("s", str(i))) == 22 for i in range(50))


def test_a_quick_resend_is_deduplicated_by_the_nonce(fake, discord):
    first = discord.send(post())
    second = discord.send(post())

    assert first == second
    assert len(fake.messages(CHANNEL)) == 1
    assert len(fake.calls_of("create_message")) == 2


def test_a_resend_outside_the_nonce_window_creates_again(fake, discord):
    # The window is "a few minutes"; outside it Discord posts again (hence find_sent).
    fake.nonce_window = 0.05
    discord.send(post())
    time.sleep(0.1)
    discord.send(post())

    assert len(fake.messages(CHANNEL)) == 2


def test_senders_threads_share_one_connector(fake):
    discord = DiscordConnector(source="discord", token=TOKEN, base_url=fake.base_url, timeout=1)
    outcomes: list[Any] = []
    threads = [
        threading.Thread(target=lambda i=i: outcomes.append(discord.send(post(post_id=f"p{i}"))))
        for i in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    discord.close()

    assert len({o.message_ref for o in outcomes if isinstance(o, Delivered)}) == 8
    assert len(fake.messages(CHANNEL)) == 8


# -- status --------------------------------------------------------------------------


def test_status_is_created_then_edited_in_place(fake, discord):
    created = discord.send(post("status", {"content": "building"}, post_id="status-1"))
    assert isinstance(created, Delivered)

    edited = discord.send(
        post("status", {"content": "deployed"}, post_id="status-1", ref=created.message_ref, rev=1)
    )

    assert edited == Delivered(created.message_ref)
    [message] = fake.messages(CHANNEL)
    assert message.content == "deployed"
    assert message.edited_timestamp is not None
    assert message.embeds == [{"type": "rich", "footer": {"text": marker("status-1")}}]
    [patch] = fake.calls_of("edit_message")
    assert patch.path.endswith(f"/channels/{CHANNEL}/messages/{created.message_ref}")
    assert "nonce" not in patch.json


def test_status_edit_in_a_thread_patches_the_thread_channel(fake, discord):
    created = discord.send(post("status", {"content": "a"}, post_id="s", thread=THREAD))
    edited = discord.send(
        post("status", {"content": "b"}, post_id="s", thread=THREAD, ref=created.message_ref)
    )

    assert edited == created
    assert [m.content for m in fake.messages(THREAD)] == ["b"]


def test_status_edit_sends_only_content_fields(fake, discord):
    created = discord.send(post("status", {"content": "a"}, post_id="s"))
    discord.send(
        post("status", {"content": "b", "tts": True, "nonce": "x"}, post_id="s", ref=created.message_ref)
    )

    [patch] = fake.calls_of("edit_message")
    assert set(patch.json) == {"content", "embeds"}


def test_status_create_deduplicated_to_an_older_copy_is_brought_up_to_date(fake, discord):
    # A create that posted although Discord answered 502; the status changed before the
    # retry, whose nonce returns the old message: the connector edits it to the new body.
    fake.script("create_message", fd.drop())
    assert isinstance(discord.send(post("status", {"content": "old"}, post_id="s")), MaybeSent)

    outcome = discord.send(post("status", {"content": "new"}, post_id="s", rev=1))

    [message] = fake.messages(CHANNEL)
    assert outcome == Delivered(message.id)
    assert message.content == "new"


def test_editing_a_message_of_someone_else_is_refused(fake, discord):
    theirs = fake.add_message(CHANNEL, "a person's message")

    outcome = discord.send(post("status", {"content": "x"}, ref=theirs))

    assert outcome == Refused("discord 50005 Cannot edit a message authored by another user")


def test_editing_a_deleted_message_is_refused(fake, discord):
    assert discord.send(post("status", ref="123456789")) == Refused("discord 10008 Unknown Message")


# -- reaction ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("emoji", "in_path", "stored"),
    [
        ("👍", "%F0%9F%91%8D", "👍"),
        ("🏳️‍🌈", "%F0%9F%8F%B3%EF%B8%8F%E2%80%8D%F0%9F%8C%88", "🏳️‍🌈"),
        ("party_blob:123456789012345678", "party_blob%3A123456789012345678", "party_blob:123456789012345678"),
        (
            "<:party_blob:123456789012345678>",
            "party_blob%3A123456789012345678",
            "party_blob:123456789012345678",
        ),
        ("<a:dance:223456789012345678>", "dance%3A223456789012345678", "dance:223456789012345678"),
    ],
)
def test_reaction_emoji_is_url_encoded(fake, discord, emoji, in_path, stored):
    theirs = fake.add_message(CHANNEL, "ship it?")

    outcome = discord.send(post("reaction", {"message_id": theirs, "emoji": emoji}))

    assert outcome == Delivered(None)
    [call] = fake.calls_of("create_reaction")
    assert call.path.endswith(f"/messages/{theirs}/reactions/{in_path}/@me")
    assert fake.message(CHANNEL, theirs).reactions == {stored: [fake.bot_user["id"]]}


def test_reaction_in_a_thread_and_twice_is_harmless(fake, discord):
    theirs = fake.add_message(THREAD, "in a thread")
    claim = post("reaction", {"message_id": theirs, "emoji": "✅"}, thread=THREAD)

    assert discord.send(claim) == Delivered(None)
    assert discord.send(claim) == Delivered(None)
    assert fake.message(THREAD, theirs).reactions == {"✅": [fake.bot_user["id"]]}


def test_reaction_unknown_emoji_and_bad_body_are_refused(fake, discord):
    theirs = fake.add_message(CHANNEL, "x")

    assert discord.send(post("reaction", {"message_id": theirs, "emoji": "smile"})) == Refused(
        "discord 10014 Unknown Emoji"
    )
    assert isinstance(discord.send(post("reaction", {"emoji": "👍"})), Refused)
    assert discord.send(post("reaction", {"message_id": "42", "emoji": "👍"})) == Refused(
        "discord 10008 Unknown Message"
    )


# -- delete --------------------------------------------------------------------------


def test_a_delete_removes_the_bots_message_from_its_channel(fake, discord):
    sent = discord.send(post())
    kept = discord.send(post(post_id="other"))
    assert isinstance(sent, Delivered) and isinstance(kept, Delivered)

    outcome = discord.send(post("delete", {}, post_id="d", ref=sent.message_ref))

    assert outcome == Delivered(sent.message_ref)
    assert [m.id for m in fake.messages(CHANNEL)] == [kept.message_ref]
    [call] = fake.calls_of("delete_message")
    assert (call.method, call.path) == ("DELETE", f"/api/v10/channels/{CHANNEL}/messages/{sent.message_ref}")


def test_a_delete_in_a_thread_deletes_from_the_threads_channel(fake, discord):
    sent = discord.send(post(thread=THREAD))
    assert isinstance(sent, Delivered)

    assert discord.send(post("delete", {}, post_id="d", thread=THREAD, ref=sent.message_ref)) == Delivered(
        sent.message_ref
    )
    assert fake.messages(THREAD) == []
    [call] = fake.calls_of("delete_message")
    assert f"/channels/{THREAD}/messages/" in call.path


def test_a_delete_of_a_message_gone_already_is_done(fake, discord):
    sent = discord.send(post())
    delete = post("delete", {}, post_id="d", ref=sent.message_ref)
    assert discord.send(delete) == Delivered(sent.message_ref)
    assert discord.send(delete) == Delivered(sent.message_ref)  # the 10008 of a second try
    assert len(fake.calls_of("delete_message")) == 2
    assert fake.statuses[404] == 1


def test_a_delete_whose_reply_is_lost_is_retried_and_never_looked_up(fake, discord):
    sent = discord.send(post())
    fake.script("delete_message", fd.drop())
    delete = post("delete", {}, post_id="d", ref=sent.message_ref, stale=True)

    assert isinstance(discord.send(delete), RetryLater)
    assert fake.messages(CHANNEL) == []  # deleted before the reply was lost
    assert discord.find_sent(delete) is None
    assert fake.calls_of("get_channel_messages") == []
    assert discord.send(delete) == Delivered(sent.message_ref)


def test_a_delete_of_someone_elses_message_is_refused_naming_the_permission(fake, discord):
    theirs = fake.add_message(CHANNEL, "a person's message")

    outcome = discord.send(post("delete", {}, post_id="d", ref=theirs))

    assert isinstance(outcome, Refused)
    assert outcome.reason.startswith("discord 50013 Missing Permissions")
    assert "Manage Messages permission" in outcome.reason
    assert [m.id for m in fake.messages(CHANNEL)] == [theirs]


def test_a_rate_limited_delete_holds_the_channel(fake, discord):
    sent = discord.send(post())
    fake.script("delete_message", fd.ratelimit(1.5))

    outcome = discord.send(post("delete", {}, post_id="d", ref=sent.message_ref))

    assert outcome == RateLimited(
        1.5, "discord HTTP 429 You are being rate limited. (rate limited, scope user)"
    )
    assert len(fake.messages(CHANNEL)) == 1


def test_a_delete_without_a_message_ref_is_refused_without_a_request(fake, discord):
    assert isinstance(discord.send(post("delete", {}, post_id="d")), Refused)
    assert fake.calls == []


# -- rate limits and errors ----------------------------------------------------------


def test_429_is_rate_limited_with_retry_after_from_the_body(fake, discord):
    fake.script("create_message", fd.ratelimit(2.25))

    outcome = discord.send(post())

    assert outcome == RateLimited(
        2.25, "discord HTTP 429 You are being rate limited. (rate limited, scope user)"
    )
    assert fake.messages(CHANNEL) == []


def test_global_429_holds_the_source(fake, discord):
    fake.script("create_message", fd.ratelimit(0.5, is_global=True))

    outcome = discord.send(post())

    assert outcome == RateLimited(
        0.5, "discord HTTP 429 You are being rate limited. (rate limited, scope global)", scope="source"
    )


def test_shared_429_holds_the_channel(fake, discord):
    fake.script("create_message", fd.ratelimit(2.0, scope="shared"))

    outcome = discord.send(post())

    assert outcome == RateLimited(
        2.0, "discord HTTP 429 You are being rate limited. (rate limited, scope shared)", scope="container"
    )


def test_429_without_body_or_headers_is_cloudflares_and_holds_the_source(fake, discord):
    fake.script("edit_message", fd.html(429))
    ref = discord.send(post("status", post_id="s")).message_ref

    outcome = discord.send(post("status", post_id="s", ref=ref))

    # An HTML 429 without X-RateLimit headers is Cloudflare's, which limits the whole IP. It has
    # no retry_after and the fake sends no header with it: 1 s default.
    assert outcome == RateLimited(
        1.0, "discord HTTP 429 Too Many Requests (rate limited, not by Discord's API)", scope="source"
    )


@pytest.mark.parametrize(
    ("action", "expected"),
    [
        (fd.error(20016, "Slowmode rate limit", status=429, retry_after=3.0), RateLimited),
        (
            fd.error(
                20028,
                "The write action you are performing on the channel has hit the write rate limit",
                status=429,
                retry_after=4.5,
            ),
            RateLimited,
        ),
        (
            fd.error(40062, "Service resource is being rate limited.", status=429, retry_after=1.0),
            RateLimited,
        ),
        (
            fd.error(30046, "Maximum number of edits to messages older than 1 hour reached. Try again later"),
            RetryLater,
        ),
        (fd.error(20029, "server write rate limit"), RetryLater),
    ],
)
def test_rate_like_codes(fake, discord, action, expected):
    fake.script("create_message", action)

    outcome = discord.send(post())

    assert isinstance(outcome, expected)
    assert f"discord {action.code} " in outcome.reason
    if expected is RateLimited:
        assert (outcome.after, outcome.scope) == (action.retry_after, "container")


def test_the_server_write_limit_holds_the_guild(fake, discord):
    fake.script("create_message", fd.error(20029, "server write rate limit", status=429, retry_after=6.0))

    outcome = discord.send(post())

    assert outcome == RateLimited(
        6.0, "discord 20029 server write rate limit (server write rate limit)", scope="workspace"
    )


@pytest.mark.parametrize(
    ("status", "code", "message"),
    [
        (404, 10003, "Unknown Channel"),
        (403, 50001, "Missing Access"),
        (403, 50013, "Missing Permissions"),
        (400, 50035, "Invalid Form Body"),
        (400, 50006, "Cannot send an empty message"),
        (400, 50083, "Operation cannot be performed on an archived thread"),
        (400, 200000, "Message was blocked by automatic moderation"),
        (413, 40005, "Request entity too large"),
    ],
)
def test_permanent_errors_are_refused_with_discords_code(fake, discord, status, code, message):
    fake.script("create_message", fd.error(code, message, status=status))

    assert discord.send(post()) == Refused(f"discord {code} {message}")


def test_unknown_channel_from_the_api(fake, discord):
    assert discord.send(post(container=OTHER)) == Refused("discord 10003 Unknown Channel")


def test_a_body_discord_rejects_is_refused(fake, discord):
    assert discord.send(post(body={"content": "x" * 2001})) == Refused(
        "discord 50035 Invalid Form Body (content: Must be 2000 or fewer in length.)"
    )


def test_bad_token_is_refused_without_the_token(fake, form):
    connector = in_form(
        form, DiscordConnector(source="discord", token="wrong-token", base_url=fake.base_url, timeout=1)
    )
    try:
        outcome = connector.send(post())
    finally:
        connector.close()
    assert outcome == Refused("discord 0 401: Unauthorized")


@pytest.mark.parametrize(
    "action",
    [
        fd.server_error(502),
        fd.server_error(500),
        fd.html(503),
        fd.error(130000, "API resource overloaded", 503),
        fd.error(40004, "Send messages has been temporarily disabled", 403),
        fd.error(40006, "This feature has been temporarily disabled server-side", 400),
    ],
)
def test_transient_errors_on_create_retry_thanks_to_the_nonce(fake, discord, action):
    fake.script("create_message", action)

    outcome = discord.send(post())

    assert isinstance(outcome, RetryLater)
    assert outcome.reason.startswith("discord ")


def test_transient_errors_on_edit_and_reaction_retry(fake, discord):
    ref = discord.send(post("status", post_id="s")).message_ref
    theirs = fake.add_message(CHANNEL, "x")
    fake.script("edit_message", fd.server_error(502))
    fake.script("create_reaction", fd.html(503))

    assert discord.send(post("status", post_id="s", ref=ref)) == RetryLater("discord 0 502: Bad Gateway")
    assert discord.send(post("reaction", {"message_id": theirs, "emoji": "👍"})) == RetryLater(
        "discord HTTP 503 Service Unavailable"
    )


def test_lost_reply_on_create_may_be_sent(fake, discord):
    fake.script("create_message", fd.drop())

    outcome = discord.send(post())

    assert isinstance(outcome, MaybeSent)
    assert "RemoteProtocolError" in outcome.reason
    assert len(fake.messages(CHANNEL)) == 1  # it was posted


def test_reset_and_timeout_on_create_may_be_sent(fake, discord):
    fake.script("create_message", fd.reset(), fd.delay(3))

    first = discord.send(post(post_id="a"))
    second = discord.send(post(post_id="b"))

    assert isinstance(first, MaybeSent)
    assert isinstance(second, MaybeSent)
    assert "ReadTimeout" in second.reason


def test_lost_reply_on_edit_and_reaction_is_a_retry(fake, discord):
    ref = discord.send(post("status", post_id="s")).message_ref
    theirs = fake.add_message(CHANNEL, "x")
    fake.script("edit_message", fd.drop())
    fake.script("create_reaction", fd.delay(3))

    edit = discord.send(post("status", {"content": "v2"}, post_id="s", ref=ref))
    react = discord.send(post("reaction", {"message_id": theirs, "emoji": "👍"}))

    assert isinstance(edit, RetryLater)
    assert isinstance(react, RetryLater)
    assert "ReadTimeout" in react.reason


def test_connect_failure_is_a_retry(form):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again below: nothing listens there
    connector = in_form(
        form, DiscordConnector(source="discord", token=TOKEN, base_url=f"http://127.0.0.1:{port}/api/v10")
    )
    try:
        outcome = connector.send(post())
    finally:
        connector.close()
    assert isinstance(outcome, RetryLater)
    assert outcome.reason.startswith("not sent: ConnectError")


# -- find_sent -----------------------------------------------------------------------


def test_find_sent_finds_the_message_whose_reply_was_lost(fake, discord):
    fake.add_message(CHANNEL, "before")
    claim = post(post_id="lost", stale=True, sent_at=datetime.now(UTC))
    fake.script("create_message", fd.drop())
    assert isinstance(discord.send(claim), MaybeSent)
    fake.add_message(CHANNEL, "after")

    ref = discord.find_sent(claim)

    [ours] = [m for m in fake.messages(CHANNEL) if m.author_id == fake.bot_user["id"]]
    assert ref == ours.id
    [history] = fake.calls_of("get_channel_messages")
    assert history.query["limit"] == "100"
    assert int(history.query["after"]) < int(ours.id)


def test_find_sent_in_a_thread(fake, discord):
    claim = post(post_id="t", thread=THREAD, sent_at=datetime.now(UTC))
    delivered = discord.send(claim)

    assert discord.find_sent(claim) == delivered.message_ref
    assert fake.calls_of("get_channel_messages")[0].path.endswith(f"/channels/{THREAD}/messages")


def test_find_sent_not_found(fake, discord):
    fake.add_message(CHANNEL, "someone talking")
    discord.send(post(post_id="other-post"))

    assert discord.find_sent(post(post_id="never-sent")) is None


def test_find_sent_ignores_messages_sent_before_the_claim(fake, discord):
    old = post(post_id="p", sent_at=datetime.now(UTC))
    discord.send(old)

    # The same post id claimed much later (not a real case, but the window must hold).
    later = post(post_id="p", sent_at=datetime.now(UTC) + timedelta(minutes=10))

    assert discord.find_sent(later) is None


def test_find_sent_ignores_the_marker_in_someone_elses_message(fake, discord):
    fake.add_message(CHANNEL, "copy", embeds=[{"footer": {"text": marker("p")}}])

    assert discord.find_sent(post(post_id="p")) is None


def test_find_sent_pages_forward(fake, discord):
    claim = post(post_id="deep", sent_at=datetime.now(UTC))
    for i in range(230):
        fake.add_message(CHANNEL, f"chatter {i}")
    delivered = discord.send(claim)
    for i in range(5):
        fake.add_message(CHANNEL, f"more {i}")

    assert discord.find_sent(claim) == delivered.message_ref

    pages = fake.calls_of("get_channel_messages")
    assert len(pages) == 3
    afters = [int(c.query["after"]) for c in pages]
    assert afters == sorted(afters)
    assert len(set(afters)) == 3


def test_find_sent_reads_every_page_before_saying_not_found(fake, discord):
    claim = post(post_id="absent", sent_at=datetime.now(UTC))
    for i in range(205):
        fake.add_message(CHANNEL, f"chatter {i}")

    assert discord.find_sent(claim) is None
    assert len(fake.calls_of("get_channel_messages")) == 3  # 100 + 100 + 5


def test_find_sent_asks_users_me_once(fake, discord):
    fake.add_message(CHANNEL, "x")
    discord.find_sent(post(post_id="a"))
    discord.find_sent(post(post_id="b"))

    assert len(fake.calls_of("get_current_user")) == 1


@pytest.mark.parametrize(
    ("route", "action"),
    [
        ("get_channel_messages", fd.ratelimit(1.0)),
        ("get_channel_messages", fd.ratelimit(1.0, is_global=True)),
        ("get_channel_messages", fd.server_error(502)),
        ("get_channel_messages", fd.error(50001, "Missing Access", 403)),
        ("get_channel_messages", fd.drop()),
        ("get_channel_messages", fd.delay(3)),
        ("get_current_user", fd.server_error(500)),
        ("get_current_user", fd.drop(after_store=False)),
    ],
)
def test_find_sent_failures_mean_check_later(fake, discord, route, action):
    fake.add_message(CHANNEL, "x")
    fake.script(route, action)

    with pytest.raises(CheckLater):
        discord.find_sent(post(post_id="p"))


def test_find_sent_failing_on_a_later_page_means_check_later(fake, discord):
    claim = post(post_id="deep", sent_at=datetime.now(UTC))
    for i in range(150):
        fake.add_message(CHANNEL, f"chatter {i}")
    fake.script("get_channel_messages", fd.passthrough(), fd.ratelimit(1.0))

    with pytest.raises(CheckLater, match="429"):
        discord.find_sent(claim)
    assert len(fake.calls_of("get_channel_messages")) == 2


def test_find_sent_without_read_message_history_is_check_later(fake, discord):
    # The trap: Discord answers 200 [] instead of an error, which looks like "not there".
    fake.add_channel(OTHER, read_history=False)
    fake.script("create_message", fd.drop())
    claim = post(post_id="p", container=OTHER, sent_at=datetime.now(UTC))
    discord.send(claim)
    assert len(fake.messages(OTHER)) == 1

    with pytest.raises(CheckLater, match="Read Message History"):
        discord.find_sent(claim)


def test_find_sent_with_only_older_history_is_not_found(fake, discord):
    fake.add_message(CHANNEL, "old news")

    assert discord.find_sent(post(post_id="p", sent_at=datetime.now(UTC) + timedelta(minutes=5))) is None


def test_find_sent_for_a_reaction_is_not_found_so_it_is_put_again(fake, discord):
    assert discord.find_sent(post("reaction", {"message_id": "1", "emoji": "👍"})) is None
    assert fake.calls == []


# -- secrets and configuration -------------------------------------------------------


def test_the_token_never_shows_in_reasons_or_logs(fake, discord, caplog, form):
    caplog.set_level(logging.DEBUG)
    theirs = fake.add_message(CHANNEL, "x")
    fake.script(
        "create_message",
        fd.error(50013, "Missing Permissions", 403),
        fd.ratelimit(1),
        fd.drop(),
        fd.server_error(502),
    )
    reasons = [getattr(discord.send(post(post_id=f"p{i}")), "reason", "") for i in range(5)]
    reasons.append(
        getattr(discord.send(post("reaction", {"message_id": theirs, "emoji": "nope"})), "reason", "")
    )
    fake.script("get_channel_messages", fd.ratelimit(1))
    with pytest.raises(CheckLater) as excinfo:
        discord.find_sent(post(post_id="p9"))
    reasons.append(str(excinfo.value))
    bad = in_form(
        form,
        DiscordConnector(source="discord", token=TOKEN, base_url="http://127.0.0.1:9/api/v10", timeout=1),
    )
    reasons.append(getattr(bad.send(post()), "reason", ""))
    bad.close()

    assert all(TOKEN not in reason for reason in reasons)
    assert TOKEN not in caplog.text
    assert TOKEN not in repr(discord)
    assert all(TOKEN not in str(c) for c in fake.calls)


def test_check_passes_a_good_configuration(fake):
    assert DiscordConnector(source="discord", token=TOKEN).check() == []
    assert DiscordConnector(source="discord", token=TOKEN, base_url=fake.base_url, timeout=2.5).check() == []


def test_check_reports_each_problem():
    where = "CONNECTOR_OUTBOX source 'chat'"

    def ids(**options: Any) -> list[tuple[str | None, str]]:
        return [(m.id, m.msg) for m in DiscordConnector(source="chat", **options).check()]

    assert ids() == [
        (
            "connector_outbox.E201",
            f"{where}: Discord needs a bot token in OPTIONS['token'].",
        )
    ]
    assert ids(token="  ") == ids()
    assert ids(token="Bot abc") == [
        (
            "connector_outbox.E201",
            f"{where}: OPTIONS['token'] must be the bare bot token, without the 'Bot ' prefix.",
        )
    ]
    assert ids(token="t", base_url="discord.com/api") == [
        (
            "connector_outbox.E202",
            f"{where}: OPTIONS['base_url'] must be an http(s) URL, not 'discord.com/api'.",
        )
    ]
    assert ids(token="t", timeout=0) == [
        (
            "connector_outbox.E203",
            f"{where}: OPTIONS['timeout'] must be a positive number of seconds (or a timedelta), not 0.",
        )
    ]
    assert ids(token="t", timeout="10")[0][0] == "connector_outbox.E203"
    assert ids(token="t", timeout=timedelta(seconds=5)) == []
    with pytest.raises(TypeError, match="webhook_url"):
        DiscordConnector(source="chat", token="t", webhook_url="x")
    assert all(isinstance(m, checks.Error) for m in DiscordConnector(source="chat").check())


def test_timeout_and_kinds():
    connector = DiscordConnector(source="d", token="t", timeout=7)
    assert connector.timeout == 7.0
    assert DiscordConnector(source="d", token="t").timeout == 10.0
    assert connector.kinds == {"message", "status", "reaction", "delete"}


# -- tokens that are not header text (issue 9, hole 13) ---------------------------------------


def test_a_token_read_from_a_file_with_its_newline_is_stripped_and_works(fake, form):
    connector = in_form(
        form, DiscordConnector(source="discord", token=f" {TOKEN}\n", base_url=fake.base_url, timeout=1)
    )
    assert connector.check() == []
    assert isinstance(connector.send(post()), Delivered)
    connector.close()


@pytest.mark.parametrize(
    "token", [TOKEN + "é", "MTIz.secret bot-token", "MTIz.secret\x00bot-token", "MTIz\rsecret"]
)
def test_a_token_that_cannot_be_sent_in_a_header_is_a_check_error(token):
    assert [(m.id, m.msg) for m in DiscordConnector(source="chat", token=token).check()] == [
        (
            "connector_outbox.E201",
            "CONNECTOR_OUTBOX source 'chat': OPTIONS['token'] must be printable ASCII without spaces; "
            "this one cannot be sent in an HTTP header.",
        )
    ]


@pytest.mark.parametrize(
    "token",
    ["MTIz.secret-bot-tokén", "MTIz.secret\x00bot-token", "MTIz.secret\nbot-token"],
    ids=["non-ascii", "nul", "newline"],
)
def test_a_request_that_cannot_be_sent_is_retried_never_a_lost_reply_and_never_shows_the_token(
    fake, caplog, token, form
):
    caplog.set_level(logging.DEBUG)
    connector = in_form(
        form, DiscordConnector(source="discord", token=token, base_url=fake.base_url, timeout=1)
    )
    outcomes = [
        connector.send(post()),
        connector.send(post("status", ref="123")),
        connector.send(post("reaction", {"emoji": "👍", "message_id": "123"})),
    ]
    with pytest.raises(CheckLater) as lookup:
        connector.find_sent(post(stale=True))
    connector.close()
    assert [type(o) for o in outcomes] == [RetryLater, RetryLater, RetryLater]
    assert fake.calls == []  # nothing left
    for text in [*(o.reason for o in outcomes), str(lookup.value), caplog.text]:
        assert "secret" not in text and "MTIz" not in text
