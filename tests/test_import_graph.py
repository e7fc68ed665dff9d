"""The package's modules import one another one way: no import circles.

An import counts when it runs or is read at module level: top-level statements,
class bodies and ``if``/``try`` blocks, ``if TYPE_CHECKING:`` included (a
circle that only type checkers follow still ties two modules together). An
import inside a function body does not count: it runs on first call, after both
modules are loaded. Importing a submodule does not count as importing its
package's ``__init__``; ``from awaken_langchain import X`` counts as importing
``__init__`` only when ``X`` is not a submodule.

Run this file as a script to print the graph and its circles.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = "awaken_langchain"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE


def _modules() -> dict[str, Path]:
    modules = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _module_level(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements that run (or that type checkers read) at module level."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        else:  # if/try/with blocks and class bodies run at import time too
            inner: list[ast.stmt] = []
            for field in ("body", "orelse", "finalbody", "handlers"):
                for child in getattr(node, field, []):
                    inner.extend(child.body if isinstance(child, ast.ExceptHandler) else [child])
            yield from _module_level(inner)


def import_graph() -> dict[str, set[str]]:
    """Each package module and the package modules it imports at module level."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in _module_level(ast.parse(path.read_text(), str(path)).body):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = name.split(".")
                    anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                    for alias in node.names
                ]
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[frozenset[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(frozenset(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_sees_the_package_imports() -> None:
    graph = import_graph()
    assert f"{PACKAGE}.model" in graph[PACKAGE]  # __init__ re-exports the model
    assert f"{PACKAGE}.events" in graph[f"{PACKAGE}.engine"]
    assert f"{PACKAGE}._telemetry" in graph[f"{PACKAGE}.events"]


def test_the_graph_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [frozenset({"a", "b", "c"})]


def test_no_module_imports_itself_back_through_others() -> None:
    assert [sorted(group) for group in circles(import_graph())] == []


def test_events_and_telemetry_import_one_way() -> None:
    graph = import_graph()
    assert f"{PACKAGE}.events" not in graph[f"{PACKAGE}._telemetry"]


def test_the_model_and_its_binding_helpers_import_one_way() -> None:
    graph = import_graph()
    for helper in ("_per_call", "_rebind"):
        assert f"{PACKAGE}.model" not in graph[f"{PACKAGE}.{helper}"]


if __name__ == "__main__":
    graph = import_graph()
    for module in sorted(graph):
        print(module, "->", ", ".join(sorted(graph[module])) or "-")
    for group in circles(graph):
        print("circle:", " <-> ".join(sorted(group)))
