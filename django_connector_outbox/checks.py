"""System checks: misconfiguration is reported by ``manage.py check``, not at send time.

The rules of the settings live in conf.py (and the building of a connector in the
connectors' registry); a check runs them and reports the `InvalidSetting` they raise, so the
running code refuses a bad value with the same message and id. Every check below runs under
plain ``manage.py check``. A per-source option gets a check function of its own, run over
`well_formed_sources()`.

Ids are stable and never reused:

- connector_outbox.E001  CONNECTOR_OUTBOX is not a dict, or has an unknown key
- connector_outbox.E002  CONNECTORS is not a dict; a source name is not a non-empty string of
                         at most 100 characters; an entry is not a dict, has an unknown key, no
                         BACKEND, a BACKEND that is not a string, or OPTIONS that are not a dict
- connector_outbox.E003  a BACKEND cannot be imported (or raises when imported, or needs a
                         package that is not installed)
- connector_outbox.E004  a BACKEND is not a Connector subclass
- connector_outbox.E005  a connector cannot be built from its OPTIONS
- connector_outbox.E006  a duration is not seconds (int/float) or a timedelta, or is not positive
                         and finite and at most MAX_DURATION (ten years)
- connector_outbox.E007  a count (MAX_ATTEMPTS, CLAIM_BATCH, MAX_BODY_BYTES) is not a positive int
- connector_outbox.E008  RETRY_JITTER is not a number in [0, 1]
- connector_outbox.E009  LEASE is not longer than a connector's longest delivery (a lookup and a send)
- connector_outbox.E010  STORE is not "auto" or "orm"
- connector_outbox.E011  django.contrib.admin is installed but rangefilter is not in INSTALLED_APPS
- connector_outbox.E012  SECRET_KEYS is not None or a non-empty list of Fernet keys
- connector_outbox.E020  a source's PACE (or, without one, its connector class's `pace`) is not a
                         dict of scope (container, workspace, source) -> (count, seconds)
- connector_outbox.E021  a connector class's kinds cannot be read for a source's OPTIONS
                         (`Connector.kinds_for`), or differ from its built connector's `kinds`
- connector_outbox.E013  DELIVERY is not "sender" or "immediate"
- connector_outbox.E014  STATUS_RETENTION is not None or a duration (E006's rule)
- connector_outbox.W001  no connector is configured
- connector_outbox.W002  SQLite without transaction_mode "IMMEDIATE": concurrent writers may fail
- connector_outbox.W003  (check --deploy) DELIVERY is "immediate", a development mode
- connector_outbox.W004  (check --deploy) a source uses the memory or console connector
- connector_outbox.W005  (check --deploy) a webhook source posts (or looks up) over plain http://
- connector_outbox.W010  ATTENTION_RETENTION is shorter than RETENTION (which then applies)
- E101-E109 Slack (E104-E109: its installations options: both token and installations,
  installations not a bool, no client_id/client_secret, bad scopes or user_scopes, bad
  success_url, OAuth options without installations), E201-E203 Discord, E211-E216 webhook,
  E221 console, E231-E234 Mattermost (url, token, timeout, installations), E241-E245 Teams
  (app_id, app_password, tenant_id, login_url, timeout), E251-E253 Telegram (token, base_url,
  timeout), E261-E263 email (from_email, connection, timeout), E271-E274 Google Chat (the
  service account key: one of service_account_file and service_account_info, readable; base_url,
  token_uri, timeout): reported by the connectors' own check(). E216: a webhook source gives both `url` and `installations`, or neither (or, with
  `installations`, a `secret` of its own, since each destination has one).
  A token that is not printable ASCII without spaces is E101 (Slack) / E201 (Discord), one not
  of @BotFather's form (digits:letters) E251 (Telegram); a webhook
  header that HTTP cannot carry is E213, a signing secret with surrounding whitespace E212.
  E234: a Mattermost source gives `installations` with a `url` or `token` of its own (or an
  `installations` that is not True/False); E231 its `url`, E232 its `token` otherwise.
  Surrounding whitespace of tokens and header values (a newline read from a file) is stripped.

Every message and hint, the connectors' own included, goes through gettext when the check runs
(the operator's language, locale/); the ids and the English texts are stable.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from django.apps import AppConfig, apps
from django.core import checks
from django.db import connections, router
from django.utils.module_loading import import_string
from django.utils.translation import gettext, ngettext

from django_connector_outbox.conf import (
    DEFAULTS,
    RULES,
    InvalidSetting,
    conf,
    connector_kinds,
    connector_mapping,
    known_key,
    source_config,
)
from django_connector_outbox.connectors import load_connector
from django_connector_outbox.connectors.base import Connector


def _report(error: InvalidSetting) -> checks.CheckMessage:
    return checks.Error(error.message, hint=error.hint, id=error.id)


@checks.register()
def check_settings(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """E001 for the dict and its keys, then each setting but CONNECTORS (check_connectors) by its rule."""
    try:
        user = conf.user()
    except InvalidSetting as e:
        return [_report(e)]
    errors: list[checks.CheckMessage] = []
    for key in sorted(user, key=repr):  # keys of any type, in a stable order
        try:
            known_key(key)
        except InvalidSetting as e:
            errors.append(_report(e))
    for name, rule in RULES.items():
        try:
            rule(name, user.get(name, DEFAULTS[name]))
        except InvalidSetting as e:
            errors.append(_report(e))
    if not errors and conf.ATTENTION_RETENTION < conf.RETENTION:
        errors.append(
            checks.Warning(
                gettext(
                    "CONNECTOR_OUTBOX['ATTENTION_RETENTION'] is shorter than RETENTION: failed and uncertain "
                    "posts are kept for RETENTION all the same."
                ),
                hint=gettext(
                    "They wait for a person: keep them at least as long as the posts that went out."
                ),
                id="connector_outbox.W010",
            )
        )
    return errors


def well_formed_sources() -> Iterator[tuple[str, dict[str, Any]]]:
    """The (source, entry) pairs of CONNECTORS that pass `source_config`; E002 reports the rest."""
    try:
        configured = connector_mapping(conf.user().get("CONNECTORS", {}))
    except InvalidSetting:
        return  # reported by check_settings (E001) or check_connectors (E002)
    for source, config in configured.items():
        try:
            yield source, source_config(source, config)
        except InvalidSetting:
            continue


@checks.register()
def check_connectors(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """The shape of CONNECTORS (E002), then each source's connector (E003-E005, E009, its own)."""
    try:
        user = conf.user()
    except InvalidSetting:
        return []  # E001, reported by check_settings
    try:
        configured = connector_mapping(user.get("CONNECTORS", {}))
    except InvalidSetting as e:
        return [_report(e)]
    if not configured:
        return [
            checks.Warning(
                gettext("No connector outbox source is configured: nothing can be queued."),
                hint=gettext("Add %(setting)s.")
                % {
                    "setting": "CONNECTOR_OUTBOX['CONNECTORS'] = {'name': {'BACKEND': ..., 'OPTIONS': {...}}}"
                },
                id="connector_outbox.W001",
            )
        ]
    messages: list[checks.CheckMessage] = []
    for source, config in configured.items():
        try:
            source_config(source, config)
        except InvalidSetting as e:
            messages.append(_report(e))
    for source, config in well_formed_sources():
        messages += _check_connector(source, config)
    return messages


