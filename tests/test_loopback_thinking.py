"""Anthropic extended thinking, citations and server tools on the loopback provider, and
the request rules both thinking wires enforce, through the real SDKs and LangChain models."""

from __future__ import annotations

import copy
from typing import Any

import anthropic
import httpx2
import openai
import pytest
from langchain_anthropic import ChatAnthropic
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, ToolMessage
from langchain_openai import ChatOpenAI
from transport_errors import raises_cut

from awaken_langchain.testing import (
    Fault,
    LoopbackProvider,
    Scenario,
    ScriptedCitation,
    ScriptedThinking,
    ScriptedToolCall,
    ScriptedWebSearch,
)
from awaken_langchain.testing._wire import signature_is_valid, thinking_signature, unseal

MODEL = "claude-sonnet-4-6"
THINKING = "The user wants the weather in Utrecht. I should call the tool."
SECRET = "redacted reasoning"
TEXT = "Utrecht is in the Netherlands."
CITATION = ScriptedCitation(0, 7, "https://example.com/utrecht", "Utrecht")
CALL = ScriptedToolCall("get_temperature", {"city": "Utrecht"})
SCRIPTED = Scenario(
    text=TEXT,
    thinking=[ScriptedThinking(THINKING), ScriptedThinking(SECRET, redacted=True)],
    citations=[CITATION],
    tool_calls=[CALL],
    chunk_size=8,
)
WEB_CITATION = {
    "type": "web_search_result_location",
    "cited_text": "Utrecht",
    "url": "https://example.com/utrecht",
    "title": "Utrecht",
}
THINKING_ON = {"type": "enabled", "budget_tokens": 1024}
TOOL = {
    "name": "get_temperature",
    "description": "Temperature of a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


@pytest.fixture
def server(loopback_provider: LoopbackProvider) -> LoopbackProvider:
    return loopback_provider


def client(server: LoopbackProvider, **kwargs: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=server.base_url_anthropic, api_key="x", max_retries=0, **kwargs
    )


def create(server: LoopbackProvider, messages: list[Any] | None = None, **kwargs: Any) -> Any:
    return client(server).messages.create(
        model=MODEL,
        max_tokens=2048,
        messages=messages or [{"role": "user", "content": "Weather in Utrecht?"}],
        **kwargs,
    )


def chat(server: LoopbackProvider, **kwargs: Any) -> ChatAnthropic:
    settings: dict[str, Any] = {"max_tokens": 2048, "thinking": THINKING_ON, **kwargs}
    return ChatAnthropic(
        model=MODEL, base_url=server.base_url_anthropic, api_key="x", max_retries=0, **settings
    )


def merge(chunks: list[Any]) -> AIMessageChunk:
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged = merged + chunk
    assert isinstance(merged, AIMessageChunk)
    return merged


def without(block: Any, *keys: str) -> dict[str, Any]:
    assert isinstance(block, dict)
    return {k: v for k, v in block.items() if k not in keys}


def assert_scripted_content(content: list[Any]) -> None:
    """The parsed SDK content blocks are exactly what ``SCRIPTED`` scripts."""
    thinking, redacted, cited, rest, tool_use = content
    assert thinking.type == "thinking"
    assert thinking.thinking == THINKING
    assert signature_is_valid(THINKING, thinking.signature)
    assert redacted.type == "redacted_thinking"
    assert unseal(redacted.data) == SECRET
    assert cited.text == TEXT[:7]
    assert [without(c.model_dump(), "encrypted_index") for c in cited.citations] == [WEB_CITATION]
    assert rest.text == TEXT[7:]
    assert not rest.citations
    assert tool_use.type == "tool_use"
    assert tool_use.input == {"city": "Utrecht"}


# -- the uncut answer -------------------------------------------------------------------


def test_sdk_non_streamed_message_holds_signed_thinking_and_citations(
    server: LoopbackProvider,
) -> None:
    server.enqueue(SCRIPTED)
    message = create(server, thinking=THINKING_ON)
    assert_scripted_content(message.content)
    assert message.stop_reason == "tool_use"


def test_sdk_stream_assembles_to_the_scripted_blocks(server: LoopbackProvider) -> None:
    server.enqueue(SCRIPTED)
    with client(server).messages.stream(
        model=MODEL,
        max_tokens=2048,
        thinking=THINKING_ON,
        messages=[{"role": "user", "content": "Weather in Utrecht?"}],
    ) as stream:
        final = stream.get_final_message()
    assert_scripted_content(final.content)


def test_thinking_streams_deltas_then_one_signature_delta_like_the_real_api(
    server: LoopbackProvider,
) -> None:
    server.enqueue(SCRIPTED)
    events = list(create(server, stream=True))
    start = events[1]
    assert start.type == "content_block_start"
    assert start.content_block.model_dump() == {
        "type": "thinking",
        "thinking": "",
        "signature": "",
    }
    block = [e for e in events if getattr(e, "index", None) == 0][1:]
    deltas = [e.delta.type for e in block if e.type == "content_block_delta"]
    assert deltas == ["thinking_delta"] * 8 + ["signature_delta"]
    assert block[-1].type == "content_block_stop"
    assert block[-2].delta.signature == thinking_signature(THINKING)
    redacted = [e for e in events if getattr(e, "index", None) == 1]
    assert [e.type for e in redacted] == ["content_block_start", "content_block_stop"]
    assert unseal(redacted[0].content_block.data) == SECRET


def test_cited_text_block_starts_with_a_citations_delta(server: LoopbackProvider) -> None:
    server.enqueue(SCRIPTED)
    events = [e for e in create(server, stream=True) if getattr(e, "index", None) == 2]
    assert events[0].content_block.model_dump(exclude_none=True) == {
        "type": "text",
        "text": "",
        "citations": [],
    }
    assert [e.delta.type for e in events[1:-1]] == ["citations_delta", "text_delta"]


def test_chat_anthropic_stream_and_invoke_keep_the_same_blocks(server: LoopbackProvider) -> None:
    server.enqueue(SCRIPTED, SCRIPTED)
    streamed = merge(list(chat(server).stream("Weather in Utrecht?")))
    invoked = chat(server).invoke("Weather in Utrecht?")
    for message in (streamed, invoked):
        thinking, redacted, cited, rest, _ = message.content
        assert without(thinking, "index") == {
            "type": "thinking",
            "thinking": THINKING,
            "signature": thinking_signature(THINKING),
        }
        assert unseal(without(redacted, "index")["data"]) == SECRET
        assert without(cited, "index")["text"] == TEXT[:7]
        citations = without(cited, "index")["citations"]
        assert [without(c, "encrypted_index") for c in citations] == [WEB_CITATION]
        assert without(rest, "index") == {"type": "text", "text": TEXT[7:]}
        assert [(c["name"], c["args"]) for c in message.tool_calls] == [
            ("get_temperature", {"city": "Utrecht"})
        ]
    assert [without(b, "index") for b in streamed.content[:4]] == invoked.content[:4]


def test_drop_inside_thinking_leaves_an_unsigned_prefix(server: LoopbackProvider) -> None:
    # message_start, thinking start, three thinking deltas.
    fault = Fault.drop_after_events(5)
    server.enqueue(Scenario(text=TEXT, thinking=[ScriptedThinking(THINKING)], fault=fault))
    received: list[Any] = []
    with raises_cut(httpx2.RemoteProtocolError):
        received.extend(chunk for chunk in chat(server).stream("hi"))
    (thinking,) = merge(received).content
    assert isinstance(thinking, dict)
    assert thinking["thinking"] == THINKING[:12]
    assert not thinking.get("signature")


def test_error_event_after_thinking_is_an_overloaded_status_error(
    server: LoopbackProvider,
) -> None:
    fault = Fault.error_event(after_events=4)
    server.enqueue(Scenario(text=TEXT, thinking=[ScriptedThinking(THINKING)], fault=fault))
    with pytest.raises(anthropic.APIStatusError) as caught:
        list(create(server, stream=True))
    assert caught.value.status_code == 200
    assert caught.value.body["error"]["type"] == "overloaded_error"


def test_web_search_server_tool_blocks_stream_and_parse_like_non_streamed(
    server: LoopbackProvider,
) -> None:
    search = ScriptedWebSearch("Utrecht weather", [("https://example.com/utrecht", "Utrecht")])
    scenario = Scenario(text=TEXT, web_searches=[search], citations=[CITATION])
    server.enqueue(scenario, scenario)
    plain = create(server).content
    with client(server).messages.stream(
        model=MODEL, max_tokens=2048, messages=[{"role": "user", "content": "Weather?"}]
    ) as stream:
        streamed = stream.get_final_message().content
    for content in (plain, streamed):
        use, result, cited, _ = content
        assert use.type == "server_tool_use"
        assert (use.name, use.input) == ("web_search", {"query": "Utrecht weather"})
        assert result.type == "web_search_tool_result"
        assert result.tool_use_id == use.id
        assert [(r.url, r.title) for r in result.content] == [
            ("https://example.com/utrecht", "Utrecht")
        ]
        assert cited.citations[0].url == "https://example.com/utrecht"
    web_search = {"type": "web_search_20250305", "name": "web_search", "max_uses": 1}
    server.enqueue(scenario)
    message = merge(list(chat(server, thinking=None).bind_tools([web_search]).stream("Weather?")))
    kinds = [block["type"] for block in message.content if isinstance(block, dict)]
    assert kinds == ["server_tool_use", "web_search_tool_result", "text", "text"]
    assert not message.tool_calls


# -- request rules: Anthropic -----------------------------------------------------------


def tool_loop(thinking_blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A conversation in the middle of a tool loop, replaying ``thinking_blocks``."""
    return [
        {"role": "user", "content": "Weather in Utrecht?"},
        {
            "role": "assistant",
            "content": [
                *thinking_blocks,
                {"type": "tool_use", "id": "toolu_1", "name": "get_temperature", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C"}],
        },
    ]


def signed(thinking: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": thinking, "signature": thinking_signature(thinking)}


def test_tool_loop_with_the_issued_thinking_block_is_accepted(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(text="It is 18C."))
    answer = create(server, tool_loop([signed(THINKING)]), thinking=THINKING_ON, tools=[TOOL])
    assert answer.content[0].text == "It is 18C."


def test_tool_loop_without_thinking_is_rejected_when_thinking_is_enabled(
    server: LoopbackProvider,
) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        create(server, tool_loop([]), thinking=THINKING_ON, tools=[TOOL])
    assert caught.value.body["error"]["type"] == "invalid_request_error"
    assert "a final `assistant` message must start with a thinking block" in str(caught.value)
    assert server.requests[-1].rejected_by == "anthropic.thinking_starts_tool_turn"
    # Without thinking enabled the same conversation is fine.
    create(server, tool_loop([]), tools=[TOOL])


@pytest.mark.parametrize(
    "block",
    [
        {**signed(THINKING), "thinking": THINKING + " (edited)"},
        {"type": "thinking", "thinking": THINKING, "signature": ""},
        {"type": "thinking", "thinking": THINKING},
        {"type": "redacted_thinking", "data": "bm90IGlzc3VlZA=="},
    ],
    ids=["modified", "empty-signature", "unsigned", "forged-redacted"],
)
def test_modified_or_unsigned_thinking_is_rejected(
    server: LoopbackProvider, block: dict[str, Any]
) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        create(server, tool_loop([block]), thinking=THINKING_ON, tools=[TOOL])
    assert "messages.1.content.0: Invalid" in str(caught.value)
    assert server.requests[-1].rejected_by == "anthropic.thinking_unmodified"


def test_thinking_after_text_is_rejected(server: LoopbackProvider) -> None:
    text = {"type": "text", "text": "Let me check."}
    with pytest.raises(anthropic.BadRequestError, match="the first block must be thinking"):
        create(server, tool_loop([text, signed(THINKING)]), thinking=THINKING_ON, tools=[TOOL])


def test_chat_anthropic_tool_loop_round_trips_its_thinking(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(thinking=[ScriptedThinking(THINKING)], tool_calls=[CALL]))
    server.enqueue(Scenario(text="It is 18C."))
    model = chat(server).bind_tools([TOOL])
    first = merge(list(model.stream("Weather in Utrecht?")))
    call = first.tool_calls[0]
    history = [
        HumanMessage("Weather in Utrecht?"),
        first,
        ToolMessage("18C", tool_call_id=call["id"]),
    ]
    assert model.invoke(history).text == "It is 18C."
    edited = copy.deepcopy(first)
    assert isinstance(edited.content[0], dict)
    edited.content[0]["thinking"] += "!"
    with pytest.raises(anthropic.BadRequestError, match="Invalid `signature`"):
        model.invoke([*history[:1], edited, history[2]])


# -- request rules: OpenAI Responses ----------------------------------------------------


def responses(server: LoopbackProvider, items: list[Any], **kwargs: Any) -> Any:
    openai_client = openai.OpenAI(base_url=server.base_url_openai, api_key="x", max_retries=0)
    return openai_client.responses.create(model="gpt-5", input=items, **kwargs)


def reasoning_item(server: LoopbackProvider) -> dict[str, Any]:
    server.enqueue(Scenario(text="ok", thinking=[ScriptedThinking(THINKING)]))
    issued = responses(
        server, [{"role": "user", "content": "hi"}], include=["reasoning.encrypted_content"]
    )
    return issued.output[0].model_dump(exclude_none=True)


def function_call(call_id: str = "call_1") -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": "f", "arguments": "{}"}


def function_output(call_id: str = "call_1") -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": "18C"}


USER = {"role": "user", "content": "Weather?"}


def test_responses_accepts_a_tool_loop_with_issued_reasoning(server: LoopbackProvider) -> None:
    reasoning = reasoning_item(server)
    answer = responses(server, [USER, reasoning, function_call(), function_output()], store=False)
    assert answer.output_text


@pytest.mark.parametrize(
    ("items", "message"),
    [
        ([USER, function_output()], "No tool call found for function call output with call_id"),
        ([USER, function_call()], "No tool output found for function call call_1"),
        (
            [USER, {"role": "assistant", "content": [{"type": "input_text", "text": "x"}]}, USER],
            "Supported values are: 'output_text' and 'refusal'",
        ),
        ([USER, {"role": "assistant", "content": "Sure,"}], "assistant message prefill"),
        ([], "Missing required parameter: 'input'"),
    ],
    ids=["output-without-call", "call-without-output", "input-text-part", "prefill", "empty"],
)
def test_responses_rejects_bad_input_items(
    server: LoopbackProvider, items: list[Any], message: str
) -> None:
    with pytest.raises(openai.BadRequestError, match=message) as caught:
        responses(server, items)
    assert caught.value.type == "invalid_request_error"


def test_responses_rejects_reasoning_the_server_did_not_issue(server: LoopbackProvider) -> None:
    reasoning = reasoning_item(server)
    tampered = {**reasoning, "encrypted_content": reasoning["encrypted_content"][:-8] + "AAAAAAA="}
    with pytest.raises(openai.BadRequestError, match="could not be verified"):
        responses(server, [USER, tampered, function_call(), function_output()])
    bare = {k: v for k, v in reasoning.items() if k != "encrypted_content"}
    with pytest.raises(openai.BadRequestError, match="Items are not persisted"):
        responses(server, [USER, bare, function_call(), function_output()], store=False)
    responses(server, [USER, bare, function_call(), function_output()])


def test_chat_openai_responses_tool_loop_round_trips_reasoning(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(thinking=[ScriptedThinking(THINKING)], tool_calls=[CALL]))
    server.enqueue(Scenario(text="It is 18C."))
    model = ChatOpenAI(
        model="gpt-5",
        base_url=server.base_url_openai,
        api_key="x",
        max_retries=0,
        use_responses_api=True,
        store=False,
        include=["reasoning.encrypted_content"],
    )
    first = merge(list(model.stream("Weather in Utrecht?")))
    call = first.tool_calls[0]
    history = [
        HumanMessage("Weather in Utrecht?"),
        first,
        ToolMessage("18C", tool_call_id=call["id"]),
    ]
    assert model.invoke(history).text == "It is 18C."
    kinds = [item.get("type") for item in server.requests[-1].input]
    assert kinds == ["message", "reasoning", "function_call", "function_call_output"]
    assert isinstance(first, AIMessage)
