"""What PyPI shows: a README whose links work there, and one version, read from the metadata."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import tomllib
import urllib.request
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from django_connector_outbox.connectors.discord import DiscordConnector
from django_connector_outbox.connectors.webhook import WebhookConnector

ROOT = Path(__file__).resolve().parent.parent
REPOSITORY = "https://github.com/django-connector-outbox/django-connector-outbox"


def test_every_link_and_image_of_the_readme_is_absolute() -> None:
    # PyPI renders the README away from the repository: relative paths and #anchors break there.
    targets = re.findall(r"!?\[[^\]]*\]\(([^)\s]+)\)", (ROOT / "README.md").read_text())
    assert targets
    assert [t for t in targets if not t.startswith("https://")] == []


def test_the_readmes_links_into_the_repository_name_files_that_exist() -> None:
    text = (ROOT / "README.md").read_text()
    paths = re.findall(rf"{REPOSITORY}/blob/main/([^)#\s]+)", text)
    paths += re.findall(r"https://raw\.githubusercontent\.com/[^/]+/[^/]+/main/([^)\s]+)", text)
    assert [p for p in paths if not (ROOT / p).is_file()] == []


def test_the_version_is_written_once_and_the_user_agents_read_it() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    package = ROOT / "django_connector_outbox"
    assert [p for p in package.rglob("*.py") if declared in p.read_text()] == []
    version = metadata.version("django-connector-outbox")
    assert (
        DiscordConnector.user_agent
        == f"DiscordBot (https://pypi.org/project/django-connector-outbox/, {version})"
    )
    assert WebhookConnector.user_agent == f"django-connector-outbox-webhook/{version}"


@pytest.mark.slow
def test_the_wheel_ships_the_fakes_for_users_end_to_end_tests(tmp_path: Path) -> None:
    pytest.importorskip("setuptools", minversion="77")
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in", "CHANGELOG.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "django_connector_outbox", source / "django_connector_outbox")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
         "-w", str(tmp_path / "dist"), str(source)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    [wheel] = (tmp_path / "dist").glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())

    fakes = {"__init__.py", "base.py", "webhook.py"}
    assert {f"django_connector_outbox/fakes/{name}" for name in fakes} <= names
    assert [n for n in names if n.startswith("tests/")] == []
    # What the wheel ships imports nothing of the test suite, which it does not ship.
    shipped = (ROOT / "django_connector_outbox").rglob("*.py")
    assert [p.name for p in shipped if re.search(r"^\s*(from|import) tests\b", p.read_text(), re.M)] == []


def test_the_shipped_webhook_fake_runs_as_a_process() -> None:
    with subprocess.Popen(
        [sys.executable, "-m", "django_connector_outbox.fakes.webhook", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    ) as process:
        try:
            assert process.stdout is not None
            url = process.stdout.readline().strip()
            assert re.fullmatch(r"http://127\.0\.0\.1:\d+/hook", url)
            with urllib.request.urlopen(url.replace("/hook", "/_fake/state"), timeout=10) as response:
                assert json.loads(response.read()) == {"calls": [], "deliveries": []}
        finally:
            process.send_signal(signal.SIGTERM)
        assert process.wait(10) == 0
