"""What `chat` and `demo` write (memory, checkpoints, logs) is private, whatever the umask."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from awaken_langchain.testing import LoopbackProvider, echo_responder

REPO_ROOT = Path(__file__).resolve().parent.parent

# Runs the command under umask 000. Between the two turns (while the memory
# database is open and SQLite keeps its -wal and -shm files) it records the
# mode of everything in --dir, and again once the command has ended.
CHILD = """
import json, os, sys
os.umask(0)
from awaken_langchain.cli import main

directory = sys.argv[1]

def modes():
    found = {}
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            path = os.path.join(root, name)
            found[os.path.relpath(path, directory)] = os.stat(path).st_mode & 0o777
    found["."] = os.stat(directory).st_mode & 0o777
    return found

class Input:
    lines = ["hello\\n", "again\\n"]
    def readline(self):
        if self.lines:
            return self.lines.pop(0)
        print("OPEN " + json.dumps(modes()), file=sys.stderr)
        return ""

status = main(sys.argv[2:], stdin=Input())
print("CLOSED " + json.dumps(modes()), file=sys.stderr)
raise SystemExit(status)
"""


def _run_child(directory: Path, *argv: str) -> tuple[dict[str, int], dict[str, int]]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OPENAI_API_KEY": "test-key"}
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(directory), *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    seen = {}
    for line in result.stderr.splitlines():
        label, _, payload = line.partition(" ")
        if label in ("OPEN", "CLOSED"):
            seen[label] = json.loads(payload)
    return seen.get("OPEN", {}), seen["CLOSED"]


def _readable_by_others(modes: dict[str, int]) -> dict[str, str]:
    return {path: oct(mode) for path, mode in modes.items() if mode & 0o077}


def test_chat_memory_is_private_under_umask_000(tmp_path: Path) -> None:
    directory = tmp_path / "new" / "chat"
    with LoopbackProvider(default=echo_responder()) as server:
        argv = ["chat", "--model", "openai:gpt-4o-mini", "--base-url", server.base_url_openai]
        open_modes, closed_modes = _run_child(directory, *argv, "--dir", str(directory))
    assert "memory.sqlite-wal" in open_modes
    assert "memory.sqlite-shm" in open_modes
    for modes in (open_modes, closed_modes):
        assert modes["."] == 0o700
        assert modes["memory.sqlite"] == 0o600
        assert _readable_by_others(modes) == {}
    assert (tmp_path / "new").stat().st_mode & 0o777 == 0o700  # a parent it created


def test_chat_makes_an_existing_memory_file_private(tmp_path: Path) -> None:
    tmp_path.joinpath("memory.sqlite").touch(0o644)
    os.chmod(tmp_path / "memory.sqlite", 0o644)
    with LoopbackProvider(default=echo_responder()) as server:
        argv = ["chat", "--model", "openai:gpt-4o-mini", "--base-url", server.base_url_openai]
        _, closed_modes = _run_child(tmp_path, *argv, "--dir", str(tmp_path))
    assert closed_modes["memory.sqlite"] == 0o600


@pytest.mark.slow
def test_demo_dir_is_private_under_umask_000(tmp_path: Path) -> None:
    directory = tmp_path / "demo"
    _, closed_modes = _run_child(
        directory, "demo", "--dir", str(directory), "--speed", "40", "--steps", "a"
    )
    assert closed_modes["."] == 0o700
    assert closed_modes["memory.sqlite"] == 0o600
    assert _readable_by_others(closed_modes) == {}
