"""A small project that queues posts next to its own data; settings come from the environment.

DATABASE_URL   default sqlite:///db.sqlite3 (postgres://... or mysql://... work too)
OUTBOX_BACKEND default the console connector (prints each post); set SLACK_BOT_TOKEN to
               post to Slack instead.
EMAIL_BACKEND  default Django's console backend: the "mail" source's emails are printed.
"""

from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent
env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env")

SECRET_KEY = env("SECRET_KEY", default="example-only-not-secret")
DEBUG = env.bool("DEBUG", default=True)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost"])
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "example_project.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Senders and web requests write at once: let them wait for each other, not fail.
    DATABASES["default"].setdefault("OPTIONS", {})["transaction_mode"] = "IMMEDIATE"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rangefilter",
    "django_connector_outbox",
    "shop",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
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

if env("SLACK_BOT_TOKEN", default=""):
    CHAT = {
        "BACKEND": "django_connector_outbox.connectors.slack.SlackConnector",
        "OPTIONS": {"token": env("SLACK_BOT_TOKEN")},
    }
else:
    CHAT = {"BACKEND": "django_connector_outbox.connectors.console.ConsoleConnector"}

# The team's mailbox gets the same Message as the chat, as a multipart email (text and
# HTML); Django's console email backend prints it rather than sending it.
EMAIL_BACKEND = env("EMAIL_BACKEND", default="django.core.mail.backends.console.EmailBackend")
DEFAULT_FROM_EMAIL = "shop@example.com"
MAIL = {"BACKEND": "django_connector_outbox.connectors.email.EmailConnector", "OPTIONS": {"timeout": 10}}

CONNECTOR_OUTBOX = {
    "CONNECTORS": {"chat": CHAT, "mail": MAIL},
    "LEASE": 30,
}

# The outbox logs to its own loggers and lets them propagate: one handler on the root logger
# shows the sender's lines (README, "Logging").
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {"django_connector_outbox": {"level": "INFO"}},
}
