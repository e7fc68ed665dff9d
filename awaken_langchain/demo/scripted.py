"""The scripted model behind the loopback server, and how the demo reads a recorded request."""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from awaken_langchain.recovery import DEFAULT_CONTINUATION_PROMPT
from awaken_langchain.testing.server import Fault, RecordedRequest, Scenario, ScriptedToolCall


@dataclass(frozen=True)
class Turn:
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
        turns: Mapping[str, Turn],
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

    def _continuation(self, turn: Turn, prefix: str, fault: Fault | None) -> Scenario:
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


def events_before_text(provider: str) -> int:
    """SSE events a stream sends before its first text delta."""
    return 1 if provider == "openai" else 2  # role chunk | message_start + block start


def is_continuation_of(request: RecordedRequest, prefix: str) -> bool:
    """Whether ``request`` continues an answer that had reached ``prefix``."""
    conversation = _conversation(request)
    return (
        len(conversation) >= 2
        and conversation[-1] == ("user", DEFAULT_CONTINUATION_PROMPT)
        and conversation[-2] == ("assistant", prefix.rstrip())
    )


def has_tool_calls(request: RecordedRequest) -> bool:
    """Whether ``request`` sends an assistant tool call back."""
    for message in request.messages:
        if message.get("tool_calls"):
            return True
        content = message.get("content")
        if isinstance(content, list) and any(
            isinstance(b, Mapping) and b.get("type") == "tool_use" for b in content
        ):
            return True
    return False
