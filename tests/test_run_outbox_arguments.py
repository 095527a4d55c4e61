"""run_outbox refuses bad arguments with a clear error, before a sender starts (issue 9, hole 14)."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command


@pytest.mark.parametrize("value", ["inf", "nan", "1e400", "-inf", "0", "-1", "315360001"])
def test_poll_must_be_a_finite_positive_number_of_seconds_up_to_ten_years(value):
    with pytest.raises(CommandError) as refused:
        call_command("run_outbox", "--once", f"--poll={value}")
    assert str(refused.value) == (
        f"Error: argument --poll: must be more than 0 and at most 315360000 seconds, got {value}"
    )


def test_a_worker_name_over_200_characters_is_refused():
    with pytest.raises(CommandError) as refused:
        call_command("run_outbox", "--once", "--worker", "w" * 201)
    assert str(refused.value) == "--worker must be 1 to 200 characters, got 201"


@pytest.mark.parametrize(
    ("worker", "refusal"),
    [
        ("", "--worker must be 1 to 200 characters, got 0"),
        (
            "w\x00",
            "--worker 'w\\x00' is not valid text: it contains a NUL character (\\x00), which PostgreSQL cannot store",
        ),
    ],
    ids=["empty", "nul"],
)
def test_a_worker_name_the_database_cannot_store_is_refused(worker, refusal):
    with pytest.raises(CommandError) as refused:
        call_command("run_outbox", "--once", "--worker", worker)
    assert str(refused.value) == refusal
