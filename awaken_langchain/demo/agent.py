"""The demo's agent, shared with its worker processes: the client, the tool, the policy."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from langchain_core.language_models import BaseChatModel

from awaken_langchain._extras import require_provider
from awaken_langchain._session import Agent, assemble_agent
from awaken_langchain.demo.conversation import LEDGER_RESULT, TOOL_RESULT
from awaken_langchain.ledger import InjectedIdempotencyKey
from awaken_langchain.retry import RetryPolicy

PACKING_LIST = "packing-list.txt"
"""The file inside ``--dir`` the packing list tool appends to (its external effect)."""

MODEL_NAMES: dict[str, str] = {"openai": "gpt-4o-mini", "anthropic": "claude-sonnet-5"}
"""The model name each client asks the loopback provider for."""


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


def make_ledger_tools(directory: Path) -> list[Any]:
    """The demo's tools with an effect: a packing list tool that appends a line to a file.

    Each line carries the call's idempotency key, so a second effect of the same
    call would show as a second line with the same key.
    """
    from langchain_core.tools import tool

    path = directory / PACKING_LIST

    @tool
    def add_to_packing_list(item: str, key: Annotated[str, InjectedIdempotencyKey]) -> str:
        """Add an item to the user's packing list."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with open(fd, "a", encoding="utf-8") as handle:
            handle.write(f"{item}\t{key}\n")
            handle.flush()
            os.fsync(handle.fileno())
        return LEDGER_RESULT if item == "sunglasses" else f"Added {item} to the packing list."

    return [add_to_packing_list]


def hold_after(tool_name: str, hold: Callable[[], None]) -> Any:
    """Middleware calling ``hold`` once a call of ``tool_name`` returned, before its step is saved.

    The demo's worker holds there until it is killed: the tool's effect and the
    ledger's record of it are on disk, LangGraph's memory does not have the result.
    """
    from langchain.agents.middleware import AgentMiddleware

    class HoldAfterTool(AgentMiddleware):
        def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
            result = handler(request)
            if request.tool_call["name"] == tool_name:
                hold()
            return result

    return HoldAfterTool()


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
    hold_after_tool: Callable[[], None] | None = None,
) -> tuple[Agent, ToolLog]:
    """Build the demo agent over the checkpoints and memory in ``directory``.

    ``hold_after_tool`` is called once the packing list tool returned (step f's
    worker waits there to be killed).
    """
    log = ToolLog()
    ledger_tools = make_ledger_tools(directory)
    agent = assemble_agent(
        directory,
        chat_client(provider, base_url),
        tools=make_tools(log),
        ledger_tools=ledger_tools,
        middleware=(
            [] if hold_after_tool is None else [hold_after(ledger_tools[0].name, hold_after_tool)]
        ),
        retry_policy=demo_retry_policy(speed, max_attempts),
        checkpoints=checkpoints,
        checkpoint_every_chunks=4,
        checkpoint_every_seconds=0.1,
    )
    return agent, log


# -- the worker process (step d) -------------------------------------------------------------
