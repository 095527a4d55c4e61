"""System checks, compared by exact equality (id, message and hint), and the same rules at run time.

Every bad value runs through Django's check registry (so a check that raises fails the test)
and, where one setting is wrong, through the `conf` property that reads it: the running code
raises ImproperlyConfigured with the same message and id.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from django_connector_outbox import Outbox
from django_connector_outbox.checks import check_admin, check_sqlite_transactions
from django_connector_outbox.conf import DEFAULTS, RULES, InvalidSetting, conf
from django_connector_outbox.connectors import Connector, connectors
from django_connector_outbox.fakes import google_chat

MEMORY = {"BACKEND": "django_connector_outbox.connectors.memory.MemoryConnector"}
TEN_YEARS = 315360000
WHERE = "CONNECTOR_OUTBOX['CONNECTORS']['chat']"


class SlowConnector(Connector):
    """Requests may take up to `timeout` seconds."""

    def __init__(self, source: str, *, timeout: float = 30, **options: object) -> None:
        super().__init__(source, **options)
        self.timeout = timeout


class NotAConnector:
    pass


def error(msg: str, id: str, hint: str | None = None) -> checks.Error:
    return checks.Error(msg, hint=hint, id=f"connector_outbox.{id}")


def outbox_checks() -> list[checks.CheckMessage]:
    """The app's messages from every registered check (databases=[]: no query is needed)."""
    return [m for m in checks.run_checks(databases=[]) if (m.id or "").startswith("connector_outbox.")]


def runtime_error(read: Callable[[], object]) -> checks.Error:
    """The ImproperlyConfigured that `read` raises, as the check error it must equal."""
    with pytest.raises(ImproperlyConfigured) as raised:
        read()
    assert isinstance(raised.value, InvalidSetting)
    return checks.Error(raised.value.message, hint=raised.value.hint, id=raised.value.id)


def duration_error(name: str, value: object) -> checks.Error:
    return error(
        f"CONNECTOR_OUTBOX['{name}'] must be a positive number of seconds or a timedelta, "
        f"at most {TEN_YEARS} (ten years), not {value!r}.",
        "E006",
    )


DURATIONS = [name for name, rule in RULES.items() if rule.__name__ == "duration"]
COUNTS = [name for name, rule in RULES.items() if rule.__name__ == "count"]
BAD_DURATIONS = [
    "120", None, True, [1], -1, 0, 0.0, math.inf, -math.inf, math.nan, 1e12, TEN_YEARS + 0.5,
    timedelta(0), timedelta(seconds=-1), timedelta(days=3651),
]  # fmt: skip
BAD_COUNTS = [0, -1, 2.5, 5.0, "5", None, True, math.inf]
BAD_JITTERS = [-0.1, 1.5, "0.2", None, True, math.nan, math.inf]


def test_every_setting_but_connectors_has_a_rule() -> None:
    assert list(RULES) == [name for name in DEFAULTS if name != "CONNECTORS"]
    others = ["RETRY_JITTER", "STATUS_RETENTION", "STORE", "SECRET_KEYS", "DELIVERY"]
    assert sorted(DURATIONS + COUNTS + others) == sorted(RULES)


def test_valid_settings_pass() -> None:
    with override_settings(
        CONNECTOR_OUTBOX={
            "CONNECTORS": {"chat": MEMORY},
            "LEASE": timedelta(minutes=2),
            "RETRY_JITTER": 0,
            "CLAIM_BATCH": 50,
            "POLL_INTERVAL": 0.25,
            "RETENTION": TEN_YEARS,
            "ATTENTION_RETENTION": TEN_YEARS,
            "STATUS_RETENTION": timedelta(days=90),
            "MAX_HOLD": timedelta(days=3650),
        }
    ):
        assert outbox_checks() == []
        assert (conf.LEASE, conf.RETRY_JITTER, conf.CLAIM_BATCH, conf.POLL_INTERVAL) == (120.0, 0.0, 50, 0.25)
        assert conf.STATUS_RETENTION == 90 * 86400.0


