"""End to end: four `run_outbox` processes on PostgreSQL against a fake Telegram Bot API that
enforces the documented limits (one message a second per chat, 20 a minute per group, 30 a
second per bot) with the connector's default pace.

Posts in three private chats and a group, a status edited twice, a reaction, two scripted 429s
and a lost reply. Telegram has no lookup, so the post whose reply was lost ends `uncertain`
(never sent twice) and its chat goes on after it. Every other post is posted exactly once, in
queue order per chat; no chat's writes outrun its limit. With ``-s`` it prints one summary line.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest
from django.db import connection, transaction
from django.test import override_settings

from django_connector_outbox import Outbox
from django_connector_outbox.fakes import telegram as ft
from django_connector_outbox.fakes.base import Limit, within_pace
from django_connector_outbox.models import Post
from tests.proof_connectors import Senders

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

TOKEN = "123456789:e2e-TELEGRAM-TOKEN_x9Qv"
PRIVATE = ("1001", "1002", "1003")
GROUP = "-100500"
PER_CHAT = 5
# A reply slower than `timeout` would be a lost reply, and with no lookup an `uncertain` post:
# room enough that a loaded machine does not make more than the one scripted.
OUTBOX = {"LEASE": 6, "POLL_INTERVAL": 0.2, "RETRY_JITTER": 0}


def test_four_senders_deliver_to_telegram_once_each_in_order_within_its_limits(senders):
    if connection.vendor != "postgresql":
        pytest.skip("the end-to-end run is on PostgreSQL")
    with ft.running(
        token=TOKEN,
        chats=(*PRIVATE, GROUP),
        chat_limit=Limit(2, 2.0),  # one a second, with a short burst
        group_limit=Limit(20, 60.0),
        bot_limit=Limit(30, 1.0),
    ) as fake:
        person = fake.add_message(int(PRIVATE[1]))
        fake.script("sendMessage", ft.drop())  # the first create's reply is lost
        fake.script("sendMessage", ft.ratelimit(1), times=2)
        settings: dict[str, Any] = {
            "CONNECTORS": {
                "telegram": {
                    "BACKEND": "django_connector_outbox.connectors.telegram.TelegramConnector",
                    "OPTIONS": {"token": TOKEN, "base_url": fake.base_url, "timeout": 2.0},
                }
            },
            **OUTBOX,
        }
        with override_settings(CONNECTOR_OUTBOX=settings):
            run(fake, settings, senders, person)


def run(fake: ft.FakeTelegram, settings: dict[str, Any], senders: Senders, person: int) -> None:
    outbox = Outbox("telegram")
    with transaction.atomic():
        for chat in (*PRIVATE, GROUP):
            for n in range(PER_CHAT if chat != GROUP else 3):
                place = {"workspace_id": "outbox_bot", "container_id": chat}
                outbox.queue(f"{chat}-{n}", **place, body={"text": f"post {chat}-{n}"})
        outbox.set_status("status", workspace_id="outbox_bot", container_id=PRIVATE[0], body={"text": "v1"})
        outbox.queue(
            "reaction",
            workspace_id="outbox_bot",
            container_id=PRIVATE[1],
            kind="reaction",
            body={"message_id": person, "reaction": "👍"},
        )
    started = time.monotonic()
    senders.start_many(4, settings, "--concurrency", "2")
    senders.wait_until_finished("the first batch")
    for text in ("v2", "v3"):
        outbox.set_status("status", workspace_id="outbox_bot", container_id=PRIVATE[0], body={"text": text})
        senders.wait_until_finished(f"the edit to {text}")
    elapsed = time.monotonic() - started
    senders.stop_all()

    states = Counter(Post.objects.filter(source="telegram").values_list("state", flat=True))
    [lost] = Post.objects.filter(source="telegram", state="uncertain")
    assert "cannot read a chat's history" in lost.last_error
    assert states == {"posted": len(PRIVATE) * PER_CHAT + 3 + 2 - 1, "uncertain": 1}

    copies: Counter[str] = Counter()
    for chat in (*PRIVATE, GROUP):
        texts = [m.text for m in fake.messages(int(chat)) if m.text.startswith("post ")]
        copies.update(texts)
        expected = [f"post {chat}-{n}" for n in range(PER_CHAT if chat != GROUP else 3)]
        assert texts == expected, f"chat {chat}: {texts}"  # in order, the lost one included
        writes = fake.accepted_times(chat)
        assert within_pace(writes, 2, 2.0), f"chat {chat} outran one a second"
    duplicates = sum(n - 1 for n in copies.values())
    assert duplicates == 0
    [status] = [m for m in fake.messages(int(PRIVATE[0])) if not m.text.startswith("post ")]
    assert (status.text, status.edited) == ("v3", True)
    edits = len(fake.calls_of("editMessageText"))
    assert edits == 2
    assert fake.messages(int(PRIVATE[1]))[0].reactions == [{"type": "emoji", "emoji": "👍"}]
    assert fake.statuses[429] >= 2
    print(
        f"\ntelegram e2e: {states['posted']} posted, {fake.statuses[429]} 429s "
        f"({dict(fake.limited)} enforced), 1 lost reply -> {states['uncertain']} uncertain, "
        f"{edits} edits, {duplicates} duplicates, 4 senders, {elapsed:.1f}s"
    )
