"""Every management command of the package answers `--help`, in a process of its own as a
user runs it: its usage, each of its options, exit status 0 (a lazy `help` once crashed them
all with a TypeError inside argparse)."""

from __future__ import annotations

import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import load_command_class

from django_connector_outbox.management import commands

COMMANDS = sorted(name for _, name, _ in pkgutil.iter_modules(commands.__path__))
ROOT = Path(__file__).resolve().parent.parent


def test_the_package_has_the_commands_the_docs_name():
    assert {"run_outbox", "outbox_status", "outbox_retry", "outbox_cancel", "outbox_prune"} <= set(COMMANDS)


@pytest.mark.parametrize("name", COMMANDS)
def test_help_prints_the_usage_and_every_option_and_exits_0(name):
    result = subprocess.run(
        [sys.executable, "-m", "django", name, "--help", "--settings", "tests.settings"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=60,
    )

    assert result.returncode == 0, result.stderr
    assert re.match(rf"usage: \S+ {name} ", result.stdout), result.stdout[:200]
    parser = load_command_class("django_connector_outbox", name).create_parser("django", name)
    options = {option for action in parser._actions for option in action.option_strings}
    assert options, "a parser with no options"
    assert all(option in result.stdout for option in options)
