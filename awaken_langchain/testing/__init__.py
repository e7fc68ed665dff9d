"""Test doubles for recovery code: users test their own recovery with these.

- :class:`LoopbackProvider`: a loopback OpenAI- (Chat Completions and
  Responses) and Anthropic-compatible streaming server, answering from
  scripted :class:`Scenario` objects with injectable :class:`Fault` objects,
  recording every request.
- :class:`ScriptedChatModel`: a chat model that replays scripted chunks,
  exceptions and stalls, recording every call.
"""

import importlib
from typing import TYPE_CHECKING, Any

from awaken_langchain.testing.scripted import (
    RecordedCall,
    ScriptedChatModel,
    Stall,
    finish,
    text,
    tool_call,
)

if TYPE_CHECKING:
    from awaken_langchain.testing.server import (
        DEFAULT_SHAPE_RULES,
        NO_ASSISTANT_PREFILL,
        BackgroundResponse,
        Fault,
        FaultKind,
        LoopbackProvider,
        Provider,
        RecordedRequest,
        Responder,
        Scenario,
        ScriptedCitation,
        ScriptedThinking,
        ScriptedToolCall,
        ScriptedWebSearch,
        ShapeRule,
        TokenUsage,
        continuation_responder,
        echo_responder,
        periodic_fault,
        schema_responder,
    )


def __getattr__(name: str) -> Any:
    # The server module is imported on first use, so that
    # ``python -m awaken_langchain.testing.server`` runs it without a second copy.
    if not name.startswith("__"):
        server = importlib.import_module("awaken_langchain.testing.server")
        if name in server.__all__:
            return getattr(server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_SHAPE_RULES",
    "NO_ASSISTANT_PREFILL",
    "BackgroundResponse",
    "Fault",
    "FaultKind",
    "LoopbackProvider",
    "Provider",
    "RecordedCall",
    "RecordedRequest",
    "Responder",
    "Scenario",
    "ScriptedChatModel",
    "ScriptedCitation",
    "ScriptedThinking",
    "ScriptedToolCall",
    "ScriptedWebSearch",
    "ShapeRule",
    "Stall",
    "TokenUsage",
    "continuation_responder",
    "echo_responder",
    "finish",
    "text",
    "tool_call",
    "periodic_fault",
    "schema_responder",
]
