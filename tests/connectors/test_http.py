"""scrub: the one helper that keeps the connectors' secrets out of reasons and log lines."""

from __future__ import annotations

import pytest

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
