"""What every step works with: the settings, the stage it plays on, the result it fills in."""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from awaken_langchain._session import Agent, Record, Screen, run_turn
from awaken_langchain.checkpoint import StreamCheckpoint
from awaken_langchain.demo.agent import ToolLog
from awaken_langchain.demo.scripted import ScriptedModel
from awaken_langchain.ledger import is_ledger_record
from awaken_langchain.testing.server import LoopbackProvider, RecordedRequest

STEPS = ("a", "b", "c", "d", "e", "f")
"""The demo's steps, in order."""

FAILURES = ("retry", "continuation", "tool", "replacement")
"""What ``--inject-failure`` can break, to show that the demo's checks can fail."""

PAUSE = 1.2
"""Pause between steps at speed 1, in seconds."""


@dataclass
class DemoSettings:
    """What ``awaken-langchain demo`` was asked to do."""

    directory: Path
    provider: str = "openai"
    speed: float = 1.0
    steps: tuple[str, ...] = STEPS
    inject_failure: str | None = None


@dataclass
class Check:
    """One claim the demo makes, and whether the facts bear it out."""

    claim: str
    ok: bool
    detail: str = ""


@dataclass
class StepResult:
    """What one step did, measured."""

    step: str
    title: str
    requests: list[RecordedRequest] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    regenerated_tokens: int = 0
    restart_tokens: int = 0
    error: str | None = None
    recoveries: list[str] = field(default_factory=list)
    """Recoveries outside the model calls (shown with the plans)."""

    def check(self, claim: str, ok: bool, detail: str = "") -> None:
        """Record a claim and its verdict."""
        self.checks.append(Check(claim, bool(ok), detail))

    @property
    def ok(self) -> bool:
        """Whether every claim held."""
        return self.error is None and bool(self.checks) and all(c.ok for c in self.checks)

    def text(self) -> str:
        """The text the turn showed."""
        return "".join(str(r["text"]) for r in self.records if r.get("type") == "token")

    def events(self, name: str) -> list[Mapping[str, Any]]:
        """The data of the recovery events called ``name``."""
        return [r["data"] for r in self.records if r.get("type") == "event" and r["name"] == name]

    def awaken(self) -> list[Mapping[str, Any]]:
        """``response_metadata["awaken"]`` of each model call in the step."""
        return [r["awaken"] for r in self.records if r.get("type") == "end" and r.get("awaken")]

    def plans(self) -> list[str]:
        """The recovery plans used."""
        return [p for meta in self.awaken() for p in meta.get("plans", [])]

    def waited(self) -> float:
        """Seconds waited before retries."""
        return float(sum(meta.get("seconds_waited", 0.0) for meta in self.awaken()))


def index_of(records: Sequence[Record], predicate: Callable[[Record], bool]) -> int:
    """The position of the first record ``predicate`` accepts, or -1."""
    for i, record in enumerate(records):
        if predicate(record):
            return i
    return -1


def is_token(record: Record) -> bool:
    """Whether ``record`` is a streamed token."""
    return record.get("type") == "token"


def difference(got: str, expected: str) -> str:
    """Where ``got`` first differs from ``expected``, for a failed claim's detail."""
    if got == expected:
        return ""
    common = 0
    for a, b in zip(got, expected, strict=False):
        if a != b:
            break
        common += 1
    return (
        f"received {len(got)} characters, expected {len(expected)}; they differ at "
        f"{common}: {got[common : common + 40]!r} instead of {expected[common : common + 40]!r}"
    )


@dataclass
class Stage:
    """What the steps share: the scripted model, its server, the agent, the screen, the thread."""

    settings: DemoSettings
    screen: Screen
    model: ScriptedModel
    server: LoopbackProvider
    thread_id: str
    agent: Agent | None = None
    tool_log: ToolLog = field(default_factory=ToolLog)

    @property
    def speed(self) -> float:
        """The factor every delay is divided by."""
        return self.settings.speed

    @property
    def provider(self) -> str:
        """The client and wire format the agent uses."""
        return self.settings.provider

    def base_url(self) -> str:
        """Where the agent's client sends its requests."""
        if self.provider == "openai":
            return self.server.base_url_openai
        return self.server.base_url_anthropic

    def pause(self, factor: float = 1.0) -> None:
        """Pause, between steps or within one, scaled by the speed."""
        time.sleep(PAUSE * factor / self.speed)

    def turn(self, result: StepResult, question: str) -> None:
        """Ask the agent ``question`` on the demo's thread, showing and recording the turn."""
        assert self.agent is not None

        def sink(record: Record) -> None:
            result.records.append(record)
            self.screen.record(record)

        self.screen.user(question)
        run_turn(self.agent, self.thread_id, question, sink)
        self.screen.note("")

    def checkpoint_of_thread(self) -> StreamCheckpoint | None:
        """The checkpoint of the thread's unfinished turn, if the store holds one."""
        assert self.agent is not None
        for checkpoint in self.agent.store.list_checkpoints():
            if checkpoint.thread_id == self.thread_id and not is_ledger_record(checkpoint):
                return checkpoint
        return None


class Step(abc.ABC):
    """One step of the demo: a turn that meets one failure, and the claims checked about it."""

    title: ClassVar[str]
    """The step's title in the list of failed claims."""
    short_title: ClassVar[str]
    """The step's name in the table of what happened."""
    question: ClassVar[str]
    answer: ClassVar[str]
    """The assistant's message that answers ``question`` in memory."""

    @abc.abstractmethod
    def run(self, stage: Stage, result: StepResult) -> None:
        """Schedule the failure, then play the turn, recording it in ``result``."""

    @abc.abstractmethod
    def verify(self, stage: Stage, result: StepResult) -> None:
        """Check the step's claims against the facts."""

    def committed(self) -> list[tuple[type[BaseMessage], str]]:
        """The messages (type and text) the turn commits to the agent's memory."""
        return [(HumanMessage, self.question), (AIMessage, self.answer)]
