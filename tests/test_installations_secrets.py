"""Credentials at rest: sealed with SECRET_KEYS (or a key derived from SECRET_KEY), and never
shown: not in a database dump, a log line (the SQL log included), an exception or a check."""

from __future__ import annotations

import io
import logging
from datetime import timedelta

import pytest
from cryptography.fernet import Fernet
from django.core import checks
from django.core.management import call_command
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_connector_outbox.conf import conf
from django_connector_outbox.installations import (
    Destinations,
    Installations,
    NotInstalled,
    RefreshFailed,
    Renewal,
)
from django_connector_outbox.installations.sealing import CannotOpen, open_sealed, reseal, seal
from django_connector_outbox.models import Installation

KEY1, KEY2, KEY3 = (Fernet.generate_key().decode() for _ in range(3))
MEMORY = {"BACKEND": "django_connector_outbox.connectors.memory.MemoryConnector"}
TOKEN = "xoxb-secret-bot-token-1234"
REFRESH = "xoxe-secret-refresh-5678"
NEW_TOKEN = "xoxb-secret-refreshed-token-9012"
NEW_REFRESH = "xoxe-secret-refreshed-3456"
HOOK = "https://hooks.example.com/services/T1/B1/secretHookPathToken42"
SIGNING = "whsec-secret-signing-7890"
SECRETS = (TOKEN, REFRESH, NEW_TOKEN, NEW_REFRESH, HOOK, "secretHookPathToken42", SIGNING)


def keys(*secret_keys: str) -> override_settings:
    return override_settings(
        CONNECTOR_OUTBOX={"CONNECTORS": {"memory": MEMORY}, "SECRET_KEYS": list(secret_keys)}
    )


def assert_no_secret(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, secret


# -- sealing ------------------------------------------------------------------------------


def test_a_sealed_value_opens_as_it_was_and_shows_nothing_of_it():
    secrets = {"bot_token": TOKEN, "url": HOOK, "text": "é\n\x00"}
    with keys(KEY1):
        sealed = seal(secrets)
        assert open_sealed(sealed, what="x") == secrets
        assert open_sealed("", what="x") == {}
    assert_no_secret(sealed)


def test_the_first_key_seals_and_every_key_opens():
    with keys(KEY1):
        by_key1 = seal({"bot_token": TOKEN})
    with keys(KEY2, KEY1):
        by_key2 = seal({"bot_token": TOKEN})
        assert open_sealed(by_key1, what="x") == open_sealed(by_key2, what="x") == {"bot_token": TOKEN}
        moved = reseal(by_key1)
    with keys(KEY2):
        assert open_sealed(by_key2, what="x") == open_sealed(moved, what="x") == {"bot_token": TOKEN}
        with pytest.raises(CannotOpen):
            open_sealed(by_key1, what="x")


def test_without_secret_keys_the_key_is_derived_from_secret_key_and_its_fallbacks_still_open():
    with override_settings(SECRET_KEY="old-django-secret-key"):
        sealed = seal({"bot_token": TOKEN})
    with override_settings(
        SECRET_KEY="new-django-secret-key", SECRET_KEY_FALLBACKS=["old-django-secret-key"]
    ):
        assert open_sealed(sealed, what="x") == {"bot_token": TOKEN}
        resealed = reseal(sealed)
    with override_settings(SECRET_KEY="new-django-secret-key", SECRET_KEY_FALLBACKS=[]):
        assert open_sealed(resealed, what="x") == {"bot_token": TOKEN}
        with pytest.raises(CannotOpen):
            open_sealed(sealed, what="x")
    with override_settings(SECRET_KEY="old-django-secret-key"), keys(KEY1), pytest.raises(CannotOpen):
        open_sealed(sealed, what="x")  # SECRET_KEYS replace the derived key


def test_a_wrong_key_raises_cannot_open_naming_the_row_without_its_secret():
    with keys(KEY1):
        sealed = seal({"bot_token": TOKEN, "url": HOOK})
    with keys(KEY2), pytest.raises(CannotOpen) as failed:
        open_sealed(sealed, what="the installation slack:T1")
    assert str(failed.value) == (
        "the credentials of the installation slack:T1 were sealed with a key that is not in "
        "SECRET_KEYS (nor derived from SECRET_KEY or its fallbacks)"
    )
    assert failed.value.__cause__ is None and failed.value.__context__ is not None
    assert_no_secret(repr(failed.value))
    with keys(KEY2), pytest.raises(CannotOpen) as resealing:
        reseal(sealed)
    assert_no_secret(str(resealing.value))


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (KEY1, "CONNECTOR_OUTBOX['SECRET_KEYS'] must be None or a non-empty list of keys, not a str."),
        ([], "CONNECTOR_OUTBOX['SECRET_KEYS'] must be None or a non-empty list of keys, not an empty list."),
        ({"k": KEY1}, "CONNECTOR_OUTBOX['SECRET_KEYS'] must be None or a non-empty list of keys, not a dict."),
        ([KEY1, "not-a-fernet-key-secret-value"], "CONNECTOR_OUTBOX['SECRET_KEYS'][1] is not a Fernet key (url-safe base64 of 32 bytes)."),
        ([KEY1[:-4]], "CONNECTOR_OUTBOX['SECRET_KEYS'][0] is not a Fernet key (url-safe base64 of 32 bytes)."),
        ([7], "CONNECTOR_OUTBOX['SECRET_KEYS'][0] is not a Fernet key (url-safe base64 of 32 bytes)."),
    ],
    ids=["a-string", "empty", "a-dict", "not-base64", "short", "not-text"],
)  # fmt: skip
def test_bad_secret_keys_are_error_e012_without_the_key(value, message):
    hint = (
        'Make one with: python -c "from cryptography.fernet import Fernet; '
        'print(Fernet.generate_key().decode())"'
    )
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"memory": MEMORY}, "SECRET_KEYS": value}):
        found = [m for m in checks.run_checks(databases=[]) if (m.id or "").startswith("connector_outbox.")]
        assert found == [checks.Error(message, hint=hint, id="connector_outbox.E012")]
        with pytest.raises(Exception, match="E012|Fernet key|list of keys"):
            _ = conf.SECRET_KEYS
    shown = found[0].msg + (found[0].hint or "")
    assert "not-a-fernet-key" not in shown and KEY1 not in shown and KEY1[:-4] not in shown


