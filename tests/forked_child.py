"""A child process forked from a fork server, and the reports it sends on a pipe.

The crash tests (``test_crash_recovery.py``, ``test_tool_ledger_crash.py``)
drive their children the same way: the child's ``run(spec, conn)`` sends
dictionaries with an ``"event"`` name (``"started"`` first, with the path of
the ``awaken_langchain`` it imported; ``"done"`` last), may wait for ``"go"``
at a block point, and writes its standard error to ``<output_dir>/<name>.err``.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.context import ForkServerContext
from pathlib import Path
from typing import Any, Protocol

import pytest

WAIT = 60.0
"""Longest wait for a child's report; reached only when something is broken."""

REPO_ROOT = Path(__file__).resolve().parent.parent


class Spec(Protocol):
    """What a child's spec tells the driver: its name and where its files go."""

    @property
    def name(self) -> str: ...

    @property
    def output_dir(self) -> str: ...


class ForkedChild:
    """One child process and its report pipe; it has started when this returns."""

    def __init__(
        self,
        context: ForkServerContext,
        target: Callable[[Any, Connection], None],
        spec: Spec,
    ) -> None:
        self.spec = spec
        self.events: list[dict[str, Any]] = []
        self._conn, child_end = context.Pipe()
        self.process = context.Process(
            target=target, args=(spec, child_end), name=spec.name, daemon=True
        )
        self.process.start()
        child_end.close()
        started = self.wait_event("started")
        assert Path(started["library"]).is_relative_to(REPO_ROOT), started

    @property
    def pid(self) -> int:
        assert self.process.pid is not None
        return self.process.pid

    def wait_for(self, matches: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """The first report that matches, read so far or next; fail if the child ends first."""
        for seen in self.events:
            if matches(seen):
                return seen
        while True:
            if not self._conn.poll(WAIT):
                pytest.fail(f"{self.spec.name}: no matching report within {WAIT} s\n{self._tail()}")
            try:
                event: dict[str, Any] = self._conn.recv()
            except EOFError:
                self.process.join(WAIT)
                pytest.fail(
                    f"{self.spec.name} ended (exit code {self.process.exitcode}) before the "
                    f"report the test waits for\n{self._tail()}"
                )
            self.events.append(event)
            if matches(event):
                return event

    def wait_event(self, name: str, **fields: Any) -> dict[str, Any]:
        """Wait for a report named ``name`` whose fields equal ``fields``."""
        return self.wait_for(
            lambda e: e["event"] == name and all(e.get(k) == v for k, v in fields.items())
        )

    def release(self) -> None:
        """Let a child blocked at a block point go on."""
        self._conn.send("go")

    def kill(self) -> None:
        """SIGKILL the child, reap it, and read the reports it sent before it died."""
        os.kill(self.pid, signal.SIGKILL)
        self.process.join(WAIT)
        assert self.process.exitcode == -signal.SIGKILL
        try:
            while self._conn.poll(0):
                self.events.append(self._conn.recv())
        except EOFError:
            pass
        self._conn.close()

    def finish(self) -> None:
        """Wait for the child to finish its turn and exit cleanly."""
        self.wait_event("done")
        self.process.join(WAIT)
        assert self.process.exitcode == 0, self._tail()
        self._conn.close()

    def stderr(self) -> str:
        """What the child wrote to its standard error."""
        path = Path(self.spec.output_dir) / f"{self.spec.name}.err"
        return path.read_text(encoding="utf-8") if path.exists() else ""

    def _tail(self) -> str:
        return f"reports: {self.events[-8:]}\nstderr:\n{self.stderr()[-4000:]}"
