"""Pure rendering of scripted scenarios into OpenAI and Anthropic wire formats.

Three wires: OpenAI Chat Completions, OpenAI Responses and Anthropic Messages.

No I/O here: functions take a :class:`Scenario` and a :class:`ResponseContext`
and return JSON-ready dicts or SSE frames. The field shapes follow the official
SDK types (``openai.types.chat.ChatCompletionChunk``,
``openai.types.responses.ResponseStreamEvent``,
``anthropic.types.RawMessageStreamEvent``) so the real SDKs and LangChain
integrations parse them exactly as they parse the real services.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from awaken_langchain.testing._scenarios import (
    _CONTEXT_OVERFLOW,
    Provider,
    Scenario,
    ScriptedCitation,
    ScriptedThinking,
    ScriptedToolCall,
    ScriptedWebSearch,
    TokenUsage,
    is_openai,
    split,
)

CREATED = 1_767_225_600
"""Fixed ``created`` timestamp (2026-01-01T00:00:00Z) so responses are reproducible."""


# -- sealed values ----------------------------------------------------------------------

_SEAL_KEY = b"awaken-langchain loopback provider"
"""The key the server seals what it issues with. Fixed, so answers are reproducible;
the point is to detect a block a client modified, not to keep anything secret."""


def _mac(text: str) -> bytes:
    return hmac.new(_SEAL_KEY, text.encode(), hashlib.sha256).digest()


def thinking_signature(thinking: str) -> str:
    """The ``signature`` of an Anthropic thinking block: an HMAC of its text."""
    return base64.b64encode(_mac("thinking:" + thinking)).decode()


def signature_is_valid(thinking: str, signature: object) -> bool:
    """Whether ``signature`` is the one the server issued for ``thinking``."""
    return isinstance(signature, str) and hmac.compare_digest(
        signature, thinking_signature(thinking)
    )


def seal(text: str) -> str:
    """An opaque token carrying ``text`` (redacted thinking data, encrypted reasoning)."""
    return base64.b64encode(_mac(text)[:16] + text.encode()).decode()


def unseal(token: object) -> str | None:
    """The text sealed in ``token``, or ``None`` when the server did not issue it."""
    if not isinstance(token, str):
        return None
    try:
        raw = base64.b64decode(token, validate=True)
        text = raw[16:].decode()
    except (ValueError, UnicodeDecodeError):
        return None
    return text if hmac.compare_digest(raw[:16], _mac(text)[:16]) else None


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
        request: The parsed request body (the Responses API echoes parts of it).
    """

    number: int
    model: str
    usage: TokenUsage
    include_usage: bool = False
    request: Mapping[str, Any] | None = None

    @property
    def openai_id(self) -> str:
        """The OpenAI completion id."""
        return f"chatcmpl-loopback-{self.number}"

    @property
    def anthropic_id(self) -> str:
        """The Anthropic message id."""
        return f"msg_loopback_{self.number}"

    @property
    def response_id(self) -> str:
        """The Responses API response id."""
        return f"resp_loopback_{self.number}"

    @property
    def request_id(self) -> str:
        """The request id sent in ``x-request-id``/``request-id`` and error bodies."""
        return f"req_loopback_{self.number}"

    def tool_call_id(self, provider: Provider, index: int, call: ScriptedToolCall) -> str:
        """The id of the ``index``-th tool call (the scripted id when given)."""
        if call.id is not None:
            return call.id
        prefix = "call" if is_openai(provider) else "toolu"
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
    prompt: Any = []
    if isinstance(body, dict):
        prompt = body.get("messages", [body.get("instructions"), body.get("input")])
    prompt_chars = len(json.dumps(prompt, separators=(",", ":")))
    output_chars = (
        len(scenario.full_text)
        + sum(len(call.name) + len(call.arguments_json) for call in scenario.tool_calls)
        + sum(len(block.full_text) for block in scenario.thinking)
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
    if is_openai(provider):
        default_type, default_code, default_message = _OPENAI_ERRORS.get(
            status, ("server_error", None, "The server had an error while processing your request.")
        )
        if message == _CONTEXT_OVERFLOW:
            message = _OPENAI_OVERFLOW
            param = param or ("input" if provider == "openai-responses" else "messages")
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
    return "server_error" if is_openai(provider) else "overloaded_error"


def error_frame(provider: Provider, body: dict[str, Any], *, sequence_number: int = 0) -> Frame:
    """An SSE error event carrying ``body`` (as built by :func:`error_body` for status 200).

    The Responses API flattens the error into the event: ``{"type": "error",
    "code", "message", "param", "sequence_number"}``.
    """
    if provider == "openai":
        return _data_frame(body)
    if provider == "openai-responses":
        error = body["error"]
        event = {
            "type": "error",
            "code": error.get("code") or error.get("type"),
            "message": error.get("message"),
            "param": error.get("param"),
            "sequence_number": sequence_number,
        }
        return _event_frame("error", event)
    return _event_frame("error", body)


def keepalive_frame(provider: Provider) -> Frame:
    """What a provider sends to keep an idle stream open: SDKs skip it."""
    if is_openai(provider):
        return Frame(b": keep-alive\n\n")
    return _event_frame("ping", {"type": "ping"})


def malformed_frame(provider: Provider) -> Frame:
    """An SSE event whose data is cut-off JSON."""
    if provider == "openai":
        return Frame(b'data: {"id": "chatcmpl-loopback", "choices": [{"delta": {"content": "\n\n')
    if provider == "openai-responses":
        return Frame(
            b'event: response.output_text.delta\ndata: {"type": "response.output_text.delta", '
            b'"ite\n\n'
        )
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


def anthropic_thinking_block(block: ScriptedThinking) -> dict[str, Any]:
    """The complete content block of a scripted thinking block, signed by the server."""
    if block.redacted:
        return {"type": "redacted_thinking", "data": seal(block.full_text)}
    text = block.full_text
    return {"type": "thinking", "thinking": text, "signature": thinking_signature(text)}


def anthropic_web_search_blocks(
    ctx: ResponseContext, number: int, search: ScriptedWebSearch
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``server_tool_use`` and ``web_search_tool_result`` blocks of a scripted search."""
    use_id = f"srvtoolu_{ctx.number}_{number}"
    use = {
        "type": "server_tool_use",
        "id": use_id,
        "name": "web_search",
        "input": {"query": search.query},
    }
    results = [
        {
            "type": "web_search_result",
            "url": url,
            "title": title,
            "encrypted_content": seal(url),
            "page_age": None,
        }
        for url, title in search.results
    ]
    return use, {"type": "web_search_tool_result", "tool_use_id": use_id, "content": results}


def anthropic_citation(scenario: Scenario, citation: ScriptedCitation) -> dict[str, Any]:
    """A scripted citation as an Anthropic ``web_search_result_location``."""
    return {
        "type": "web_search_result_location",
        "cited_text": scenario.full_text[citation.start : citation.end],
        "url": citation.url,
        "title": citation.title,
        "encrypted_index": seal(citation.url),
    }


def anthropic_frames(scenario: Scenario, ctx: ResponseContext) -> list[Frame]:
    """Render a streamed Messages response.

    Args:
        scenario: What to answer.
        ctx: Per-request values.

    Returns:
        The SSE frames: ``message_start``; per content block (thinking first,
        then text, then one ``tool_use`` block per call) ``content_block_start``,
        deltas and ``content_block_stop``; ``message_delta`` with
        ``stop_reason`` and usage; ``message_stop``. A thinking block streams
        ``thinking_delta`` events and one ``signature_delta``; a redacted one
        carries its ``data`` in the start event and has no deltas. Text cited
        by a scripted citation is its own block, starting with a
        ``citations_delta``.
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
    for thinking in scenario.thinking:
        if thinking.redacted:
            frames.append(_block_start(index, anthropic_thinking_block(thinking)))
        else:
            frames.append(
                _block_start(index, {"type": "thinking", "thinking": "", "signature": ""})
            )
            for piece in thinking.pieces(scenario.chunk_size):
                frames.append(_block_delta(index, {"type": "thinking_delta", "thinking": piece}))
            signature = thinking_signature(thinking.full_text)
            frames.append(_block_delta(index, {"type": "signature_delta", "signature": signature}))
        frames.append(_block_stop(index))
        index += 1
    for number, search in enumerate(scenario.web_searches):
        use, result = anthropic_web_search_blocks(ctx, number, search)
        frames.append(_block_start(index, {**use, "input": {}}))
        for piece in split(json.dumps(use["input"]), scenario.chunk_size):
            frames.append(_block_delta(index, {"type": "input_json_delta", "partial_json": piece}))
        frames.append(_block_stop(index))
        frames.append(_block_start(index + 1, result))
        frames.append(_block_stop(index + 1))
        index += 2
    if scenario.citations:
        texts = [
            (split(segment, scenario.chunk_size), citation)
            for segment, citation in scenario.text_segments()
        ]
    else:
        texts = [(scenario.text_pieces(), None)] if scenario.full_text else []
    for pieces, citation in texts:
        if citation is None:
            frames.append(_block_start(index, {"type": "text", "text": ""}))
        else:
            frames.append(_block_start(index, {"type": "text", "text": "", "citations": []}))
            delta = {"type": "citations_delta", "citation": anthropic_citation(scenario, citation)}
            frames.append(_block_delta(index, delta))
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
        The ``message`` body, with the same content blocks a stream assembles to.

    Raises:
        ValueError: A tool call's arguments are not a JSON object, which a
            non-streamed Anthropic ``tool_use.input`` cannot express.
    """
    content: list[dict[str, Any]] = [anthropic_thinking_block(b) for b in scenario.thinking]
    for number, search in enumerate(scenario.web_searches):
        content.extend(anthropic_web_search_blocks(ctx, number, search))
    for segment, citation in scenario.text_segments():
        if citation is None:
            content.append({"type": "text", "text": segment})
        else:
            citations = [anthropic_citation(scenario, citation)]
            content.append({"type": "text", "text": segment, "citations": citations})
    for number, call in enumerate(scenario.tool_calls):
        content.append(
            {
                "type": "tool_use",
                "id": ctx.tool_call_id("anthropic", number, call),
                "name": call.name,
                "input": _arguments_object(call),
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


def _arguments_object(call: ScriptedToolCall) -> dict[str, Any]:
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
    return arguments


# -- OpenAI Responses -----------------------------------------------------------------

ENCRYPTED_REASONING = "reasoning.encrypted_content"
"""The ``include`` value asking the Responses API for ``encrypted_content`` on reasoning items."""

_INCOMPLETE_REASONS = {
    "length": "max_output_tokens",
    "max_tokens": "max_output_tokens",
    "max_output_tokens": "max_output_tokens",
    "content_filter": "content_filter",
}


def reasoning_item_id(number: int, index: int) -> str:
    """The id of the ``index``-th reasoning item of response ``number``."""
    return f"rs_loopback_{number}_{index}"


def encrypted_reasoning(item_id: str, summary: str) -> str:
    """The ``encrypted_content`` the server issues for a reasoning item."""
    return seal(f"{item_id}\n{summary}")


def responses_output(scenario: Scenario, ctx: ResponseContext) -> list[dict[str, Any]]:
    """The complete ``output`` items of a Responses API answer.

    Reasoning items come first (with ``encrypted_content`` when the request's
    ``include`` lists :data:`ENCRYPTED_REASONING`), then one assistant
    ``message`` with one ``output_text`` part (carrying ``url_citation``
    annotations for scripted citations), then one ``function_call`` per tool call.
    """
    include = (ctx.request or {}).get("include") or []
    output: list[dict[str, Any]] = []
    for index, block in enumerate(scenario.thinking):
        item_id = reasoning_item_id(ctx.number, index)
        summary = "" if block.redacted else block.full_text
        item: dict[str, Any] = {
            "id": item_id,
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": summary}] if summary else [],
        }
        if ENCRYPTED_REASONING in include:
            item["encrypted_content"] = encrypted_reasoning(item_id, block.full_text)
        output.append(item)
    for index, search in enumerate(scenario.web_searches):
        sources = [{"type": "url", "url": url} for url, _ in search.results]
        output.append(
            {
                "id": f"ws_loopback_{ctx.number}_{index}",
                "type": "web_search_call",
                "status": "completed",
                "action": {"type": "search", "query": search.query, "sources": sources},
            }
        )
    if scenario.full_text:
        part = {
            "type": "output_text",
            "annotations": [_url_citation(c) for c in scenario.citations],
            "logprobs": [],
            "text": scenario.full_text,
        }
        output.append(
            {
                "id": f"msg_loopback_{ctx.number}",
                "type": "message",
                "status": "completed",
                "role": "assistant",
                "content": [part],
            }
        )
    for index, call in enumerate(scenario.tool_calls):
        output.append(
            {
                "id": f"fc_loopback_{ctx.number}_{index}",
                "type": "function_call",
                "status": "completed",
                "arguments": call.arguments_json,
                "call_id": ctx.tool_call_id("openai-responses", index, call),
                "name": call.name,
            }
        )
    return output


def responses_usage(scenario: Scenario, usage: TokenUsage) -> dict[str, Any]:
    """The Responses API ``usage`` object."""
    reasoning = sum(len(block.full_text) for block in scenario.thinking) // 4
    return {
        "input_tokens": usage.input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": min(reasoning, usage.output_tokens)},
        "total_tokens": usage.input_tokens + usage.output_tokens,
    }


def responses_object(
    scenario: Scenario,
    ctx: ResponseContext,
    *,
    status: str | None = None,
    output: list[dict[str, Any]] | None = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Render a Responses API ``response`` object.

    Args:
        scenario: What to answer.
        ctx: Per-request values.
        status: ``None`` gives the scenario's final status (``completed``, or
            ``incomplete`` for a ``length``/``max_tokens`` stop reason); pass
            ``in_progress`` or ``failed`` for the other stages.
        output: The output items; ``None`` gives the complete ones.
        error: The ``error`` object of a failed response.

    Returns:
        The ``response`` body; ``usage`` is set only once the response is done.
    """
    request = ctx.request or {}
    reason = _INCOMPLETE_REASONS.get(scenario.stop_reason or "")
    if status is None:
        status = "incomplete" if reason else "completed"
    done = status in ("completed", "incomplete")
    reasoning: Mapping[str, Any] = request.get("reasoning") or {}
    return {
        "id": ctx.response_id,
        "object": "response",
        "created_at": CREATED,
        "status": status,
        "background": bool(request.get("background", False)),
        "error": error,
        "incomplete_details": {"reason": reason} if status == "incomplete" else None,
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "model": ctx.model,
        "output": responses_output(scenario, ctx) if output is None else output,
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "previous_response_id": request.get("previous_response_id"),
        "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
        "store": request.get("store", True),
        "temperature": request.get("temperature", 1.0),
        "text": request.get("text") or {"format": {"type": "text"}},
        "tool_choice": request.get("tool_choice", "auto"),
        "tools": request.get("tools") or [],
        "top_p": request.get("top_p", 1.0),
        "truncation": request.get("truncation", "disabled"),
        "usage": responses_usage(scenario, ctx.usage) if done else None,
        "user": None,
        "metadata": request.get("metadata") or {},
    }


class _Events:
    """Numbers Responses API events: every event carries an increasing ``sequence_number``."""

    def __init__(self) -> None:
        self.frames: list[Frame] = []

    def add(self, event_type: str, terminal: bool = False, **fields: Any) -> None:
        body = {"type": event_type, "sequence_number": len(self.frames), **fields}
        self.frames.append(_event_frame(event_type, body, terminal=terminal))


def responses_frames(scenario: Scenario, ctx: ResponseContext) -> list[Frame]:
    """Render a streamed Responses API answer.

    Args:
        scenario: What to answer.
        ctx: Per-request values.

    Returns:
        The SSE frames: ``response.created``, ``response.in_progress``; per
        output item ``response.output_item.added``, its content events and
        ``response.output_item.done`` (reasoning: ``reasoning_summary_part`` and
        ``reasoning_summary_text`` events; message: ``content_part``,
        ``output_text.delta``, ``output_text.annotation.added`` once a cited
        span has streamed, ``output_text.done``; function call:
        ``function_call_arguments`` events); then the terminal
        ``response.completed`` (or ``response.incomplete``) with ``usage``.
    """
    events = _Events()
    start = responses_object(scenario, ctx, status="in_progress", output=[])
    events.add("response.created", response=start)
    events.add("response.in_progress", response=start)
    items = responses_output(scenario, ctx)
    for output_index, item in enumerate(items):
        where = {"item_id": item["id"], "output_index": output_index}
        if item["type"] == "reasoning":
            events.add(
                "response.output_item.added",
                output_index=output_index,
                item={"id": item["id"], "type": "reasoning", "summary": []},
            )
            block = scenario.thinking[output_index]
            if item["summary"]:
                summary = {**where, "summary_index": 0}
                events.add(
                    "response.reasoning_summary_part.added",
                    **summary,
                    part={"type": "summary_text", "text": ""},
                )
                for piece in block.pieces(scenario.chunk_size):
                    events.add("response.reasoning_summary_text.delta", **summary, delta=piece)
                events.add("response.reasoning_summary_text.done", **summary, text=block.full_text)
                events.add(
                    "response.reasoning_summary_part.done", **summary, part=item["summary"][0]
                )
        elif item["type"] == "web_search_call":
            added = {**item, "status": "in_progress"}
            events.add("response.output_item.added", output_index=output_index, item=added)
            for stage in ("in_progress", "searching", "completed"):
                events.add(f"response.web_search_call.{stage}", **where)
        elif item["type"] == "message":
            events.add(
                "response.output_item.added",
                output_index=output_index,
                item={**item, "status": "in_progress", "content": []},
            )
            part = {**where, "content_index": 0}
            events.add(
                "response.content_part.added",
                **part,
                part={"type": "output_text", "annotations": [], "logprobs": [], "text": ""},
            )
            streamed, pending = 0, list(enumerate(scenario.citations))
            for piece in scenario.text_pieces():
                events.add("response.output_text.delta", **part, delta=piece, logprobs=[])
                streamed += len(piece)
                while pending and pending[0][1].end <= streamed:
                    number, citation = pending.pop(0)
                    events.add(
                        "response.output_text.annotation.added",
                        **part,
                        annotation_index=number,
                        annotation=_url_citation(citation),
                    )
            events.add("response.output_text.done", **part, text=scenario.full_text, logprobs=[])
            events.add("response.content_part.done", **part, part=item["content"][0])
        else:
            events.add(
                "response.output_item.added",
                output_index=output_index,
                item={**item, "status": "in_progress", "arguments": ""},
            )
            call = scenario.tool_calls[output_index - len(items) + len(scenario.tool_calls)]
            for piece in scenario.argument_pieces(call):
                events.add("response.function_call_arguments.delta", **where, delta=piece)
            events.add(
                "response.function_call_arguments.done", **where, arguments=item["arguments"]
            )
        events.add("response.output_item.done", output_index=output_index, item=item)
    final = responses_object(scenario, ctx, output=items)
    terminal = "response.completed" if final["status"] == "completed" else "response.incomplete"
    events.add(terminal, terminal=True, response=final)
    return events.frames


def responses_failed_frame(
    scenario: Scenario, ctx: ResponseContext, *, code: str, message: str, sequence_number: int
) -> Frame:
    """A ``response.failed`` event: the response ends with ``status: failed`` and ``error``."""
    response = responses_object(
        scenario, ctx, status="failed", output=[], error={"code": code, "message": message}
    )
    body = {"type": "response.failed", "sequence_number": sequence_number, "response": response}
    return _event_frame("response.failed", body, terminal=True)


def _url_citation(citation: ScriptedCitation) -> dict[str, Any]:
    return {
        "type": "url_citation",
        "start_index": citation.start,
        "end_index": citation.end,
        "url": citation.url,
        "title": citation.title,
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
