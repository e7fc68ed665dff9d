"""StreamCheckpointHandler: any chat model's streamed turn, checkpointed from callbacks."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessageChunk, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, LLMResult
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from transport_errors import raises_cut

from awaken_langchain import (
    AsyncStreamCheckpointHandler,
    DiskCacheStreamCheckpointStore,
    FileStreamCheckpointStore,
    InMemoryStreamCheckpointStore,
    RecoveringChatModel,
    StreamCheckpoint,
    StreamCheckpointHandler,
    StreamCheckpointWarning,
)
from awaken_langchain.recovery import DEFAULT_CONTINUATION_PROMPT
from awaken_langchain.retry import RetryPolicy
from awaken_langchain.testing import Fault, LoopbackProvider, Scenario
from awaken_langchain.testing.scripted import ScriptedChatModel, finish, text, tool_call


async def _no_wait(_seconds: float) -> None:
    return None


NO_WAIT = RetryPolicy(sleep=lambda _s: None, async_sleep=_no_wait)


def reset() -> ConnectionResetError:
    return ConnectionResetError("connection reset by peer")


class Ticks:
    """A clock that never advances by itself: the cadence is counted in chunks."""

    def __call__(self) -> float:
        return 0.0


@pytest.fixture
def store(tmp_path: Path) -> Iterator[DiskCacheStreamCheckpointStore]:
    with DiskCacheStreamCheckpointStore(tmp_path / "checkpoints") as opened:
        yield opened


def drain(stream: Iterator[Any], into: list[str] | None = None) -> None:
    """Consume a stream, keeping each chunk's text as it arrives."""
    for chunk in stream:
        if into is not None:
            into.append(str(chunk.content))


async def adrain(stream: Any) -> None:
    """Consume an async stream, yielding to other tasks between chunks."""
    async for _ in stream:
        await asyncio.sleep(0)


def handler_for(store: Any, **settings: Any) -> StreamCheckpointHandler:
    settings.setdefault("clock", Ticks())
    return StreamCheckpointHandler(store, **settings)


def test_no_more_than_the_configured_chunks_are_at_risk_while_streaming(
    store: DiskCacheStreamCheckpointStore,
) -> None:
    model = ScriptedChatModel(scripts=[[*text("y" * 40, size=1), finish()]])
    handler = handler_for(store, checkpoint_every_chunks=8)
    run_id = uuid.uuid4()
    stream = model.stream("q", config={"callbacks": [handler], "run_id": run_id})
    seen = ""
    for _ in range(21):
        seen += str(next(stream).content)
        saved = store.get(str(run_id))
        assert len(seen) - len(saved.partial_text if saved else "") <= 8
    rest = "".join(str(c.content) for c in stream)
    assert seen + rest == "y" * 40


class SteppedClock:
    """A clock that advances a fixed step each time it is read."""

    def __init__(self, step: float) -> None:
        self.now = 0.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_slow_output_is_written_after_checkpoint_every_seconds(
    store: DiskCacheStreamCheckpointStore,
) -> None:
    model = ScriptedChatModel(scripts=[[*text("slow words here", size=5), finish()]])
    handler = StreamCheckpointHandler(
        store, checkpoint_every_chunks=1000, checkpoint_every_seconds=1.0, clock=SteppedClock(0.6)
    )
    run_id = uuid.uuid4()
    stream = model.stream("q", config={"callbacks": [handler], "run_id": run_id})
    first = str(next(stream).content)
    assert store.get(str(run_id)) is None  # 0.6 s of output: not yet due
    second = str(next(stream).content)
    saved = store.get(str(run_id))
    assert saved is not None
    assert saved.partial_text == first + second  # 1.2 s: written although only 2 chunks
    drain(stream)


def test_a_completed_turn_leaves_no_checkpoint(store: DiskCacheStreamCheckpointStore) -> None:
    model = ScriptedChatModel(scripts=[[*text("z" * 30, size=1), finish()]])
    handler = handler_for(store, checkpoint_every_chunks=4)
    run_id = uuid.uuid4()
    assert (
        "".join(
            str(c.content)
            for c in model.stream("q", config={"callbacks": [handler], "run_id": run_id})
        )
        == "z" * 30
    )
    assert store.get(str(run_id)) is None
    assert handler.active_runs == 0


