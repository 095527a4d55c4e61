"""Every Python example of the docs runs here, read from the files, so the docs cannot drift.

The files: the top-level *.md (README.md, ...) and docs/**/*.md. Every fenced block whose
language is python (or py) is found, and run according to what it is:

- settings (imports and assignments, `+=` included, to UPPER_CASE names only), or the entries
  of a dict (one source of CONNECTORS): evaluated over a copy of the test settings, with the
  variables they read from `os.environ` (``os.environ[...]``, ``.get``, ``os.getenv``) set to
  placeholder values, and django-environ's `env()` giving the same; then CONNECTOR_OUTBOX (or
  the sources) must pass the package's system
  checks, INSTALLED_APPS must name importable apps, and LOGGING must be accepted by dictConfig
  and show the package's INFO lines (in a subprocess, so this process's logging is untouched);
- code: run on the test database, in order after the code blocks before it in the same file
  (one namespace per file, as in a doctest, which is a module in sys.modules, so that a
  connector class it defines can be a BACKEND), with memory connectors for the sources the
  docs name. Each `test_*` function it defines is then run as a test of its own, its arguments being
  pytest fixtures, and each unittest TestCase class it defines is run too.

A block that cannot run is preceded by ``<!-- docs-test: compile-only: why -->``; it must still
compile, and the why must be given.
"""

from __future__ import annotations

import ast
import copy
import importlib.util
import inspect
import os
import re
import subprocess
import sys
import types
import unittest
from typing import Any
from unittest import mock

import pytest
from django.apps import apps
from django.conf import settings
from django.core.checks import run_checks
from django.test import override_settings

from django_connector_outbox.testing import MEMORY_BACKEND
from tests.doc_blocks import ROOT, Block, python_blocks

DOC_FILES = sorted({*ROOT.glob("*.md"), *(ROOT / "docs").rglob("*.md")})
# The source names the docs use; code examples run with a memory connector for each.
DOC_SOURCES = ("slack", "discord", "hooks", "chat")

MODES = {"compile-only"}


BLOCKS = [block for path in DOC_FILES for block in python_blocks(path)]


def parse(block: Block) -> tuple[str, ast.Module]:
    """What the block is ("settings", "entries" or "code"), and its tree (lines as in the file)."""
    try:
        tree, kind = ast.parse(block.code), "code"
    except SyntaxError:
        # Not a module: the entries of a dict, such as one source of CONNECTORS?
        tree, kind = ast.parse("__entries__ = {\n" + block.code + "\n}"), "entries"
        ast.increment_lineno(tree, block.line - 1)
        return kind, tree
    ast.increment_lineno(tree, block.line)
    assignments = ast.Assign | ast.AnnAssign | ast.AugAssign
    if any(isinstance(s, assignments) for s in tree.body) and all(
        isinstance(s, ast.Import | ast.ImportFrom) or (isinstance(s, assignments) and _sets_settings(s))
        for s in tree.body
    ):
        kind = "settings"
    return kind, tree


def _sets_settings(statement: ast.Assign | ast.AnnAssign | ast.AugAssign) -> bool:
    targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
    for target in targets:
        while isinstance(target, ast.Subscript | ast.Attribute):
            target = target.value
        if not (isinstance(target, ast.Name) and target.id.isupper()):
            return False
    return True


def defined_tests(block: Block) -> list[str]:
    kind, tree = parse(block)
    if kind != "code" or block.mode:
        return []
    return [s.name for s in tree.body if isinstance(s, ast.FunctionDef) and s.name.startswith("test")]


# -- the files are read completely ---------------------------------------------------------------


def test_every_python_block_of_the_docs_is_found():
    for path in DOC_FILES:
        text = path.read_text(encoding="utf-8")
        fences = re.findall(r"^\s*```(?:python|py|python3)\s*$", text, flags=re.MULTILINE | re.IGNORECASE)
        assert len(python_blocks(path)) == len(fences), path
    assert ROOT / "README.md" in DOC_FILES and any(path.parent.name == "connectors" for path in DOC_FILES)
    assert len(BLOCKS) >= 10


