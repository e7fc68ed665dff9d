"""What the ``demo`` and ``chat`` commands share.

A LangGraph agent with SQLite memory and a recovering, checkpointing model; a
callback handler that reports a turn's tokens and recovery events in order; and
the terminal view of a turn.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage, HumanMessage
from langchain_core.outputs import ChatGenerationChunk, LLMResult
from rich.console import Console
from rich.text import Text

from awaken_langchain._extras import require_agents, visible
from awaken_langchain.history import release_committed
from awaken_langchain.ledger import ToolLedger
from awaken_langchain.model import RecoveringChatModel
from awaken_langchain.retry import RetryPolicy
from awaken_langchain.stores._base import make_private_database
from awaken_langchain.stores.diskcache import DiskCacheStreamCheckpointStore

CHECKPOINTS_DIR = "checkpoints"
"""The checkpoint store's directory inside ``--dir``."""
MEMORY_FILE = "memory.sqlite"
"""The LangGraph memory's database inside ``--dir``."""


def private_directory(path: Path) -> Path:
    """Create ``path`` and any missing parents private to the owner (0700), whatever the umask.

    A directory that already exists keeps its mode (it may be shared on
    purpose, like the current directory); what this package writes in it is
    private on its own.
    """
    missing = [p for p in (path, *path.parents) if not p.exists()]
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    for created in missing:
        os.chmod(created, 0o700)
    return path


def private_database(path: Path) -> sqlite3.Connection:
    """Open a SQLite database whose file and side files are private (0600), whatever the umask."""
    make_private_database(path)
    return sqlite3.connect(path, check_same_thread=False)


@dataclass
class Agent:
    """A LangGraph agent with SQLite memory and a recovering, checkpointing model."""

    graph: Any
    model: RecoveringChatModel
    store: DiskCacheStreamCheckpointStore
    connection: sqlite3.Connection

    def close(self) -> None:
        """Close the memory database and the checkpoint store."""
        self.connection.close()
        self.store.close()


def assemble_agent(
    directory: Path,
    client: BaseChatModel,
    *,
    tools: Sequence[Any] = (),
    ledger_tools: Sequence[Any] = (),
    middleware: Sequence[Any] = (),
    retry_policy: RetryPolicy | None = None,
    checkpoints: Path | None = None,
    **settings: Any,
) -> Agent:
    """Wrap ``client`` and build a ``create_agent`` graph with memory in ``directory``.

    Args:
        directory: Holds the checkpoint store (``checkpoints/``) and the memory
            (``memory.sqlite``); created private (0700) if missing. The memory
            database and its side files are private (0600).
        client: The provider's chat model.
        tools: The agent's tools.
        ledger_tools: Tools whose calls go through a `ToolLedger` kept in the
            agent's checkpoint store (their results are replayed, not run
            again, when a replacement process re-runs their step).
        middleware: ``create_agent`` middleware.
        retry_policy: The wrapper's retry policy (the default when ``None``).
        checkpoints: Another checkpoint directory than ``directory/checkpoints``.
        **settings: Further `RecoveringChatModel` settings.
    """
    require_agents("this command")
    from langchain.agents import create_agent
    from langgraph.checkpoint.sqlite import SqliteSaver

    private_directory(directory)
    store = DiskCacheStreamCheckpointStore(checkpoints or directory / CHECKPOINTS_DIR)
    connection = private_database(directory / MEMORY_FILE)
    model = RecoveringChatModel(
        model=client, store=store, retry_policy=retry_policy or RetryPolicy(), **settings
    )
    ledger = ToolLedger(store)
    graph = create_agent(
        model,
        [*tools, *(ledger.wrap(tool) for tool in ledger_tools)],
        middleware=list(middleware),
        checkpointer=SqliteSaver(connection),
    )
    return Agent(graph=graph, model=model, store=store, connection=connection)


Record = dict[str, Any]
"""One thing a turn reported: a token, a tool call, a recovery event, its end."""


class TurnReporter(BaseCallbackHandler):
    """Reports a turn's tokens, whole tool calls and recovery events, in order.

    Tokens arrive through ``on_llm_new_token`` on the model's own thread, in the
    same order as the recovery events, so the terminal shows each event exactly
    where it happened in the stream.
    """

    def __init__(self, sink: Callable[[Record], None]) -> None:
        self.sink = sink

    def on_llm_new_token(
        self,
        token: Any,
        *,
        chunk: Any = None,
        **kwargs: Any,
    ) -> None:
        """Report the text and whole tool calls of one chunk."""
        if not isinstance(chunk, ChatGenerationChunk):
            if isinstance(token, str) and token:
                self.sink({"type": "token", "text": token})
            return
        message = chunk.message
        text = message.text
        if text:
            self.sink({"type": "token", "text": text})
        for call in getattr(message, "tool_call_chunks", None) or []:
            self.sink({"type": "tool_call", "name": call.get("name"), "args": call.get("args")})

    def on_custom_event(self, name: str, data: Any, **kwargs: Any) -> None:
        """Report a recovery event."""
        self.sink({"type": "event", "name": name, "data": _plain(data)})

    def on_llm_end(self, response: LLMResult, **kwargs: Any) -> None:
        """Report what recovery happened in the model call that just ended."""
        message = response.generations[0][0]
        awaken = getattr(getattr(message, "message", None), "response_metadata", {}).get("awaken")
        self.sink({"type": "end", "awaken": _plain(awaken)})


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def run_turn(
    agent: Agent, thread_id: str, question: str | None, sink: Callable[[Record], None]
) -> None:
    """Run one turn of the agent on ``thread_id`` (``None`` resumes the pending turn).

    Memory is written synchronously at every step, and once the graph has
    committed the turn its kept checkpoint is released.
    """
    config = {"configurable": {"thread_id": thread_id}, "callbacks": [TurnReporter(sink)]}
    inputs = None if question is None else {"messages": [HumanMessage(content=question)]}
    for _ in agent.graph.stream(inputs, config, stream_mode="messages", durability="sync"):
        pass  # tokens are reported by TurnReporter, in order with recovery events
    release_committed(thread_messages(agent, thread_id), agent.store)