def test_an_interrupted_turn_is_checkpointed_and_a_replacement_finishes_it(
    store: DiskCacheStreamCheckpointStore,
) -> None:
    first = ScriptedChatModel(scripts=[[*text("Once upon a time "), reset()]])
    handler = handler_for(store, checkpoint_every_chunks=100)  # only the failure writes
    run_id = uuid.uuid4()
    with pytest.raises(ConnectionResetError):
        for _ in first.stream("story", config={"callbacks": [handler], "run_id": run_id}):
            pass
    saved = store.get(str(run_id))
    assert saved is not None
    assert saved.partial_text == "Once upon a time "
    assert saved.model == "scripted:scripted"  # named as the wrapper names its inner model

    inner = ScriptedChatModel(scripts=[[*text("there was a dragon."), finish()]])
    replacement = RecoveringChatModel(model=inner, store=store, retry_policy=NO_WAIT)
    answer = replacement.invoke("story", config={"run_id": run_id})
    assert answer.content == "Once upon a time there was a dragon."
    assert len(inner.calls) == 1
    assert inner.calls[0].messages[-1].content == DEFAULT_CONTINUATION_PROMPT
    assert store.get(str(run_id)) is None


def test_tool_calls_are_captured_whole_and_the_cut_off_call_as_in_flight(
    store: DiskCacheStreamCheckpointStore,
) -> None:
    steps = [
        *tool_call("lookup", '{"q": "weather"}', id="c1", index=0),
        *tool_call("transfer", '{"to": "bob", "amount": 10', id="c2", index=1),
        reset(),
    ]
    model = ScriptedChatModel(scripts=[steps])
    handler = handler_for(store)
    run_id = uuid.uuid4()
    with pytest.raises(ConnectionResetError):
        model.invoke("q", config={"callbacks": [handler], "run_id": run_id}, stream=True)
    saved = store.get(str(run_id))
    assert saved is not None
    assert [(c.name, c.args) for c in saved.completed_tool_calls] == [("lookup", {"q": "weather"})]
    assert saved.in_flight_tool_call is not None
    assert saved.in_flight_tool_call.name == "transfer"
    assert saved.in_flight_tool_call.partial_args == '{"to": "bob", "amount": 10'


def test_the_partial_response_given_to_on_llm_error_is_checkpointed(
    store: DiskCacheStreamCheckpointStore,
) -> None:
    """LangChain hands the merged partial chunk to on_llm_error; it is enough on its own."""
    handler = handler_for(store)
    run_id = uuid.uuid4()
    handler.on_chat_model_start(
        {},
        [[HumanMessage("q")]],
        run_id=run_id,
        metadata={"ls_model_name": "gpt-4o-mini"},
        invocation_params={"_type": "openai-chat"},
    )
    partial = ChatGenerationChunk(message=AIMessageChunk(content="Partial from the error"))
    error_metadata = ChatGeneration(
        message=AIMessageChunk(content="", response_metadata={"status_code": 200})
    )
    handler.on_llm_error(
        RuntimeError("stream broke"),
        run_id=run_id,
        response=LLMResult(generations=[[partial], [error_metadata]]),
    )
    saved = store.get(str(run_id))
    assert saved is not None
    assert saved.partial_text == "Partial from the error"
    assert saved.model == "openai-chat:gpt-4o-mini"


def test_concurrent_runs_in_threads_are_kept_apart(
    store: DiskCacheStreamCheckpointStore,
) -> None:
    handler = handler_for(store, checkpoint_every_chunks=3)
    run_ids = [uuid.uuid4() for _ in range(8)]

    def one(n: int) -> None:
        model = ScriptedChatModel(scripts=[[*text(f"run {n} " * 10, size=2), reset()]])
        with pytest.raises(ConnectionResetError):
            for _ in model.stream("q", config={"callbacks": [handler], "run_id": run_ids[n]}):
                pass

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(one, range(8)))
    for n, run_id in enumerate(run_ids):
        saved = store.get(str(run_id))
        assert saved is not None
        assert saved.partial_text == f"run {n} " * 10
    assert handler.active_runs == 0


