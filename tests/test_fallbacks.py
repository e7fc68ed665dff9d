"""A turn continues on a fallback model when the model in effect is spent.

The real ChatOpenAI and ChatAnthropic talk to the loopback provider through the
official SDKs (``max_retries=0``: only the wrapper retries). The primary model
streams part of an answer, then the provider answers 529 until the primary's
budget is spent; the fallback, answering like a model asked to continue,
finishes the turn. Tests assert what the caller saw, what the provider
received, and what ``response_metadata["awaken"]`` and the events report.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage
from langchain_core.tools import BaseTool, tool
from pydantic import BaseModel

from awaken_langchain import (
    DiskCacheStreamCheckpointStore,
    InMemoryStreamCheckpointStore,
    RecoveringChatModel,
    RetryPolicy,
    StreamCheckpoint,
    StreamInterruptedError,
)
from awaken_langchain.errors import StreamCheckpointError
from awaken_langchain.middleware import StreamRecoveryMiddleware
from awaken_langchain.recovery import DEFAULT_CONTINUATION_PROMPT
from awaken_langchain.testing import (
    Fault,
    LoopbackProvider,
    RecordedRequest,
    Scenario,
    ScriptedThinking,
    ScriptedToolCall,
    continuation_responder,
)
from tests.conftest import Events, Sleeps, answered_a_tool, loopback_client

pytestmark = pytest.mark.asyncio(loop_scope="module")

REPO_ROOT = Path(__file__).resolve().parent.parent

ANSWER = (
    "The lighthouse keeper climbed the stairs at dusk, trimmed the wick, and watched "
    "the beam sweep across the water until the fishing boats were home."
)
OPENAI = "gpt-4o-mini"
ANTHROPIC = "claude-loopback"
OPENAI_ID = f"openai-chat:{OPENAI}"
ANTHROPIC_ID = f"anthropic-chat:{ANTHROPIC}"
PROVIDER_OF = {OPENAI: "openai", ANTHROPIC: "anthropic"}


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(
        b if isinstance(b, str) else b.get("text", "")
        for b in content
        if isinstance(b, str) or b.get("type") == "text"
    )


@pytest.fixture
def server(shared_server: LoopbackProvider) -> LoopbackProvider:
    shared_server.reset()
    shared_server.default = Scenario(text=ANSWER)
    return shared_server


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


def chat_model(name: str, server: LoopbackProvider) -> BaseChatModel:
    """The real integration for ``name``, talking to the loopback server (kept with it)."""
    return loopback_client(PROVIDER_OF[name], server, model=name)


def policy(sleeps: Sleeps, **settings: Any) -> RetryPolicy:
    settings.setdefault("overload_deadline", None)
    return RetryPolicy(sleep=sleeps, async_sleep=sleeps.asleep, clock=sleeps.clock, **settings)


def storm(primary: str, then: Callable[[RecordedRequest], Scenario]) -> Any:
    """Every request to ``primary`` is answered 529; the others by ``then``."""

    def respond(request: RecordedRequest) -> Scenario:
        if request.body.get("model") == primary:
            return Scenario(fault=Fault.overloaded())
        return then(request)

    return respond


def continuing(full: str = ANSWER, overlap_words: int = 0, **fields: Any) -> Any:
    return continuation_responder(Scenario(text=full, **fields), overlap_words=overlap_words)


def to(name: str) -> list[RecordedRequest]:
    """The requests a model received, in order."""
    return [r for r in SERVER[0].requests if r.body.get("model") == name]


SERVER: list[LoopbackProvider] = []


@pytest.fixture(autouse=True)
def _remember(server: LoopbackProvider) -> None:
    SERVER[:] = [server]


def last_assistant(request: RecordedRequest) -> Any:
    return [m for m in request.messages if m.get("role") == "assistant"][-1]["content"]


def user_turns(request: RecordedRequest) -> list[str]:
    return [_text_of(m["content"]) for m in request.messages if m.get("role") == "user"]


ENTRY_POINTS = ["invoke", "stream", "ainvoke", "astream"]


@pytest.fixture(params=ENTRY_POINTS)
def entry(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def call(
    model: Any, entry: str, prompt: Any = "Tell me about the lighthouse", **kwargs: Any
) -> tuple[AIMessage, list[AIMessageChunk]]:
    """The caller's final message and streamed chunks (empty for invoke)."""
    if entry == "invoke":
        return model.invoke(prompt, **kwargs), []
    if entry == "ainvoke":
        return await model.ainvoke(prompt, **kwargs), []
    if entry == "stream":
        chunks = list(model.stream(prompt, **kwargs))
    else:
        chunks = [chunk async for chunk in model.astream(prompt, **kwargs)]
    total = chunks[0]
    for chunk in chunks[1:]:
        total = total + chunk
    fields = total.model_dump(exclude={"type", "tool_call_chunks", "chunk_position"})
    return AIMessage(**fields), chunks


def streamed_text(chunks: list[AIMessageChunk]) -> str:
    return "".join(_text_of(c.content) for c in chunks)


DIRECTIONS = [(OPENAI, ANTHROPIC), (ANTHROPIC, OPENAI)]


@pytest.fixture(params=DIRECTIONS, ids=["openai-to-anthropic", "anthropic-to-openai"])
def pair(request: pytest.FixtureRequest) -> tuple[str, str]:
    return request.param  # type: ignore[no-any-return]


def cut_answer(primary: str, events: int = 8, **fields: Any) -> Scenario:
    """The primary's first answer: part of ``ANSWER``, then the connection drops."""
    fields.setdefault("text", ANSWER)
    fault = Fault.drop_after_events(events)
    return Scenario(provider=PROVIDER_OF[primary], fault=fault, **fields)


