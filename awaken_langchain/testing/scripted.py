"""A scripted, fault-injecting chat model for deterministic recovery tests.

Each call to the model consumes the next script: a list of steps, each a
chunk to stream, an exception to raise at that point, or a stall. Every call's
messages and keyword arguments are recorded so tests can assert on what was
requested (retries, continuation requests).

Example:
    ```python
    model = ScriptedChatModel(
        scripts=[
            [*text("Hello, wor"), ConnectionError("reset")],
            [*text("world!"), finish()],
        ]
    )
    ```
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.callbacks import (
    AsyncCallbackManagerForLLMRun,
    CallbackManagerForLLMRun,
)
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessageChunk, BaseMessage
from langchain_core.messages.tool import tool_call_chunk
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import Field, PrivateAttr


@dataclass(frozen=True)
class Stall:
    """Pause the stream for ``seconds`` before the next step."""

    seconds: float


Step = AIMessageChunk | BaseException | Stall
"""One step of a script."""


def text(content: str, *, size: int = 4) -> list[AIMessageChunk]:
    """Split ``content`` into text chunks of ``size`` characters."""
    return [AIMessageChunk(content=content[i : i + size]) for i in range(0, len(content), size)]


def tool_call(
    name: str, args: str, *, id: str, index: int = 0, pieces: int = 3
) -> list[AIMessageChunk]:
    """Stream a tool call whose raw ``args`` arrive in ``pieces`` fragments."""
    step = max(1, -(-len(args) // pieces))
    fragments = [args[i : i + step] for i in range(0, len(args), step)] or [""]
    chunks = [
        AIMessageChunk(
            content="",
            tool_call_chunks=[tool_call_chunk(name=name, args=fragments[0], id=id, index=index)],
        )
    ]
    chunks += [
        AIMessageChunk(
            content="",
            tool_call_chunks=[tool_call_chunk(name=None, args=frag, id=None, index=index)],
        )
        for frag in fragments[1:]
    ]
    return chunks


def finish(
    reason: str = "stop", *, input_tokens: int = 0, output_tokens: int = 0
) -> AIMessageChunk:
    """The terminal chunk: a finish reason and, optionally, usage."""
    usage = None
    if input_tokens or output_tokens:
        usage = {
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens,
        }
    return AIMessageChunk(
        content="",
        response_metadata={"finish_reason": reason},
        usage_metadata=usage,
    )


@dataclass(frozen=True)
class RecordedCall:
    """One request the scripted model received."""

    messages: list[BaseMessage]
    kwargs: dict[str, Any]


class ScriptedChatModel(BaseChatModel):
    """A chat model that replays scripted chunks, faults and stalls.

    When the scripts run out, ``default`` (if set) answers every further call.
    """

    scripts: list[list[Any]] = Field(default_factory=list)
    """One list of steps per call, consumed in order."""
    default: list[Any] | None = None
    """Steps for calls after the scripts ran out; ``None`` raises instead."""
    model_name: str = "scripted"
    """Reported as the model's name."""
    sleep: Callable[[float], None] = Field(default=time.sleep, exclude=True)
    """How a sync stall waits (injectable)."""

    _calls: list[RecordedCall] = PrivateAttr(default_factory=list)
    _next: int = PrivateAttr(default=0)

    @property
    def _llm_type(self) -> str:
        return "scripted"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model_name": self.model_name}

    @property
    def calls(self) -> list[RecordedCall]:
        """Every request received so far."""
        return self._calls

    def _take(self, messages: list[BaseMessage], kwargs: dict[str, Any]) -> list[Any]:
        self._calls.append(RecordedCall(list(messages), dict(kwargs)))
        if self._next < len(self.scripts):
            steps = self.scripts[self._next]
            self._next += 1
            return steps
        if self.default is not None:
            return self.default
        raise RuntimeError(
            f"ScriptedChatModel received call {len(self._calls)} but has only "
            f"{len(self.scripts)} scripts; add a script or set default="
        )

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        for step in self._take(messages, kwargs):
            if isinstance(step, BaseException):
                raise step
            if isinstance(step, Stall):
                self.sleep(step.seconds)
                continue
            chunk = ChatGenerationChunk(message=step.model_copy(deep=True))
            if run_manager is not None:
                run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield chunk

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        for step in self._take(messages, kwargs):
            if isinstance(step, BaseException):
                raise step
            if isinstance(step, Stall):
                await asyncio.sleep(step.seconds)
                continue
            chunk = ChatGenerationChunk(message=step.model_copy(deep=True))
            if run_manager is not None:
                await run_manager.on_llm_new_token(chunk.text, chunk=chunk)
            yield chunk

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        merged: ChatGenerationChunk | None = None
        for chunk in self._stream(messages, stop=stop, **kwargs):
            merged = chunk if merged is None else merged + chunk
        if merged is None:
            raise ValueError("the script produced no chunks")
        return ChatResult(generations=[ChatGeneration(message=merged.message)])

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessageChunk]:
        """Bind tools in OpenAI format (recorded with each call's kwargs)."""
        formatted = [convert_to_openai_tool(t) for t in tools]
        if tool_choice is not None:
            kwargs["tool_choice"] = tool_choice
        return self.bind(tools=formatted, **kwargs)  # type: ignore[return-value]
