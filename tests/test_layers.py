"""Imports run one way: command -> sender -> outbox -> store -> models, with no circle.

Every import of the package's own modules counts, those inside functions too (a lazy import
hides a circle from Python, not from a reader); those under `if TYPE_CHECKING` do not.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "django_connector_outbox"
NAME = PACKAGE.name
# Each layer, and the layers above it, which it never imports.
LAYERS = ["models", "store", "outbox", "sender", "management"]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts}

    def owner(name: str) -> str:
        while name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                node.body = []
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(NAME):
                targets = [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names if alias.name.startswith(NAME)]
            else:
                continue
            graph[name] |= {owner(target) for target in targets} - {name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                found.append(sorted([v, *component]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_of_the_package_imports_itself_back_through_others():
    graph = import_graph()
    assert len(graph) > 60
    assert circles(graph) == []


def test_the_finder_sees_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("layer", LAYERS[:-1])
def test_a_layer_never_imports_the_layers_above_it(layer):
    graph = import_graph()
    above = LAYERS[LAYERS.index(layer) + 1 :]
    mine = [name for name in graph if name.split(".")[1:2] == [layer]]
    assert mine
    upward = sorted(
        (name, target) for name in mine for target in graph[name] if set(target.split(".")[1:2]) & set(above)
    )
    assert upward == []
