from __future__ import annotations

import logging
import os
from datetime import UTC, datetime, timedelta
from importlib.metadata import entry_points

import pytest
from hypothesis import HealthCheck, settings

from django_connector_outbox.connectors import connectors

# Where the package is installed (tox), its pytest11 entry point has loaded the plugin already;
# from a checkout, it is loaded here.
if not entry_points(group="pytest11", name="django_connector_outbox"):
    pytest_plugins = ["django_connector_outbox.pytest_plugin"]


def pytest_addoption(parser):
    parser.addoption(
        "--screenshots",
        metavar="DIR",
        default=None,
        help="save the admin's screenshots (tests/test_admin_browser.py) into DIR: "
        "`--screenshots docs` regenerates the ones the docs show",
    )


@pytest.fixture
def senders():
    """Starts `run_outbox` processes against the test database; kills those left at the end."""
    from django.db import connection

    from tests.proof_connectors import Senders

    started = Senders(connection.settings_dict["NAME"])
    yield started
    started.close()


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


@pytest.fixture
def package_log(caplog):
    """Records of the package's loggers, at every level (they propagate to caplog's handler)."""
    caplog.set_level(logging.DEBUG, logger="django_connector_outbox")
    return caplog


@pytest.fixture(autouse=True)
def _fresh_connectors():
    connectors.reset()
    yield
    connectors.reset()


# Hypothesis: deterministic in the normal run (a failure prints its reproduction blob);
# HYPOTHESIS_PROFILE=long hunts with far more, random, examples.
settings.register_profile(
    "ci",
    max_examples=200,
    stateful_step_count=50,
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "long",
    max_examples=5000,
    stateful_step_count=60,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
