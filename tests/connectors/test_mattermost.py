"""The Mattermost connector against the fake Mattermost server, over real sockets. The tests
that take `mattermost` or `form` run through both forms: the blocking methods and the
coroutines (installations read and revoked off the loop)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core import checks

from django_connector_outbox.connectors import (
    CannotCheck,
    CheckLater,
    Delivered,
    Hold,
    MaybeSent,
    RateLimited,
    Refused,
    RetryLater,
)
from django_connector_outbox.connectors.mattermost import MattermostConnector, marker_for
from django_connector_outbox.fakes import mattermost as fm
from django_connector_outbox.installations import Credentials, Installations
from django_connector_outbox.posts import ClaimedPost, Parent, Scope
from tests.connectors.helpers import claimed_post, in_form

TOKEN = "mm-bot-token-8f2k4q9x7w3e5r1t"
TEAM = "teamteamteamteamteamteam01"
CHANNEL = "channelchannelchannelchan1"
OTHER = "channelchannelchannelchan2"


@pytest.fixture
def fake() -> Iterator[fm.FakeMattermost]:
    with fm.running(token=TOKEN, channels=(CHANNEL, OTHER)) as server:
        yield server


@pytest.fixture
def mattermost(fake: fm.FakeMattermost, form: str) -> Iterator[MattermostConnector]:
    connector = in_form(form, MattermostConnector(source="mm", url=fake.url, token=TOKEN, timeout=1))
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
    stale: bool = False,
    sent_at: datetime | None = None,
    workspace: str = TEAM,
) -> ClaimedPost:
    return claimed_post(
        "mm",
        post_id,
        {"message": "hello"} if body is None else body,
        kind=kind,
        workspace_id=workspace,
        container_id=container,
        thread_id=thread,
        message_ref=ref,
        stale=stale,
        sent_at=sent_at,
    )


def bot_posts(fake: fm.FakeMattermost, channel: str = CHANNEL) -> list[fm.Post]:
    return [p for p in fake.posts(channel) if p.user_id == fake.bot_user["id"]]


# -- message, threads ---------------------------------------------------------------------


def test_a_message_is_created_with_its_marker_and_dedupe_key_and_its_post_id_is_the_ref(fake, mattermost):
    outcome = mattermost.send(post(body={"message": "deploy done", "props": {"card": "x"}}))

    [stored] = bot_posts(fake)
    assert outcome == Delivered(stored.id)
    key = marker_for("mm", "post-1")
    assert (stored.message, stored.root_id, stored.props) == (
        "deploy done",
        "",
        {"card": "x", "outbox_id": key},
    )
    [call] = fake.calls_of("create_post")
    assert call.json["pending_post_id"] == key and call.json["channel_id"] == CHANNEL
    assert call.path == "/api/v4/posts"


def test_a_reply_goes_into_its_thread_by_root_id(fake, mattermost):
    root = fake.add_post(CHANNEL, "incident")
    outcome = mattermost.send(post(thread=root, body={"message": "on it", "root_id": "ignored"}))

    assert isinstance(outcome, Delivered)
    assert fake.post(outcome.message_ref).root_id == root


def test_a_reply_to_a_reply_names_the_root_of_the_thread():
    connector = MattermostConnector(source="mm", url="https://chat.example.com", token=TOKEN)
    # A top-level parent: its own post is the thread's root.
    assert connector.reply_thread(Parent("p1", "posted", "rootpost", "")) == "rootpost"
    # A parent that is itself a reply: Mattermost refuses a root_id that is a reply, so the
    # reply goes into the parent's own thread.
    assert connector.reply_thread(Parent("p2", "posted", "replypost", "rootpost")) == "rootpost"


def test_a_reply_with_the_resolved_thread_of_its_parent_lands_in_that_thread(fake, mattermost):
    parent = mattermost.send(post(post_id="parent", body={"message": "parent"}))
    assert isinstance(parent, Delivered) and parent.message_ref
    thread = mattermost.reply_thread(Parent("parent", "posted", parent.message_ref, ""))
    reply = mattermost.send(post(post_id="child", thread=thread, body={"message": "child"}))
    assert isinstance(reply, Delivered)
    assert fake.post(reply.message_ref).root_id == parent.message_ref
    # A reply to that reply goes to the same root.
    thread2 = mattermost.reply_thread(Parent("child", "posted", reply.message_ref, thread))
    grandchild = mattermost.send(post(post_id="grandchild", thread=thread2, body={"message": "again"}))
    assert isinstance(grandchild, Delivered)
    assert fake.post(grandchild.message_ref).root_id == parent.message_ref


def test_a_reply_to_a_reply_id_is_refused_with_mattermosts_error(fake, mattermost):
    root = fake.add_post(CHANNEL, "root")
    reply = fake.add_post(CHANNEL, "reply", root_id=root)
    outcome = mattermost.send(post(thread=reply))
    assert outcome == Refused(
        "mattermost 400 api.post.create_post.root_id.app_error: Invalid RootId parameter."
    )


# -- status ---------------------------------------------------------------------------------


def test_a_status_is_created_then_patched_in_place_keeping_its_marker(fake, mattermost):
    created = mattermost.send(post("status", {"message": "deploy: started", "props": {"a": 1}}))
    assert isinstance(created, Delivered) and created.message_ref
    edited = mattermost.send(post("status", {"message": "deploy: done"}, ref=created.message_ref))

    assert edited == Delivered(created.message_ref)
    [stored] = bot_posts(fake)
    assert (stored.message, stored.props) == ("deploy: done", {"outbox_id": marker_for("mm", "post-1")})
    [patch] = fake.calls_of("patch_post")
    assert patch.path == f"/api/v4/posts/{created.message_ref}/patch"
    assert set(patch.json) == {"message", "props"}


def test_a_status_create_answered_with_an_older_copy_by_pending_post_id_is_brought_up_to_date(
    fake, mattermost
):
    # The first try created the post but its answer was a proxy's 502; the status changed since.
    fake.script("create_post", fm.drop())
    assert isinstance(mattermost.send(post("status", {"message": "v1"})), MaybeSent)
    outcome = mattermost.send(post("status", {"message": "v2"}))

    [stored] = bot_posts(fake)
    assert outcome == Delivered(stored.id)
    assert stored.message == "v2"
    assert len(fake.calls_of("patch_post")) == 1


def test_a_lost_reply_on_a_patch_is_a_retry(fake, mattermost):
    created = mattermost.send(post("status", {"message": "v1"}))
    fake.script("patch_post", fm.drop())
    outcome = mattermost.send(post("status", {"message": "v2"}, ref=created.message_ref))
    assert isinstance(outcome, RetryLater)


def test_patching_a_post_of_someone_else_is_refused(fake, mattermost):
    theirs = fake.add_post(CHANNEL, "mine")
    outcome = mattermost.send(post("status", {"message": "x"}, ref=theirs))
    assert outcome == Refused(
        "mattermost 403 api.context.permissions.app_error: You do not have the appropriate permissions."
    )


# -- reaction, ephemeral --------------------------------------------------------------------


def test_a_reaction_is_saved_as_the_bot_whose_id_is_asked_once(fake, mattermost):
    target = fake.add_post(CHANNEL, "shall we deploy?")
    for n in range(2):
        body = {"post_id": target, "emoji_name": ":white_check_mark:"}
        assert mattermost.send(post("reaction", body, post_id=f"r{n}")) == Delivered(None)

    assert [(r.user_id, r.post_id, r.emoji_name) for r in fake.reactions] == [
        (fake.bot_user["id"], target, "white_check_mark")
    ]
    assert len(fake.calls_of("get_me")) == 1


def test_props_that_are_not_an_object_are_refused_before_any_request(fake, mattermost):
    refused = Refused("mattermost body 'props' must be a JSON object")
    assert mattermost.send(post(body={"message": "x", "props": ["a"]})) == refused
    assert mattermost.send(post("status", {"message": "x", "props": "a"}, ref="someref")) == refused
    assert fake.calls == []


def test_a_reaction_without_its_post_or_emoji_is_refused_before_any_request(fake, mattermost):
    assert mattermost.send(post("reaction", {"emoji_name": "eyes"})) == Refused(
        "mattermost reaction body needs 'post_id' and 'emoji_name'"
    )
    assert fake.calls == []


def test_a_lost_reply_on_a_reaction_is_a_retry_and_its_lookup_says_send_again(fake, mattermost):
    target = fake.add_post(CHANNEL, "x")
    fake.script("save_reaction", fm.drop())
    reaction = post("reaction", {"post_id": target, "emoji_name": "eyes"})
    assert isinstance(mattermost.send(reaction), RetryLater)
    assert mattermost.find_sent(reaction) is None


def test_an_ephemeral_post_goes_to_one_user_and_cannot_be_looked_up(fake, mattermost):
    ephemeral = post("ephemeral", {"user_id": fm.PERSON_ID, "message": "only you"})
    assert mattermost.send(ephemeral) == Delivered(None)
    [sent] = fake.ephemerals
    assert sent["user_id"] == fm.PERSON_ID
    assert (sent["post"]["channel_id"], sent["post"]["message"]) == (CHANNEL, "only you")
    assert bot_posts(fake) == []
    with pytest.raises(CannotCheck, match="ephemeral"):
        mattermost.find_sent(ephemeral)


def test_a_lost_reply_on_an_ephemeral_post_may_have_been_sent(fake, mattermost):
    fake.script("create_ephemeral", fm.drop())
    assert isinstance(
        mattermost.send(post("ephemeral", {"user_id": fm.PERSON_ID, "message": "x"})), MaybeSent
    )


# -- delete ---------------------------------------------------------------------------------


def test_a_delete_removes_the_bots_post_and_its_replies(fake, mattermost):
    root = mattermost.send(post(body={"message": "root"}))
    assert isinstance(root, Delivered) and root.message_ref
    assert isinstance(
        mattermost.send(post(post_id="r", body={"message": "reply"}, thread=root.message_ref)), Delivered
    )
    kept = mattermost.send(post(post_id="other", body={"message": "kept"}))

    assert mattermost.send(post("delete", {}, post_id="d", ref=root.message_ref)) == Delivered(
        root.message_ref
    )
    assert [p.message for p in bot_posts(fake)] == ["kept"]
    [call] = fake.calls_of("delete_post")
    assert (call.method, call.path) == ("DELETE", f"/api/v4/posts/{root.message_ref}")
    assert isinstance(kept, Delivered)


def test_a_delete_of_a_post_gone_already_is_done(fake, mattermost):
    sent = mattermost.send(post())
    assert isinstance(sent, Delivered) and sent.message_ref
    delete = post("delete", {}, post_id="d", ref=sent.message_ref)
    assert mattermost.send(delete) == Delivered(sent.message_ref)
    assert mattermost.send(delete) == Delivered(sent.message_ref)  # the 404 of a second try
    assert len(fake.calls_of("delete_post")) == 2


def test_a_delete_whose_reply_is_lost_is_retried_and_never_looked_up(fake, mattermost):
    sent = mattermost.send(post())
    assert isinstance(sent, Delivered) and sent.message_ref
    fake.script("delete_post", fm.drop())
    delete = post("delete", {}, post_id="d", ref=sent.message_ref)
    assert isinstance(mattermost.send(delete), RetryLater)
    assert bot_posts(fake) == []  # deleted before the reply was lost
    assert mattermost.find_sent(delete) is None
    assert mattermost.send(delete) == Delivered(sent.message_ref)


def test_a_delete_of_someone_elses_post_is_refused_with_the_permission_it_lacks(fake, mattermost):
    theirs = fake.add_post(CHANNEL, "a person's")
    outcome = mattermost.send(post("delete", {}, post_id="d", ref=theirs))
    assert isinstance(outcome, Refused)
    assert "mattermost 403 api.context.permissions.app_error" in outcome.reason
    assert "delete_post permission" in outcome.reason
    assert [p.message for p in fake.posts(CHANNEL)] == ["a person's"]


def test_a_delete_without_a_message_ref_is_refused_without_a_request(fake, mattermost):
    assert isinstance(mattermost.send(post("delete", {}, post_id="d")), Refused)
    assert fake.calls == []


# -- errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("action", "expected"),
    [
        (
            fm.error("model.post.is_valid.message_length.app_error", "Invalid Message property length."),
            Refused(
                "mattermost 400 model.post.is_valid.message_length.app_error: Invalid Message property length."
            ),
        ),
        (
            fm.error(
                "api.post.create_post.can_not_post_to_deleted.error", "Can not post to deleted channel.", 400
            ),
            Refused(
                "mattermost 400 api.post.create_post.can_not_post_to_deleted.error: Can not post to deleted channel."
            ),
        ),
        (
            fm.error("api.context.permissions.app_error", "No permission", 403),
            Refused("mattermost 403 api.context.permissions.app_error: No permission"),
        ),
        (
            fm.error("api.post.create_post.too_large", "x", 413),
            Refused("mattermost 413 api.post.create_post.too_large: x"),
        ),
        (
            fm.error("api.post.deduplicate_create_post.pending", "pending", 500),
            RetryLater("mattermost 500 api.post.deduplicate_create_post.pending: pending"),
        ),
        (
            fm.error("app.post.save.app_error", "Unable to save the post.", 500),
            RetryLater("mattermost 500 app.post.save.app_error: Unable to save the post."),
        ),
        (fm.html(502), MaybeSent("mattermost 502 Bad Gateway")),
        (fm.html(504), MaybeSent("mattermost 504 Gateway Timeout")),
        (fm.ratelimit(3), RateLimited(3.0, "mattermost 429 Too Many Requests (rate limited)", Scope.SOURCE)),
    ],
)
def test_create_errors_map_to_outcomes(fake, mattermost, action, expected):
    fake.script("create_post", action)
    assert mattermost.send(post()) == expected


@pytest.mark.parametrize("action", [fm.html(502), fm.error("app.post.update.app_error", "x", 500)])
def test_a_5xx_on_a_patch_is_a_retry(fake, mattermost, action):
    created = mattermost.send(post("status", {"message": "v1"}))
    fake.script("patch_post", action)
    assert isinstance(mattermost.send(post("status", {"message": "v2"}, ref=created.message_ref)), RetryLater)


def test_an_unknown_channel_is_refused(fake, mattermost):
    outcome = mattermost.send(post(container="channelnotherechannelnoth1"))
    assert isinstance(outcome, Refused) and "403 api.context.permissions.app_error" in outcome.reason


def test_a_refused_token_is_refused_and_never_shown(fake, caplog, form):
    wrong = "mm-wrong-token-zz81kq03mm4"
    connector = in_form(form, MattermostConnector(source="mm", url=fake.url, token=wrong, timeout=1))
    with caplog.at_level(logging.DEBUG):
        outcome = connector.send(post())
    assert outcome == Refused(
        "mattermost 401 api.context.session_expired.app_error: Invalid or expired session, please login again."
    )
    assert wrong not in caplog.text and TOKEN not in caplog.text
    connector.close()


def test_a_connection_refused_is_a_retry(form):
    connector = in_form(
        form, MattermostConnector(source="mm", url="http://127.0.0.1:9", token=TOKEN, timeout=1)
    )
    assert isinstance(connector.send(post()), RetryLater)
    connector.close()


def test_a_reply_slower_than_the_timeout_on_a_create_may_have_been_sent(fake, form):
    connector = in_form(form, MattermostConnector(source="mm", url=fake.url, token=TOKEN, timeout=0.2))
    fake.script("create_post", fm.delay(1.0))
    assert isinstance(connector.send(post()), MaybeSent)
    connector.close()


# -- lost replies and lookups ---------------------------------------------------------------


def test_a_lost_reply_on_a_create_is_maybe_sent_stored_once_and_found(fake, mattermost):
    fake.script("create_post", fm.drop())
    first = post()
    assert isinstance(mattermost.send(first), MaybeSent)
    [stored] = bot_posts(fake)
    assert mattermost.find_sent(post(stale=True, sent_at=first.sent_at)) == stored.id
    [listing] = fake.calls_of("get_posts")
    assert int(listing.query["since"]) <= int((first.sent_at - timedelta(seconds=60)).timestamp() * 1000)


def test_a_retry_within_the_dedupe_window_returns_the_first_post(fake, mattermost):
    fake.script("create_post", fm.drop())
    assert isinstance(mattermost.send(post()), MaybeSent)
    again = mattermost.send(post())
    [stored] = bot_posts(fake)
    assert again == Delivered(stored.id)


def test_a_post_not_sent_is_not_found(fake, mattermost):
    mattermost.send(post(post_id="other"))
    fake.add_post(CHANNEL, "hello")
    assert mattermost.find_sent(post(stale=True)) is None


def test_a_persons_post_with_the_marker_is_not_the_bots(fake, mattermost):
    with fake._lock:
        fake._new_post(
            CHANNEL, fm.PERSON_ID, {"message": "x", "props": {"outbox_id": marker_for("mm", "post-1")}}
        )
    assert mattermost.find_sent(post(stale=True)) is None


def test_a_lost_reply_in_a_thread_is_found_in_the_thread(fake, mattermost):
    root = fake.add_post(CHANNEL, "root")
    fake.script("create_post", fm.drop())
    reply = post(thread=root, body={"message": "in thread"})
    assert isinstance(mattermost.send(reply), MaybeSent)
    [stored] = bot_posts(fake)
    assert mattermost.find_sent(reply) == stored.id
    assert [c.path for c in fake.calls_of("get_thread")] == [f"/api/v4/posts/{root}/thread"]
    assert fake.calls_of("get_posts") == []


def test_a_post_older_than_the_lookup_window_is_not_read(fake, mattermost):
    mattermost.send(post())
    later = datetime.now(UTC) + timedelta(minutes=5)
    assert mattermost.find_sent(post(stale=True, sent_at=later)) is None


def test_a_failed_lookup_asks_again_later(fake, mattermost):
    fake.script("get_posts", fm.error("app.post.get_posts_since.app_error", "db", 500))
    with pytest.raises(CheckLater, match="mattermost lookup: mattermost 500"):
        mattermost.find_sent(post(stale=True))
    fake.script("get_posts", fm.ratelimit(2))
    with pytest.raises(CheckLater, match="429"):
        mattermost.find_sent(post(stale=True))


def test_a_channel_with_a_full_since_answer_asks_again_later(fake, mattermost, monkeypatch):
    monkeypatch.setattr(fm, "SINCE_CAP", 3)
    monkeypatch.setattr("django_connector_outbox.connectors.mattermost.SINCE_CAP", 3)
    for n in range(3):
        fake.add_post(CHANNEL, f"busy {n}")
    with pytest.raises(CheckLater, match="3 or more"):
        mattermost.find_sent(post(stale=True))


# -- rate limits ----------------------------------------------------------------------------


def test_the_servers_limit_holds_the_source_for_its_retry_after():
    with fm.running(token=TOKEN, channels=(CHANNEL,), limit=fm.mattermost_limit(per_sec=1, burst=1)) as fake:
        connector = MattermostConnector(source="mm", url=fake.url, token=TOKEN, timeout=1)
        first = connector.send(post(post_id="a"))
        second = connector.send(post(post_id="b"))
        third = connector.send(post(post_id="c"))
        connector.close()
    assert isinstance(first, Delivered) and first.hold is None
    # The request that empties the bucket is told so: the next one waits a second.
    assert isinstance(second, Delivered)
    assert second.hold == Hold(1.0, "mattermost rate limit: X-Ratelimit-Remaining 0", Scope.SOURCE)
    assert third == RateLimited(1.0, "mattermost 429 Too Many Requests (rate limited)", Scope.SOURCE)
    assert fake.statuses[429] == 1 and len(fake.accepted) == 2


def test_with_installations_a_429_holds_the_team():
    connector = MattermostConnector(source="mm", installations=True)
    assert connector.limit_scope == Scope.WORKSPACE


# -- installations --------------------------------------------------------------------------


@pytest.mark.django_db
def test_each_team_posts_to_its_own_server_with_its_own_bot(form):
    other_token = "mm-second-server-token-5t6y7u8i"
    with (
        fm.running(token=TOKEN, channels=(CHANNEL,)) as one,
        fm.running(token=other_token, channels=(OTHER,)) as two,
    ):
        installs = Installations("mm")
        installs.save("team-one", secrets={"bot_token": TOKEN}, extra={"url": one.url})
        installs.save("team-two", secrets={"bot_token": other_token}, extra={"url": two.url + "/api/v4/"})
        connector = in_form(form, MattermostConnector(source="mm", installations=True, timeout=1))
        assert connector.check() == []
        first = connector.send(post(workspace="team-one", container=CHANNEL))
        second = connector.send(post(post_id="p2", workspace="team-two", container=OTHER))
        connector.close()
        assert [p.id for p in bot_posts(one, CHANNEL)] == [first.message_ref]
        assert [p.id for p in bot_posts(two, OTHER)] == [second.message_ref]
        assert all(c.authorized for c in one.calls + two.calls)


@pytest.mark.django_db
def test_a_team_without_an_installation_fails_with_no_request(fake, form):
    connector = in_form(form, MattermostConnector(source="mm", installations=True, timeout=1))
    outcome = connector.send(post(workspace="team-none"))
    assert outcome == Refused("workspace team-none has no installation of source 'mm': install the app again")
    with pytest.raises(CannotCheck, match="team-none has no installation"):
        connector.find_sent(post(workspace="team-none", stale=True))
    assert fake.calls == []


@pytest.mark.django_db
def test_an_installation_without_a_server_url_fails_with_no_request(fake):
    Installations("mm").save("team-one", secrets={"bot_token": TOKEN})
    connector = MattermostConnector(source="mm", installations=True, timeout=1)
    outcome = connector.send(post(workspace="team-one"))
    assert isinstance(outcome, Refused) and "has no server url" in outcome.reason
    assert fake.calls == []


@pytest.mark.django_db
def test_a_401_revokes_the_installation_and_the_teams_next_posts_make_no_request(fake, caplog, form):
    wrong = "mm-revoked-token-q1w2e3r4t5"
    Installations("mm").save("team-one", secrets={"bot_token": wrong}, extra={"url": fake.url})
    connector = in_form(form, MattermostConnector(source="mm", installations=True, timeout=1))
    with caplog.at_level(logging.DEBUG):
        first = connector.send(post(workspace="team-one"))
        second = connector.send(post(post_id="p2", workspace="team-one"))
    connector.close()
    assert isinstance(first, Refused) and "was revoked (mattermost 401" in first.reason
    assert "install the app again" in first.reason
    assert second == first
    assert len(fake.calls) == 1
    # Another sender, whose copy of the installation is still cached, gets the same 401 after
    # the revocation: its post fails the same way, not as "installed again since".
    cached = in_form(form, MattermostConnector(source="mm", installations=True, timeout=1))
    cached._installations = Installations("mm", cache_seconds=60)
    cached._installations._cache.put(
        "team-one", Credentials("mm", "team-one", wrong, extra={"url": fake.url})
    )
    assert cached.send(post(post_id="p3", workspace="team-one")) == first
    cached.close()
    assert wrong not in caplog.text + first.reason


# -- configuration --------------------------------------------------------------------------


def ids(messages: list[checks.CheckMessage]) -> list[tuple[str | None, str]]:
    return [(m.id, m.msg) for m in messages]


def test_checks_name_each_bad_option():
    where = "CONNECTOR_OUTBOX source 'mm'"
    assert ids(MattermostConnector(source="mm").check()) == [
        (
            "connector_outbox.E231",
            f"{where}: Mattermost needs the server's http(s) URL in OPTIONS['url'], not None.",
        ),
        (
            "connector_outbox.E232",
            f"{where}: Mattermost needs a bot access token in OPTIONS['token'] (or 'installations': True).",
        ),
    ]
    bad = MattermostConnector(source="mm", url="chat.example.com", token="a b", timeout=0)
    assert ids(bad.check()) == [
        (
            "connector_outbox.E231",
            f"{where}: Mattermost needs the server's http(s) URL in OPTIONS['url'], not 'chat.example.com'.",
        ),
        (
            "connector_outbox.E232",
            f"{where}: OPTIONS['token'] must be printable ASCII without spaces; "
            "this one cannot be sent in an HTTP header.",
        ),
        (
            "connector_outbox.E233",
            f"{where}: OPTIONS['timeout'] must be a positive number of seconds (or a timedelta), not 0.",
        ),
    ]
    both = MattermostConnector(source="mm", url="https://chat.example.com", token=TOKEN, installations=True)
    assert ids(both.check()) == [
        (
            "connector_outbox.E234",
            f"{where}: with OPTIONS['installations'], each team's server url and bot token come from "
            "its installation: remove OPTIONS['url'] and OPTIONS['token'].",
        )
    ]
    assert ids(MattermostConnector(source="mm", installations="yes").check()) == [
        ("connector_outbox.E234", f"{where}: OPTIONS['installations'] must be True or False, not 'yes'.")
    ]
    assert MattermostConnector(source="mm", url="https://chat.example.com/", token=f"{TOKEN}\n").check() == []


def test_the_token_is_not_in_the_connectors_repr():
    connector = MattermostConnector(source="mm", url="https://chat.example.com", token=TOKEN)
    assert TOKEN not in repr(connector)
