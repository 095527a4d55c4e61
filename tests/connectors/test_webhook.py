"""The webhook connector against the fake receiver, over real sockets (no database). The tests
that take `hook` or `form` run through both forms: the blocking methods and the coroutines."""

from __future__ import annotations

import base64
import logging
import socket
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import pytest

from django_connector_outbox.connectors import (
    CannotCheck,
    CheckLater,
    Delivered,
    MaybeSent,
    RateLimited,
    Refused,
    RetryLater,
)
from django_connector_outbox.connectors.webhook import WebhookConnector, sign
from django_connector_outbox.fakes import webhook as fw
from django_connector_outbox.posts import ClaimedPost
from tests.connectors.helpers import claimed_post, in_form

SECRET = "s3cret-signing-key-do-not-log"
WHSEC = "whsec_" + base64.b64encode(b"sixteen byte key").decode()
AUTH = "Bearer receiver-token-do-not-log"


@pytest.fixture
def fake() -> Iterator[fw.FakeWebhook]:
    with fw.running(secret=SECRET) as server:
        yield server


def connect(fake: fw.FakeWebhook, **options: Any) -> WebhookConnector:
    options.setdefault("url", fake.url)
    options.setdefault("secret", SECRET)
    options.setdefault("timeout", 1)
    return WebhookConnector(source="hook", **options)


@pytest.fixture
def hook(fake: fw.FakeWebhook, form: str) -> Iterator[WebhookConnector]:
    connector = in_form(form, connect(fake, lookup_url=fake.lookup_url, headers={"Authorization": AUTH}))
    yield connector
    connector.close()


def post(
    kind: str = "message",
    body: dict[str, Any] | None = None,
    *,
    post_id: str = "post-1",
    rev: int = 0,
    ref: str | None = None,
) -> ClaimedPost:
    return claimed_post(
        "hook",
        post_id,
        {"text": "hello", "n": 1} if body is None else body,
        kind=kind,
        workspace_id="w",
        container_id="c",
        rev=rev,
        message_ref=ref,
    )


# -- delivery ------------------------------------------------------------------------


def test_message_is_posted_signed_with_idempotency_headers(fake, hook):
    outcome = hook.send(post(body={"text": "héllo", "n": 1}))

    assert outcome == Delivered("d-1")
    [delivery] = fake.deliveries
    assert delivery.body == {"text": "héllo", "n": 1}
    [call] = fake.calls_of("deliver")
    assert call.method == "POST"
    assert call.headers["content-type"] == "application/json"
    assert call.headers["idempotency-key"] == '"post-1"'
    assert call.headers["webhook-id"] == "post-1"
    assert call.headers["x-outbox-post-id"] == "post-1"
    assert call.headers["x-outbox-kind"] == "message"
    assert call.headers["x-outbox-rev"] == "0"
    assert call.headers["authorization"] == AUTH
    assert call.headers["webhook-signature"].startswith("v1,")
    assert fake.verify(call.headers, call.body, SECRET)


