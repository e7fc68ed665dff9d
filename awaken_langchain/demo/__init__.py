"""`awaken-langchain demo`: the whole mission, offline, in about a minute.

A LangGraph agent (``create_agent``) with a SQLite-backed memory talks through
the real ``ChatOpenAI`` (or ``ChatAnthropic``) client, wrapped in
:class:`~awaken_langchain.RecoveringChatModel` with the embedded
:class:`~awaken_langchain.DiskCacheStreamCheckpointStore`, to the loopback
provider server. Five turns each meet one failure:

a. a 429 with a retry hint before any output: retried after the hint;
b. a connection drop mid-answer: continued, with no repeated text;
c. a tool call cut off mid-arguments: not executed, re-issued, run once;
d. a process replacement: a worker process is killed with SIGKILL mid-stream
   and a fresh worker finishes the same turn from the checkpoint;
e. a connection drop under the OpenAI Responses API with ``provider_resume=True``:
   the provider keeps generating the background response, and the wrapper
   resumes its stream after the last event received (one model call outside
   the agent, with the real ``ChatOpenAI(use_responses_api=True)``, whatever
   ``--provider`` says).

Every claim is then checked against facts (the requests the server recorded,
the text received, the tool's log, the memory's messages), and the demo fails
(exit status 1) if any claim does not hold.

The worker processes of step d run ``python -m awaken_langchain.demo`` and
report tokens and recovery events as JSON lines on their standard output.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from rich.console import Console
from rich.table import Table
from rich.text import Text

from awaken_langchain._extras import CommandError, require_agents, require_provider
from awaken_langchain._session import (
    CHECKPOINTS_DIR,
    MEMORY_FILE,
    Agent,
    Record,
    Screen,
    TurnReporter,
    assemble_agent,
    private_directory,
    run_turn,
    thread_messages,
)
from awaken_langchain.checkpoint import StreamCheckpoint
from awaken_langchain.model import RecoveringChatModel
from awaken_langchain.recovery import DEFAULT_CONTINUATION_PROMPT, estimate_tokens
from awaken_langchain.retry import RetryPolicy
from awaken_langchain.testing.server import (
    Fault,
    FaultKind,
    LoopbackProvider,
    RecordedRequest,
    Scenario,
    ScriptedToolCall,
)

DemoProvider = Literal["openai", "anthropic"]

MODEL_NAMES: dict[str, str] = {"openai": "gpt-4o-mini", "anthropic": "claude-sonnet-5"}
"""The model name each client asks the loopback provider for."""

STEPS = ("a", "b", "c", "d", "e")
"""The demo's steps, in order."""

FAILURES = ("retry", "continuation", "tool", "replacement")
"""What ``--inject-failure`` can break, to show that the demo's checks can fail."""


CHUNK_SIZE = 6
"""Characters per streamed delta."""
EVENT_DELAY = 0.05
"""Seconds between streamed events at speed 1."""
RETRY_HINT = 2.0
"""The 429's retry hint at speed 1, in seconds."""
PAUSE = 1.2
"""Pause between steps at speed 1, in seconds."""
KILL_TIMEOUT = 60.0
"""Longest wait for the worker to reach the point where it is killed, in seconds."""

# -- the conversation ----------------------------------------------------------------------


Q_RATE = "In one paragraph: what does an HTTP 429 from a model provider mean?"
A_RATE = (
    "An HTTP 429 means the provider is rate limiting you: too many requests or tokens "
    "arrived in its accounting window. It usually says how long to wait in a retry-after "
    "header. Nothing was generated yet, so the right move is to wait that long and send "
    "the very same request again."
)
Q_DROP = "Why do streamed answers break, and what should a client do about it?"
A_DROP = (
    "Streamed answers break for ordinary reasons: a provider sheds load, a proxy or load "
    "balancer closes a connection it thinks is idle, a deploy replaces the process that was "
    "reading the stream, or a network path drops packets for a few seconds. A careful client "
    "treats these differently depending on what has already arrived. Before the first token, "
    "it simply retries, honouring any retry hint the provider sent. After partial output, it "
    "keeps what it has shown and asks the model to continue from exactly there, removing any "
    "words the model repeats at the seam. And when the process itself dies, a checkpoint of "
    "the in-flight turn lets a fresh process finish the answer instead of starting over."
)
Q_TOOL = "What will the weather be in Lisbon for the next three days?"
A_TOOL = "Let me look that up with the forecast tool."
TOOL_ARGS: dict[str, Any] = {"city": "Lisbon", "days": 3}
TOOL_RESULT = "Lisbon, next 3 days: sunny, highs of 24 C, a light northerly wind."
A_AFTER_TOOL = (
    f"The forecast tool says: {TOOL_RESULT} Good weather for a walk along the river, "
    "so pack sunglasses rather than an umbrella."
)
Q_REPLACE = "What does a checkpoint of an in-flight turn hold, and what does it leave out?"
A_REPLACE = (
    "A checkpoint of an in-flight turn holds only what a replacement process needs to "
    "finish it: the run and thread it belongs to, the model it was requested from, the text "
    "that has arrived so far across every attempt, the tool calls whose arguments arrived "
    "whole, the one call still arriving, how many retries were spent, and a fencing epoch "
    "so that two processes never write the same turn. It leaves out everything else. The "
    "conversation itself stays in the agent's memory, which remains the authority for "
    "messages, and secrets such as API keys or request headers are never written at all. "
    "When the turn completes and memory has it, the checkpoint is deleted."
)
Q_RESUME = "Why can the Responses API resume a broken stream without generating it again?"
A_RESUME = (
    "A response created in background mode keeps running at the provider when the client's "
    "connection drops, and every event of its stream carries a sequence number. The client "
    "remembers the number of the last event it received and asks for the same stream again, "
    "starting after that event. The provider replays what it already generated and goes on "
    "from there, so nothing is generated twice and nothing is sent twice."
)
RESPONSES_MODEL = "gpt-5-mini"
"""The model name step e asks the loopback provider for, on the Responses API."""
_RESPONSES_EVENTS_BEFORE_TEXT = 4
"""Responses API events before the first text delta (created, in_progress, item and part added)."""


