"""The shape of src/slotq, read from its source: no import circles, and
imports that go one way between the layers (docs/architecture.md):

    cli -> client -> transports -> host -> core (the top-level modules)

Every import counts, a lazy one inside a function too (it is a dependency
all the same); only those under `if TYPE_CHECKING:` do not."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
LAYERS = ["cli", "client", "transports", "host", "core"]  # each may import only those after it


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted((SRC / "slotq").rglob("*.py")):
        name = ".".join(p.relative_to(SRC).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = p
    return out


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes under `if TYPE_CHECKING:`."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            out |= {id(n) for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))}
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    tree = ast.parse(path.read_text())
    skip = _type_checking_only(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for a in node.names:
                out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base)
    return {m for m in out if m in modules and m != name}


def graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[1] in LAYERS else "core"  # history/ is core


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


@pytest.mark.timeout(30)
def test_the_graph_is_read_from_the_source() -> None:
    g = graph()
    assert "slotq.host.verdict" in g["slotq.host.hostrun"]  # a module-level import
    assert "slotq.host.orphans" in g["slotq.host.hostrun"]  # and a lazy one, inside a method
    assert "slotq.procinfo" in g["slotq.history"]  # a lazy one, inside a function
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # and circles are found


@pytest.mark.timeout(30)
def test_no_import_circles() -> None:
    assert cycles(graph()) == []


@pytest.mark.timeout(30)
def test_imports_go_down_the_layers_only() -> None:
    upward = sorted(f"{m} -> {t}" for m, ts in graph().items() for t in ts
                    if m != "slotq.cli" and LAYERS.index(layer(m)) > LAYERS.index(layer(t)))
    assert upward == []
