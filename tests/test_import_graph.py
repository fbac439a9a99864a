"""The package's import graph, read from the source: the arrows the design
forbids, and no import circle anywhere. A module-level import and one inside
a function both count: an arrow hidden in a function is still an arrow."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "letsinfer"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def graph() -> dict[str, set[str]]:
    """Module -> the letsinfer modules it imports (a package import counts as
    its ``__init__``; ``from pkg import mod`` as ``pkg.mod`` when that is a module)."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                    for a in node.names
                ]
            else:
                continue
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target.startswith("letsinfer") and target != name:
                    found.add(target)
        edges[name] = found
    return edges


def under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def arrows(source: str, target: str) -> list[str]:
    return sorted(
        f"{a} -> {b}"
        for a, bs in graph().items()
        if under(a, source)
        for b in bs
        if under(b, target)
    )


@pytest.mark.parametrize(
    ("source", "target"),
    [
        # A child runs its agent and no authority code.
        ("letsinfer.agent", "letsinfer.authority"),
        # The authority decides; it neither runs engines nor reaches into lifecycle.
        ("letsinfer.authority", "letsinfer.agent"),
        ("letsinfer.authority", "letsinfer.lifecycle"),
        # The store is the floor: SQL over plain records, importing nothing above it.
        ("letsinfer.store", "letsinfer.authority"),
        ("letsinfer.store", "letsinfer.agent"),
        ("letsinfer.store", "letsinfer.gateway"),
        ("letsinfer.store", "letsinfer.lifecycle"),
        ("letsinfer.store", "letsinfer.cli"),
        ("letsinfer.store", "letsinfer.control"),
        # The gateway's request path never writes the authority's tables.
        ("letsinfer.gateway", "letsinfer.cli"),
        # The servers (the admin API, the authority) never import the CLI: what
        # both show is computed below it, so local and remote output agree.
        ("letsinfer.control", "letsinfer.cli"),
        ("letsinfer.authority", "letsinfer.cli"),
    ],
)
def test_a_forbidden_arrow_is_absent(source: str, target: str) -> None:
    assert arrows(source, target) == []


def test_no_module_imports_itself_through_others() -> None:
    edges = graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    import sys

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for v in sorted(edges):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    assert circles == []


def test_no_file_of_the_package_is_longer_than_700_lines() -> None:
    long = {
        str(p.relative_to(PACKAGE.parent)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 700
    }
    assert long == {}


def test_the_graph_counts_an_import_inside_a_function() -> None:
    """The reader itself: `model add --external`'s signing code is imported
    inside a function (so that `model list` does not load it); it is an arrow."""
    assert "letsinfer.audit.anchor" in graph()["letsinfer.cli.model_external"]
    assert "letsinfer.audit.anchor" not in {
        b for a, bs in graph().items() if a == "letsinfer.cli.model" for b in bs
    }