@pytest.mark.parametrize("kind", ["async", "sync-inline"])
async def test_concurrent_async_runs_are_kept_apart_and_in_order(
    store: DiskCacheStreamCheckpointStore, kind: str
) -> None:
    handler: Any = (
        AsyncStreamCheckpointHandler(store, checkpoint_every_chunks=2, clock=Ticks())
        if kind == "async"
        else handler_for(store, checkpoint_every_chunks=2)
    )
    run_ids = [uuid.uuid4() for _ in range(6)]

    async def one(n: int) -> None:
        model = ScriptedChatModel(scripts=[[*text(f"<{n}>" + "abc" * 10, size=1), reset()]])
        with pytest.raises(ConnectionResetError):
            await adrain(model.astream("q", config={"callbacks": [handler], "run_id": run_ids[n]}))

    await asyncio.gather(*(one(n) for n in range(6)))
    for n, run_id in enumerate(run_ids):
        saved = await store.aget(str(run_id))
        assert saved is not None
        assert saved.partial_text == f"<{n}>" + "abc" * 10


async def test_async_handler_deletes_the_checkpoint_of_a_completed_turn(
    store: DiskCacheStreamCheckpointStore,
) -> None:
    handler = AsyncStreamCheckpointHandler(store, checkpoint_every_chunks=2, clock=Ticks())
    model = ScriptedChatModel(scripts=[[*text("done " * 5, size=1), finish()]])
    run_id = uuid.uuid4()
    chunks = [
        c async for c in model.astream("q", config={"callbacks": [handler], "run_id": run_id})
    ]
    assert "".join(str(c.content) for c in chunks) == "done " * 5
    assert await store.aget(str(run_id)) is None


def test_a_failing_store_warns_and_never_fails_the_call(tmp_path: Path) -> None:
    store = FileStreamCheckpointStore(tmp_path / "store")
    (tmp_path / "store").rename(tmp_path / "moved")
    (tmp_path / "store").write_text("not a directory")
    model = ScriptedChatModel(scripts=[[*text("still fine", size=1), finish()]])
    handler = handler_for(store, checkpoint_every_chunks=2)
    with pytest.warns(StreamCheckpointWarning):
        answer = model.invoke("q", config={"callbacks": [handler]}, stream=True)
    assert answer.content == "still fine"


def test_a_handler_fenced_out_by_a_new_owner_stops_writing() -> None:
    store = InMemoryStreamCheckpointStore()
    model = ScriptedChatModel(scripts=[[*text("a" * 30, size=1), reset()]])
    handler = handler_for(store, checkpoint_every_chunks=4)
    run_id = uuid.uuid4()
    key = str(run_id)
    stream = model.stream("q", config={"callbacks": [handler], "run_id": run_id})
    for _ in range(10):
        next(stream)
    epoch = store.claim(key)  # a replacement process took the run over
    store.put(StreamCheckpoint(run_id=key, partial_text="the new owner's", epoch=epoch))
    with pytest.warns(StreamCheckpointWarning, match="fenced"), pytest.raises(ConnectionResetError):
        for _ in stream:
            pass
    saved = store.get(key)
    assert saved is not None
    assert saved.partial_text == "the new owner's"


def test_runs_of_the_recovering_wrapper_are_left_to_the_wrapper(
    store: DiskCacheStreamCheckpointStore,
) -> None:
    inner = ScriptedChatModel(scripts=[[*text("wrapped", size=1), finish()]])
    wrapper = RecoveringChatModel(model=inner, retry_policy=NO_WAIT)
    handler = handler_for(store, checkpoint_every_chunks=1)
    stream = wrapper.stream("q", config={"callbacks": [handler]})
    next(stream)
    assert handler.active_runs == 0
    assert store.list_run_ids() == []
    list(stream)


