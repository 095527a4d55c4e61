"""Installations: credentials per workspace, read through a cache, refreshed once per expiry
by whichever sender gets the row lock first, revoked only for the token the answer was about."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_connector_outbox import Outbox
from django_connector_outbox.installations import (
    Credentials,
    Destinations,
    Installations,
    NoDestination,
    NotInstalled,
    RefreshFailed,
    Renewal,
)
from django_connector_outbox.installations.sealing import CannotOpen, open_sealed, seal
from django_connector_outbox.models import Destination, Installation, Post

pytestmark = pytest.mark.django_db


def install(installations: Installations, workspace: str = "T1", token: str = "xoxb-1", **fields) -> None:
    installations.save(workspace, secrets={"bot_token": token, "bot_refresh_token": f"r-{token}"}, **fields)


def test_a_workspace_without_an_installation_is_named_with_what_to_do():
    with pytest.raises(NotInstalled) as raised:
        Installations("slack").credentials("T404")
    assert "T404" in str(raised.value)
    assert str(raised.value).endswith(": install the app again")  # the CONTRACT's words
    assert raised.value.workspace_id == "T404"


def test_a_workspace_without_a_usable_installation_is_told_to_install_the_app_again_as_the_contract_says():
    installations = Installations("slack")
    install(installations, "T1")
    installations.revoke("T1", "token_revoked")
    installations.save("T2", secrets={})  # installed, and left without a token
    reasons = {}
    for workspace in ("T404", "T1", "T2"):
        with pytest.raises(NotInstalled) as raised:
            installations.credentials(workspace)
        reasons[workspace] = str(raised.value).rpartition(": ")[2]
    assert reasons == {
        "T404": "install the app again",
        "T1": "install the app again",
        "T2": "install the app again",
    }


def test_a_reinstall_is_the_installation_s_install_time_and_a_token_refresh_is_not(clock):
    installations = Installations("slack", clock=clock)
    expiring(installations, clock)
    first = clock()
    clock.advance(11 * 3600)
    used = installations.credentials("T1")
    installations.refresh(used, lambda c: Renewal("xoxb-2", "r-2", clock() + timedelta(hours=12)))
    assert Installation.objects.get().installed_at == first
    installations.revoke("T1", "token_revoked")
    clock.advance(60)
    install(installations, token="xoxb-3")
    assert Installation.objects.get().installed_at == clock() == first + timedelta(hours=11, minutes=1)


def test_the_posts_waiting_for_an_installation_are_the_queued_ones_and_those_failed_for_want_of_one():
    installations = Installations("memory")
    install(installations, "T1")
    installations.revoke("T1", "token_revoked")
    installations.save("T2", secrets={})
    failed = {}
    for workspace in ("T404", "T1", "T2"):
        with pytest.raises(NotInstalled) as raised:
            installations.credentials(workspace)
        failed[f"for-{workspace}"] = str(raised.value)
    failed["gone"] = "slack error channel_not_found"
    failed["quoting"] = "400: the body says 'install the app again' in its text"
    outbox = Outbox("memory")
    for n, post_id in enumerate([*failed, "uncertain"]):
        assert outbox.queue(post_id, workspace_id="W", container_id=f"C{n}", body={"text": "x"})
    claims = {claim.post_id: claim for claim in outbox.claim()}
    for post_id, reason in failed.items():
        assert outbox.settle(claims[post_id], "failed", reason)
    assert outbox.settle(claims["uncertain"], "uncertain", f"lookup impossible: {failed['for-T1']}")
    assert outbox.queue("queued", workspace_id="W", container_id="C9", body={"text": "x"})

    waiting = Post.objects.filter(source="memory").waiting_for_installation()
    assert sorted(waiting.values_list("post_id", flat=True)) == ["for-T1", "for-T2", "for-T404", "queued"]
    assert sorted(Post.objects.failed_for_installation().values_list("post_id", flat=True)) == [
        "for-T1", "for-T2", "for-T404",
    ]  # fmt: skip


def test_credentials_are_stored_sealed_and_read_back():
    installations = Installations("slack")
    install(installations, token="xoxb-secret-1")
    row = Installation.objects.get(source="slack", workspace_id="T1")
    assert "xoxb-secret-1" not in row.secrets
    assert open_sealed(row.secrets, what="t")["bot_token"] == "xoxb-secret-1"
    credentials = installations.credentials("T1")
    assert credentials.token == "xoxb-secret-1"
    assert "xoxb-secret-1" not in repr(credentials)


def test_a_send_reads_the_database_once_per_cache_period():
    installations = Installations("slack")
    install(installations)
    installations.credentials("T1")
    with CaptureQueriesContext(connection) as queries:
        for _ in range(100):
            installations.credentials("T1")
    assert len(queries) == 0


def test_a_missing_installation_is_remembered_too():
    installations = Installations("slack")
    with pytest.raises(NotInstalled):
        installations.credentials("T404")
    with CaptureQueriesContext(connection) as queries, pytest.raises(NotInstalled):
        installations.credentials("T404")
    assert len(queries) == 0


class Clock:
    """A monotonic clock for the installations' cache, moved by the test."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_entries_that_expire_together_are_read_again_in_one_query_with_the_one_asked_for():
    installations = Installations("slack", cache_seconds=10)
    installations._cache.clock = clock = Clock()
    for workspace in ("T1", "T2", "T3"):
        install(installations, workspace, token=f"xoxb-{workspace}")
        installations.credentials(workspace)
    Installation.objects.filter(workspace_id="T3").update(secrets=seal({"bot_token": "xoxb-T3-new"}))
    clock.now = 12.0  # every entry expired

    with CaptureQueriesContext(connection) as queries:
        assert installations.credentials("T1").token == "xoxb-T1"
        assert installations.credentials("T2").token == "xoxb-T2"
        assert installations.credentials("T3").token == "xoxb-T3-new"  # read again indeed
    assert len(queries) == 1  # T1's read took T2 and T3 along

    clock.now = 40.0  # expired long ago: not read along with another (no longer in use, maybe)
    with CaptureQueriesContext(connection) as queries:
        installations.credentials("T1")
        installations.credentials("T2")
    assert len(queries) == 2


