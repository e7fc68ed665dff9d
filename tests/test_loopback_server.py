"""The loopback provider server, driven by the real SDKs and LangChain integrations."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import openai
import pytest
from langchain_anthropic import ChatAnthropic
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessageChunk, HumanMessage
from langchain_openai import ChatOpenAI
from transport_errors import caused_by, raises_cut

from awaken_langchain import RecoveringChatModel
from awaken_langchain.testing import (
    DEFAULT_SHAPE_RULES,
    NO_ASSISTANT_PREFILL,
    Fault,
    LoopbackProvider,
    RecordedRequest,
    Scenario,
    ScriptedToolCall,
    ShapeRule,
    TokenUsage,
    continuation_responder,
    echo_responder,
    periodic_fault,
)
from awaken_langchain.testing import server as loopback_server
from awaken_langchain.testing._wire import Frame
from awaken_langchain.testing.server import plan_stream

REPO_ROOT = Path(__file__).resolve().parent.parent

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
            "required": ["city"],
        },
    },
}
WEATHER_CALL = ScriptedToolCall("get_weather", {"city": "Paris", "unit": "celsius"})
TEXT = "The quick brown fox jumps over the lazy dog."
ANTHROPIC_MODEL = "claude-sonnet-4-6"
OPENAI_MODEL = "gpt-4o-mini"


@pytest.fixture
def server(loopback_provider: LoopbackProvider) -> LoopbackProvider:
    return loopback_provider


def openai_client(server: LoopbackProvider, **kwargs: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url_openai, api_key="x", max_retries=0, **kwargs)


def anthropic_client(server: LoopbackProvider, **kwargs: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=server.base_url_anthropic, api_key="x", max_retries=0, **kwargs
    )


def chat_openai(server: LoopbackProvider, **kwargs: Any) -> ChatOpenAI:
    return ChatOpenAI(
        model=OPENAI_MODEL, base_url=server.base_url_openai, api_key="x", max_retries=0, **kwargs
    )


def chat_anthropic(server: LoopbackProvider, **kwargs: Any) -> ChatAnthropic:
    return ChatAnthropic(
        model=ANTHROPIC_MODEL,
        base_url=server.base_url_anthropic,
        api_key="x",
        max_retries=0,
        **kwargs,
    )


def merge(chunks: list[BaseMessageChunk]) -> AIMessageChunk:
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged = merged + chunk
    assert isinstance(merged, AIMessageChunk)
    return merged


def drain_text(stream: Any, received: list[str]) -> None:
    """Consume a LangChain stream, keeping each chunk's text as it arrives."""
    for chunk in stream:
        received.append(chunk.text)


async def adrain_text(stream: Any, received: list[str]) -> None:
    """Consume a LangChain async stream, keeping each chunk's text as it arrives."""
    async for chunk in stream:
        received.append(chunk.text)


def collect(iterable: Any, into: list[Any]) -> None:
    """Consume ``iterable``, keeping each item as it arrives (even if it then fails)."""
    for item in iterable:
        into.append(item)


def openai_stream(server: LoopbackProvider, **kwargs: Any) -> Any:
    return openai_client(server).chat.completions.create(
        model=OPENAI_MODEL, messages=[{"role": "user", "content": "hi"}], stream=True, **kwargs
    )


def anthropic_stream(server: LoopbackProvider, **kwargs: Any) -> Any:
    return anthropic_client(server).messages.create(
        model=ANTHROPIC_MODEL,
        max_tokens=64,
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        **kwargs,
    )


# -- streaming text and tool calls ----------------------------------------------------


def test_openai_sdk_streams_text_in_chunk_size_pieces(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(text=TEXT, chunk_size=5))
    chunks = list(openai_stream(server))
    deltas = [c.choices[0].delta.content for c in chunks if c.choices]
    deltas = [d for d in deltas if d]
    assert "".join(deltas) == TEXT
    assert max(len(d) for d in deltas) == 5
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_anthropic_sdk_streams_text_events_in_order(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(text=TEXT, chunk_size=7))
    events = list(anthropic_stream(server))
    types = [e.type for e in events]
    assert types[0] == "message_start"
    assert types[-2:] == ["message_delta", "message_stop"]
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    assert text == TEXT
    assert events[-2].delta.stop_reason == "end_turn"


def test_chat_openai_reassembles_fragmented_tool_call_arguments(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(text="Let me check.", tool_calls=[WEATHER_CALL], chunk_size=3))
    model = chat_openai(server).bind_tools([WEATHER_TOOL])
    chunks = list(model.stream("Weather in Paris?"))
    fragments = [tc for c in chunks for tc in getattr(c, "tool_call_chunks", []) if tc["args"]]
    assert len(fragments) > 5
    message = merge(chunks)
    assert message.content == "Let me check."
    assert message.tool_calls == [
        {
            "name": "get_weather",
            "args": {"city": "Paris", "unit": "celsius"},
            "id": "call_1_0",
            "type": "tool_call",
        }
    ]
    assert message.response_metadata["finish_reason"] == "tool_calls"


def test_chat_anthropic_reassembles_fragmented_tool_call_arguments(
    server: LoopbackProvider,
) -> None:
    second = ScriptedToolCall("get_weather", ['{"ci', 'ty": "Ro', 'me"}'], id="toolu_given")
    server.enqueue(Scenario(text="Checking.", tool_calls=[WEATHER_CALL, second], chunk_size=2))
    model = chat_anthropic(server).bind_tools([WEATHER_TOOL])
    message = merge(list(model.stream("Weather in Paris and Rome?")))
    assert [(c["id"], c["args"]) for c in message.tool_calls] == [
        ("toolu_1_0", {"city": "Paris", "unit": "celsius"}),
        ("toolu_given", {"city": "Rome"}),
    ]
    assert message.text == "Checking."
    assert message.response_metadata["stop_reason"] == "tool_use"


