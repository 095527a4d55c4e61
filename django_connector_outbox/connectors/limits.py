"""How a connector's `message_problem` words a Message over one of its platform's limits.

One wording for every platform, naming the field, what it has and the limit: "text is 4,210
characters, over Telegram's 4,096", so that the `InvalidPost` a producer sees says what to cut.
"""

from __future__ import annotations


def too_long(name: str, length: int, platform: str, limit: int, unit: str = "characters") -> str | None:
    """The problem of a `name` of `length` (in `unit`) over `platform`'s `limit`, or None."""
    if length <= limit:
        return None
    return f"{name} is {length:,} {unit}, over {possessive(platform)} {limit:,}"


def too_many(name: str, count: int, platform: str, limit: int) -> str | None:
    """The problem of `count` `name` (a plural) over `platform`'s `limit`, or None."""
    if count <= limit:
        return None
    return f"{count:,} {name}, over {possessive(platform)} {limit:,}"


def possessive(platform: str) -> str:
    """The possessive of a platform's name: "Slack's", "Teams'"."""
    return f"{platform}'" if platform.endswith("s") else f"{platform}'s"


def first(*problems: str | None) -> str | None:
    """The first problem found, or None."""
    return next((problem for problem in problems if problem is not None), None)
