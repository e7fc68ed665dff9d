"""The worker processes of steps d and f: one turn each, reported as JSON lines on standard output.

The demo starts them as ``python -m awaken_langchain.demo`` and reads their records.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from awaken_langchain._extras import require_agents, require_provider
from awaken_langchain._session import Record, run_turn
from awaken_langchain.demo.agent import MODEL_NAMES, build_agent


def worker_main(argv: Sequence[str] | None = None) -> int:
    """Run one turn in this process, reporting JSON lines on standard output."""
    parser = argparse.ArgumentParser(prog="python -m awaken_langchain.demo")
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--checkpoints", type=Path, default=None)
    parser.add_argument("--provider", choices=sorted(MODEL_NAMES), required=True)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--thread", required=True)
    parser.add_argument("--speed", type=float, default=1.0)
    parser.add_argument("--question", default=None, help="omit to finish the pending turn")
    parser.add_argument(
        "--standby", action="store_true", help="load everything, then wait for a line on stdin"
    )
    parser.add_argument(
        "--hold-after-tool",
        action="store_true",
        help="once the packing list tool returned, report it and wait for a line on stdin",
    )
    args = parser.parse_args(argv)
    out = sys.stdout

    def emit(record: Record) -> None:
        out.write(json.dumps(record) + "\n")
        out.flush()

    if args.standby:
        require_agents("the demo worker")
        require_provider(args.provider, "the demo worker")
        emit({"type": "standby"})
        if not sys.stdin.readline():
            return 1  # the demo ended without needing this worker

    def hold() -> None:
        emit({"type": "held"})
        sys.stdin.readline()  # the demo kills this process here

    agent, _ = build_agent(
        args.dir,
        provider=args.provider,
        base_url=args.base_url,
        speed=args.speed,
        checkpoints=args.checkpoints,
        hold_after_tool=hold if args.hold_after_tool else None,
    )
    try:
        if args.question is None:
            state = agent.graph.get_state({"configurable": {"thread_id": args.thread}})
            if not state.next:
                emit({"type": "error", "message": "the thread has no unfinished turn"})
                return 1
            emit({"type": "pending", "next": list(state.next)})
        else:
            emit({"type": "started"})
        run_turn(agent, args.thread, args.question, emit)
        emit({"type": "committed"})
    except Exception as exc:
        emit({"type": "error", "message": f"{type(exc).__name__}: {exc}"})
        return 1
    finally:
        agent.close()
    return 0


@dataclass
class Worker:
    """A worker process and the records it has reported so far."""

    process: subprocess.Popen[str]
    records: queue.SimpleQueue[Record | None]
    log_path: Path

    def go(self) -> None:
        """Let a worker on standby start its turn."""
        assert self.process.stdin is not None
        self.process.stdin.write("go\n")
        self.process.stdin.flush()

    def stop(self) -> None:
        """End the worker if it is still running."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=30)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()

    @property
    def returncode(self) -> int | None:
        """The exit status, once it has exited."""
        return self.process.poll()


def spawn_worker(args: Sequence[str], log_path: Path) -> Worker:
    """Start ``python -m awaken_langchain.demo ARGS``, importing this very package."""
    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([package_root, *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    # the log holds the conversation: private, like the memory and the checkpoints
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    log = open(fd, "w", encoding="utf-8")  # noqa: SIM115 - handed to the child, closed below
    process = subprocess.Popen(
        [sys.executable, "-m", "awaken_langchain.demo", *args],
        stdout=subprocess.PIPE,
        stderr=log,
        stdin=subprocess.PIPE,
        text=True,
        env=env,
    )
    log.close()
    records: queue.SimpleQueue[Record | None] = queue.SimpleQueue()

    def read(stream: IO[str]) -> None:
        for line in stream:
            with contextlib.suppress(json.JSONDecodeError):
                records.put(json.loads(line))
        records.put(None)

    assert process.stdout is not None
    threading.Thread(target=read, args=(process.stdout,), daemon=True).start()
    return Worker(process, records, log_path)
