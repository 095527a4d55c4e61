"""Sphinx configuration of the docs site.

The docs are Sphinx with MyST Markdown and the Furo theme, the convention of Django,
django-anymail and procrastinate: the pages stay Markdown that reads well on GitHub, and the
reference pages (settings, system checks, commands, metrics, the Python API) are generated
from the code by the extension in _ext/, so they cannot drift from it.

Build: ``sphinx-build -E -W --keep-going -b html docs docs/_build/html`` (tox -e docs; -E: the
reference pages are made afresh from the code, which Sphinx does not watch). With -W,
a link to a page or a heading that does not exist fails the build (MyST's cross-reference
warnings, with ``myst_heading_anchors``), as does a reference page whose source changed
without its words (see _ext/outbox_reference.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import django
from django.conf import settings

DOCS = Path(__file__).resolve().parent
sys.path[:0] = [str(DOCS.parent), str(DOCS / "_ext")]

# Autodoc imports the package's modules (the models among them): a minimal project.
settings.configure(
    INSTALLED_APPS=[
        "django.contrib.contenttypes",
        "django.contrib.auth",
        "django.contrib.admin",
        "django.contrib.sessions",
        "django.contrib.messages",
        "rangefilter",
        "django_connector_outbox",
    ],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
    USE_TZ=True,
    CONNECTOR_OUTBOX={
        "CONNECTORS": {"chat": {"BACKEND": "django_connector_outbox.connectors.console.ConsoleConnector"}}
    },
)
django.setup()

project = "django-connector-outbox"
copyright = "the django-connector-outbox authors"  # noqa: A001 - Sphinx's name
extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "outbox_reference",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext"]
html_theme = "furo"
html_title = project
# Furo's "view this page" and "edit this page" links, to the page's Markdown on GitHub.
html_theme_options = {
    "source_repository": "https://github.com/django-connector-outbox/django-connector-outbox/",
    "source_branch": "main",
    "source_directory": "docs/",
}

# Every heading up to this depth gets a slug anchor, so `page.md#a-heading` links are checked.
myst_heading_anchors = 4

# Every cross-reference autodoc makes must resolve, but for the names below: Python's and
# Django's own classes (the docs have no intersphinx: the build needs no network), the
# package's type aliases, and its internal classes that a public signature names.
nitpicky = True
nitpick_ignore = [("py:class", "Clock")]
nitpick_ignore_regex = [
    (
        r"py:.*",
        r"(datetime|collections|typing|enum|json|django|asgiref|logging|argparse|io|httpx|aiohttp|slack_sdk|types|abc)\..*",
    ),
    (
        r"py:.*",
        r"(str|int|float|bool|bytes|dict|list|tuple|set|frozenset|object|type|None|Any|Callable|Iterable|Iterator|Sequence|Mapping|Awaitable|Coroutine|Self|TypeVar|Exception|ValueError|TimeoutError|timedelta|datetime)",
    ),
    (r"py:class", r"django_connector_outbox\.(models|store)\..*"),
]

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
# The docstrings write names in single backticks (`claim`, `InvalidPost`): code, as in Markdown.
default_role = "code"
smartquotes = False  # "--once" stays two hyphens in the text
