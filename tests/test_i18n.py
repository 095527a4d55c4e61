"""Translations: what the admin, the checks (the connectors' own too), the commands and the Slack
install pages show is in the operator's language, and the catalogs (locale/) list every message
of the code, those of the admin, the checks and the install pages all translated.

The catalogs are checked against the code by running `makemessages` into a copy of the package
(never into the checkout) and `compilemessages` there: they need GNU gettext (apt-get install
gettext; ./runtests installs it).
"""

from __future__ import annotations

import ast
import gettext
import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core import checks
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.urls import reverse
from django.utils import translation

from django_connector_outbox.posts import State
from tests.test_admin import CHANGELIST, act, change_url, make, messages_of

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "django_connector_outbox"
LANGUAGES = ("de", "fr", "es", "pt_BR")
# The files whose strings each of these shows: each of their messages is translated in every
# language, and there are at least that many of them (a pattern that no longer matches fails).
SHOWN_BY = {
    "the admin": (
        re.compile(
            r"(admin\.py|installations/admin\.py|senders_admin\.py|message_admin\.py|models\.py|posts\.py|apps\.py|templates/admin/.*)"
        ),
        150,
    ),
    "the checks": (re.compile(r"(checks\.py|conf\.py|connectors/.*\.py)"), 100),
    "the Slack install pages": (
        re.compile(r"(installations/slack_views\.py|templates/django_connector_outbox/.*)"),
        20,
    ),
}


def catalog(path: Path) -> dict[str, dict[str, Any]]:
    """The entries of a .po file by msgid: their references (`refs`), `msgid_plural` and msgstrs."""
    entries: dict[str, dict[str, Any]] = {}
    for block in path.read_text(encoding="utf-8").split("\n\n"):
        entry: dict[str, Any] = {"refs": []}
        key = None
        for line in block.splitlines():
            if line.startswith("#:"):
                entry["refs"] += [ref.rsplit(":", 1)[0] for ref in line[2:].split()]
            elif line.startswith("#"):
                continue
            elif match := re.match(r"^(msgid|msgid_plural|msgstr(?:\[\d\])?) (\".*\")$", line):
                key = match[1]
                entry[key] = ast.literal_eval(match[2])
            elif line.startswith('"') and key:
                entry[key] += ast.literal_eval(line)
        if entry.get("msgid"):
            entries[entry["msgid"]] = entry
    return entries


def translations(entry: dict[str, Any]) -> list[str]:
    return [value for key, value in entry.items() if key.startswith("msgstr")]


def shown_by(files: re.Pattern[str], entry: dict[str, Any]) -> bool:
    return any(files.fullmatch(ref) for ref in entry["refs"])


