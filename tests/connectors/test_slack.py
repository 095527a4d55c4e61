"""The Slack connector: the real connector and slack-sdk, over real sockets, to a fake Slack."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core import checks
from slack_sdk import WebClient

from django_connector_outbox.connectors.base import (
    CannotCheck,
    CheckLater,
    Delivered,
    MaybeSent,
    Outcome,
    RateLimited,
    Refused,
    RetryLater,
)
from django_connector_outbox.connectors.slack import SlackConnector
from django_connector_outbox.fakes.slack import (
    BOT_USER_ID,
    FakeSlack,
    delay,
    drop,
    error,
    html,
    ok,
    ratelimit,
    reset,
)
from django_connector_outbox.posts import ClaimedPost
from tests.connectors.helpers import claimed_post

# Distinctive, so that any leak into a reason or a log line is found by a plain substring test.
TOKEN = "xoxb-SECRET-4242-do-not-leak"
CHANNEL = "C0000000001"
TEAM = "T0000000001"
META = "connector_outbox"


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeSlack]:
    # slack-sdk reads proxies from the environment; the fake is on loopback, never behind one.
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    server = FakeSlack(TOKEN, channels=(CHANNEL, "C0000000002"), team_id=TEAM).start()
    yield server
    server.stop()


@pytest.fixture
def connector(fake: FakeSlack) -> Iterator[SlackConnector]:
    built = SlackConnector(source="slack", token=TOKEN, base_url=fake.base_url, timeout=2)
    yield built
    built.close()


@pytest.fixture
def marketplace(fake: FakeSlack) -> Iterator[SlackConnector]:
    """A Marketplace (or internal) app's connector: lookups of 200 a page, up to 5 pages a call."""
    built = SlackConnector(source="slack", token=TOKEN, base_url=fake.base_url, timeout=2, marketplace=True)
    yield built
    built.close()


def claim(
    post_id: str = "p1",
    *,
    kind: str = "message",
    body: dict[str, Any] | None = None,
    container_id: str = CHANNEL,
    thread_id: str = "",
    message_ref: str | None = None,
    stale: bool = False,
    sent_at: datetime | None = None,
) -> ClaimedPost:
    return claimed_post(
        "slack",
        post_id,
        {"text": f"hello from {post_id}"} if body is None else body,
        kind=kind,
        workspace_id=TEAM,
        container_id=container_id,
        thread_id=thread_id,
        message_ref=message_ref,
        stale=stale,
        sent_at=sent_at,
    )


def ours(post_id: str) -> dict[str, Any]:
    return {"event_type": META, "event_payload": {"post_id": post_id}}


def ref_ts(outcome: Outcome) -> str:
    assert isinstance(outcome, Delivered) and outcome.message_ref
    channel, ts = outcome.message_ref.split(":")
    assert channel == CHANNEL
    return ts


# -- options and checks


def test_options_and_kinds() -> None:
    connector = SlackConnector(source="slack", token=TOKEN, timeout=3)
    assert connector.timeout == 3.0
    assert connector.kinds == {"message", "status", "reaction", "ephemeral", "delete"}
    assert SlackConnector(source="slack", token=TOKEN).timeout == 10.0
    assert connector.client.base_url == "https://slack.com/api/"
    # The outbox retries, not the SDK.
    assert connector.client.retry_handlers == []
    assert connector.check() == []


def test_unknown_option_is_a_type_error() -> None:
    with pytest.raises(
        TypeError,
        match=r"unknown OPTIONS channel, tokn; it takes token, installations, client_id, "
        r"client_secret, scopes, user_scopes, success_url, marketplace, base_url and timeout",
    ):
        SlackConnector(source="slack", tokn=TOKEN, channel="C1")


@pytest.mark.parametrize("token", [None, "", "   "])
def test_check_missing_token(token: str | None) -> None:
    options: dict[str, Any] = {} if token is None else {"token": token}
    assert SlackConnector(source="slack", **options).check() == [
        checks.Error(
            "Connector outbox source 'slack': the Slack OPTIONS need a 'token'.",
            hint="Set OPTIONS['token'] to the app's bot token (xoxb-...), or "
            "OPTIONS['installations'] to True for an app installed in many workspaces.",
            id="connector_outbox.E101",
        )
    ]


@pytest.mark.parametrize("timeout", [0, -1, "10", None, True, float("nan"), float("inf")])
def test_check_bad_timeout(timeout: Any) -> None:
    connector = SlackConnector(source="slack", token=TOKEN, timeout=timeout)
    assert connector.check() == [
        checks.Error(
            f"Connector outbox source 'slack': the Slack OPTIONS['timeout'] must be a positive number "
            f"of seconds, not {timeout!r}.",
            id="connector_outbox.E102",
        )
    ]
    # Still usable as a number by the LEASE check, which then reports nothing of its own.
    assert connector.timeout == 10.0