def test_the_extractor_reads_fences_markers_and_indented_blocks(tmp_path):
    (tmp_path / "x.md").write_text(
        "Text\n\n```python\nA = 1\n```\n\n<!-- docs-test: compile-only: it needs your model -->\n\n"
        "```py\nOrder.objects.create()\n```\n\n- a list item:\n\n  ```python\n  def f():\n      return 2\n  ```\n"
        "```sh\necho not python\n```\n"
    )
    assert [(b.line, b.code, b.mode, b.why) for b in python_blocks(tmp_path / "x.md")] == [
        (3, "A = 1", "", ""),
        (9, "Order.objects.create()", "compile-only", "it needs your model"),
        (15, "def f():\n    return 2", "", ""),
    ]


def test_settings_examples_get_placeholders_for_what_they_read_from_os_environ():
    tree = ast.parse(
        "import os\nfrom os import environ\nA = os.environ['A_TOKEN']\nB = os.environ.get('B_URL', 'x')\n"
        "C = os.getenv('C')\nD = environ['D']\nE = os.environ[name]\n"
    )
    assert environment_read(tree) == {"A_TOKEN", "B_URL", "C", "D"}
    names: dict[str, Any] = {}
    with mock.patch.dict(os.environ, {name: placeholder(name) for name in environment_read(tree)}):
        exec(
            compile(
                ast.parse("import os\nTOKEN = os.environ['A_TOKEN']\nHOOK = os.environ['B_URL']"), "x", "exec"
            ),
            names,
        )
    assert (names["TOKEN"], names["HOOK"]) == ("test-a-token", "https://example.com/b_url")
    assert "A_TOKEN" not in os.environ


# -- every block ---------------------------------------------------------------------------------


def placeholder(name: str) -> str:
    """A value of the right shape for the environment variable `name` of a settings example."""
    if name.endswith("URL"):
        return f"https://example.com/{name.lower()}"
    if name == "TELEGRAM_BOT_TOKEN":  # @BotFather's form, digits:letters (check E251)
        return "123456789:test-telegram-bot-token"
    return f"test-{name.lower().replace('_', '-')}"


def environment_read(tree: ast.Module) -> set[str]:
    """The variables a block reads by a literal name: os.environ[...], .get(...), os.getenv(...)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and _is_environ(node.value):
            key = node.slice
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.args
            and (
                (node.func.attr in ("get", "setdefault") and _is_environ(node.func.value))
                or (node.func.attr == "getenv" and isinstance(node.func.value, ast.Name))
            )
        ):
            key = node.args[0]
        else:
            continue
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            names.add(key.value)
    return names


def _is_environ(node: ast.expr) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ"
    )


class FakeEnv:
    """django-environ's `env` in settings examples: placeholder values of the right shape."""

    def __call__(self, name: str, default: Any = None, **kwargs: Any) -> Any:
        return default if default is not None else placeholder(name)

    def __getattr__(self, cast: str) -> Any:  # env.int(...), env.bool(...), ...
        return self


@pytest.fixture
def docs_settings(db):
    """The settings the docs' code runs under: a memory connector for each source they name."""
    sources = {name: {"BACKEND": MEMORY_BACKEND} for name in DOC_SOURCES}
    with override_settings(CONNECTOR_OUTBOX={"CONNECTORS": sources}):
        yield


def outbox_errors() -> list[str]:
    # The app's checks, on the database the test may use (on MySQL the suite has a second alias).
    found = run_checks(app_configs=[apps.get_app_config("django_connector_outbox")], databases=["default"])
    return [
        f"{m.id}: {m.msg}" for m in found if (m.id or "").startswith("connector_outbox.") and m.is_serious()
    ]


