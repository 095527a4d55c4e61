"""Rows in a given state, for tests of the admin and of pruning.

Tests of the outbox's behaviour go through the `Outbox` API instead: these factories write
rows directly and do not keep a lane's head up to date (a `Lane` created here has no head),
so a post made here is never claimed.

    PostFactory(failed=True)
    PostFactory(status="uncertain", kind="status")
"""

from __future__ import annotations

from datetime import UTC, datetime

import factory

from django_connector_outbox.models import Lane, Post
from django_connector_outbox.posts import State

# The FakeClock's start, so that factory rows and the outbox under a FakeClock agree.
EPOCH = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


class LaneFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Lane
        django_get_or_create = ("source", "workspace_id", "container_id")

    source = "memory"
    workspace_id = "T1"
    container_id = "C1"


class PostFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Post

    class Params:
        # Sets the state, and the fields that go with it (attempts, body, error). Not
        # `sending`: a post is sending while its lane holds a lease on it (Outbox.claim).
        status = State.QUEUED
        queued = factory.Trait(status=State.QUEUED)
        posted = factory.Trait(status=State.POSTED)
        failed = factory.Trait(status=State.FAILED)
        uncertain = factory.Trait(status=State.UNCERTAIN)
        cancelled = factory.Trait(status=State.CANCELLED)

    source = "memory"
    post_id = factory.Sequence(lambda n: f"post-{n}")
    workspace_id = "T1"
    container_id = "C1"
    thread_id = ""
    kind = "message"
    lane = factory.SubFactory(
        LaneFactory,
        source=factory.SelfAttribute("..source"),
        workspace_id=factory.SelfAttribute("..workspace_id"),
        container_id=factory.SelfAttribute("..container_id"),
    )
    state = factory.SelfAttribute("status")
    queued_at = EPOCH
    next_at = factory.SelfAttribute("queued_at")
    created_at = factory.SelfAttribute("queued_at")
    updated_at = factory.SelfAttribute("queued_at")
    turn_key = None

    @factory.lazy_attribute
    def body(self) -> dict[str, str] | None:
        # A delivered or cancelled one-off post has no body any more; the rest keep it.
        if self.kind != "status" and self.status in (State.POSTED, State.CANCELLED):
            return None
        return {"text": f"text of {self.post_id}"}

    @factory.lazy_attribute
    def attempts(self) -> int:
        return {State.FAILED: 5, State.UNCERTAIN: 1}.get(self.status, 0)

    @factory.lazy_attribute
    def message_ref(self) -> str | None:
        return f"{self.container_id}:{self.post_id}" if self.status == State.POSTED else None

    @factory.lazy_attribute
    def last_error(self) -> str:
        return {State.FAILED: "channel_not_found", State.UNCERTAIN: "cannot check"}.get(self.status, "")
