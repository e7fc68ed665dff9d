"""Recovery plans and continuation requests (pure functions).

When a stream breaks, what had arrived decides the plan:

- R1, text only: continue with messages + assistant(prefix) + user(prompt).
- R2, at least one complete tool call: finish with the complete calls; the
  cut-off call becomes an invalid call.
- R3, text and a cut-off tool call: drop the call, continue from the text.
- R4, nothing usable: send the original request again.

The repeat a provider may send at the start of a continuation is removed by
:class:`~awaken_langchain.seam.SeamFilter` (re-exported here).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import StrEnum

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from awaken_langchain.seam import SeamFilter as SeamFilter  # re-exported

DEFAULT_CONTINUATION_PROMPT = (
    "Your previous response was interrupted mid-stream. Continue exactly where it "
    "stopped, without repeating anything you already wrote."
)
"""The user message appended after the assistant prefix of a continuation request."""

NOT_EXECUTED_REPLY = (
    "Tool call {name} with id {id} was not executed: {reason} Re-issue the call "
    "with complete arguments if it is still needed."
)
"""The synthetic tool result that answers a tool call that was never executed."""

CHARS_PER_TOKEN = 4
"""Rough characters per token, used only to estimate regenerated output."""


class Plan(StrEnum):
    """How an interrupted turn is recovered."""

    CONTINUE_TEXT = "R1"
    """Text only: continue from the text prefix."""
    FINISH_WITH_TOOL_CALLS = "R2"
    """Complete tool calls arrived: finish the turn with them."""
    DROP_TOOL_AND_CONTINUE = "R3"
    """Text and a cut-off tool call: drop the call, continue from the text."""
    RESTART = "R4"
    """Nothing usable arrived: send the original request again."""


def choose_plan(*, text: str, completed_tool_calls: int, in_flight_tool_call: bool) -> Plan:
    """Choose the recovery plan from what had arrived when the stream broke.

    Args:
        text: The whole turn's text so far.
        completed_tool_calls: How many tool calls arrived whole.
        in_flight_tool_call: Whether a tool call was cut off mid-arguments.
    """
    if completed_tool_calls > 0:
        return Plan.FINISH_WITH_TOOL_CALLS
    if text.strip():
        return Plan.DROP_TOOL_AND_CONTINUE if in_flight_tool_call else Plan.CONTINUE_TEXT
    return Plan.RESTART


def continuation_messages(
    messages: Sequence[BaseMessage], prefix: str, prompt: str = DEFAULT_CONTINUATION_PROMPT
) -> list[BaseMessage]:
    """Build the continuation request for a text prefix.

    The original messages, then the prefix as an assistant message with trailing
    whitespace removed (providers reject an assistant turn ending in whitespace),
    then the continuation prompt as a user message, so the request never ends
    with an assistant message.
    """
    stripped = prefix.rstrip()
    if not stripped:
        return list(messages)
    return [*messages, AIMessage(content=stripped), HumanMessage(content=prompt)]


def answer_invalid_tool_calls(
    messages: Sequence[BaseMessage], *, interrupted_marker: str = ""
) -> list[BaseMessage]:
    """Answer every never-executed tool call of the history, for one request.

    An assistant message's invalid tool calls (cut off mid-stream, or malformed)
    are sent to providers as tool calls; OpenAI and Anthropic reject a history in
    which a tool call id has no tool result, and the model should learn that the
    call did not run. For each invalid call with an id and no answering
    ``ToolMessage``, an error ``ToolMessage`` saying so is inserted right after
    the assistant message. The input is not modified (memory never holds these).

    Args:
        messages: The request's messages.
        interrupted_marker: Argument prefix that marks a call cut off mid-stream.
    """
    answered = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
    patched: list[BaseMessage] = []
    for message in messages:
        patched.append(message)
        if not isinstance(message, AIMessage):
            continue
        for call in message.invalid_tool_calls:
            call_id = call.get("id")
            if not call_id or call_id in answered:
                continue
            args = call.get("args") or ""
            interrupted = bool(interrupted_marker) and args.startswith(interrupted_marker)
            reason = call.get("error") or (
                "its arguments were cut off when the response stream was interrupted."
                if interrupted
                else "its arguments were not a complete JSON object."
            )
            name = call.get("name") or "unknown"
            patched.append(
                ToolMessage(
                    content=NOT_EXECUTED_REPLY.format(name=name, id=call_id, reason=reason),
                    tool_call_id=call_id,
                    name=name,
                    status="error",
                )
            )
            answered.add(call_id)
    return patched


def estimate_tokens(chars: int) -> int:
    """Estimate how many tokens ``chars`` characters of output took."""
    return math.ceil(chars / CHARS_PER_TOKEN) if chars > 0 else 0
