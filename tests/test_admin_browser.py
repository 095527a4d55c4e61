"""The admin in a real browser: log in, filter, select, retry, confirm, see the result; the
installations' list, filter, search and revoke.

Drives the Debian Chromium (/usr/bin/chromium) through Playwright against pytest-django's
live_server. The screenshots the docs show (docs/admin-*.png) are taken on the way, of the
pages the tests have just checked, into a temporary directory; `--screenshots docs`
(tests/conftest.py) saves them into docs/ instead, which is how they are regenerated
(docs/contributing.md).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connections
from django.utils import timezone

from django_connector_outbox.installations import Installations, NotInstalled
from django_connector_outbox.models import Installation, Post
from django_connector_outbox.outbox import Outbox
from django_connector_outbox.posts import State
from tests.test_admin import make, states

CHROMIUM = "/usr/bin/chromium"
MEMORY = "django_connector_outbox.connectors.memory.MemoryConnector"
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
def shots(request, tmp_path) -> Path:
    """Where screenshots go: a temporary directory, so that a test run leaves the tree clean,
    or the directory of `--screenshots DIR`."""
    chosen = request.config.getoption("screenshots")
    if chosen is None:
        return tmp_path
    directory = Path(chosen)
    directory.mkdir(parents=True, exist_ok=True)
    return directory


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


def three_workspaces() -> None:
    """Of the source "slack" (the settings' `slack` fixture names it): Acme live with two posts waiting for it (and one posted, which does not wait), Globex
    failing to refresh its token, Initech revoked with a post that failed for want of it."""
    slack = Installations("slack")
    for team, name in (("T024BE7LD", "Acme"), ("T03GLOBEX", "Globex"), ("T05INITEC", "Initech")):
        slack.save(
            team,
            secrets={"bot_token": f"xoxb-browser-{team}", "bot_refresh_token": f"xoxe-browser-{team}"},
            team_name=name,
            bot_user_id=f"U{team[1:]}",
            bot_scopes="chat:write,chat:write.public,reactions:write,channels:history",
            token_expires_at=timezone.now() + timedelta(hours=11) if name == "Globex" else None,
        )
    Installation.objects.filter(workspace_id="T03GLOBEX").update(refresh_error="slack error invalid_refresh_token")
    slack.revoke("T05INITEC", "token_revoked")
    outbox = Outbox("slack")
    for n in range(3):
        outbox.queue(f"standup-{n}", workspace_id="T024BE7LD", container_id="C0STANDUP", body={"text": "x"})
    outbox.queue("invoice-77", workspace_id="T05INITEC", container_id="C0BILLING", body={"text": "x"})
    claims = {claim.post_id: claim for claim in outbox.claim()}
    assert outbox.posted(claims["standup-0"], "C0STANDUP:1")
    with pytest.raises(NotInstalled) as refused:
        slack.credentials("T05INITEC")
    assert outbox.settle(claims["invoice-77"], "failed", str(refused.value))  # as a connector does


@pytest.fixture
def slack(settings) -> None:
    """A source named as the docs' is, delivered in memory: the live server reads the same
    settings, in this process."""
    connectors = {**settings.CONNECTOR_OUTBOX["CONNECTORS"], "slack": {"BACKEND": MEMORY}}
    settings.CONNECTOR_OUTBOX = {**settings.CONNECTOR_OUTBOX, "CONNECTORS": connectors}


def test_the_installations_list_filters_searches_and_revokes(page, live_server, admin_user, slack, shots):
    three_workspaces()
    log_in(page, live_server, admin_user)
    page.set_viewport_size({"width": 1920, "height": 900})  # the list's ten columns, none scrolled off
    page.goto(f"{live_server.url}/admin/django_connector_outbox/installation/")

    rows = page.locator("#result_list tbody tr")
    listed = {
        rows.nth(i).locator(".field-team_name").inner_text(): rows.nth(i).locator(".field-waiting").inner_text()
        for i in range(rows.count())
    }
    assert listed == {"Acme": "2", "Globex": "0", "Initech": "1"}
    content = page.locator("#content").inner_text()
    assert "slack error invalid_refresh_token" in content and "xoxb-browser" not in page.content()
    page.screenshot(path=str(shots / "admin-installations.png"), full_page=True)

    page.locator("#changelist-filter").get_by_role("link", name="Refresh failing", exact=True).click()
    page.wait_for_url("**/installation/?revoked=failing")
    assert page.locator("#result_list .field-team_name").all_inner_texts() == ["Globex"]
    page.goto(f"{live_server.url}/admin/django_connector_outbox/installation/")
    page.fill("#searchbar", "Acme")
    page.press("#searchbar", "Enter")
    page.wait_for_url("**/installation/?q=Acme")
    assert page.locator("#result_list .field-team_name").all_inner_texts() == ["Acme"]

    select_all_and_run(page, "revoke_installations")
    assert page.locator(".messagelist").inner_text().strip() == "1 installation(s) revoked."
    acme = Installation.objects.get(workspace_id="T024BE7LD")
    assert acme.revoked_at is not None and acme.secrets == ""

    assert acme.revoked_reason == f"revoked in the admin by {admin_user.username}"

    # An installation's page: every field read-only, the token's times and its refresh error.
    globex = Installation.objects.get(workspace_id="T03GLOBEX")
    page.goto(f"{live_server.url}/admin/django_connector_outbox/installation/{globex.pk}/change/")
    content = page.locator("#content").inner_text()
    for text in ("T03GLOBEX", "Globex", "slack error invalid_refresh_token", "chat:write, chat:write.public"):
        assert text in content, text
    assert page.locator("input[name=_save]").count() == 0 and "xoxb-browser" not in page.content()
    page.screenshot(path=str(shots / "admin-installation.png"), full_page=True)
    assert page.dialogs == []
