"""The OpenAI Responses API wire of the loopback provider, through the openai SDK and ChatOpenAI."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx2
import openai
import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, ToolMessage
from langchain_openai import ChatOpenAI

from awaken_langchain.testing import (
    Fault,
    LoopbackProvider,
    Scenario,
    ScriptedCitation,
    ScriptedThinking,
    ScriptedToolCall,
    ScriptedWebSearch,
    continuation_responder,
    echo_responder,
)
from awaken_langchain.testing._wire import unseal

MODEL = "gpt-5-mini"
TEXT = "Paris is the capital of France."
REASONING = "The user asks about France; the capital is Paris."
CITATION = ScriptedCitation(0, 5, "https://example.com/paris", "Paris")
CALL = ScriptedToolCall("get_weather", {"city": "Paris"})
SCRIPTED = Scenario(
    text=TEXT,
    thinking=[ScriptedThinking(REASONING)],
    citations=[CITATION],
    tool_calls=[CALL],
    chunk_size=6,
)
ENCRYPTED = ["reasoning.encrypted_content"]
URL_CITATION = {
    "type": "url_citation",
    "start_index": 0,
    "end_index": 5,
    "url": "https://example.com/paris",
    "title": "Paris",
}


@pytest.fixture
def server(loopback_provider: LoopbackProvider) -> LoopbackProvider:
    return loopback_provider


def client(server: LoopbackProvider, **kwargs: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url_openai, api_key="x", max_retries=0, **kwargs)


def chat(server: LoopbackProvider, **kwargs: Any) -> ChatOpenAI:
    return ChatOpenAI(
        model=MODEL,
        base_url=server.base_url_openai,
        api_key="x",
        max_retries=0,
        use_responses_api=True,
        **kwargs,
    )


def create(server: LoopbackProvider, **kwargs: Any) -> Any:
    return client(server).responses.create(model=MODEL, input="What is the capital?", **kwargs)


def merge(chunks: list[Any]) -> AIMessageChunk:
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged = merged + chunk
    assert isinstance(merged, AIMessageChunk)
    return merged


def collect(iterable: Any, into: list[Any]) -> None:
    for item in iterable:
        into.append(item)


def assert_scripted_output(output: list[Any], *, encrypted: bool) -> None:
    """The parsed output items are exactly what ``SCRIPTED`` scripts."""
    reasoning, message, call = output
    assert reasoning.type == "reasoning"
    assert [(s.type, s.text) for s in reasoning.summary] == [("summary_text", REASONING)]
    if encrypted:
        assert unseal(reasoning.encrypted_content) == f"{reasoning.id}\n{REASONING}"
    else:
        assert reasoning.encrypted_content is None
    assert message.type == "message"
    assert message.role == "assistant"
    (part,) = message.content
    assert part.type == "output_text"
    assert part.text == TEXT
    assert [a.model_dump() for a in part.annotations] == [URL_CITATION]
    assert call.type == "function_call"
    assert call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"}


# -- the uncut answer -------------------------------------------------------------------


def test_sdk_non_streamed_response_holds_the_scripted_items(server: LoopbackProvider) -> None:
    server.enqueue(SCRIPTED)
    response = create(server, include=ENCRYPTED)
    assert response.object == "response"
    assert response.status == "completed"
    assert_scripted_output(response.output, encrypted=True)
    assert response.output_text == TEXT
    assert response.usage is not None
    assert response.usage.total_tokens > 0


def test_encrypted_reasoning_is_sent_only_when_included(server: LoopbackProvider) -> None:
    server.enqueue(SCRIPTED)
    assert_scripted_output(create(server).output, encrypted=False)


def test_sdk_stream_assembles_to_the_scripted_items(server: LoopbackProvider) -> None:
    server.enqueue(SCRIPTED)
    with client(server).responses.stream(
        model=MODEL, input="What is the capital?", include=ENCRYPTED
    ) as stream:
        final = stream.get_final_response()
    assert final.status == "completed"
    assert_scripted_output(final.output, encrypted=True)


def test_stream_events_are_typed_numbered_and_end_with_completed(
    server: LoopbackProvider,
) -> None:
    server.enqueue(SCRIPTED)
    events = list(create(server, stream=True, include=ENCRYPTED))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert all(type(e).__name__.startswith("Response") for e in events)
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert events[-1].response.usage.output_tokens > 0
    reasoning_events = kinds[kinds.index("response.output_item.added") :]
    assert reasoning_events[:2] == [
        "response.output_item.added",
        "response.reasoning_summary_part.added",
    ]
    for expected in (
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.annotation.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ):
        assert expected in kinds
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == TEXT
    assert len(deltas) == 6
    # The annotation arrives once its cited span has streamed, before the text is done.
    annotation = kinds.index("response.output_text.annotation.added")
    assert kinds[annotation - 1] == "response.output_text.delta"
    assert annotation < kinds.index("response.output_text.done")
    # Encrypted reasoning is complete only on the item's done event.
    added = next(e for e in events if e.type == "response.output_item.added")
    assert added.item.encrypted_content is None


def test_chat_openai_stream_keeps_reasoning_annotations_and_calls(
    server: LoopbackProvider,
) -> None:
    server.enqueue(SCRIPTED)
    message = merge(list(chat(server, include=ENCRYPTED).stream("What is the capital?")))
    reasoning, text, call = message.content
    assert isinstance(reasoning, dict)
    assert isinstance(text, dict)
    assert isinstance(call, dict)
    assert reasoning["type"] == "reasoning"
    assert [s["text"] for s in reasoning["summary"]] == [REASONING]
    assert unseal(reasoning["encrypted_content"]) == f"{reasoning['id']}\n{REASONING}"
    assert text["text"] == TEXT
    assert text["annotations"] == [URL_CITATION]
    assert call["type"] == "function_call"
    assert [(c["name"], c["args"]) for c in message.tool_calls] == [("get_weather", CALL.arguments)]
    assert message.usage_metadata is not None
    assert message.response_metadata["status"] == "completed"


def test_chat_openai_invoke_keeps_reasoning_annotations_and_calls(
    server: LoopbackProvider,
) -> None:
    server.enqueue(SCRIPTED)
    message = chat(server, include=ENCRYPTED).invoke("What is the capital?")
    reasoning, text, _ = message.content
    assert isinstance(reasoning, dict)
    assert isinstance(text, dict)
    assert [s["text"] for s in reasoning["summary"]] == [REASONING]
    assert unseal(reasoning["encrypted_content"]) == f"{reasoning['id']}\n{REASONING}"
    assert text["text"] == TEXT
    assert text["annotations"] == [URL_CITATION]
    assert isinstance(message, AIMessage)
    assert [(c["name"], c["args"]) for c in message.tool_calls] == [("get_weather", CALL.arguments)]


async def test_async_chat_openai_streams_the_responses_wire(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(text=TEXT))
    chunks = [chunk async for chunk in chat(server).astream("hi")]
    assert merge(chunks).text == TEXT


def test_length_stop_ends_with_response_incomplete(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(text=TEXT, stop_reason="length"))
    events = list(create(server, stream=True))
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"
    server.enqueue(Scenario(text=TEXT, stop_reason="length"))
    assert create(server).status == "incomplete"


def test_redacted_reasoning_has_no_summary(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(text=TEXT, thinking=[ScriptedThinking("hidden", redacted=True)]))
    reasoning, _ = create(server, include=ENCRYPTED).output
    assert reasoning.summary == []
    assert unseal(reasoning.encrypted_content) == f"{reasoning.id}\nhidden"


def test_web_search_call_item_streams_its_stages(server: LoopbackProvider) -> None:
    search = ScriptedWebSearch("capital of France", [("https://example.com/paris", "Paris")])
    scenario = Scenario(text=TEXT, web_searches=[search], citations=[CITATION])
    server.enqueue(scenario, scenario)
    events = list(create(server, stream=True))
    stages = [e.type for e in events if e.type.startswith("response.web_search_call.")]
    assert stages == [
        "response.web_search_call.in_progress",
        "response.web_search_call.searching",
        "response.web_search_call.completed",
    ]
    call, message = events[-1].response.output
    assert call.type == "web_search_call"
    assert call.action.query == "capital of France"
    assert message.content[0].annotations[0].url == "https://example.com/paris"
    assert [item.type for item in create(server).output] == ["web_search_call", "message"]


# -- faults -----------------------------------------------------------------------------


def test_drop_after_events_delivers_prefix_then_raises_connection_error(
    server: LoopbackProvider,
) -> None:
    # created, in_progress, item added, part added, then two 4-character deltas.
    server.enqueue(Scenario(text=TEXT, fault=Fault.drop_after_events(6)))
    received: list[Any] = []
    with pytest.raises(openai.APIConnectionError) as caught:
        collect(chat(server).stream("hi"), received)
    assert isinstance(caught.value.__cause__, openai.APIConnectionError)
    assert isinstance(caught.value.__cause__.__cause__, httpx2.RemoteProtocolError)
    assert "".join(chunk.text for chunk in received) == TEXT[:8]


def test_drop_after_bytes_cuts_the_stream_mid_event(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(text=TEXT, fault=Fault.drop_after_bytes(300)))
    events: list[Any] = []
    with pytest.raises(openai.APIConnectionError):
        collect(create(server, stream=True), events)
    assert [e.type for e in events] == []


def test_drop_before_headers_raises_connection_error(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(text=TEXT, fault=Fault.drop_before_headers()))
    with pytest.raises(openai.APIConnectionError):
        create(server, stream=True)


def test_error_event_is_yielded_by_the_sdk_with_its_code(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(text=TEXT, fault=Fault.error_event(after_events=5)))
    events = list(create(server, stream=True))
    assert [e.sequence_number for e in events] == list(range(6))
    error = events[-1]
    assert error.type == "error"
    assert error.code == "server_error"
    assert error.message


def test_error_event_makes_chat_openai_raise_after_the_prefix(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(text=TEXT, fault=Fault.error_event(after_events=5)))
    received: list[Any] = []
    with pytest.raises(ValueError, match="server_error"):
        collect(chat(server).stream("hi"), received)
    assert "".join(chunk.text for chunk in received) == TEXT[:4]


def test_response_failed_carries_the_error_code(server: LoopbackProvider) -> None:
    fault = Fault.response_failed(after_events=4, code="rate_limit_exceeded")
    server.enqueue(Scenario(text=TEXT, fault=fault))
    events = list(create(server, stream=True))
    failed = events[-1]
    assert failed.type == "response.failed"
    assert failed.sequence_number == 4
    assert failed.response.status == "failed"
    assert failed.response.error.code == "rate_limit_exceeded"
    server.enqueue(Scenario(text=TEXT, fault=fault))
    with pytest.raises(ValueError, match="rate_limit_exceeded"):
        list(chat(server).stream("hi"))


def test_non_streamed_failures_become_http_statuses(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(text=TEXT, fault=Fault.error_event()))
    with pytest.raises(openai.InternalServerError) as caught:
        create(server)
    assert caught.value.code is None or caught.value.type == "server_error"
    server.enqueue(Scenario(text=TEXT, fault=Fault.response_failed(code="rate_limit_exceeded")))
    with pytest.raises(openai.RateLimitError) as limited:
        create(server)
    assert limited.value.code == "rate_limit_exceeded"


def test_rate_limit_carries_retry_hints(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(fault=Fault.rate_limited(retry_after=2, retry_after_ms=1500)))
    with pytest.raises(openai.RateLimitError) as caught:
        create(server, stream=True)
    assert caught.value.response.headers["retry-after"] == "2"
    assert caught.value.response.headers["retry-after-ms"] == "1500"
    assert caught.value.code == "rate_limit_exceeded"
    assert caught.value.response.headers["x-request-id"].startswith("req_loopback_")


def test_server_error_status_surfaces_as_internal_server_error(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(fault=Fault.server_error(503)))
    with pytest.raises(openai.InternalServerError) as caught:
        list(chat(server).stream("hi"))
    assert caught.value.status_code == 503


def test_context_overflow_names_the_input_param(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(fault=Fault.context_overflow()))
    with pytest.raises(openai.BadRequestError) as caught:
        create(server)
    assert caught.value.code == "context_length_exceeded"
    assert caught.value.param == "input"


def test_stall_longer_than_read_timeout_raises_timeout(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(text=TEXT, fault=Fault.stall(5, after_events=3)))
    with pytest.raises(openai.APITimeoutError):
        list(chat(server, timeout=0.2).stream("hi"))


def test_keepalive_stall_sends_no_events(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(text="ok", fault=Fault.stall(0.3, after_events=2, keepalive=0.05)))
    events = list(client(server, timeout=0.2).responses.create(model=MODEL, input="x", stream=True))
    assert events[-1].type == "response.completed"


def test_malformed_event_raises_json_decode_error(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(text=TEXT, fault=Fault.malformed_sse(after_events=4)))
    with pytest.raises(json.JSONDecodeError):
        list(create(server, stream=True))


def test_no_terminal_event_ends_without_completed(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(text=TEXT, fault=Fault.no_terminal_event()))
    events = list(create(server, stream=True))
    assert events[-1].type == "response.output_item.done"
    assert "response.completed" not in [e.type for e in events]
    server.enqueue(Scenario(text=TEXT, fault=Fault.no_terminal_event()))
    assert create(server).status == "in_progress"


# -- requests ---------------------------------------------------------------------------


def test_recorded_request_exposes_input_items_and_a_messages_view(
    server: LoopbackProvider,
) -> None:
    server.enqueue(Scenario(text="Sunny."))
    history = [
        HumanMessage("Weather in Paris?"),
        AIMessage(
            "",
            tool_calls=[{"name": "get_weather", "args": {"city": "Paris"}, "id": "call_9"}],
        ),
        ToolMessage("18C", tool_call_id="call_9"),
    ]
    chat(server).invoke(history)
    (request,) = server.requests_for("openai-responses")
    assert request.path == "/v1/responses"
    assert request.provider == "openai-responses"
    assert [item.get("type") for item in request.input] == [
        "message",
        "function_call",
        "function_call_output",
    ]
    roles = [m["role"] for m in request.messages]
    assert roles == ["user", "assistant", "tool"]
    assert request.messages[1]["tool_calls"][0]["id"] == "call_9"
    assert request.messages[2] == {"role": "tool", "tool_call_id": "call_9", "content": "18C"}


def test_echo_responder_reads_the_last_user_input(server: LoopbackProvider) -> None:
    server.default = echo_responder()
    assert chat(server).invoke("ping").text == "You said: ping"
    assert create(server).output_text == "You said: What is the capital?"


def test_continuation_responder_continues_a_responses_prefix(server: LoopbackProvider) -> None:
    server.default = continuation_responder(Scenario(text=TEXT))
    history = [
        HumanMessage("Tell me."),
        AIMessage(TEXT[:10]),
        HumanMessage("Continue."),
    ]
    assert chat(server).invoke(history).text == TEXT[10:]


# -- background mode: the provider keeps the response -----------------------------------


class Clock:
    """A clock the test moves forward."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def cut_background(server: LoopbackProvider, scenario: Scenario) -> tuple[str, list[Any]]:
    """Create ``scenario`` in background mode; return its id and the events read before the cut."""
    server.enqueue(scenario)
    events: list[Any] = []
    with pytest.raises(openai.APIConnectionError):
        collect(create(server, stream=True, background=True, store=True), events)
    return events[0].response.id, events