async def test_chat_openai_astream_streams_text_and_tool_calls(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(text=TEXT, tool_calls=[WEATHER_CALL]))
    model = chat_openai(server).bind_tools([WEATHER_TOOL])
    chunks = [chunk async for chunk in model.astream("hi")]
    message = merge(chunks)
    assert message.content == TEXT
    assert message.tool_calls[0]["args"] == {"city": "Paris", "unit": "celsius"}


async def test_chat_anthropic_astream_streams_text_and_tool_calls(
    server: LoopbackProvider,
) -> None:
    server.enqueue(Scenario(text=TEXT, tool_calls=[WEATHER_CALL]))
    model = chat_anthropic(server).bind_tools([WEATHER_TOOL])
    message = merge([chunk async for chunk in model.astream("hi")])
    assert message.text == TEXT
    assert message.tool_calls[0]["args"] == {"city": "Paris", "unit": "celsius"}


def test_non_streamed_invoke_returns_text_and_tool_calls(server: LoopbackProvider) -> None:
    server.enqueue(
        Scenario(text="Sure.", tool_calls=[WEATHER_CALL], provider="openai"),
        Scenario(text="Sure.", tool_calls=[WEATHER_CALL], provider="anthropic"),
    )
    for model in (chat_openai(server), chat_anthropic(server)):
        reply = model.bind_tools([WEATHER_TOOL]).invoke("Weather?")
        assert isinstance(reply, AIMessage)
        assert reply.text == "Sure."
        assert reply.tool_calls[0]["args"] == {"city": "Paris", "unit": "celsius"}
    assert [r.stream for r in server.requests] == [False, False]


async def test_async_sdk_clients_stream(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(text=TEXT, provider="openai"), Scenario(text=TEXT))
    oai = openai.AsyncOpenAI(base_url=server.base_url_openai, api_key="x", max_retries=0)
    stream = await oai.chat.completions.create(
        model=OPENAI_MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == TEXT
    ant = anthropic.AsyncAnthropic(base_url=server.base_url_anthropic, api_key="x", max_retries=0)
    async with ant.messages.stream(
        model=ANTHROPIC_MODEL, max_tokens=64, messages=[{"role": "user", "content": "hi"}]
    ) as message_stream:
        final = await message_stream.get_final_message()
    assert final.content[0].type == "text"
    assert final.content[0].text == TEXT


def test_usage_chunk_is_sent_only_when_requested(server: LoopbackProvider) -> None:
    usage = TokenUsage(input_tokens=11, output_tokens=7)
    server.enqueue(Scenario(text="a", usage=usage), Scenario(text="a", usage=usage))
    without = list(openai_stream(server))
    assert all(c.usage is None for c in without)
    with_usage = list(openai_stream(server, stream_options={"include_usage": True}))
    assert with_usage[-1].choices == []
    assert with_usage[-1].usage is not None
    assert (with_usage[-1].usage.prompt_tokens, with_usage[-1].usage.completion_tokens) == (11, 7)


def test_anthropic_usage_reaches_langchain_usage_metadata(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(text="ok", usage=TokenUsage(input_tokens=20, output_tokens=3)))
    message = merge(list(chat_anthropic(server).stream("hi")))
    assert message.usage_metadata is not None
    assert message.usage_metadata["input_tokens"] == 20
    assert message.usage_metadata["output_tokens"] == 3


def test_scripted_stop_reason_reports_truncation(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(text="cut", stop_reason="max_tokens", provider="anthropic"))
    server.enqueue(Scenario(text="cut", stop_reason="length", provider="openai"))
    assert merge(list(chat_anthropic(server).stream("hi"))).response_metadata["stop_reason"] == (
        "max_tokens"
    )
    assert merge(list(chat_openai(server).stream("hi"))).response_metadata["finish_reason"] == (
        "length"
    )


# -- faults ---------------------------------------------------------------------------


def test_drop_after_events_delivers_prefix_then_raises_protocol_error(
    server: LoopbackProvider,
) -> None:
    # message_start, content_block_start, then three 4-character text deltas.
    server.enqueue(Scenario(text=TEXT, fault=Fault.drop_after_events(5)))
    received: list[str] = []
    with raises_cut(httpx2.RemoteProtocolError):
        drain_text(chat_anthropic(server).stream("hi"), received)
    assert "".join(received) == TEXT[:12]


def test_openai_drop_after_events_raises_connection_error(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(text=TEXT, fault=Fault.drop_after_events(3)))
    received: list[str] = []
    with pytest.raises(openai.APIConnectionError) as caught:
        drain_text(chat_openai(server).stream("hi"), received)
    # LangChain's OpenAIConnectionError <- openai.APIConnectionError <- httpx2 protocol error.
    assert isinstance(caught.value.__cause__, openai.APIConnectionError)
    assert isinstance(caught.value.__cause__.__cause__, httpx2.RemoteProtocolError)
    assert "".join(received) == TEXT[:8]


def test_drop_after_bytes_cuts_the_body_mid_event(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(text=TEXT, fault=Fault.drop_after_bytes(10)))
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
    received: list[bytes] = []
    url = server.base_url_openai + "/chat/completions"
    with (
        httpx2.Client() as client,
        client.stream("POST", url, json=body) as response,
        pytest.raises(httpx2.RemoteProtocolError),
    ):
        collect(response.iter_bytes(), received)
    assert b"".join(received) == b'data: {"id'


def test_drop_before_headers_raises_connection_error(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(text=TEXT, fault=Fault.drop_before_headers()))
    with pytest.raises(openai.APIConnectionError):
        list(openai_stream(server))
    server.enqueue(Scenario(text=TEXT, fault=Fault.drop_before_headers()))
    with pytest.raises(anthropic.APIConnectionError):
        list(anthropic_stream(server))
    assert len(server.requests) == 2


def test_reset_drop_raises_read_error(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(text=TEXT, fault=Fault.drop_after_events(3, reset=True)))
    with raises_cut(httpx2.ReadError):
        list(anthropic_stream(server))


def test_rate_limit_carries_retry_after_seconds_and_ms(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(fault=Fault.rate_limited(retry_after=7, retry_after_ms=6500)))
    with pytest.raises(openai.RateLimitError) as caught:
        list(openai_stream(server))
    headers = caught.value.response.headers
    assert (headers["retry-after"], headers["retry-after-ms"]) == ("7", "6500")
    assert caught.value.status_code == 429
    assert caught.value.code == "rate_limit_exceeded"


def test_rate_limit_carries_retry_after_http_date(server: LoopbackProvider) -> None:
    when = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    server.enqueue(Scenario(fault=Fault.rate_limited(retry_after=when)))
    with pytest.raises(anthropic.RateLimitError) as caught:
        list(anthropic_stream(server))
    assert parsedate_to_datetime(caught.value.response.headers["retry-after"]) == when
    assert caught.value.body == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": caught.value.body["error"]["message"]},
        "request_id": "req_loopback_1",
    }