def test_the_defaults_pass() -> None:
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"chat": MEMORY}}):
        assert outbox_checks() == []
        assert [getattr(conf, name) for name in RULES] == [DEFAULTS[name] for name in RULES]


@pytest.mark.parametrize("name", DURATIONS)
@pytest.mark.parametrize("value", BAD_DURATIONS, ids=repr)
def test_a_bad_duration_is_one_error_e006_and_refused_at_run_time(name: str, value: object) -> None:
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"chat": MEMORY}, name: value}):
        assert outbox_checks() == [duration_error(name, value)]
        assert runtime_error(lambda: getattr(conf, name)) == duration_error(name, value)


@pytest.mark.parametrize("name", COUNTS)
@pytest.mark.parametrize("value", BAD_COUNTS, ids=repr)
def test_a_bad_count_is_one_error_e007_and_refused_at_run_time(name: str, value: object) -> None:
    expected = error(f"CONNECTOR_OUTBOX['{name}'] must be a positive int, not {value!r}.", "E007")
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"chat": MEMORY}, name: value}):
        assert outbox_checks() == [expected]
        assert runtime_error(lambda: getattr(conf, name)) == expected


@pytest.mark.parametrize("value", BAD_JITTERS, ids=repr)
def test_a_bad_jitter_is_one_error_e008_and_refused_at_run_time(value: object) -> None:
    expected = error(f"CONNECTOR_OUTBOX['RETRY_JITTER'] must be a number in [0, 1], not {value!r}.", "E008")
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"chat": MEMORY}, "RETRY_JITTER": value}):
        assert outbox_checks() == [expected]
        assert runtime_error(lambda: conf.RETRY_JITTER) == expected


@pytest.mark.parametrize("value", [v for v in BAD_DURATIONS if v is not None], ids=repr)
def test_a_bad_status_retention_is_one_error_e014_and_refused_at_run_time(value: object) -> None:
    expected = error(
        "CONNECTOR_OUTBOX['STATUS_RETENTION'] must be None (kept for ever) or a positive number of seconds "
        f"or a timedelta, at most {TEN_YEARS} (ten years), not {value!r}.",
        "E014",
    )
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"chat": MEMORY}, "STATUS_RETENTION": value}):
        assert outbox_checks() == [expected]
        assert runtime_error(lambda: conf.STATUS_RETENTION) == expected


@pytest.mark.parametrize("value", [None, 3600, 0.5, timedelta(days=1)], ids=repr)
def test_a_status_retention_is_none_or_a_duration(value: object) -> None:
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"chat": MEMORY}, "STATUS_RETENTION": value}):
        assert outbox_checks() == []
        assert (value.total_seconds() if isinstance(value, timedelta) else value) == conf.STATUS_RETENTION


@pytest.mark.parametrize("value", ["postgres", "", None, 1, ["orm"]], ids=repr)
def test_a_store_other_than_auto_or_orm_is_one_error_e010_and_refused_at_run_time(value: object) -> None:
    expected = error(f'CONNECTOR_OUTBOX[\'STORE\'] must be "auto" or "orm", not {value!r}.', "E010")
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"chat": MEMORY}, "STORE": value}):
        assert outbox_checks() == [expected]
        assert runtime_error(lambda: conf.STORE) == expected


def test_several_bad_settings_are_each_reported() -> None:
    with override_settings(
        CONNECTOR_OUTBOX={"CONNECTORS": {"chat": MEMORY}, "LEASE": "2m", "MAX_ATTEMPTS": 0, "RETRY_JITTER": 2}
    ):
        assert outbox_checks() == [
            duration_error("LEASE", "2m"),
            error("CONNECTOR_OUTBOX['MAX_ATTEMPTS'] must be a positive int, not 0.", "E007"),
            error("CONNECTOR_OUTBOX['RETRY_JITTER'] must be a number in [0, 1], not 2.", "E008"),
        ]