def test_check_timedelta_timeout_is_fine() -> None:
    connector = SlackConnector(source="slack", token=TOKEN, timeout=timedelta(seconds=5))
    assert connector.timeout == 5.0
    assert connector.check() == []


@pytest.mark.parametrize("base_url", ["slack.com/api", "ftp://slack.com/api/", ""])
def test_check_bad_base_url(base_url: str) -> None:
    assert SlackConnector(source="slack", token=TOKEN, base_url=base_url).check() == [
        checks.Error(
            f"Connector outbox source 'slack': the Slack OPTIONS['base_url'] must be an http(s) URL, "
            f"not {base_url!r}.",
            hint="Leave it out to use https://slack.com/api/.",
            id="connector_outbox.E103",
        )
    ]


# -- each kind


def test_message_top_level(connector: SlackConnector, fake: FakeSlack) -> None:
    outcome = connector.send(claim("p1", body={"text": "hi", "unfurl_links": False}))

    ts = ref_ts(outcome)
    assert fake.calls_of("chat.postMessage") == [
        {"channel": CHANNEL, "text": "hi", "unfurl_links": False, "metadata": ours("p1")}
    ]
    [message] = fake.messages(CHANNEL)
    assert (message.ts, message.text, message.thread_ts, message.metadata) == (ts, "hi", "", ours("p1"))
    assert all(call.authorized for call in fake.calls)


def test_message_thread_reply(connector: SlackConnector, fake: FakeSlack) -> None:
    parent = fake.add_message(CHANNEL, "a question")

    outcome = connector.send(claim("reply:1", thread_id=parent, body={"text": "an answer"}))

    ts = ref_ts(outcome)
    assert fake.calls_of("chat.postMessage")[0]["thread_ts"] == parent
    assert [m.ts for m in fake.messages(CHANNEL, thread_ts=parent)] == [ts]
    assert fake.message(CHANNEL, parent).replies == [ts]


def test_message_ref_uses_the_channel_slack_returns(connector: SlackConnector, fake: FakeSlack) -> None:
    # A user id as channel opens a DM; only its D... id works for chat.update later.
    outcome = connector.send(claim("dm", container_id="U0PERSON1"))

    assert isinstance(outcome, Delivered)
    assert outcome.message_ref is not None and outcome.message_ref.startswith("D0PERSON1:")


@pytest.mark.parametrize("key", ["channel", "thread_ts", "metadata", "token"])
def test_body_may_not_set_what_the_outbox_sets(connector: SlackConnector, fake: FakeSlack, key: str) -> None:
    outcome = connector.send(claim(body={"text": "hi", key: "x"}))

    assert outcome == Refused(f"the body may not set {key}: the outbox sets it")
    assert fake.calls == []


def test_status_create_then_update(connector: SlackConnector, fake: FakeSlack) -> None:
    created = connector.send(
        claim("status:1", kind="status", body={"text": "building", "icon_emoji": ":gear:"})
    )
    ts = ref_ts(created)
    assert fake.calls_of("chat.postMessage")[0]["metadata"] == ours("status:1")

    body = {
        "text": "built",
        "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": "*built*"}}],
        "icon_emoji": ":gear:",  # not accepted by chat.update: dropped
        "unfurl_links": False,  # idem
    }
    edited = connector.send(claim("status:1", kind="status", body=body, message_ref=f"{CHANNEL}:{ts}"))

    assert edited == Delivered(f"{CHANNEL}:{ts}")
    assert fake.calls_of("chat.update") == [
        {"channel": CHANNEL, "ts": ts, "text": "built", "blocks": body["blocks"]}
    ]
    message = fake.message(CHANNEL, ts)
    assert (message.text, message.blocks) == ("built", body["blocks"])
    # chat.update without metadata keeps the message's own: it can still be found.
    assert message.metadata == ours("status:1")
    assert len(fake.messages(CHANNEL)) == 1


def test_status_update_of_a_deleted_message_is_refused(connector: SlackConnector, fake: FakeSlack) -> None:
    outcome = connector.send(claim(kind="status", message_ref=f"{CHANNEL}:1700000000.000100"))

    assert outcome == Refused("slack error message_not_found on chat.update")