def test_background_stream_resumes_after_the_last_event_read(server: LoopbackProvider) -> None:
    response_id, before = cut_background(
        server,
        Scenario(
            text=TEXT, thinking=[ScriptedThinking(REASONING)], fault=Fault.drop_after_events(9)
        ),
    )
    assert before[0].response.background is True
    after = list(
        client(server).responses.retrieve(
            response_id, stream=True, starting_after=before[-1].sequence_number
        )
    )
    events = before + after
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == TEXT
    assert len(server.requests_for("openai-responses")) == 1  # one generation
    assert len(server.retrievals()) == 1


async def test_async_background_stream_resumes_after_the_last_event_read(
    server: LoopbackProvider,
) -> None:
    response_id, before = cut_background(
        server, Scenario(text=TEXT, fault=Fault.drop_after_events(5))
    )
    sdk = openai.AsyncOpenAI(base_url=server.base_url_openai, api_key="x", max_retries=0)
    stream = await sdk.responses.retrieve(
        response_id, stream=True, starting_after=before[-1].sequence_number
    )
    after = [event async for event in stream]
    assert after[0].sequence_number == before[-1].sequence_number + 1
    assert after[-1].type == "response.completed"


def test_retrieval_after_the_response_completed_replays_the_rest(
    server: LoopbackProvider,
) -> None:
    server.enqueue(Scenario(text=TEXT))
    events = list(create(server, stream=True, background=True, store=True))
    response_id = events[0].response.id
    assert client(server).responses.retrieve(response_id).status == "completed"
    tail = list(client(server).responses.retrieve(response_id, stream=True, starting_after=5))
    assert [e.sequence_number for e in tail] == [e.sequence_number for e in events[6:]]
    assert tail[-1].type == "response.completed"


