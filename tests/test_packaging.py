"""What PyPI shows: a README whose links work there, and one version, read from the metadata."""

from __future__ import annotations

import configparser
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

import django_connector_outbox
from django_connector_outbox.connectors import http
from django_connector_outbox.connectors.discord import DiscordConnector
from django_connector_outbox.connectors.webhook import WebhookConnector

ROOT = Path(__file__).resolve().parent.parent
LANGUAGES = ("de", "fr", "es", "pt_BR")
REPOSITORY = "https://github.com/django-connector-outbox/django-connector-outbox"


# The README is the front page of a clone and of GitHub: its links into the repository are
# relative (docs/..., RELEASING.md), the docs site's pages are the docs/*.md it links.
MARKDOWN_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def test_the_readme_is_a_short_front_page() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


def test_every_relative_link_of_the_readme_names_a_file_and_heading_that_exist() -> None:
    targets = MARKDOWN_LINK.findall((ROOT / "README.md").read_text())
    relative = [t for t in targets if "://" not in t and not t.startswith("mailto:")]
    assert any(t.startswith("docs/") for t in relative)
    missing = []
    for target in relative:
        path, _, anchor = target.partition("#")
        file = ROOT / path if path else ROOT / "README.md"
        if not file.exists() or (anchor and anchor not in _heading_slugs(file)):
            missing.append(target)
    assert missing == []
    # Absolute links only leave the repository: none names a file of it by URL.
    assert [t for t in targets if t.startswith(REPOSITORY + "/blob/")] == []