@tool
def lookup(q: str) -> str:
    """Look something up."""
    return f"result for {q}"


def test_every_model_run_of_an_agent_is_captured_and_released(
    store: DiskCacheStreamCheckpointStore,
) -> None:
    model = ScriptedChatModel(
        scripts=[
            [*tool_call("lookup", '{"q": "tides"}', id="c1"), finish("tool_calls")],
            [*text("High tide is at noon.", size=2), finish()],
        ]
    )
    writes: list[str] = []

    class Recording(InMemoryStreamCheckpointStore):
        def put(self, checkpoint: StreamCheckpoint) -> None:
            writes.append(checkpoint.run_id)
            super().put(checkpoint)

    recording = Recording()
    handler = handler_for(recording, checkpoint_every_chunks=2)
    agent = create_agent(model, tools=[lookup])
    streamed = list(
        agent.stream(
            {"messages": [HumanMessage("when is high tide?")]},
            config={"callbacks": [handler]},
            stream_mode="messages",  # the agent's model calls stream only in this mode
        )
    )
    assert "".join(str(m.content) for m, _ in streamed if m.type == "AIMessageChunk") == (
        "High tide is at noon."
    )
    assert len(set(writes)) == 2  # both model runs were checkpointed, under their own ids
    assert recording.list_run_ids() == []
    assert handler.active_runs == 0


def test_chat_openai_stream_cut_by_the_network_is_checkpointed_and_finished(
    loopback_provider: LoopbackProvider, store: DiskCacheStreamCheckpointStore
) -> None:
    server = loopback_provider
    server.enqueue(Scenario(text="The tide rises twice a day", fault=Fault.drop_after_events(4)))
    server.enqueue(Scenario(text=" because of the moon."))
    model = ChatOpenAI(
        model="gpt-4o-mini", base_url=server.base_url_openai, api_key="x", max_retries=0
    )
    handler = handler_for(store, checkpoint_every_chunks=100)
    run_id = uuid.uuid4()
    pieces: list[str] = []
    with pytest.raises(openai.APIConnectionError):
        drain(model.stream("tides?", config={"callbacks": [handler], "run_id": run_id}), pieces)
    received = "".join(pieces)
    saved = store.get(str(run_id))
    assert saved is not None
    assert saved.partial_text == received
    assert saved.partial_text
    assert saved.model == "openai-chat:gpt-4o-mini"

    replacement = RecoveringChatModel(model=model, store=store, retry_policy=NO_WAIT)
    answer = replacement.invoke("tides?", config={"run_id": run_id})
    assert answer.content == received + " because of the moon."
    assert len(server.requests_for("openai")) == 2


def test_chat_anthropic_stream_cut_mid_tool_call_is_checkpointed_with_its_text(
    loopback_provider: LoopbackProvider, store: DiskCacheStreamCheckpointStore
) -> None:
    from langchain_anthropic import ChatAnthropic

    from awaken_langchain.testing import ScriptedToolCall

    server = loopback_provider
    server.enqueue(
        Scenario(
            text="Checking the weather first.",
            tool_calls=[ScriptedToolCall("lookup", {"q": "weather in Lisbon"}, id="toolu_1")],
            fault=Fault.drop_after_events(12),
        )
    )
    model = ChatAnthropic(
        model="claude-sonnet-4-6",
        base_url=server.base_url_anthropic,
        api_key="x",
        max_retries=0,
    ).bind_tools([lookup])
    handler = handler_for(store, checkpoint_every_chunks=100)
    run_id = uuid.uuid4()
    with raises_cut(httpx2.RemoteProtocolError):
        drain(model.stream("weather?", config={"callbacks": [handler], "run_id": run_id}))
    saved = store.get(str(run_id))
    assert saved is not None
    assert saved.partial_text == "Checking the weather first."
    assert saved.completed_tool_calls == ()
    assert saved.in_flight_tool_call is not None
    assert saved.in_flight_tool_call.name == "lookup"
    assert saved.in_flight_tool_call.partial_args  # cut off: kept raw, never as a valid call