def test_secret_keys_may_be_bytes_as_fernet_generates_them():
    with override_settings(
        CONNECTOR_OUTBOX={"CONNECTORS": {"memory": MEMORY}, "SECRET_KEYS": [KEY3.encode()]}
    ):
        assert conf.SECRET_KEYS == (KEY3,)
        assert open_sealed(seal({"a": "b"}), what="x") == {"a": "b"}


# -- nothing shows a secret ---------------------------------------------------------------


def store_and_use() -> list[str]:
    """An installation with a rotating token (saved, refreshed once, its refresh failing once),
    another revoked, and a destination with a signing secret."""
    with keys(KEY1):
        slack = Installations("memory")
        slack.save(
            "T1",
            secrets={"bot_token": TOKEN, "bot_refresh_token": REFRESH},
            token_expires_at=timezone.now() + timedelta(minutes=1),
        )
        slack.save("T2", secrets={"bot_token": TOKEN + "-T2"})
        used = slack.credentials("T1")
        assert used.token == TOKEN

        def failing(credentials):
            raise RefreshFailed("slack error invalid_refresh_token")

        with pytest.raises(RefreshFailed):
            slack.refresh(used, failing, force=True)
        renewed = slack.refresh(used, lambda c: Renewal(NEW_TOKEN, NEW_REFRESH, None), force=True)
        assert renewed.token == NEW_TOKEN
        assert slack.revoke("T2", "token_revoked", token=TOKEN + "-T2")
        with pytest.raises(NotInstalled) as revoked:
            slack.credentials("T2")
        hooks = Destinations("hooks")
        hooks.set("C1", HOOK, workspace_id="T1", secret=SIGNING)
        assert hooks.target("C1").url == HOOK
        return [str(revoked.value), repr(used), repr(renewed), repr(hooks.target("C1"))]


@pytest.fixture
def stored(db):
    return store_and_use()


def test_a_database_dump_holds_no_token_url_or_secret(stored):
    with keys(KEY1):
        out = io.StringIO()
        call_command("dumpdata", "django_connector_outbox", stdout=out)
    dump = out.getvalue()
    assert '"model": "django_connector_outbox.installation"' in dump
    assert '"model": "django_connector_outbox.destination"' in dump
    assert_no_secret(dump)


def test_no_log_line_exception_or_repr_shows_a_secret(db, caplog):
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="django")  # Django's logging sets it to INFO
    # The SQL log too (force_debug_cursor): the parameters hold the sealed values only.
    with CaptureQueriesContext(connection) as queries:
        shown = store_and_use()
    assert any(r.name == "django.db.backends" for r in caplog.records)
    assert len(queries.captured_queries) > 10
    for text in (caplog.text, *(r.getMessage() for r in caplog.records), *shown):
        assert_no_secret(text)


def test_installation_rows_hold_only_sealed_secrets(stored):
    for row in Installation.objects.all():
        assert_no_secret(str(row.__dict__))