def test_retrieval_without_starting_after_replays_every_event(server: LoopbackProvider) -> None:
    response_id, before = cut_background(
        server, Scenario(text=TEXT, fault=Fault.drop_after_events(4))
    )
    replay = list(client(server).responses.retrieve(response_id, stream=True))
    assert [e.type for e in replay[:4]] == [e.type for e in before]
    assert replay[-1].type == "response.completed"


def test_drop_during_the_resume_cuts_the_resumed_stream(server: LoopbackProvider) -> None:
    scenario = Scenario(
        text=TEXT, fault=Fault.drop_after_events(5), resume_faults=[Fault.drop_after_events(2)]
    )
    response_id, _ = cut_background(server, scenario)
    first: list[Any] = []
    with pytest.raises(openai.APIConnectionError):
        collect(
            client(server).responses.retrieve(response_id, stream=True, starting_after=4), first
        )
    assert [e.sequence_number for e in first] == [5, 6]
    second = list(client(server).responses.retrieve(response_id, stream=True, starting_after=6))
    assert second[0].sequence_number == 7
    assert second[-1].type == "response.completed"
    assert len(server.requests_for("openai-responses")) == 1


def test_expired_background_response_is_not_found() -> None:
    clock = Clock()
    with LoopbackProvider(clock=clock, background_ttl=60.0) as server:
        response_id, _ = cut_background(
            server, Scenario(text=TEXT, fault=Fault.drop_after_events(4))
        )
        clock.now += 61.0
        with pytest.raises(openai.NotFoundError):
            list(client(server).responses.retrieve(response_id, stream=True, starting_after=3))
        assert server.background_response(response_id) is None