# -- after output: the fallback continues from the prefix ---------------------------------


async def test_fallback_continues_the_turn_from_the_prefix_without_prefill(
    pair: tuple[str, str], entry: str, server: LoopbackProvider, sleeps: Sleeps
) -> None:
    primary, fallback = pair
    server.enqueue(cut_answer(primary))
    server.default = storm(primary, continuing())
    model = RecoveringChatModel(
        model=chat_model(primary, server),
        fallbacks=[chat_model(fallback, server)],
        retry_policy=policy(sleeps, max_continuations=2),
    )
    events = Events()
    message, chunks = await call(model, entry, config={"callbacks": [events]})

    assert _text_of(message.content) == ANSWER
    if primary == OPENAI:  # the answer keeps the shape it began with
        assert message.content == ANSWER
    if chunks:
        assert streamed_text(chunks) == ANSWER
    # the primary: the cut answer, then two continuations answered 529
    assert len(to(primary)) == 3
    [request] = to(fallback)
    assert request.provider == PROVIDER_OF[fallback]
    prefix = _text_of(last_assistant(request))
    assert prefix
    assert ANSWER.startswith(prefix)
    assert prefix == prefix.rstrip()
    assert request.messages[-1]["role"] == "user"  # no assistant prefill
    assert user_turns(request) == ["Tell me about the lighthouse", DEFAULT_CONTINUATION_PROMPT]
    assert request.rejected_by is None

    awaken = message.response_metadata["awaken"]
    ids = {OPENAI: OPENAI_ID, ANTHROPIC: ANTHROPIC_ID}
    switch = awaken["models"][1]["start"]
    assert ANSWER[:switch].rstrip() == prefix
    assert awaken["models"] == [
        {"model": ids[primary], "start": 0, "end": switch},
        {"model": ids[fallback], "start": switch, "end": len(ANSWER)},
    ]
    assert awaken["plans"] == ["R1", "R1", "R1"]
    [event] = events.named("awaken_fallback")
    assert (event["from_model"], event["to_model"]) == (ids[primary], ids[fallback])
    assert event["plan"] == "R1"
    assert event["cause"] == "overloaded"
    assert "max_continuations=2" in event["reason"]


async def test_words_the_fallback_repeats_at_the_seam_are_removed(
    pair: tuple[str, str], server: LoopbackProvider, sleeps: Sleeps
) -> None:
    primary, fallback = pair
    server.enqueue(cut_answer(primary))
    server.default = storm(primary, continuing(overlap_words=3))
    model = RecoveringChatModel(
        model=chat_model(primary, server),
        fallbacks=[chat_model(fallback, server)],
        retry_policy=policy(sleeps, max_continuations=1),
    )
    message, chunks = await call(model, "stream")
    assert streamed_text(chunks) == ANSWER
    assert _text_of(message.content) == ANSWER
    assert message.response_metadata["awaken"]["regenerated_output_tokens"] >= 1


async def test_overload_past_the_overload_deadline_moves_on_without_waiting(
    server: LoopbackProvider, sleeps: Sleeps
) -> None:
    server.enqueue(cut_answer(OPENAI))
    server.default = storm(OPENAI, continuing())
    model = RecoveringChatModel(
        model=chat_model(OPENAI, server),
        fallbacks=[chat_model(ANTHROPIC, server)],
        retry_policy=policy(sleeps, max_continuations=1, overload_deadline=20.0, jitter=0.0),
    )
    message, _ = await call(model, "ainvoke")
    assert message.content == ANSWER
    # the drop: 0.5 s; then 529s: 4 s, 8 s; another 8 s would end past 20 s, so the
    # fallback takes over at once
    assert sleeps.waits == [0.5, 4.0, 8.0, 0.0]
    assert len(to(OPENAI)) == 4
    assert len(to(ANTHROPIC)) == 1


async def test_fallback_before_output_is_a_fresh_request_and_nothing_is_repeated(
    pair: tuple[str, str], entry: str, server: LoopbackProvider, sleeps: Sleeps
) -> None:
    primary, fallback = pair
    server.default = storm(primary, continuing())
    model = RecoveringChatModel(
        model=chat_model(primary, server),
        fallbacks=[chat_model(fallback, server)],
        retry_policy=policy(sleeps, max_attempts=2),
    )
    message, chunks = await call(model, entry)
    assert _text_of(message.content) == ANSWER
    if chunks:
        assert streamed_text(chunks) == ANSWER
    assert len(to(primary)) == 2
    [request] = to(fallback)
    assert user_turns(request) == ["Tell me about the lighthouse"]
    assert [m["role"] for m in request.messages] == ["user"]
    awaken = message.response_metadata["awaken"]
    assert awaken["plans"] == ["R4", "R4"]
    assert [(m["start"], m["end"]) for m in awaken["models"]] == [(0, 0), (0, len(ANSWER))]


async def test_when_every_model_is_spent_the_turn_raises_with_the_partial_answer(
    server: LoopbackProvider, sleeps: Sleeps
) -> None:
    server.enqueue(cut_answer(OPENAI))
    server.default = Scenario(fault=Fault.overloaded())
    model = RecoveringChatModel(
        model=chat_model(OPENAI, server),
        fallbacks=[chat_model(ANTHROPIC, server)],
        retry_policy=policy(sleeps, max_continuations=1),
    )
    with pytest.raises(StreamInterruptedError) as raised:
        model.invoke("Tell me about the lighthouse")
    assert "on the last of 2 models" in str(raised.value)
    assert raised.value.partial is not None
    assert ANSWER.startswith(_text_of(raised.value.partial.content))
    assert (len(to(OPENAI)), len(to(ANTHROPIC))) == (2, 2)


