"""Pure rendering of scripted scenarios into OpenAI and Anthropic wire formats.

No I/O here: functions take a :class:`Scenario` and a :class:`ResponseContext`
and return JSON-ready dicts or SSE frames. The field shapes follow the official
SDK types (``openai.types.chat.ChatCompletionChunk``,
``anthropic.types.RawMessageStreamEvent``) so the real SDKs and LangChain
integrations parse them exactly as they parse the real services.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, NamedTuple

from awaken_langchain.testing._scenarios import (
    _CONTEXT_OVERFLOW,
    Provider,
    Scenario,
    ScriptedToolCall,
    TokenUsage,
)

CREATED = 1_767_225_600
"""Fixed ``created`` timestamp (2026-01-01T00:00:00Z) so responses are reproducible."""


class Frame(NamedTuple):
    """One SSE event as sent on the wire.

    Attributes:
        data: The complete event text, ending in a blank line.
        terminal: Whether the frame is part of the terminal signal (OpenAI's
            ``finish_reason`` chunk, usage chunk and ``[DONE]``; Anthropic's
            ``message_delta`` and ``message_stop``).
    """

    data: bytes
    terminal: bool = False


@dataclass(frozen=True)
class ResponseContext:
    """Per-request values a rendered response needs.

    Attributes:
        number: The request's sequence number on the server (1-based).
        model: The model name to report.
        usage: Token usage to report.
        include_usage: OpenAI only: send the final usage chunk
            (``stream_options.include_usage``).
    """

    number: int
    model: str
    usage: TokenUsage
    include_usage: bool = False

    @property
    def openai_id(self) -> str:
        """The OpenAI completion id."""
        return f"chatcmpl-loopback-{self.number}"

    @property
    def anthropic_id(self) -> str:
        """The Anthropic message id."""
        return f"msg_loopback_{self.number}"

    @property
    def request_id(self) -> str:
        """The request id sent in ``x-request-id``/``request-id`` and error bodies."""
        return f"req_loopback_{self.number}"

    def tool_call_id(self, provider: Provider, index: int, call: ScriptedToolCall) -> str:
        """The id of the ``index``-th tool call (the scripted id when given)."""
        if call.id is not None:
            return call.id
        prefix = "call" if provider == "openai" else "toolu"
        return f"{prefix}_{self.number}_{index}"


def estimate_usage(body: Any, scenario: Scenario) -> TokenUsage:
    """Estimate token usage at about four characters per token.

    Args:
        body: The parsed request body.
        scenario: The answering scenario.

    Returns:
        The scenario's own usage if it sets one, else the estimate.
    """
    if scenario.usage is not None:
        return scenario.usage
    prompt: Any = body.get("messages", []) if isinstance(body, dict) else []
    prompt_chars = len(json.dumps(prompt, separators=(",", ":")))
    output_chars = len(scenario.full_text) + sum(
        len(call.name) + len(call.arguments_json) for call in scenario.tool_calls
    )
    return TokenUsage(max(1, prompt_chars // 4), max(1, output_chars // 4))


# -- errors ---------------------------------------------------------------------------

_OPENAI_ERRORS: dict[int, tuple[str, str | None, str]] = {
    400: ("invalid_request_error", None, "Invalid request."),
    401: ("invalid_request_error", "invalid_api_key", "Incorrect API key provided."),
    403: ("invalid_request_error", "unsupported_country_region_territory", "Forbidden."),
    404: ("invalid_request_error", "model_not_found", "The model does not exist."),
    413: ("invalid_request_error", None, "Request too large."),
    429: ("requests", "rate_limit_exceeded", "Rate limit reached for requests."),
}
_ANTHROPIC_ERRORS: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "Invalid request."),
    401: ("authentication_error", "invalid x-api-key"),
    402: ("billing_error", "Billing error."),
    403: ("permission_error", "Your API key does not have permission to use this resource."),
    404: ("not_found_error", "Not found."),
    413: ("request_too_large", "Request exceeds the maximum allowed number of bytes."),
    429: ("rate_limit_error", "Number of request tokens has exceeded your rate limit."),
    500: ("api_error", "Internal server error"),
    504: ("timeout_error", "Request timed out"),
    529: ("overloaded_error", "Overloaded"),
}
_OPENAI_OVERFLOW = (
    "This model's maximum context length is 128000 tokens. However, your messages "
    "resulted in 250000 tokens. Please reduce the length of the messages."
)
_ANTHROPIC_OVERFLOW = "prompt is too long: 250000 tokens > 200000 maximum"


def error_body(
    provider: Provider,
    status: int,
    *,
    request_id: str,
    error_type: str | None = None,
    message: str | None = None,
    code: str | None = None,
    param: str | None = None,
) -> dict[str, Any]:
    """Build a provider-style error body.

    Args:
        provider: The wire format.
        status: The HTTP status the error is reported with (200 for an SSE
            error event); picks the default type and message.
        request_id: Anthropic ``request_id``.
        error_type: Provider error type; ``None`` picks the usual one for ``status``.
        message: Error message; ``None`` picks a default.
        code: OpenAI error ``code``.
        param: OpenAI error ``param``.

    Returns:
        The JSON-ready error body.
    """
    if provider == "openai":
        default_type, default_code, default_message = _OPENAI_ERRORS.get(
            status, ("server_error", None, "The server had an error while processing your request.")
        )
        if message == _CONTEXT_OVERFLOW:
            message, param = _OPENAI_OVERFLOW, param or "messages"
        return {
            "error": {
                "message": message or default_message,
                "type": error_type or default_type,
                "param": param,
                "code": code if code is not None else default_code,
            }
        }
    default_type, default_message = _ANTHROPIC_ERRORS.get(
        status, ("api_error", "Internal server error")
    )
    if message == _CONTEXT_OVERFLOW:
        message = _ANTHROPIC_OVERFLOW
    return {
        "type": "error",
        "error": {"type": error_type or default_type, "message": message or default_message},
        "request_id": request_id,
    }


def stream_error_type(provider: Provider, error_type: str | None) -> str:
    """The error type of an SSE error event: the given one, else the provider's usual one."""
    if error_type is not None:
        return error_type
    return "server_error" if provider == "openai" else "overloaded_error"


