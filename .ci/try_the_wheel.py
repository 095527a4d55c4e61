"""Try the built wheel as a new user would: installed (not the checkout, not editable) in a
new venv, the README's quickstart, then every management command's and every fake's `--help`,
a template and a translation of the package. This catches what the wheel fails to ship
(templates, catalogs, fakes, a module) and the checkout would hide.

tox -e lint runs it after `python -m build`: `python .ci/try_the_wheel.py DIST_DIR`. pip
installs the wheel's dependencies from the index (its cache keeps a second run quick).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.test_quickstart import run_quickstart  # noqa: E402  (the checkout's tests, not its package)

#: The quickstart's extra and those the shipped fakes and the "Add to Slack" tag import.
EXTRAS = "webhook,slack,discord,google-chat"

#: Run by the venv's Python, in the quickstart's project: what it finds, one per line.
SHIPPED = """
import pkgutil
from pathlib import Path

import django_connector_outbox
from django_connector_outbox import fakes
from django_connector_outbox.management import commands

assert "site-packages" in django_connector_outbox.__file__, django_connector_outbox.__file__
for module in pkgutil.iter_modules(commands.__path__):
    print("command", module.name)
for module in pkgutil.iter_modules(fakes.__path__):
    source = Path(fakes.__path__[0], module.name + ".py").read_text()
    if 'if __name__ == "__main__":' in source:
        print("fake", module.name)
"""

#: The template tag, its template and a compiled catalog, as a project's page would use them.
RENDERED = """
from django.template import Context, Template
from django.utils import translation

with translation.override("de"):
    page = Template('{% load connector_outbox %}{% add_to_slack_button "chat" %}').render(Context())
print(page)
"""


def run(*args: str, cwd: Path) -> str:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        sys.exit(f"try_the_wheel: {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def main(dist: Path) -> None:
    started = time.monotonic()
    [wheel] = dist.glob("*.whl")
    with tempfile.TemporaryDirectory(prefix="try-the-wheel-") as tmp:
        work = Path(tmp)
        venv.create(work / "venv", with_pip=True)
        python = str(work / "venv" / "bin" / "python")
        run(
            python,
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            f"{wheel}[{EXTRAS}]",
            cwd=work,
        )
        project = run_quickstart(python, work)

        found = run(python, "manage.py", "shell", "-c", SHIPPED, cwd=project).splitlines()
        names = {
            kind: [line.split()[1] for line in found if line.startswith(f"{kind} ")]
            for kind in ("command", "fake")
        }
        assert len(names["command"]) >= 6 and len(names["fake"]) >= 7, names
        for name in names["command"]:
            assert f"manage.py {name}" in run(python, "manage.py", name, "--help", cwd=project), name
        for name in names["fake"]:
            assert "--port" in run(
                python, "-m", f"django_connector_outbox.fakes.{name}", "--help", cwd=project
            ), name

        # The quickstart's project has no install view routed: the tag must say so, in a page
        # that does route it, it renders. Route it, as docs/installations.md says.
        urls = project / "mysite" / "urls.py"
        urls.write_text(
            urls.read_text().replace("from django.urls import path", "from django.urls import include, path")
            + 'urlpatterns += [path("slack/", include("django_connector_outbox.installations.slack_urls"))]\n'
        )
        page = run(python, "manage.py", "shell", "-c", RENDERED, cwd=project)
        assert 'href="/slack/install/chat/"' in page and "Zu Slack hinzufügen" in page, page
    print(
        f"try_the_wheel: {wheel.name} in a new venv: the quickstart, {len(names['command'])} commands' and "
        f"{len(names['fake'])} fakes' --help, a template and a catalog, in {time.monotonic() - started:.0f} s"
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
