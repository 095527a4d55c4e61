"""How values appear in messages that users read: plain values, never Python's reprs of
enums (`Kind.STATUS`) or of types (`NoneType`)."""

from __future__ import annotations

from enum import Enum
from typing import Any


def plain(value: Any) -> str:
    """`value` quoted as a user wrote it: an enum member by its value ('status', not Kind.STATUS)."""
    return repr(value.value if isinstance(value, Enum) else value)


def type_of(value: Any) -> str:
    """What `value` is, for "must be a string, not ...": None, or its type's name (int, list)."""
    return "None" if value is None else type(value).__name__


def a_type_of(value: Any) -> str:
    """The same with an article, for "must be a dict, not ...": None, a list, an int."""
    if value is None:
        return "None"
    name = type(value).__name__
    return f"{'an' if name[0].lower() in 'aeiou' else 'a'} {name}"