def error_frame(provider: Provider, body: dict[str, Any]) -> Frame:
    """An SSE error event carrying ``body``."""
    if provider == "openai":
        return _data_frame(body)
    return _event_frame("error", body)


def keepalive_frame(provider: Provider) -> Frame:
    """What a provider sends to keep an idle stream open: SDKs skip it."""
    if provider == "openai":
        return Frame(b": keep-alive\n\n")
    return _event_frame("ping", {"type": "ping"})


def malformed_frame(provider: Provider) -> Frame:
    """An SSE event whose data is cut-off JSON."""
    if provider == "openai":
        return Frame(b'data: {"id": "chatcmpl-loopback", "choices": [{"delta": {"content": "\n\n')
    return Frame(b'event: content_block_delta\ndata: {"type": "content_block_delta", "ind\n\n')


# -- OpenAI ---------------------------------------------------------------------------


def openai_finish_reason(scenario: Scenario) -> str:
    """The ``finish_reason`` the scenario ends with."""
    if scenario.stop_reason is not None:
        return scenario.stop_reason
    return "tool_calls" if scenario.tool_calls else "stop"


def openai_usage(usage: TokenUsage) -> dict[str, int]:
    """OpenAI's ``usage`` object."""
    return {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.input_tokens + usage.output_tokens,
    }


def openai_frames(scenario: Scenario, ctx: ResponseContext) -> list[Frame]:
    """Render a streamed Chat Completions response.

    Args:
        scenario: What to answer.
        ctx: Per-request values.

    Returns:
        The SSE frames: a role chunk, content deltas, tool-call deltas (the
        first of each call carries ``id``, ``type`` and ``function.name``), the
        ``finish_reason`` chunk, the usage chunk when requested, ``[DONE]``.
    """

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": ctx.openai_id,
            "object": "chat.completion.chunk",
            "created": CREATED,
            "model": ctx.model,
            "system_fingerprint": "fp_loopback",
            "choices": [
                {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            ],
        }
        if ctx.include_usage:
            body["usage"] = None
        return body

    frames = [_data_frame(chunk({"role": "assistant", "content": "", "refusal": None}))]
    frames += [_data_frame(chunk({"content": piece})) for piece in scenario.text_pieces()]
    for index, call in enumerate(scenario.tool_calls):
        head = {
            "index": index,
            "id": ctx.tool_call_id("openai", index, call),
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        frames.append(_data_frame(chunk({"tool_calls": [head]})))
        for piece in scenario.argument_pieces(call):
            delta = {"index": index, "function": {"arguments": piece}}
            frames.append(_data_frame(chunk({"tool_calls": [delta]})))
    frames.append(_data_frame(chunk({}, openai_finish_reason(scenario)), terminal=True))
    if ctx.include_usage:
        usage_chunk = chunk({})
        usage_chunk["choices"] = []
        usage_chunk["usage"] = openai_usage(ctx.usage)
        frames.append(_data_frame(usage_chunk, terminal=True))
    frames.append(Frame(b"data: [DONE]\n\n", terminal=True))
    return frames


def openai_completion(
    scenario: Scenario, ctx: ResponseContext, *, terminal: bool = True
) -> dict[str, Any]:
    """Render a non-streamed Chat Completions response.

    Args:
        scenario: What to answer.
        ctx: Per-request values.
        terminal: Whether to report a ``finish_reason`` (``null`` when False).

    Returns:
        The ``chat.completion`` body.
    """
    message: dict[str, Any] = {
        "role": "assistant",
        "content": scenario.full_text or None,
        "refusal": None,
    }
    if scenario.tool_calls:
        message["tool_calls"] = [
            {
                "id": ctx.tool_call_id("openai", index, call),
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments_json},
            }
            for index, call in enumerate(scenario.tool_calls)
        ]
    return {
        "id": ctx.openai_id,
        "object": "chat.completion",
        "created": CREATED,
        "model": ctx.model,
        "system_fingerprint": "fp_loopback",
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": openai_finish_reason(scenario) if terminal else None,
            }
        ],
        "usage": openai_usage(ctx.usage),
    }