def check_settings(block: Block, names: dict[str, Any]) -> None:
    if "CONNECTOR_OUTBOX" in names:
        with override_settings(CONNECTOR_OUTBOX=names["CONNECTOR_OUTBOX"]):
            assert outbox_errors() == [], block.where
    for app in names.get("INSTALLED_APPS", ()):
        if isinstance(app, str):
            assert importlib.util.find_spec(app.split(".")[0]) is not None, f"{block.where}: {app}"
    if "LOGGING" in names:
        check_logging(block, names["LOGGING"])


def check_logging(block: Block, logging_settings: dict[str, Any]) -> None:
    code = (
        "import ast, logging, logging.config, sys\n"
        "logging.config.dictConfig(ast.literal_eval(sys.argv[1]))\n"
        "sender = logging.getLogger('django_connector_outbox.sender')\n"
        "assert sender.isEnabledFor(logging.INFO) and sender.hasHandlers()\n"
    )
    run = subprocess.run([sys.executable, "-c", code, repr(logging_settings)], capture_output=True, text=True)
    assert run.returncode == 0, f"{block.where}: {run.stderr}"


def run_file_up_to(block: Block) -> dict[str, Any]:
    """Run the code blocks of the block's file, up to and including it, in one namespace: a
    module registered in sys.modules (until the next run of the file), so that what it
    defines has an importable dotted path."""
    name = "docs_" + re.sub(r"\W", "_", str(block.path.relative_to(ROOT)))
    module = sys.modules[name] = types.ModuleType(name)
    namespace: dict[str, Any] = module.__dict__
    for earlier in python_blocks(block.path):
        if earlier.line > block.line:
            break
        kind, tree = parse(earlier)
        if kind == "code" and not earlier.mode:
            exec(compile(tree, str(earlier.path), "exec"), namespace)
    return namespace


@pytest.mark.parametrize("block", BLOCKS, ids=[b.where for b in BLOCKS])
def test_the_example_runs(block, docs_settings):
    kind, tree = parse(block)  # a block that is neither Python nor dict entries fails here
    if block.mode:
        assert block.mode in MODES, f"{block.where}: unknown docs-test mode {block.mode!r}"
        assert block.why, (
            f"{block.where}: say why the block cannot run: <!-- docs-test: {block.mode}: why -->"
        )
        compile(tree, str(block.path), "exec")
        return
    if kind == "code":
        namespace = run_file_up_to(block)
        for value in list(namespace.values()):
            if (
                isinstance(value, type)
                and issubclass(value, unittest.TestCase)
                and value.__module__ == namespace["__name__"]
            ):
                result = unittest.TestResult()
                unittest.defaultTestLoader.loadTestsFromTestCase(value).run(result)
                assert result.testsRun and result.wasSuccessful(), [
                    e[1] for e in result.errors + result.failures
                ]
        return
    # The settings the block reads (DATABASES["default"]... = ...), as the tests have them.
    read = {
        n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id.isupper() and hasattr(settings, n.id)
    }
    names = {name: copy.deepcopy(getattr(settings, name)) for name in read}
    names["env"], names["os"] = FakeEnv(), os
    with mock.patch.dict(os.environ, {name: placeholder(name) for name in environment_read(tree)}):
        exec(compile(tree, str(block.path), "exec"), names)
    if kind == "entries":
        entries = names["__entries__"]
        if all(isinstance(entry, dict) and "BACKEND" in entry for entry in entries.values()):
            names = {"CONNECTOR_OUTBOX": {"CONNECTORS": entries}}
    check_settings(block, names)


TESTS = [(block, name) for block in BLOCKS for name in defined_tests(block)]


@pytest.mark.parametrize(("block", "name"), TESTS, ids=[f"{b.where}::{name}" for b, name in TESTS])
def test_the_examples_test_passes(block, name, docs_settings, request):
    """A `test_*` function of the docs, run with the fixtures it names."""
    function = run_file_up_to(block)[name]
    function(
        **{argument: request.getfixturevalue(argument) for argument in inspect.signature(function).parameters}
    )
