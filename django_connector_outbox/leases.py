"""The leases of a sender's claims in flight, renewed before they end.

A claim's lease (conf.LEASE) bounds how long its sender may go on with it: a delivery starts
a platform call only while the lease outlives the call (`sender.adeliver`), and once the lease
has ended another sender takes the head back. A delivery can take longer than one call (a
lookup, then the send; a reply's thread found first; a wait for a blocking thread), so the
sender renews the leases of its claims in flight once less than half of a lease is left: each
claim batch (one lease token) in one conditional write of its lanes (`Outbox.renew_leases`).

Invariants:
- A lease that has ended is never renewed (another sender may be taking its head back), and
  one that could not be renewed is not asked for again: its deliveries go on under the lease
  they have, and give their claims back before a call it no longer covers.
- A delivery sees a renewal only once it is committed: `lease_until` is set after the commit,
  so no call starts under a lease that the database does not hold.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Protocol

from django_connector_outbox.conf import conf
from django_connector_outbox.outbox import Outbox
from django_connector_outbox.posts import ClaimedPost

# A lease is renewed once less than this share of it is left.
RENEW_WHEN_LEFT = 0.5


class InFlight(Protocol):
    """A claim in flight, whose delivery reads `lease_until` before each platform call."""

    outbox: Outbox
    claim: ClaimedPost
    lease_until: datetime


class Leases:
    """The claims in flight of one sender, by source and lease token."""

    def __init__(self) -> None:
        self._by_token: dict[tuple[str, str], list[InFlight]] = {}

    def add(self, claims: Iterable[InFlight]) -> None:
        for claim in claims:
            self._by_token.setdefault((claim.outbox.source, claim.claim.lease_token), []).append(claim)

    def discard(self, claim: InFlight) -> None:
        """A delivery that finished (a lease given up earlier is not tracked any more)."""
        key = (claim.outbox.source, claim.claim.lease_token)
        if (claims := self._by_token.get(key)) is not None:
            claims.remove(claim)
            if not claims:
                del self._by_token[key]

    def until_renewal(self, now: datetime) -> float | None:
        """Seconds until a lease in flight is to be renewed (0: now); None with none in flight."""
        if not self._by_token:
            return None
        earliest = min(claims[0].lease_until for claims in self._by_token.values())
        return max((earliest - self._margin() - now).total_seconds(), 0.0)

    def renew(self, now: datetime) -> int:
        """Renew the leases that are due (one transaction per source); how many claims kept theirs."""
        due: dict[Outbox, list[str]] = defaultdict(list)
        for (_, token), claims in self._by_token.items():
            if claims[0].lease_until - now <= self._margin():
                due[claims[0].outbox].append(token)
        kept = 0
        for outbox, tokens in due.items():
            renewed, until = outbox.renew_leases(tokens)
            for token in tokens:
                key = (outbox.source, token)
                if token not in renewed:  # ended, or taken back: not asked for again
                    del self._by_token[key]
                    continue
                claims = self._by_token[key]
                for claim in claims:
                    claim.lease_until = until
                kept += len(claims)
        return kept

    @staticmethod
    def _margin() -> timedelta:
        return timedelta(seconds=conf.LEASE * RENEW_WHEN_LEFT)
