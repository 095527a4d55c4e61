"""Credentials at rest: sealed with Fernet keys from SECRET_KEYS, never stored in the clear.

The first key seals, every key opens (MultiFernet), so a key is rotated by putting a new one
first, running `manage.py outbox_reencrypt` (which reseals every row with it), then dropping
the old one. Without SECRET_KEYS the key is derived from Django's SECRET_KEY (and the
SECRET_KEY_FALLBACKS still open), so a project that rotates its SECRET_KEY the Django way
keeps its credentials readable.

A sealed value is a JSON object of strings (a token, a refresh token, a URL): nothing in it
is ever logged, and an error names the row, never its content.
"""

from __future__ import annotations

import json
from base64 import urlsafe_b64encode
from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.utils.crypto import salted_hmac

from django_connector_outbox.conf import conf

# The purpose of the key derived from SECRET_KEY: no other use of SECRET_KEY derives the same.
DERIVATION_SALT = "django_connector_outbox.installations.sealing"


class CannotOpen(Exception):
    """A sealed value that none of the keys opens: sealed with a key no longer configured."""


def seal(secrets: dict[str, str]) -> str:
    """`secrets` as one Fernet token (text) under the first key."""
    return _keys().encrypt(json.dumps(secrets, sort_keys=True).encode()).decode()


def open_sealed(sealed: str, *, what: str) -> dict[str, str]:
    """What `seal` sealed; "" opens as {} (nothing stored). `what` names the row for the error."""
    if not sealed:
        return {}
    try:
        return dict(json.loads(_keys().decrypt(sealed.encode())))
    except InvalidToken:
        raise CannotOpen(
            f"the credentials of {what} were sealed with a key that is not in SECRET_KEYS "
            "(nor derived from SECRET_KEY or its fallbacks)"
        ) from None


def reseal(sealed: str) -> str:
    """`sealed` under the first key (MultiFernet.rotate keeps its timestamp); CannotOpen if no key opens it."""
    try:
        return _keys().rotate(sealed.encode()).decode()
    except InvalidToken:
        raise CannotOpen("a value was sealed with a key that is not configured") from None


def _keys() -> MultiFernet:
    return _multifernet(
        conf.SECRET_KEYS, settings.SECRET_KEY, tuple(getattr(settings, "SECRET_KEY_FALLBACKS", ()))
    )


# Keyed by the settings themselves, so a changed setting (override_settings) builds new keys.
@lru_cache(maxsize=4)
def _multifernet(keys: tuple[str, ...] | None, secret_key: str, fallbacks: tuple[str, ...]) -> MultiFernet:
    if keys is not None:
        return MultiFernet([Fernet(key) for key in keys])
    return MultiFernet([Fernet(_derived(secret)) for secret in (secret_key, *fallbacks)])


def _derived(secret: str) -> bytes:
    """A Fernet key from a Django secret, as Django derives its own keys (salted HMAC-SHA256)."""
    return urlsafe_b64encode(
        salted_hmac(DERIVATION_SALT, "fernet", secret=secret, algorithm="sha256").digest()
    )