def test_langchain_wraps_rate_limit_with_retry_hint(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(fault=Fault.rate_limited(retry_after=2)))
    with pytest.raises(anthropic.RateLimitError) as caught:
        list(chat_anthropic(server).stream("hi"))
    assert caught.value.response.headers["retry-after"] == "2"


def test_anthropic_529_is_overloaded_error(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(fault=Fault.overloaded()))
    with pytest.raises(anthropic.OverloadedError) as caught:
        list(anthropic_stream(server))
    assert caught.value.status_code == 529
    assert caught.value.body["error"]["type"] == "overloaded_error"


OPENAI_ERRORS: dict[int, tuple[type[openai.APIStatusError], str]] = {
    400: (openai.BadRequestError, "invalid_request_error"),
    401: (openai.AuthenticationError, "invalid_request_error"),
    403: (openai.PermissionDeniedError, "invalid_request_error"),
    404: (openai.NotFoundError, "invalid_request_error"),
    413: (openai.APIStatusError, "invalid_request_error"),
    500: (openai.InternalServerError, "server_error"),
    502: (openai.InternalServerError, "server_error"),
    503: (openai.InternalServerError, "server_error"),
    529: (openai.InternalServerError, "server_error"),
}
ANTHROPIC_ERRORS: dict[int, tuple[type[anthropic.APIStatusError], str]] = {
    400: (anthropic.BadRequestError, "invalid_request_error"),
    401: (anthropic.AuthenticationError, "authentication_error"),
    403: (anthropic.PermissionDeniedError, "permission_error"),
    404: (anthropic.NotFoundError, "not_found_error"),
    413: (anthropic.APIStatusError, "request_too_large"),
    500: (anthropic.InternalServerError, "api_error"),
    502: (anthropic.InternalServerError, "api_error"),
    503: (anthropic.InternalServerError, "api_error"),
    529: (anthropic.OverloadedError, "overloaded_error"),
}


@pytest.mark.parametrize("status", sorted(OPENAI_ERRORS))
def test_http_error_statuses_surface_as_sdk_errors(server: LoopbackProvider, status: int) -> None:
    openai_error, openai_type = OPENAI_ERRORS[status]
    anthropic_error, anthropic_type = ANTHROPIC_ERRORS[status]
    server.enqueue(Scenario(fault=Fault.http_error(status)))
    with pytest.raises(openai_error) as from_openai:
        list(openai_stream(server))
    assert from_openai.value.status_code == status
    assert from_openai.value.type == openai_type
    server.enqueue(Scenario(fault=Fault.http_error(status)))
    with pytest.raises(anthropic_error) as from_anthropic:
        list(anthropic_stream(server))
    assert from_anthropic.value.status_code == status
    assert from_anthropic.value.body["error"]["type"] == anthropic_type


def test_context_overflow_is_a_provider_style_bad_request(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(fault=Fault.context_overflow()))
    with pytest.raises(openai.BadRequestError) as from_openai:
        chat_openai(server).invoke("hi")
    assert from_openai.value.code == "context_length_exceeded"
    server.enqueue(Scenario(fault=Fault.context_overflow()))
    with pytest.raises(anthropic.BadRequestError) as from_anthropic:
        chat_anthropic(server).invoke("hi")
    assert "prompt is too long" in from_anthropic.value.body["error"]["message"]


def test_anthropic_error_event_raises_status_error_with_status_200(
    server: LoopbackProvider,
) -> None:
    server.enqueue(Scenario(text=TEXT, fault=Fault.error_event(after_events=4)))
    received: list[str] = []
    with pytest.raises(anthropic.APIStatusError) as caught:
        drain_text(chat_anthropic(server).stream("hi"), received)
    assert caught.value.status_code == 200
    assert caught.value.body["error"]["type"] == "overloaded_error"
    assert "".join(received) == TEXT[:8]


