"""A fork server for the tests' child processes, running this repository's code."""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
from multiprocessing.context import ForkServerContext
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def fork_server(preload: str) -> ForkServerContext:
    """A fork server that has imported ``preload`` (a module in ``tests/``) once.

    The fork server is started with ``PYTHONPATH`` set to the repository root
    (and ``tests/``), so children run this worktree's ``awaken_langchain``,
    not an installed copy; each child checks that in its first report.
    """
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([preload])
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "tests")])
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved
    return context