async def test_a_permanent_error_is_raised_without_trying_the_fallback(
    server: LoopbackProvider, sleeps: Sleeps
) -> None:
    server.enqueue(Scenario(provider="openai", fault=Fault.http_error(401)))
    model = RecoveringChatModel(
        model=chat_model(OPENAI, server),
        fallbacks=[chat_model(ANTHROPIC, server)],
        retry_policy=policy(sleeps),
    )
    with pytest.raises(Exception) as raised:
        await model.ainvoke("Tell me about the lighthouse")
    assert not isinstance(raised.value, StreamInterruptedError)
    assert (len(to(OPENAI)), len(to(ANTHROPIC))) == (1, 0)


async def test_thinking_blocks_stay_in_the_answer_and_are_not_sent_to_another_provider(
    entry: str, server: LoopbackProvider, sleeps: Sleeps
) -> None:
    from langchain_anthropic import ChatAnthropic

    thinking = [ScriptedThinking("The keeper's routine matters; describe it in order.")]
    server.enqueue(cut_answer(ANTHROPIC, 24, thinking=thinking, chunk_size=6))
    server.default = storm(ANTHROPIC, continuing())
    thinker = ChatAnthropic(  # type: ignore[call-arg]
        model=ANTHROPIC,
        base_url=server.base_url_anthropic,
        api_key="x",
        max_retries=0,
        max_tokens=4096,
        thinking={"type": "enabled", "budget_tokens": 1024},
    )
    model = RecoveringChatModel(
        model=thinker,
        fallbacks=[chat_model(OPENAI, server)],
        retry_policy=policy(sleeps, max_continuations=1),
    )
    message, chunks = await call(model, entry)
    if chunks:
        assert streamed_text(chunks) == ANSWER
    [request] = to(OPENAI)
    sent = last_assistant(request)
    assert isinstance(sent, str)
    assert sent
    assert ANSWER.startswith(sent)
    assert "signature" not in json.dumps(request.body)
    thought, *text = message.content
    assert isinstance(thought, dict)
    assert thought["type"] == "thinking"
    assert thought["thinking"] == thinking[0].text
    assert thought["signature"]
    assert _text_of(text) == ANSWER


async def test_a_turn_restarted_on_a_fallback_has_the_fallbacks_answer_whatever_was_discarded(
    entry: str, server: LoopbackProvider, sleeps: Sleeps
) -> None:
    from langchain_anthropic import ChatAnthropic

    thinking = [ScriptedThinking("The keeper's routine matters; describe it in order.")]
    # cut inside the thinking block: nothing was shown, the fallback answers afresh
    server.enqueue(cut_answer(ANTHROPIC, 4, thinking=thinking, chunk_size=6))
    server.default = storm(ANTHROPIC, continuing())
    thinker = ChatAnthropic(  # type: ignore[call-arg]
        model=ANTHROPIC,
        base_url=server.base_url_anthropic,
        api_key="x",
        max_retries=0,
        max_tokens=4096,
        thinking={"type": "enabled", "budget_tokens": 1024},
    )
    model = RecoveringChatModel(
        model=thinker,
        fallbacks=[chat_model(OPENAI, server)],
        retry_policy=policy(sleeps, max_attempts=2),
    )
    message, _ = await call(model, entry)
    bare = chat_model(OPENAI, server).invoke("Tell me about the lighthouse")
    assert message.content == bare.content == ANSWER
    assert message.response_metadata["awaken"]["plans"] == ["R4", "R4"]


# -- tool calls ------------------------------------------------------------------------------


def transfer(to: str, amount: int, confirm: bool = False) -> str:
    """Transfer money."""
    return f"sent {amount} to {to}"


ARGS = {"to": "alice", "amount": 100, "confirm": True}


async def test_a_tool_call_cut_off_on_the_primary_is_issued_whole_by_the_fallback(
    pair: tuple[str, str], entry: str, server: LoopbackProvider, sleeps: Sleeps
) -> None:
    primary, fallback = pair
    cut = Scenario(
        provider=PROVIDER_OF[primary],
        text="Sending now.",
        tool_calls=[ScriptedToolCall("transfer", ARGS, id="call_cut")],
        chunk_size=3,
        fault=Fault.drop_after_events(12),
    )
    server.enqueue(cut)
    whole = Scenario(tool_calls=[ScriptedToolCall("transfer", ARGS, id="call_whole")])
    server.default = storm(primary, lambda request: whole)
    model = RecoveringChatModel(
        model=chat_model(primary, server),
        fallbacks=[chat_model(fallback, server)],
        retry_policy=policy(sleeps, max_continuations=1),
    ).bind_tools([transfer])
    message, chunks = await call(model, entry)

    assert [(c["id"], c["args"]) for c in message.tool_calls] == [("call_whole", ARGS)]
    assert message.invalid_tool_calls == []
    assert _text_of(message.content) == "Sending now."
    for chunk in chunks:
        for piece in chunk.tool_call_chunks:
            assert json.loads(piece["args"] or "") == ARGS  # only whole calls were yielded
    [request] = to(fallback)
    [tool] = request.body["tools"]
    if fallback == ANTHROPIC:  # the tools are bound the fallback's own way
        assert tool["name"] == "transfer"
        assert "input_schema" in tool
    else:
        assert tool["function"]["name"] == "transfer"
    assert _text_of(last_assistant(request)) == "Sending now."
    assert request.messages[-1]["role"] == "user"


