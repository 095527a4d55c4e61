"""Delivering a source's posts in a test through the pytest plugin's `outbox_deliver`."""

from __future__ import annotations

from typing import Any

from django_connector_outbox.models import Post


def deliver_all(outbox_deliver: Any, outbox_clock: Any, source: str, *, pace: float = 1.0) -> list[str]:
    """Deliver `source`'s posts until none is queued, moving the test's clock `pace` seconds
    past each pace's wait between deliveries; the post ids delivered, in order."""
    delivered: list[str] = []
    for _ in range(10):
        delivered += [p.post_id for p in outbox_deliver(source).get(source, [])]
        if not Post.objects.with_claim().filter(source=source).in_states(("queued",)).exists():
            return delivered
        outbox_clock.advance(pace)
    raise AssertionError("posts still queued after ten deliveries")