def test_while_another_thread_reads_expired_entries_again_the_others_use_theirs_without_a_query():
    installations = Installations("slack", cache_seconds=10)
    installations._cache.clock = clock = Clock()
    install(installations, "T1", token="xoxb-1")
    installations.credentials("T1")
    installations._refreshing.acquire()  # another thread is reading the expired entries again
    try:
        clock.now = 15.0
        with CaptureQueriesContext(connection) as queries:
            assert installations.credentials("T1").token == "xoxb-1"
        assert len(queries) == 0
        clock.now = 25.0  # too late to use: read it now
        with CaptureQueriesContext(connection) as queries:
            assert installations.credentials("T1").token == "xoxb-1"
        assert len(queries) == 1
    finally:
        installations._refreshing.release()


def test_a_workspace_whose_row_cannot_be_opened_fails_alone_when_entries_are_read_again_together():
    installations = Installations("slack", cache_seconds=10)
    installations._cache.clock = clock = Clock()
    install(installations, "T1", token="xoxb-1")
    install(installations, "T2", token="xoxb-2")
    installations.credentials("T1")
    installations.credentials("T2")
    Installation.objects.filter(workspace_id="T2").update(secrets="not-a-fernet-token")
    clock.now = 12.0

    assert installations.credentials("T1").token == "xoxb-1"  # read again with T2's row
    with pytest.raises(CannotOpen):
        installations.credentials("T2")


def test_sources_do_not_share_installations():
    install(Installations("a"), token="xoxb-a")
    with pytest.raises(NotInstalled):
        Installations("b").credentials("T1")


def test_saving_again_replaces_the_token_and_clears_a_revocation():
    installations = Installations("slack")
    install(installations, token="xoxb-old")
    assert installations.revoke("T1", "token_revoked")
    with pytest.raises(NotInstalled, match="was revoked \\(token_revoked\\): install the app again"):
        installations.credentials("T1")
    install(installations, token="xoxb-new")
    assert installations.credentials("T1").token == "xoxb-new"
    assert Installation.objects.get().revoked_at is None


