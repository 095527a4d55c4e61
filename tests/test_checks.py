"""System checks, compared by exact equality (id, message and hint)."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from django.core import checks
from django.test import override_settings

from django_connector_outbox.checks import check_connectors, check_settings, check_sqlite_transactions
from django_connector_outbox.connectors.base import Connector

MEMORY = {"BACKEND": "django_connector_outbox.connectors.memory.MemoryConnector"}


class SlowConnector(Connector):
    """Requests may take up to `timeout` seconds."""

    def __init__(self, source: str, *, timeout: float = 30, **options: object) -> None:
        super().__init__(source, **options)
        self.timeout = timeout


class NotAConnector:
    pass


def outbox(**settings: object) -> override_settings:
    return override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"chat": MEMORY}, **settings})


def error(msg: str, id: str, hint: str | None = None) -> checks.Error:
    return checks.Error(msg, hint=hint, id=f"connector_outbox.{id}")


def test_valid_settings_pass() -> None:
    with outbox(LEASE=timedelta(minutes=2), RETRY_JITTER=0, CLAIM_BATCH=50):
        assert check_settings() == []
        assert check_connectors() == []


def test_settings_not_a_dict() -> None:
    with override_settings(CONNECTOR_OUTBOX=["nope"]):
        assert check_settings() == [error("CONNECTOR_OUTBOX must be a dict.", "E001")]


def test_unknown_key() -> None:
    with outbox(LEASES=3):
        assert check_settings() == [
            error(
                "CONNECTOR_OUTBOX has an unknown key 'LEASES'.",
                "E001",
                "Known: CONNECTORS, LEASE, MAX_ATTEMPTS, RETRY_BASE, RETRY_MAX, RETRY_JITTER, CLAIM_BATCH, "
                "POLL_INTERVAL, RETENTION, MAX_BODY_BYTES, MAX_HOLD, STORE.",
            )
        ]


@pytest.mark.parametrize("value", ["120", -1, 0, None, True])
def test_bad_duration(value: object) -> None:
    with outbox(LEASE=value):
        assert check_settings() == [
            error(
                "CONNECTOR_OUTBOX['LEASE'] must be a positive number of seconds or a timedelta, "
                f"at most 315360000 (ten years), not {value!r}.",
                "E006",
            )
        ]


@pytest.mark.parametrize(
    "name", ["LEASE", "RETRY_BASE", "RETRY_MAX", "POLL_INTERVAL", "RETENTION", "MAX_HOLD"]
)
@pytest.mark.parametrize(
    "value",
    [math.inf, math.nan, 1e12, 315360000.5, timedelta(days=3651)],
    ids=["inf", "nan", "1e12", "10y+", "td"],
)
def test_a_duration_that_is_not_finite_or_is_over_ten_years_is_an_error(name: str, value: object) -> None:
    with outbox(**{name: value}):
        assert check_settings() == [
            error(
                f"CONNECTOR_OUTBOX['{name}'] must be a positive number of seconds or a timedelta, "
                f"at most 315360000 (ten years), not {value!r}.",
                "E006",
            )
        ]


@pytest.mark.parametrize("value", ["3600", -1, 0, None])
def test_bad_max_hold(value: object) -> None:
    with outbox(MAX_HOLD=value):
        assert check_settings() == [
            error(
                "CONNECTOR_OUTBOX['MAX_HOLD'] must be a positive number of seconds or a timedelta, "
                f"at most 315360000 (ten years), not {value!r}.",
                "E006",
            )
        ]


def test_a_duration_of_ten_years_passes() -> None:
    with outbox(RETENTION=315360000, LEASE=timedelta(days=3650)):
        assert check_settings() == []


@pytest.mark.parametrize("value", [0, 2.5, "5", True])
def test_bad_count(value: object) -> None:
    with outbox(MAX_ATTEMPTS=value):
        assert check_settings() == [
            error(f"CONNECTOR_OUTBOX['MAX_ATTEMPTS'] must be a positive int, not {value!r}.", "E007")
        ]


@pytest.mark.parametrize("value", [-0.1, 1.5, "0.2"])
def test_bad_jitter(value: object) -> None:
    with outbox(RETRY_JITTER=value):
        assert check_settings() == [
            error(f"CONNECTOR_OUTBOX['RETRY_JITTER'] must be a number in [0, 1], not {value!r}.", "E008")
        ]


def test_no_connectors_warns() -> None:
    with override_settings(CONNECTOR_OUTBOX={}):
        assert check_connectors() == [
            checks.Warning(
                "No connector outbox source is configured: nothing can be queued.",
                hint="Add CONNECTOR_OUTBOX['CONNECTORS'] = {'name': {'BACKEND': ..., 'OPTIONS': {...}}}.",
                id="connector_outbox.W001",
            )
        ]


@pytest.mark.parametrize("config", ["dotted.Path", {"OPTIONS": {}}, {"BACKEND": "x.Y", "OPTIONS": []}])
def test_malformed_connector_entry(config: object) -> None:
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"chat": config}}):
        assert check_connectors() == [
            error(
                "CONNECTOR_OUTBOX['CONNECTORS']['chat'] must be a dict with a 'BACKEND' path and an optional "
                "'OPTIONS' dict.",
                "E002",
            )
        ]


@pytest.mark.parametrize("backend", [5, None, ["x.Y"]])
def test_a_backend_that_is_not_a_string_is_an_error(backend: object) -> None:
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"chat": {"BACKEND": backend}}}):
        assert check_connectors() == [
            error(
                "CONNECTOR_OUTBOX['CONNECTORS']['chat'] must be a dict with a 'BACKEND' path and an optional "
                "'OPTIONS' dict.",
                "E002",
            )
        ]


@pytest.mark.parametrize("source", [5, "", "s" * 101], ids=["int", "empty", "101"])
def test_a_source_name_that_is_not_a_short_string_is_an_error(source: object) -> None:
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {source: MEMORY}}):
        assert check_connectors() == [
            error(
                f"CONNECTOR_OUTBOX['CONNECTORS'][{source!r}]: a source name must be a non-empty string of at "
                "most 100 characters.",
                "E002",
            )
        ]


def test_a_backend_module_that_raises_when_imported_is_an_error() -> None:
    with override_settings(
        CONNECTOR_OUTBOX={"CONNECTORS": {"chat": {"BACKEND": "tests.broken_module.Connector"}}}
    ):
        assert check_connectors() == [
            error(
                "CONNECTOR_OUTBOX['CONNECTORS']['chat']: BACKEND 'tests.broken_module.Connector' cannot be "
                "imported: this module fails as it is imported",
                "E003",
            )
        ]


def test_unknown_backend_path() -> None:
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"chat": {"BACKEND": "nowhere.Connector"}}}):
        assert check_connectors() == [
            error(
                "CONNECTOR_OUTBOX['CONNECTORS']['chat']: BACKEND 'nowhere.Connector' cannot be imported: "
                "No module named 'nowhere'",
                "E003",
            )
        ]


def test_backend_not_a_connector() -> None:
    with override_settings(
        CONNECTOR_OUTBOX={"CONNECTORS": {"chat": {"BACKEND": "tests.test_checks.NotAConnector"}}}
    ):
        assert check_connectors() == [
            error(
                "CONNECTOR_OUTBOX['CONNECTORS']['chat']: BACKEND 'tests.test_checks.NotAConnector' is not a "
                "Connector subclass.",
                "E004",
            )
        ]


def test_wrong_options() -> None:
    config = {**MEMORY, "OPTIONS": {"tokn": "x"}}
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"chat": config}}):
        assert check_connectors() == [
            error(
                "CONNECTOR_OUTBOX['CONNECTORS']['chat']: the connector cannot be built from its OPTIONS: "
                "MemoryConnector takes no options, got tokn",
                "E005",
            )
        ]


def test_lease_not_longer_than_a_lookup_and_a_send() -> None:
    config = {"BACKEND": "tests.test_checks.SlowConnector", "OPTIONS": {"timeout": 30}}
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"chat": config}, "LEASE": 30}):
        assert check_connectors() == [
            error(
                "LEASE (30s) must be longer than the longest delivery of source 'chat' (60s: a lookup "
                "of up to 1 requests and a send, each up to the 30s request timeout).",
                "E009",
                "Claims whose lease ends before a lookup or a send could finish are given back unsent, "
                "so a post could never be delivered.",
            )
        ]
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"chat": config}, "LEASE": 61}):
        assert check_connectors() == []


def test_the_shipped_connectors_fit_the_default_lease() -> None:
    connectors = {
        "slack": {
            "BACKEND": "django_connector_outbox.connectors.slack.SlackConnector",
            "OPTIONS": {"token": "xoxb-1"},
        },
        "discord": {
            "BACKEND": "django_connector_outbox.connectors.discord.DiscordConnector",
            "OPTIONS": {"token": "t"},
        },
    }
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": connectors}):
        assert [m for m in check_connectors() if m.id == "connector_outbox.E009"] == []


def test_sqlite_without_immediate_transactions_warns(settings: object) -> None:
    from django.db import connections

    connection = connections["default"]
    if connection.vendor != "sqlite":
        pytest.skip("a SQLite setting")
    options = connection.settings_dict["OPTIONS"]
    assert check_sqlite_transactions(databases=["default"]) == []
    saved = options.pop("transaction_mode")
    try:
        assert [m.id for m in check_sqlite_transactions(databases=["default"])] == ["connector_outbox.W002"]
    finally:
        options["transaction_mode"] = saved


@pytest.mark.django_db(databases="__all__")  # `check` reads every configured database
def test_manage_py_check_runs_them() -> None:
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    with (
        override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"chat": {"BACKEND": "nowhere.Connector"}}}),
        pytest.raises(SystemCheckError, match="connector_outbox.E003"),
    ):
        call_command("check")


@pytest.mark.parametrize("store", ["postgres", "", None, 1])
def test_a_store_other_than_auto_or_orm(store) -> None:
    with outbox(STORE=store):
        assert check_settings() == [
            error(f'CONNECTOR_OUTBOX[\'STORE\'] must be "auto" or "orm", not {store!r}.', "E010")
        ]
