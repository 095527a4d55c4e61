"""Text that connectors send in headers or show in reasons: what HTTP can carry, and no secrets.

Kept apart from http.py so that connectors without httpx (Slack, through slack-sdk) use it too.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import parse_qsl, unquote, urlsplit

# Words of a secret this long are secrets too: a platform echoes the token of
# "Authorization: Bearer <token>" without its scheme. Shorter words ("Bearer") are not.
SECRET_WORD = 8
# A path segment of a URL this long is a token whatever it holds; a shorter one when it has a
# digit too (and at least SECRET_WORD characters): "services", "hooks" or "lookup" are not.
SECRET_SEGMENT = 16


def scrub(text: str, secrets: Iterable[object]) -> str:
    """`text` with every secret, each part of one a platform may echo alone, and their escaped
    forms as `***`.

    The parts: each long enough word, and of a URL (a hook's URL often holds its token) its
    path and each segment of it that looks like a token, its query and each of its values, its
    password and fragment (`url_parts`). Escaped forms too, since exception messages show
    values as Python reprs (a newline as ``\\n``, a non-ASCII byte as ``\\xc3``). The longest
    go first, so that a whole secret is replaced before its parts.
    """
    values = [v for v in secrets if isinstance(v, str) and v]
    words = {word for v in values for word in v.split() if len(word) >= SECRET_WORD}
    words |= {part for v in values if "://" in v for part in url_parts(v)}
    forms = {
        form
        for v in {*values, *words}
        for form in (v, v.strip(), repr(v)[1:-1], repr(v.encode(errors="backslashreplace"))[2:-1])
    }
    for secret in sorted((f for f in forms if len(f) >= 4), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def url_parts(url: str) -> set[str]:
    """The parts of `url` that may hold a secret, as a receiver may echo them (see `scrub`).

    A receiver answers "no hook at /services/T01/B01/<token>": the path alone, or part of it.
    The host and the query's names are left: they tell an operator where the request went.
    """
    try:
        split = urlsplit(url)
        query = parse_qsl(split.query, keep_blank_values=True)
        password = split.password
    except ValueError:  # not a URL after all (an invalid port, say): its words will do
        return set()
    segments = {segment for segment in split.path.split("/") if _looks_like_a_token(unquote(segment))}
    parts = {*segments, *(unquote(s) for s in segments), *(value for _, value in query), split.fragment}
    if segments:  # the path holds a token: the path itself, as echoed, with or without its query
        parts |= {split.path, unquote(split.path), split.path.lstrip("/")}
    if split.query:
        parts |= {split.query, f"{split.path}?{split.query}"}
    if password:
        parts.add(password)
    return {part for part in parts if part}


def _looks_like_a_token(segment: str) -> bool:
    return len(segment) >= SECRET_SEGMENT or (
        len(segment) >= SECRET_WORD and any(c.isdigit() for c in segment)
    )


def is_header_value(value: str) -> bool:
    """Whether httpx can send `value` in a header as it is: printable ASCII (spaces inside)."""
    return value.isascii() and value.isprintable() and value == value.strip()


def is_header_token(value: str) -> bool:
    """A header value that is one word, as tokens are."""
    return is_header_value(value) and not any(c.isspace() for c in value)