def test_status_update_with_a_bad_ref_is_refused(connector: SlackConnector, fake: FakeSlack) -> None:
    outcome = connector.send(claim(kind="status", message_ref="no-colon"))

    assert outcome == Refused("not a Slack message ref (channel:ts): 'no-colon'")
    assert fake.calls == []


def test_delete_removes_the_message_from_the_channel(connector: SlackConnector, fake: FakeSlack) -> None:
    kept = ref_ts(connector.send(claim("kept")))
    ref = connector.send(claim("p1")).message_ref  # type: ignore[union-attr]

    outcome = connector.send(claim("p1:delete", kind="delete", body={}, message_ref=ref))

    assert outcome == Delivered(ref)
    assert fake.calls_of("chat.delete") == [{"channel": CHANNEL, "ts": ref.split(":")[1]}]
    assert [m.ts for m in fake.messages(CHANNEL)] == [kept]


def test_delete_of_a_reply_takes_it_out_of_its_thread(connector: SlackConnector, fake: FakeSlack) -> None:
    parent = ref_ts(connector.send(claim("parent")))
    reply = connector.send(claim("reply", thread_id=parent)).message_ref

    assert connector.send(claim("reply:delete", kind="delete", body={}, message_ref=reply)) == Delivered(
        reply
    )

    assert fake.messages(CHANNEL, thread_ts=parent) == []
    assert fake.message(CHANNEL, parent).replies == []


def test_delete_of_a_message_gone_already_is_done(connector: SlackConnector, fake: FakeSlack) -> None:
    ref = connector.send(claim("p1")).message_ref
    post = claim("p1:delete", kind="delete", body={}, message_ref=ref)
    assert connector.send(post) == Delivered(ref)

    # A second delete (after a lost reply, or a person deleted it first): Slack's
    # message_not_found, the message is not there, which is what the delete asked.
    assert connector.send(post) == Delivered(ref)
    assert len(fake.calls_of("chat.delete")) == 2


def test_delete_of_a_persons_message_is_refused(connector: SlackConnector, fake: FakeSlack) -> None:
    ts = fake.add_message(CHANNEL, "mine")

    outcome = connector.send(claim("x:delete", kind="delete", body={}, message_ref=f"{CHANNEL}:{ts}"))

    assert outcome == Refused("slack error cant_delete_message on chat.delete")
    assert [m.ts for m in fake.messages(CHANNEL)] == [ts]


def test_delete_with_a_bad_ref_is_refused_without_a_call(connector: SlackConnector, fake: FakeSlack) -> None:
    outcome = connector.send(claim("x:delete", kind="delete", body={}, message_ref="no-colon"))

    assert outcome == Refused("not a Slack message ref (channel:ts): 'no-colon'")
    assert fake.calls == []


def test_delete_429_holds_the_workspace(connector: SlackConnector, fake: FakeSlack) -> None:
    # chat.delete is Tier 3, limited per workspace: every channel would get the same 429.
    outcome = _send_failing(connector, fake, "chat.delete", ratelimit("7"))

    assert outcome == RateLimited(
        7.0, "slack error ratelimited on chat.delete (HTTP 429, Retry-After 7)", scope="workspace"
    )


def test_find_sent_of_a_delete_sends_it_again(connector: SlackConnector, fake: FakeSlack) -> None:
    post = claim("p1:delete", kind="delete", body={}, message_ref=f"{CHANNEL}:1700000000.000100", stale=True)

    assert connector.find_sent(post) is None
    assert fake.calls == []


def test_reaction_then_already_reacted(connector: SlackConnector, fake: FakeSlack) -> None:
    ts = fake.add_message(CHANNEL, "ship it?")
    post = claim("react:1", kind="reaction", body={"name": "white_check_mark", "timestamp": ts})

    assert connector.send(post) == Delivered(None)
    # A repeat (a retried send after a lost reply, say) is already there: delivered.
    assert connector.send(post) == Delivered(None)

    assert (
        fake.calls_of("reactions.add")
        == [{"channel": CHANNEL, "name": "white_check_mark", "timestamp": ts}] * 2
    )
    assert fake.message(CHANNEL, ts).reactions == {"white_check_mark": [BOT_USER_ID]}


@pytest.mark.parametrize(
    "body", [{"name": "eyes"}, {"timestamp": "1700000000.000100"}, {"name": "", "timestamp": "1"}]
)
def test_reaction_body_needs_name_and_timestamp(
    connector: SlackConnector, fake: FakeSlack, body: dict[str, str]
) -> None:
    assert connector.send(claim(kind="reaction", body=body)) == Refused(
        "a reaction body needs 'name' and 'timestamp' strings"
    )
    assert fake.calls == []


