"""Modules depend one way: a module the model is built from never imports the model.

Imports are read from the source (``if TYPE_CHECKING:`` blocks and imports inside
functions included), so a cycle that only the type checker or a late import
sees is found too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import awaken_langchain

PACKAGE = Path(awaken_langchain.__file__).resolve().parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports_of(module: str) -> set[str]:
    """The package's modules that ``module`` imports, anywhere in its source."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(MODULES[module].read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                found.add(name if name in MODULES else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m in MODULES and m not in (module, "awaken_langchain")}


def reaches(start: str, target: str) -> bool:
    """Whether importing ``start`` imports ``target``, directly or through other modules."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        module = todo.pop()
        for imported in imports_of(module) - seen:
            if imported == target:
                return True
            seen.add(imported)
            todo.append(imported)
    return False


def test_no_module_the_model_imports_imports_the_model_back() -> None:
    model = "awaken_langchain.model"
    assert imports_of(model)  # the reading of imports works
    back = sorted(m for m in imports_of(model) if reaches(m, model))
    assert back == []
