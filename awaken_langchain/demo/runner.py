"""The runner: plays the requested steps in order, checks every claim, prints the verdict."""

from __future__ import annotations

import json
import time
import uuid

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from rich.console import Console
from rich.table import Table
from rich.text import Text

from awaken_langchain._extras import CommandError, require_agents, require_provider
from awaken_langchain._session import (
    CHECKPOINTS_DIR,
    MEMORY_FILE,
    Screen,
    private_directory,
    thread_messages,
)
from awaken_langchain.demo.agent import MODEL_NAMES, build_agent
from awaken_langchain.demo.conversation import (
    A_AFTER_LEDGER,
    A_AFTER_TOOL,
    A_DROP,
    A_LEDGER,
    A_RATE,
    A_REPLACE,
    A_RESUME,
    A_TOOL,
    LEDGER_ARGS,
    Q_DROP,
    Q_LEDGER,
    Q_RATE,
    Q_REPLACE,
    Q_RESUME,
    Q_TOOL,
    TOOL_ARGS,
)
from awaken_langchain.demo.drop import DropStep
from awaken_langchain.demo.ledger_replay import LedgerReplayStep
from awaken_langchain.demo.provider_resume import ProviderResumeStep
from awaken_langchain.demo.rate_limit import RateLimitStep
from awaken_langchain.demo.replacement import ReplacementStep
from awaken_langchain.demo.scripted import ScriptedModel, Turn
from awaken_langchain.demo.stage import (
    FAILURES,
    STEPS,
    Check,
    DemoSettings,
    Stage,
    Step,
    StepResult,
)
from awaken_langchain.demo.tool_cut import ToolCutStep
from awaken_langchain.recovery import DEFAULT_CONTINUATION_PROMPT
from awaken_langchain.testing.server import LoopbackProvider, ScriptedToolCall

STEP_TYPES: dict[str, type[Step]] = dict(
    zip(
        STEPS,
        (
            RateLimitStep,
            DropStep,
            ToolCutStep,
            ReplacementStep,
            ProviderResumeStep,
            LedgerReplayStep,
        ),
        strict=True,
    )
)
"""Each step's letter and the step it plays."""

CHUNK_SIZE = 6
"""Characters per streamed delta."""
EVENT_DELAY = 0.05
"""Seconds between streamed events at speed 1."""


