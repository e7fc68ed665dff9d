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
from typing import Any

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

INVALID_ARGS_MARKER = "[awaken: not executed] "
"""Prefix given, in streamed chunks only, to the raw arguments of a call that will
not run when LangChain's lenient chunk merge would repair them.

LangChain re-parses merged tool-call chunks with ``parse_partial_json``, which
closes cut-off JSON: ``{"city": "Ber`` would become a valid call. The marker
keeps such a call in ``invalid_tool_calls`` after any merge; arguments that no
merge can repair are streamed as the model wrote them. Requests built by the
wrapper strip the marker again (see `awaken_langchain.recovery.answer_invalid_tool_calls`).
"""

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
    messages: Sequence[BaseMessage],
    prefix: str,
    prompt: str = DEFAULT_CONTINUATION_PROMPT,
    *,
    blocks: Sequence[Any] | None = None,
) -> list[BaseMessage]:
    """Build the continuation request for a text prefix.

    The original messages, then the prefix as an assistant message with trailing
    whitespace removed (providers reject an assistant turn ending in whitespace),
    then the continuation prompt as a user message, so the request never ends
    with an assistant message.

    Args:
        messages: The original request.
        prefix: The turn's text so far.
        prompt: The user message asking to continue.
        blocks: For a model that streams content blocks, the turn's whole blocks
            so far (thinking, reasoning, text...). They are sent as issued, in
            order, so signed thinking stays first and unmodified; only the last
            text block loses its trailing whitespace.
    """
    if not prefix.rstrip():
        return list(messages)
    if blocks is None:
        return [*messages, AIMessage(content=prefix.rstrip()), HumanMessage(content=prompt)]
    content = [dict(b) if isinstance(b, dict) else b for b in blocks]
    last = max((i for i, b in enumerate(content) if _is_text_block(b)), default=None)
    if last is not None:
        block = content[last]
        if isinstance(block, str):
            content[last] = block.rstrip()
        else:
            block["text"] = str(block.get("text", "")).rstrip()
    content = [b for b in content if not (_is_text_block(b) and not _text_in(b))]
    return [*messages, AIMessage(content=content), HumanMessage(content=prompt)]


def _is_text_block(block: Any) -> bool:
    return isinstance(block, str) or (isinstance(block, dict) and block.get("type") == "text")


def _text_in(block: Any) -> str:
    return block if isinstance(block, str) else str(block.get("text", ""))


def _not_executed_reasons(message: AIMessage) -> dict[str, str]:
    """The reasons ``response_metadata["awaken"]`` gives for calls that did not run."""
    awaken = message.response_metadata.get("awaken")
    entries = awaken.get("not_executed") if isinstance(awaken, dict) else None
    reasons: dict[str, str] = {}
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and entry.get("id") and entry.get("error"):
            reasons[str(entry["id"])] = str(entry["error"])
    return reasons


def _unmarked(message: AIMessage, marker: str) -> AIMessage:
    """``message`` with the streaming guard removed from its invalid calls' arguments."""
    calls = message.invalid_tool_calls
    if not any((c.get("args") or "").startswith(marker) for c in calls):
        return message
    fixed = [
        {**c, "args": (c.get("args") or "").removeprefix(marker)}
        for c in calls  # the arguments the model wrote
    ]
    return message.model_copy(update={"invalid_tool_calls": fixed})


def answer_invalid_tool_calls(
    messages: Sequence[BaseMessage], *, marker: str = INVALID_ARGS_MARKER
) -> list[BaseMessage]:
    """Make a history's never-executed tool calls valid to send, for one request.

    An assistant message's invalid tool calls (cut off mid-stream, or malformed)
    are sent to providers as tool calls; OpenAI and Anthropic reject a history in
    which a tool call id has no tool result, and the model should learn that the
    call did not run. For each invalid call with an id and no answering
    ``ToolMessage``, an error ``ToolMessage`` saying so is inserted right after
    the assistant message; and the streaming guard that kept a cut-off call from
    being repaired into a valid one is removed from its arguments, so the
    provider gets the arguments the model wrote. The input is not modified
    (memory never holds these changes).

    Args:
        messages: The request's messages.
        marker: The guard prefix streamed before repairable invalid arguments.
    """
    answered = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
    patched: list[BaseMessage] = []
    for message in messages:
        if not isinstance(message, AIMessage) or not message.invalid_tool_calls:
            patched.append(message)
            continue
        patched.append(_unmarked(message, marker))
        reasons = _not_executed_reasons(message)
        for call in message.invalid_tool_calls:
            call_id = call.get("id")
            if not call_id or call_id in answered:
                continue
            reason = (
                call.get("error")
                or reasons.get(call_id)
                or "its arguments were not a complete JSON object."
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
