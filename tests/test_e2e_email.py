"""End to end: four `run_outbox` processes send email through Django's SMTP backend to a fake
SMTP server (tests/fakes/smtp.py) in this process.

Ten recipients, six messages each, queued in one transaction; the server answers some of them
with a 4xx at RCPT or after the message (retried), a 5xx (the post fails), a connection dropped
before DATA (nothing taken: sent again) or after the message was taken (the reply lost: the post
ends `uncertain` after its lease, since no mail API can look a message up, and is never sent
twice). Checked: every post finished as scripted, each recipient got its messages in queue
order, every message the server took carries its post's Message-ID, and no Message-ID was taken
twice. With -s it prints one summary line.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
from django.db import transaction

from django_connector_outbox import Outbox
from django_connector_outbox.connectors.email import message_id
from django_connector_outbox.models import Post
from tests.fakes.smtp import FakeSmtp

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SENDERS = 4
RECIPIENTS = [f"r{n}@example.org" for n in range(10)]
PER_RECIPIENT = 6
# LEASE: a lost reply is settled `uncertain` only once its lease has run out, so short; but a
# send that outlives its lease ends `uncertain` too (no lookup), and the first sends of four
# processes starting at once on a small machine are slow (imports, the host's name): 5 s.
CONFIG = {
    "CONNECTORS": {
        "mail": {
            "BACKEND": "django_connector_outbox.connectors.email.EmailConnector",
            "OPTIONS": {"from_email": "Outbox <outbox@example.com>", "timeout": 1},
        }
    },
    "LEASE": 5,
    "POLL_INTERVAL": 0.2,
    "RETRY_BASE": 0.1,
    "RETRY_MAX": 0.5,
    "RETRY_JITTER": 0,
}
# recipient -> the server's answers to its first messages, in order
SCRIPTS = {
    "r1@example.org": ["rcpt_4xx", "rcpt_4xx"],
    "r2@example.org": ["pass", "data_4xx"],
    "r3@example.org": ["drop_before_data", "pass", "drop_before_data"],
    "r4@example.org": ["drop_after_data"],
    "r5@example.org": ["pass", "rcpt_5xx"],
    "r6@example.org": ["pass", "pass", "pass", "drop_after_data"],
    "r7@example.org": ["data_5xx"],
}
UNCERTAIN = {"r4@example.org:0", "r6@example.org:3"}
FAILED = {"r5@example.org:1", "r7@example.org:0"}


def test_email_through_smtp_with_four_senders(settings, monkeypatch, senders):
    settings.CONNECTOR_OUTBOX = CONFIG
    with FakeSmtp() as fake:
        for recipient, actions in SCRIPTS.items():
            fake.script(recipient, *actions)
        monkeypatch.setenv("OUTBOX_PROOF_SMTP_PORT", str(fake.port))
        outbox = Outbox("mail")
        with transaction.atomic():
            for n in range(PER_RECIPIENT):
                for to in RECIPIENTS:
                    body = {"subject": f"Post {n}", "text": f"Message {n} to {to}."}
                    outbox.queue(f"{to}:{n}", workspace_id="w", container_id=to, body=body)
        started = time.monotonic()
        senders.start_many(SENDERS, CONFIG, "--concurrency", "4")
        senders.wait_until_finished("every post")
        elapsed = time.monotonic() - started
        senders.stop_all()
        log = senders.stderr()

        states = dict(Post.objects.values_list("post_id", "state"))
        refs = dict(Post.objects.values_list("post_id", "message_ref"))
        errors = dict(Post.objects.exclude(last_error="").values_list("post_id", "last_error"))
        taken = Counter(m.message_id for m in fake.messages)
        duplicates = sum(count - 1 for count in taken.values())

    expected = {
        pid: "uncertain" if pid in UNCERTAIN else "failed" if pid in FAILED else "posted" for pid in states
    }
    assert states == expected, f"{errors}\n{log}"
    assert duplicates == 0, [mid for mid, count in taken.items() if count > 1]
    for post_id, state in states.items():
        mid = message_id("mail", post_id, "example.com")
        assert taken[mid] == (0 if state == "failed" else 1), post_id
        if state == "posted":
            assert refs[post_id] == mid
    for to in RECIPIENTS:
        order = [m.subject for m in fake.to(to)]
        assert order == sorted(order, key=lambda s: int(s.split()[-1])), f"{to} got {order}"
    statuses = fake.statuses
    print(
        f"\nemail e2e: {len(states)} posts by {SENDERS} senders in {elapsed:.1f}s: "
        f"{Counter(states.values())['posted']} posted, {statuses[450] + statuses[451]} 4xx retried, "
        f"{statuses[550] + statuses[554]} 5xx failed, {statuses[0]} dropped connections "
        f"({len(UNCERTAIN)} after DATA -> uncertain), {len(fake.messages)} messages taken, "
        f"duplicates {duplicates}"
    )