def test_unknown_response_id_is_not_found(server: LoopbackProvider) -> None:
    with pytest.raises(openai.NotFoundError):
        client(server).responses.retrieve("resp_missing")
    with pytest.raises(openai.NotFoundError):
        client(server).responses.cancel("resp_missing")


def test_cancel_stops_a_running_response_and_its_stream_ends_without_terminal_event(
    server: LoopbackProvider,
) -> None:
    response_id, _ = cut_background(server, Scenario(text=TEXT, fault=Fault.drop_after_events(4)))
    assert client(server).responses.cancel(response_id).status == "cancelled"
    assert client(server).responses.retrieve(response_id).status == "cancelled"
    assert list(client(server).responses.retrieve(response_id, stream=True, starting_after=3)) == []
    assert [r.path for r in server.cancellations()] == [f"/v1/responses/{response_id}/cancel"]


def test_background_mode_requires_store(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(text=TEXT))
    with pytest.raises(openai.BadRequestError, match="store"):
        create(server, stream=True, background=True, store=False)


def test_retrieval_sends_events_no_sooner_than_the_response_generates_them(
    server: LoopbackProvider,
) -> None:
    paced = Scenario(text=TEXT, delay=0.02, fault=Fault.drop_after_events(3))
    response_id, _ = cut_background(server, paced)
    kept = server.background_response(response_id)
    assert kept is not None
    events = list(client(server).responses.retrieve(response_id, stream=True, starting_after=2))
    last = events[-1].sequence_number
    assert last == len(kept.frames) - 1
    assert time.monotonic() >= kept.started + last * paced.delay  # generated at its pace