def _check_connector(source: str, config: dict[str, Any]) -> list[checks.CheckMessage]:
    try:
        connector = load_connector(source, config)
    except InvalidSetting as e:
        return [_report(e)]
    try:
        messages = list(connector.check())
        messages += _check_kinds(source, config, connector)
        timeout = connector.timeout
        try:
            lease: float | None = conf.LEASE
        except InvalidSetting:
            lease = None  # reported by check_settings
        if timeout is not None and lease is not None:
            # The worst delivery: a stale claim's lookup (lookup_requests requests) and a send.
            worst = timeout * (connector.lookup_requests + 1)
            if lease <= worst:
                messages.append(
                    checks.Error(
                        gettext(
                            "LEASE (%(lease)ss) must be longer than the longest delivery of source %(source)r "
                            "(%(worst)ss: a lookup of up to %(requests)s requests and a send, "
                            "each up to the %(timeout)ss request timeout)."
                        )
                        % {
                            "lease": f"{lease:g}",
                            "source": source,
                            "worst": f"{worst:g}",
                            "requests": connector.lookup_requests,
                            "timeout": f"{timeout:g}",
                        },
                        hint=gettext(
                            "Claims whose lease ends before a lookup or a send could finish are given back "
                            "unsent, so a post could never be delivered."
                        ),
                        id="connector_outbox.E009",
                    )
                )
        return messages
    finally:
        connector.close()