def test_ephemeral(connector: SlackConnector, fake: FakeSlack) -> None:
    parent = fake.add_message(CHANNEL, "help?")

    outcome = connector.send(
        claim("e1", kind="ephemeral", thread_id=parent, body={"user": "U0PERSON1", "text": "psst"})
    )

    assert outcome == Delivered(None)
    assert fake.calls_of("chat.postEphemeral") == [
        {"channel": CHANNEL, "user": "U0PERSON1", "text": "psst", "thread_ts": parent}
    ]
    assert [(e["user"], e["text"], e["thread_ts"]) for e in fake.ephemeral] == [("U0PERSON1", "psst", parent)]
    assert fake.messages(CHANNEL, thread_ts=parent) == []


def test_ephemeral_needs_a_user(connector: SlackConnector, fake: FakeSlack) -> None:
    assert connector.send(claim(kind="ephemeral", body={"text": "psst"})) == Refused(
        "an ephemeral body needs a 'user'"
    )
    assert fake.calls == []


def test_ephemeral_to_a_non_member_is_refused(connector: SlackConnector, fake: FakeSlack) -> None:
    fake.add_channel("C0000000009", members={"U0PERSON1"})
    post = claim(kind="ephemeral", container_id="C0000000009", body={"user": "U0STRANGER", "text": "psst"})

    assert connector.send(post) == Refused("slack error user_not_in_channel on chat.postEphemeral")


def test_one_connector_many_threads(connector: SlackConnector, fake: FakeSlack) -> None:
    posts = [claim(f"p{i}", container_id=(CHANNEL, "C0000000002")[i % 2]) for i in range(40)]

    with ThreadPoolExecutor(max_workers=8) as pool:
        outcomes = list(pool.map(connector.send, posts))

    refs = [o.message_ref for o in outcomes if isinstance(o, Delivered)]
    assert len(set(refs)) == 40
    assert len(fake.messages(CHANNEL)) + len(fake.messages("C0000000002")) == 40


# -- error mapping


def _send_failing(connector: SlackConnector, fake: FakeSlack, method: str, action: Any) -> Outcome:
    """Send a post whose call is `method`, with that call answered by `action`."""
    if method == "chat.postMessage":
        fake.script(method, action)
        return connector.send(claim())
    if method == "chat.update":
        ts = ref_ts(connector.send(claim("status", kind="status")))
        fake.script(method, action)
        return connector.send(claim("status", kind="status", message_ref=f"{CHANNEL}:{ts}"))
    if method == "reactions.add":
        ts = fake.add_message(CHANNEL, "hi")
        fake.script(method, action)
        return connector.send(claim(kind="reaction", body={"name": "eyes", "timestamp": ts}))
    if method == "chat.delete":
        ref = connector.send(claim("to-delete")).message_ref  # type: ignore[union-attr]
        fake.script(method, action)
        return connector.send(claim("to-delete:delete", kind="delete", body={}, message_ref=ref))
    assert method == "chat.postEphemeral"
    fake.script(method, action)
    return connector.send(claim(kind="ephemeral", body={"user": "U0PERSON1", "text": "psst"}))


PERMANENT = [
    ("chat.postMessage", "channel_not_found"),
    ("chat.postMessage", "not_in_channel"),
    ("chat.postMessage", "is_archived"),
    ("chat.postMessage", "invalid_auth"),
    ("chat.postMessage", "token_revoked"),
    ("chat.postMessage", "missing_scope"),
    ("chat.postMessage", "invalid_blocks"),
    ("chat.postMessage", "restricted_action_thread_locked"),
    ("chat.postMessage", "slack_connect_file_upload_blocked"),
    ("chat.update", "msg_too_long"),
    ("chat.update", "message_not_found"),
    ("chat.update", "cant_update_message"),
    ("chat.update", "edit_window_closed"),
    ("reactions.add", "invalid_name"),
    ("reactions.add", "too_many_reactions"),
    ("chat.delete", "cant_delete_message"),
    ("chat.delete", "compliance_exports_prevent_deletion"),
    ("chat.delete", "channel_not_found"),
    ("chat.delete", "missing_scope"),
    ("chat.postEphemeral", "user_not_in_channel"),
]


@pytest.mark.parametrize(("method", "code"), PERMANENT)
def test_permanent_errors_are_refused(
    connector: SlackConnector, fake: FakeSlack, method: str, code: str
) -> None:
    assert _send_failing(connector, fake, method, error(code)) == Refused(f"slack error {code} on {method}")


