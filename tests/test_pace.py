"""PACE: how a source's pacing is resolved (`conf.pace`) and checked (E020, by exact equality)."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any, ClassVar

import pytest
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_connector_outbox import conf as conf_module
from django_connector_outbox.checks import check_connectors, check_pace
from django_connector_outbox.conf import conf
from django_connector_outbox.connectors import Connector, Pace, Scope

MEMORY = "django_connector_outbox.connectors.memory.MemoryConnector"
SLACK = "django_connector_outbox.connectors.slack.SlackConnector"
DISCORD = "django_connector_outbox.connectors.discord.DiscordConnector"
WEBHOOK = "django_connector_outbox.connectors.webhook.WebhookConnector"
WHERE = "CONNECTOR_OUTBOX['CONNECTORS']['chat']['PACE']"
HINT = "A PACE is like {'container': (1, 1.0), 'workspace': (20, 1.0)}; {} turns pacing off."


class PacedConnector(Connector):
    pace: ClassVar[dict[str, tuple[int, float]]] = {"container": (3, 6.0), "source": (100, 60.0)}


class BadlyPacedConnector(Connector):
    pace: ClassVar[Any] = {"team": (1, 1.0)}


def source(backend: str = MEMORY, **config: Any) -> override_settings:
    return override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"chat": {"BACKEND": backend, **config}}})


def e020(msg: str) -> checks.Error:
    return checks.Error(msg, hint=HINT, id="connector_outbox.E020")


# -- resolving


def test_a_source_without_pace_takes_its_connector_class_pace() -> None:
    with source(f"{__name__}.PacedConnector"):
        assert conf.pace("chat") == {Scope.CONTAINER: Pace(3, 6.0), Scope.SOURCE: Pace(100, 60.0)}


def test_a_source_pace_replaces_the_class_pace_scope_by_scope_as_a_whole() -> None:
    with source(f"{__name__}.PacedConnector", PACE={"workspace": (20, timedelta(minutes=1))}):
        assert conf.pace("chat") == {Scope.WORKSPACE: Pace(20, 60.0)}


def test_an_empty_pace_turns_pacing_off() -> None:
    with source(SLACK, OPTIONS={"token": "xoxb-1"}, PACE={}):
        assert conf.pace("chat") == {}


@pytest.mark.parametrize(
    ("backend", "expected"),
    [
        (MEMORY, {}),
        (WEBHOOK, {}),
        (SLACK, {Scope.CONTAINER: Pace(1, 1.0)}),
        (DISCORD, {Scope.SOURCE: Pace(3, 0.063)}),
        (
            "django_connector_outbox.connectors.google_chat.GoogleChatConnector",
            {Scope.CONTAINER: Pace(5, 5.5), Scope.SOURCE: Pace(50, 1.05)},
        ),
    ],
)
def test_the_shipped_connectors_default_paces(backend: str, expected: dict[Scope, Pace]) -> None:
    with source(backend):
        assert conf.pace("chat") == expected


def test_the_pace_of_an_unknown_source_is_a_configuration_error() -> None:
    with source(), pytest.raises(ImproperlyConfigured, match="Unknown connector outbox source 'other'"):
        conf.pace("other")


def test_a_bad_pace_raises_the_checks_message() -> None:
    with source(PACE={"container": (0, 1)}), pytest.raises(ValueError, match=r"\['container'\] must be"):
        conf.pace("chat")


# -- caching: parsed once per source, until the settings change


def test_override_settings_changes_a_pace_read_before() -> None:
    with source(PACE={"container": (1, 1.0)}):
        assert conf.pace("chat") == {Scope.CONTAINER: Pace(1, 1.0)}
        with source(PACE={"workspace": (20, 60)}):
            assert conf.pace("chat") == {Scope.WORKSPACE: Pace(20, 60.0)}
            with source(f"{__name__}.PacedConnector"):
                assert conf.pace("chat") == {Scope.CONTAINER: Pace(3, 6.0), Scope.SOURCE: Pace(100, 60.0)}
            assert conf.pace("chat") == {Scope.WORKSPACE: Pace(20, 60.0)}
        assert conf.pace("chat") == {Scope.CONTAINER: Pace(1, 1.0)}
    with pytest.raises(ImproperlyConfigured, match="Unknown connector outbox source 'chat'"):
        conf.pace("chat")


def test_a_pace_is_parsed_once_per_source_until_the_settings_change(monkeypatch: pytest.MonkeyPatch) -> None:
    parsed: list[str] = []
    parse = conf_module.parse_pace

    def counting(value: Any, where: str) -> dict[Scope, Pace]:
        parsed.append(where)
        return parse(value, where)

    monkeypatch.setattr(conf_module, "parse_pace", counting)
    config = {"BACKEND": MEMORY, "PACE": {"source": (2, 1)}}
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"a": config, "b": config}}):
        for _ in range(3):
            assert conf.pace("a") == conf.pace("b") == {Scope.SOURCE: Pace(2, 1.0)}
        assert len(parsed) == 2  # once for a, once for b
        with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"a": config}}):
            conf.pace("a")
            conf.pace("a")
        assert len(parsed) == 3
        conf.pace("a")
        assert len(parsed) == 4  # the settings changed back: read again


def test_a_caller_changing_its_pace_changes_no_one_elses() -> None:
    with source(PACE={"container": (1, 1.0)}):
        conf.pace("chat").clear()
        assert conf.pace("chat") == {Scope.CONTAINER: Pace(1, 1.0)}


def test_a_bad_pace_is_refused_every_time_it_is_read() -> None:
    with source(PACE={"container": (0, 1)}):
        for _ in range(2):
            with pytest.raises(ValueError, match=r"\['container'\] must be"):
                conf.pace("chat")


# -- checks


@pytest.mark.parametrize(
    "pace",
    [
        {},
        {"container": (1, 1)},
        {"container": [2, 2.5], "workspace": (50, timedelta(minutes=1)), "source": (45, 1)},
    ],
)
def test_a_valid_pace_passes(pace: Any) -> None:
    with source(PACE=pace):
        assert check_pace() == []


def test_a_pace_that_is_not_a_dict_is_e020() -> None:
    with source(PACE=[("container", 1, 1)]):
        assert check_pace() == [
            e020(f"{WHERE} must be a dict of scope -> (count, seconds), not [('container', 1, 1)].")
        ]


def test_an_unknown_scope_is_e020() -> None:
    with source(PACE={"channel": (1, 1)}):
        assert check_pace() == [
            e020(f"{WHERE} has an unknown scope 'channel'; scopes: container, workspace, source.")
        ]


@pytest.mark.parametrize(
    "limit",
    [
        (0, 1),
        (-1, 1),
        (True, 1),
        (1.5, 1),
        ("1", 1),
        (1, 0),
        (1, -2),
        (1, math.inf),
        (1, math.nan),
        (1, 1e12),
        (1, "1"),
        (1, None),
        (1,),
        (1, 1, 1),
        5,
        None,
    ],
)
def test_a_bad_count_or_window_is_e020(limit: Any) -> None:
    with source(PACE={"workspace": limit}):
        assert check_pace() == [
            e020(
                f"{WHERE}['workspace'] must be (count, seconds): a positive int, and a positive number of "
                f"seconds or a timedelta of at most 315360000 (ten years), not {limit!r}."
            )
        ]


def test_a_bad_class_pace_is_e020_naming_the_class() -> None:
    with source(f"{__name__}.BadlyPacedConnector"):
        assert check_pace() == [
            e020(
                f"{__name__}.BadlyPacedConnector.pace has an unknown scope 'team'; "
                "scopes: container, workspace, source."
            )
        ]


def test_a_bad_class_pace_does_not_matter_when_the_source_gives_its_own() -> None:
    with source(f"{__name__}.BadlyPacedConnector", PACE={}):
        assert check_pace() == []


@pytest.mark.parametrize(
    "config",
    [
        {"BACKEND": "no.such.Module"},
        {"BACKEND": f"{__name__}.source"},
        {"BACKEND": 5},
        "not a dict",
    ],
)
def test_a_backend_that_other_checks_report_adds_no_e020(config: Any) -> None:
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"chat": config}}):
        assert check_pace() == []
        assert check_connectors() != []


def test_each_source_is_checked() -> None:
    with override_settings(
        CONNECTOR_OUTBOX={
            "CONNECTORS": {
                "a": {"BACKEND": MEMORY, "PACE": {"source": (1, 0)}},
                "b": {"BACKEND": MEMORY},
                "c": {"BACKEND": MEMORY, "PACE": None},
            }
        }
    ):
        assert [m.msg for m in check_pace()] == [
            "CONNECTOR_OUTBOX['CONNECTORS']['a']['PACE']['source'] must be (count, seconds): a positive int, "
            "and a positive number of seconds or a timedelta of at most 315360000 (ten years), not (1, 0).",
            "CONNECTOR_OUTBOX['CONNECTORS']['c']['PACE'] must be a dict of scope -> (count, seconds), not None.",
        ]
