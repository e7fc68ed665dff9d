"""Test doubles for recovery code: users test their own recovery with these.

- :class:`LoopbackProvider`: a loopback OpenAI- and Anthropic-compatible
  streaming server, answering from scripted :class:`Scenario` objects with
  injectable :class:`Fault` objects, recording every request.
"""

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
)

__all__ = [
    "DEFAULT_SHAPE_RULES",
    "NO_ASSISTANT_PREFILL",
    "Fault",
    "FaultKind",
    "LoopbackProvider",
    "Provider",
    "RecordedRequest",
    "Responder",
    "Scenario",
    "ScriptedToolCall",
    "ShapeRule",
    "TokenUsage",
    "echo_responder",
]
