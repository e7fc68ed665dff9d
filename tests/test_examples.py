"""Every Python example in README.md and docs/ runs, offline, against the loopback provider.

Each ```python block is one test (its id is the file and line where the block
starts) and runs in a process of its own, forked from one interpreter that has
imported LangChain and the SDKs already (``tests/example_runner.py``). Most
examples point their clients at a `LoopbackProvider` themselves; for the ones
written for the real APIs, the clients' environment variables
(``OPENAI_BASE_URL``, ``ANTHROPIC_BASE_URL`` and dummy keys) point at a
loopback provider started for the block. A block
preceded by an HTML comment ``<!-- not run: reason -->`` is only compiled: keep
that for an example that truly needs a real key or service. A block whose first
line names a pytest file (``# test_my_store.py``) is a test module: it is
written to that file and run with pytest, which must pass it.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from awaken_langchain.testing import LoopbackProvider, echo_responder

REPO_ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"(<!--\s*not run:[^>]*-->\s*\n)?```python\n(.*?)^```", re.S | re.M)
TEST_MODULE = re.compile(r"# (test_\w+\.py)\n")
DEPRECATED_MEMORY = re.compile(r"\b(InMemoryChatMessageHistory|BaseChatMessageHistory)\b")


class Example(NamedTuple):
    path: str
    line: int
    runnable: bool
    source: str


def examples() -> list[Example]:
    files = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]
    found = []
    for file in files:
        text = file.read_text(encoding="utf-8")
        for match in BLOCK.finditer(text):
            line = text[: match.start(2)].count("\n")
            path = file.relative_to(REPO_ROOT).as_posix()
            found.append(Example(path, line, match.group(1) is None, match.group(2)))
    return found


EXAMPLES = examples()


def test_the_docs_have_examples_to_run() -> None:
    assert sum(e.runnable for e in EXAMPLES) >= 20
    assert {e.path for e in EXAMPLES} >= {"README.md", "docs/getting-started.md"}


@pytest.mark.parametrize("example", EXAMPLES, ids=[f"{e.path}:{e.line}" for e in EXAMPLES])
def test_example_uses_no_deprecated_memory_classes(example: Example) -> None:
    # the BaseChatMessageHistory family is deprecated in langchain-core 1.x
    assert not DEPRECATED_MEMORY.search(example.source), f"{example.path}:{example.line}"


@pytest.fixture(scope="session")
def example_runner() -> Iterator[subprocess.Popen[str]]:
    runner = subprocess.Popen(
        [sys.executable, str(REPO_ROOT / "tests" / "example_runner.py")],
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert runner.stdin is not None
    assert runner.stdout is not None
    assert json.loads(runner.stdout.readline()) == {"ready": True}
    yield runner
    runner.stdin.close()
    runner.wait(timeout=30)


def as_script(example: Example) -> str:
    """The source that runs ``example``: itself, or pytest on it if it is a test module."""
    module = TEST_MODULE.match(example.source)
    if module is None:
        return example.source
    return (
        "import pathlib, pytest\n"
        f"pathlib.Path({module[1]!r}).write_text({example.source!r})\n"
        f"raise SystemExit(pytest.main([{module[1]!r}, '-q', '-p', 'no:cacheprovider']))\n"
    )


@pytest.mark.slow
@pytest.mark.parametrize("example", EXAMPLES, ids=[f"{e.path}:{e.line}" for e in EXAMPLES])
def test_example_runs(
    example: Example, tmp_path: Path, example_runner: subprocess.Popen[str]
) -> None:
    where = f"{example.path}:{example.line}"
    compile(example.source, where, "exec")
    if not example.runnable:
        return
    with LoopbackProvider(default=echo_responder("Here is an answer: ")) as server:
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("LANGSMITH_", "LANGCHAIN_", "OTEL_"))
        }
        env.update(
            PYTHONPATH=str(REPO_ROOT),
            OPENAI_BASE_URL=server.base_url_openai,
            OPENAI_API_BASE=server.base_url_openai,
            OPENAI_API_KEY="x",
            ANTHROPIC_BASE_URL=server.url,
            ANTHROPIC_API_URL=server.url,
            ANTHROPIC_API_KEY="x",
        )
        job = {"source": as_script(example), "where": where, "env": env, "cwd": str(tmp_path)}
        assert example_runner.stdin is not None
        assert example_runner.stdout is not None
        example_runner.stdin.write(json.dumps({**job, "timeout": 120}) + "\n")
        example_runner.stdin.flush()
        done = json.loads(example_runner.stdout.readline())
    assert done["status"] == 0, f"{where}:\n{done['output']}"


REFERENCED_MODULES = (
    "awaken_langchain",
    "awaken_langchain.stores",
    "awaken_langchain.stores.redis",
    "awaken_langchain.middleware",
    "awaken_langchain.history",
    "awaken_langchain.events",
    "awaken_langchain.testing",
)


@pytest.mark.parametrize("module_name", REFERENCED_MODULES)
def test_the_api_reference_documents_every_public_name(module_name: str) -> None:
    # mkdocstrings leaves out members without a docstring, so each one needs its own
    module = importlib.import_module(module_name)
    pages = (REPO_ROOT / "docs" / "reference").glob("*.md")
    assert any(f"::: {module_name}\n" in page.read_text() for page in pages)
    undocumented = [
        name
        for name in module.__all__
        if (inspect.isclass(obj := getattr(module, name)) or inspect.isroutine(obj))
        and not inspect.getdoc(obj)
    ]
    assert undocumented == []
