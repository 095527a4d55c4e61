"""Settings, read lazily from ``settings.CONNECTOR_OUTBOX`` on every access, and their rules.

Reading on access (never writing to settings) keeps ``override_settings`` working in tests, as
in django-cors-headers. Three values are cached per source, read from its connector class
without building a connector: its pace (`Settings.pace`), which every claim reads, the
kinds it takes (`Settings.kinds`), which every queued post is checked against, and its
limits for a Message (`Settings.message_check`); the caches are
cleared when ``CONNECTOR_OUTBOX`` changes (the ``setting_changed`` signal that
``override_settings`` sends), like the connectors' registry.

Each rule a value must follow is written once, here: a property raises `InvalidSetting` (an
``ImproperlyConfigured``) for a bad value, and the system checks (checks.py) report the same
exception as an error with its id, so ``manage.py check`` and the running code say the same.
"""

from __future__ import annotations

import binascii
import functools
import math
from base64 import urlsafe_b64decode
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.utils.module_loading import import_string
from django.utils.translation import gettext

from django_connector_outbox.posts import Kind, Pace, Scope
from django_connector_outbox.wording import a_type_of

if TYPE_CHECKING:  # connectors/ imports this module
    from django_connector_outbox.connectors.base import Connector
    from django_connector_outbox.message import Message

    MessageCheck = Callable[[Message], str | None]

# The channel of the wake-up NOTIFY that queueing sends (PostgreSQL; idle senders LISTEN on it).
NOTIFY_CHANNEL = "connector_outbox"

DEFAULTS: dict[str, Any] = {
    "CONNECTORS": {},
    "LEASE": 120,  # seconds a claim holds a post (renewed while its send is in flight)
    "MAX_ATTEMPTS": 5,  # a post is handed to send at most this many times in all; then it fails
    "RETRY_BASE": 2,  # backoff: min(RETRY_BASE * 2 ** (attempts - 1), RETRY_MAX)
    "RETRY_MAX": 60,  # the longest backoff between two attempts
    "RETRY_JITTER": 0.2,  # backoff is multiplied by a random factor in [1 - j, 1]
    "CLAIM_BATCH": 100,  # by measurement: bench/README.md, "defaults"
    "POLL_INTERVAL": 1.0,  # longest idle wait where no wake-up signal exists
    "RETENTION": 7 * 24 * 3600,  # finished one-off posts are kept this long
    # failed and uncertain ones this long (at least RETENTION): they wait for a person
    "ATTENTION_RETENTION": 30 * 24 * 3600,
    # finished status posts are kept this long; None: for ever (set_status can edit them again)
    "STATUS_RETENTION": None,
    "MAX_BODY_BYTES": 256 * 1024,  # largest compact JSON encoding of a body
    "MAX_HOLD": 3600,  # the longest wait a retry or hold may set; longer ones are cut to it
    # "auto": PostgreSQL's own statements there, the ORM elsewhere; "orm": the ORM everywhere
    # (a pooler that cannot keep prepared statements, or to compare the two).
    "STORE": "auto",
    # Keys that encrypt stored credentials (installations, destinations): the first encrypts,
    # all decrypt, so a key is rotated by putting a new one first (then `outbox_reencrypt`).
    # None: one key derived from SECRET_KEY (SECRET_KEY_FALLBACKS still decrypt).
    "SECRET_KEYS": None,
    # "sender": `run_outbox` processes deliver. "immediate" (development only; check --deploy
    # warns): each committed post is delivered right after its transaction commits, in process.
    "DELIVERY": "sender",
}
STORES = ("auto", "orm")
DELIVERIES = ("sender", "immediate")

# The longest duration any setting or option may give (about ten years): a longer one is a
# mistake, and 1e12 seconds from now is past the year 9999 that datetimes (and databases) end at.
MAX_DURATION = 10 * 365 * 24 * 3600

# The keys of one CONNECTORS entry. PACE (pacing) has a rule and a check of its own.
SOURCE_KEYS = ("BACKEND", "OPTIONS", "PACE")
# The length of the source column of Post and Lane.
SOURCE_LENGTH = 100