class Demo:
    """Runs the demo's steps against a loopback provider and checks every claim."""

    def __init__(self, settings: DemoSettings, console: Console) -> None:
        self.settings = settings
        self.console = console
        model = ScriptedModel(
            {
                Q_RATE: Turn(A_RATE),
                Q_DROP: Turn(A_DROP),
                Q_TOOL: Turn(
                    A_TOOL,
                    tool_calls=(ScriptedToolCall("get_forecast", TOOL_ARGS),),
                    after_tool=A_AFTER_TOOL,
                ),
                Q_REPLACE: Turn(A_REPLACE),
                Q_RESUME: Turn(A_RESUME),
                Q_LEDGER: Turn(
                    A_LEDGER,
                    tool_calls=(ScriptedToolCall("add_to_packing_list", LEDGER_ARGS),),
                    after_tool=A_AFTER_LEDGER,
                ),
            },
            chunk_size=CHUNK_SIZE,
            delay=EVENT_DELAY / settings.speed,
            repeat_earlier_sentence=settings.inject_failure == "continuation",
            duplicate_reissued_tool_call=settings.inject_failure == "tool",
        )
        self.stage = Stage(
            settings,
            Screen(console),
            model,
            LoopbackProvider(default=model),
            thread_id=f"demo-{uuid.uuid4().hex[:12]}",
        )
        self.steps = [(name, STEP_TYPES[name]()) for name in settings.steps]
        self.played: list[tuple[Step, StepResult]] = []
        self.memory_checks: list[Check] = []
        self.committed: list[BaseMessage] = []

    def run(self) -> bool:
        """Run every requested step, then the checks; return whether all claims held."""
        stage = self.stage
        private_directory(self.settings.directory)
        started = time.monotonic()
        with stage.server:
            self.console.print(
                Text.assemble(
                    ("awaken-langchain demo", "bold"),
                    f": {stage.provider} client → loopback provider at {stage.server.url}; "
                    f"checkpoints in {self.settings.directory / CHECKPOINTS_DIR}, "
                    f"memory in {self.settings.directory / MEMORY_FILE}, thread {stage.thread_id}",
                )
            )
            stage.agent, stage.tool_log = build_agent(
                self.settings.directory,
                provider=stage.provider,
                base_url=stage.base_url(),
                speed=stage.speed,
                # "retry": no retry budget, so the 429 is not recovered
                max_attempts=1 if self.settings.inject_failure == "retry" else 3,
            )
            stage.tool_log.on_call = lambda args: stage.screen.marker(
                "⚙", f"get_forecast ran with {args}", "bold blue"
            )
            try:
                for name, step in self.steps:
                    result = StepResult(name, step.title)
                    self.played.append((step, result))
                    first = len(stage.server.requests)
                    try:
                        step.run(stage, result)
                    except Exception as exc:
                        result.error = f"{type(exc).__name__}: {exc}"
                        stage.screen.note(f"step {name} failed: {result.error}", "bold red")
                    result.requests = stage.server.requests[first:]
                    stage.pause()
                self.check_memory()
            finally:
                stage.agent.close()
        self.report(time.monotonic() - started)
        return self.ok

    @property
    def results(self) -> list[StepResult]:
        """What each step played so far did."""
        return [result for _, result in self.played]

    @property
    def ok(self) -> bool:
        """Whether every claim of every step held."""
        return all(r.ok for r in self.results) and all(c.ok for c in self.memory_checks)

    # -- memory --------------------------------------------------------------------------------

    def check_memory(self) -> None:
        """Verify each step, then what the memory committed for the thread."""
        stage = self.stage
        for step, result in self.played:
            if result.error is None:
                step.verify(stage, result)
        assert stage.agent is not None
        self.committed = thread_messages(stage.agent, stage.thread_id)
        expected: list[tuple[type[BaseMessage], str]] = []
        for _, step in self.steps:
            expected += step.committed()
        actual = [(type(m), str(m.text)) for m in self.committed]
        self.memory_checks.append(
            Check(
                "memory holds exactly the complete turns, in order",
                actual == expected,
                f"{len(actual)} messages committed, {len(expected)} expected",
            )
        )
        self.memory_checks.append(
            Check(
                "no partial answer or continuation prompt reached memory",
                all(DEFAULT_CONTINUATION_PROMPT not in m.text for m in self.committed)
                and all(
                    not isinstance(m, AIMessage) or not m.invalid_tool_calls for m in self.committed
                ),
            )
        )
        if "c" in self.settings.steps:
            calls = [
                c
                for m in self.committed
                if isinstance(m, AIMessage)
                for c in m.tool_calls
                if c["name"] == "get_forecast"
            ]
            self.memory_checks.append(
                Check(
                    "memory holds one tool call, with complete arguments, answered by its result",
                    [c["args"] for c in calls] == [TOOL_ARGS]
                    and any(
                        isinstance(m, ToolMessage) and m.tool_call_id == calls[0]["id"]
                        for m in self.committed
                    ),
                )
            )

    # -- the report ---------------------------------------------------------------------------

    def report(self, seconds: float) -> None:
        """Print the tables and the verdict."""
        console = self.console
        console.print()
        table = Table(
            title=f"What happened ({self.stage.provider}, {seconds:.1f} s)",
            caption=(
                "waited: seconds before retries; regenerated: output tokens recovery made the "
                "model write again; restart: what a restart from scratch would have rewritten"
            ),
        )
        table.add_column("step")
        table.add_column("attempts", justify="right")
        table.add_column("plans")
        table.add_column("waited", justify="right")
        table.add_column("regenerated", justify="right")
        table.add_column("restart", justify="right")
        table.add_column("ok")
        for step, r in self.played:
            table.add_row(
                f"{r.step}. {step.short_title}",
                str(len(r.requests)),
                ", ".join([*r.plans(), *r.recoveries]) or "-",
                f"{r.waited():.2f} s",
                str(r.regenerated_tokens),
                str(r.restart_tokens),
                Text("yes", style="green") if r.ok else Text("NO", style="bold red"),
            )
        console.print(table)
        thread = Table(title=f"Committed thread {self.stage.thread_id} (LangGraph memory)")
        thread.add_column("#", justify="right")
        thread.add_column("role")
        thread.add_column("content")
        for i, message in enumerate(self.committed, 1):
            content = str(message.text)
            if isinstance(message, AIMessage) and message.tool_calls:
                calls = ", ".join(
                    f"{c['name']}({json.dumps(c['args'])})" for c in message.tool_calls
                )
                content = f"{content} [tool call: {calls}]".strip()
            thread.add_row(str(i), message.type, _shorten(content, 110))
        console.print(thread)
        failures = [(f"{r.step}. {r.title}", c) for r in self.results for c in r.checks if not c.ok]
        failures += [("memory", c) for c in self.memory_checks if not c.ok]
        errors = [(f"{r.step}. {r.title}", r.error) for r in self.results if r.error]
        total = sum(len(r.checks) for r in self.results) + len(self.memory_checks)
        if self.ok:
            console.print(f"[bold green]All {total} claims verified.")
            return
        for where, error in errors:
            console.print(Text.assemble(("FAILED ", "bold red"), f"{where}: {error}"))
        for where, check in failures:
            detail = f" ({check.detail})" if check.detail else ""
            console.print(Text.assemble(("FAILED ", "bold red"), f"{where}: {check.claim}{detail}"))
        console.print(f"[bold red]{len(failures) + len(errors)} of {total} claims did not hold.")


def _shorten(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def run_demo(settings: DemoSettings, console: Console) -> bool:
    """Run the demo; return whether every claim held.

    Raises:
        CommandError: If a required extra is missing or the settings are invalid.
    """
    if settings.provider not in MODEL_NAMES:
        raise CommandError(
            f"unknown provider {settings.provider!r}; choose one of {sorted(MODEL_NAMES)}"
        )
    if not settings.speed > 0:
        raise CommandError(f"--speed must be a positive number, got {settings.speed!r}")
    unknown = [s for s in settings.steps if s not in STEPS]
    if unknown or not settings.steps:
        raise CommandError(
            f"--steps takes letters from {','.join(STEPS)} (for example a,b), "
            f"got {','.join(settings.steps) or 'nothing'}"
        )
    if settings.inject_failure is not None and settings.inject_failure not in FAILURES:
        raise CommandError(
            f"--inject-failure takes one of {', '.join(FAILURES)}, got {settings.inject_failure!r}"
        )
    require_agents("the demo")
    require_provider(settings.provider, f"the demo with --provider {settings.provider}")
    if "e" in settings.steps:
        require_provider("openai", "the demo's step e (the OpenAI Responses API)")
    if settings.directory.exists() and not settings.directory.is_dir():
        raise CommandError(f"--dir {settings.directory} exists and is not a directory")
    return Demo(settings, console).run()
