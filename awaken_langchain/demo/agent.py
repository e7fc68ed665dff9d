"""The demo's agent, shared with its worker processes: the client, the tool, the policy."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel

from awaken_langchain._extras import require_provider
from awaken_langchain._session import Agent, assemble_agent
from awaken_langchain.demo.conversation import TOOL_RESULT
from awaken_langchain.retry import RetryPolicy

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