def test_a_revocation_erases_the_secrets_and_keeps_the_row():
    installations = Installations("slack")
    install(installations, token="xoxb-1")
    installations.revoke("T1", "app_uninstalled")
    row = Installation.objects.get()
    assert row.secrets == ""
    assert row.revoked_reason == "app_uninstalled"


def test_an_answer_to_an_old_token_does_not_revoke_a_reinstall():
    installations = Installations("slack")
    install(installations, token="xoxb-old")
    install(installations, token="xoxb-new")
    assert not installations.revoke("T1", "invalid_auth", token="xoxb-old")
    assert installations.credentials("T1").token == "xoxb-new"
    assert installations.revoke("T1", "invalid_auth", token="xoxb-new")


def test_an_org_wide_installation_serves_the_teams_it_lists():
    installations = Installations("slack")
    install(installations, "E1", token="xoxb-org", is_enterprise_install=True, enterprise_id="E1")
    with pytest.raises(NotInstalled):
        installations.credentials("T7")
    installations.set_teams("E1", ["T7", "T8"])
    credentials = installations.credentials("T7")
    assert (credentials.token, credentials.workspace_id) == ("xoxb-org", "E1")


def test_a_team_s_own_installation_goes_before_its_org_s():
    installations = Installations("slack")
    install(installations, "E1", token="xoxb-org", is_enterprise_install=True, enterprise_id="E1")
    installations.set_teams("E1", ["T7"])
    install(installations, "T7", token="xoxb-team")
    assert installations.credentials("T7").token == "xoxb-team"


def expiring(installations: Installations, clock, lifetime: timedelta = timedelta(hours=12)) -> None:
    install(installations, token="xoxb-1", token_issued_at=clock(), token_expires_at=clock() + lifetime)


def test_a_token_is_due_two_hours_before_it_expires_or_at_three_quarters_of_a_short_life(clock):
    long_lived = Credentials("s", "T1", "t", issued_at=clock(), expires_at=clock() + timedelta(hours=12))
    assert not long_lived.due(clock() + timedelta(hours=9, minutes=59))
    assert long_lived.due(clock() + timedelta(hours=10))
    short_lived = Credentials("s", "T1", "t", issued_at=clock(), expires_at=clock() + timedelta(seconds=8))
    assert not short_lived.due(clock() + timedelta(seconds=5.9))
    assert short_lived.due(clock() + timedelta(seconds=6))
    assert not Credentials("s", "T1", "t").due(clock() + timedelta(days=9999))


def test_a_refresh_saves_the_new_token_and_refresh_token_together(clock):
    installations = Installations("slack", clock=clock)
    expiring(installations, clock)
    used = installations.credentials("T1")
    clock.advance(11 * 3600)
    seen = []

    def renew(current: Credentials) -> Renewal:
        seen.append(current.refresh_token)
        return Renewal("xoxb-2", "r-2", clock() + timedelta(hours=12))

    fresh = installations.refresh(used, renew)
    assert seen == ["r-xoxb-1"]
    assert (fresh.token, fresh.refresh_token) == ("xoxb-2", "r-2")
    stored = Installations("slack", clock=clock).credentials("T1")
    assert (stored.token, stored.refresh_token, stored.expires_at) == (
        "xoxb-2",
        "r-2",
        clock() + timedelta(hours=12),
    )


def test_a_refresh_finds_the_token_another_sender_saved_and_does_not_renew(clock):
    expiring(Installations("slack", clock=clock), clock)
    first, second = Installations("slack", clock=clock), Installations("slack", clock=clock)
    used_by_first, used_by_second = first.credentials("T1"), second.credentials("T1")
    clock.advance(11 * 3600)
    first.refresh(used_by_first, lambda c: Renewal("xoxb-2", "r-2", clock() + timedelta(hours=12)))

    def must_not_renew(current: Credentials) -> Renewal:
        raise AssertionError("renewed twice")

    assert second.refresh(used_by_second, must_not_renew).token == "xoxb-2"


