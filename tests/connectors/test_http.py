"""scrub: the one helper that keeps the connectors' secrets out of reasons and log lines."""

from __future__ import annotations

import pytest
from django.core import checks

from django_connector_outbox.connectors.http import HttpConnector
from django_connector_outbox.connectors.text import scrub

TOKEN = "MTIz.secret-bot-token"


@pytest.mark.parametrize(
    ("text", "secrets", "scrubbed"),
    [
        (f"401 for Bot {TOKEN}", [TOKEN], "401 for Bot ***"),
        # As h11 and http.client quote a header value: a Python repr of its bytes.
        (f"Illegal header value b'Bot {TOKEN}\\n'", [TOKEN + "\n"], "Illegal header value b'Bot ***'"),
        ("can't encode b'tok\\xc3\\xa9n-secret-value'", ["tokén-secret-value"], "can't encode b'***'"),
        # A receiver echoes the token of "Authorization: Bearer <token>" without its scheme.
        (f"bad token {TOKEN}", [f"Bearer {TOKEN}"], "bad token ***"),
        ("Bearer is a word, and so is short", ["Bearer short"], "Bearer is a word, and so is short"),
        ("nothing to hide", [None, "", 5], "nothing to hide"),
    ],
    ids=["whole", "repr", "bytes-repr", "word", "short-words", "not-secrets"],
)
def test_scrub_replaces_every_form_of_a_secret(text, secrets, scrubbed):
    assert scrub(text, secrets) == scrubbed


HOOK = "https://hooks.example.com/services/T0123ABCD/B0123ABCD/hK3rT9wQ2mZ8vB5nL1pY7cD4"


@pytest.mark.parametrize(
    ("text", "secrets", "scrubbed"),
    [
        # A receiver echoes the path it was asked for: the whole of it goes.
        ("no hook at /services/T0123ABCD/B0123ABCD/hK3rT9wQ2mZ8vB5nL1pY7cD4", [HOOK], "no hook at ***"),
        # Or the token alone, or a tail of the path: each part that looks like a token goes.
        ("token hK3rT9wQ2mZ8vB5nL1pY7cD4 revoked", [HOOK], "token *** revoked"),
        ("no hook B0123ABCD/hK3rT9wQ2mZ8vB5nL1pY7cD4", [HOOK], "no hook ***/***"),
        # The words of the path that are no token, and the host, stay: they say where it went.
        ("hooks.example.com: no services here", [HOOK], "hooks.example.com: no services here"),
        # Every query value, with or without its name, and the password of the user info.
        (
            "sig=Zx9Lp2Qr was refused",
            ["https://h.example/run?api-version=1&sig=Zx9Lp2Qr"],
            "sig=*** was refused",
        ),
        ("login hunter22 refused", ["https://bot:hunter22@h.example/hook"], "login *** refused"),
        # Percent-encoded in the URL, echoed decoded.
        ("no hook at /h/tok en/ab12cd34ef", ["https://h.example/h/tok%20en/ab12cd34ef"], "no hook at ***"),
    ],
    ids=["path", "token", "tail", "not-tokens", "query", "password", "decoded"],
)
def test_scrub_replaces_every_part_of_a_url_that_holds_a_secret(text, secrets, scrubbed):
    assert scrub(text, secrets) == scrubbed


# -- shared OPTION checks -----------------------------------------------------------------


def http_connector() -> HttpConnector:
    return HttpConnector(source="src")


@pytest.mark.parametrize("url", ["https://chat.example.com", "http://127.0.0.1:8080/api"])
def test_an_http_url_with_a_host_passes_the_check(url):
    assert http_connector().check_http_url("url", url, "connector_outbox.E999") == []


@pytest.mark.parametrize("url", [None, "", "https://", "chat.example.com", "ftp://chat.example.com"])
def test_an_option_that_is_not_an_http_url_with_a_host_is_an_error_that_shows_it(url):
    assert http_connector().check_http_url("base_url", url, "connector_outbox.E999") == [
        checks.Error(
            f"CONNECTOR_OUTBOX source 'src': OPTIONS['base_url'] must be an http(s) URL, not {url!r}.",
            id="connector_outbox.E999",
        )
    ]


def test_a_secret_url_is_not_shown_in_its_error():
    assert http_connector().check_http_url(
        "url", "hooks.example.com/T0KEN", "connector_outbox.E999", needs="it needs a URL", secret=True
    ) == [checks.Error("CONNECTOR_OUTBOX source 'src': it needs a URL.", id="connector_outbox.E999")]


@pytest.mark.parametrize("token", [None, ""])
def test_a_missing_token_is_an_error_that_says_what_it_should_be(token):
    assert http_connector().check_header_token(
        "token", token, "connector_outbox.E999", missing="it needs a token", hint="Get one."
    ) == [
        checks.Error(
            "CONNECTOR_OUTBOX source 'src': it needs a token.", hint="Get one.", id="connector_outbox.E999"
        )
    ]


@pytest.mark.parametrize("token", ["two words", "tokén", "tok\nen"])
def test_a_token_that_cannot_be_a_header_word_is_an_error_that_does_not_show_it(token):
    [error] = http_connector().check_header_token("token", token, "connector_outbox.E999", missing="")

    assert error.msg == (
        "CONNECTOR_OUTBOX source 'src': OPTIONS['token'] must be printable ASCII without spaces; "
        "this one cannot be sent in an HTTP header."
    )
    assert token not in error.msg


def test_a_header_token_passes_the_check():
    assert (
        http_connector().check_header_token("token", "abc.DEF-123", "connector_outbox.E999", missing="") == []
    )
