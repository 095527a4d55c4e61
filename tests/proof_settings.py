"""Settings of the sender processes that tests start: the test settings, with the outbox
settings of one test taken from the OUTBOX_PROOF_SETTINGS environment variable (JSON)."""

import json
import os

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES

CONNECTOR_OUTBOX = json.loads(os.environ["OUTBOX_PROOF_SETTINGS"])

if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # Commits need not wait for the disk here: the tests kill senders, never the server (a
    # restart is a clean shutdown), and the crash test records thousands of outcomes, each
    # in its own transaction.
    DATABASES["default"].setdefault("OPTIONS", {})["options"] = "-c synchronous_commit=off"
