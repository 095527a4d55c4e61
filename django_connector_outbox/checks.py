"""System checks: misconfiguration is reported by ``manage.py check``, not at send time.

Ids are stable and never reused:

- connector_outbox.E001  CONNECTOR_OUTBOX is not a dict, or has an unknown key
- connector_outbox.E002  a CONNECTORS entry is not a dict with a BACKEND string (and optional OPTIONS
                         dict), or its source name is not a non-empty string of at most 100 characters
- connector_outbox.E003  a BACKEND cannot be imported (or raises when imported)
- connector_outbox.E004  a BACKEND is not a Connector subclass
- connector_outbox.E005  a connector cannot be built from its OPTIONS
- connector_outbox.E006  a duration is not seconds (int/float) or a timedelta, or is not positive
                         and finite and at most MAX_DURATION (ten years)
- connector_outbox.E007  a count (MAX_ATTEMPTS, CLAIM_BATCH, MAX_BODY_BYTES) is not a positive int
- connector_outbox.E008  RETRY_JITTER is not a number in [0, 1]
- connector_outbox.E009  LEASE is not longer than a connector's longest delivery (a lookup and a send)
- connector_outbox.E010  STORE is not "auto" or "orm"
- connector_outbox.E020  a source's PACE (or, without one, its connector class's `pace`) is not a
                         dict of scope (container, workspace, source) -> (count, seconds)
- connector_outbox.W001  no connector is configured
- connector_outbox.W002  SQLite without transaction_mode "IMMEDIATE": concurrent writers may fail
- E101-E103 Slack, E201-E203 Discord, E211-E215 webhook: reported by the connectors' own check().
  A token that is not printable ASCII without spaces is E101 (Slack) / E201 (Discord); a webhook
  header that HTTP cannot carry is E213, a signing secret with surrounding whitespace E212.
  Surrounding whitespace of tokens and header values (a newline read from a file) is stripped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core import checks
from django.db import connections
from django.utils.module_loading import import_string

from django_connector_outbox.conf import DEFAULTS, DURATIONS, MAX_DURATION, STORES, conf, seconds
from django_connector_outbox.connectors.base import Connector

# The length of the source column of Post and Lane.
SOURCE_LENGTH = 100


def _error(msg: str, id: str, hint: str | None = None) -> checks.CheckMessage:
    return checks.Error(msg, hint=hint, id=f"connector_outbox.{id}")


@checks.register()
def check_settings(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    user = getattr(settings, "CONNECTOR_OUTBOX", {})
    if not isinstance(user, dict):
        return [_error("CONNECTOR_OUTBOX must be a dict.", "E001")]
    errors: list[checks.CheckMessage] = []
    for key in sorted(set(user) - set(DEFAULTS)):
        errors.append(
            _error(f"CONNECTOR_OUTBOX has an unknown key {key!r}.", "E001", f"Known: {', '.join(DEFAULTS)}.")
        )
    for name in DURATIONS:
        value = conf.raw(name)
        try:
            # NaN fails both comparisons; inf and 1e12 would overflow a datetime later.
            valid = 0 < seconds(value) <= MAX_DURATION
        except TypeError:
            valid = False
        if not valid:
            errors.append(
                _error(
                    f"CONNECTOR_OUTBOX['{name}'] must be a positive number of seconds or a timedelta, "
                    f"at most {MAX_DURATION} (ten years), not {value!r}.",
                    "E006",
                )
            )
    for name in ("MAX_ATTEMPTS", "CLAIM_BATCH", "MAX_BODY_BYTES"):
        value = conf.raw(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            errors.append(
                _error(f"CONNECTOR_OUTBOX['{name}'] must be a positive int, not {value!r}.", "E007")
            )
    jitter = conf.raw("RETRY_JITTER")
    if isinstance(jitter, bool) or not isinstance(jitter, (int, float)) or not 0 <= jitter <= 1:
        errors.append(
            _error(f"CONNECTOR_OUTBOX['RETRY_JITTER'] must be a number in [0, 1], not {jitter!r}.", "E008")
        )
    if conf.raw("STORE") not in STORES:
        errors.append(
            _error(f'CONNECTOR_OUTBOX[\'STORE\'] must be "auto" or "orm", not {conf.raw("STORE")!r}.', "E010")
        )
    return errors


@checks.register()
def check_connectors(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    user = getattr(settings, "CONNECTOR_OUTBOX", {})
    configured = user.get("CONNECTORS", {}) if isinstance(user, dict) else {}
    if not isinstance(configured, dict):
        return [_error("CONNECTOR_OUTBOX['CONNECTORS'] must be a dict of source name -> config.", "E002")]
    if not configured:
        return [
            checks.Warning(
                "No connector outbox source is configured: nothing can be queued.",
                hint="Add CONNECTOR_OUTBOX['CONNECTORS'] = {'name': {'BACKEND': ..., 'OPTIONS': {...}}}.",
                id="connector_outbox.W001",
            )
        ]
    messages: list[checks.CheckMessage] = []
    for source, config in configured.items():
        messages += _check_connector(source, config)
    return messages


def _check_connector(source: str, config: Any) -> list[checks.CheckMessage]:
    where = f"CONNECTOR_OUTBOX['CONNECTORS'][{source!r}]"
    if not isinstance(source, str) or not 0 < len(source) <= SOURCE_LENGTH:
        return [
            _error(
                f"{where}: a source name must be a non-empty string of at most {SOURCE_LENGTH} characters.",
                "E002",
            )
        ]
    if (
        not isinstance(config, dict)
        or not isinstance(config.get("BACKEND"), str)
        or not isinstance(config.get("OPTIONS", {}), dict)
    ):
        return [
            _error(f"{where} must be a dict with a 'BACKEND' path and an optional 'OPTIONS' dict.", "E002")
        ]
    try:
        backend = import_string(config["BACKEND"])
    except Exception as e:  # noqa: BLE001 - ImportError, or any error the module raises as it is imported
        return [_error(f"{where}: BACKEND {config['BACKEND']!r} cannot be imported: {e}", "E003")]
    if not (isinstance(backend, type) and issubclass(backend, Connector)):
        return [_error(f"{where}: BACKEND {config['BACKEND']!r} is not a Connector subclass.", "E004")]
    try:
        connector = backend(source=source, **config.get("OPTIONS", {}))
    except Exception as e:  # noqa: BLE001 - any failure to build is a configuration error to report
        return [_error(f"{where}: the connector cannot be built from its OPTIONS: {e}", "E005")]
    try:
        messages = list(connector.check())
        timeout = connector.timeout
        try:
            lease = conf.LEASE
        except TypeError:
            lease = None  # reported by check_settings
        if timeout is not None and lease is not None:
            # The worst delivery: a stale claim's lookup (lookup_requests requests) and a send.
            worst = timeout * (connector.lookup_requests + 1)
            if lease <= worst:
                messages.append(
                    _error(
                        f"LEASE ({lease:g}s) must be longer than the longest delivery of source {source!r} "
                        f"({worst:g}s: a lookup of up to {connector.lookup_requests} requests and a send, "
                        f"each up to the {timeout:g}s request timeout).",
                        "E009",
                        "Claims whose lease ends before a lookup or a send could finish are given back "
                        "unsent, so a post could never be delivered.",
                    )
                )
        return messages
    finally:
        connector.close()


@checks.register()
def check_pace(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E020 for each source whose effective pace is malformed (bad entries are E002-E004's)."""
    user = getattr(settings, "CONNECTOR_OUTBOX", {})
    configured = user.get("CONNECTORS", {}) if isinstance(user, dict) else {}
    if not isinstance(configured, dict):
        return []
    errors: list[checks.CheckMessage] = []
    for source, config in configured.items():
        if not isinstance(config, dict) or not isinstance(config.get("BACKEND"), str):
            continue
        if "PACE" not in config:
            try:
                backend = import_string(config["BACKEND"])
            except Exception:  # noqa: BLE001 - reported by check_connectors (E003)
                continue
            if not (isinstance(backend, type) and issubclass(backend, Connector)):
                continue
        try:
            conf.pace(source)
        except ValueError as e:
            errors.append(
                _error(
                    str(e),
                    "E020",
                    "A PACE is like {'container': (1, 1.0), 'workspace': (20, 1.0)}; {} turns pacing off.",
                )
            )
    return errors


@checks.register(checks.Tags.database)
def check_sqlite_transactions(
    databases: Sequence[str] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    messages: list[checks.CheckMessage] = []
    for alias in databases or ():
        connection = connections[alias]
        if (
            connection.vendor == "sqlite"
            and connection.settings_dict.get("OPTIONS", {}).get("transaction_mode") != "IMMEDIATE"
        ):
            messages.append(
                checks.Warning(
                    f"Database {alias!r} is SQLite without OPTIONS['transaction_mode'] = 'IMMEDIATE'.",
                    hint="With deferred transactions a sender and a request that write at once can fail with "
                    "'database is locked'; IMMEDIATE makes them wait for each other instead.",
                    id="connector_outbox.W002",
                )
            )
    return messages