TRANSIENT = [
    ("chat.postMessage", "service_unavailable", None),
    ("chat.postMessage", "request_timeout", None),
    ("chat.postMessage", "team_added_to_org", 300.0),
    ("chat.postMessage", "org_login_required", 300.0),
    ("chat.update", "update_failed", None),
    ("chat.update", "internal_error", None),
    ("chat.update", "fatal_error", None),
    ("chat.update", "streaming_state_conflict", None),
    ("reactions.add", "internal_error", None),
    ("reactions.add", "external_channel_migrating", None),
    ("chat.delete", "internal_error", None),  # a delete is sent again: deleting twice is harmless
    ("chat.delete", "service_unavailable", None),
    # A code Slack adds later: retried, and failed once out of attempts, rather than refused.
    ("chat.postMessage", "some_new_error", None),
]


@pytest.mark.parametrize(("method", "code", "after"), TRANSIENT)
def test_transient_errors_are_retried(
    connector: SlackConnector, fake: FakeSlack, method: str, code: str, after: float | None
) -> None:
    assert _send_failing(connector, fake, method, error(code)) == RetryLater(
        f"slack error {code} on {method}", after
    )


@pytest.mark.parametrize(
    ("method", "code"),
    [
        ("chat.postMessage", "internal_error"),
        ("chat.postMessage", "fatal_error"),
        ("chat.postEphemeral", "fatal_error"),
    ],
)
def test_ambiguous_errors_on_a_create_may_have_posted(
    connector: SlackConnector, fake: FakeSlack, method: str, code: str
) -> None:
    assert _send_failing(connector, fake, method, error(code)) == MaybeSent(f"slack error {code} on {method}")


@pytest.mark.parametrize(
    ("method", "scope"),
    [
        # One channel's 429 holds the channel: Slack's 429 does not say which limit tripped.
        ("chat.postMessage", "container"),
        # Tiered methods are limited "per API method per workspace/team per app".
        ("chat.update", "workspace"),
        ("reactions.add", "workspace"),
        ("chat.postEphemeral", "workspace"),
    ],
)
def test_http_429_holds_for_retry_after(
    connector: SlackConnector, fake: FakeSlack, method: str, scope: str
) -> None:
    outcome = _send_failing(connector, fake, method, ratelimit("7"))

    assert outcome == RateLimited(
        after=7.0, reason=f"slack error ratelimited on {method} (HTTP 429, Retry-After 7)", scope=scope
    )


def test_http_429_without_retry_after_holds_for_a_minute(connector: SlackConnector, fake: FakeSlack) -> None:
    outcome = _send_failing(connector, fake, "chat.postMessage", ratelimit("soon"))

    assert outcome == RateLimited(
        after=60.0, reason="slack error ratelimited on chat.postMessage (HTTP 429, no Retry-After)"
    )


@pytest.mark.parametrize(("code", "after"), [("rate_limited", 60.0), ("message_limit_exceeded", 900.0)])
def test_rate_limit_codes_hold_the_workspace(
    connector: SlackConnector, fake: FakeSlack, code: str, after: float
) -> None:
    outcome = _send_failing(connector, fake, "chat.postMessage", error(code))

    # "Application has posted too many messages", "Members on this team are sending too many
    # messages": limits of the team, not of the channel.
    assert outcome == RateLimited(
        after=after, reason=f"slack error {code} on chat.postMessage", scope="workspace"
    )


@pytest.mark.parametrize(
    ("method", "status", "expected"),
    [
        ("chat.postMessage", 503, RetryLater),  # turned away before Slack saw it
        ("chat.postMessage", 500, MaybeSent),  # may have been processed behind the proxy
        ("chat.postMessage", 504, MaybeSent),
        ("chat.update", 500, RetryLater),  # an edit is idempotent
        ("reactions.add", 502, RetryLater),
        ("chat.postMessage", 404, RetryLater),
    ],
)
def test_non_json_answers(
    connector: SlackConnector,
    fake: FakeSlack,
    method: str,
    status: int,
    expected: type[RetryLater | MaybeSent],
) -> None:
    outcome = _send_failing(connector, fake, method, html(status))

    assert outcome == expected(f"{method}: HTTP {status} without a Slack answer")


# -- lost replies and transport failures


