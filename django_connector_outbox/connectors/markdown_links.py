"""The url of a Markdown link, as the Markdown dialects of Discord, Mattermost and Teams read it.

A link's target ends at the first space or unbalanced ``)``, and ``<``/``>`` start an
autolink: percent-encoded, they keep the url's meaning (RFC 3986: an encoded character
the server decodes) and end nothing early.
"""

from __future__ import annotations

_TARGET_ESCAPES = str.maketrans({" ": "%20", "(": "%28", ")": "%29", "<": "%3C", ">": "%3E"})


def link_target(url: str) -> str:
    """`url` safe inside ``[label](...)``."""
    return url.translate(_TARGET_ESCAPES)
