"""429s spread across containers: a platform's answer that does not say which limit tripped.

Slack, Teams and Telegram answer 429 alike for a container's limit and for a wider one (the
workspace's, the tenant's, the bot's). One container's 429s hold that container; 429s from
several containers of one place within a short window are the wider limit's.

Invariant: only the 429s of the last `window` seconds are kept (the latest of each container),
and a place without any is forgotten, so the memory is bounded by the 429s of one window.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class Recent429s:
    """Which containers of each place got a 429 lately (thread-safe: the sender calls one
    connector from several threads)."""

    def __init__(self, window: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.window = window
        self.clock = clock
        self._lock = threading.Lock()
        self._seen: dict[str, dict[str, float]] = {}  # place -> container -> latest 429

    def note(self, place: str, container: str) -> int:
        """Record a 429 of `container` in `place`; return how many containers of `place` got
        one within the window."""
        now = self.clock()
        with self._lock:
            for key in list(self._seen):
                recent = {c: at for c, at in self._seen[key].items() if at > now - self.window}
                if recent:
                    self._seen[key] = recent
                else:
                    del self._seen[key]
            containers = self._seen.setdefault(place, {})
            containers[container] = now
            return len(containers)