@pytest.mark.parametrize("action", [drop(), reset()], ids=["closed", "reset"])
def test_lost_reply_on_create_may_have_posted_and_is_not_resent(
    connector: SlackConnector, fake: FakeSlack, action: Any
) -> None:
    post = claim("lost")

    outcome = connector.send(post)
    assert isinstance(outcome, Delivered)
    fake.script("chat.postMessage", action)
    outcome = connector.send(claim("lost-2"))

    assert isinstance(outcome, MaybeSent)
    assert outcome.reason.startswith("chat.postMessage: reply lost (")
    # slack-sdk did not send it again on its own: Slack got it once, and has it once.
    assert [c["metadata"]["event_payload"]["post_id"] for c in fake.calls_of("chat.postMessage")] == [
        "lost",
        "lost-2",
    ]
    assert len(fake.messages(CHANNEL)) == 2
    # ... which is why the outbox looks it up before sending again.
    [stored] = [m for m in fake.messages(CHANNEL) if m.metadata == ours("lost-2")]
    assert connector.find_sent(claim("lost-2", stale=True)) == f"{CHANNEL}:{stored.ts}"


def test_slack_sdk_default_would_post_twice(fake: FakeSlack) -> None:
    # Why retry_handlers=[]: the SDK's default ConnectionErrorRetryHandler re-sends a request
    # whose reply was lost, and the fake (like Slack) had already posted it.
    fake.script("chat.postMessage", drop())
    client = WebClient(token=TOKEN, base_url=fake.base_url, timeout=2)

    client.chat_postMessage(channel=CHANNEL, text="twice")

    assert len(fake.calls_of("chat.postMessage")) == 2
    assert [m.text for m in fake.messages(CHANNEL)] == ["twice", "twice"]


def test_reply_slower_than_the_timeout_on_create(fake: FakeSlack) -> None:
    connector = SlackConnector(source="slack", token=TOKEN, base_url=fake.base_url, timeout=0.3)
    fake.script("chat.postMessage", delay(5))

    outcome = connector.send(claim("slow"))

    assert outcome == MaybeSent("chat.postMessage: reply lost (TimeoutError: timed out)")
    assert len(fake.calls_of("chat.postMessage")) == 1


@pytest.mark.parametrize("method", ["chat.update", "reactions.add", "chat.delete"])
@pytest.mark.parametrize("action", [drop(), delay(5)], ids=["dropped", "slow"])
def test_lost_reply_on_an_idempotent_call_is_retried(fake: FakeSlack, method: str, action: Any) -> None:
    connector = SlackConnector(source="slack", token=TOKEN, base_url=fake.base_url, timeout=0.3)

    outcome = _send_failing(connector, fake, method, action)

    assert isinstance(outcome, RetryLater)
    assert outcome.reason.startswith(f"{method}: reply lost (")
    assert len(fake.calls_of(method)) == 1


def test_connection_refused_was_not_sent() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    connector = SlackConnector(
        source="slack", token=TOKEN, base_url=f"http://127.0.0.1:{port}/api/", timeout=2
    )

    outcome = connector.send(claim())

    assert isinstance(outcome, RetryLater)
    assert (
        outcome.reason
        == "chat.postMessage: request not sent (ConnectionRefusedError: [Errno 111] Connection refused)"
    )


# -- secrets


