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
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

from awaken_langchain._extras import require_agents, require_provider
from awaken_langchain._session import Record, private_directory, run_turn
from awaken_langchain.demo.agent import MODEL_NAMES, build_agent

if TYPE_CHECKING:
    from awaken_langchain.demo.stage import Stage, StepResult


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


@contextlib.contextmanager
def worker_pair(
    stage: Stage, first: Sequence[str], second: Sequence[str], logs: Sequence[str]
) -> Iterator[tuple[Worker, Worker]]:
    """Start worker 1 on the demo's thread, and worker 2 on standby; stop both after.

    Args:
        stage: The demo run (its directory, provider, loopback provider and thread).
        first: Worker 1's own arguments (its question, ...).
        second: Worker 2's own arguments besides ``--standby``.
        logs: The two workers' log names, under ``logs/`` of the demo's directory.
    """
    common = [
        "--dir",
        str(stage.settings.directory),
        "--provider",
        stage.provider,
        "--base-url",
        stage.base_url(),
        "--thread",
        stage.thread_id,
        "--speed",
        repr(stage.speed),
    ]
    directory = stage.settings.directory / "logs"
    private_directory(directory)
    worker_1 = spawn_worker([*common, *first], directory / f"{logs[0]}.log")
    try:
        worker_2 = spawn_worker([*common, "--standby", *second], directory / f"{logs[1]}.log")
        try:
            yield worker_1, worker_2
        finally:
            worker_2.stop()
    finally:
        worker_1.stop()


def take_over(stage: Stage, result: StepResult, worker: Worker, doing: str) -> list[Record]:
    """Let worker 2 go (it ``doing`` the turn) and show its records until it exits."""
    stage.screen.note(f"worker 2 (pid {worker.process.pid}, a fresh process) {doing} ...")
    worker.go()
    stage.screen.answer_follows()
    records: list[Record] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            record = worker.records.get(timeout=0.1)
        except queue.Empty:
            continue
        if record is None:
            break
        records.append(record)
        result.records.append({**record, "worker": 2})
        stage.screen.record(record)
        if record.get("type") == "error":
            stage.screen.note(f"worker 2: {record.get('message')}", "bold red")
    else:
        worker.process.kill()
    worker.process.wait(timeout=30)
    stage.screen.note("")
    return records