# -- checkpoints: a replacement process goes on with the model in effect ---------------------


def fallback_cut_then_storm(primary: str, fallback: str) -> Any:
    """The primary is overloaded; the fallback continues, drops, then is overloaded too."""
    answered: list[RecordedRequest] = []
    cont = continuing()

    def respond(request: RecordedRequest) -> Scenario:
        if request.body.get("model") == primary or answered:
            return Scenario(fault=Fault.overloaded())
        answered.append(request)
        scenario = cont(request)
        return Scenario(text=scenario.text, fault=Fault.drop_after_events(8))

    return respond


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_new_wrapper_resumes_a_turn_on_the_fallback_that_was_in_effect(
    pair: tuple[str, str], mode: str, server: LoopbackProvider, sleeps: Sleeps
) -> None:
    primary, fallback = pair
    store = InMemoryStreamCheckpointStore()
    run_id = uuid.uuid4()
    config: Any = {"run_id": run_id}

    def process() -> RecoveringChatModel:
        return RecoveringChatModel(
            model=chat_model(primary, server),
            fallbacks=[chat_model(fallback, server)],
            retry_policy=policy(sleeps, max_continuations=1),
            store=store,
        )

    server.enqueue(cut_answer(primary))
    server.default = fallback_cut_then_storm(primary, fallback)
    with pytest.raises(StreamInterruptedError):
        await call(process(), "invoke" if mode == "sync" else "ainvoke", config=config)
    record = store.get(str(run_id))
    assert record is not None
    ids = {OPENAI: OPENAI_ID, ANTHROPIC: ANTHROPIC_ID}
    assert record.model == ids[fallback]
    assert [span.model for span in record.model_spans] == [ids[primary], ids[fallback]]
    saved = record.partial_text
    assert ANSWER.startswith(saved)
    assert len(saved) > record.model_spans[1].start

    server.reset()
    server.default = storm(primary, continuing())
    message, chunks = await call(
        process(), "stream" if mode == "sync" else "astream", config=config
    )
    assert streamed_text(chunks) == ANSWER  # the saved part replayed, then the rest
    assert to(primary) == []
    [request] = to(fallback)
    assert _text_of(last_assistant(request)) == saved.rstrip()
    awaken = message.response_metadata["awaken"]
    assert awaken["resumed"] is True
    assert [(m["model"], m["start"]) for m in awaken["models"]] == [
        (ids[primary], 0),
        (ids[fallback], record.model_spans[1].start),
    ]
    assert awaken["models"][-1]["end"] == len(ANSWER)
    assert store.get(str(run_id)) is None


async def test_a_wrapper_without_that_fallback_ignores_the_checkpoint(
    server: LoopbackProvider, sleeps: Sleeps, caplog: pytest.LogCaptureFixture
) -> None:
    store = InMemoryStreamCheckpointStore()
    run_id = uuid.uuid4()
    server.enqueue(cut_answer(OPENAI))
    server.default = fallback_cut_then_storm(OPENAI, ANTHROPIC)
    first = RecoveringChatModel(
        model=chat_model(OPENAI, server),
        fallbacks=[chat_model(ANTHROPIC, server)],
        retry_policy=policy(sleeps, max_continuations=1),
        store=store,
    )
    with pytest.raises(StreamInterruptedError):
        first.invoke("Tell me about the lighthouse", config={"run_id": run_id})

    server.reset()
    server.default = Scenario(text=ANSWER)
    alone = RecoveringChatModel(
        model=chat_model(OPENAI, server), retry_policy=policy(sleeps), store=store
    )
    message = alone.invoke("Tell me about the lighthouse", config={"run_id": run_id})
    assert message.content == ANSWER
    assert message.response_metadata["awaken"]["resumed"] is False
    [request] = to(OPENAI)
    assert [m["role"] for m in request.messages] == ["user"]
    assert ANTHROPIC_ID in caplog.text


# -- settings ------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [[object()], ["not a model", 3], "openai:gpt-4o-mini"])
async def test_a_fallback_that_is_not_a_chat_model_is_refused(
    bad: Any, server: LoopbackProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "x")
    with pytest.raises(ValueError, match="fallbacks"):
        RecoveringChatModel(model=chat_model(OPENAI, server), fallbacks=bad)


async def test_a_fallback_string_is_resolved_once_with_init_chat_model(
    server: LoopbackProvider, sleeps: Sleeps, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "x")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)
    server.default = storm(OPENAI, continuing())
    model = RecoveringChatModel(
        model=chat_model(OPENAI, server),
        fallbacks=[f"anthropic:{ANTHROPIC}"],
        retry_policy=policy(sleeps, max_attempts=1),
    )
    from langchain_anthropic import ChatAnthropic

    [fallback] = model.fallbacks
    assert isinstance(fallback, ChatAnthropic)
    message = model.invoke([HumanMessage("Tell me about the lighthouse")])
    assert message.content == ANSWER
    assert (len(to(OPENAI)), len(to(ANTHROPIC))) == (1, 1)


# -- agents: StreamRecoveryMiddleware(fallbacks=[...]) ----------------------------------------

WEATHER_ARGS = {"city": "Paris"}
TOOL_TURN = Scenario(
    tool_calls=[ScriptedToolCall("weather", WEATHER_ARGS, id="call_weather")], chunk_size=2
)


def agent_responder(request: RecordedRequest) -> Scenario:
    """A model that calls the weather tool, then answers (continuing a cut answer)."""
    if answered_a_tool(request):
        return continuing()(request)
    return TOOL_TURN


