"""The admin shows what a wider hold keeps waiting: the post's "held until", and the holds."""

from __future__ import annotations

import pytest
from django.urls import reverse

from django_connector_outbox import Outbox

pytestmark = pytest.mark.django_db


def test_a_post_of_a_held_workspace_shows_until_when_and_why(admin_client):
    outbox = Outbox("memory")
    for post_id, container in (("a1", "C1"), ("a2", "C2")):
        outbox.queue(post_id, workspace_id="T1", container_id=container, body={"text": post_id})
    first, second = outbox.claim()
    outbox.posted(second)
    outbox.queue("a3", workspace_id="T1", container_id="C2", body={"text": "a3"})
    outbox.hold(first, 600, "429 on chat.postMessage in 2 channels", scope="workspace")

    page = admin_client.get(reverse("admin:django_connector_outbox_post_changelist")).content.decode()
    assert page.count("with its workspace: 429 on chat.postMessage in 2 channels") == 2  # a1 and a3

    holds = admin_client.get(reverse("admin:django_connector_outbox_gate_changelist")).content.decode()
    assert "429 on chat.postMessage in 2 channels" in holds
    assert "T1" in holds