def test_openai_error_event_raises_api_error_with_type(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(text=TEXT, fault=Fault.error_event(after_events=2)))
    with pytest.raises(openai.APIError) as caught:
        list(openai_stream(server))
    assert not isinstance(caught.value, openai.APIStatusError)
    assert caught.value.type == "server_error"


def test_no_terminal_event_ends_quietly_without_finish_reason(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(text=TEXT, fault=Fault.no_terminal_event(), provider="openai"))
    server.enqueue(Scenario(text=TEXT, fault=Fault.no_terminal_event(), provider="anthropic"))
    from_openai = merge(list(chat_openai(server).stream("hi")))
    assert from_openai.content == TEXT
    assert "finish_reason" not in from_openai.response_metadata
    from_anthropic = merge(list(chat_anthropic(server).stream("hi")))
    assert from_anthropic.text == TEXT
    assert "stop_reason" not in from_anthropic.response_metadata


def test_no_terminal_event_after_n_events_truncates_cleanly(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(text=TEXT, fault=Fault.no_terminal_event(after_events=3)))
    events = list(anthropic_stream(server))
    assert [e.type for e in events] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
    ]


def test_stall_longer_than_read_timeout_raises_timeout(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(text=TEXT, fault=Fault.stall(5, after_events=2)))
    with pytest.raises(openai.APITimeoutError):
        list(chat_openai(server, timeout=0.2).stream("hi"))


def test_short_stall_then_stream_completes(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(text=TEXT, fault=Fault.stall(0.05, after_events=2)))
    assert merge(list(chat_anthropic(server).stream("hi"))).text == TEXT


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_keepalive_stall_outlasts_read_timeout_without_new_chunks(
    server: LoopbackProvider, provider: str
) -> None:
    # Margins are wide so a loaded machine cannot turn a late keep-alive into a timeout.
    stall = Fault.stall(0.8, after_events=3, keepalive=0.05)
    server.enqueue(Scenario(text=TEXT, fault=stall))
    model = (
        chat_openai(server, timeout=0.4)
        if provider == "openai"
        else chat_anthropic(server, default_request_timeout=0.4)
    )
    gaps: list[float] = []
    last = time.monotonic()
    chunks = []
    for chunk in model.stream("hi"):
        now = time.monotonic()
        gaps.append(now - last)
        last = now
        chunks.append(chunk)
    assert merge(chunks).text == TEXT
    assert max(gaps) >= 0.7