class Weather:
    """The agent's tool; it counts its executions."""

    def __init__(self) -> None:
        self.calls: list[str] = []

        @tool
        def weather(city: str) -> str:
            """Current weather in a city."""
            self.calls.append(city)
            return "sunny, 22 degrees"

        self.tools: list[BaseTool] = [weather]


async def run_agent(agent: Any, entry: str) -> tuple[list[Any], str]:
    """Run the agent; return the thread and the text streamed in ``messages`` mode."""
    state = {"messages": [HumanMessage("Weather in Paris?")]}
    if entry == "invoke":
        return agent.invoke(state)["messages"], ""
    if entry == "ainvoke":
        return (await agent.ainvoke(state))["messages"], ""
    final: dict[str, Any] = {}
    streamed: list[str] = []
    if entry == "stream":
        parts: Any = agent.stream(state, stream_mode=["messages", "values"])
    else:
        parts = [p async for p in agent.astream(state, stream_mode=["messages", "values"])]
    for kind, data in parts:
        if kind == "values":
            final = data
        elif isinstance(data[0], AIMessageChunk):
            streamed.append(data[0].text)
    return final["messages"], "".join(streamed)


AGENT_FAULTS = {
    # the answer is cut mid text, then the primary is overloaded: the fallback continues it
    "mid_text": [TOOL_TURN, Scenario(text=ANSWER, fault=Fault.drop_after_events(8))],
    # the tool call is cut inside its arguments: nothing was released, the fallback asks again
    "mid_tool_arguments": [
        Scenario(
            tool_calls=[ScriptedToolCall("weather", WEATHER_ARGS, id="call_cut")],
            chunk_size=2,
            fault=Fault.drop_after_events(5),
        )
    ],
}


@pytest.mark.parametrize("fault", list(AGENT_FAULTS))
async def test_agent_turn_moves_to_the_fallback_and_the_thread_holds_one_message_per_turn(
    fault: str, entry: str, server: LoopbackProvider, sleeps: Sleeps
) -> None:
    for scenario in AGENT_FAULTS[fault]:
        server.enqueue(dataclasses.replace(scenario, provider="openai"))
    server.default = storm(OPENAI, agent_responder)
    weather = Weather()
    agent = create_agent(
        chat_model(OPENAI, server),
        weather.tools,
        middleware=[
            StreamRecoveryMiddleware(
                retry_policy=policy(sleeps, max_attempts=2, max_continuations=1),
                fallbacks=[chat_model(ANTHROPIC, server)],
            )
        ],
    )

    thread, streamed = await run_agent(agent, entry)

    assert [type(m).__name__ for m in thread] == [
        "HumanMessage",
        "AIMessage",
        "ToolMessage",
        "AIMessage",
    ]
    call_turn, answer_turn = thread[1], thread[3]
    assert [(c["name"], c["args"]) for c in call_turn.tool_calls] == [("weather", WEATHER_ARGS)]
    assert call_turn.invalid_tool_calls == []
    assert weather.calls == ["Paris"]  # the tool ran once
    assert answer_turn.text == ANSWER
    if entry in ("stream", "astream"):
        assert streamed == ANSWER  # every token once, the seam not repeated
    models = [m["model"] for m in answer_turn.response_metadata["awaken"]["models"]]
    assert models == [OPENAI_ID, ANTHROPIC_ID]
    if fault == "mid_text":
        [request] = to(ANTHROPIC)  # the continuation of the answer, tool result included
        assert answered_a_tool(request)
        assert request.messages[-1]["role"] == "user"
        assert ANSWER.startswith(_text_of(last_assistant(request)))
        assert call_turn.response_metadata["awaken"]["models"][0]["model"] == OPENAI_ID
    else:
        assert [c["id"] for c in call_turn.tool_calls] == ["call_weather"]  # the fallback's


async def test_middleware_refuses_a_fallback_that_is_not_a_chat_model() -> None:
    with pytest.raises(ValueError, match="fallbacks"):
        StreamRecoveryMiddleware(fallbacks=[object()])  # type: ignore[list-item]


# -- a replacement process after SIGKILL ------------------------------------------------------

CHILD = """
import sys, uuid
from langchain_anthropic import ChatAnthropic
from langchain_openai import ChatOpenAI
from awaken_langchain import DiskCacheStreamCheckpointStore, RecoveringChatModel, RetryPolicy

base, store_dir, run_id = sys.argv[1:4]
model = RecoveringChatModel(
    model=ChatOpenAI(model="gpt-4o-mini", base_url=base + "/v1", api_key="x", max_retries=0),
    fallbacks=[ChatAnthropic(model="claude-loopback", base_url=base, api_key="x", max_retries=0)],
    retry_policy=RetryPolicy(max_continuations=1, overload_deadline=None, initial_delay=0.0),
    store=DiskCacheStreamCheckpointStore(store_dir),
    checkpoint_every_chunks=1,
)
for _ in model.stream("Tell me about the lighthouse", config={"run_id": uuid.UUID(run_id)}):
    pass
"""


def kill_once_the_fallback_wrote(store_dir: Path, base_url: str, run_id: uuid.UUID) -> str:
    """Run the child until its checkpoint holds the fallback's own words; SIGKILL it.

    Returns the saved text. Waiting here is on another process writing its
    store, not on a backoff.
    """
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, base_url, str(store_dir), str(run_id)],
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and child.poll() is None:
            if (store_dir / "cache.db").exists():
                try:  # the child may still be creating the database's tables
                    with DiskCacheStreamCheckpointStore(store_dir, read_only=True) as store:
                        record = store.get(str(run_id))
                except StreamCheckpointError:
                    record = None
                if (
                    record is not None
                    and record.model == ANTHROPIC_ID
                    and len(record.model_spans) == 2
                    and len(record.partial_text) > record.model_spans[1].start
                ):
                    child.send_signal(signal.SIGKILL)
                    assert child.wait(30) == -signal.SIGKILL
                    return record.partial_text
            time.sleep(0.05)
        pytest.fail(f"the child never saved the fallback's words (exit {child.poll()})")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(30)