# -- the scripted model behind the loopback server ------------------------------------------


@dataclass(frozen=True)
class _Turn:
    """What the scripted model answers to one question."""

    text: str
    tool_calls: tuple[ScriptedToolCall, ...] = ()
    after_tool: str | None = None


class ScriptedModel:
    """A loopback responder that behaves like a model that knows its answers.

    A fresh question is answered with its scripted text (and tool calls); a
    continuation request (assistant prefix + continuation prompt) is answered
    with the rest of the text after the prefix, starting, as real models often
    do, by repeating the prefix's last word; a request ending with a tool result
    gets the answer written from that result. Faults scheduled for a question
    break its requests in order.

    Args:
        turns: Question -> answer.
        chunk_size: Characters per streamed delta.
        delay: Seconds between streamed events.
        repeat_earlier_sentence: Start every continuation by repeating the
            answer's first sentence (a repetition far from the seam, which no
            seam filter removes); used to show that the demo's checks fail.
        duplicate_reissued_tool_call: Re-issue a cut-off tool call twice.
    """

    def __init__(
        self,
        turns: Mapping[str, _Turn],
        *,
        chunk_size: int,
        delay: float,
        repeat_earlier_sentence: bool = False,
        duplicate_reissued_tool_call: bool = False,
    ) -> None:
        self.turns = dict(turns)
        self.chunk_size = chunk_size
        self.delay = delay
        self.repeat_earlier_sentence = repeat_earlier_sentence
        self.duplicate_reissued_tool_call = duplicate_reissued_tool_call
        self._faults: dict[str, list[Fault | None]] = {}
        self._lock = threading.Lock()

    def schedule(self, question: str, *faults: Fault | None) -> None:
        """Break the next requests about ``question`` with ``faults``, in order."""
        with self._lock:
            self._faults.setdefault(question, []).extend(faults)

    def scenario(self, question: str, *, fault: Fault | None = None) -> Scenario:
        """The fresh answer to ``question`` (used to plan where a fault cuts it)."""
        turn = self.turns[question]
        return Scenario(
            text=turn.text,
            tool_calls=turn.tool_calls,
            chunk_size=self.chunk_size,
            delay=self.delay,
            fault=fault,
        )

    def __call__(self, request: RecordedRequest) -> Scenario:
        """Answer one request."""
        conversation = _conversation(request)
        if not conversation:
            return _refusal("the request has no messages")
        role, last = conversation[-1]
        if role == "tool":
            question = _last_question(conversation)
            turn = self.turns.get(question or "")
            if turn is None or turn.after_tool is None:
                return _refusal(f"no answer is scripted after a tool result for {question!r}")
            return Scenario(text=turn.after_tool, chunk_size=self.chunk_size, delay=self.delay)
        prefix: str | None = None
        if last == DEFAULT_CONTINUATION_PROMPT and len(conversation) >= 2:
            prefix = conversation[-2][1]
            question = _last_question(conversation[:-2])
        else:
            question = last
        turn = self.turns.get(question or "")
        if turn is None:
            return Scenario(
                text=f"(the demo model has no scripted answer to {question!r})",
                chunk_size=self.chunk_size,
            )
        with self._lock:
            pending = self._faults.get(question or "", [])
            fault = pending.pop(0) if pending else None
        if prefix is None:
            return self.scenario(question or "", fault=fault)
        return self._continuation(turn, prefix, fault)

    def _continuation(self, turn: _Turn, prefix: str, fault: Fault | None) -> Scenario:
        if not turn.text.startswith(prefix):
            return _refusal(
                "the continuation request's assistant prefix is not the start of what this "
                f"model wrote: {prefix[-60:]!r}"
            )
        rest = turn.text[len(prefix) :]
        text = ""
        if rest:
            # like real models, repeat the end of the prefix (its last two words)
            tail = re.search(r"\S+\s+\S+$|\S+$", prefix)
            text = (tail.group() if tail else "") + rest
            if self.repeat_earlier_sentence:
                first_sentence = turn.text.split(". ")[0] + ". "
                text = first_sentence + rest.lstrip()
        calls = turn.tool_calls
        if calls and self.duplicate_reissued_tool_call:
            calls = (*calls, *calls)
        return Scenario(
            text=text, tool_calls=calls, chunk_size=self.chunk_size, delay=self.delay, fault=fault
        )