def test_stop_ends_a_stall_promptly() -> None:
    server = LoopbackProvider([Scenario(text=TEXT, fault=Fault.stall(60, after_events=1))])
    server.start()
    client = httpx2.Client()
    with client.stream(
        "POST",
        server.base_url_anthropic + "/v1/messages",
        json={"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
        | {"stream": True},
    ) as response:
        assert response.status_code == 200
        started = time.monotonic()
        server.stop()
        with pytest.raises(httpx2.RemoteProtocolError):
            list(response.iter_bytes())
    assert time.monotonic() - started < 2


def test_malformed_sse_raises_json_decode_error(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(text=TEXT, fault=Fault.malformed_sse(after_events=2)))
    with pytest.raises(json.JSONDecodeError):
        list(anthropic_stream(server))
    server.enqueue(Scenario(text=TEXT, fault=Fault.malformed_sse(after_events=2)))
    with pytest.raises(json.JSONDecodeError):
        list(openai_stream(server))


def test_fault_headers_and_scenario_headers_are_sent(server: LoopbackProvider) -> None:
    server.enqueue(
        Scenario(
            headers={"x-scenario": "1"},
            fault=Fault.server_error(503, headers={"x-should-retry": "false"}),
        )
    )
    with pytest.raises(openai.InternalServerError) as caught:
        list(openai_stream(server))
    headers = caught.value.response.headers
    assert (headers["x-scenario"], headers["x-should-retry"]) == ("1", "false")
    assert headers["x-request-id"] == "req_loopback_1"


# -- scenario selection and recording -------------------------------------------------


def test_requests_are_recorded_with_body_headers_and_answering_scenario(
    server: LoopbackProvider,
) -> None:
    first = Scenario(text="one", name="first")
    second = Scenario(text="two", name="second", provider="anthropic")
    server.script([second, first])
    assert chat_openai(server).invoke("hello openai").text == "one"
    assert chat_anthropic(server).invoke("hello anthropic").text == "two"
    openai_requests = server.requests_for("openai")
    anthropic_requests = server.requests_for("anthropic")
    assert [r.scenario for r in openai_requests] == [first]
    assert [r.scenario for r in anthropic_requests] == [second]
    assert openai_requests[0].messages == [{"role": "user", "content": "hello openai"}]
    assert openai_requests[0].headers["authorization"] == "Bearer x"
    assert "anthropic-version" in anthropic_requests[0].headers
    assert anthropic_requests[0].body["model"] == ANTHROPIC_MODEL
    assert [r.number for r in server.requests] == [1, 2]
    assert server.pending == ()


def test_each_retry_is_recorded_as_its_own_request(server: LoopbackProvider) -> None:
    client = openai.OpenAI(base_url=server.base_url_openai, api_key="x", max_retries=1)
    # The SDK's own retry waits about half a second; retry-after-ms makes it immediate.
    server.script(
        [
            Scenario(fault=Fault.server_error(503, headers={"retry-after-ms": "1"})),
            Scenario(text="after retry"),
        ]
    )
    reply = client.chat.completions.create(
        model=OPENAI_MODEL, messages=[{"role": "user", "content": "hi"}]
    )
    assert reply.choices[0].message.content == "after retry"
    assert [r.scenario.fault is not None for r in server.requests if r.scenario] == [True, False]
    assert [r.headers["x-stainless-retry-count"] for r in server.requests] == ["0", "1"]
    assert 0 <= server.requests[1].received_at - server.requests[0].received_at < 5


def test_empty_queue_answers_with_default_scenario(server: LoopbackProvider) -> None:
    assert chat_openai(server).invoke("hi").text == "This is the loopback provider answering."
    server.default = Scenario(text="fixed")
    assert chat_anthropic(server).invoke("hi").text == "fixed"


def test_echo_responder_answers_with_last_user_message() -> None:
    with LoopbackProvider(default=echo_responder()) as server:
        message = merge(list(chat_anthropic(server).stream([HumanMessage("ping pong")])))
    assert message.text == "You said: ping pong"


def continuation_request(prefix: str) -> list[dict[str, Any]]:
    return [
        user("Tell me a sentence."),
        {"role": "assistant", "content": prefix},
        user("Continue exactly where you stopped."),
    ]


def test_continuation_responder_answers_the_rest_of_the_text() -> None:
    responder = continuation_responder(Scenario(text=TEXT, chunk_size=3), overlap_words=2)
    with LoopbackProvider(default=responder) as server:
        client = anthropic_client(server)
        first = client.messages.create(**anthropic_body([user("Tell me a sentence.")]))
        rest = client.messages.create(**anthropic_body(continuation_request(TEXT[:19])))
        next_turn = client.messages.create(
            **anthropic_body([*continuation_request(TEXT)[:2], user("Again?")])
        )
    assert [first.content[0].text, rest.content[0].text, next_turn.content[0].text] == [
        TEXT,
        TEXT[10:],  # from "brown": the prefix's last two words, then the rest
        TEXT,
    ]
    with pytest.raises(ValueError, match="overlap_words >= 0"):
        continuation_responder(Scenario(text=TEXT), overlap_words=-1)


def test_recovering_model_continues_a_dropped_stream_from_the_loopback(
    server: LoopbackProvider,
) -> None:
    server.enqueue(Scenario(text=TEXT, fault=Fault.drop_after_events(6)))
    server.default = continuation_responder(Scenario(text=TEXT), overlap_words=2)
    model = RecoveringChatModel(model=chat_anthropic(server))
    chunks = list(model.stream("Tell me a sentence."))
    assert "".join(chunk.text for chunk in chunks) == TEXT
    first, continuation = server.requests
    assert first.scenario is not None
    assert first.scenario.fault is not None
    assert continuation.rejected_by is None
    assert continuation.messages[-2] == {"role": "assistant", "content": TEXT[:16].rstrip()}
    assert continuation.messages[-1]["role"] == "user"


def test_responder_sees_the_request(server: LoopbackProvider) -> None:
    seen: list[RecordedRequest] = []

    def respond(request: RecordedRequest) -> Scenario:
        seen.append(request)
        return Scenario(text=f"request {request.number}")

    server.default = respond
    assert chat_openai(server).invoke("hi").text == "request 1"
    assert seen[0].path == "/v1/chat/completions"


def test_unknown_path_is_404_and_consumes_no_scenario(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(text="kept"))
    response = httpx2.post(server.url + "/v1/embeddings", json={"input": "x"})
    assert response.status_code == 404
    assert response.json()["error"]["message"].startswith("Unknown request URL")
    assert server.pending == (Scenario(text="kept"),)
    assert server.requests[0].provider is None


def test_delay_paces_events(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(text="abcdef", chunk_size=2, delay=0.02))
    started = time.monotonic()
    assert merge(list(chat_openai(server).stream("hi"))).text == "abcdef"
    assert time.monotonic() - started >= 0.02 * 4


def test_scenario_rejects_invalid_settings() -> None:
    with pytest.raises(ValueError, match="chunk_size"):
        Scenario(chunk_size=0)
    with pytest.raises(ValueError, match="4xx/5xx"):
        Fault.http_error(200)
    with pytest.raises(ValueError, match="JSON-serialisable"):
        ScriptedToolCall("f", {"when": object()})
    with pytest.raises(ValueError, match="timezone-aware"):
        Fault.rate_limited(retry_after=datetime(2030, 1, 1))


# -- request shape checks -------------------------------------------------------------


def anthropic_body(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": ANTHROPIC_MODEL, "max_tokens": 16, "messages": messages}


def test_anthropic_rejects_final_assistant_message_ending_in_whitespace(
    server: LoopbackProvider,
) -> None:
    server.enqueue(Scenario(text="kept"))
    with pytest.raises(anthropic.BadRequestError) as caught:
        anthropic_client(server).messages.create(
            **anthropic_body(
                [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello "}]
            )
        )
    assert "trailing whitespace" in caught.value.body["error"]["message"]
    assert server.requests[0].rejected_by == "anthropic.final_assistant_no_trailing_whitespace"
    assert server.pending == (Scenario(text="kept"),)


def test_anthropic_accepts_final_assistant_message_without_whitespace(
    server: LoopbackProvider,
) -> None:
    reply = anthropic_client(server).messages.create(
        **anthropic_body(
            [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello"}]
        )
    )
    assert reply.stop_reason == "end_turn"


def test_anthropic_rejects_tool_use_without_tool_result(server: LoopbackProvider) -> None:
    use = {"type": "tool_use", "id": "toolu_a", "name": "get_weather", "input": {}}
    with pytest.raises(anthropic.BadRequestError) as caught:
        anthropic_client(server).messages.create(
            **anthropic_body(
                [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": [use]},
                    {"role": "user", "content": "and?"},
                ]
            )
        )
    assert "toolu_a" in caught.value.body["error"]["message"]
    answered = {"type": "tool_result", "tool_use_id": "toolu_a", "content": "sunny"}
    reply = anthropic_client(server).messages.create(
        **anthropic_body(
            [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [use]},
                {"role": "user", "content": [answered]},
            ]
        )
    )
    assert reply.content[0].type == "text"


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


BAD_ANTHROPIC_MESSAGES = {
    "anthropic.messages_present": [],
    "anthropic.alternating_roles": [user("a"), user("b")],
    "anthropic.non_empty_content": [user("")],
    "anthropic.tool_use_answered": [
        user([{"type": "tool_result", "tool_use_id": "toolu_x", "content": "x"}])
    ],
}


@pytest.mark.parametrize(
    ("rule", "messages"),
    [
        *BAD_ANTHROPIC_MESSAGES.items(),
        ("anthropic.non_empty_content", [user([{"type": "text", "text": " "}])]),
    ],
)
def test_anthropic_shape_rules_reject_bad_messages(
    server: LoopbackProvider, rule: str, messages: list[dict[str, Any]]
) -> None:
    response = httpx2.post(server.url + "/v1/messages", json=anthropic_body(messages))
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert server.requests[0].rejected_by == rule


def test_openai_rejects_unanswered_tool_call(server: LoopbackProvider) -> None:
    call = {"id": "call_a", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages: list[Any] = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "user", "content": "well?"},
    ]
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client(server).chat.completions.create(model=OPENAI_MODEL, messages=messages)
    assert "call_a" in str(caught.value.message)
    assert server.requests[0].rejected_by == "openai.tool_calls_answered"
    messages[2] = {"role": "tool", "tool_call_id": "call_a", "content": "done"}
    reply = openai_client(server).chat.completions.create(model=OPENAI_MODEL, messages=messages)
    assert reply.choices[0].finish_reason == "stop"


def test_openai_rejects_tool_message_without_preceding_call(server: LoopbackProvider) -> None:
    with pytest.raises(openai.BadRequestError):
        openai_client(server).chat.completions.create(
            model=OPENAI_MODEL,
            messages=[
                {"role": "user", "content": "hi"},
                {"role": "tool", "tool_call_id": "call_x", "content": "done"},
            ],
        )
    assert server.requests[0].rejected_by == "openai.tool_message_follows_call"


def test_openai_rejects_assistant_message_without_content_or_tool_calls(
    server: LoopbackProvider,
) -> None:
    with pytest.raises(openai.BadRequestError, match="got null"):
        openai_client(server).chat.completions.create(
            model=OPENAI_MODEL,
            messages=[
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": None},
                {"role": "user", "content": "go on"},
            ],
        )
    assert server.requests[0].rejected_by == "openai.assistant_has_content"


def test_default_shape_rules_are_documented_and_uniquely_named() -> None:
    names = [rule.name for rule in DEFAULT_SHAPE_RULES]
    assert len(names) == len(set(names))
    for rule in DEFAULT_SHAPE_RULES:
        assert rule.name.startswith(rule.provider + ".")
        assert rule.description.endswith(".")


def test_shape_rules_can_be_disabled_and_extended() -> None:
    prefill = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hi "}]
    with LoopbackProvider(shape_rules=()) as lenient:
        reply = anthropic_client(lenient).messages.create(**anthropic_body(prefill))
        assert reply.stop_reason == "end_turn"
    with LoopbackProvider(shape_rules=[NO_ASSISTANT_PREFILL]) as strict:
        with pytest.raises(anthropic.BadRequestError, match="prefill"):
            anthropic_client(strict).messages.create(**anthropic_body(prefill))
        assert strict.requests[0].rejected_by == "anthropic.no_assistant_prefill"


# -- lifecycle and standalone use -----------------------------------------------------


def test_context_manager_binds_a_free_loopback_port() -> None:
    with LoopbackProvider() as first, LoopbackProvider() as second:
        assert first.port != second.port
        assert first.url == f"http://127.0.0.1:{first.port}"
        assert first.base_url_openai == first.url + "/v1"
        assert first.running
    assert not first.running
    with pytest.raises(RuntimeError, match="not running"):
        _ = first.url


def test_server_can_restart_after_stop() -> None:
    server = LoopbackProvider()
    with server:
        assert chat_openai(server).invoke("a").text
    with server:
        assert chat_openai(server).invoke("b").text
    assert len(server.requests) == 2


def test_standalone_module_serves_until_terminated() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-m", "awaken_langchain.testing.server", "--port", "0", "--echo"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("loopback provider listening:")
        fields = dict(part.split("=", 1) for part in line.split()[3:])
        client = openai.OpenAI(base_url=fields["openai"], api_key="x", max_retries=0)
        reply = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "standalone"}]
        )
        assert reply.choices[0].message.content == "You said: standalone"
    finally:
        process.terminate()
        _, errors = process.communicate(timeout=10)
    assert process.returncode == 0
    assert "Warning" not in errors


