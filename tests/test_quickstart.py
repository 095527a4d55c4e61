"""The README's quickstart, run as a new user would: a new project, its settings, migrate, a
post queued from the shell, and the sender printing it.

The blocks are read from the README's "Quickstart" section, so the section cannot drift; the
sender runs with `--once` where the README starts it with `--autoreload` beside runserver
(tests/test_run_outbox_autoreload.py covers the reloader).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.doc_blocks import ROOT, python_blocks

pytestmark = pytest.mark.slow


def quickstart() -> tuple[str, str, str, str]:
    """The settings to add, the shell session, the expected output, and the sh commands."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    start = readme.index("\n## Quickstart\n")
    end = readme.index("\n## ", start + 1)
    first, last = readme[:start].count("\n") + 1, readme[:end].count("\n") + 1
    settings, shell = [b.code for b in python_blocks(ROOT / "README.md") if first < b.line < last][:2]
    section = readme[start:end]
    [printed] = re.findall(r"```text\n(.*?)```", section, re.S)
    commands = "\n".join(re.findall(r"```sh\n(.*?)```", section, re.S))
    return settings, shell, printed, commands


def test_the_readmes_quickstart_prints_the_post_it_queued(tmp_path: Path) -> None:
    run_quickstart(sys.executable, tmp_path)


def run_quickstart(python: str, workdir: Path) -> Path:
    """The quickstart with this interpreter (of the venv the package is installed in, the
    checkout's or the wheel's: .ci/try_the_wheel.py), in workdir; the project's directory."""
    settings, shell, printed, commands = quickstart()
    assert "django-admin startproject mysite" in commands
    assert "python manage.py migrate" in commands and "run_outbox --autoreload" in commands
    # The project's own settings, not the suite's: manage.py sets DJANGO_SETTINGS_MODULE only
    # when it is unset.
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "PYTHONPATH")}

    def run(*args: str, cwd: Path) -> str:
        done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{args}: {done.stdout}\n{done.stderr}"
        return done.stdout

    run(python, "-m", "django", "startproject", "mysite", cwd=workdir)
    project = workdir / "mysite"
    with (project / "mysite" / "settings.py").open("a", encoding="utf-8") as file:
        file.write("\n" + settings + "\n")
    manage = (python, "manage.py")
    assert "System check identified no issues" in run(*manage, "check", cwd=project)
    run(*manage, "migrate", "-v", "0", cwd=project)
    run(*manage, "shell", "-c", shell, cwd=project)
    assert run(*manage, "run_outbox", "--once", "-v", "0", cwd=project) == printed
    return project
