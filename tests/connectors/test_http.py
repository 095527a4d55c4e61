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
