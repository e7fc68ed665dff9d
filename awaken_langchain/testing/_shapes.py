"""Request-shape rules: the validation the real APIs apply before generating.

Each :class:`ShapeRule` is a named, documented check on one provider's request
body. A request that breaks a rule is answered HTTP 400 with the provider's
error body and the rule's message, worded like the real API's, so a client that
builds bad continuation requests fails here the way it would in production.

The rules are data: pass ``shape_rules=`` to
:class:`~awaken_langchain.testing.LoopbackProvider` to drop some or add your
own (for example :data:`NO_ASSISTANT_PREFILL`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from awaken_langchain.testing._scenarios import Provider
from awaken_langchain.testing._wire import signature_is_valid, unseal

ShapeCheck = Callable[[Mapping[str, Any]], "str | None"]
"""A check on a parsed request body: returns an error message, or ``None`` if it passes."""


@dataclass(frozen=True)
class ShapeRule:
    """One validation rule on a provider's request body.

    Attributes:
        name: A stable identifier, for example ``anthropic.tool_use_answered``.
        provider: The wire format the rule applies to.
        description: What the real API requires, in one sentence.
        check: Returns the error message for a violating body, else ``None``.
    """

    name: str
    provider: Provider
    description: str
    check: ShapeCheck

    def violation(self, body: Mapping[str, Any]) -> str | None:
        """Run the check; a body of the wrong structure is a violation, not a crash."""
        try:
            return self.check(body)
        except (AttributeError, KeyError, TypeError) as exc:
            return f"{self.name}: malformed request body ({type(exc).__name__}: {exc})"


# -- shared helpers -------------------------------------------------------------------


def _messages(body: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list):
        return []
    return [m for m in messages if isinstance(m, Mapping)]


def _blocks(message: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    content = message.get("content")
    if isinstance(content, list):
        return [b for b in content if isinstance(b, Mapping)]
    return []


def _ids(blocks: Sequence[Mapping[str, Any]], block_type: str, key: str) -> list[str]:
    return [str(b.get(key)) for b in blocks if b.get("type") == block_type]


# -- Anthropic ------------------------------------------------------------------------


def _anthropic_messages_present(body: Mapping[str, Any]) -> str | None:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: at least one message is required"
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or message.get("role") not in ("user", "assistant"):
            return f"messages.{i}.role: Input should be 'user' or 'assistant'"
    return None


def _anthropic_max_tokens(body: Mapping[str, Any]) -> str | None:
    value = body.get("max_tokens")
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        return "max_tokens: Field required (a positive integer)"
    return None


def _anthropic_alternating_roles(body: Mapping[str, Any]) -> str | None:
    messages = _messages(body)
    for i in range(1, len(messages)):
        if messages[i].get("role") == messages[i - 1].get("role"):
            return (
                f"messages.{i}: roles must alternate between 'user' and 'assistant', "
                f"but found multiple '{messages[i].get('role')}' roles in a row"
            )
    return None


def _anthropic_non_empty_content(body: Mapping[str, Any]) -> str | None:
    messages = _messages(body)
    for i, message in enumerate(messages):
        final_assistant = i == len(messages) - 1 and message.get("role") == "assistant"
        content = message.get("content")
        if content in ("", []) or content is None:
            if final_assistant:
                continue
            return (
                f"messages.{i}: all messages must have non-empty content except for "
                "the optional final assistant message"
            )
        for j, block in enumerate(_blocks(message)):
            if block.get("type") == "text" and not str(block.get("text", "")).strip():
                return f"messages.{i}.content.{j}.text: text content blocks must be non-empty"
        if isinstance(content, str) and not content.strip() and not final_assistant:
            return f"messages.{i}: text content blocks must contain non-whitespace text"
    return None


def _anthropic_final_assistant_whitespace(body: Mapping[str, Any]) -> str | None:
    messages = _messages(body)
    if not messages or messages[-1].get("role") != "assistant":
        return None
    content = messages[-1].get("content")
    if isinstance(content, str):
        text = content
    else:
        texts = [b for b in _blocks(messages[-1]) if b.get("type") == "text"]
        blocks = _blocks(messages[-1])
        if not texts or blocks[-1].get("type") != "text":
            return None
        text = str(texts[-1].get("text", ""))
    if text and text != text.rstrip():
        return "messages: final assistant content cannot end with trailing whitespace"
    return None


def _anthropic_tool_use_answered(body: Mapping[str, Any]) -> str | None:
    messages = _messages(body)
    for i, message in enumerate(messages):
        blocks = _blocks(message)
        if message.get("role") == "assistant":
            uses = _ids(blocks, "tool_use", "id")
            if not uses:
                continue
            following = _blocks(messages[i + 1]) if i + 1 < len(messages) else []
            answered = set(_ids(following, "tool_result", "tool_use_id"))
            missing = [u for u in uses if u not in answered]
            if missing:
                return (
                    f"messages.{i + 1}: `tool_use` ids were found without `tool_result` blocks "
                    f"immediately after: {', '.join(missing)}. Each `tool_use` block must have "
                    "a corresponding `tool_result` block in the next message."
                )
        else:
            previous = _blocks(messages[i - 1]) if i > 0 else []
            known = set(_ids(previous, "tool_use", "id"))
            for j, block in enumerate(blocks):
                if block.get("type") == "tool_result" and block.get("tool_use_id") not in known:
                    return (
                        f"messages.{i}.content.{j}: unexpected `tool_use_id` found in "
                        f"`tool_result` blocks: {block.get('tool_use_id')}. Each `tool_result` "
                        "block must have a corresponding `tool_use` block in the previous message."
                    )
    return None


def _anthropic_no_prefill(body: Mapping[str, Any]) -> str | None:
    messages = _messages(body)
    if messages and messages[-1].get("role") == "assistant":
        return (
            "This model does not support assistant message prefill. "
            "The conversation must end with a user message."
        )
    return None


_THINKING_TYPES = ("thinking", "redacted_thinking")


def _anthropic_thinking_enabled(body: Mapping[str, Any]) -> bool:
    thinking = body.get("thinking")
    return isinstance(thinking, Mapping) and thinking.get("type") in ("enabled", "adaptive")


def _anthropic_thinking_unmodified(body: Mapping[str, Any]) -> str | None:
    for i, message in enumerate(_messages(body)):
        if message.get("role") != "assistant":
            continue
        for j, block in enumerate(_blocks(message)):
            if block.get("type") == "thinking" and not signature_is_valid(
                str(block.get("thinking", "")), block.get("signature")
            ):
                return f"messages.{i}.content.{j}: Invalid `signature` in `thinking` block"
            if block.get("type") == "redacted_thinking" and unseal(block.get("data")) is None:
                return f"messages.{i}.content.{j}: Invalid `data` in `redacted_thinking` block"
    return None


def _anthropic_thinking_first(body: Mapping[str, Any]) -> str | None:
    for i, message in enumerate(_messages(body)):
        blocks = _blocks(message)
        if message.get("role") != "assistant" or not blocks:
            continue
        has_thinking = any(b.get("type") in _THINKING_TYPES for b in blocks)
        if has_thinking and blocks[0].get("type") not in _THINKING_TYPES:
            return (
                f"messages.{i}.content.0: If an assistant message contains any thinking "
                f"blocks, the first block must be thinking or redacted_thinking. "
                f"Found {blocks[0].get('type')}."
            )
    return None


def _anthropic_thinking_starts_tool_turn(body: Mapping[str, Any]) -> str | None:
    if not _anthropic_thinking_enabled(body):
        return None
    messages = _messages(body)
    if len(messages) < 2 or messages[-1].get("role") != "user":
        return None
    if not any(b.get("type") == "tool_result" for b in _blocks(messages[-1])):
        return None
    i = len(messages) - 2
    blocks = _blocks(messages[i])
    first = blocks[0].get("type") if blocks else "text"
    if messages[i].get("role") == "assistant" and first not in _THINKING_TYPES:
        return (
            f"messages.{i}.content.0.type: Expected `thinking` or `redacted_thinking`, but "
            f"found `{first}`. When `thinking` is enabled, a final `assistant` message must "
            "start with a thinking block (preceeding the lastmost set of `tool_use` and "
            "`tool_result` blocks). We recommend you include thinking blocks from previous "
            "turns. To avoid this requirement, disable `thinking`. Please consult our "
            "documentation at https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
        )
    return None


# -- OpenAI Responses -----------------------------------------------------------------


def _input_items(body: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    items = body.get("input")
    if not isinstance(items, list):
        return []
    return [item for item in items if isinstance(item, Mapping)]


def _item_type(item: Mapping[str, Any]) -> Any:
    return item.get("type", "message" if "role" in item else None)


def _responses_input_present(body: Mapping[str, Any]) -> str | None:
    value = body.get("input")
    if body.get("previous_response_id") or (isinstance(value, str) and value):
        return None
    if not isinstance(value, list) or not value:
        return "Missing required parameter: 'input'."
    return None


def _responses_function_calls_answered(body: Mapping[str, Any]) -> str | None:
    called: set[str] = set()
    answered: set[str] = set()
    for item in _input_items(body):
        if _item_type(item) == "function_call":
            called.add(str(item.get("call_id")))
        elif _item_type(item) == "function_call_output":
            call_id = str(item.get("call_id"))
            if call_id not in called:
                return f"No tool call found for function call output with call_id {call_id}."
            answered.add(call_id)
    for item in _input_items(body):
        call_id = str(item.get("call_id"))
        if _item_type(item) == "function_call" and call_id not in answered:
            return f"No tool output found for function call {call_id}."
    return None


def _responses_reasoning_issued(body: Mapping[str, Any]) -> str | None:
    for item in _input_items(body):
        if _item_type(item) != "reasoning":
            continue
        item_id = str(item.get("id"))
        sealed = item.get("encrypted_content")
        if sealed is not None:
            text = unseal(sealed)
            if text is None or not text.startswith(item_id + "\n"):
                return (
                    f"The encrypted content for item {item_id} could not be verified. "
                    "Reason: Encrypted content could not be decrypted or parsed."
                )
        elif body.get("store") is False:
            return (
                f"Item with id '{item_id}' not found. Items are not persisted when `store` is "
                "set to false. Try again with `store` set to true, or remove this item from "
                "your input."
            )
        elif not item_id.startswith("rs_loopback_"):
            return f"Item with id '{item_id}' not found."
    return None


def _responses_assistant_parts(body: Mapping[str, Any]) -> str | None:
    for i, item in enumerate(_input_items(body)):
        if _item_type(item) != "message" or item.get("role") != "assistant":
            continue
        for j, part in enumerate(_blocks(item)):
            if part.get("type") not in ("output_text", "refusal"):
                return (
                    f"Invalid value: '{part.get('type')}'. Supported values are: "
                    f"'output_text' and 'refusal'. (input[{i}].content[{j}])"
                )
    return None


def _responses_no_prefill(body: Mapping[str, Any]) -> str | None:
    items = _input_items(body)
    if items and _item_type(items[-1]) == "message" and items[-1].get("role") == "assistant":
        return (
            "This model does not support assistant message prefill. "
            "The input must not end with an assistant message."
        )
    return None


# -- OpenAI ---------------------------------------------------------------------------

_OPENAI_ROLES = ("system", "developer", "user", "assistant", "tool", "function")


def _openai_messages_present(body: Mapping[str, Any]) -> str | None:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "[] is too short - 'messages'"
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or message.get("role") not in _OPENAI_ROLES:
            return f"Invalid value for 'messages[{i}].role': expected one of {_OPENAI_ROLES}."
    return None


def _openai_tool_runs(
    messages: Sequence[Mapping[str, Any]],
) -> Iterator[tuple[int, list[str], list[str]]]:
    """Yield (index, call ids, ids answered right after) per tool-calling turn."""
    for i, message in enumerate(messages):
        calls = message.get("tool_calls") if message.get("role") == "assistant" else None
        if not calls:
            continue
        ids = [str(c.get("id")) for c in calls if isinstance(c, Mapping)]
        answered: list[str] = []
        for follower in messages[i + 1 :]:
            if follower.get("role") != "tool":
                break
            answered.append(str(follower.get("tool_call_id")))
        yield i, ids, answered


def _openai_tool_calls_answered(body: Mapping[str, Any]) -> str | None:
    for _, ids, answered in _openai_tool_runs(_messages(body)):
        missing = [call_id for call_id in ids if call_id not in answered]
        if missing:
            return (
                "An assistant message with 'tool_calls' must be followed by tool messages "
                "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                f"response messages: {', '.join(missing)}"
            )
    return None


def _openai_tool_message_follows_call(body: Mapping[str, Any]) -> str | None:
    messages = _messages(body)
    for i, message in enumerate(messages):
        if message.get("role") != "tool":
            continue
        j = i - 1
        while j >= 0 and messages[j].get("role") == "tool":
            j -= 1
        calls = messages[j].get("tool_calls") if j >= 0 else None
        ids = {str(c.get("id")) for c in calls or [] if isinstance(c, Mapping)}
        if messages[j].get("role") != "assistant" or str(message.get("tool_call_id")) not in ids:
            return (
                f"Invalid parameter: messages with role 'tool' must be a response to a "
                f"preceeding message with 'tool_calls' (messages[{i}])."
            )
    return None


def _openai_assistant_has_content(body: Mapping[str, Any]) -> str | None:
    for i, message in enumerate(_messages(body)):
        if message.get("role") != "assistant" or message.get("tool_calls"):
            continue
        if message.get("content") is None:
            return f"Invalid value for 'messages[{i}].content': expected a string, got null."
    return None


def _openai_stream_options(body: Mapping[str, Any]) -> str | None:
    if body.get("stream_options") is not None and not body.get("stream"):
        return "The 'stream_options' parameter is only allowed when 'stream' is enabled."
    return None


# -- the rule sets --------------------------------------------------------------------

NO_ASSISTANT_PREFILL = ShapeRule(
    "anthropic.no_assistant_prefill",
    "anthropic",
    "The conversation must end with a user message (newer Claude models reject prefill).",
    _anthropic_no_prefill,
)
"""Opt-in rule: reject a request ending with an assistant message, as newer Claude models do."""

DEFAULT_SHAPE_RULES: tuple[ShapeRule, ...] = (
    ShapeRule(
        "anthropic.messages_present",
        "anthropic",
        "`messages` is a non-empty list of 'user'/'assistant' messages.",
        _anthropic_messages_present,
    ),
    ShapeRule(
        "anthropic.max_tokens",
        "anthropic",
        "`max_tokens` is a positive integer.",
        _anthropic_max_tokens,
    ),
    ShapeRule(
        "anthropic.alternating_roles",
        "anthropic",
        "Messages alternate between 'user' and 'assistant'.",
        _anthropic_alternating_roles,
    ),
    ShapeRule(
        "anthropic.non_empty_content",
        "anthropic",
        "Every message but an optional final assistant one has non-empty content, "
        "and text blocks are non-empty.",
        _anthropic_non_empty_content,
    ),
    ShapeRule(
        "anthropic.final_assistant_no_trailing_whitespace",
        "anthropic",
        "A final assistant message must not end in whitespace.",
        _anthropic_final_assistant_whitespace,
    ),
    ShapeRule(
        "anthropic.tool_use_answered",
        "anthropic",
        "Every `tool_use` is answered by a `tool_result` in the next message, and every "
        "`tool_result` answers a `tool_use` of the previous message.",
        _anthropic_tool_use_answered,
    ),
    ShapeRule(
        "anthropic.thinking_unmodified",
        "anthropic",
        "Thinking and redacted thinking blocks are sent back exactly as issued (the "
        "signature matches the thinking text).",
        _anthropic_thinking_unmodified,
    ),
    ShapeRule(
        "anthropic.thinking_first",
        "anthropic",
        "An assistant message that contains thinking blocks starts with one.",
        _anthropic_thinking_first,
    ),
    ShapeRule(
        "anthropic.thinking_starts_tool_turn",
        "anthropic",
        "With `thinking` enabled, the assistant message answered by the final "
        "`tool_result` starts with a thinking or redacted_thinking block.",
        _anthropic_thinking_starts_tool_turn,
    ),
    ShapeRule(
        "openai-responses.input_present",
        "openai-responses",
        "`input` is a non-empty string or list (unless `previous_response_id` is given).",
        _responses_input_present,
    ),
    ShapeRule(
        "openai-responses.function_calls_answered",
        "openai-responses",
        "A `function_call_output` follows the `function_call` with its `call_id`, and every "
        "`function_call` is answered.",
        _responses_function_calls_answered,
    ),
    ShapeRule(
        "openai-responses.reasoning_items_issued",
        "openai-responses",
        "A `reasoning` item carries the id and `encrypted_content` the server issued "
        "(`encrypted_content` is required when `store` is false).",
        _responses_reasoning_issued,
    ),
    ShapeRule(
        "openai-responses.assistant_output_parts",
        "openai-responses",
        "Assistant `message` items hold only `output_text` and `refusal` parts.",
        _responses_assistant_parts,
    ),
    ShapeRule(
        "openai-responses.no_assistant_prefill",
        "openai-responses",
        "The input does not end with an assistant message (newer models reject prefill).",
        _responses_no_prefill,
    ),
    ShapeRule(
        "openai.messages_present",
        "openai",
        "`messages` is a non-empty list of messages with known roles.",
        _openai_messages_present,
    ),
    ShapeRule(
        "openai.tool_calls_answered",
        "openai",
        "Every assistant `tool_calls` id is answered by a following 'tool' message.",
        _openai_tool_calls_answered,
    ),
    ShapeRule(
        "openai.tool_message_follows_call",
        "openai",
        "A 'tool' message answers a `tool_call_id` of the preceding assistant message.",
        _openai_tool_message_follows_call,
    ),
    ShapeRule(
        "openai.assistant_has_content",
        "openai",
        "An assistant message without `tool_calls` has non-null `content`.",
        _openai_assistant_has_content,
    ),
    ShapeRule(
        "openai.stream_options_needs_stream",
        "openai",
        "`stream_options` is only allowed when `stream` is true.",
        _openai_stream_options,
    ),
)
"""The rules every :class:`~awaken_langchain.testing.LoopbackProvider` applies by default."""


def first_violation(
    rules: Sequence[ShapeRule], provider: Provider, body: Mapping[str, Any]
) -> tuple[ShapeRule, str] | None:
    """Return the first rule of ``provider`` that ``body`` breaks, with its message."""
    for rule in rules:
        if rule.provider != provider:
            continue
        message = rule.violation(body)
        if message is not None:
            return rule, message
    return None