def test_the_signature_follows_standard_webhooks():
    # The example of the Standard Webhooks spec's reference libraries.
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    payload = b'{"test": 2432232314}'
    assert sign(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", payload) == (
        "g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    )


def test_whsec_secrets_are_base64_decoded(fake):
    with fw.running(secret=WHSEC) as receiver:
        connector = connect(receiver, secret=WHSEC)
        try:
            assert connector.send(post()) == Delivered("d-1")
        finally:
            connector.close()


def test_a_wrong_secret_is_refused_without_showing_it(fake):
    connector = connect(fake, secret="not-the-secret")
    try:
        outcome = connector.send(post())
    finally:
        connector.close()
    assert outcome == Refused("webhook HTTP 401 invalid_signature webhook signature does not match")
    assert fake.deliveries == []


def test_unsigned_when_no_secret(fake):
    with fw.running() as receiver:
        connector = connect(receiver, secret=None)
        try:
            assert connector.send(post()) == Delivered("d-1")
        finally:
            connector.close()
        [call] = receiver.calls_of("deliver")
        assert "webhook-signature" not in call.headers
        assert "webhook-timestamp" not in call.headers


def test_delivered_without_an_id(fake):
    with fw.running(reply_with_id=False) as receiver:
        connector = connect(receiver, secret=None)
        try:
            assert connector.send(post()) == Delivered(None)
        finally:
            connector.close()


def test_a_resend_is_deduplicated_by_the_receiver(fake, hook):
    first = hook.send(post())
    second = hook.send(post())

    assert first == second == Delivered("d-1")
    assert len(fake.deliveries) == 1
    assert len(fake.calls_of("deliver")) == 2


def test_status_revisions_get_their_own_keys(fake, hook):
    assert hook.send(post("status", {"state": "building"}, post_id="deploy")) == Delivered("d-1")
    assert hook.send(post("status", {"state": "done"}, post_id="deploy", rev=1, ref="d-1")) == Delivered(
        "d-2"
    )
    assert hook.send(post("status", {"state": "done"}, post_id="deploy", rev=1, ref="d-1")) == Delivered(
        "d-2"
    )

    assert [(d.kind, d.rev, d.key, d.body["state"]) for d in fake.deliveries] == [
        ("status", "0", "deploy:0", "building"),
        ("status", "1", "deploy:1", "done"),
    ]
    first, second, _ = fake.calls_of("deliver")
    assert "x-outbox-message-ref" not in first.headers
    assert second.headers["x-outbox-message-ref"] == "d-1"
    assert second.headers["webhook-id"] == "deploy:1"


def test_awkward_post_ids_make_valid_headers(fake, hook):
    assert hook.send(post(post_id='say "hi" \\ there')) == Delivered("d-1")
    assert hook.send(post(post_id="café-☕")) == Delivered("d-2")

    assert [d.key for d in fake.deliveries] == ['say "hi" \\ there', "caf%C3%A9-%E2%98%95"]
    assert fake.calls_of("deliver")[0].headers["idempotency-key"] == '"say \\"hi\\" \\\\ there"'


# -- answers -------------------------------------------------------------------------


def _in(seconds: float) -> str:
    return format_datetime(datetime.now(UTC) + timedelta(seconds=seconds), usegmt=True)


@pytest.mark.parametrize(
    ("action", "expected"),
    [
        (fw.respond(429, Retry_After="7"), RateLimited(7.0, "webhook HTTP 429")),
        (fw.respond(429), RateLimited(30.0, "webhook HTTP 429")),
        (
            fw.respond(503, {"error": "maintenance"}, Retry_After="120"),
            RateLimited(120.0, "webhook HTTP 503 maintenance"),
        ),
        (fw.respond(503), RetryLater("webhook HTTP 503")),
        (fw.respond(500, {"message": "boom"}), RetryLater("webhook HTTP 500 boom")),
        (fw.respond(502), RetryLater("webhook HTTP 502")),
        (fw.respond(504, Retry_After="3"), RetryLater("webhook HTTP 504", 3.0)),
        (fw.respond(408), RetryLater("webhook HTTP 408")),
        (fw.respond(409, {"error": "in_progress"}), RetryLater("webhook HTTP 409 in_progress")),
        (fw.respond(425), RetryLater("webhook HTTP 425")),
        (fw.respond(301, Location="http://127.0.0.1:1/elsewhere"), Refused("webhook HTTP 301")),
        (fw.respond(307), Refused("webhook HTTP 307")),
        (fw.respond(400, {"error": "bad_payload", "code": 42}), Refused("webhook HTTP 400 42 bad_payload")),
        (fw.respond(403), Refused("webhook HTTP 403")),
        (fw.respond(404), Refused("webhook HTTP 404")),
        (fw.respond(410, {"error": "gone"}), Refused("webhook HTTP 410 gone")),
        (fw.respond(413), Refused("webhook HTTP 413")),
        (fw.respond(422), Refused("webhook HTTP 422")),
        (fw.respond(201, {"id": 77}), Delivered("77")),
        (fw.respond(202), Delivered(None)),
    ],
)
def test_status_codes(fake, hook, action, expected):
    fake.script("deliver", action)

    assert hook.send(post()) == expected


def test_429_with_an_http_date(fake, hook):
    fake.script("deliver", fw.respond(429, Retry_After=_in(90)))

    outcome = hook.send(post())

    assert isinstance(outcome, RateLimited)
    assert 85 <= outcome.after <= 90


def test_redirects_are_not_followed(fake, hook):
    fake.script("deliver", fw.respond(308, Location=fake.url))

    assert hook.send(post()) == Refused("webhook HTTP 308")
    assert len(fake.calls_of("deliver")) == 1


def test_key_reused_with_another_body_is_refused(fake, hook):
    hook.send(post(body={"v": 1}))

    assert hook.send(post(body={"v": 2})) == Refused(
        "webhook HTTP 422 idempotency_key_reused key reused with another payload"
    )


@pytest.mark.parametrize("action", [fw.drop(), fw.reset(), fw.delay(3)])
def test_lost_reply_may_be_sent(fake, hook, action):
    fake.script("deliver", action)

    outcome = hook.send(post())

    assert isinstance(outcome, MaybeSent)
    assert len(fake.deliveries) == 1
    assert hook.find_sent(post()) == "d-1"  # and the lookup finds it


def test_connect_failure_is_a_retry(form):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    connector = in_form(
        form, WebhookConnector(source="hook", url=f"http://127.0.0.1:{port}/hook", secret=SECRET)
    )
    try:
        outcome = connector.send(post())
    finally:
        connector.close()
    assert isinstance(outcome, RetryLater)
    assert outcome.reason.startswith("not sent: ConnectError")


# -- lookup --------------------------------------------------------------------------


def test_find_sent_cannot_check_without_a_lookup_url(fake):
    connector = connect(fake)
    with pytest.raises(CannotCheck):
        connector.find_sent(post())
    assert fake.calls == []


def test_find_sent_with_a_url_template(fake, hook):
    hook.send(post(post_id="a/b c"))

    assert hook.find_sent(post(post_id="a/b c")) == "d-1"
    assert hook.find_sent(post(post_id="never")) is None
    found, missing = fake.calls_of("lookup")
    assert found.path == "/lookup/a%2Fb%20c"
    assert found.headers["authorization"] == AUTH
    assert found.headers["x-outbox-post-id"] == "a/b c"


def test_find_sent_with_a_query_parameter(fake):
    connector = connect(fake, lookup_url=f"http://127.0.0.1:{fake.port}/lookup")
    try:
        connector.send(post(post_id="q&a"))
        assert connector.find_sent(post(post_id="q&a")) == "d-1"
        assert connector.find_sent(post(post_id="other")) is None
    finally:
        connector.close()
    assert [c.query for c in fake.calls_of("lookup")] == [{"post_id": "q&a"}, {"post_id": "other"}]


def test_find_sent_found_without_an_id_stands_for_the_post_id(fake, hook):
    fake.script("lookup", fw.respond(200, {"found": True}))

    assert hook.find_sent(post(post_id="p")) == "p"


@pytest.mark.parametrize(
    "action",
    [
        fw.respond(500),
        fw.respond(429, Retry_After="5"),
        fw.respond(401),
        fw.respond(302),
        fw.drop(),
        fw.delay(3),
    ],
)
def test_find_sent_failures_mean_check_later(fake, hook, action):
    fake.script("lookup", action)

    with pytest.raises(CheckLater):
        hook.find_sent(post())


# -- secrets and configuration -------------------------------------------------------


def test_secrets_never_show_in_reasons_or_logs(fake, caplog, form):
    caplog.set_level(logging.DEBUG)
    connector = in_form(
        form, connect(fake, secret=SECRET, headers={"Authorization": AUTH}, lookup_url=fake.lookup_url)
    )
    fake.script(
        "deliver",
        fw.respond(400, {"error": f"bad signature for key {SECRET}"}),
        fw.respond(500, {"message": SECRET, "detail": f"got {AUTH}"}),
        fw.drop(),
        fw.respond(401, {"error": "token_revoked", "message": f"token {AUTH.split()[1]} revoked"}),
        fw.respond(429),
    )
    fake.script("lookup", fw.respond(503, {"message": f"secret was {SECRET}"}))
    reasons = [getattr(connector.send(post(post_id=f"p{i}")), "reason", "") for i in range(5)]
    with pytest.raises(CheckLater) as excinfo:
        connector.find_sent(post())
    reasons.append(str(excinfo.value))
    wrong = in_form(form, connect(fake, secret="wrong-" + SECRET))
    reasons.append(getattr(wrong.send(post()), "reason", ""))
    wrong.close()
    connector.close()

    assert reasons[0] == "webhook HTTP 400 bad signature for key ***"
    # The bearer token without its scheme, as a receiver would echo it.
    assert reasons[3] == "webhook HTTP 401 token_revoked token *** revoked"
    assert all(SECRET not in r and "receiver-token" not in r for r in reasons), reasons
    assert SECRET not in caplog.text
    assert "receiver-token" not in caplog.text
    assert SECRET not in repr(connector)


# A hook whose URL carries its own token (in the path, as Slack's and Discord's do) and another
# in its query; the fake receiver knows no such hook and echoes the path in its error.
PATH_TOKEN = "hK3rT9wQ2mZ8vB5nL1pY7cD4"
QUERY_TOKEN = "q7Xv2LpR9sTw4MzK"


def test_no_part_of_a_url_with_a_token_shows_in_reasons_logs_or_exceptions(fake, caplog, form):
    caplog.set_level(logging.DEBUG)  # every logger, httpx's and httpcore's too
    base = f"http://127.0.0.1:{fake.port}"
    connector = in_form(
        form,
        connect(
            fake,
            url=f"{base}/services/T01/B01/{PATH_TOKEN}?token={QUERY_TOKEN}",
            lookup_url=f"{base}/lookup/{{post_id}}?token={QUERY_TOKEN}",
        ),
    )
    fake.script("lookup", fw.respond(503, {"message": f"token {QUERY_TOKEN} is suspended"}))
    try:
        outcome = connector.send(post())
        with pytest.raises(CheckLater) as lookup:
            connector.find_sent(post())
    finally:
        connector.close()

    assert isinstance(outcome, Refused)
    assert outcome.reason == "webhook HTTP 404 not_found no hook at ***"
    assert str(lookup.value) == "webhook lookup HTTP 503 token *** is suspended"
    assert any(r.name == "httpx" and r.levelno == logging.INFO for r in caplog.records)
    seen = [outcome.reason, str(lookup.value), repr(lookup.value), caplog.text]
    seen += [r.getMessage() for r in caplog.records]
    for text in seen:
        assert PATH_TOKEN not in text and QUERY_TOKEN not in text, text


def test_the_httpx_request_line_keeps_the_method_host_and_status_without_the_secret_path(fake, caplog, form):
    caplog.set_level(logging.INFO, logger="httpx")
    connector = in_form(
        form, connect(fake, url=f"http://127.0.0.1:{fake.port}/services/T01/B01/{PATH_TOKEN}")
    )
    try:
        connector.send(post())
    finally:
        connector.close()
    [line] = [r.getMessage() for r in caplog.records if r.name == "httpx"]
    assert line == f'HTTP Request: POST http://127.0.0.1:{fake.port}/*** "HTTP/1.1 404 Not Found"'


def test_check_passes_a_good_configuration():
    assert WebhookConnector(source="hook", url="https://example.com/hook").check() == []
    assert (
        WebhookConnector(
            source="hook",
            url="https://example.com/hook",
            secret=WHSEC,
            headers={"Authorization": "Bearer x"},
            timeout=15,
            lookup_url="https://example.com/posts/{post_id}",
        ).check()
        == []
    )


def test_check_reports_each_problem():
    def ids(**options: Any) -> list[tuple[str | None, str]]:
        options.setdefault("url", "https://example.com/hook")
        return [(m.id, m.msg) for m in WebhookConnector(source="hook", **options).check()]

    where = "CONNECTOR_OUTBOX source 'hook'"
    assert ids(url="") == [
        ("connector_outbox.E211", f"{where}: the webhook needs an http(s) URL in OPTIONS['url'].")
    ]
    assert ids(url=None)[0][0] == "connector_outbox.E216"  # neither url nor installations
    assert ids(url="ftp://example.com")[0][0] == "connector_outbox.E211"
    assert ids(secret="") == [
        ("connector_outbox.E212", f"{where}: OPTIONS['secret'] must be a non-empty string.")
    ]
    assert ids(secret="whsec_***") == [
        (
            "connector_outbox.E212",
            f"{where}: OPTIONS['secret'] starts with 'whsec_' but the rest is not base64.",
        )
    ]
    assert ids(headers=[("A", "b")]) == [
        (
            "connector_outbox.E213",
            f"{where}: OPTIONS['headers'] must be a dict of header names to string values.",
        )
    ]
    assert ids(headers={"X-N": 1})[0][0] == "connector_outbox.E213"
    assert ids(timeout=-1) == [
        (
            "connector_outbox.E214",
            f"{where}: OPTIONS['timeout'] must be a positive number of seconds (or a timedelta), not -1.",
        )
    ]
    assert ids(lookup_url="/lookup") == [
        ("connector_outbox.E215", f"{where}: OPTIONS['lookup_url'] must be an http(s) URL.")
    ]
    with pytest.raises(TypeError, match="signing_secret"):
        WebhookConnector(source="hook", url="https://example.com/hook", signing_secret="x")


def test_secret_is_not_in_the_check_messages():
    messages = WebhookConnector(source="hook", url=None, secret="whsec_!!" + SECRET).check()
    assert all(SECRET not in m.msg and SECRET not in (m.hint or "") for m in messages)


def test_timeout_and_kinds():
    assert WebhookConnector(source="h", url="https://x.example", timeout=3).timeout == 3.0
    assert WebhookConnector(source="h", url="https://x.example").kinds == {"message", "status"}


# -- header values and secrets that are not header text (issue 9, hole 13) --------------------


def test_a_header_value_read_from_a_file_with_its_newline_is_stripped_and_works(fake):
    connector = connect(fake, headers={"Authorization": AUTH + "\n"})
    assert connector.check() == []
    assert isinstance(connector.send(post()), Delivered)
    assert fake.calls_of("deliver")[0].headers["authorization"] == AUTH
    connector.close()


@pytest.mark.parametrize(
    "headers",
    [
        {"Authorization": "Bearer receiver-tökén"},
        {"Authorization": "Bearer a\x00b"},
        {"X Bad": "v"},
        {"X:Y": "v"},
    ],
    ids=["non-ascii", "nul", "space-in-name", "colon-in-name"],
)
def test_a_header_that_cannot_be_sent_is_a_check_error_that_does_not_show_its_value(headers):
    [name] = headers
    messages = WebhookConnector(source="hook", url="https://example.com/hook", headers=headers).check()
    assert [(m.id, m.msg) for m in messages] == [
        (
            "connector_outbox.E213",
            f"CONNECTOR_OUTBOX source 'hook': OPTIONS['headers'][{name!r}] must be a header name (a token) "
            "with a value of printable ASCII; this one cannot be sent.",
        )
    ]


def test_a_secret_with_surrounding_whitespace_is_a_check_error():
    messages = WebhookConnector(source="hook", url="https://example.com/hook", secret=SECRET + "\n").check()
    assert [(m.id, m.msg) for m in messages] == [
        (
            "connector_outbox.E212",
            "CONNECTOR_OUTBOX source 'hook': OPTIONS['secret'] starts or ends with whitespace (a newline read "
            "from a file?); it would be part of the signing key, so strip it.",
        )
    ]


@pytest.mark.parametrize("value", ["Bearer receiver-tökén-do-not-log", "Bearer receiver\x01token-do-not-log"])
def test_a_request_that_cannot_be_sent_is_retried_never_a_lost_reply_and_never_shows_the_header(
    fake, caplog, value, form
):
    caplog.set_level(logging.DEBUG)
    connector = in_form(form, connect(fake, headers={"Authorization": value}, lookup_url=fake.lookup_url))
    outcome = connector.send(post())
    with pytest.raises(CheckLater) as lookup:
        connector.find_sent(post())
    connector.close()
    assert type(outcome) is RetryLater
    assert fake.calls == []
    for text in (outcome.reason, str(lookup.value), caplog.text):
        assert "receiver" not in text and "do-not-log" not in text
