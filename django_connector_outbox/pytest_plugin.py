"""pytest fixtures for a project's tests, loaded by the package's ``pytest11`` entry point.

pytest loads this in every run where the package is installed, Django project or not, so
it imports nothing of Django at import time; the fixtures import `testing` when used.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from django_connector_outbox.connectors.memory import MemoryConnector
    from django_connector_outbox.testing import Deliveries, TestClock


@pytest.fixture(autouse=True)
def _outbox_fresh_connectors() -> Iterator[None]:
    """Each test starts with connectors built afresh (memory ones empty), as pytest-django
    empties mail.outbox; only where the registry has been imported, so a run without Django
    stays without it."""
    registry = sys.modules.get("django_connector_outbox.connectors")
    if registry is not None:
        registry.connectors.reset()
    yield


@pytest.fixture
def outbox_clock() -> TestClock:
    """A `TestClock` at now, ticking; `outbox_deliver` and ``clock=`` seams read it."""
    from django_connector_outbox.testing import TestClock

    return TestClock()


@pytest.fixture
def outbox_memory() -> Iterator[dict[str, MemoryConnector]]:
    """Every configured source delivered by a MemoryConnector: source -> its connector."""
    from django_connector_outbox.testing import memory_connectors

    with memory_connectors() as platforms:
        yield platforms


@pytest.fixture
def outbox_deliver(outbox_clock: TestClock) -> Callable[..., Deliveries]:
    """`deliver_due` on `outbox_clock`: ``outbox_deliver()["slack"]`` is what Slack received."""
    from django_connector_outbox.testing import deliver_due

    return functools.partial(deliver_due, clock=outbox_clock)