def thread_messages(agent: Agent, thread_id: str) -> list[BaseMessage]:
    """The messages the agent's memory holds for ``thread_id``."""
    state = agent.graph.get_state({"configurable": {"thread_id": thread_id}})
    return list(state.values.get("messages", []))


def pending_turn(agent: Agent, thread_id: str) -> bool:
    """Whether the thread has a turn that a previous process did not finish."""
    state = agent.graph.get_state({"configurable": {"thread_id": thread_id}})
    return bool(state.next)


class Screen:
    """Shows the streamed answers and marks where each recovery happens."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._column = 0
        self._label_due = False
        self._replay = 0

    def _newline(self) -> None:
        if self._column:
            self.console.print()
            self._column = 0

    def _label(self) -> None:
        if self._label_due:
            self._label_due = False
            self.console.print(Text("model ", style="bold green"), end="")
            self._column = 6

    def heading(self, title: str, detail: str) -> None:
        """Start a step."""
        self._newline()
        self._label_due = False
        self.console.print()
        self.console.rule(_shown(title, "bold"))
        self.console.print(_shown(detail, "dim"))

    def user(self, text: str) -> None:
        """Show the user's message; the model's answer follows."""
        self._newline()
        self.console.print(Text.assemble(("user  ", "bold cyan"), _shown(text)))
        self._label_due = True

    def answer_follows(self) -> None:
        """Label the next streamed text as the model's."""
        self._newline()
        self._label_due = True

    def note(self, text: str, style: str = "dim") -> None:
        """Show a line of commentary."""
        self._newline()
        if text:
            self.console.print(_shown(text, style))

    def marker(self, symbol: str, text: str, style: str) -> None:
        """Mark, on its own line, where something happened in the stream."""
        self._newline()
        self.console.print(Text.assemble((f"  {symbol} ", style), _shown(text, style)))
        self._label_due = True

    def token(self, text: str) -> None:
        """Show streamed text; text replayed from a checkpoint is dimmed."""
        self._label()
        if self._replay > 0:
            replayed, text = text[: self._replay], text[self._replay :]
            self._replay -= len(replayed)
            self.console.print(_shown(replayed, "dim italic"), end="", soft_wrap=True)
        if text:
            self.console.print(_shown(text), end="", soft_wrap=True)
        self._column += len(text) or 1

    def record(self, record: Record) -> None:
        """Show one record reported by a turn."""
        kind = record.get("type")
        if kind == "token":
            self.token(str(record["text"]))
        elif kind == "tool_call":
            self.marker("→", f"tool call {record['name']}({record['args']})", "bold blue")
        elif kind == "event":
            self._event(str(record["name"]), record.get("data") or {})

    def _event(self, name: str, data: Mapping[str, Any]) -> None:
        if name == "awaken_retry":
            status = data.get("status_code")
            # a failure without an HTTP status (a dropped connection, a timeout) names its error
            why = f"HTTP {status}" if status is not None else data.get("error") or "no response"
            hint = data.get("retry_after")
            hint_text = f", retry hint {hint:g} s" if isinstance(hint, int | float) else ""
            self.marker(
                "⟳",
                f"awaken_retry: {data.get('cause')} ({why}){hint_text}, before any "
                f"output; waited {data.get('delay', 0):.2f} s, sending the same request again",
                "bold yellow",
            )
        elif name == "awaken_continuation":
            plan = data.get("plan")
            what = _PLAN_ACTIONS.get(str(plan), "recovering")
            self.marker(
                "⤳",
                f"awaken_continuation: {data.get('cause')} after {data.get('chars_so_far')} "
                f"characters (plan {plan}): {what}",
                "bold magenta",
            )
        elif name == "awaken_resume":
            self._replay = int(data.get("chars") or 0)
            self.marker(
                "↺",
                f"awaken_resume: found the turn's checkpoint ({data.get('chars')} characters, "
                f"plan {data.get('plan')}); replaying it (dimmed), then continuing",
                "bold green",
            )
        elif name == "awaken_finish_with_tool_calls":
            self.marker(
                "⤳",
                f"{name}: the turn ends with its complete tool calls; the cut-off call "
                f"{data.get('cut_off_tool_call')} is not run",
                "bold magenta",
            )
        elif name == "awaken_tool_ledger_replay":
            self.marker(
                "↺",
                f"{name}: call {data.get('tool_call_id')} of {data.get('tool')} already "
                f"{data.get('state')}; tool result replayed from the ledger, the tool was not "
                "called again",
                "bold green",
            )
        else:
            self.marker("!", f"{name}: {data.get('message', data)}", "bold red")


def _shown(text: str, style: str = "") -> Text:
    """Model or user text as the terminal shows it: no markup, control characters escaped."""
    return Text(visible(text, keep="\n\t"), style=style)


_PLAN_ACTIONS = {
    "R1": "asking the model to continue from exactly here",
    "R3": "the cut-off tool call is dropped, never run; asking the model to continue",
    "R4": "nothing was shown yet; sending the request again",
}
