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


@pytest.mark.parametrize(
    ("args", "refusal"),
    [
        (["--concurrency", "x"], "argument --concurrency: must be a whole number of at least 1, got 'x'"),
        (["--batch", "1.5"], "argument --batch: must be a whole number of at least 1, got '1.5'"),
        (["--batch", "0"], "argument --batch: must be at least 1, got 0"),
        (["--max-posts", "many"], "argument --max-posts: must be a whole number of at least 1, got 'many'"),
        (
            ["--metrics-port", "http"],
            "argument --metrics-port: must be a port number from 0 to 65535, got http",
        ),
        (
            ["--metrics-port", "70000"],
            "argument --metrics-port: must be a port number from 0 to 65535, got 70000",
        ),
        (["--poll", "soon"], "argument --poll: must be more than 0 and at most 315360000 seconds, got soon"),
        (
            ["--max-runtime", "1h"],
            "argument --max-runtime: must be more than 0 and at most 315360000 seconds, got 1h",
        ),
    ],
)
def test_a_value_that_is_no_number_is_refused_without_naming_a_python_function(args, refusal):
    with pytest.raises(CommandError) as refused:
        call_command("run_outbox", "--once", *args)
    assert str(refused.value) == f"Error: {refusal}"
