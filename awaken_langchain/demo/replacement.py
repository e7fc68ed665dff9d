"""Step d: a worker process killed with SIGKILL mid-stream; a fresh worker finishes the turn."""

from __future__ import annotations

import queue
import signal
import time

from awaken_langchain._session import Record
from awaken_langchain.checkpoint import StreamCheckpoint
from awaken_langchain.demo.conversation import A_REPLACE, Q_REPLACE
from awaken_langchain.demo.scripted import ScriptedModel, events_before_text, is_continuation_of
from awaken_langchain.demo.stage import Stage, Step, StepResult, difference, is_token
from awaken_langchain.demo.worker import Worker, take_over, worker_pair
from awaken_langchain.recovery import estimate_tokens
from awaken_langchain.testing.server import Fault

KILL_TIMEOUT = 60.0
"""Longest wait for the worker to reach the point where it is killed, in seconds."""


def stall_mid_text(model: ScriptedModel, question: str, provider: str) -> Fault:
    """A long pause two thirds into the answer, where the worker is killed at the latest."""
    pieces = model.scenario(question).text_pieces()
    return Fault.stall(
        KILL_TIMEOUT, after_events=events_before_text(provider) + 2 * len(pieces) // 3
    )


class ReplacementStep(Step):
    """Step d: the process streaming the answer is replaced mid-answer."""

    title = "process replaced mid-stream"
    short_title = "killed"
    question = Q_REPLACE
    answer = A_REPLACE

    def __init__(self) -> None:
        # facts gathered while the step runs, checked afterwards
        self.worker_1: Worker | None = None
        self.worker_2_records: list[Record] = []
        self.checkpoint_after_kill: StreamCheckpoint | None = None
        self.killed_shown = 0

    def run(self, stage: Stage, result: StepResult) -> None:
        """A worker killed with SIGKILL mid-stream; a fresh worker finishes the turn."""
        assert stage.agent is not None
        stage.model.schedule(Q_REPLACE, stall_mid_text(stage.model, Q_REPLACE, stage.provider))
        stage.screen.heading(
            "d. the process is replaced mid-stream",
            "A worker process streams the answer; it is killed with SIGKILL mid-answer, and "
            "a fresh worker process finishes the same turn from its checkpoint.",
        )
        second_args = []
        if stage.settings.inject_failure == "replacement":
            second_args = ["--checkpoints", str(stage.settings.directory / "checkpoints-elsewhere")]
        stage.screen.note(
            "starting worker 1, and worker 2 on standby (it loads its libraries, then waits "
            "without touching the turn) ..."
        )
        with worker_pair(
            stage, ["--question", Q_REPLACE], second_args, ("worker-1", "worker-2")
        ) as (first, second):
            self.worker_1 = first
            stage.screen.user(Q_REPLACE)
            shown = self._stream_until_killed(stage, result, first)
            self.killed_shown = shown
            after_kill = stage.checkpoint_of_thread()
            self.checkpoint_after_kill = after_kill
            saved = len(after_kill.partial_text) if after_kill is not None else 0
            stage.screen.marker(
                "☠",
                f"SIGKILL worker 1 (pid {first.process.pid}) after {shown} characters; "
                f"its checkpoint holds {saved} of them",
                "bold red",
            )
            result.records.append({"type": "killed", "shown": shown})
            stage.pause(0.5)
            self.worker_2_records = take_over(stage, result, second, "takes over")

    def _stream_until_killed(self, stage: Stage, result: StepResult, worker: Worker) -> int:
        """Show the worker's stream; SIGKILL it once a checkpoint holds part of it."""
        shown = 0
        deadline = time.monotonic() + KILL_TIMEOUT + 30
        target = len(A_REPLACE) * 2 // 5
        while time.monotonic() < deadline:
            try:
                record = worker.records.get(timeout=0.02)
            except queue.Empty:
                record = None
            if record is not None:
                result.records.append({**record, "worker": 1})
                stage.screen.record(record)
                if record.get("type") == "token":
                    shown += len(str(record["text"]))
                if record.get("type") in ("committed", "error"):
                    raise RuntimeError(f"worker 1 ended before it could be killed: {record}")
            elif worker.returncode is not None:
                raise RuntimeError(
                    f"worker 1 exited with status {worker.returncode} before it could be "
                    f"killed; see {worker.log_path}"
                )
            checkpoint = stage.checkpoint_of_thread() if shown >= target else None
            if checkpoint is not None and checkpoint.partial_text:
                worker.process.send_signal(signal.SIGKILL)
                worker.process.wait(timeout=10)
                # what the worker wrote before it died, not yet shown here
                while (record := worker.records.get(timeout=10)) is not None:
                    result.records.append({**record, "worker": 1})
                    stage.screen.record(record)
                    if record.get("type") == "token":
                        shown += len(str(record["text"]))
                return shown
        worker.process.kill()
        raise RuntimeError("worker 1 never reached the point where it is killed")

    def verify(self, stage: Stage, result: StepResult) -> None:
        """Check step d against the facts."""
        first = self.worker_1
        records = self.worker_2_records
        checkpoint = self.checkpoint_after_kill
        shown = self.killed_shown
        first_text = "".join(
            str(r["text"]) for r in result.records if r.get("worker") == 1 and is_token(r)
        )
        result.check(
            "worker 1 was killed by SIGKILL mid-answer",
            first is not None
            and first.returncode == -signal.SIGKILL
            and 0 < shown < len(A_REPLACE)
            and A_REPLACE.startswith(first_text),
            f"exit status {first.returncode if first else None}, {shown} characters shown",
        )
        saved = checkpoint.partial_text if checkpoint is not None else ""
        result.check(
            "the turn's checkpoint survived the kill",
            checkpoint is not None and bool(saved) and first_text.startswith(saved),
            f"{len(saved)} characters checkpointed",
        )
        resumes = [
            r["data"] for r in records if r.get("type") == "event" and r["name"] == "awaken_resume"
        ]
        result.check(
            "worker 2, a fresh process, resumed the turn from the checkpoint",
            len(resumes) == 1 and resumes[0].get("chars") == len(saved),
        )
        later = result.requests[1:]
        result.check(
            "worker 2 asked the provider to continue from the checkpoint, not to start over",
            len(later) == 1 and bool(saved) and is_continuation_of(later[0], saved),
        )
        second_text = "".join(str(r["text"]) for r in records if is_token(r))
        result.check(
            "worker 2 finished the same turn, with no repeated text",
            second_text == A_REPLACE and any(r.get("type") == "committed" for r in records),
            difference(second_text, A_REPLACE),
        )
        result.check(
            "the checkpoint was deleted once the turn was committed",
            stage.checkpoint_of_thread() is None,
        )
        seam = sum(
            int(r["awaken"].get("regenerated_output_tokens", 0))
            for r in records
            if r.get("type") == "end" and r.get("awaken")
        )
        result.restart_tokens = estimate_tokens(shown)
        result.regenerated_tokens = estimate_tokens(max(0, shown - len(saved))) + seam
