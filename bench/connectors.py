"""A connector that delivers nowhere and keeps nothing: the benchmarks measure the sender.

(The memory connector keeps every post it was sent, like the platform it stands for, so a
long drain through it measures its history as much as the sender.)
"""

from __future__ import annotations

from django_connector_outbox.connectors.base import Connector, Delivered, Outcome
from django_connector_outbox.posts import ClaimedPost


class NullConnector(Connector):
    def send(self, post: ClaimedPost) -> Outcome:
        return Delivered(f"{post.container_id}:{post.post_id}")
