"""outbox_reencrypt: after a key rotation every row opens with the new key alone; a row that no
key opens is named, never shown, and the command exits 1."""

from __future__ import annotations

import io

import pytest
from cryptography.fernet import Fernet
from django.core.management import CommandError, call_command

from django_connector_outbox.installations import Destinations, Installations
from django_connector_outbox.installations.sealing import CannotOpen, open_sealed, seal
from django_connector_outbox.management.commands import outbox_reencrypt
from django_connector_outbox.models import Destination, Installation

pytestmark = pytest.mark.django_db

OLD, NEW, LOST = (
    Fernet.generate_key().decode(),
    Fernet.generate_key().decode(),
    Fernet.generate_key().decode(),
)
TOKEN = "xoxb-reencrypt-token-do-not-log"
HOOK = "https://hooks.example.com/services/T1/B1/reencryptHookToken123"


def keys(settings, *secret_keys: str) -> None:
    settings.CONNECTOR_OUTBOX = {**settings.CONNECTOR_OUTBOX, "SECRET_KEYS": list(secret_keys)}


def reencrypt(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("outbox_reencrypt", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


@pytest.fixture
def sealed_with_old(settings):
    """Three installations (one revoked, its secrets erased) and two destinations, sealed with OLD."""
    keys(settings, OLD)
    installations = Installations("slack")
    for team in ("T1", "T2", "T3"):
        installations.save(team, secrets={"bot_token": f"{TOKEN}-{team}", "bot_refresh_token": "xoxe-1"})
    installations.revoke("T3", "token_revoked")
    hooks = Destinations("hooks")
    hooks.set("C1", HOOK + "1", secret="whsec-one")
    hooks.set("C2", HOOK + "2")


def opened() -> list[dict[str, str]]:
    rows = [*Installation.objects.exclude(secrets="").order_by("pk"), *Destination.objects.order_by("pk")]
    return [open_sealed(row.secrets, what=str(row)) for row in rows]


def test_after_a_rotation_every_row_opens_with_the_new_key_alone(settings, sealed_with_old):
    keys(settings, NEW, OLD)
    before = opened()

    out, err = reencrypt()

    assert out == "4 resealed\n"
    assert err == ""
    keys(settings, NEW)
    assert opened() == before
    assert opened()[0] == {"bot_token": f"{TOKEN}-T1", "bot_refresh_token": "xoxe-1"}
    assert Installations("slack").credentials("T2").token == f"{TOKEN}-T2"
    assert Destinations("hooks").target("C1").url == HOOK + "1"


def test_a_dry_run_counts_and_changes_nothing(settings, sealed_with_old):
    keys(settings, NEW, OLD)
    stored = list(Installation.objects.order_by("pk").values_list("secrets", flat=True))

    out, _ = reencrypt("--dry-run", "--batch", "1")

    assert out == "4 would be resealed; nothing changed\n"
    assert list(Installation.objects.order_by("pk").values_list("secrets", flat=True)) == stored
    keys(settings, NEW)
    with pytest.raises(CannotOpen):
        opened()


def test_small_batches_reseal_every_row(settings, sealed_with_old):
    keys(settings, NEW, OLD)
    out, _ = reencrypt("--batch", "1")
    assert out == "4 resealed\n"
    keys(settings, NEW)
    assert len(opened()) == 4


def test_a_row_sealed_with_an_unknown_key_is_named_without_its_content_and_exits_1(settings, sealed_with_old):
    keys(settings, LOST)
    Destinations("hooks").set("C9", HOOK + "9", secret="lost-secret")
    keys(settings, NEW, OLD)

    with pytest.raises(CommandError) as failed:
        reencrypt()
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(CommandError):
        call_command("outbox_reencrypt", stdout=out, stderr=err)

    assert failed.value.returncode == 1
    assert str(failed.value) == (
        "1 row(s) could not be opened with any key: add the key they were sealed with to "
        "SECRET_KEYS (after the new one) and run this again"
    )
    # The second run finds the four others sealed with NEW already: it reseals them again.
    assert out.getvalue() == "4 resealed, 1 could not be opened\n"
    assert (
        err.getvalue()
        == "cannot open the destination hooks:C9: sealed with a key that is not in SECRET_KEYS\n"
    )
    for text in (out.getvalue(), err.getvalue(), str(failed.value)):
        assert HOOK not in text and "lost-secret" not in text and "gAAAA" not in text
    keys(settings, NEW)
    assert len([row for row in Installation.objects.exclude(secrets="")]) == 2
    assert Destinations("hooks").target("C2").url == HOOK + "2"


def test_a_row_saved_meanwhile_is_never_overwritten(settings, sealed_with_old, monkeypatch):
    """A refresh saves T1 between the command's read of it and its write: the refresh wins."""
    keys(settings, NEW, OLD)
    real_reseal, refreshed = outbox_reencrypt.reseal, []

    def reseal_as_t1_is_refreshed(sealed: str) -> str:
        t1 = Installation.objects.get(workspace_id="T1")
        if t1.secrets == sealed and not refreshed:
            refreshed.append(Installation.objects.filter(pk=t1.pk).update(secrets=seal({"bot_token": "new"})))
        return real_reseal(sealed)

    monkeypatch.setattr(outbox_reencrypt, "reseal", reseal_as_t1_is_refreshed)

    out, _ = reencrypt()

    assert refreshed == [1]
    assert out == "3 resealed, 1 changed meanwhile (already sealed anew)\n"
    keys(settings, NEW)
    assert Installations("slack").credentials("T1").token == "new"


def test_an_unknown_database_and_a_bad_batch_are_usage_errors():
    with pytest.raises(CommandError, match="Unknown database alias 'nope'"):
        reencrypt("--database", "nope")
    with pytest.raises(CommandError, match="--batch must be at least 1"):
        reencrypt("--batch", "0")