def _refusal(message: str) -> Scenario:
    return Scenario(name="demo-refusal", fault=Fault.http_error(400, message=message))


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(block.get("text", ""))
            for block in content
            if isinstance(block, Mapping) and block.get("type") == "text"
        )
    return ""


def _conversation(request: RecordedRequest) -> list[tuple[str, str]]:
    """The request's messages as (role, text), tool results as role ``tool``."""
    out: list[tuple[str, str]] = []
    for message in request.messages:
        role = str(message.get("role"))
        content = message.get("content")
        if isinstance(content, list) and any(
            isinstance(b, Mapping) and b.get("type") == "tool_result" for b in content
        ):
            for block in content:
                if isinstance(block, Mapping) and block.get("type") == "tool_result":
                    out.append(("tool", _text_of(block.get("content"))))
            continue
        out.append((role, _text_of(content)))
    return out


def _last_question(conversation: Sequence[tuple[str, str]]) -> str | None:
    for role, text in reversed(conversation):
        if role == "user" and text != DEFAULT_CONTINUATION_PROMPT:
            return text
    return None


def _events_before_text(provider: str) -> int:
    """SSE events a stream sends before its first text delta."""
    return 1 if provider == "openai" else 2  # role chunk | message_start + block start


def drop_mid_text(model: ScriptedModel, question: str, provider: str) -> Fault:
    """A connection drop halfway through the answer's text."""
    pieces = model.scenario(question).text_pieces()
    return Fault.drop_after_events(_events_before_text(provider) + len(pieces) // 2)


def drop_mid_arguments(model: ScriptedModel, question: str, provider: str) -> tuple[Fault, str]:
    """A connection drop halfway through the first tool call's arguments.

    Returns:
        The fault and the argument text sent before the drop.
    """
    scenario = model.scenario(question)
    text_events = len(scenario.text_pieces())
    args = scenario.argument_pieces(scenario.tool_calls[0])
    sent = len(args) // 2
    # openai: role, text deltas, tool call head; anthropic: message_start, text block
    # start, text deltas, text block stop, tool block start; then argument deltas
    before = text_events + (2 if provider == "openai" else 4)
    return Fault.drop_after_events(before + sent), "".join(args[:sent])


def stall_mid_text(model: ScriptedModel, question: str, provider: str) -> Fault:
    """A long pause two thirds into the answer, where the worker is killed at the latest."""
    pieces = model.scenario(question).text_pieces()
    return Fault.stall(
        KILL_TIMEOUT, after_events=_events_before_text(provider) + 2 * len(pieces) // 3
    )


# -- the agent, shared by the demo and its worker processes --------------------------------


class ToolLog:
    """Records every call of the demo's forecast tool (arguments as received)."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.on_call: Callable[[dict[str, Any]], None] | None = None

    def record(self, args: dict[str, Any]) -> None:
        """Record one call."""
        self.calls.append(dict(args))
        if self.on_call is not None:
            self.on_call(dict(args))


def make_tools(log: ToolLog) -> list[Any]:
    """The demo's tools: a forecast lookup that records its calls."""
    from langchain_core.tools import tool

    @tool
    def get_forecast(city: str, days: int) -> str:
        """Return the weather forecast for a city for the next few days."""
        log.record({"city": city, "days": days})
        return TOOL_RESULT if (city, days) == ("Lisbon", 3) else f"No forecast for {city}."

    return [get_forecast]


def chat_client(provider: str, base_url: str) -> BaseChatModel:
    """The real LangChain client for ``provider``, pointed at ``base_url``, no SDK retries."""
    require_provider(provider, f"the demo with --provider {provider}")
    if provider == "openai":
        from langchain_openai import ChatOpenAI

        return ChatOpenAI(
            model=MODEL_NAMES["openai"],
            base_url=base_url,
            api_key="demo-key-not-a-secret",
            max_retries=0,
            stream_usage=True,
        )
    from langchain_anthropic import ChatAnthropic

    return ChatAnthropic(
        model=MODEL_NAMES["anthropic"],
        base_url=base_url,
        api_key="demo-key-not-a-secret",
        max_retries=0,
    )


def demo_retry_policy(speed: float, max_attempts: int = 3) -> RetryPolicy:
    """Short, speed-scaled backoff; provider hints are honoured as sent."""
    initial = 0.5 / speed
    return RetryPolicy(
        max_attempts=max_attempts,
        max_continuations=3,
        initial_delay=initial,
        overloaded_initial_delay=initial,
        max_delay=max(initial, 8.0 / speed),
        jitter=0.0,
        # one attempt shows an unrecovered 429: no overload time budget either
        overload_deadline=None if max_attempts == 1 else 300.0 / speed,
    )


def build_agent(
    directory: Path,
    *,
    provider: str,
    base_url: str,
    speed: float,
    checkpoints: Path | None = None,
    max_attempts: int = 3,
) -> tuple[Agent, ToolLog]:
    """Build the demo agent over the checkpoints and memory in ``directory``."""
    log = ToolLog()
    agent = assemble_agent(
        directory,
        chat_client(provider, base_url),
        tools=make_tools(log),
        retry_policy=demo_retry_policy(speed, max_attempts),
        checkpoints=checkpoints,
        checkpoint_every_chunks=4,
        checkpoint_every_seconds=0.1,
    )
    return agent, log


# -- the worker process (step d) -------------------------------------------------------------


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

    agent, _ = build_agent(
        args.dir,
        provider=args.provider,
        base_url=args.base_url,
        speed=args.speed,
        checkpoints=args.checkpoints,
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


# -- checks -----------------------------------------------------------------------------------


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


def _index(records: Sequence[Record], predicate: Callable[[Record], bool]) -> int:
    for i, record in enumerate(records):
        if predicate(record):
            return i
    return -1


def _is_token(record: Record) -> bool:
    return record.get("type") == "token"


def _is_continuation_of(request: RecordedRequest, prefix: str) -> bool:
    conversation = _conversation(request)
    return (
        len(conversation) >= 2
        and conversation[-1] == ("user", DEFAULT_CONTINUATION_PROMPT)
        and conversation[-2] == ("assistant", prefix.rstrip())
    )


# -- the demo ------------------------------------------------------------------------------------


@dataclass
class DemoSettings:
    """What ``awaken-langchain demo`` was asked to do."""

    directory: Path
    provider: str = "openai"
    speed: float = 1.0
    steps: tuple[str, ...] = STEPS
    inject_failure: str | None = None


class Demo:
    """Runs the demo's steps against a loopback provider and checks every claim."""

    def __init__(self, settings: DemoSettings, console: Console) -> None:
        self.settings = settings
        self.console = console
        self.screen = Screen(console)
        self.speed = settings.speed
        self.provider = settings.provider
        self.thread_id = f"demo-{uuid.uuid4().hex[:12]}"
        self.model = ScriptedModel(
            {
                Q_RATE: _Turn(A_RATE),
                Q_DROP: _Turn(A_DROP),
                Q_TOOL: _Turn(
                    A_TOOL,
                    tool_calls=(ScriptedToolCall("get_forecast", TOOL_ARGS),),
                    after_tool=A_AFTER_TOOL,
                ),
                Q_REPLACE: _Turn(A_REPLACE),
                Q_RESUME: _Turn(A_RESUME),
            },
            chunk_size=CHUNK_SIZE,
            delay=EVENT_DELAY / self.speed,
            repeat_earlier_sentence=settings.inject_failure == "continuation",
            duplicate_reissued_tool_call=settings.inject_failure == "tool",
        )
        self.server = LoopbackProvider(default=self.model)
        self.results: list[StepResult] = []
        self.memory_checks: list[Check] = []
        self.committed: list[BaseMessage] = []
        self.agent: Agent | None = None
        self.tool_log = ToolLog()
        # facts gathered by steps c and d, checked afterwards
        self.cut_arguments = ""
        self.worker_1: Worker | None = None
        self.worker_2_records: list[Record] = []
        self.checkpoint_after_kill: StreamCheckpoint | None = None
        self.killed_shown = 0

    # -- running ----------------------------------------------------------------------------

    def run(self) -> bool:
        """Run every requested step, then the checks; return whether all claims held."""
        private_directory(self.settings.directory)
        started = time.monotonic()
        with self.server:
            self.console.print(
                Text.assemble(
                    ("awaken-langchain demo", "bold"),
                    f": {self.provider} client → loopback provider at {self.server.url}; "
                    f"checkpoints in {self.settings.directory / CHECKPOINTS_DIR}, "
                    f"memory in {self.settings.directory / MEMORY_FILE}, thread {self.thread_id}",
                )
            )
            self.agent, self.tool_log = build_agent(
                self.settings.directory,
                provider=self.provider,
                base_url=self._base_url(),
                speed=self.speed,
                # "retry": no retry budget, so the 429 is not recovered
                max_attempts=1 if self.settings.inject_failure == "retry" else 3,
            )
            self.tool_log.on_call = lambda args: self.screen.marker(
                "⚙", f"get_forecast ran with {args}", "bold blue"
            )
            try:
                steps = {
                    "a": self.step_retry,
                    "b": self.step_drop,
                    "c": self.step_tool,
                    "d": self.step_replacement,
                    "e": self.step_provider_resume,
                }
                for name in self.settings.steps:
                    result = StepResult(name, _TITLES[name])
                    self.results.append(result)
                    first = len(self.server.requests)
                    try:
                        steps[name](result)
                    except Exception as exc:
                        result.error = f"{type(exc).__name__}: {exc}"
                        self.screen.note(f"step {name} failed: {result.error}", "bold red")
                    result.requests = self.server.requests[first:]
                    self._pause()
                self.check_memory()
            finally:
                self.agent.close()
        self.report(time.monotonic() - started)
        return self.ok

    @property
    def ok(self) -> bool:
        """Whether every claim of every step held."""
        return all(r.ok for r in self.results) and all(c.ok for c in self.memory_checks)

    def _base_url(self) -> str:
        if self.provider == "openai":
            return self.server.base_url_openai
        return self.server.base_url_anthropic

    def _pause(self, factor: float = 1.0) -> None:
        time.sleep(PAUSE * factor / self.speed)

    def _turn(self, result: StepResult, question: str) -> None:
        assert self.agent is not None

        def sink(record: Record) -> None:
            result.records.append(record)
            self.screen.record(record)

        self.screen.user(question)
        run_turn(self.agent, self.thread_id, question, sink)
        self.screen.note("")

    # -- step a ------------------------------------------------------------------------------

    def step_retry(self, result: StepResult) -> None:
        """A 429 with a retry hint before any output: retried after the hint."""
        hint = RETRY_HINT / self.speed
        self.model.schedule(
            Q_RATE,
            Fault.rate_limited(retry_after_ms=max(1, round(hint * 1000))),
        )
        self.screen.heading(
            "a. HTTP 429 with a retry hint, before any output",
            f"The provider answers the first request 429 with retry-after-ms: {hint * 1000:.0f}.",
        )
        self._turn(result, Q_RATE)

    def verify_retry(self, result: StepResult) -> None:
        """Check step a against the facts."""
        requests = result.requests
        first = requests[0] if requests else None
        fault = first.scenario.fault if first is not None and first.scenario else None
        hint = RETRY_HINT / self.speed
        result.check(
            "the provider answered the first request 429 with a retry hint",
            fault is not None and fault.status == 429 and "retry-after-ms" in fault.headers,
        )
        retries = result.events("awaken_retry")
        result.check(
            "the wrapper waited at least the hinted time, then retried",
            len(retries) == 1
            and float(retries[0].get("delay") or 0) >= hint - 1e-6
            and result.waited() >= hint - 1e-6,
            f"hint {hint:.3f} s, waited {result.waited():.3f} s",
        )
        retry_at = _index(result.records, lambda r: r.get("name") == "awaken_retry")
        first_token = _index(result.records, _is_token)
        result.check(
            "the retry happened before any output reached the caller",
            retry_at != -1 and (first_token == -1 or retry_at < first_token),
        )
        result.check(
            "the retry sent the very same request again",
            len(requests) == 2 and requests[0].messages == requests[1].messages,
            f"{len(requests)} requests",
        )
        result.check("the answer arrived whole", result.text() == A_RATE)

    # -- step b ------------------------------------------------------------------------------

    def step_drop(self, result: StepResult) -> None:
        """A connection drop mid-answer: continued without repeating text."""
        self.model.schedule(Q_DROP, drop_mid_text(self.model, Q_DROP, self.provider))
        self.screen.heading(
            "b. the connection drops mid-answer",
            "The provider closes the TCP connection halfway through the answer.",
        )
        self._turn(result, Q_DROP)

    def verify_drop(self, result: StepResult) -> None:
        """Check step b against the facts."""
        requests = result.requests
        continuations = result.events("awaken_continuation")
        chars = int(continuations[0].get("chars_so_far") or 0) if continuations else 0
        prefix = A_DROP[:chars]
        result.check(
            "the connection dropped mid-answer",
            bool(requests)
            and requests[0].scenario is not None
            and requests[0].scenario.fault is not None
            and requests[0].scenario.fault.kind is FaultKind.DROP_AFTER_EVENTS
            and 0 < chars < len(A_DROP),
            f"{chars} of {len(A_DROP)} characters had arrived",
        )
        result.check(
            "the continuation request carried exactly the text received, then the prompt",
            len(requests) == 2 and _is_continuation_of(requests[1], prefix),
        )
        result.check(
            "the answer reached the caller whole, with no repeated text",
            result.text() == A_DROP,
            _difference(result.text(), A_DROP),
        )
        result.restart_tokens = estimate_tokens(chars)
        result.regenerated_tokens = sum(
            int(m.get("regenerated_output_tokens", 0)) for m in result.awaken()
        )

    # -- step c ------------------------------------------------------------------------------

    def step_tool(self, result: StepResult) -> None:
        """A tool call cut off mid-arguments: not executed, re-issued, run once."""
        fault, self.cut_arguments = drop_mid_arguments(self.model, Q_TOOL, self.provider)
        self.model.schedule(Q_TOOL, fault)
        self.screen.heading(
            "c. a tool call is cut off mid-arguments",
            f"The connection drops after the arguments {self.cut_arguments!r}: "
            "a JSON fragment that a lenient parser would 'repair' and run.",
        )
        self._turn(result, Q_TOOL)

    def verify_tool(self, result: StepResult) -> None:
        """Check step c against the facts."""
        assert self.agent is not None
        requests = result.requests
        cut = self.cut_arguments
        cut_valid = True
        try:
            json.loads(cut)
        except ValueError:
            cut_valid = False
        result.check(
            "the stream broke inside the tool call's arguments",
            bool(requests)
            and requests[0].scenario is not None
            and requests[0].scenario.fault is not None
            and bool(cut)
            and not cut_valid,
            f"arguments sent before the drop: {cut!r}",
        )
        continuation = requests[1] if len(requests) > 1 else None
        result.check(
            "the call was re-issued by a continuation that did not send the cut-off call back",
            continuation is not None
            and _is_continuation_of(continuation, A_TOOL)
            and not _has_tool_calls(continuation),
        )
        calls = self.tool_log.calls
        result.check(
            "the tool ran exactly once, with complete arguments",
            calls == [TOOL_ARGS],
            f"tool log: {calls}",
        )
        result.check(
            "the agent answered from the tool's result",
            result.text() == A_TOOL + A_AFTER_TOOL,
            _difference(result.text(), A_TOOL + A_AFTER_TOOL),
        )
        result.restart_tokens = estimate_tokens(len(A_TOOL) + len(cut))
        result.regenerated_tokens = sum(
            int(m.get("regenerated_output_tokens", 0)) for m in result.awaken()
        )

    # -- step d ------------------------------------------------------------------------------

    def step_replacement(self, result: StepResult) -> None:
        """A worker killed with SIGKILL mid-stream; a fresh worker finishes the turn."""
        assert self.agent is not None
        self.model.schedule(Q_REPLACE, stall_mid_text(self.model, Q_REPLACE, self.provider))
        self.screen.heading(
            "d. the process is replaced mid-stream",
            "A worker process streams the answer; it is killed with SIGKILL mid-answer, and "
            "a fresh worker process finishes the same turn from its checkpoint.",
        )
        common = [
            "--dir",
            str(self.settings.directory),
            "--provider",
            self.provider,
            "--base-url",
            self._base_url(),
            "--thread",
            self.thread_id,
            "--speed",
            repr(self.speed),
        ]
        logs = self.settings.directory / "logs"
        private_directory(logs)
        second_args = [*common, "--standby"]
        if self.settings.inject_failure == "replacement":
            second_args += ["--checkpoints", str(self.settings.directory / "checkpoints-elsewhere")]
        self.screen.note(
            "starting worker 1, and worker 2 on standby (it loads its libraries, then waits "
            "without touching the turn) ..."
        )
        first = spawn_worker([*common, "--question", Q_REPLACE], logs / "worker-1.log")
        second = spawn_worker(second_args, logs / "worker-2.log")
        self.worker_1 = first
        try:
            self.screen.user(Q_REPLACE)
            shown = self._stream_until_killed(result, first)
            self.killed_shown = shown
            after_kill = self._checkpoint_of_thread()
            self.checkpoint_after_kill = after_kill
            saved = len(after_kill.partial_text) if after_kill is not None else 0
            self.screen.marker(
                "☠",
                f"SIGKILL worker 1 (pid {first.process.pid}) after {shown} characters; "
                f"its checkpoint holds {saved} of them",
                "bold red",
            )
            result.records.append({"type": "killed", "shown": shown})
            self._pause(0.5)
            self.screen.note(f"worker 2 (pid {second.process.pid}, a fresh process) takes over ...")
            second.go()
            self.screen.answer_follows()
            self.worker_2_records = self._stream_to_end(result, second)
            self.screen.note("")
        finally:
            first.stop()
            second.stop()

    def _stream_until_killed(self, result: StepResult, worker: Worker) -> int:
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
                self.screen.record(record)
                if record.get("type") == "token":
                    shown += len(str(record["text"]))
                if record.get("type") in ("committed", "error"):
                    raise RuntimeError(f"worker 1 ended before it could be killed: {record}")
            elif worker.returncode is not None:
                raise RuntimeError(
                    f"worker 1 exited with status {worker.returncode} before it could be "
                    f"killed; see {worker.log_path}"
                )
            checkpoint = self._checkpoint_of_thread() if shown >= target else None
            if checkpoint is not None and checkpoint.partial_text:
                worker.process.send_signal(signal.SIGKILL)
                worker.process.wait(timeout=10)
                # what the worker wrote before it died, not yet shown here
                while (record := worker.records.get(timeout=10)) is not None:
                    result.records.append({**record, "worker": 1})
                    self.screen.record(record)
                    if record.get("type") == "token":
                        shown += len(str(record["text"]))
                return shown
        worker.process.kill()
        raise RuntimeError("worker 1 never reached the point where it is killed")

    def _stream_to_end(self, result: StepResult, worker: Worker) -> list[Record]:
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
            self.screen.record(record)
            if record.get("type") == "error":
                self.screen.note(f"worker 2: {record.get('message')}", "bold red")
        else:
            worker.process.kill()
        worker.process.wait(timeout=30)
        return records

    def _checkpoint_of_thread(self) -> StreamCheckpoint | None:
        assert self.agent is not None
        for checkpoint in self.agent.store.list_checkpoints():
            if checkpoint.thread_id == self.thread_id:
                return checkpoint
        return None

    def verify_replacement(self, result: StepResult) -> None:
        """Check step d against the facts."""
        first = self.worker_1
        records = self.worker_2_records
        checkpoint = self.checkpoint_after_kill
        shown = self.killed_shown
        first_text = "".join(
            str(r["text"]) for r in result.records if r.get("worker") == 1 and _is_token(r)
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
            len(later) == 1 and bool(saved) and _is_continuation_of(later[0], saved),
        )
        second_text = "".join(str(r["text"]) for r in records if _is_token(r))
        result.check(
            "worker 2 finished the same turn, with no repeated text",
            second_text == A_REPLACE and any(r.get("type") == "committed" for r in records),
            _difference(second_text, A_REPLACE),
        )
        result.check(
            "the checkpoint was deleted once the turn was committed",
            self._checkpoint_of_thread() is None,
        )
        seam = sum(
            int(r["awaken"].get("regenerated_output_tokens", 0))
            for r in records
            if r.get("type") == "end" and r.get("awaken")
        )
        result.restart_tokens = estimate_tokens(shown)
        result.regenerated_tokens = estimate_tokens(max(0, shown - len(saved))) + seam

    # -- step e ------------------------------------------------------------------------------

    def step_provider_resume(self, result: StepResult) -> None:
        """A drop on the Responses API: the provider's stream is resumed, nothing regenerated."""
        from langchain_openai import ChatOpenAI

        pieces = self.model.scenario(Q_RESUME).text_pieces()
        self.model.schedule(
            Q_RESUME, Fault.drop_after_events(_RESPONSES_EVENTS_BEFORE_TEXT + len(pieces) // 2)
        )
        self.screen.heading(
            "e. the connection drops; the provider keeps the answer (provider_resume=True)",
            "ChatOpenAI on the Responses API creates the response in background mode; the "
            "connection drops halfway and the provider goes on generating. (One model call "
            "outside the agent.)",
        )
        model = RecoveringChatModel(
            model=ChatOpenAI(
                model=RESPONSES_MODEL,
                base_url=self.server.base_url_openai,
                api_key="demo-key-not-a-secret",
                max_retries=0,
                use_responses_api=True,
            ),
            provider_resume=True,
            retry_policy=demo_retry_policy(self.speed),
        )

        def sink(record: Record) -> None:
            result.records.append(record)
            if record.get("type") == "event" and record["name"] == "awaken_provider_resume":
                data = record["data"]
                self.screen.marker(
                    "↻",
                    f"awaken_provider_resume: {data.get('cause')} after "
                    f"{data.get('chars_so_far')} characters; resuming response "
                    f"{data.get('response_id')} after event {data.get('starting_after')}",
                    "bold green",
                )
            else:
                self.screen.record(record)

        self.screen.user(Q_RESUME)
        for _ in model.stream(Q_RESUME, config={"callbacks": [TurnReporter(sink)]}):
            pass
        self.screen.note("")

    def verify_provider_resume(self, result: StepResult) -> None:
        """Check step e against the facts."""
        created = [r for r in result.requests if r.provider == "openai-responses"]
        retrievals = [r for r in result.requests if r.method == "GET"]
        first = created[0] if created else None
        fault = first.scenario.fault if first is not None and first.scenario else None
        resumes = result.events("awaken_provider_resume")
        chars = int(resumes[0].get("chars_so_far") or 0) if resumes else 0
        result.check(
            "the connection dropped mid-answer while the provider kept the response running",
            first is not None
            and first.body.get("background") is True
            and fault is not None
            and fault.kind is FaultKind.DROP_AFTER_EVENTS
            and 0 < chars < len(A_RESUME),
            f"{chars} of {len(A_RESUME)} characters had arrived",
        )
        after = fault.count - 1 if fault is not None and fault.count is not None else None
        result.check(
            "the wrapper resumed the provider's stream after the last event it received",
            len(retrievals) == 1
            and f"starting_after={after}" in retrievals[0].query
            and len(resumes) == 1
            and resumes[0].get("starting_after") == after,
            f"{len(retrievals)} retrieval(s), last event received: {after}",
        )
        regenerated = sum(int(m.get("regenerated_output_tokens", 0)) for m in result.awaken())
        result.check(
            "the provider generated the answer once: no second request, no token regenerated",
            len(created) == 1 and regenerated == 0 and result.plans() == ["provider_resume"],
            f"{len(created)} generation(s), {regenerated} tokens regenerated",
        )
        result.check(
            "the answer reached the caller whole, with no repeated text",
            result.text() == A_RESUME,
            _difference(result.text(), A_RESUME),
        )
        result.restart_tokens = estimate_tokens(chars)
        result.regenerated_tokens = regenerated

    # -- memory --------------------------------------------------------------------------------

    def check_memory(self) -> None:
        """Verify each step, then what the memory committed for the thread."""
        verify = {
            "a": self.verify_retry,
            "b": self.verify_drop,
            "c": self.verify_tool,
            "d": self.verify_replacement,
            "e": self.verify_provider_resume,
        }
        for result in self.results:
            if result.error is None:
                verify[result.step](result)
        assert self.agent is not None
        self.committed = thread_messages(self.agent, self.thread_id)
        expected: list[tuple[type[BaseMessage], str]] = []
        for step in self.settings.steps:
            if step == "e":  # a model call outside the agent: not in its memory
                continue
            question, answer = _STEP_TURNS[step]
            expected.append((HumanMessage, question))
            expected.append((AIMessage, answer))
            if step == "c":
                expected += [(ToolMessage, TOOL_RESULT), (AIMessage, A_AFTER_TOOL)]
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
            calls = [c for m in self.committed if isinstance(m, AIMessage) for c in m.tool_calls]
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
            title=f"What happened ({self.provider}, {seconds:.1f} s)",
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
        for r in self.results:
            table.add_row(
                f"{r.step}. {_SHORT_TITLES[r.step]}",
                str(len(r.requests)),
                ", ".join(r.plans()) or "-",
                f"{r.waited():.2f} s",
                str(r.regenerated_tokens),
                str(r.restart_tokens),
                Text("yes", style="green") if r.ok else Text("NO", style="bold red"),
            )
        console.print(table)
        thread = Table(title=f"Committed thread {self.thread_id} (LangGraph memory)")
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


_TITLES = {
    "a": "429 with a retry hint, before output",
    "b": "connection drop mid-answer",
    "c": "tool call cut mid-arguments",
    "d": "process replaced mid-stream",
    "e": "drop resumed at the provider",
}

_SHORT_TITLES = {
    "a": "429 + hint",
    "b": "dropped",
    "c": "tool cut",
    "d": "killed",
    "e": "provider resume",
}

_STEP_TURNS = {
    "a": (Q_RATE, A_RATE),
    "b": (Q_DROP, A_DROP),
    "c": (Q_TOOL, A_TOOL),
    "d": (Q_REPLACE, A_REPLACE),
    "e": (Q_RESUME, A_RESUME),
}


def _has_tool_calls(request: RecordedRequest) -> bool:
    for message in request.messages:
        if message.get("tool_calls"):
            return True
        content = message.get("content")
        if isinstance(content, list) and any(
            isinstance(b, Mapping) and b.get("type") == "tool_use" for b in content
        ):
            return True
    return False


def _difference(got: str, expected: str) -> str:
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
