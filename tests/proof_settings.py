"""Settings of the sender processes that tests start: the test settings, with the outbox
settings of one test taken from the OUTBOX_PROOF_SETTINGS environment variable (JSON)."""

import json
import os

import django

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES

CONNECTOR_OUTBOX = json.loads(os.environ["OUTBOX_PROOF_SETTINGS"])

if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # Commits need not wait for the disk here: the tests kill senders, never the server (a
    # restart is a clean shutdown), and the crash test records thousands of outcomes, each
    # in its own transaction.
    DATABASES["default"].setdefault("OPTIONS", {})["options"] = "-c synchronous_commit=off"

if "OUTBOX_PROOF_SMTP_PORT" in os.environ:
    # The email connector's end-to-end test: Django's SMTP backend, pointed at its fake server
    # (Django 6.1 configures mail with MAILERS; its EMAIL_* settings are deprecated).
    SMTP_PORT = int(os.environ["OUTBOX_PROOF_SMTP_PORT"])
    if django.VERSION >= (6, 1):
        MAILERS = {
            "default": {
                "BACKEND": "django.core.mail.backends.smtp.EmailBackend",
                "OPTIONS": {"host": "127.0.0.1", "port": SMTP_PORT},
            }
        }
    else:
        EMAIL_HOST, EMAIL_PORT = "127.0.0.1", SMTP_PORT
