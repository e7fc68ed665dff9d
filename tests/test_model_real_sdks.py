"""The fault matrix: RecoveringChatModel around the real ChatOpenAI and ChatAnthropic.

Both integrations talk to the loopback provider server through the official
SDKs (``max_retries=0``, so only the wrapper retries). Tests assert what the
caller saw, what the provider received, and what was retried.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage
from pydantic import BaseModel

from awaken_langchain import RecoveringChatModel, RetryPolicy, StreamInterruptedError
from awaken_langchain.recovery import DEFAULT_CONTINUATION_PROMPT
from awaken_langchain.seam import is_word_start
from awaken_langchain.testing import (
    Fault,
    LoopbackProvider,
    RecordedRequest,
    Scenario,
    ScriptedToolCall,
    continuation_responder,
)
from tests.conftest import Sleeps, loopback_client

# one event loop for the module: the SDKs' async clients are shared between tests
ASYNC = pytest.mark.asyncio(loop_scope="module")
"""Marks each async test: the SDKs' async clients are kept for the module's loop."""

ANSWER = "The quick brown fox jumps over the lazy dog, then naps in the warm afternoon sun."
PROVIDERS = ["openai", "anthropic"]


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content if isinstance(b, dict))


def continuing(full: str, overlap_words: int = 0) -> Any:
    """A model asked to continue: it resumes after the saved prefix."""
    return continuation_responder(Scenario(text=full), overlap_words=overlap_words)


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
def server(shared_server: LoopbackProvider) -> LoopbackProvider:
    """One server per module (clients are costly to build), reset for each test."""
    shared_server.reset()
    shared_server.default = continuing(ANSWER)
    return shared_server


def inner_model(provider: str, server: LoopbackProvider) -> BaseChatModel:
    return loopback_client(provider, server)


def wrapper(
    provider: str, server: LoopbackProvider, sleeps: Sleeps, **settings: Any
) -> RecoveringChatModel:
    policy = RetryPolicy(sleep=sleeps, async_sleep=sleeps.asleep, **settings.pop("policy", {}))
    return RecoveringChatModel(model=inner_model(provider, server), retry_policy=policy, **settings)


async def run(model: Any, mode: str, prompt: Any = "Tell me about the fox") -> list[AIMessageChunk]:
    if mode == "sync":
        return list(model.stream(prompt))
    return [chunk async for chunk in model.astream(prompt)]


def joined(chunks: list[AIMessageChunk]) -> str:
    return "".join(_text_of(c.content) for c in chunks)


def final(chunks: list[AIMessageChunk]) -> AIMessage:
    total = chunks[0]
    for chunk in chunks[1:]:
        total = total + chunk
    return AIMessage(**total.model_dump(exclude={"type", "tool_call_chunks", "chunk_position"}))


@pytest.fixture(params=PROVIDERS)
def provider(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=["sync", "async"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# -- before output ---------------------------------------------------------------------


@ASYNC
@pytest.mark.parametrize(
    "fault",
    [
        Fault.rate_limited(retry_after=3),
        Fault.overloaded(),
        Fault.server_error(500),
        Fault.server_error(502),
        Fault.server_error(503),
        Fault.drop_before_headers(),
    ],
    ids=["429", "529", "500", "502", "503", "drop-before-headers"],
)
async def test_retryable_failure_before_output_is_retried_invisibly(
    provider: str, mode: str, server: LoopbackProvider, sleeps: Sleeps, fault: Fault
) -> None:
    server.enqueue(Scenario(fault=fault))
    chunks = await run(wrapper(provider, server, sleeps), mode)
    assert joined(chunks) == ANSWER
    assert len(server.requests) == 2
    assert server.requests[0].messages == server.requests[1].messages
    assert final(chunks).response_metadata["awaken"]["plans"] == ["R4"]


@ASYNC
async def test_retry_after_hint_is_honoured_and_capped(
    provider: str, mode: str, server: LoopbackProvider, sleeps: Sleeps
) -> None:
    server.enqueue(Scenario(fault=Fault.rate_limited(retry_after=3600)))
    await run(wrapper(provider, server, sleeps), mode)
    assert sleeps.waits == [60.0]


@ASYNC
@pytest.mark.parametrize(
    "fault",
    [
        Fault.http_error(400),
        Fault.http_error(401),
        Fault.http_error(403),
        Fault.http_error(404),
        Fault.http_error(413),
        Fault.context_overflow(),
    ],
    ids=["400", "401", "403", "404", "413", "context-overflow"],
)
async def test_permanent_error_is_raised_as_the_provider_raised_it_after_one_request(
    provider: str, mode: str, server: LoopbackProvider, sleeps: Sleeps, fault: Fault
) -> None:
    server.enqueue(Scenario(fault=fault))
    with pytest.raises(Exception) as raised:
        await run(wrapper(provider, server, sleeps), mode)
    assert type(raised.value).__module__.split(".")[0] in {
        "openai",
        "anthropic",
        "langchain_openai",
        "langchain_anthropic",
    }
    assert not isinstance(raised.value, StreamInterruptedError)
    assert len(server.requests) == 1
    assert sleeps.waits == []


# -- after output -------------------------------------------------------------------------


@ASYNC
@pytest.mark.parametrize(
    "fault",
    [
        Fault.drop_after_events(6),
        Fault.drop_after_bytes(700),
        Fault.error_event(after_events=6),
        Fault.no_terminal_event(after_events=6),
        Fault.malformed_sse(after_events=6),
    ],
    ids=["drop-events", "drop-bytes", "sse-error-event", "no-terminal-event", "malformed-sse"],
)
async def test_interruption_after_output_is_continued_without_repeating_text(
    provider: str, mode: str, server: LoopbackProvider, sleeps: Sleeps, fault: Fault
) -> None:
    server.enqueue(Scenario(text=ANSWER, fault=fault))
    chunks = await run(wrapper(provider, server, sleeps), mode)
    assert joined(chunks) == ANSWER
    assert len(server.requests) == 2
    continuation = server.requests[1].messages
    assert continuation[-1]["role"] == "user"
    assert DEFAULT_CONTINUATION_PROMPT in json.dumps(continuation[-1])
    prefix = _text_of(continuation[-2]["content"])
    assert prefix
    assert ANSWER.startswith(prefix)
    assert prefix == prefix.rstrip()
    awaken = final(chunks).response_metadata["awaken"]
    assert awaken["plans"] == ["R1"]
    assert DEFAULT_CONTINUATION_PROMPT not in joined(chunks)


@ASYNC
@pytest.mark.parametrize("overlap_words", [2, 3, 5, 20])  # 20: the whole prefix again
async def test_words_repeated_at_the_seam_are_removed(
    provider: str, mode: str, server: LoopbackProvider, sleeps: Sleeps, overlap_words: int
) -> None:
    server.default = continuing(ANSWER, overlap_words=overlap_words)
    server.enqueue(Scenario(text=ANSWER, fault=Fault.drop_after_events(7)))
    chunks = await run(wrapper(provider, server, sleeps), mode)
    assert joined(chunks) == ANSWER
    assert final(chunks).response_metadata["awaken"]["regenerated_output_tokens"] >= 1


def restarting_with_a_space(full: str, words: int, fault_after: int | None = None) -> Any:
    """A model that restarts the prefix's last ``words`` words from the space before them.

    Its tokens carry their leading space, so the restart begins with one
    (``"… ant3 ant4"`` + ``" ant3 ant4 ant5 …"``). A first request is answered
    with the whole text, cut after ``fault_after`` events when that is set.
    """

    def respond(request: RecordedRequest) -> Scenario:
        assistant = [m for m in request.messages if m.get("role") == "assistant"]
        prefix = _text_of(assistant[-1]["content"]) if assistant else ""
        if not prefix:
            fault = None if fault_after is None else Fault.drop_after_events(fault_after)
            return Scenario(text=full, fault=fault)
        assert full.startswith(prefix)
        starts = [i for i in range(len(prefix)) if is_word_start(prefix, i)]
        restart = starts[-min(words, len(starts))]
        return Scenario(text=" " + full[restart:] if restart == 0 else full[restart - 1 :])

    return respond


@ASYNC
@pytest.mark.parametrize("overlap_words", [2, 3, 20])  # 20: the whole prefix again
@pytest.mark.parametrize("cut_after", [4, 7, 11])
async def test_words_repeated_from_the_space_before_them_are_removed(
    provider: str,
    mode: str,
    server: LoopbackProvider,
    sleeps: Sleeps,
    overlap_words: int,
    cut_after: int,
) -> None:
    server.default = restarting_with_a_space(ANSWER, overlap_words)
    server.enqueue(Scenario(text=ANSWER, fault=Fault.drop_after_events(cut_after)))
    chunks = await run(wrapper(provider, server, sleeps), mode)
    assert joined(chunks) == ANSWER
    assert _text_of(final(chunks).content) == ANSWER
    assert len(server.requests) == 2


@ASYNC
async def test_many_concurrent_turns_continued_after_a_spaced_restart_each_give_the_uncut_text(
    provider: str, server: LoopbackProvider, sleeps: Sleeps
) -> None:
    answer = " ".join(f"ant{n}" for n in range(1, 41)) + "."
    server.default = restarting_with_a_space(answer, 2, fault_after=6)
    model = wrapper(provider, server, sleeps)

    async def turn(number: int) -> str:
        return joined([c async for c in model.astream(f"turn {number}")])

    answers = await asyncio.gather(*(turn(n) for n in range(16)))
    assert answers == [answer] * 16
    assert len(server.requests) == 32  # every turn cut once and continued once


@ASYNC
async def test_stalled_stream_is_continued(
    provider: str, mode: str, server: LoopbackProvider, sleeps: Sleeps
) -> None:
    server.enqueue(Scenario(text=ANSWER, fault=Fault.stall(5.0, after_events=6)))
    model = wrapper(provider, server, sleeps, stream_idle_timeout=0.3)
    chunks = await run(model, mode)
    assert joined(chunks) == ANSWER
    assert final(chunks).response_metadata["awaken"]["interruptions"][0]["kind"] == "timeout"


@ASYNC
async def test_several_interruptions_in_one_turn(
    provider: str, mode: str, server: LoopbackProvider, sleeps: Sleeps
) -> None:
    server.enqueue(Scenario(text=ANSWER, fault=Fault.drop_after_events(5)))
    model = wrapper(provider, server, sleeps)

    answered = []

    def second(request: RecordedRequest) -> Scenario:
        scenario = continuing(ANSWER)(request)
        answered.append(request)
        if len(answered) == 1:
            return Scenario(text=scenario.text, fault=Fault.drop_after_events(6))
        return scenario

    server.default = second
    chunks_seen: list[AIMessageChunk] = await run(model, mode)
    assert joined(chunks_seen) == ANSWER
    assert len(server.requests) == 3
    assert final(chunks_seen).response_metadata["awaken"]["continuations"] == 2


@ASYNC
async def test_exhausted_recovery_raises_with_the_partial_answer(
    provider: str, mode: str, server: LoopbackProvider, sleeps: Sleeps
) -> None:
    server.default = Scenario(text=ANSWER, fault=Fault.drop_after_events(5))
    model = wrapper(provider, server, sleeps, policy={"max_continuations": 1})
    with pytest.raises(StreamInterruptedError) as raised:
        await run(model, mode)
    assert raised.value.partial is not None
    assert ANSWER.startswith(_text_of(raised.value.partial.content)[:10])
    assert len(server.requests) == 2


# -- tool calls --------------------------------------------------------------------------


def transfer(to: str, amount: int, confirm: bool = False) -> str:
    """Transfer money."""
    return f"sent {amount} to {to}"


ARGS = {"to": "alice", "amount": 100, "confirm": True}


@ASYNC
async def test_cut_off_tool_call_after_text_is_dropped_and_reissued(
    provider: str, mode: str, server: LoopbackProvider, sleeps: Sleeps
) -> None:
    cut = Scenario(
        text="Sending now.",
        tool_calls=[ScriptedToolCall("transfer", ARGS, id="call_1")],
        chunk_size=3,
        fault=Fault.drop_after_events(12),
    )
    retry = Scenario(tool_calls=[ScriptedToolCall("transfer", ARGS, id="call_2")])
    server.enqueue(cut, retry)
    model = wrapper(provider, server, sleeps).bind_tools([transfer])
    chunks = await run(model, mode)
    message = final(chunks)
    assert [(c["id"], c["args"]) for c in message.tool_calls] == [("call_2", ARGS)]
    assert message.invalid_tool_calls == []
    assert joined(chunks) == "Sending now."
    for chunk in chunks:
        for piece in chunk.tool_call_chunks:
            assert json.loads(piece["args"]) == ARGS  # only whole calls were yielded


@ASYNC
async def test_complete_tool_calls_finish_the_turn_when_a_later_call_is_cut_off(
    provider: str, mode: str, server: LoopbackProvider, sleeps: Sleeps
) -> None:
    calls = [
        ScriptedToolCall("transfer", {"to": "bob", "amount": 5, "confirm": True}, id="call_a"),
        ScriptedToolCall("transfer", ARGS, id="call_b"),
    ]
    server.enqueue(Scenario(tool_calls=calls, chunk_size=4, fault=Fault.drop_after_events(14)))
    model = wrapper(provider, server, sleeps).bind_tools([transfer])
    message = final(await run(model, mode))
    assert [c["id"] for c in message.tool_calls] == ["call_a"]
    assert [c["id"] for c in message.invalid_tool_calls] == ["call_b"]
    assert len(server.requests) == 1


@ASYNC
async def test_invoke_goes_through_the_same_recovery(
    provider: str, server: LoopbackProvider, sleeps: Sleeps
) -> None:
    server.enqueue(Scenario(text=ANSWER, fault=Fault.drop_after_events(6)))
    model = wrapper(provider, server, sleeps)
    message = await model.ainvoke([HumanMessage("Tell me about the fox")])
    assert message.content == ANSWER
    assert message.response_metadata["awaken"]["plans"] == ["R1"]


class Answer(BaseModel):
    """An answer."""

    value: int


@ASYNC
async def test_structured_output_keeps_the_wrapper_and_recovers(
    provider: str, mode: str, server: LoopbackProvider, sleeps: Sleeps
) -> None:
    if provider == "openai":
        good = Scenario(text='{"value": 42}')
    else:
        good = Scenario(tool_calls=[ScriptedToolCall("Answer", {"value": 42}, id="toolu_1")])
    server.enqueue(Scenario(fault=Fault.overloaded()), good)
    structured = wrapper(provider, server, sleeps).with_structured_output(Answer)
    if mode == "sync":
        result = structured.invoke("the answer")
    else:
        result = await structured.ainvoke("the answer")
    assert result == Answer(value=42)
    assert len(server.requests) == 2


# -- how a sync stream is read ------------------------------------------------------------


def _busy_readers() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "awaken-stream-pump")


def _paced(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(text=ANSWER, chunk_size=4, delay=0.05))  # about a second


@ASYNC
async def test_text_chunks_reach_the_caller_as_the_inner_models_own_messages(
    provider: str,
    mode: str,
    server: LoopbackProvider,
    sleeps: Sleeps,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a copy of every chunk would cost the caller as much as the inner model's own chunk
    made: list[Any] = []
    model = wrapper(provider, server, sleeps)
    cls = type(model.model)
    stream, astream = cls._stream, cls._astream

    def recorded(self: Any, *args: Any, **kwargs: Any) -> Any:
        inner = stream(self, *args, **kwargs)  # a local: the wrapper finds its socket
        for generation in inner:
            made.append(generation.message)
            yield generation

    async def arecorded(self: Any, *args: Any, **kwargs: Any) -> Any:
        async for generation in astream(self, *args, **kwargs):
            made.append(generation.message)
            yield generation

    monkeypatch.setattr(cls, "_stream", recorded)
    monkeypatch.setattr(cls, "_astream", arecorded)
    server.enqueue(Scenario(text=ANSWER, chunk_size=4))
    chunks = await run(model, mode)
    assert joined(chunks) == ANSWER
    text = [c for c in chunks if _text_of(c.content)]
    assert len(text) > 10
    # the first text is released by the general path (held while it could be whitespace)
    assert all(any(c is m for m in made) for c in text[1:])
    assert {c.id for c in chunks} == {chunks[-1].id}


def test_a_sync_sdk_stream_holds_no_reader_thread_after_its_first_chunk(
    provider: str, server: LoopbackProvider, sleeps: Sleeps
) -> None:
    """With the idle timeout on, the caller's thread reads an SDK stream itself once it
    has begun: no second thread wakes for every chunk, and none is held."""
    before = _busy_readers()
    _paced(server)
    stream = wrapper(provider, server, sleeps).stream("Tell me about the fox")
    seen = [next(stream) for _ in range(3)]
    settled = time.monotonic() + 1.0
    while _busy_readers() > before and time.monotonic() < settled:
        time.sleep(0.01)
    assert _busy_readers() == before
    seen += list(stream)
    assert joined(seen) == ANSWER
    assert len(server.requests) == 1


def test_a_sync_sdk_stream_its_caller_leaves_is_hung_up_at_once(
    provider: str, server: LoopbackProvider, sleeps: Sleeps
) -> None:
    _paced(server)
    stream = wrapper(provider, server, sleeps).stream("Tell me about the fox")
    for _ in range(3):
        next(stream)
    stream.close()
    left = time.monotonic()
    request = server.requests[0]
    while request.number not in server.hangups and time.monotonic() < left + 2.0:
        time.sleep(0.01)
    assert request.number in server.hangups  # the provider stops generating
    assert server.hangups[request.number] - left < 1.0


def test_a_slow_caller_of_a_sync_sdk_stream_is_not_taken_for_a_stall(
    provider: str, server: LoopbackProvider, sleeps: Sleeps
) -> None:
    """Only a wait for the provider counts against the idle timeout, not the caller's own time."""
    _paced(server)
    stream = wrapper(provider, server, sleeps, stream_idle_timeout=0.3).stream("Tell me")
    seen = []
    for _ in range(4):
        seen.append(next(stream))
        time.sleep(0.45)  # longer than the idle timeout, between reads
    seen += list(stream)
    assert joined(seen) == ANSWER
    assert len(server.requests) == 1
    assert not final(seen).response_metadata["awaken"]["interruptions"]