async def test_async_clients_observe_mid_stream_faults(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(text=TEXT, fault=Fault.drop_after_events(4)))
    received: list[str] = []
    with raises_cut(httpx2.RemoteProtocolError):
        await adrain_text(chat_anthropic(server).astream("hi"), received)
    assert "".join(received) == TEXT[:8]
    server.enqueue(Scenario(text=TEXT, fault=Fault.error_event(after_events=3)))
    with pytest.raises(anthropic.APIStatusError) as caught:
        await adrain_text(chat_anthropic(server).astream("hi"), [])
    assert caught.value.status_code == 200
    server.enqueue(Scenario(fault=Fault.rate_limited(retry_after_ms=250)))
    with pytest.raises(openai.RateLimitError) as limited:
        await adrain_text(chat_openai(server).astream("hi"), [])
    assert limited.value.response.headers["retry-after-ms"] == "250"


# -- non-streamed requests under faults -----------------------------------------------


def test_non_streamed_drop_mid_body_raises_connection_error(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(text=TEXT, fault=Fault.drop_after_events(1), provider="openai"))
    with pytest.raises(openai.APIConnectionError):
        chat_openai(server).invoke("hi")
    server.enqueue(Scenario(text=TEXT, fault=Fault.drop_after_bytes(20), provider="anthropic"))
    with pytest.raises(anthropic.APIConnectionError):
        chat_anthropic(server).invoke("hi")


