"""Try the built wheel as a new user would: installed (not the checkout, not editable) in a
new venv, the README's quickstart, then every management command's and every fake's `--help`,
a template and a translation of the package, and the tour of `./demo` (example_project,
copied out of the checkout so that only the wheel's package can be imported), asserting on
what each step prints. This catches what the wheel fails to ship (templates, catalogs, fakes,
a module) and the checkout would hide.

tox -e lint runs it after `python -m build`: `python .ci/try_the_wheel.py DIST_DIR`. pip
installs the wheel's dependencies from the index (its cache keeps a second run quick).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
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


#: The example project's own settings, never the suite's, and nothing of the checkout on the path.
ENV = {
    k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "PYTHONPATH", "DATABASE_URL")
}

#: The steps of ./demo's tour, in its order: a change to ./demo shows up here, to be asserted on.
DEMO_STEPS = [
    "migrate -v 0",
    "demo place",
    "run_outbox --once",
    "demo ship",
    "run_outbox --once",
    "demo admin --url http://127.0.0.1:8000",
]


def run(*args: str, cwd: Path) -> str:
    return run_both(*args, cwd=cwd)[0]


def run_both(*args: str, cwd: Path) -> tuple[str, str]:
    done = subprocess.run(args, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        sys.exit(f"try_the_wheel: {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout, done.stderr


def demo_steps() -> list[list[str]]:
    """The `manage ...` lines of ./demo's tour (the top level's, not the `admin` branch's)."""
    script = (ROOT / "demo").read_text()
    lines = re.findall(r"^manage (.+)$", script, re.M)
    steps = [shlex.split(line.replace('"$url"', "http://127.0.0.1:8000")) for line in lines]
    assert [" ".join(step) for step in steps] == DEMO_STEPS, steps
    return steps


def chat_lines(printed: str) -> list[str]:
    return [line for line in printed.splitlines() if line.startswith("[chat] ")]


def run_the_demo(python: str, work: Path) -> None:
    """./demo's tour against the wheel: example_project copied out of the checkout (its `shop`
    app and settings only), django-environ installed as ./demo does, a new SQLite database."""
    project = work / "example_project"
    shutil.copytree(
        ROOT / "example_project", project, ignore=shutil.ignore_patterns("*.sqlite3", "__pycache__")
    )
    pip = (python, "-m", "pip", "install", "-q", "--disable-pip-version-check")
    run(*pip, "django-environ", cwd=work)
    printed = [run_both(python, "manage.py", *step, cwd=project) for step in demo_steps()]
    (_, _), (placed, _), (sent, sent_log), (shipped, _), (edited, edited_log), (admin, _) = printed

    assert placed == "Placed orders #1 and #2; their posts are queued.\n", placed
    kinds = [" ".join(line.split()[1:3]) for line in chat_lines(sent)]
    assert kinds == [
        "message order-1-placed", "status order-1-status", "reaction order-1-ack",
        "message order-2-placed", "status order-2-status", "reaction order-2-ack",
    ], sent  # fmt: skip
    assert "Subject: New order #1" in sent and "Subject: New order #2" in sent, sent  # the mailbox
    assert " posted=8 " in sent_log and " failed=0 " in sent_log, sent_log
    assert shipped == "Shipped order #1; its status post will be edited in place.\n", shipped
    assert chat_lines(edited) == ["[chat] edit order-1-status -> T-SHOP/C-ORDERS (ref C-ORDERS:2)"], edited
    assert '{"text": "Order #1: shipped"}' in edited and " posted=1 " in edited_log, edited
    login = re.match(r"Log in at http://127\.0\.0\.1:8000/admin/ as admin, password (\S+)\n", admin)
    assert login, admin
    check = f"from django.contrib.auth import authenticate; print(authenticate(username='admin', password={login[1]!r}) is not None)"
    assert run(python, "manage.py", "shell", "-v", "0", "-c", check, cwd=project).strip() == "True"


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

        demo_started = time.monotonic()
        run_the_demo(python, work)
        demo_took = time.monotonic() - demo_started
    print(
        f"try_the_wheel: {wheel.name} in a new venv: the quickstart, {len(names['command'])} commands' and "
        f"{len(names['fake'])} fakes' --help, a template and a catalog, ./demo's tour ({demo_took:.0f} s), "
        f"in {time.monotonic() - started:.0f} s"
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