def _check_kinds(source: str, config: dict[str, Any], connector: Connector) -> list[checks.CheckMessage]:
    """E021: the kinds that producers read from the connector class (`conf.connector_kinds`)
    are not readable, or are not those of the connector built from the same OPTIONS (a
    connector that sets `self.kinds` in `__init__` without overriding `kinds_for`)."""
    try:
        kinds = connector_kinds(source, config)
    except InvalidSetting as e:
        return [_report(e)]
    if connector.kinds == kinds:
        return []
    return [
        checks.Error(
            gettext(
                "CONNECTOR_OUTBOX['CONNECTORS'][%(source)r]: its connector takes the kinds %(built)s, but its "
                "class says %(read)s (%(backend)s.kinds_for(OPTIONS)), which is what queue() checks posts against."
            )
            % {
                "source": source,
                "built": ", ".join(sorted(connector.kinds)) or "none",
                "read": ", ".join(sorted(kinds)) or "none",
                "backend": config["BACKEND"],
            },
            hint=gettext("A connector whose kinds follow its OPTIONS overrides the classmethod kinds_for()."),
            id="connector_outbox.E021",
        )
    ]


@checks.register()
def check_admin(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E011: the admin's date-range filters render rangefilter's templates.

    An error rather than a fallback to Django's own date filters: the admin promises ranges
    (from, to), which Django's filters (today, past 7 days, ...) cannot give, and the package
    is installed with the app, so only the INSTALLED_APPS line is missing.
    """
    if apps.is_installed("django.contrib.admin") and not apps.is_installed("rangefilter"):
        return [
            checks.Error(
                gettext(
                    "'rangefilter' is not in INSTALLED_APPS: the connector outbox admin's date-range "
                    "filters need its templates (without it the post list fails with TemplateDoesNotExist)."
                ),
                hint=gettext("Add 'rangefilter' to INSTALLED_APPS, next to 'django_connector_outbox'."),
                id="connector_outbox.E011",
            )
        ]
    return []


@checks.register()
def check_pace(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E020 for each source whose effective pace is malformed (bad entries are E002-E004's)."""
    errors: list[checks.CheckMessage] = []
    for source, config in well_formed_sources():
        if "PACE" not in config:
            try:
                backend = import_string(config["BACKEND"])
            except Exception:  # noqa: BLE001 - reported by check_connectors (E003)
                continue
            if not (isinstance(backend, type) and issubclass(backend, Connector)):
                continue
        try:
            conf.pace(source)
        except InvalidSetting:
            continue  # the settings themselves are wrong: reported by check_settings
        except ValueError as e:
            errors.append(
                checks.Error(
                    str(e),
                    hint=gettext("A PACE is like %(example)s; {} turns pacing off.")
                    % {"example": "{'container': (1, 1.0), 'workspace': (20, 1.0)}"},
                    id="connector_outbox.E020",
                )
            )
    return errors


@checks.register()
def check_sqlite_transactions(
    app_configs: Sequence[AppConfig] | None = None, databases: Sequence[str] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """W002 for each SQLite database that can hold posts and does not begin IMMEDIATE.

    Only settings are read (no connection is opened), so it runs under plain ``check``.
    """
    from django_connector_outbox.models import Post

    messages: list[checks.CheckMessage] = []
    for alias in connections if databases is None else databases:
        connection = connections[alias]
        if (
            connection.vendor == "sqlite"
            and router.allow_migrate_model(alias, Post)
            and connection.settings_dict.get("OPTIONS", {}).get("transaction_mode") != "IMMEDIATE"
        ):
            messages.append(
                checks.Warning(
                    gettext("Database %(alias)r is SQLite without OPTIONS['transaction_mode'] = 'IMMEDIATE'.")
                    % {"alias": alias},
                    hint=gettext(
                        "With deferred transactions a sender and a request that write at once can fail with "
                        "'database is locked'; IMMEDIATE makes them wait for each other instead."
                    ),
                    id="connector_outbox.W002",
                )
            )
    return messages


# What --deploy warns of, by BACKEND class: connectors for development and tests only.
DEVELOPMENT_CONNECTORS = {
    "django_connector_outbox.connectors.memory.MemoryConnector": "memory",
    "django_connector_outbox.connectors.console.ConsoleConnector": "console",
}


@checks.register(deploy=True)
def check_deploy(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """W003-W005, under ``check --deploy`` only: what is for development, never silently in
    production (as Django's own deploy checks, and its mail.E001 for the console backend)."""
    messages: list[checks.CheckMessage] = []
    try:
        immediate = conf.DELIVERY == "immediate"
    except InvalidSetting:
        immediate = False  # E001/E013, reported by check_settings
    if immediate:
        messages.append(
            checks.Warning(
                gettext(
                    "CONNECTOR_OUTBOX['DELIVERY'] is \"immediate\": each post is delivered by the process "
                    "that commits it, and a retried post waits for the next commit."
                ),
                hint=gettext(
                    'It is for development. In production leave DELIVERY at "sender" and run manage.py run_outbox.'
                ),
                id="connector_outbox.W003",
            )
        )
    for source, config in well_formed_sources():
        try:
            backend = import_string(config["BACKEND"])
        except Exception:  # noqa: BLE001 - reported by check_connectors (E003)
            continue
        if not isinstance(backend, type):
            continue
        messages += _development_connector(source, backend) + _plain_http_webhook(source, backend, config)
    return messages


def _development_connector(source: str, backend: type) -> list[checks.CheckMessage]:
    """W004: a source whose connector (or its base class) is the memory or console one."""
    for cls in backend.__mro__:
        name = DEVELOPMENT_CONNECTORS.get(f"{cls.__module__}.{cls.__qualname__}")
        if name is not None:
            return [
                checks.Warning(
                    gettext(
                        "CONNECTOR_OUTBOX source %(source)r uses the %(name)s connector: its posts never reach "
                        "a chat platform."
                    )
                    % {"source": source, "name": name},
                    hint=gettext(
                        "It is for development and tests; give the source a platform's connector in production."
                    ),
                    id="connector_outbox.W004",
                )
            ]
    return []


def _plain_http_webhook(source: str, backend: type, config: dict[str, Any]) -> list[checks.CheckMessage]:
    """W005: a webhook source whose `url` or `lookup_url` is plain http:// (the URL itself is
    not shown: a hook's URL often holds its token)."""
    try:
        from django_connector_outbox.connectors.webhook import WebhookConnector
    except ImportError:  # without httpx no webhook source can be built (E003)
        return []
    if not issubclass(backend, WebhookConnector):
        return []
    options = config.get("OPTIONS", {})
    plain = [
        name
        for name in ("url", "lookup_url")
        if isinstance(options.get(name), str) and options[name].strip().startswith("http://")
    ]
    if not plain:
        return []
    return [
        checks.Warning(
            ngettext(
                "CONNECTOR_OUTBOX source %(source)r: the webhook's %(options)s is plain http://: posts, "
                "signatures and answers travel unencrypted.",
                "CONNECTOR_OUTBOX source %(source)r: the webhook's %(options)s are plain http://: posts, "
                "signatures and answers travel unencrypted.",
                len(plain),
            )
            % {"source": source, "options": gettext(" and ").join(plain)},
            hint=gettext("Use an https:// URL."),
            id="connector_outbox.W005",
        )
    ]