@pytest.mark.parametrize(
    ("value", "shown"), [(["nope"], "a list"), ("nope", "a str"), (None, "None"), (5, "an int")], ids=repr
)
def test_settings_that_are_not_a_dict_are_one_error_e001(value: object, shown: str) -> None:
    expected = error(f"CONNECTOR_OUTBOX must be a dict, not {shown}.", "E001")
    with override_settings(CONNECTOR_OUTBOX=value):
        assert outbox_checks() == [expected]
        assert runtime_error(lambda: conf.LEASE) == expected
        assert runtime_error(lambda: Outbox("chat")) == expected


KNOWN = (
    "Known: CONNECTORS, LEASE, MAX_ATTEMPTS, RETRY_BASE, RETRY_MAX, RETRY_JITTER, CLAIM_BATCH, "
    "POLL_INTERVAL, RETENTION, ATTENTION_RETENTION, STATUS_RETENTION, MAX_BODY_BYTES, MAX_HOLD, STORE, "
    "SECRET_KEYS, DELIVERY."
)


def test_each_unknown_key_is_an_error_e001_whatever_its_type() -> None:
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"chat": MEMORY}, "LEASES": 3, 5: 1, None: 2}):
        assert outbox_checks() == [
            error("CONNECTOR_OUTBOX has an unknown key 'LEASES'.", "E001", KNOWN),
            error("CONNECTOR_OUTBOX has an unknown key 5.", "E001", KNOWN),
            error("CONNECTOR_OUTBOX has an unknown key None.", "E001", KNOWN),
        ]


def test_an_unknown_key_is_refused_at_run_time() -> None:
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"chat": MEMORY}, "LEASES": 3}):
        assert runtime_error(lambda: conf.LEASE) == error(
            "CONNECTOR_OUTBOX has an unknown key 'LEASES'.", "E001", KNOWN
        )


def test_no_connectors_warns() -> None:
    with override_settings(CONNECTOR_OUTBOX={}):
        assert outbox_checks() == [
            checks.Warning(
                "No connector outbox source is configured: nothing can be queued.",
                hint="Add CONNECTOR_OUTBOX['CONNECTORS'] = {'name': {'BACKEND': ..., 'OPTIONS': {...}}}.",
                id="connector_outbox.W001",
            )
        ]


@pytest.mark.parametrize(
    ("value", "shown"), [(["chat"], "a list"), ("chat", "a str"), (None, "None")], ids=repr
)
def test_connectors_that_are_not_a_dict_are_one_error_e002(value: object, shown: str) -> None:
    expected = error(
        "CONNECTOR_OUTBOX['CONNECTORS'] must be a dict of source name -> {'BACKEND': ..., 'OPTIONS': {...}}, "
        f"not {shown}.",
        "E002",
    )
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": value}):
        assert outbox_checks() == [expected]
        assert runtime_error(lambda: conf.CONNECTORS) == expected


ENTRY = "must be a dict with a 'BACKEND' path and an optional 'OPTIONS' dict"


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ("dotted.Path", error(f"{WHERE} {ENTRY}, not a str.", "E002")),
        (None, error(f"{WHERE} {ENTRY}, not None.", "E002")),
        (["x.Y"], error(f"{WHERE} {ENTRY}, not a list.", "E002")),
        (
            {"OPTIONS": {}},
            error(
                f"{WHERE} has no 'BACKEND'.",
                "E002",
                "Set it to the dotted path of a Connector class, such as "
                "'django_connector_outbox.connectors.slack.SlackConnector'.",
            ),
        ),
        (
            {"BACKEND": 5},
            error(f"{WHERE}['BACKEND'] must be the dotted path of a Connector class (a string), not 5.", "E002"),
        ),
        (
            {"BACKEND": None},
            error(
                f"{WHERE}['BACKEND'] must be the dotted path of a Connector class (a string), not None.", "E002"
            ),
        ),
        (
            {"BACKEND": SlowConnector},
            error(
                f"{WHERE}['BACKEND'] must be the dotted path of a Connector class (a string), "
                f"not {SlowConnector!r}.",
                "E002",
            ),
        ),
        (
            {**MEMORY, "OPTIONS": ["token"]},
            error(f"{WHERE}['OPTIONS'] must be a dict of the connector's options, not a list.", "E002"),
        ),
        (
            {**MEMORY, "OPTIONS": None},
            error(f"{WHERE}['OPTIONS'] must be a dict of the connector's options, not None.", "E002"),
        ),
        (
            {**MEMORY, "OPTION": {}},
            error(f"{WHERE} has an unknown key 'OPTION'.", "E002", "Known: BACKEND, OPTIONS, PACE."),
        ),
    ],
    ids=["str", "none", "list", "no-backend", "backend-int", "backend-none", "backend-class",
         "options-list", "options-none", "unknown-key"],
)  # fmt: skip
def test_a_malformed_entry_is_one_error_e002_and_refused_at_run_time(
    config: object, expected: checks.Error
) -> None:
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"chat": config}}):
        assert outbox_checks() == [expected]
        assert runtime_error(lambda: Outbox("chat")) == expected
        assert runtime_error(lambda: connectors["chat"]) == expected