def manage(*args: str, cwd: Path) -> None:
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "tests.settings"}
    subprocess.run(
        [sys.executable, "-m", "django", *args], cwd=cwd, env=environment, check=True, capture_output=True
    )


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the package whose catalogs `makemessages` made again from the code."""
    if shutil.which("msgmerge") is None:
        pytest.fail("GNU gettext is needed to check the catalogs: apt-get install gettext")
    copy = tmp_path_factory.mktemp("i18n") / "django_connector_outbox"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    manage("makemessages", *(f"-l{lang}" for lang in LANGUAGES), "--no-obsolete", cwd=copy)
    manage("compilemessages", cwd=copy)
    return copy


@pytest.mark.parametrize("lang", LANGUAGES)
def test_the_catalogs_list_every_message_of_the_code(regenerated: Path, lang: str) -> None:
    committed = catalog(PACKAGE / "locale" / lang / "LC_MESSAGES" / "django.po")
    made = catalog(regenerated / "locale" / lang / "LC_MESSAGES" / "django.po")
    assert sorted(set(made) - set(committed)) == []
    assert sorted(set(committed) - set(made)) == []  # none left over from code that is gone


@pytest.mark.parametrize("shown", SHOWN_BY)
@pytest.mark.parametrize("lang", LANGUAGES)
def test_every_message_of_the_admin_the_checks_and_the_install_pages_is_translated(
    regenerated: Path, lang: str, shown: str
) -> None:
    files, at_least = SHOWN_BY[shown]
    committed = catalog(PACKAGE / "locale" / lang / "LC_MESSAGES" / "django.po")
    made = catalog(regenerated / "locale" / lang / "LC_MESSAGES" / "django.po")
    messages = [msgid for msgid, entry in made.items() if shown_by(files, entry)]
    assert len(messages) > at_least
    assert [m for m in messages if m in committed and not all(translations(committed[m]))] == []
    # A fuzzy entry (msgmerge's guess from a similar msgid) is left out of the compiled catalog.
    text = (PACKAGE / "locale" / lang / "LC_MESSAGES" / "django.po").read_text(encoding="utf-8")
    assert re.findall(r"^#,.*\bfuzzy\b", text, re.M) == []


@pytest.mark.parametrize("lang", LANGUAGES)
def test_the_compiled_catalogs_are_those_of_the_po_files(lang: str) -> None:
    folder = PACKAGE / "locale" / lang / "LC_MESSAGES"
    with (folder / "django.mo").open("rb") as mo:
        compiled = gettext.GNUTranslations(mo)
    stale = []
    for msgid, entry in catalog(folder / "django.po").items():
        if "msgid_plural" in entry:
            found = compiled.ngettext(msgid, entry["msgid_plural"], 1)
            expected = entry["msgstr[0]"] or msgid
        else:
            found, expected = compiled.gettext(msgid), entry["msgstr"] or msgid
        if found != expected:
            stale.append(msgid)
    assert stale == []


# -- in German ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_admins_list_its_actions_and_filters_speak_german(admin_client: Any) -> None:
    make("q1", State.QUEUED)
    with translation.override("de"):
        page = admin_client.get(CHANGELIST).content.decode()
    assert "Ausgewählte wartende Posts abbrechen" in page
    assert "Ausgewählte fehlgeschlagene oder ungewisse Posts erneut versuchen" in page
    assert "Ausgewählte abgeschlossene Posts löschen" in page
    assert "Braucht Aufmerksamkeit" in page
    assert "Ältester fälliger Post je Quelle" in page
    assert "Cancel selected queued posts" not in page


def test_a_check_speaks_german() -> None:
    with override_settings(CONNECTOR_OUTBOX={}), translation.override("de"):
        found = [m for m in checks.run_checks(databases=[]) if m.id == "connector_outbox.W001"]
    assert [(m.msg, m.hint) for m in found] == [
        (
            "Keine Quelle der Connector-Outbox ist konfiguriert: nichts kann eingereiht werden.",
            "Fügen Sie CONNECTOR_OUTBOX['CONNECTORS'] = {'name': {'BACKEND': ..., 'OPTIONS': {...}}} hinzu.",
        )
    ]


# One misconfigured source per platform, each with one error of its connector's own check().
CONNECTORS = "django_connector_outbox.connectors"
MISCONFIGURED = {
    "slack": {"BACKEND": f"{CONNECTORS}.slack.SlackConnector", "OPTIONS": {}},
    "mm": {
        "BACKEND": f"{CONNECTORS}.mattermost.MattermostConnector",
        "OPTIONS": {"url": "chat", "token": "t"},
    },
    "teams": {"BACKEND": f"{CONNECTORS}.teams.TeamsConnector", "OPTIONS": {"app_password": "p"}},
    "tg": {"BACKEND": f"{CONNECTORS}.telegram.TelegramConnector", "OPTIONS": {"token": "bot1:a"}},
    "mail": {"BACKEND": f"{CONNECTORS}.email.EmailConnector", "OPTIONS": {"from_email": "nobody"}},
    "hook": {
        "BACKEND": f"{CONNECTORS}.webhook.WebhookConnector",
        "OPTIONS": {"url": "https://h.test", "timeout": 0},
    },
}
SAID = {
    "en": [
        (
            "connector_outbox.E101",
            "Connector outbox source 'slack': the Slack OPTIONS need a 'token'.",
            "Set OPTIONS['token'] to the app's bot token (xoxb-...), or OPTIONS['installations'] to True for "
            "an app installed in many workspaces.",
        ),
        (
            "connector_outbox.E214",
            "CONNECTOR_OUTBOX source 'hook': OPTIONS['timeout'] must be a positive number of seconds (or a "
            "timedelta), not 0.",
            None,
        ),
        (
            "connector_outbox.E231",
            "CONNECTOR_OUTBOX source 'mm': Mattermost needs the server's http(s) URL in OPTIONS['url'], not 'chat'.",
            "For example https://chat.example.com (the API is under /api/v4).",
        ),
        (
            "connector_outbox.E241",
            "CONNECTOR_OUTBOX source 'teams': Teams needs the bot's Microsoft App ID in OPTIONS['app_id'].",
            "The Azure Bot resource's Configuration page shows it.",
        ),
        (
            "connector_outbox.E251",
            "CONNECTOR_OUTBOX source 'tg': OPTIONS['token'] is not a Telegram bot token (digits, ':', then "
            "letters, digits, '_' or '-'), without the 'bot' prefix of the URL.",
            None,
        ),
        (
            "connector_outbox.E261",
            "CONNECTOR_OUTBOX source 'mail': the email sender 'nobody' is not an email address.",
            "Set OPTIONS['from_email'] (or DEFAULT_FROM_EMAIL) to 'name@example.com' or "
            "'Name <name@example.com>'.",
        ),
    ],
    "de": [
        (
            "connector_outbox.E101",
            "Quelle der Connector-Outbox 'slack': die Slack-OPTIONS brauchen ein 'token'.",
            "Setzen Sie OPTIONS['token'] auf das Bot-Token der App (xoxb-...) oder OPTIONS['installations'] "
            "auf True für eine App, die in vielen Workspaces installiert ist.",
        ),
        (
            "connector_outbox.E214",
            "CONNECTOR_OUTBOX-Quelle 'hook': OPTIONS['timeout'] muss eine positive Zahl von Sekunden (oder ein "
            "timedelta) sein, nicht 0.",
            None,
        ),
        (
            "connector_outbox.E231",
            "CONNECTOR_OUTBOX-Quelle 'mm': Mattermost braucht die http(s)-URL des Servers in OPTIONS['url'], "
            "nicht 'chat'.",
            "Zum Beispiel https://chat.example.com (die API liegt unter /api/v4).",
        ),
        (
            "connector_outbox.E241",
            "CONNECTOR_OUTBOX-Quelle 'teams': Teams braucht die Microsoft App ID des Bots in OPTIONS['app_id'].",
            "Die Seite Configuration der Azure-Bot-Ressource zeigt sie.",
        ),
        (
            "connector_outbox.E251",
            "CONNECTOR_OUTBOX-Quelle 'tg': OPTIONS['token'] ist kein Telegram-Bot-Token (Ziffern, ':', dann "
            "Buchstaben, Ziffern, '_' oder '-'), ohne das Präfix 'bot' der URL.",
            None,
        ),
        (
            "connector_outbox.E261",
            "CONNECTOR_OUTBOX-Quelle 'mail': der E-Mail-Absender 'nobody' ist keine E-Mail-Adresse.",
            "Setzen Sie OPTIONS['from_email'] (oder DEFAULT_FROM_EMAIL) auf 'name@example.com' oder "
            "'Name <name@example.com>'.",
        ),
    ],
    "fr": [
        (
            "connector_outbox.E101",
            "Source de la boîte d’envoi 'slack' : les OPTIONS Slack ont besoin d’un 'token'.",
            "Réglez OPTIONS['token'] sur le jeton de bot de l’application (xoxb-...), ou "
            "OPTIONS['installations'] sur True pour une application installée dans de nombreux espaces de travail.",
        ),
        (
            "connector_outbox.E214",
            "Source CONNECTOR_OUTBOX 'hook' : OPTIONS['timeout'] doit être un nombre positif de secondes (ou un "
            "timedelta), et non 0.",
            None,
        ),
        (
            "connector_outbox.E231",
            "Source CONNECTOR_OUTBOX 'mm' : Mattermost a besoin de l’URL http(s) du serveur dans OPTIONS['url'], "
            "et non 'chat'.",
            "Par exemple https://chat.example.com (l’API est sous /api/v4).",
        ),
        (
            "connector_outbox.E241",
            "Source CONNECTOR_OUTBOX 'teams' : Teams a besoin du Microsoft App ID du bot dans OPTIONS['app_id'].",
            "La page Configuration de la ressource Azure Bot l’affiche.",
        ),
        (
            "connector_outbox.E251",
            "Source CONNECTOR_OUTBOX 'tg' : OPTIONS['token'] n’est pas un jeton de bot Telegram (des chiffres, "
            "':', puis des lettres, chiffres, '_' ou '-'), sans le préfixe 'bot' de l’URL.",
            None,
        ),
        (
            "connector_outbox.E261",
            "Source CONNECTOR_OUTBOX 'mail' : l’expéditeur des e-mails 'nobody' n’est pas une adresse e-mail.",
            "Réglez OPTIONS['from_email'] (ou DEFAULT_FROM_EMAIL) sur 'name@example.com' ou "
            "'Name <name@example.com>'.",
        ),
    ],
}


@pytest.mark.parametrize("lang", SAID)
def test_the_connectors_checks_speak_the_operators_language(lang: str) -> None:
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": MISCONFIGURED}), translation.override(lang):
        found = checks.run_checks(databases=[])
    own = sorted(
        (m.id, m.msg, m.hint) for m in found if re.fullmatch(r"connector_outbox\.E[1-9]\d\d", m.id or "")
    )
    assert own == SAID[lang]


def test_a_connector_check_built_by_the_http_helpers_speaks_spanish_and_portuguese() -> None:
    # check_header_token and check_http_url word a message from the caller's phrase and their own.
    config = {
        "mm": {
            "BACKEND": f"{CONNECTORS}.mattermost.MattermostConnector",
            "OPTIONS": {"url": "https://m.test"},
        }
    }
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": config}):
        with translation.override("es"):
            spanish = [m.msg for m in checks.run_checks(databases=[]) if m.id == "connector_outbox.E232"]
        with translation.override("pt-br"):
            portuguese = [m.msg for m in checks.run_checks(databases=[]) if m.id == "connector_outbox.E232"]
    assert spanish == [
        "Origen de CONNECTOR_OUTBOX 'mm': Mattermost necesita un token de acceso de bot en OPTIONS['token'] "
        "(o 'installations': True)."
    ]
    assert portuguese == [
        "Origem de CONNECTOR_OUTBOX 'mm': o Mattermost precisa de um token de acesso de bot em OPTIONS['token'] "
        "(ou 'installations': True)."
    ]


@pytest.mark.django_db
def test_a_command_speaks_german() -> None:
    make("f1", State.FAILED)
    out = io.StringIO()
    with translation.override("de"), pytest.raises(CommandError) as unmatched:
        call_command("outbox_retry", "f1", "nope", stdout=out)
    assert out.getvalue().splitlines()[-1] == "1 erneut versucht"
    assert out.getvalue().startswith("erneut versucht: memory:f1 (failed, ")
    assert str(unmatched.value) == "kein Post passt zu nope"


@pytest.mark.django_db
@pytest.mark.parametrize("lang", LANGUAGES)
def test_every_admin_page_renders_in_each_language(admin_client: Any, lang: str) -> None:
    # Each translation keeps its placeholders: a page whose catalog lost one would fail here.
    posts = [make(f"p-{state}", state) for state in State]
    behind = make("behind", State.QUEUED, container=posts[0].container_id)
    uncertain = next(post for post in posts if post.state == State.UNCERTAIN)
    pages = [f"{CHANGELIST}?state=all", *(change_url(post) for post in [*posts, behind])]
    pages += [
        reverse(f"admin:django_connector_outbox_{model}_changelist")
        for model in ("gate", "installation", "destination", "heartbeat")
    ]
    with translation.override(lang):
        for url in pages:
            assert admin_client.get(url).status_code == 200, url
        confirmation = act(admin_client, "retry_posts", [uncertain])
    assert confirmation.status_code == 200
    assert "retry_confirmation" in confirmation.templates[0].name


@pytest.mark.django_db
def test_the_actions_messages_speak_german(admin_client: Any) -> None:
    failed, queued = make("f1", State.FAILED), make("q1", State.QUEUED)
    with translation.override("de"):
        retried = messages_of(act(admin_client, "retry_posts", [failed, queued]))
        cancelled = messages_of(act(admin_client, "cancel_posts", [queued]))
    assert retried == [
        "1 erneut versucht; 1 übersprungen: nur fehlgeschlagene und ungewisse Posts können erneut versucht "
        "werden (1 wartend)"
    ]
    assert cancelled == ["1 abgebrochen"]


@pytest.mark.django_db
def test_english_stays_the_default(admin_client: Any) -> None:
    make("q1", State.QUEUED)
    page = admin_client.get(CHANGELIST).content.decode()
    assert "Cancel selected queued posts" in page and "Needs attention" in page