def test_a_forced_refresh_renews_a_token_the_platform_called_expired_before_our_clock_did(clock):
    installations = Installations("slack", clock=clock)
    expiring(installations, clock)
    used = installations.credentials("T1")
    renewed = installations.refresh(used, lambda c: Renewal("xoxb-2", "r-2", None), force=True)
    assert renewed.token == "xoxb-2"


def test_a_failed_refresh_is_recorded_and_raised(clock):
    installations = Installations("slack", clock=clock)
    expiring(installations, clock)
    used = installations.credentials("T1")
    clock.advance(11 * 3600)

    def fail(current: Credentials) -> Renewal:
        raise RefreshFailed("oauth.v2.access: HTTP 503")

    with pytest.raises(RefreshFailed):
        installations.refresh(used, fail)
    assert Installation.objects.get().refresh_error == "oauth.v2.access: HTTP 503"
    installations.refresh(used, lambda c: Renewal("xoxb-2", "r-2", None))
    assert Installation.objects.get().refresh_error == ""


def test_a_revoked_refresh_token_revokes_the_installation(clock):
    installations = Installations("slack", clock=clock)
    expiring(installations, clock)
    used = installations.credentials("T1")
    clock.advance(11 * 3600)

    def revoked(current: Credentials) -> Renewal:
        raise RefreshFailed("invalid_refresh_token", revoked=True)

    with pytest.raises(NotInstalled, match="install the app again"):
        installations.refresh(used, revoked)
    assert Installation.objects.get().revoked_at is not None


@pytest.mark.django_db(transaction=True)
def test_senders_refreshing_at_once_renew_once(clock, settings):
    """Eight senders (each its own Installations and connection) find the token due together:
    the row lock (on SQLite, BEGIN IMMEDIATE's write lock) lets one renew."""
    expiring(Installations("slack", clock=clock), clock)
    senders = [Installations("slack", clock=clock) for _ in range(8)]
    used = [sender.credentials("T1") for sender in senders]
    clock.advance(11 * 3600)
    renewals = []
    start = threading.Barrier(len(senders))
    tokens: list[str] = []

    def renew(current: Credentials) -> Renewal:
        renewals.append(current.token)
        return Renewal(f"xoxb-{len(renewals) + 1}", "r", clock() + timedelta(hours=12))

    def refresh(index: int) -> None:
        start.wait()
        try:
            tokens.append(senders[index].refresh(used[index], renew).token)
        finally:
            connection.close()

    threads = [threading.Thread(target=refresh, args=(i,)) for i in range(len(senders))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert renewals == ["xoxb-1"]
    assert tokens == ["xoxb-2"] * len(senders)


def test_a_destination_is_sealed_and_read_back():
    destinations = Destinations("hooks")
    destinations.set("C1", "https://hooks.example/abc", workspace_id="W1", secret="s3")
    target = destinations.target("C1")
    assert (target.url, target.secret, target.workspace_id) == ("https://hooks.example/abc", "s3", "W1")
    assert "hooks.example" not in repr(target)


def test_a_container_without_a_destination_is_named():
    with pytest.raises(NoDestination, match="container C9 has no destination"):
        Destinations("hooks").target("C9")


def test_a_removed_destination_is_gone_at_once_for_its_reader():
    destinations = Destinations("hooks")
    destinations.set("C1", "https://hooks.example/abc")
    destinations.target("C1")
    assert destinations.remove("C1")
    assert not destinations.remove("C1")
    with pytest.raises(NoDestination):
        destinations.target("C1")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("C1", "ftp://x/y"), "must be an http"),
        (("C1", "not a url"), "must be an http"),
        (("", "https://x/y"), "container_id must not be empty"),
        (("C\x00", "https://x/y"), "NUL"),
    ],
)
def test_a_bad_destination_is_refused_and_nothing_is_written(args, message):
    with pytest.raises(ValueError, match=message) as raised:
        Destinations("hooks").set(*args)
    assert "x/y" not in str(raised.value)
    assert not Destination.objects.exists()
