"""Step f: a worker killed after a tool's effect; the replacement replays the tool's result."""

from __future__ import annotations

import queue
import signal
import time
from pathlib import Path

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from awaken_langchain._session import Record
from awaken_langchain.demo.agent import PACKING_LIST
from awaken_langchain.demo.conversation import (
    A_AFTER_LEDGER,
    A_LEDGER,
    LEDGER_ARGS,
    LEDGER_RESULT,
    Q_LEDGER,
)
from awaken_langchain.demo.stage import Stage, Step, StepResult, difference, is_token
from awaken_langchain.demo.worker import Worker, take_over, worker_pair

HOLD_TIMEOUT = 60.0
"""Longest wait for worker 1 to reach the point where it is killed, in seconds."""

TOOL = "add_to_packing_list"
"""The tool with an effect."""


class LedgerReplayStep(Step):
    """Step f: the process running a tool with an effect is killed after the effect."""

    title = "process killed after a tool's effect"
    short_title = "tool effect"
    question = Q_LEDGER
    answer = A_LEDGER

    def __init__(self) -> None:
        self.worker_1: Worker | None = None
        self.held = False
        self.effects_at_kill: list[str] = []
        self.worker_2_records: list[Record] = []

    def committed(self) -> list[tuple[type[BaseMessage], str]]:
        """The question, the call, the tool's result and the answer written from it."""
        return [*super().committed(), (ToolMessage, LEDGER_RESULT), (AIMessage, A_AFTER_LEDGER)]

    def run(self, stage: Stage, result: StepResult) -> None:
        """Kill worker 1 once the tool appended to the file; worker 2 resumes the thread."""
        directory = stage.settings.directory
        effects = directory / PACKING_LIST
        effects.unlink(missing_ok=True)
        stage.screen.heading(
            "f. a process is killed after a tool's effect",
            f"Worker 1's tool {TOOL} appends to {effects}; the worker is killed with SIGKILL "
            "after the append, before LangGraph saved the tool's result. A fresh worker "
            "resumes the thread: the tool ledger replays the result instead of appending again.",
        )
        stage.screen.note("starting worker 1, and worker 2 on standby ...")
        with worker_pair(
            stage,
            ["--question", Q_LEDGER, "--hold-after-tool"],
            [],
            ("worker-f1", "worker-f2"),
        ) as (first, second):
            self.worker_1 = first
            stage.screen.user(Q_LEDGER)
            self._run_until_held(stage, result, first)
            self.effects_at_kill = _lines(effects)
            first.process.send_signal(signal.SIGKILL)
            first.process.wait(timeout=10)
            stage.screen.marker(
                "☠",
                f"SIGKILL worker 1 (pid {first.process.pid}) after {TOOL} appended "
                f"{len(self.effects_at_kill)} line to the packing list, before its step was saved",
                "bold red",
            )
            result.records.append({"type": "killed"})
            self.worker_2_records = take_over(stage, result, second, "resumes the thread")

    def _run_until_held(self, stage: Stage, result: StepResult, worker: Worker) -> None:
        deadline = time.monotonic() + HOLD_TIMEOUT
        while time.monotonic() < deadline:
            try:
                record = worker.records.get(timeout=0.05)
            except queue.Empty:
                if worker.returncode is not None:
                    raise RuntimeError(
                        f"worker 1 exited with status {worker.returncode} before it could be "
                        f"killed; see {worker.log_path}"
                    ) from None
                continue
            if record is None:
                raise RuntimeError(
                    f"worker 1 ended before it could be killed; see {worker.log_path}"
                )
            result.records.append({**record, "worker": 1})
            stage.screen.record(record)
            if record.get("type") in ("committed", "error"):
                raise RuntimeError(f"worker 1 ended before it could be killed: {record}")
            if record.get("type") == "held":
                self.held = True
                return
        worker.process.kill()
        raise RuntimeError("worker 1 never reached the point where it is killed")

    def verify(self, stage: Stage, result: StepResult) -> None:
        """Check step f against the facts."""
        first = self.worker_1
        records = self.worker_2_records
        effects = _lines(stage.settings.directory / PACKING_LIST)
        item = str(LEDGER_ARGS["item"])
        result.check(
            "worker 1 was killed by SIGKILL after the tool's effect, before its step was saved",
            first is not None
            and first.returncode == -signal.SIGKILL
            and self.held
            and len(self.effects_at_kill) == 1,
            f"exit status {first.returncode if first else None}, "
            f"{len(self.effects_at_kill)} line(s) in the packing list at the kill",
        )
        result.check(
            "worker 2, a fresh process, resumed the thread at the tool step",
            any(r.get("type") == "pending" and r.get("next") == ["tools"] for r in records),
        )
        replays = [
            r["data"]
            for r in records
            if r.get("type") == "event" and r.get("name") == "awaken_tool_ledger_replay"
        ]
        result.check(
            "worker 2 replayed the tool's result from the ledger and did not call the tool",
            len(replays) == 1
            and replays[0].get("tool") == TOOL
            and replays[0].get("state") == "finished",
            f"{len(replays)} replay event(s)",
        )
        if replays:
            result.recoveries.append("tool result replayed from the ledger")
        result.check(
            "the packing list holds the effect once",
            len(effects) == 1 and effects[0].split("\t")[0] == item,
            f"packing list: {effects}",
        )
        text = "".join(str(r["text"]) for r in records if is_token(r))
        result.check(
            "worker 2 finished the turn from the tool's result",
            text == A_AFTER_LEDGER and any(r.get("type") == "committed" for r in records),
            difference(text, A_AFTER_LEDGER),
        )


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