def test_the_token_never_shows(fake: FakeSlack, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    good = SlackConnector(source="slack", token=TOKEN, base_url=fake.base_url, timeout=0.3)
    wrong = SlackConnector(source="slack", token=TOKEN + "-old", base_url=fake.base_url, timeout=0.3)
    fake.script("chat.postMessage", ratelimit("3"), html(500), drop(), delay(5))
    fake.script("conversations.history", error("missing_scope"))

    outcomes: list[object] = [good.send(claim()) for _ in range(4)]
    outcomes.append(wrong.send(claim()))
    with pytest.raises(CheckLater) as lookup:
        good.find_sent(claim(stale=True))
    outcomes.append(lookup.value)

    assert [type(o).__name__ for o in outcomes] == [
        "RateLimited",
        "MaybeSent",
        "MaybeSent",
        "MaybeSent",
        "Refused",
        "CheckLater",
    ]
    assert outcomes[4] == Refused("slack error invalid_auth on chat.postMessage")
    assert caplog.records, "slack-sdk logs its requests at DEBUG; they are part of the test"
    for outcome in outcomes:
        assert "SECRET" not in str(outcome) and "SECRET" not in repr(outcome)
    assert "SECRET" not in caplog.text
    assert "SECRET" not in repr(good)
    # Nor does the fake keep it.
    assert "SECRET" not in str(fake.state())


# -- lookups


def test_find_sent_found(connector: SlackConnector, fake: FakeSlack) -> None:
    fake.add_message(CHANNEL, "noise")
    ts = ref_ts(connector.send(claim("p1")))
    connector.send(claim("p2"))

    sent = claim("p1", stale=True)
    assert connector.find_sent(sent) == f"{CHANNEL}:{ts}"
    [args] = fake.calls_of("conversations.history")
    assert args.keys() == {"channel", "oldest", "latest", "inclusive", "include_all_metadata", "limit"}
    assert (args["channel"], args["inclusive"], args["include_all_metadata"], args["limit"]) == (
        CHANNEL,
        "1",
        "1",
        "15",  # a non-Marketplace app's page, by default
    )
    # Up to the send's timeout (2 s) and Slack's clock skew after the claim: one page's window.
    assert float(args["latest"]) == pytest.approx(
        (sent.sent_at + timedelta(seconds=62)).timestamp(), abs=1e-6
    )


def test_find_sent_not_found(connector: SlackConnector, fake: FakeSlack) -> None:
    connector.send(claim("p2"))
    fake.add_message(CHANNEL, "noise")

    assert connector.find_sent(claim("p1", stale=True)) is None


def test_find_sent_looks_from_a_minute_before_sent_at(connector: SlackConnector, fake: FakeSlack) -> None:
    connector.send(claim("p1"))
    sent_at = datetime.now(UTC) + timedelta(minutes=5)

    # Posted more than the skew before this claim's first send: not this claim's post.
    assert connector.find_sent(claim("p1", stale=True, sent_at=sent_at)) is None
    [args] = fake.calls_of("conversations.history")
    assert float(args["oldest"]) == pytest.approx((sent_at - timedelta(seconds=60)).timestamp(), abs=1e-6)


def test_find_sent_reads_every_page(marketplace: SlackConnector, fake: FakeSlack) -> None:
    ts = ref_ts(marketplace.send(claim("p1")))
    for i in range(450):  # newer than ours: history is newest first, ours is on page three
        fake.add_message(CHANNEL, f"chatter {i}")

    assert marketplace.find_sent(claim("p1", stale=True)) == f"{CHANNEL}:{ts}"

    pages = fake.calls_of("conversations.history")
    assert len(pages) == 3
    assert "cursor" not in pages[0]
    assert pages[1]["cursor"] and pages[2]["cursor"] and pages[1]["cursor"] != pages[2]["cursor"]


def test_find_sent_not_found_after_every_page(marketplace: SlackConnector, fake: FakeSlack) -> None:
    for i in range(250):
        fake.add_message(CHANNEL, f"chatter {i}")

    assert marketplace.find_sent(claim("p1", stale=True)) is None
    assert len(fake.calls_of("conversations.history")) == 2


def test_find_sent_in_a_thread(connector: SlackConnector, fake: FakeSlack) -> None:
    parent = fake.add_message(CHANNEL, "a question")
    fake.add_message(CHANNEL, "me too", thread_ts=parent)
    ts = ref_ts(connector.send(claim("reply:1", thread_id=parent)))

    assert connector.find_sent(claim("reply:1", thread_id=parent, stale=True)) == f"{CHANNEL}:{ts}"
    assert connector.find_sent(claim("reply:2", thread_id=parent, stale=True)) is None
    [args, _] = fake.calls_of("conversations.replies")
    assert (args["channel"], args["ts"], args["include_all_metadata"], args["limit"]) == (
        CHANNEL,
        parent,
        "1",
        "15",
    )
    # conversations.history lists parents only: a reply is not found there.
    assert connector.find_sent(claim("reply:1", stale=True)) is None


def test_find_sent_of_a_status_without_ref_looks_it_up(connector: SlackConnector, fake: FakeSlack) -> None:
    ts = ref_ts(connector.send(claim("status:1", kind="status")))

    assert connector.find_sent(claim("status:1", kind="status", stale=True)) == f"{CHANNEL}:{ts}"
    # With a ref there is nothing to look up (the sender does not ask, but the answer is sane).
    ref = f"{CHANNEL}:{ts}"
    assert connector.find_sent(claim("status:1", kind="status", message_ref=ref, stale=True)) == ref
    assert len(fake.calls_of("conversations.history")) == 1


def test_find_sent_of_a_reaction_sends_again(connector: SlackConnector, fake: FakeSlack) -> None:
    # Adding a reaction twice is harmless (already_reacted -> delivered): no lookup needed.
    assert connector.find_sent(claim(kind="reaction", body={"name": "eyes", "timestamp": "1.2"})) is None
    assert fake.calls == []


def test_find_sent_of_an_ephemeral_cannot_check(connector: SlackConnector, fake: FakeSlack) -> None:
    with pytest.raises(CannotCheck):
        connector.find_sent(claim(kind="ephemeral", body={"user": "U0PERSON1", "text": "psst"}))
    assert fake.calls == []


@pytest.mark.parametrize(
    ("action", "reason"),
    [
        (ratelimit("30"), "slack error ratelimited on conversations.history (HTTP 429, Retry-After 30)"),
        (error("missing_scope"), "slack error missing_scope on conversations.history"),
        (error("channel_not_found"), "slack error channel_not_found on conversations.history"),
        (html(502), "conversations.history: HTTP 502 without a Slack answer"),
    ],
)
def test_find_sent_failure_is_check_later(
    connector: SlackConnector, fake: FakeSlack, action: Any, reason: str
) -> None:
    fake.script("conversations.history", action)

    with pytest.raises(
        CheckLater, match=rf"^lookup failed: {reason.replace('(', '[(]').replace(')', '[)]')}$"
    ):
        connector.find_sent(claim(stale=True))


def test_find_sent_transport_failure_is_check_later(fake: FakeSlack) -> None:
    connector = SlackConnector(source="slack", token=TOKEN, base_url=fake.base_url, timeout=0.3)
    fake.script("conversations.replies", delay(5))

    with pytest.raises(CheckLater, match="reply lost"):
        connector.find_sent(claim(stale=True, thread_id="1700000000.000100"))


def test_find_sent_failing_on_a_later_page_is_not_not_found(
    marketplace: SlackConnector, fake: FakeSlack
) -> None:
    for i in range(250):
        fake.add_message(CHANNEL, f"chatter {i}")
    fake.script("conversations.history", ok(), ratelimit("30"))

    with pytest.raises(CheckLater, match="ratelimited"):
        marketplace.find_sent(claim(stale=True))
    assert len(fake.calls_of("conversations.history")) == 2


# -- the fake itself is faithful where the connector depends on it


def test_fake_returns_metadata_only_when_asked(connector: SlackConnector, fake: FakeSlack) -> None:
    connector.send(claim("p1"))
    client = WebClient(token=TOKEN, base_url=fake.base_url, retry_handlers=[])

    [plain] = client.conversations_history(channel=CHANNEL)["messages"]
    [full] = client.conversations_history(channel=CHANNEL, include_all_metadata=True)["messages"]

    assert "metadata" not in plain
    assert full["metadata"] == ours("p1")


def test_fake_checks_the_token(fake: FakeSlack) -> None:
    from slack_sdk.errors import SlackApiError

    with pytest.raises(SlackApiError) as failure:
        WebClient(token="xoxb-other", base_url=fake.base_url, retry_handlers=[]).chat_postMessage(
            channel=CHANNEL, text="x"
        )
    assert failure.value.response["error"] == "invalid_auth"
    assert fake.messages(CHANNEL) == []


# -- tokens that are not header text (issue 9, hole 13)


def test_a_token_read_from_a_file_with_its_newline_is_stripped_and_works(fake: FakeSlack) -> None:
    connector = SlackConnector(source="slack", token=f" {TOKEN}\n", base_url=fake.base_url, timeout=2)
    assert connector.check() == []
    assert isinstance(connector.send(claim()), Delivered)


@pytest.mark.parametrize(
    "token", [TOKEN + "é", "xoxb-SECRET 4242", "xoxb-SECRET\x004242", "xoxb-SECRET\r4242"]
)
def test_a_token_that_cannot_be_sent_in_a_header_is_a_check_error(token: str) -> None:
    assert SlackConnector(source="slack", token=token).check() == [
        checks.Error(
            "Connector outbox source 'slack': the Slack OPTIONS['token'] must be printable ASCII without "
            "spaces; this one cannot be sent in an HTTP header.",
            id="connector_outbox.E101",
        )
    ]


@pytest.mark.parametrize(
    "token",
    ["xoxb-SECRET\r4242", "xoxb-SECRET\n4242", "xoxb-SECRET\x004242", "xoxb-SECRÉT"],
    ids=["return", "newline", "nul", "non-ascii"],
)
def test_a_request_that_cannot_be_sent_is_retried_never_a_lost_reply_and_never_shows_the_token(
    fake: FakeSlack, caplog: pytest.LogCaptureFixture, token: str
) -> None:
    caplog.set_level(logging.DEBUG)
    connector = SlackConnector(source="slack", token=token, base_url=fake.base_url, timeout=2)
    outcome = connector.send(claim())
    assert outcome == RetryLater(
        "chat.postMessage: request not sent (the token cannot be sent in an HTTP header)"
    )
    assert fake.calls == []
    assert "SECRET" not in caplog.text
