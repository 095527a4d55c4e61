"""The webhook connector with ``installations: True``: each container's posts go to its own URL,
signed with its own secret (Destinations); a container without one is refused without a request,
and no destination URL or secret shows in a reason or a log line. Through both forms: the
blocking methods and the coroutines (the destination read off the loop)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.test import override_settings

from django_connector_outbox import Outbox
from django_connector_outbox.connectors import Delivered, Refused
from django_connector_outbox.connectors.webhook import WebhookConnector
from django_connector_outbox.fakes import webhook as fw
from django_connector_outbox.installations import Destinations
from django_connector_outbox.models import Post
from tests.connectors.helpers import claimed_post, in_form

ALERTS, SALES = "/hooks/alerts", "/hooks/sales-Xk29fLq81ZtR4mWp"
ALERTS_SECRET, SALES_SECRET = "alerts-signing-secret-1", "sales-signing-secret-2"
UNKNOWN_PATH_TOKEN = "Nq83kDfZ2pLs9WxYtR7v"
BACKEND = "django_connector_outbox.connectors.webhook.WebhookConnector"


@pytest.fixture
def fake() -> Iterator[fw.FakeWebhook]:
    with fw.running(hooks={ALERTS: ALERTS_SECRET, SALES: SALES_SECRET}) as server:
        yield server


@pytest.fixture
def channels(fake: fw.FakeWebhook) -> Destinations:
    destinations = Destinations("hooks")
    destinations.set("C-alerts", fake.hook_url(ALERTS), workspace_id="W1", secret=ALERTS_SECRET)
    destinations.set("C-sales", fake.hook_url(SALES), workspace_id="W1", secret=SALES_SECRET)
    return destinations


@pytest.fixture
def hook(form: str) -> Iterator[WebhookConnector]:
    connector = in_form(form, WebhookConnector(source="hooks", installations=True, timeout=1))
    yield connector
    connector.close()


def post(post_id: str, container_id: str) -> Any:
    return claimed_post("hooks", post_id, {"text": post_id}, workspace_id="W1", container_id=container_id)


@pytest.mark.django_db
def test_each_container_gets_its_own_url_signed_with_its_own_secret(fake, channels, hook):
    assert hook.send(post("a1", "C-alerts")) == Delivered("d-1")
    assert hook.send(post("s1", "C-sales")) == Delivered("d-2")
    assert hook.send(post("a2", "C-alerts")) == Delivered("d-3")

    assert [(d.path, d.post_id) for d in fake.deliveries] == [(ALERTS, "a1"), (SALES, "s1"), (ALERTS, "a2")]
    calls = fake.calls_of("deliver")
    assert fake.verify(calls[0].headers, calls[0].body, ALERTS_SECRET)
    assert fake.verify(calls[1].headers, calls[1].body, SALES_SECRET)
    assert not fake.verify(calls[1].headers, calls[1].body, ALERTS_SECRET)


@pytest.mark.django_db
def test_a_container_without_a_destination_is_refused_naming_it_without_a_request(fake, channels, hook):
    outcome = hook.send(post("lost", "C-nowhere"))

    assert outcome == Refused(
        "container C-nowhere has no destination in source 'hooks': set one with "
        "Destinations(source).set(container_id, url)"
    )
    assert fake.calls == []


@pytest.mark.django_db
def test_a_destination_changed_or_removed_is_used_from_then_on(fake, channels, hook):
    assert isinstance(hook.send(post("a1", "C-alerts")), Delivered)
    hook.destinations.set("C-alerts", fake.hook_url(SALES), secret=SALES_SECRET)
    assert isinstance(hook.send(post("a2", "C-alerts")), Delivered)
    hook.destinations.remove("C-alerts")
    assert isinstance(hook.send(post("a3", "C-alerts")), Refused)
    assert [(d.path, d.post_id) for d in fake.deliveries] == [(ALERTS, "a1"), (SALES, "a2")]


@pytest.mark.django_db
def test_no_destination_url_or_secret_shows_in_a_reason_or_a_log_line(fake, channels, hook, caplog):
    caplog.set_level(logging.DEBUG)
    wrong = f"http://127.0.0.1:{fake.port}/hooks/{UNKNOWN_PATH_TOKEN}"
    hook.destinations.set("C-gone", wrong, secret="gone-signing-secret-3")
    fake.script("deliver", fw.respond(400, {"error": f"bad signature {SALES_SECRET} for {SALES}"}))

    refused = hook.send(post("g1", "C-gone"))
    echoed = hook.send(post("s1", "C-sales"))
    delivered = hook.send(post("a1", "C-alerts"))

    assert refused == Refused("webhook HTTP 404 not_found no hook at ***")
    assert echoed == Refused("webhook HTTP 400 bad signature *** for ***")
    assert isinstance(delivered, Delivered)
    lines = [r.getMessage() for r in caplog.records if r.name == "httpx"]
    assert lines == [
        f'HTTP Request: POST http://127.0.0.1:{fake.port}/*** "HTTP/1.1 404 Not Found"',
        f'HTTP Request: POST http://127.0.0.1:{fake.port}/*** "HTTP/1.1 400 Bad Request"',
        f'HTTP Request: POST http://127.0.0.1:{fake.port}/*** "HTTP/1.1 200 OK"',
    ]
    for text in (
        caplog.text,
        refused.reason,
        echoed.reason,
        repr(hook),
        repr(hook.destinations.target("C-sales")),
    ):
        for secret in (
            UNKNOWN_PATH_TOKEN,
            "sales-Xk29",
            "/hooks/alerts",
            ALERTS_SECRET,
            SALES_SECRET,
            "gone-signing",
        ):
            assert secret not in text, (secret, text)


def test_check_wants_either_url_or_installations():
    def found(**options: Any) -> list[tuple[str | None, str]]:
        return [(m.id, m.msg) for m in WebhookConnector(source="hooks", **options).check()]

    where = "CONNECTOR_OUTBOX source 'hooks'"
    assert found(installations=True) == []
    assert found(installations=True, lookup_url="https://example.com/posts/{post_id}") == []
    assert found(url="https://example.com/hook", installations=True) == [
        (
            "connector_outbox.E216",
            f"{where}: OPTIONS has both 'url' and 'installations': give 'url' for one destination, "
            "or 'installations': True for a URL per container (Destinations).",
        )
    ]
    assert found() == [
        (
            "connector_outbox.E216",
            f"{where}: the webhook needs OPTIONS['url'] (one destination), or "
            "OPTIONS['installations']: True (a URL per container, from Destinations).",
        )
    ]
    assert found(installations=True, secret=SALES_SECRET) == [
        (
            "connector_outbox.E216",
            f"{where}: with 'installations', each destination has its own secret "
            "(Destinations(source).set(container_id, url, secret=...)): remove OPTIONS['secret'].",
        )
    ]
    assert found(installations="yes") == [
        ("connector_outbox.E216", f"{where}: OPTIONS['installations'] must be True or False.")
    ]


@pytest.mark.django_db(transaction=True)  # the sender's send threads read the destinations
def test_the_sender_delivers_each_channel_to_its_hook_and_fails_a_channel_without_one(fake, channels):
    config = {"BACKEND": BACKEND, "OPTIONS": {"installations": True, "timeout": 1}}
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"hooks": config}}):
        outbox = Outbox("hooks")
        for post_id, container in [
            ("a1", "C-alerts"),
            ("s1", "C-sales"),
            ("x1", "C-none"),
            ("a2", "C-alerts"),
        ]:
            assert outbox.queue(post_id, workspace_id="W1", container_id=container, body={"text": post_id})
        call_command("run_outbox", "--once", "--source", "hooks", verbosity=0)

    assert sorted((d.path, d.post_id) for d in fake.deliveries) == [
        (ALERTS, "a1"),
        (ALERTS, "a2"),
        (SALES, "s1"),
    ]
    assert [d.post_id for d in fake.deliveries if d.path == ALERTS] == ["a1", "a2"]
    rows = {p.post_id: p for p in Post.objects.filter(source="hooks")}
    assert {post_id: row.state for post_id, row in rows.items()} == {
        "a1": "posted", "s1": "posted", "a2": "posted", "x1": "failed",
    }  # fmt: skip
    assert rows["x1"].last_error.startswith("container C-none has no destination in source 'hooks'")
    assert all(fake.hook_url(SALES) not in row.last_error for row in rows.values())
