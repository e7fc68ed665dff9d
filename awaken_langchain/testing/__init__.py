"""Test doubles for recovery code: users test their own recovery with these.

- :class:`LoopbackProvider`: a loopback OpenAI- and Anthropic-compatible
  streaming server, answering from scripted :class:`Scenario` objects with
  injectable :class:`Fault` objects, recording every request.
- :class:`ScriptedChatModel`: a chat model that replays scripted chunks,
  exceptions and stalls, recording every call.
"""

from awaken_langchain.testing.scripted import (
    RecordedCall,
    ScriptedChatModel,
    Stall,
    finish,
    text,
    tool_call,
)
from awaken_langchain.testing.server import (
    DEFAULT_SHAPE_RULES,
    NO_ASSISTANT_PREFILL,
    Fault,
    FaultKind,
    LoopbackProvider,
    Provider,
    RecordedRequest,
    Responder,
    Scenario,
    ScriptedToolCall,
    ShapeRule,
    TokenUsage,
    echo_responder,
    periodic_fault,
)

__all__ = [
    "DEFAULT_SHAPE_RULES",
    "NO_ASSISTANT_PREFILL",
    "Fault",
    "FaultKind",
    "LoopbackProvider",
    "Provider",
    "RecordedCall",
    "RecordedRequest",
    "Responder",
    "Scenario",
    "ScriptedChatModel",
    "ScriptedToolCall",
    "ShapeRule",
    "Stall",
    "TokenUsage",
    "echo_responder",
    "finish",
    "text",
    "tool_call",
    "periodic_fault",
]