@pytest.mark.slow
async def test_after_sigkill_on_the_fallback_a_replacement_process_finishes_on_the_fallback(
    server: LoopbackProvider, sleeps: Sleeps, tmp_path: Path
) -> None:
    rest = continuing()

    def stall_on_the_fallback(request: RecordedRequest) -> Scenario:
        if request.body.get("model") == OPENAI:
            return Scenario(fault=Fault.overloaded())
        scenario = rest(request)  # the fallback continues, then hangs mid-answer
        return Scenario(text=scenario.text, fault=Fault.stall(120.0, after_events=12))

    server.enqueue(cut_answer(OPENAI))
    server.default = stall_on_the_fallback
    store_dir = tmp_path / "checkpoints"
    run_id = uuid.uuid4()
    saved = kill_once_the_fallback_wrote(store_dir, server.url, run_id)
    assert len(to(OPENAI)) == 2  # the cut answer, one 529

    server.reset()
    server.default = storm(OPENAI, continuing())
    store = DiskCacheStreamCheckpointStore(store_dir)
    replacement = RecoveringChatModel(
        model=chat_model(OPENAI, server),
        fallbacks=[chat_model(ANTHROPIC, server)],
        retry_policy=policy(sleeps, max_continuations=1),
        store=store,
    )
    message, chunks = await call(replacement, "stream", config={"run_id": run_id})
    assert streamed_text(chunks) == ANSWER
    assert to(OPENAI) == []  # the replacement went on with the model in effect
    [request] = to(ANTHROPIC)
    assert _text_of(last_assistant(request)) == saved.rstrip()
    awaken = message.response_metadata["awaken"]
    assert awaken["resumed"] is True
    assert [m["model"] for m in awaken["models"]] == [OPENAI_ID, ANTHROPIC_ID]
    assert store.get(str(run_id)) is None


# -- budgets and one-document requests ------------------------------------------------------


async def test_the_deadline_bounds_the_whole_turn_across_models(
    server: LoopbackProvider, sleeps: Sleeps
) -> None:
    server.default = Scenario(fault=Fault.overloaded())
    model = RecoveringChatModel(
        model=chat_model(OPENAI, server),
        fallbacks=[chat_model(ANTHROPIC, server)],
        retry_policy=policy(
            sleeps,
            max_attempts=3,
            overloaded_initial_delay=1.0,
            multiplier=1.0,
            jitter=0.0,
            deadline=3.5,
        ),
    )
    with pytest.raises(StreamInterruptedError, match=r"RetryPolicy.deadline=3.5"):
        await model.ainvoke("Tell me about the lighthouse")
    # the primary: 3 requests, 2 s of waits; the fallback's own budget would allow 3
    # requests, but its second retry would end past 3.5 s from the start of the turn
    assert (len(to(OPENAI)), len(to(ANTHROPIC))) == (3, 2)
    assert sleeps.waits == [1.0, 1.0, 0.0, 1.0]


class Answer(BaseModel):
    """An answer."""

    value: int


async def test_structured_output_moves_only_to_a_fallback_of_the_primarys_class(
    server: LoopbackProvider, sleeps: Sleeps
) -> None:
    from langchain_openai import ChatOpenAI

    def respond(request: RecordedRequest) -> Scenario:
        if request.body.get("model") == "gpt-4o":
            return Scenario(text='{"value": 42}')
        return Scenario(fault=Fault.overloaded())

    server.default = respond
    same_class = ChatOpenAI(
        model="gpt-4o", base_url=server.base_url_openai, api_key="x", max_retries=0
    )
    model = RecoveringChatModel(
        model=chat_model(OPENAI, server),
        fallbacks=[chat_model(ANTHROPIC, server), same_class],
        retry_policy=policy(sleeps, max_attempts=1),
    )
    result = await model.with_structured_output(Answer).ainvoke("the answer")
    assert result == Answer(value=42)
    assert [r.body["model"] for r in server.requests] == [OPENAI, "gpt-4o"]
    assert server.requests[1].body["response_format"] == server.requests[0].body["response_format"]


async def test_a_fallback_continuing_its_own_answer_gets_its_own_thinking_back(
    server: LoopbackProvider, sleeps: Sleeps
) -> None:
    from langchain_anthropic import ChatAnthropic

    thinking = [ScriptedThinking("Describe the keeper's evening in order.")]
    rest = continuing()
    first: list[RecordedRequest] = []

    def respond(request: RecordedRequest) -> Scenario:
        if request.body.get("model") == ANTHROPIC:
            return Scenario(fault=Fault.overloaded())  # the primary, before any output
        if not first:
            first.append(request)
            return Scenario(
                text=ANSWER, thinking=thinking, chunk_size=6, fault=Fault.drop_after_events(24)
            )
        return rest(request)

    server.default = respond

    def thinker(name: str) -> ChatAnthropic:
        return ChatAnthropic(  # type: ignore[call-arg]
            model=name,
            base_url=server.base_url_anthropic,
            api_key="x",
            max_retries=0,
            max_tokens=4096,
            thinking={"type": "enabled", "budget_tokens": 1024},
        )

    model = RecoveringChatModel(
        model=thinker(ANTHROPIC),
        fallbacks=[thinker("claude-fallback")],
        retry_policy=policy(sleeps, max_attempts=1),
    )
    message, chunks = await call(model, "stream")
    assert streamed_text(chunks) == ANSWER
    continuation = to("claude-fallback")[-1]
    assert continuation.rejected_by is None
    sent = last_assistant(continuation)
    assert sent[0]["type"] == "thinking"  # sent back, signed, to the model that wrote it
    assert sent[0]["signature"]
    assert [m["model"] for m in message.response_metadata["awaken"]["models"]] == [
        ANTHROPIC_ID,
        "anthropic-chat:claude-fallback",
    ]