class InvalidSetting(ImproperlyConfigured):
    """A bad value in ``CONNECTOR_OUTBOX``; `id` is the system check that reports it."""

    def __init__(self, message: str, id: str, hint: str | None = None) -> None:
        super().__init__(message if hint is None else f"{message} {hint}")
        self.message = message
        self.id = f"connector_outbox.{id}"
        self.hint = hint


def seconds(value: float | timedelta) -> float:
    """A duration given as seconds (int/float) or a timedelta, in seconds."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"a duration must be seconds (int/float) or a timedelta, not {value!r}")
    return float(value)


def known_key(key: object) -> None:
    """E001 unless `key` is a setting of the app."""
    if key not in DEFAULTS:
        raise InvalidSetting(
            gettext("CONNECTOR_OUTBOX has an unknown key %(key)r.") % {"key": key},
            "E001",
            gettext("Known: %(known)s.") % {"known": ", ".join(DEFAULTS)},
        )


def duration(name: str, value: Any) -> float:
    """E006 unless `value` is positive seconds or a timedelta, at most MAX_DURATION."""
    try:
        # NaN fails both comparisons; inf and 1e12 would overflow a datetime later.
        if 0 < (result := seconds(value)) <= MAX_DURATION:
            return result
    except TypeError:
        pass
    raise InvalidSetting(
        gettext(
            "CONNECTOR_OUTBOX['%(name)s'] must be a positive number of seconds or a timedelta, "
            "at most %(max)s (ten years), not %(value)r."
        )
        % {"name": name, "max": MAX_DURATION, "value": value},
        "E006",
    )


def duration_or_none(name: str, value: Any) -> float | None:
    """E014 unless `value` is None or a duration as `duration` takes it (E006's rule)."""
    if value is None:
        return None
    try:
        return duration(name, value)
    except InvalidSetting:
        raise InvalidSetting(
            gettext(
                "CONNECTOR_OUTBOX['%(name)s'] must be None (kept for ever) or a positive number of seconds "
                "or a timedelta, at most %(max)s (ten years), not %(value)r."
            )
            % {"name": name, "max": MAX_DURATION, "value": value},
            "E014",
        ) from None


def count(name: str, value: Any) -> int:
    """E007 unless `value` is a positive int."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidSetting(
            gettext("CONNECTOR_OUTBOX['%(name)s'] must be a positive int, not %(value)r.")
            % {"name": name, "value": value},
            "E007",
        )
    return value


def fraction(name: str, value: Any) -> float:
    """E008 unless `value` is a number in [0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise InvalidSetting(
            gettext("CONNECTOR_OUTBOX['%(name)s'] must be a number in [0, 1], not %(value)r.")
            % {"name": name, "value": value},
            "E008",
        )
    return float(value)


def connector_mapping(value: Any) -> dict[Any, Any]:
    """E002 unless CONNECTORS is a dict."""
    if not isinstance(value, dict):
        raise InvalidSetting(
            gettext(
                "CONNECTOR_OUTBOX['CONNECTORS'] must be a dict of source name -> "
                "{'BACKEND': ..., 'OPTIONS': {...}}, not %(type)s."
            )
            % {"type": a_type_of(value)},
            "E002",
        )
    return value


def source_config(source: Any, config: Any) -> dict[str, Any]:
    """E002 unless `source` is a valid name and `config` a dict of BACKEND path and OPTIONS dict.

    Values are named by their type only where they may hold a secret (OPTIONS, a whole entry).
    """
    where = f"CONNECTOR_OUTBOX['CONNECTORS'][{source!r}]"
    if not isinstance(source, str) or not 0 < len(source) <= SOURCE_LENGTH:
        raise InvalidSetting(
            gettext("%(where)s: a source name must be a non-empty string of at most %(length)s characters.")
            % {"where": where, "length": SOURCE_LENGTH},
            "E002",
        )
    if not isinstance(config, dict):
        raise InvalidSetting(
            gettext(
                "%(where)s must be a dict with a 'BACKEND' path and an optional 'OPTIONS' dict, not %(type)s."
            )
            % {"where": where, "type": a_type_of(config)},
            "E002",
        )
    for key in config:
        if key not in SOURCE_KEYS:
            raise InvalidSetting(
                gettext("%(where)s has an unknown key %(key)r.") % {"where": where, "key": key},
                "E002",
                gettext("Known: %(known)s.") % {"known": ", ".join(SOURCE_KEYS)},
            )
    if "BACKEND" not in config:
        raise InvalidSetting(
            gettext("%(where)s has no 'BACKEND'.") % {"where": where},
            "E002",
            gettext(
                "Set it to the dotted path of a Connector class, such as "
                "'django_connector_outbox.connectors.slack.SlackConnector'."
            ),
        )
    if not isinstance(config["BACKEND"], str):
        raise InvalidSetting(
            gettext(
                "%(where)s['BACKEND'] must be the dotted path of a Connector class (a string), not %(value)r."
            )
            % {"where": where, "value": config["BACKEND"]},
            "E002",
        )
    if not isinstance(config.get("OPTIONS", {}), dict):
        raise InvalidSetting(
            gettext("%(where)s['OPTIONS'] must be a dict of the connector's options, not %(type)s.")
            % {"where": where, "type": a_type_of(config["OPTIONS"])},
            "E002",
        )
    return config


def store(name: str, value: Any) -> str:
    """E010 unless `value` is one of STORES."""
    if value not in STORES or not isinstance(value, str):
        raise InvalidSetting(
            gettext('CONNECTOR_OUTBOX[\'%(name)s\'] must be "auto" or "orm", not %(value)r.')
            % {"name": name, "value": value},
            "E010",
        )
    return value


def delivery(name: str, value: Any) -> str:
    """E013 unless `value` is one of DELIVERIES."""
    if value not in DELIVERIES or not isinstance(value, str):
        raise InvalidSetting(
            gettext('CONNECTOR_OUTBOX[\'%(name)s\'] must be "sender" or "immediate", not %(value)r.')
            % {"name": name, "value": value},
            "E013",
        )
    return value


# The extra (pyproject.toml) that installs what a shipped connector's module imports.
EXTRAS = {
    "django_connector_outbox.connectors.slack": "slack",  # slack-sdk
    "django_connector_outbox.connectors.discord": "discord",  # httpx
    "django_connector_outbox.connectors.webhook": "webhook",  # httpx
    "django_connector_outbox.connectors.telegram": "telegram",  # httpx
    "django_connector_outbox.connectors.mattermost": "mattermost",  # httpx
    "django_connector_outbox.connectors.teams": "teams",  # httpx
    "django_connector_outbox.connectors.google_chat": "google-chat",  # httpx, google-auth
}


def connector_class(source: str, config: dict[str, Any]) -> type[Connector]:
    """The BACKEND class of a well-formed entry (see `source_config`): E003 when it cannot be
    imported, E004 when it is not a Connector class."""
    from django_connector_outbox.connectors.base import Connector  # connectors/ imports conf

    where = {"source": source, "backend": config["BACKEND"]}
    try:
        backend = import_string(config["BACKEND"])
    except Exception as e:  # noqa: BLE001 - ImportError, or any error the module raises as it is imported
        extra = EXTRAS.get(config["BACKEND"].rpartition(".")[0])
        hint = (
            gettext("Install what it needs: %(command)s.")
            % {"command": f'pip install "django-connector-outbox[{extra}]"'}
            if extra and isinstance(e, ModuleNotFoundError)
            else None
        )
        raise InvalidSetting(
            gettext(
                "CONNECTOR_OUTBOX['CONNECTORS'][%(source)r]: BACKEND %(backend)r cannot be imported: %(error)s"
            )
            % {**where, "error": e},
            "E003",
            hint,
        ) from e
    if not (isinstance(backend, type) and issubclass(backend, Connector)):
        raise InvalidSetting(
            gettext(
                "CONNECTOR_OUTBOX['CONNECTORS'][%(source)r]: BACKEND %(backend)r is not a Connector subclass."
            )
            % where,
            "E004",
        )
    return backend


def connector_kinds(source: str, config: dict[str, Any]) -> frozenset[str]:
    """The kinds that `source` takes, from its connector class (`Connector.kinds_for`) and
    OPTIONS, without building a connector: E003/E004 for its BACKEND, E021 unless they are
    known kinds. (A connector that cannot be built from its OPTIONS is E005, by the checks.)"""
    backend = connector_class(source, config)
    where = f"CONNECTOR_OUTBOX['CONNECTORS'][{source!r}]"
    try:
        kinds = backend.kinds_for(config.get("OPTIONS", {}))
    except Exception as e:  # noqa: BLE001 - any failure to read them is a configuration error to report
        raise InvalidSetting(
            gettext("%(where)s: the kinds of its connector cannot be read from its OPTIONS: %(error)s")
            % {"where": where, "error": e},
            "E021",
        ) from e
    if not isinstance(kinds, frozenset) or not kinds <= set(Kind.values):
        raise InvalidSetting(
            gettext("%(where)s: %(backend)s.kinds_for() must return a frozenset of %(known)s, not %(value)r.")
            % {"where": where, "backend": config["BACKEND"], "known": ", ".join(Kind.values), "value": kinds},
            "E021",
        )
    return kinds


def secret_keys(name: str, value: Any) -> tuple[str, ...] | None:
    """E012 unless `value` is None or a non-empty list/tuple of Fernet keys (url-safe base64
    of 32 random bytes, as ``Fernet.generate_key()`` makes them)."""
    if value is None:
        return None
    hint = gettext("Make one with: %(command)s") % {
        "command": 'python -c "from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())"'
    }
    if not isinstance(value, (list, tuple)) or not value:
        raise InvalidSetting(
            gettext("CONNECTOR_OUTBOX['%(name)s'] must be None or a non-empty list of keys, not %(type)s.")
            % {
                "name": name,
                "type": gettext("an empty %(type)s") % {"type": type(value).__name__}
                if isinstance(value, (list, tuple))
                else a_type_of(value),
            },
            "E012",
            hint,
        )
    for index, key in enumerate(value):
        if not _is_fernet_key(key):
            # Never the key itself in the message: it is a secret, even when malformed.
            raise InvalidSetting(
                gettext(
                    "CONNECTOR_OUTBOX['%(name)s'][%(index)s] is not a Fernet key (url-safe base64 of 32 bytes)."
                )
                % {"name": name, "index": index},
                "E012",
                hint,
            )
    return tuple(k.decode() if isinstance(k, bytes) else k for k in value)


def _is_fernet_key(key: Any) -> bool:
    if not isinstance(key, (str, bytes)):
        return False
    try:
        return len(urlsafe_b64decode(key)) == 32
    except (binascii.Error, ValueError):
        return False


# The rule of each setting but CONNECTORS (whose entries are checked one by one).
RULES: dict[str, Callable[[str, Any], object]] = {
    "LEASE": duration,
    "MAX_ATTEMPTS": count,
    "RETRY_BASE": duration,
    "RETRY_MAX": duration,
    "RETRY_JITTER": fraction,
    "CLAIM_BATCH": count,
    "POLL_INTERVAL": duration,
    "RETENTION": duration,
    "ATTENTION_RETENTION": duration,
    "STATUS_RETENTION": duration_or_none,
    "MAX_BODY_BYTES": count,
    "MAX_HOLD": duration,
    "STORE": store,
    "SECRET_KEYS": secret_keys,
    "DELIVERY": delivery,
}


def parse_pace(value: Any, where: str) -> dict[Scope, Pace]:
    """A PACE (a source's setting, or a connector's `pace`) as {Scope: Pace}.

    Raises ValueError with a message that starts with `where` (the setting's name) and says
    what is wrong; the system check E020 reports the same message.
    """
    if not isinstance(value, dict):
        raise ValueError(
            gettext("%(where)s must be a dict of scope -> (count, seconds), not %(value)r.")
            % {"where": where, "value": value}
        )
    pace: dict[Scope, Pace] = {}
    for scope, limit in value.items():
        if scope not in Scope.values:
            raise ValueError(
                gettext("%(where)s has an unknown scope %(scope)r; scopes: %(scopes)s.")
                % {"where": where, "scope": scope, "scopes": ", ".join(Scope.values)}
            )
        count, per = limit if isinstance(limit, (tuple, list)) and len(limit) == 2 else (None, None)
        try:
            duration = seconds(per)  # type: ignore[arg-type]  # anything: a TypeError is the answer
        except TypeError:
            duration = math.nan
        if (
            isinstance(count, bool)
            or not isinstance(count, int)
            or count < 1
            or not 0 < duration <= MAX_DURATION
        ):
            raise ValueError(
                gettext(
                    "%(where)s[%(scope)r] must be (count, seconds): a positive int, and a positive number of "
                    "seconds or a timedelta of at most %(max)s (ten years), not %(value)r."
                )
                % {"where": where, "scope": scope, "max": MAX_DURATION, "value": limit}
            )
        pace[Scope(scope)] = Pace(count, duration)
    return pace


class Settings:
    """The settings, each checked by its rule as it is read (a source's pace: once, see `pace`)."""

    def __init__(self) -> None:
        self._paces: dict[str, dict[Scope, Pace]] = {}  # source -> its parsed pace
        self._kinds: dict[str, frozenset[str]] = {}  # source -> the kinds it takes
        self._message_checks: dict[str, MessageCheck] = {}  # source -> its message_problem
        self._workspace_required: dict[str, bool] = {}  # source -> Connector.workspace_required

    def clear_cache(self) -> None:
        """Forget the parsed paces, kinds and message checks: the next read reads the settings again."""
        # New dicts: a read under way still fills the old ones.
        self._paces = {}
        self._kinds = {}
        self._message_checks = {}
        self._workspace_required = {}

    def user(self) -> dict[Any, Any]:
        """``settings.CONNECTOR_OUTBOX``; E001 unless it is a dict."""
        user = getattr(settings, "CONNECTOR_OUTBOX", {})
        if not isinstance(user, dict):
            raise InvalidSetting(
                gettext("CONNECTOR_OUTBOX must be a dict, not %(type)s.") % {"type": a_type_of(user)}, "E001"
            )
        return user

    def raw(self, name: str) -> Any:
        """The value of `name` as given (or its default), unchecked; E001 for an unknown key."""
        user = self.user()
        for key in user:
            known_key(key)
        return user.get(name, DEFAULTS[name])

    @property
    def CONNECTORS(self) -> dict[str, dict[str, Any]]:
        configured = connector_mapping(self.raw("CONNECTORS"))
        for source, config in configured.items():
            source_config(source, config)
        return configured

    @property
    def LEASE(self) -> float:
        return duration("LEASE", self.raw("LEASE"))

    @property
    def MAX_ATTEMPTS(self) -> int:
        return count("MAX_ATTEMPTS", self.raw("MAX_ATTEMPTS"))

    @property
    def RETRY_BASE(self) -> float:
        return duration("RETRY_BASE", self.raw("RETRY_BASE"))

    @property
    def RETRY_MAX(self) -> float:
        return duration("RETRY_MAX", self.raw("RETRY_MAX"))

    @property
    def RETRY_JITTER(self) -> float:
        return fraction("RETRY_JITTER", self.raw("RETRY_JITTER"))

    @property
    def CLAIM_BATCH(self) -> int:
        return count("CLAIM_BATCH", self.raw("CLAIM_BATCH"))

    @property
    def POLL_INTERVAL(self) -> float:
        return duration("POLL_INTERVAL", self.raw("POLL_INTERVAL"))

    @property
    def RETENTION(self) -> float:
        return duration("RETENTION", self.raw("RETENTION"))

    @property
    def ATTENTION_RETENTION(self) -> float:
        return duration("ATTENTION_RETENTION", self.raw("ATTENTION_RETENTION"))

    @property
    def STATUS_RETENTION(self) -> float | None:
        return duration_or_none("STATUS_RETENTION", self.raw("STATUS_RETENTION"))

    @property
    def MAX_BODY_BYTES(self) -> int:
        return count("MAX_BODY_BYTES", self.raw("MAX_BODY_BYTES"))

    @property
    def MAX_HOLD(self) -> float:
        return duration("MAX_HOLD", self.raw("MAX_HOLD"))

    @property
    def STORE(self) -> str:
        return store("STORE", self.raw("STORE"))

    @property
    def SECRET_KEYS(self) -> tuple[str, ...] | None:
        return secret_keys("SECRET_KEYS", self.raw("SECRET_KEYS"))

    @property
    def DELIVERY(self) -> str:
        return delivery("DELIVERY", self.raw("DELIVERY"))

    def pace(self, source: str) -> dict[Scope, Pace]:
        """The pacing of `source`: its "PACE" if given (``{}``: none), else its connector class's
        `pace`. ImproperlyConfigured for an unknown source; ValueError for a bad pace (E020).

        Every claim reads it, so it is parsed once per source (a copy is returned: callers may
        change theirs) until ``CONNECTOR_OUTBOX`` changes; errors are not cached.
        """
        paces = self._paces  # the settings' own: `clear_cache` replaces it, never empties it
        if (pace := paces.get(source)) is None:
            pace = paces[source] = self._parse_pace(source)
        return dict(pace)

    def kinds(self, source: str) -> frozenset[str]:
        """The kinds that `source` takes (`connector_kinds`), read from its connector class and
        OPTIONS without building a connector (a Slack connector builds its WebClient), once
        per source until ``CONNECTOR_OUTBOX`` changes; errors are not cached.
        ImproperlyConfigured for an unknown source or a bad entry."""
        known = self._kinds  # the settings' own: `clear_cache` replaces it, never empties it
        if (kinds := known.get(source)) is None:
            kinds = known[source] = connector_kinds(source, self._source(source))
        return kinds

    def message_check(self, source: str) -> MessageCheck:
        """`message_problem` of `source`'s connector class with its OPTIONS given: why a
        Message cannot be shown there, or None. Read without building a connector, like `kinds`,
        once per source until ``CONNECTOR_OUTBOX`` changes."""
        known = self._message_checks  # the settings' own: `clear_cache` replaces it
        if (check := known.get(source)) is None:
            config = self._source(source)
            backend = connector_class(source, config)
            check = known[source] = functools.partial(
                backend.message_problem, options=config.get("OPTIONS", {})
            )
        return check

    def workspace_required(self, source: str) -> bool:
        """Whether `source`'s posts need a non-empty workspace_id (`Connector.workspace_required`),
        read from its connector class once per source, like `kinds`."""
        known = self._workspace_required  # the settings' own: `clear_cache` replaces it
        if (required := known.get(source)) is None:
            required = known[source] = connector_class(source, self._source(source)).workspace_required
        return required

    def _source(self, source: str) -> dict[str, Any]:
        """The entry of `source` in CONNECTORS; ImproperlyConfigured for an unknown source."""
        config = self.CONNECTORS.get(source)
        if config is None:
            raise ImproperlyConfigured(
                gettext("Unknown connector outbox source %(source)r.") % {"source": source}
            )
        return config

    def _parse_pace(self, source: str) -> dict[Scope, Pace]:
        config = self._source(source)
        if "PACE" in config:
            return parse_pace(config["PACE"], f"CONNECTOR_OUTBOX['CONNECTORS'][{source!r}]['PACE']")
        backend = config["BACKEND"]
        return parse_pace(import_string(backend).pace, f"{backend}.pace")


conf = Settings()


def _clear_cache(*, setting: str, **kwargs: Any) -> None:
    if setting == "CONNECTOR_OUTBOX":
        conf.clear_cache()


setting_changed.connect(_clear_cache, dispatch_uid="connector_outbox_conf_clear_cache")
