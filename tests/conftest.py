from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from django_connector_outbox.connectors import connectors


class FakeClock:
    """A clock that moves only when told to: tests move time instead of sleeping."""

    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(autouse=True)
def _fresh_connectors():
    connectors.reset()
    yield
    connectors.reset()