def test_non_streamed_no_terminal_event_has_no_finish_reason(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(text=TEXT, fault=Fault.no_terminal_event()))
    reply = openai_client(server).chat.completions.create(
        model=OPENAI_MODEL, messages=[{"role": "user", "content": "hi"}]
    )
    assert reply.choices[0].message.content == TEXT
    assert reply.choices[0].finish_reason is None
    server.enqueue(Scenario(text=TEXT, fault=Fault.no_terminal_event()))
    message = anthropic_client(server).messages.create(**anthropic_body([user("hi")]))
    assert message.stop_reason is None


def test_non_streamed_error_event_becomes_the_matching_http_status(
    server: LoopbackProvider,
) -> None:
    server.enqueue(Scenario(text=TEXT, fault=Fault.error_event()))
    with pytest.raises(anthropic.OverloadedError):
        chat_anthropic(server).invoke("hi")
    server.enqueue(Scenario(text=TEXT, fault=Fault.error_event()))
    with pytest.raises(openai.InternalServerError) as caught:
        chat_openai(server).invoke("hi")
    assert caught.value.type == "server_error"


def test_non_streamed_malformed_body_fails_to_decode(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(text=TEXT, fault=Fault.malformed_sse()))
    with pytest.raises(json.JSONDecodeError):
        openai_client(server).chat.completions.create(
            model=OPENAI_MODEL, messages=[{"role": "user", "content": "hi"}]
        )


def test_non_streamed_anthropic_tool_call_needs_json_object_arguments(
    server: LoopbackProvider,
) -> None:
    server.enqueue(Scenario(tool_calls=[ScriptedToolCall("f", '{"cut": ')]))
    with pytest.raises(anthropic.InternalServerError, match="not a JSON object"):
        anthropic_client(server).messages.create(**anthropic_body([user("hi")]))


def test_streamed_invalid_tool_arguments_are_sent_verbatim(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(tool_calls=[ScriptedToolCall("get_weather", '{"city": "Par')]))
    message = merge(list(chat_openai(server).bind_tools([WEATHER_TOOL]).stream("hi")))
    assert message.tool_call_chunks[0]["args"] == '{"city": "Par'


# -- responders, concurrency, lifecycle -----------------------------------------------


def test_failing_responder_answers_500_naming_the_error(server: LoopbackProvider) -> None:
    def broken(request: RecordedRequest) -> Scenario:
        raise LookupError("no script for this prompt")

    server.default = broken
    with pytest.raises(openai.InternalServerError, match="no script for this prompt"):
        chat_openai(server).invoke("hi")


def test_responder_returning_no_scenario_answers_500_naming_the_value(
    server: LoopbackProvider,
) -> None:
    server.default = lambda request: None  # type: ignore[assignment,return-value]
    with pytest.raises(openai.InternalServerError, match="must return a Scenario"):
        chat_openai(server).invoke("hi")


def test_failing_shape_rule_answers_500_and_is_reported_in_errors() -> None:
    def crash(body: Any) -> str | None:
        raise RuntimeError("rule bug")

    rule = ShapeRule("openai.crash", "openai", "Always crashes.", crash)
    with (
        LoopbackProvider(shape_rules=[rule]) as server,
        pytest.raises(openai.InternalServerError, match="rule bug"),
    ):
        chat_openai(server).invoke("hi")
    assert [repr(error) for error in server.errors] == ["RuntimeError('rule bug')"]


def test_periodic_fault_breaks_every_nth_default_answer() -> None:
    responder = periodic_fault(Scenario(text=TEXT), Fault.drop_after_events(2), every=2)
    with LoopbackProvider(default=responder) as server:
        outcomes = []
        for _ in range(4):
            try:
                outcomes.append(merge(list(chat_anthropic(server).stream("hi"))).text)
            except Exception as error:
                cut = caused_by(error, httpx2.RemoteProtocolError)
                outcomes.append("dropped" if cut else repr(error))
    assert outcomes == [TEXT, "dropped", TEXT, "dropped"]
    with pytest.raises(ValueError, match="every >= 1"):
        periodic_fault(Scenario(), Fault.overloaded(), every=0)


async def test_concurrent_streams_are_each_answered_by_their_own_scenario(
    server: LoopbackProvider,
) -> None:
    server.script([Scenario(text=f"answer {i}", delay=0.01) for i in range(6)])
    model = chat_openai(server)

    async def ask(i: int) -> str:
        return merge([chunk async for chunk in model.astream(f"question {i}")]).text

    answers = await asyncio.gather(*(ask(i) for i in range(6)))
    assert sorted(answers) == sorted(f"answer {i}" for i in range(6))
    assert len(server.requests) == 6
    assert server.pending == ()