def test_options_are_never_shown_in_an_error() -> None:
    config = {**MEMORY, "OPTIONS": "xoxb-secret-token"}
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"chat": config}}):
        assert "secret" not in str(outbox_checks())
        assert "secret" not in str(runtime_error(lambda: conf.CONNECTORS))


def test_a_pace_key_is_left_to_its_own_check() -> None:
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"chat": {**MEMORY, "PACE": {}}}}):
        assert [m for m in outbox_checks() if m.id == "connector_outbox.E002"] == []


@pytest.mark.parametrize("source", [5, "", "s" * 101, None], ids=["int", "empty", "101", "none"])
def test_a_source_name_that_is_not_a_short_string_is_an_error(source: object) -> None:
    expected = error(
        f"CONNECTOR_OUTBOX['CONNECTORS'][{source!r}]: a source name must be a non-empty string of at "
        "most 100 characters.",
        "E002",
    )
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {source: MEMORY}}):
        assert outbox_checks() == [expected]
        assert runtime_error(lambda: conf.CONNECTORS) == expected


def test_a_bad_entry_does_not_hide_the_checks_of_the_good_ones() -> None:
    slow = {"BACKEND": "tests.test_checks.SlowConnector", "OPTIONS": {"timeout": 60}}
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"chat": {"BACKEND": 5}, "slow": slow}}):
        assert [m.id for m in outbox_checks()] == ["connector_outbox.E002", "connector_outbox.E009"]


@pytest.mark.parametrize(
    ("backend", "expected"),
    [
        (
            "tests.broken_module.Connector",
            error(
                f"{WHERE}: BACKEND 'tests.broken_module.Connector' cannot be imported: "
                "this module fails as it is imported",
                "E003",
            ),
        ),
        (
            "nowhere.Connector",
            error(
                f"{WHERE}: BACKEND 'nowhere.Connector' cannot be imported: No module named 'nowhere'", "E003"
            ),
        ),
        (
            "Connector",
            error(
                f"{WHERE}: BACKEND 'Connector' cannot be imported: Connector doesn't look like a module path",
                "E003",
            ),
        ),
        (
            "django_connector_outbox.connectors.memory.Nothing",
            error(
                f"{WHERE}: BACKEND 'django_connector_outbox.connectors.memory.Nothing' cannot be imported: "
                'Module "django_connector_outbox.connectors.memory" does not define a "Nothing" attribute/class',
                "E003",
            ),
        ),
        (
            "tests.test_checks.NotAConnector",
            error(f"{WHERE}: BACKEND 'tests.test_checks.NotAConnector' is not a Connector subclass.", "E004"),
        ),
        (
            "tests.test_checks.MEMORY",
            error(f"{WHERE}: BACKEND 'tests.test_checks.MEMORY' is not a Connector subclass.", "E004"),
        ),
    ],
    ids=["raises", "missing", "no-dot", "no-class", "not-a-connector", "not-a-class"],
)
def test_a_backend_that_cannot_be_loaded_is_an_error_and_refused_at_run_time(
    backend: str, expected: checks.Error
) -> None:
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"chat": {"BACKEND": backend}}}):
        assert outbox_checks() == [expected]
        assert runtime_error(lambda: connectors["chat"]) == expected


