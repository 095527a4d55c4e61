"""Settings of the test suite; the database comes from DATABASE_URL (SQLite by default)."""

from pathlib import Path

import environ

env = environ.Env()
BASE_DIR = Path(__file__).resolve().parent

SECRET_KEY = "tests-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "tests.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DATABASES = {"default": env.db("DATABASE_URL", default="sqlite:///" + str(BASE_DIR / "outbox-tests.sqlite3"))}
# Sender processes started by the tests connect to the test database under this name.
if env("TEST_DATABASE_NAME", default=""):
    DATABASES["default"]["NAME"] = env("TEST_DATABASE_NAME")
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # BEGIN IMMEDIATE: each transaction takes the write lock up front, so two writers
    # queue behind each other instead of failing with "database is locked".
    DATABASES["default"].setdefault("OPTIONS", {})["transaction_mode"] = "IMMEDIATE"
    # A file, not memory: tests start real sender processes against the test database.
    DATABASES["default"]["TEST"] = {
        "NAME": env("SQLITE_TEST_NAME", default=str(BASE_DIR / "test-outbox.sqlite3"))
    }
if DATABASES["default"]["ENGINE"] == "django.db.backends.mysql":
    # The same test database under REPEATABLE READ, a setting Django supports for MySQL: the
    # outbox's fencing must hold there too (tests/test_outbox_repeatable_read.py).
    DATABASES["repeatable_read"] = {
        **DATABASES["default"],
        "OPTIONS": {**DATABASES["default"].get("OPTIONS", {}), "isolation_level": "repeatable read"},
        "TEST": {"MIRROR": "default"},
    }

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rangefilter",
    "django_connector_outbox",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
STATIC_URL = "/static/"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

CONNECTOR_OUTBOX = {
    "CONNECTORS": {
        "memory": {"BACKEND": "django_connector_outbox.connectors.memory.MemoryConnector"},
        "other": {"BACKEND": "django_connector_outbox.connectors.memory.MemoryConnector"},
    },
    # OUTBOX_STORE=orm runs the suite through the ORM store on PostgreSQL too (tox.ini).
    "STORE": env("OUTBOX_STORE", default="auto"),
}
