"""Fixtures of the connector tests."""

from __future__ import annotations

import pytest

from tests.connectors.helpers import FORMS


@pytest.fixture(params=FORMS)
def form(request: pytest.FixtureRequest) -> str:
    """Each test that takes it runs through the connector's blocking methods and through its
    coroutines (`helpers.in_form`)."""
    return str(request.param)