def test_options_the_connector_does_not_take_are_an_error_e005() -> None:
    expected = error(
        f"{WHERE}: the connector cannot be built from its OPTIONS: MemoryConnector takes no options, got tokn",
        "E005",
    )
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"chat": {**MEMORY, "OPTIONS": {"tokn": "x"}}}}):
        assert outbox_checks() == [expected]
        assert runtime_error(lambda: connectors["chat"]) == expected


class KindsOfItsOwnConnector(Connector):
    """Sets its kinds as it is built, not in `kinds_for`: producers would check the class's."""

    def __init__(self, source: str, **options: object) -> None:
        super().__init__(source, **options)
        self.kinds = frozenset({"message"})  # type: ignore[misc]


class UnreadableKindsConnector(Connector):
    @classmethod
    def kinds_for(cls, options: Any) -> frozenset[str]:
        raise ValueError("no kinds here")


def test_kinds_set_by_a_built_connector_and_not_by_its_class_are_an_error_e021() -> None:
    config = {"BACKEND": "tests.test_checks.KindsOfItsOwnConnector"}
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"chat": config}}):
        assert outbox_checks() == [
            error(
                f"{WHERE}: its connector takes the kinds message, but its class says ephemeral, message, "
                "reaction, status (tests.test_checks.KindsOfItsOwnConnector.kinds_for(OPTIONS)), which is "
                "what queue() checks posts against.",
                "E021",
                "A connector whose kinds follow its OPTIONS overrides the classmethod kinds_for().",
            )
        ]


def test_kinds_that_cannot_be_read_are_an_error_e021_and_refused_at_run_time() -> None:
    config = {"BACKEND": "tests.test_checks.UnreadableKindsConnector"}
    expected = error(f"{WHERE}: the kinds of its connector cannot be read from its OPTIONS: no kinds here", "E021")
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"chat": config}}):
        assert outbox_checks() == [expected]
        assert runtime_error(lambda: conf.kinds("chat")) == expected


def test_lease_not_longer_than_a_lookup_and_a_send() -> None:
    config = {"BACKEND": "tests.test_checks.SlowConnector", "OPTIONS": {"timeout": 30}}
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"chat": config}, "LEASE": 30}):
        assert outbox_checks() == [
            error(
                "LEASE (30s) must be longer than the longest delivery of source 'chat' (60s: a lookup "
                "of up to 1 requests and a send, each up to the 30s request timeout).",
                "E009",
                "Claims whose lease ends before a lookup or a send could finish are given back unsent, "
                "so a post could never be delivered.",
            )
        ]
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"chat": config}, "LEASE": 61}):
        assert outbox_checks() == []


def test_a_bad_lease_is_reported_once_not_again_against_each_connector() -> None:
    config = {"BACKEND": "tests.test_checks.SlowConnector", "OPTIONS": {"timeout": 30}}
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"chat": config}, "LEASE": "30"}):
        assert outbox_checks() == [duration_error("LEASE", "30")]


def test_the_shipped_connectors_fit_the_default_lease() -> None:
    shipped = {
        "slack": {
            "BACKEND": "django_connector_outbox.connectors.slack.SlackConnector",
            "OPTIONS": {"token": "xoxb-1"},
        },
        "discord": {
            "BACKEND": "django_connector_outbox.connectors.discord.DiscordConnector",
            "OPTIONS": {"token": "t"},
        },
        "hooks": {
            "BACKEND": "django_connector_outbox.connectors.webhook.WebhookConnector",
            "OPTIONS": {"url": "https://example.com/hook"},
        },
        "google_chat": {
            "BACKEND": "django_connector_outbox.connectors.google_chat.GoogleChatConnector",
            "OPTIONS": {"service_account_info": google_chat.service_account_key(google_chat.shared_key())},
        },
    }
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": shipped}):
        assert outbox_checks() == []