async def test_a_one_model_checkpoint_is_written_as_before_and_spans_round_trip() -> None:
    from awaken_langchain.checkpoint import ModelSpan, decode_checkpoint, encode_checkpoint

    alone = StreamCheckpoint(run_id="r", model=OPENAI_ID, partial_text="Half")
    assert "model_spans" not in json.loads(encode_checkpoint(alone))
    moved = alone.model_copy(
        update={
            "model": ANTHROPIC_ID,
            "model_spans": (ModelSpan(model=OPENAI_ID), ModelSpan(model=ANTHROPIC_ID, start=4)),
        }
    )
    assert decode_checkpoint(encode_checkpoint(moved)) == moved


async def test_tools_bound_for_openai_are_bound_for_anthropic_with_the_same_choices(
    server: LoopbackProvider,
) -> None:
    from awaken_langchain.fallback import call_kwargs_for

    openai, anthropic = chat_model(OPENAI, server), chat_model(ANTHROPIC, server)
    bound = openai.bind_tools([transfer], tool_choice="auto", parallel_tool_calls=False)
    kwargs = {**bound.kwargs, "logprobs": True}  # type: ignore[attr-defined]
    moved = call_kwargs_for(openai, anthropic, kwargs)
    assert [t["name"] for t in moved["tools"]] == ["transfer"]
    assert moved["tools"][0]["input_schema"]["required"] == ["to", "amount"]
    assert moved["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}
    assert "logprobs" not in moved  # OpenAI's own argument stays with OpenAI
    back = call_kwargs_for(anthropic, openai, moved)
    assert back["tools"][0]["function"]["name"] == "transfer"
    assert back["tool_choice"] == "auto"
    assert back["parallel_tool_calls"] is False
    same = call_kwargs_for(openai, chat_model(OPENAI, server), kwargs)
    assert same == kwargs


@pytest.mark.parametrize("surface", ["responses/v1", "v0"])
async def test_responses_reasoning_items_stay_in_the_answer_and_are_not_sent_to_anthropic(
    surface: str, entry: str, server: LoopbackProvider, sleeps: Sleeps
) -> None:
    from langchain_openai import ChatOpenAI

    reasoner = "gpt-5-mini"
    summary = "Walk through the keeper's evening."
    server.enqueue(
        Scenario(
            text=ANSWER,
            thinking=[ScriptedThinking(summary)],
            chunk_size=6,
            provider="openai-responses",
            fault=Fault.drop_after_events(24),
        )
    )
    server.default = storm(reasoner, continuing())
    model = RecoveringChatModel(
        model=ChatOpenAI(
            model=reasoner,
            base_url=server.base_url_openai,
            api_key="x",
            max_retries=0,
            use_responses_api=True,
            output_version=surface,
            include=["reasoning.encrypted_content"],
        ),
        fallbacks=[chat_model(ANTHROPIC, server)],
        retry_policy=policy(sleeps, max_continuations=1),
    )
    message, chunks = await call(model, entry)
    assert _text_of(message.content) == ANSWER
    if chunks:
        assert streamed_text(chunks) == ANSWER
    assert len(to(reasoner)) == 2  # the cut answer, one 529
    [request] = to(ANTHROPIC)
    sent = last_assistant(request)
    assert isinstance(sent, str)
    assert sent
    assert ANSWER.startswith(sent)
    assert message.response_metadata["awaken"]["models"][1]["start"] > 0
    body = json.dumps(request.body)
    assert "encrypted_content" not in body
    assert summary not in body
    if surface == "v0":
        reasoning = message.additional_kwargs["reasoning"]
    else:
        [reasoning] = [b for b in message.content if b["type"] == "reasoning"]
    assert [s["text"] for s in reasoning["summary"]] == [summary]
    assert reasoning["encrypted_content"]


async def test_connections_that_keep_dropping_move_the_turn_to_the_fallback(
    server: LoopbackProvider, sleeps: Sleeps
) -> None:
    rest = continuing()

    def respond(request: RecordedRequest) -> Scenario:
        if request.body.get("model") == ANTHROPIC:  # every continuation breaks at once
            return Scenario(text=rest(request).text, fault=Fault.drop_after_events(2))
        return rest(request)

    server.enqueue(cut_answer(ANTHROPIC))
    server.default = respond
    model = RecoveringChatModel(
        model=chat_model(ANTHROPIC, server),
        fallbacks=[chat_model(OPENAI, server)],
        retry_policy=policy(sleeps, max_continuations=2),
    )
    events = Events()
    message, chunks = await call(model, "astream", config={"callbacks": [events]})
    assert streamed_text(chunks) == ANSWER
    assert (len(to(ANTHROPIC)), len(to(OPENAI))) == (3, 1)
    [event] = events.named("awaken_fallback")
    assert event["cause"] == "connection"
    assert [i["kind"] for i in message.response_metadata["awaken"]["interruptions"]] == [
        "connection"
    ] * 3


# -- the arguments a fallback of another class gets ------------------------------------------

PROVIDER_ONLY = {
    # OpenAI Chat Completions' own: the Anthropic SDK refuses them
    OPENAI: {"logprobs": True, "top_logprobs": 2, "stream_options": {"include_usage": True}},
    # Anthropic's own: the OpenAI SDK refuses them
    ANTHROPIC: {"cache_control": {"type": "ephemeral"}, "top_k": 5},
}


@pytest.mark.parametrize("with_tools", [False, True], ids=["text", "tools"])
async def test_a_fallback_of_another_class_gets_none_of_the_primarys_own_arguments(
    pair: tuple[str, str], with_tools: bool, entry: str, server: LoopbackProvider, sleeps: Sleeps
) -> None:
    primary, fallback = pair
    server.enqueue(cut_answer(primary))
    server.default = storm(primary, continuing())
    model: Any = RecoveringChatModel(
        model=chat_model(primary, server),
        fallbacks=[chat_model(fallback, server)],
        retry_policy=policy(sleeps, max_continuations=1),
    )
    if with_tools:
        model = model.bind_tools([transfer])
    model = model.bind(**PROVIDER_ONLY[primary])

    message, chunks = await call(model, entry, stop=["THE END"])

    assert _text_of(message.content) == ANSWER
    if chunks:
        assert streamed_text(chunks) == ANSWER
    first = to(primary)[0]
    for name in PROVIDER_ONLY[primary]:  # the primary got them all
        assert name in first.body
    [request] = to(fallback)
    for name in PROVIDER_ONLY[primary]:
        assert name not in request.body
    stop = request.body["stop"] if fallback == OPENAI else request.body["stop_sequences"]
    assert stop == ["THE END"]  # portable arguments pass
    if with_tools:
        [tool] = request.body["tools"]
        assert (tool["function"]["name"] if fallback == OPENAI else tool["name"]) == "transfer"


async def test_a_fallback_of_the_primarys_class_gets_the_primarys_own_arguments(
    server: LoopbackProvider, sleeps: Sleeps
) -> None:
    other = "gpt-4o"
    server.enqueue(cut_answer(OPENAI))
    server.default = storm(OPENAI, continuing())
    model = RecoveringChatModel(
        model=chat_model(OPENAI, server),
        fallbacks=[loopback_client("openai", server, model=other)],
        retry_policy=policy(sleeps, max_continuations=1),
    ).bind(**PROVIDER_ONLY[OPENAI])

    message = await model.ainvoke("Tell me about the lighthouse")

    assert message.content == ANSWER
    [request] = [r for r in server.requests if r.body.get("model") == other]
    assert request.body["logprobs"] is True
    assert request.body["top_logprobs"] == 2


async def test_an_agent_with_anthropic_prompt_caching_falls_back_to_openai(
    entry: str, server: LoopbackProvider, sleeps: Sleeps
) -> None:
    from langchain_anthropic.middleware import AnthropicPromptCachingMiddleware

    server.enqueue(dataclasses.replace(TOOL_TURN, provider="anthropic"))
    server.default = storm(ANTHROPIC, agent_responder)
    weather = Weather()
    agent = create_agent(
        chat_model(ANTHROPIC, server),
        weather.tools,
        system_prompt="You report the weather.",
        middleware=[
            AnthropicPromptCachingMiddleware(unsupported_model_behavior="raise"),
            StreamRecoveryMiddleware(
                retry_policy=policy(sleeps, max_attempts=2), fallbacks=[chat_model(OPENAI, server)]
            ),
        ],
    )

    thread, _ = await run_agent(agent, entry)

    assert [type(m).__name__ for m in thread] == [
        "HumanMessage",
        "AIMessage",
        "ToolMessage",
        "AIMessage",
    ]
    assert weather.calls == ["Paris"]
    assert thread[3].text == ANSWER
    first = to(ANTHROPIC)[0]
    assert first.body["cache_control"] == {"type": "ephemeral", "ttl": "5m"}
    [request] = to(OPENAI)  # the answer after the tool ran, on the fallback
    assert "cache_control" not in request.body
    [tool] = request.body["tools"]
    assert tool["function"]["name"] == "weather"
    assert "cache_control" not in json.dumps(request.body["tools"])
    assert request.rejected_by is None


# -- the shape of an answer a fallback finishes with a tool call ------------------------------


async def test_an_answer_a_fallback_ends_with_a_tool_call_keeps_the_shape_it_began_with(
    pair: tuple[str, str], entry: str, server: LoopbackProvider, sleeps: Sleeps
) -> None:
    primary, fallback = pair
    server.enqueue(cut_answer(primary))
    call_tool = [ScriptedToolCall("transfer", ARGS, id="call_after_text")]
    server.default = storm(primary, continuing(tool_calls=call_tool, chunk_size=4))
    model = RecoveringChatModel(
        model=chat_model(primary, server),
        fallbacks=[chat_model(fallback, server)],
        retry_policy=policy(sleeps, max_continuations=1),
    ).bind_tools([transfer])

    message, chunks = await call(model, entry)

    assert [(c["id"], c["name"], c["args"]) for c in message.tool_calls] == [
        ("call_after_text", "transfer", ARGS)
    ]
    assert message.invalid_tool_calls == []
    if primary == OPENAI:  # began as a string: a string, as the bare model answers
        assert message.content == ANSWER
        assert all(isinstance(c.content, str) for c in chunks)
    else:  # began as content blocks: text blocks only, the call is in tool_calls
        assert isinstance(message.content, list)
        assert _text_of(message.content) == ANSWER
        assert all(isinstance(c.content, list) for c in chunks)
    if chunks:
        assert streamed_text(chunks) == ANSWER
    assert len(to(fallback)) == 1