# -- Anthropic ------------------------------------------------------------------------


def anthropic_stop_reason(scenario: Scenario) -> str:
    """The ``stop_reason`` the scenario ends with."""
    if scenario.stop_reason is not None:
        return scenario.stop_reason
    return "tool_use" if scenario.tool_calls else "end_turn"


def anthropic_frames(scenario: Scenario, ctx: ResponseContext) -> list[Frame]:
    """Render a streamed Messages response.

    Args:
        scenario: What to answer.
        ctx: Per-request values.

    Returns:
        The SSE frames: ``message_start``; per content block (text first, then
        one ``tool_use`` block per call) ``content_block_start``, deltas
        (``text_delta`` or ``input_json_delta``) and ``content_block_stop``;
        ``message_delta`` with ``stop_reason`` and usage; ``message_stop``.
    """
    start_message: dict[str, Any] = {
        "id": ctx.anthropic_id,
        "type": "message",
        "role": "assistant",
        "model": ctx.model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": ctx.usage.input_tokens, "output_tokens": 1},
    }
    frames = [_event_frame("message_start", {"type": "message_start", "message": start_message})]
    index = 0
    pieces = scenario.text_pieces()
    if pieces:
        frames.append(_block_start(index, {"type": "text", "text": ""}))
        for piece in pieces:
            frames.append(_block_delta(index, {"type": "text_delta", "text": piece}))
        frames.append(_block_stop(index))
        index += 1
    for call_number, call in enumerate(scenario.tool_calls):
        block = {
            "type": "tool_use",
            "id": ctx.tool_call_id("anthropic", call_number, call),
            "name": call.name,
            "input": {},
        }
        frames.append(_block_start(index, block))
        for piece in scenario.argument_pieces(call):
            frames.append(_block_delta(index, {"type": "input_json_delta", "partial_json": piece}))
        frames.append(_block_stop(index))
        index += 1
    message_delta = {
        "type": "message_delta",
        "delta": {"stop_reason": anthropic_stop_reason(scenario), "stop_sequence": None},
        "usage": {
            "input_tokens": ctx.usage.input_tokens,
            "output_tokens": ctx.usage.output_tokens,
        },
    }
    frames.append(_event_frame("message_delta", message_delta, terminal=True))
    frames.append(_event_frame("message_stop", {"type": "message_stop"}, terminal=True))
    return frames


def anthropic_message(
    scenario: Scenario, ctx: ResponseContext, *, terminal: bool = True
) -> dict[str, Any]:
    """Render a non-streamed Messages response.

    Args:
        scenario: What to answer.
        ctx: Per-request values.
        terminal: Whether to report a ``stop_reason`` (``null`` when False).

    Returns:
        The ``message`` body.

    Raises:
        ValueError: A tool call's arguments are not a JSON object, which a
            non-streamed Anthropic ``tool_use.input`` cannot express.
    """
    content: list[dict[str, Any]] = []
    if scenario.full_text:
        content.append({"type": "text", "text": scenario.full_text})
    for number, call in enumerate(scenario.tool_calls):
        try:
            arguments = json.loads(call.arguments_json)
        except json.JSONDecodeError:
            arguments = None
        if not isinstance(arguments, dict):
            raise ValueError(
                f"tool call {call.name!r} has arguments that are not a JSON object "
                f"({call.arguments_json!r}); a non-streamed Anthropic response needs one. "
                "Stream the request, or script valid arguments."
            )
        content.append(
            {
                "type": "tool_use",
                "id": ctx.tool_call_id("anthropic", number, call),
                "name": call.name,
                "input": arguments,
            }
        )
    return {
        "id": ctx.anthropic_id,
        "type": "message",
        "role": "assistant",
        "model": ctx.model,
        "content": content,
        "stop_reason": anthropic_stop_reason(scenario) if terminal else None,
        "stop_sequence": None,
        "usage": {
            "input_tokens": ctx.usage.input_tokens,
            "output_tokens": ctx.usage.output_tokens,
        },
    }


# -- helpers --------------------------------------------------------------------------


def _json(body: Any) -> str:
    return json.dumps(body, separators=(",", ":"))


def _data_frame(body: Any, *, terminal: bool = False) -> Frame:
    return Frame(f"data: {_json(body)}\n\n".encode(), terminal)


def _event_frame(event: str, body: Any, *, terminal: bool = False) -> Frame:
    return Frame(f"event: {event}\ndata: {_json(body)}\n\n".encode(), terminal)


def _block_start(index: int, block: dict[str, Any]) -> Frame:
    body = {"type": "content_block_start", "index": index, "content_block": block}
    return _event_frame("content_block_start", body)


def _block_delta(index: int, delta: dict[str, Any]) -> Frame:
    body = {"type": "content_block_delta", "index": index, "delta": delta}
    return _event_frame("content_block_delta", body)


def _block_stop(index: int) -> Frame:
    return _event_frame("content_block_stop", {"type": "content_block_stop", "index": index})
