"""Messages rendered by the email and webhook connectors, and delivered through them."""

from __future__ import annotations

import pytest
from django.core import mail
from django.test import override_settings

from django_connector_outbox import Link, Message, Outbox
from django_connector_outbox.connectors.email import EmailConnector
from django_connector_outbox.connectors.email_render import render_email, subject
from django_connector_outbox.connectors.text_render import plain_text
from django_connector_outbox.connectors.webhook import WebhookConnector
from django_connector_outbox.connectors.webhook_render import render_webhook
from django_connector_outbox.fakes.webhook import FakeWebhook
from django_connector_outbox.testing import deliver_due
from tests.connectors.test_email import use_mail

ALERT = Message(
    "Disk on **db1** is at _91%_ <see> & [the graph](https://grafana.example.com/d/1?a=1&b=2)",
    title="Disk alert: db1",
    fields=[("Host", "db1 <primary>"), ("Used", "91%")],
    actions=[
        Link("Runbook", "https://wiki.example.com/disk?x=1&y=2"),
        Link("Silence", "https://am.example.com/s"),
    ],
    image_url="https://grafana.example.com/d/1.png",
    context="sent by `cron` at 12:00",
)
EMAIL = {
    "BACKEND": "django_connector_outbox.connectors.email.EmailConnector",
    "OPTIONS": {"from_email": "o@e.com"},
}


def test_the_webhook_posts_the_messages_json_and_its_text():
    assert render_webhook(ALERT) == {"text": plain_text(ALERT), "message": ALERT.to_json()}
    assert WebhookConnector("hooks", url="https://hooks.example.com/x").render(ALERT) == render_webhook(ALERT)
    assert Message.from_json(render_webhook(ALERT)["message"]) == ALERT


def test_the_email_is_text_and_html_with_the_title_as_subject():
    body = render_email(ALERT)
    assert EmailConnector("mail", from_email="o@example.com").render(ALERT) == body
    assert body["subject"] == "Disk alert: db1"
    assert body["text"] == plain_text(ALERT)
    assert body["html"] == (
        "<!DOCTYPE html>\n"
        '<html><head><meta charset="utf-8"></head><body>\n'
        "<h2>Disk alert: db1</h2>\n"
        "<p>Disk on <strong>db1</strong> is at <em>91%</em> &lt;see&gt; &amp; "
        '<a href="https://grafana.example.com/d/1?a=1&amp;b=2">the graph</a></p>\n'
        '<table><tr><th align="left" style="padding:2px 12px 2px 0">Host</th><td>db1 &lt;primary&gt;</td></tr>'
        '<tr><th align="left" style="padding:2px 12px 2px 0">Used</th><td>91%</td></tr></table>\n'
        '<p><a href="https://wiki.example.com/disk?x=1&amp;y=2"><strong>Runbook</strong></a> &middot; '
        '<a href="https://am.example.com/s"><strong>Silence</strong></a></p>\n'
        '<p><img src="https://grafana.example.com/d/1.png" alt="" style="max-width:100%"></p>\n'
        '<div style="color:#666666;font-size:small"><p>sent by <code>cron</code> at 12:00</p></div>\n'
        "</body></html>\n"
    )


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (Message("x", title="Two\nlines  here"), "Two lines here"),
        (Message("\n\n**First** line\nsecond"), "First line"),
        (Message("a" * 100), "a" * 77 + "…"),
        (Message("", fields=[("Build", "ok")]), "Build: ok"),
    ],
)
def test_a_subject_is_one_line_from_the_title_or_the_text(message, expected):
    assert subject(message, plain_text(message)) == expected


@pytest.mark.django_db
def test_a_message_is_mailed_as_multipart_text_and_html(settings):
    use_mail(settings, "django.core.mail.backends.locmem.EmailBackend")
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"mail": EMAIL}}):
        Outbox("mail").queue("alert-1", workspace_id="ops", container_id="ada@example.org", body=ALERT)
        [delivered] = deliver_due()["mail"]
    [sent] = mail.outbox
    assert (sent.subject, sent.to, sent.body) == ("Disk alert: db1", ["ada@example.org"], plain_text(ALERT))
    assert sent.alternatives[0][1] == "text/html"
    assert sent.alternatives[0][0] == render_email(ALERT)["html"]
    assert delivered.message == ALERT


@pytest.mark.django_db
def test_a_message_reaches_a_webhook_as_its_json_and_text():
    with FakeWebhook.running() as receiver:
        hooks = {"BACKEND": "django_connector_outbox.connectors.webhook.WebhookConnector", "OPTIONS": {}}
        hooks["OPTIONS"]["url"] = receiver.url
        with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": {"hooks": hooks}}):
            Outbox("hooks").queue("h1", workspace_id="T1", container_id="C1", body=ALERT)
            deliver_due()
    assert [d.body for d in receiver.deliveries] == [render_webhook(ALERT)]
