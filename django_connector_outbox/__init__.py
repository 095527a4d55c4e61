"""django-connector-outbox: deliver posts to chat platforms through a transactional outbox.

The version is written once, in pyproject.toml; `__version__` reads it from the installed
package's metadata (a source tree that is not installed says "unknown").
"""

from __future__ import annotations

from importlib import metadata
from typing import TYPE_CHECKING, Any

from django_connector_outbox.message import Link, Message
from django_connector_outbox.posts import ClaimedPost, InvalidPost, PostState

if TYPE_CHECKING:
    from django_connector_outbox.outbox import Outbox

__all__ = ["ClaimedPost", "InvalidPost", "Link", "Message", "Outbox", "PostState", "__version__"]

try:
    __version__ = metadata.version("django-connector-outbox")
except metadata.PackageNotFoundError:  # a source tree on sys.path, not installed
    __version__ = "unknown"


def __getattr__(name: str) -> Any:
    # Outbox imports the models, which may not be imported before the app registry is
    # ready (this package is itself in INSTALLED_APPS), so it is loaded on first use.
    if name == "Outbox":
        from django_connector_outbox.outbox import Outbox

        return Outbox
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