def test_start_twice_is_refused_and_stop_is_idempotent() -> None:
    server = LoopbackProvider().start()
    try:
        with pytest.raises(RuntimeError, match="already running"):
            server.start()
    finally:
        server.stop()
    server.stop()
    assert not server.running


def test_standalone_module_injects_faults_periodically() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    command = [sys.executable, "-m", "awaken_langchain.testing.server", "--text", TEXT]
    command += ["--fault", "drop", "--fault-every", "2", "--fault-after-events", "3"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert process.stdout is not None
        fields = dict(part.split("=", 1) for part in process.stdout.readline().split()[3:])
        model = ChatAnthropic(
            model=ANTHROPIC_MODEL, base_url=fields["anthropic"], api_key="x", max_retries=0
        )
        assert merge(list(model.stream("hi"))).text == TEXT
        with raises_cut(httpx2.RemoteProtocolError):
            list(model.stream("hi"))
    finally:
        process.terminate()
        assert process.wait(timeout=10) == 0


# -- the wire plan, without I/O -------------------------------------------------------

FRAMES = [Frame(b"a"), Frame(b"bb"), Frame(b"ccc"), Frame(b"T1", True), Frame(b"T2", True)]


def writes(steps: list[Any]) -> list[bytes]:
    return [step.data for step in steps if hasattr(step, "data")]


def test_plan_without_fault_sends_every_frame_with_delays_between() -> None:
    steps = plan_stream(FRAMES, None, delay=0.5)
    assert writes(steps) == [b"a", b"bb", b"ccc", b"T1", b"T2"]
    assert sum(1 for step in steps if getattr(step, "seconds", None) == 0.5) == 4
    assert not any(hasattr(step, "reset") for step in steps)


def test_plan_drop_after_bytes_cuts_inside_a_frame() -> None:
    steps = plan_stream(FRAMES, Fault.drop_after_bytes(4))
    assert writes(steps) == [b"a", b"bb", b"c"]
    assert getattr(steps[-1], "reset", None) is False


def test_plan_no_terminal_event_keeps_content_frames_only() -> None:
    assert writes(plan_stream(FRAMES, Fault.no_terminal_event())) == [b"a", b"bb", b"ccc"]
    assert writes(plan_stream(FRAMES, Fault.no_terminal_event(after_events=1))) == [b"a"]


def test_plan_stall_pauses_after_the_given_event() -> None:
    steps = plan_stream(FRAMES, Fault.stall(9, after_events=2))
    assert [getattr(s, "data", getattr(s, "seconds", None)) for s in steps[:4]] == [
        b"a",
        b"bb",
        9,
        b"ccc",
    ]


def test_plan_stall_with_keepalive_interleaves_keepalive_writes() -> None:
    stall = Fault.stall(0.25, after_events=1, keepalive=0.1)
    steps = plan_stream(FRAMES[:2], stall, keepalive=Frame(b"K"))
    assert [getattr(s, "data", getattr(s, "seconds", None)) for s in steps] == [
        b"a",
        0.1,
        b"K",
        0.1,
        b"K",
        pytest.approx(0.05),
        b"bb",
    ]


def test_plan_error_event_replaces_the_rest_of_the_stream() -> None:
    steps = plan_stream(FRAMES, Fault.error_event(after_events=1), extra=Frame(b"ERR"))
    assert writes(steps) == [b"a", b"ERR"]


def test_server_public_names_are_exported_from_testing() -> None:
    import awaken_langchain.testing as testing
    import awaken_langchain.testing.server as module

    assert sorted(module.__all__) == [
        "BackgroundResponse",
        "DEFAULT_SHAPE_RULES",
        "Fault",
        "FaultKind",
        "LoopbackProvider",
        "NO_ASSISTANT_PREFILL",
        "Provider",
        "RecordedRequest",
        "Responder",
        "Scenario",
        "ScriptedCitation",
        "ScriptedThinking",
        "ScriptedToolCall",
        "ScriptedWebSearch",
        "ShapeRule",
        "TokenUsage",
        "continuation_responder",
        "echo_responder",
        "periodic_fault",
        "schema_responder",
    ]
    for name in module.__all__:
        assert name in testing.__all__
        assert getattr(testing, name) is getattr(module, name)


def test_testing_package_imports_server_names_in_a_fresh_process() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    source = (
        "from awaken_langchain.testing import LoopbackProvider, ScriptedChatModel\n"
        "import awaken_langchain.testing as testing\n"
        "assert testing.Scenario is not None\n"
        "try:\n"
        "    testing.NoSuchName\n"
        "except AttributeError as error:\n"
        "    print(error)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", source], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "has no attribute 'NoSuchName'" in done.stdout


def test_module_docstring_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    import awaken_langchain.testing.server as module

    doc = module.__doc__
    assert doc is not None
    block = doc.split("at it::\n", 1)[1].split("\n\nThis prints", 1)[0]
    exec(textwrap.dedent(block), {})
    assert capsys.readouterr().out == "Hell <connection dropped>\n"


def test_docs_testing_example_runs() -> None:
    page = (REPO_ROOT / "docs" / "testing.md").read_text()
    section = page.split("## The loopback provider", 1)[1]
    block = section.split("```python\n", 1)[1].split("```", 1)[0]
    exec(block, {})


def test_servers_in_one_process_never_share_a_port_so_clients_kept_per_url_stay_valid() -> None:
    provider = LoopbackProvider()
    ports = []
    for _ in range(1000):  # the kernel reuses ephemeral ports well within this many binds
        server = loopback_server._bind("127.0.0.1", 0, provider)
        ports.append(server.server_address[1])
        server.server_close()
    assert len(set(ports)) == len(ports)
