"""Text that connectors send in headers or show in reasons: what HTTP can carry, and no secrets.

Kept apart from http.py so that connectors without httpx (Slack, through slack-sdk) use it too.
"""

from __future__ import annotations

from collections.abc import Iterable

# Words of a secret this long are secrets too: a platform echoes the token of
# "Authorization: Bearer <token>" without its scheme. Shorter words ("Bearer") are not.
SECRET_WORD = 8


def scrub(text: str, secrets: Iterable[object]) -> str:
    """`text` with every secret, each long enough word of one, and their escaped forms as `***`.

    Escaped forms too, since exception messages show values as Python reprs (a newline as
    ``\\n``, a non-ASCII byte as ``\\xc3``). The longest go first, so that a whole secret is replaced before its parts.
    """
    values = [v for v in secrets if isinstance(v, str) and v]
    words = {word for v in values for word in v.split() if len(word) >= SECRET_WORD}
    forms = {
        form
        for v in {*values, *words}
        for form in (v, v.strip(), repr(v)[1:-1], repr(v.encode(errors="backslashreplace"))[2:-1])
    }
    for secret in sorted((f for f in forms if len(f) >= 4), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def is_header_value(value: str) -> bool:
    """Whether httpx can send `value` in a header as it is: printable ASCII (spaces inside)."""
    return value.isascii() and value.isprintable() and value == value.strip()


def is_header_token(value: str) -> bool:
    """A header value that is one word, as tokens are."""
    return is_header_value(value) and not any(c.isspace() for c in value)
