"""The admin in a real browser: log in, filter, select, retry, confirm, see the result.

Drives the Debian Chromium (/usr/bin/chromium) through Playwright against pytest-django's
live_server, and saves the screenshots that docs/admin.md shows.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connections
from django.utils import timezone

from django_connector_outbox.models import Post
from django_connector_outbox.outbox import Outbox
from django_connector_outbox.posts import State
from tests.test_admin import make, states

CHROMIUM = "/usr/bin/chromium"
# Screenshots go to a temporary directory, so that a test run leaves the tree clean;
# ADMIN_SCREENSHOTS=docs refreshes the ones docs/admin.md shows.
DOCS = Path(__file__).resolve().parent.parent / "docs"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
if not shutil.which(CHROMIUM):
    pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)", allow_module_level=True)


@pytest.fixture
def page(monkeypatch) -> Iterator[Any]:
    # Playwright's sync API runs an event loop in this thread, so Django would refuse the
    # test's own database calls as "async"; they are not.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1440, "height": 900}, locale="en-US")
        page = context.new_page()
        dialogs: list[str] = []
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
        page.dialogs = dialogs
        try:
            yield page
        finally:
            browser.close()
            # With Playwright's loop running, Django's connections are keyed to its context,
            # not to the thread: close them here, or the test database cannot be dropped.
            connections.close_all()


@pytest.fixture
def shots(tmp_path) -> Path:
    return DOCS if os.environ.get("ADMIN_SCREENSHOTS") == "docs" else tmp_path


def log_in(page: Any, live_server: Any, admin_user: Any) -> None:
    page.goto(f"{live_server.url}/admin/login/?next=/admin/django_connector_outbox/post/")
    page.fill("#id_username", admin_user.username)
    page.fill("#id_password", "password")
    page.click("input[type=submit]")
    page.wait_for_url("**/admin/django_connector_outbox/post/")
    page.click("#toggle-nav-sidebar")  # closed for the rest of the session: room for the list


def an_outbox_with_troubles() -> dict[str, Post]:
    outbox = Outbox("memory")
    # A container held by a rate limit, with a post waiting behind its head.
    outbox.queue(
        "digest-1041", workspace_id="T024BE7LD", container_id="C0ALERTS", body={"text": "Nightly digest"}
    )
    outbox.queue("digest-1042", workspace_id="T024BE7LD", container_id="C0ALERTS", body={"text": "Follow-up"})
    [claim] = outbox.claim(worker="sender-a:311")
    outbox.hold(claim, 45, reason="ratelimited: Retry-After 45")
    return {
        "sending": make("order-7731-shipped", State.SENDING, container="C0ORDERS"),
        "failed-1": make("invoice-2201", State.FAILED, container="C0BILLING"),
        "failed-2": make("invoice-2202", State.FAILED, container="C0BILLING2", last_error="not_in_channel"),
        "uncertain": make(
            "reminder-88",
            State.UNCERTAIN,
            container="C0REMIND",
            last_error="lookup impossible: ephemeral message",
        ),  # fmt: skip
        "queued": make("welcome-5", container="C0WELCOME", thread="1712345678.000100"),
        "posted": make("welcome-4", State.POSTED, container="C0WELCOME"),
        "cancelled": make("welcome-3", State.CANCELLED, container="C0WELCOME"),
        "xss": make(
            "report-13",
            State.FAILED,
            source="other",
            container="C0REPORTS",
            body={
                "text": "<script>alert('owned')</script> weekly report",
                "unfurl_links": False,
                "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": "*Weekly* report"}}],
            },
            last_error="msg_too_long",
        ),  # fmt: skip
    }


def select_all_and_run(page: Any, action: str) -> None:
    page.check("#action-toggle")
    page.select_option("select[name=action]", action)
    page.click("button[name=index]")


def test_filter_select_retry_and_confirm(page, live_server, admin_user, shots):
    posts = an_outbox_with_troubles()
    log_in(page, live_server, admin_user)

    # The default list: what needs attention, with the health header and the holds.
    body = page.locator("#content").inner_text()
    assert "held until" in body and "ratelimited: Retry-After 45" in body
    assert "waits behind digest-1041" in body
    assert "welcome-4" not in body  # posted: not in the default view
    page.screenshot(path=str(shots / "admin-changelist.png"), full_page=True)

    # Filter to failed, select them all, retry.
    page.locator("#changelist-filter").get_by_role("link", name="Failed", exact=True).click()
    page.wait_for_url("**/post/?state=failed")
    assert page.locator("#result_list tbody tr").count() == 3
    select_all_and_run(page, "retry_posts")
    assert page.locator(".messagelist").inner_text().strip() == "3 retried"
    failed = [posts["failed-1"], posts["failed-2"], posts["xss"]]
    assert states(*failed) == ["queued"] * 3
    assert states(posts["sending"]) == ["sending"]

    # Uncertain ones ask first.
    page.goto(f"{live_server.url}/admin/django_connector_outbox/post/?state=uncertain")
    select_all_and_run(page, "retry_posts")
    assert "appear twice" in page.locator("#content").inner_text()
    assert states(posts["uncertain"]) == ["uncertain"]
    page.screenshot(path=str(shots / "admin-retry-confirmation.png"), full_page=True)
    page.click("input[type=submit][value='Yes, retry them']")
    assert page.locator(".messagelist").inner_text().strip() == "1 retried"
    assert states(posts["uncertain"]) == ["queued"]
    assert page.dialogs == []


def test_cancel_skips_what_is_not_queued(page, live_server, admin_user):
    posts = an_outbox_with_troubles()
    log_in(page, live_server, admin_user)
    page.goto(f"{live_server.url}/admin/django_connector_outbox/post/?state=all")
    select_all_and_run(page, "cancel_posts")
    assert page.locator(".messagelist").inner_text().strip() == (
        "3 cancelled; 7 skipped: only queued posts can be cancelled"
        " (1 sending, 1 posted, 3 failed, 1 uncertain, 1 cancelled)"
    )
    assert states(posts["queued"], posts["sending"]) == ["cancelled", "sending"]


def test_detail_page_shows_everything_and_runs_no_script(page, live_server, admin_user, shots):
    posts = an_outbox_with_troubles()
    log_in(page, live_server, admin_user)
    page.goto(f"{live_server.url}/admin/django_connector_outbox/post/{posts['xss'].pk}/change/")
    body = page.locator("pre.outbox-pre").last.inner_text()
    assert "<script>alert('owned')</script> weekly report" in body
    assert '"unfurl_links": false' in body
    content = page.locator("#content").inner_text()
    for text in ("report-13", "msg_too_long", "failed", "Attempts", "Lease until", "Sent at", "Rev"):
        assert text in content
    lease = page.locator(".field-lease_until_ .readonly").inner_text()
    assert lease == "—"  # the claim was its lane's, and is over
    assert page.locator("input[name=_save]").count() == 0
    page.screenshot(path=str(shots / "admin-detail.png"), full_page=True)
    assert page.dialogs == []

    # A post being sent: its holder, lease and first send, read from its lane's claim.
    sending = posts["sending"]
    page.goto(f"{live_server.url}/admin/django_connector_outbox/post/{sending.pk}/change/")
    content = page.locator("#content").inner_text()
    for text in ("order-7731-shipped", "sending", "host-1:4242", "head of its container: being sent",
                 f"{timezone.localtime(sending.lease_until):%Y-%m-%d %H:%M:%S %Z}",
                 f"{timezone.localtime(sending.sent_at):%Y-%m-%d %H:%M:%S %Z}"):  # fmt: skip
        assert text in content, text
    assert page.dialogs == []


def test_the_retry_button_of_an_uncertain_post_asks_then_retries(page, live_server, admin_user, shots):
    posts = an_outbox_with_troubles()
    uncertain = posts["uncertain"]
    log_in(page, live_server, admin_user)
    page.goto(f"{live_server.url}/admin/django_connector_outbox/post/{uncertain.pk}/change/")
    assert page.locator("button.outbox-tool").all_inner_texts() == ["RETRY POST"]  # styled upper case
    page.screenshot(path=str(shots / "admin-detail-retry.png"), full_page=True)

    page.click("text=Retry post")
    page.wait_for_url(f"**/post/{uncertain.pk}/retry/")
    assert "appear twice" in page.locator("#content").inner_text()
    assert states(uncertain) == ["uncertain"]  # nothing until confirmed
    page.click("input[value='Yes, retry them']")

    page.wait_for_url(f"**/post/{uncertain.pk}/change/")
    assert page.locator("ul.messagelist li").all_inner_texts() == ["1 retried"]
    assert states(uncertain) == ["queued"]
    # Queued now: the cancel button replaces the retry button.
    assert page.locator("button.outbox-tool").all_inner_texts() == ["CANCEL POST"]
    assert page.dialogs == []
