"""What PyPI shows: a README whose links work there, and one version, read from the metadata."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

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