def test_a_console_stream_that_cannot_be_written_to_is_an_error_e221() -> None:
    console = {"BACKEND": "django_connector_outbox.connectors.console.ConsoleConnector"}
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"chat": {**console, "OPTIONS": {"stream": 5}}}}):
        assert outbox_checks() == [
            error(
                "CONNECTOR_OUTBOX source 'chat': the console OPTIONS['stream'] must be a text stream "
                "(with write() and flush()), such as sys.stderr, not 5.",
                "E221",
                "Leave it out to print to standard output.",
            )
        ]
    with override_settings(
        CONNECTOR_OUTBOX={"CONNECTORS": {"chat": {**console, "OPTIONS": {"stream": io.StringIO()}}}}
    ):
        assert outbox_checks() == []


ADMIN_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_connector_outbox",
]


def test_the_admin_without_rangefilter_is_an_error_e011() -> None:
    with override_settings(INSTALLED_APPS=ADMIN_APPS):
        assert check_admin() == [
            error(
                "'rangefilter' is not in INSTALLED_APPS: the connector outbox admin's date-range filters "
                "need its templates (without it the post list fails with TemplateDoesNotExist).",
                "E011",
                "Add 'rangefilter' to INSTALLED_APPS, next to 'django_connector_outbox'.",
            )
        ]


def test_without_the_admin_rangefilter_is_not_needed() -> None:
    with override_settings(INSTALLED_APPS=[a for a in ADMIN_APPS if a != "django.contrib.admin"]):
        assert check_admin() == []


@pytest.fixture
def deferred_sqlite() -> Any:
    """The default database's OPTIONS without transaction_mode, restored afterwards."""
    from django.db import connections

    connection = connections["default"]
    if connection.vendor != "sqlite":
        pytest.skip("a SQLite setting")
    options = connection.settings_dict["OPTIONS"]
    saved = options.pop("transaction_mode")
    yield
    options["transaction_mode"] = saved


def test_sqlite_with_immediate_transactions_passes() -> None:
    assert check_sqlite_transactions() == []


W002 = checks.Warning(
    "Database 'default' is SQLite without OPTIONS['transaction_mode'] = 'IMMEDIATE'.",
    hint="With deferred transactions a sender and a request that write at once can fail with "
    "'database is locked'; IMMEDIATE makes them wait for each other instead.",
    id="connector_outbox.W002",
)


def test_sqlite_without_immediate_transactions_warns_under_plain_check(deferred_sqlite: None) -> None:
    # checks.run_checks() as `manage.py check` calls it: no tags, no --database.
    assert [m for m in checks.run_checks() if m.id == "connector_outbox.W002"] == [W002]


class NoOutboxHere:
    def allow_migrate(self, db: str, app_label: str, **hints: object) -> bool | None:
        return False if app_label == "django_connector_outbox" else None


def test_sqlite_that_cannot_hold_posts_does_not_warn(deferred_sqlite: None) -> None:
    with override_settings(DATABASE_ROUTERS=[NoOutboxHere()]):
        assert check_sqlite_transactions() == []


@pytest.mark.django_db(databases="__all__")  # `check` reads every configured database
def test_manage_py_check_reports_a_backend_that_is_not_a_string() -> None:
    with (
        override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"chat": {"BACKEND": 5}}}),
        pytest.raises(SystemCheckError, match=r"connector_outbox\.E002"),
    ):
        call_command("check")


def test_an_attention_retention_shorter_than_the_retention_warns_w010() -> None:
    with override_settings(
        CONNECTOR_OUTBOX={"CONNECTORS": {"chat": MEMORY}, "RETENTION": 86400, "ATTENTION_RETENTION": 3600}
    ):
        assert outbox_checks() == [
            checks.Warning(
                "CONNECTOR_OUTBOX['ATTENTION_RETENTION'] is shorter than RETENTION: failed and uncertain "
                "posts are kept for RETENTION all the same.",
                hint="They wait for a person: keep them at least as long as the posts that went out.",
                id="connector_outbox.W010",
            )
        ]
