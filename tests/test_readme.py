"""The README's Python examples run, offline, against the loopback provider.

Each ```python block runs in a fresh interpreter whose OpenAI and Anthropic
settings point at a loopback provider. A block preceded by an HTML comment
``<!-- not run: reason -->`` is only compiled (for example, one that needs a
real Redis host).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from awaken_langchain.testing import LoopbackProvider, echo_responder

REPO_ROOT = Path(__file__).resolve().parent.parent
README = REPO_ROOT / "README.md"
BLOCK = re.compile(r"(<!--\s*not run:[^>]*-->\s*)?```python\n(.*?)```", re.S)


def blocks() -> list[tuple[int, bool, str]]:
    text = README.read_text(encoding="utf-8")
    return [
        (text[: m.start()].count("\n") + 1, m.group(1) is None, m.group(2))
        for m in BLOCK.finditer(text)
    ]


@pytest.mark.parametrize(("line", "runnable", "source"), blocks(), ids=lambda v: str(v)[:12])
def test_readme_python_example_runs(line: int, runnable: bool, source: str) -> None:
    compile(source, f"README.md:{line}", "exec")
    if not runnable:
        return
    with LoopbackProvider(default=echo_responder("Here is an answer: ")) as server:
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO_ROOT),
            "OPENAI_API_BASE": server.base_url_openai,
            "OPENAI_BASE_URL": server.base_url_openai,
            "OPENAI_API_KEY": "x",
            "ANTHROPIC_BASE_URL": server.url,
            "ANTHROPIC_API_URL": server.url,
            "ANTHROPIC_API_KEY": "x",
        }
        done = subprocess.run(
            [sys.executable, "-c", source],
            env=env,
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, f"README.md line {line}:\n{done.stderr}"
