"""What the connector tests share."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar, cast

from django_connector_outbox.connectors.base import Connector
from django_connector_outbox.engine import run_inline
from django_connector_outbox.posts import ClaimedPost

LEASE = timedelta(seconds=120)


def claimed_post(
    source: str,
    post_id: str,
    body: dict[str, Any],
    *,
    kind: str = "message",
    workspace_id: str = "",
    container_id: str = "",
    thread_id: str = "",
    rev: int = 0,
    message_ref: str | None = None,
    stale: bool = False,
    sent_at: datetime | None = None,
    lease_until: datetime | None = None,
) -> ClaimedPost:
    """A post as a sender holds it on its first attempt: `sent_at` now unless given, leased
    for `LEASE` from now unless `lease_until` is given."""
    now = datetime.now(UTC)
    return ClaimedPost(
        source=source,
        post_id=post_id,
        workspace_id=workspace_id,
        container_id=container_id,
        thread_id=thread_id,
        kind=kind,
        body=body,
        rev=rev,
        attempts=1,
        message_ref=message_ref,
        turn_key=None,
        stale=stale,
        sent_at=sent_at or now,
        lease_until=lease_until or now + LEASE,
    )


#: The two forms of a connector's calls: its blocking methods, or its coroutines on a loop.
FORMS = ("blocking", "coroutine")

C = TypeVar("C", bound=Connector)


class CoroutineForm:
    """A connector whose `send`, `find_sent` and `close` are its coroutines `asend`,
    `afind_sent` and `aclose`, each run to its end as an in-process delivery runs it
    (`engine.run_inline`: on this thread's kept event loop, so that its loop's client serves
    every call, and work it does off the loop on this thread, in the test's transaction): a
    test written against the blocking methods checks the coroutine ones through the same
    assertions. Anything else is the connector's own."""

    def __init__(self, connector: Connector) -> None:
        object.__setattr__(self, "connector", connector)

    def send(self, post: ClaimedPost) -> Any:
        return run_inline(lambda: self.connector.asend(post))

    def find_sent(self, post: ClaimedPost) -> Any:
        return run_inline(lambda: self.connector.afind_sent(post))

    def close(self) -> None:
        run_inline(self.connector.aclose)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.connector, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.connector, name, value)

    def __repr__(self) -> str:
        return repr(self.connector)


def in_form(form: str, connector: C) -> C:
    """`connector` itself for the blocking form, else its `CoroutineForm`."""
    return connector if form == "blocking" else cast(C, CoroutineForm(connector))