def _heading_slugs(path: Path) -> set[str]:
    """The anchors of a Markdown file's headings, as GitHub and MyST (myst_heading_anchors) make them."""
    text = re.sub(r"^(```|~~~).*?^\1", "", path.read_text(), flags=re.M | re.S)
    headings = re.findall(r"^#{1,6} (.+)$", text, re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


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


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_the_package_version_is_pyprojects_read_from_the_metadata() -> None:
    declared = pyproject()["version"]
    assert django_connector_outbox.__version__ == metadata.version("django-connector-outbox") == declared
    # Semantic Versioning, in PEP 440's spelling of a pre-release (RELEASING.md).
    assert re.fullmatch(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(rc[1-9]\d*)?", declared)


def test_the_readmes_install_lines_name_what_exists() -> None:
    # Until a release is tagged, the git install names the main branch (a tag that does not
    # exist failed as written); the wheel built from a clone carries pyproject's version.
    readme, version = (ROOT / "README.md").read_text(), pyproject()["version"]
    refs = re.findall(
        r"git\+https://github\.com/django-connector-outbox/django-connector-outbox@(\S+?)\"", readme
    )
    wheels = re.findall(r"django_connector_outbox-(\S+?)-py3-none-any\.whl", readme)
    assert refs and set(refs) == {"main"}  # the Install section's, and the quickstart's with its extra
    assert wheels == [version]
    assert "pip install build" in readme


def test_the_changelog_lists_every_migration_in_its_upgrade_notes() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text()
    migrations = sorted(p.stem for p in (ROOT / "django_connector_outbox" / "migrations").glob("0*.py"))
    assert len(migrations) >= 11
    assert [m for m in migrations if f"| `{m}` |" not in changelog] == []


def test_a_version_tag_builds_checks_and_publishes_with_trusted_publishing() -> None:
    workflow = (ROOT / ".github" / "workflows" / "release.yml").read_text()
    assert re.search(r"^on:\n  push:\n    tags: \[\"v\*\"\]$", workflow, re.M)
    assert "python -m build --outdir dist" in workflow and "twine check --strict dist/*" in workflow
    assert 'test "${GITHUB_REF_NAME}" = "v${version}"' in workflow
    assert "id-token: write" in workflow and "uses: pypa/gh-action-pypi-publish@release/v1" in workflow
    assert "password" not in workflow and "secrets." not in workflow  # no stored token


def _matrix_of_tox() -> dict[str, set[str]]:
    tox = configparser.ConfigParser()
    tox.read(ROOT / "tox.ini")
    found: dict[str, set[str]] = {"python": set(), "django": set(), "database": set()}
    for line in tox["tox"]["env_list"].split():
        if line in ("lint", "docs"):
            continue
        python, django, databases = line.split("-", 2)
        found["python"].add(f"3.{python.removeprefix('py3')}")
        found["django"].add(f"{django.removeprefix('django')[0]}.{django.removeprefix('django')[1:]}")
        found["database"].update(databases.strip("{}").split(","))
    return found


def _matrix_of_readme() -> dict[str, set[str]]:
    text = (ROOT / "README.md").read_text()
    row = {
        name: re.search(rf"^\| {name} \| ([^|]+) \| ([^|]+) \|$", text, re.M)
        for name in ("Python", "Django", "Databases")
    }
    assert all(row.values()), row
    tested = row["Databases"][2].lower()  # type: ignore[index]
    return {
        "python": set(re.findall(r"3\.\d+", row["Python"][1])),  # type: ignore[index]
        "django": set(re.findall(r"\d+\.\d+", row["Django"][1])),  # type: ignore[index]
        "database": {db for db in ("sqlite", "postgres", "mariadb") if db in tested},
    }


def test_the_supported_versions_are_the_same_in_pyproject_tox_and_the_readme() -> None:
    project, tox, readme = pyproject(), _matrix_of_tox(), _matrix_of_readme()
    classifiers = project["classifiers"]
    pythons = {
        c.rsplit(" :: ", 1)[1]
        for c in classifiers
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    }
    djangos = {
        c.rsplit(" :: ", 1)[1] for c in classifiers if re.fullmatch(r"Framework :: Django :: \d+\.\d+", c)
    }
    assert pythons == tox["python"] == readme["python"] == {"3.11", "3.12", "3.13"}
    assert djangos == tox["django"] == readme["django"]
    assert project["requires-python"] == f">={min(pythons, key=lambda v: tuple(map(int, v.split('.'))))}"
    assert f"Django>={min(djangos, key=lambda v: tuple(map(int, v.split('.'))))}" in project["dependencies"]
    assert tox["database"] == readme["database"] == {"sqlite", "postgres", "mariadb"}


def test_the_http_connectors_public_api_is_documented() -> None:
    documented = (ROOT / "docs" / "connectors" / "your-own.md").read_text()
    assert sorted(http.__all__) == [
        "DEFAULT_TIMEOUT", "HttpConnector", "LostReply", "NotSent", "TransportError", "json_or_none",
        "parse_retry_after",
    ]  # fmt: skip
    assert [name for name in http.__all__ if f"`{name}`" not in documented] == []
    stable = ("request", "secrets", "scrub", "check_timeout", "close", "client")
    assert [name for name in stable if not getattr(http.HttpConnector, name).__doc__] == []
    assert [
        name for name in http.__all__ if callable(getattr(http, name)) and not getattr(http, name).__doc__
    ] == []


@pytest.mark.slow
def test_the_wheel_ships_the_fakes_for_users_end_to_end_tests_and_the_translations(tmp_path: Path) -> None:
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

    fakes = {
        "__init__.py",
        "base.py",
        "webhook.py",
        "slack.py",
        "slack_teams.py",
        "discord.py",
        "mattermost.py",
        "teams.py",
        "telegram.py",
    }
    assert {f"django_connector_outbox/fakes/{name}" for name in fakes} <= names
    assert [n for n in names if n.startswith("tests/")] == []
    # The catalogs Django reads (.mo) and their sources (.po), of each language.
    catalogs = {
        f"django_connector_outbox/locale/{lang}/LC_MESSAGES/django.{ext}"
        for lang in LANGUAGES
        for ext in ("po", "mo")
    }
    assert catalogs <= names
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
