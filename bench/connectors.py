"""A connector that delivers nowhere and keeps nothing: the benchmarks measure the sender.

(The memory connector keeps every post it was sent, like the platform it stands for, so a
long drain through it measures its history as much as the sender.)

BENCH_SEND_LATENCY (seconds, default 0) makes each send wait that long first, like a
platform's round trip (bench/throughput.py --send-latency passes it to the senders). It is a
coroutine connector (`asend`), as the shipped HTTP connectors are; BlockingNullConnector is the
same with a blocking `send`, run on the sender's threads (bench/throughput.py --blocking).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from django_connector_outbox.connectors.base import Connector, Delivered, Outcome
from django_connector_outbox.posts import ClaimedPost

SEND_LATENCY = "BENCH_SEND_LATENCY"


class NullConnector(Connector):
    def __init__(self, source: str, **options: Any) -> None:
        super().__init__(source, **options)
        self.latency = float(os.environ.get(SEND_LATENCY, "0"))

    async def asend(self, post: ClaimedPost) -> Outcome:
        if self.latency:
            await asyncio.sleep(self.latency)
        return Delivered(f"{post.container_id}:{post.post_id}")


class BlockingNullConnector(NullConnector):
    """The no-op connector written before coroutines: a blocking `send`, on the sender's threads."""

    def send(self, post: ClaimedPost) -> Outcome:
        if self.latency:
            time.sleep(self.latency)
        return Delivered(f"{post.container_id}:{post.post_id}")

    asend = Connector.asend  # the base class's: `send` on the sender's threads


class PacedNullConnector(NullConnector):
    """The no-op connector with a shipped connector's default pace (Slack's), which a source's
    `"PACE": {}` turns off: bench/rate_limits.py's `off` scenario."""

    pace = {"container": (1, 1.0)}
