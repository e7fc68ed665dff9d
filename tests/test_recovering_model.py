"""RecoveringChatModel against the scripted fault-injecting chat model."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, cast

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.exceptions import ModelAuthenticationError
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage
from langchain_core.messages.utils import message_chunk_to_message
from langchain_core.outputs import ChatGenerationChunk
from langchain_core.runnables import RunnableLambda, RunnableParallel
from pydantic import BaseModel, PrivateAttr

from awaken_langchain.errors import StreamInterruptedError
from awaken_langchain.model import RecoveringChatModel
from awaken_langchain.recovery import DEFAULT_CONTINUATION_PROMPT
from awaken_langchain.retry import RetryPolicy
from awaken_langchain.testing.scripted import (
    ScriptedChatModel,
    Stall,
    finish,
    text,
    tool_call,
)
from tests.conftest import Drive


async def _no_wait(_seconds: float) -> None:
    return None


def policy(**settings: Any) -> RetryPolicy:
    return RetryPolicy(sleep=lambda _s: None, async_sleep=_no_wait, **settings)


NO_WAIT = policy()


def wrap(*scripts: list[Any], **settings: Any) -> tuple[RecoveringChatModel, ScriptedChatModel]:
    inner = ScriptedChatModel(scripts=list(scripts))
    settings.setdefault("retry_policy", NO_WAIT)
    return RecoveringChatModel(model=inner, **settings), inner


def merged(chunks: list[AIMessageChunk]) -> AIMessage:
    total = chunks[0]
    for chunk in chunks[1:]:
        total = total + chunk
    return message_chunk_to_message(total)  # type: ignore[return-value]


def reset() -> ConnectionResetError:
    return ConnectionResetError("connection reset by peer")


# -- retry before output -------------------------------------------------------------


async def test_failure_before_output_is_retried_and_caller_sees_only_the_good_attempt(
    drive: Drive,
) -> None:
    model, inner = wrap([reset()], [*text("Fine answer."), finish()])
    chunks = await drive.stream(model, "hi")
    assert "".join(str(c.content) for c in chunks) == "Fine answer."
    assert len(inner.calls) == 2
    assert inner.calls[1].messages == inner.calls[0].messages
    assert chunks[-1].response_metadata["awaken"]["plans"] == ["R4"]
    assert chunks[-1].response_metadata["awaken"]["retries"] == 1


async def test_cut_off_tool_call_before_any_text_restarts_without_showing_anything(
    drive: Drive,
) -> None:
    partial = tool_call("transfer", '{"to": "alice", "amount": 100, "conf', id="c1", pieces=3)
    whole = tool_call("transfer", '{"to": "alice", "amount": 100, "confirm": true}', id="c2")
    model, inner = wrap([*partial, reset()], [*whole, finish("tool_calls")])
    chunks = await drive.stream(model, "pay alice")
    calls = [tc for c in chunks for tc in c.tool_call_chunks]
    assert len(calls) == 1
    assert json.loads(calls[0]["args"]) == {"to": "alice", "amount": 100, "confirm": True}
    assert len(inner.calls) == 2


async def test_permanent_error_propagates_as_raised_after_exactly_one_request(drive: Drive) -> None:
    error = ModelAuthenticationError("invalid api key")
    model, inner = wrap([error], [*text("never"), finish()])
    with pytest.raises(ModelAuthenticationError) as raised:
        await drive.invoke(model, "hi")
    assert raised.value is error
    assert len(inner.calls) == 1


async def test_unknown_exception_is_not_retried_unless_the_policy_says_so(drive: Drive) -> None:
    model, inner = wrap([ValueError("odd")], [*text("ok"), finish()])
    with pytest.raises(ValueError, match="odd"):
        await drive.invoke(model, "hi")
    assert len(inner.calls) == 1
    model, inner = wrap(
        [ValueError("odd")], [*text("ok"), finish()], retry_policy=policy(retry_on=ValueError)
    )
    assert (await drive.invoke(model, "hi")).content == "ok"
    assert len(inner.calls) == 2


async def test_retries_before_output_are_bounded_by_max_attempts(drive: Drive) -> None:
    model, inner = wrap(
        [reset()], [reset()], [reset()], [reset()], retry_policy=policy(max_attempts=3)
    )
    with pytest.raises(StreamInterruptedError) as raised:
        await drive.invoke(model, "hi")
    assert len(inner.calls) == 3
    assert raised.value.partial is None
    assert isinstance(raised.value.cause, ConnectionResetError)


# -- continuation after output ----------------------------------------------------------


async def test_interruption_after_text_sends_a_continuation_request(drive: Drive) -> None:
    model, inner = wrap(
        [*text("The quick brown fox "), reset()],
        [*text("jumps over the lazy dog."), finish()],
    )
    chunks = await drive.stream(model, [HumanMessage("tell me")])
    assert "".join(str(c.content) for c in chunks) == "The quick brown fox jumps over the lazy dog."
    request = inner.calls[1].messages
    assert [type(m).__name__ for m in request] == ["HumanMessage", "AIMessage", "HumanMessage"]
    assert request[1].content == "The quick brown fox"  # trailing whitespace removed
    assert request[2].content == DEFAULT_CONTINUATION_PROMPT
    assert chunks[-1].response_metadata["awaken"]["plans"] == ["R1"]


async def test_continuation_prompt_never_appears_in_the_output(drive: Drive) -> None:
    model, _ = wrap(
        [*text("Part one, "), reset()], [*text("part two."), finish()], continuation_prompt="GO ON"
    )
    message = await drive.invoke(model, "hi")
    assert "GO ON" not in str(message.content)
    assert message.content == "Part one, part two."


async def test_text_the_provider_repeats_at_the_seam_is_removed(drive: Drive) -> None:
    model, _ = wrap(
        [*text("Once upon a time there was a "), reset()],
        [*text("there was a dragon who loved tea."), finish()],
    )
    chunks = await drive.stream(model, "story")
    assert (
        "".join(str(c.content) for c in chunks)
        == "Once upon a time there was a dragon who loved tea."
    )
    assert chunks[-1].response_metadata["awaken"]["regenerated_output_tokens"] >= 3


async def test_several_interruptions_continue_from_the_whole_turn_so_far(drive: Drive) -> None:
    model, inner = wrap(
        [*text("Alpha beta "), reset()],
        [*text("gamma delta "), reset()],
        [*text("epsilon."), finish()],
    )
    message = await drive.invoke(model, "letters")
    assert message.content == "Alpha beta gamma delta epsilon."
    assert inner.calls[2].messages[1].content == "Alpha beta gamma delta"
    assert len(inner.calls[2].messages) == 3  # not stacked: one prefix, one prompt
    assert message.response_metadata["awaken"]["continuations"] == 2


async def test_stream_that_ends_without_a_terminal_signal_is_an_interruption(drive: Drive) -> None:
    model, inner = wrap([*text("Half an ans")], [*text("wer, whole."), finish()])
    message = await drive.invoke(model, "hi")
    assert message.content == "Half an answer, whole."
    assert len(inner.calls) == 2


async def test_concatenated_yielded_text_equals_the_final_message_text(drive: Drive) -> None:
    model, _ = wrap(
        [*text("abc def ghi ", size=3), reset()],
        [*text("ghi jkl", size=2), finish()],
    )
    chunks = await drive.stream(model, "x")
    assert "".join(str(c.content) for c in chunks) == merged(chunks).content


async def test_every_chunk_of_a_turn_carries_one_stable_message_id(drive: Drive) -> None:
    model, _ = wrap([*text("one "), reset()], [*text("two"), finish()])
    chunks = await drive.stream(model, "x")
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].id is not None


async def test_usage_is_summed_over_attempts(drive: Drive) -> None:
    model, _ = wrap(
        [*text("one "), _usage_only(10, 2), reset()],
        [*text("two"), finish(input_tokens=15, output_tokens=3)],
    )
    message = await drive.invoke(model, "x")
    assert message.usage_metadata is not None
    assert message.usage_metadata["input_tokens"] == 25
    assert message.usage_metadata["output_tokens"] == 5


def _usage_only(input_tokens: int, output_tokens: int) -> AIMessageChunk:
    return AIMessageChunk(
        content="",
        usage_metadata={
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens,
        },
    )


async def test_failure_after_the_terminal_signal_keeps_the_complete_answer(drive: Drive) -> None:
    model, inner = wrap([*text("Done."), finish(), reset()])
    assert (await drive.invoke(model, "x")).content == "Done."
    assert len(inner.calls) == 1


async def test_exhausted_continuations_raise_with_the_partial_message_and_cause(
    drive: Drive,
) -> None:
    model, inner = wrap(
        [*text("Begin "), reset()],
        [*text("more "), reset()],
        retry_policy=policy(max_continuations=1),
    )
    with pytest.raises(StreamInterruptedError) as raised:
        await drive.stream(model, "x")
    assert raised.value.partial is not None
    assert raised.value.partial.content == "Begin more "
    assert isinstance(raised.value.cause, ConnectionResetError)
    assert raised.value.attempts == 2
    assert len(inner.calls) == 2


# -- tool calls --------------------------------------------------------------------------


async def test_tool_calls_are_yielded_only_whole(drive: Drive) -> None:
    model, _ = wrap(
        [
            *text("Let me check. "),
            *tool_call("weather", '{"city": "Paris"}', id="a", index=0, pieces=4),
            *tool_call("weather", '{"city": "Rome"}', id="b", index=1, pieces=4),
            finish("tool_calls"),
        ]
    )
    chunks = await drive.stream(model, "weather?")
    pieces = [tc for c in chunks for tc in c.tool_call_chunks]
    assert [json.loads(p["args"]) for p in pieces] == [{"city": "Paris"}, {"city": "Rome"}]
    message = merged(chunks)
    assert [c["args"] for c in message.tool_calls] == [{"city": "Paris"}, {"city": "Rome"}]


async def test_complete_tool_calls_finish_the_turn_and_the_cut_off_call_is_invalid(
    drive: Drive,
) -> None:
    model, inner = wrap(
        [
            *tool_call("lookup", '{"q": "a"}', id="a", index=0),
            *tool_call("transfer", '{"to": "bob", "amount": 10', id="b", index=1),
            reset(),
        ]
    )
    message = await drive.invoke(model, "go")
    assert len(inner.calls) == 1
    assert [c["name"] for c in message.tool_calls] == ["lookup"]
    assert [c["name"] for c in message.invalid_tool_calls] == ["transfer"]
    assert "interrupted" in (message.invalid_tool_calls[0]["error"] or "")
    assert message.response_metadata["awaken"]["plans"] == ["R2"]


async def test_cut_off_tool_call_stays_invalid_after_streamed_chunks_are_merged(
    drive: Drive,
) -> None:
    model, _ = wrap(
        [
            *tool_call("lookup", '{"q": "a"}', id="a", index=0),
            *tool_call("transfer", '{"to": "bob", "amount": 10', id="b", index=1),
            reset(),
        ]
    )
    message = merged(await drive.stream(model, "go"))
    assert [c["name"] for c in message.tool_calls] == ["lookup"]
    assert [c["name"] for c in message.invalid_tool_calls] == ["transfer"]


async def test_text_then_cut_off_tool_call_drops_the_call_and_continues_from_the_text(
    drive: Drive,
) -> None:
    model, inner = wrap(
        [*text("I will pay now. "), *tool_call("pay", '{"amount": 5', id="p1"), reset()],
        [*tool_call("pay", '{"amount": 50}', id="p2"), finish("tool_calls")],
    )
    message = await drive.invoke(model, "pay")
    assert message.content == "I will pay now. "
    assert [(c["id"], c["args"]) for c in message.tool_calls] == [("p2", {"amount": 50})]
    assert message.invalid_tool_calls == []
    assert inner.calls[1].messages[-2].content == "I will pay now."
    assert message.response_metadata["awaken"]["plans"] == ["R3"]


async def test_continuation_tool_call_indices_do_not_collide_with_earlier_ones(
    drive: Drive,
) -> None:
    model, _ = wrap(
        [*text("Checking. "), reset()],
        [*tool_call("a", '{"x": 1}', id="t1", index=0), finish("tool_calls")],
    )
    chunks = await drive.stream(model, "x")
    message = merged(chunks)
    assert [c["args"] for c in message.tool_calls] == [{"x": 1}]


async def test_malformed_arguments_in_a_complete_turn_are_never_a_valid_call(drive: Drive) -> None:
    model, _ = wrap([*tool_call("f", '{"a": 1,,}', id="m"), finish("tool_calls")])
    message = await drive.invoke(model, "x")
    assert message.tool_calls == []
    assert [c["name"] for c in message.invalid_tool_calls] == ["f"]


# -- idle timeout -----------------------------------------------------------------------


async def test_stalled_stream_is_an_interruption(drive: Drive) -> None:
    model, inner = wrap(
        [*text("Slow start "), Stall(2.0), *text("never seen")],
        [*text("then fine."), finish()],
        stream_idle_timeout=0.05,
    )
    message = await drive.invoke(model, "x")
    assert message.content == "Slow start then fine."
    assert message.response_metadata["awaken"]["interruptions"][0]["kind"] == "timeout"
    assert len(inner.calls) == 2


async def test_time_the_caller_spends_between_chunks_is_not_idle_time(drive: Drive) -> None:
    model, inner = wrap([*text("One two three four "), finish()], stream_idle_timeout=0.05)
    chunks = []
    async for chunk in drive.iterate(model, "x"):
        chunks.append(chunk)
        await asyncio.sleep(0.03)  # 5 chunks: the caller is busy for longer than the timeout
    assert "".join(str(c.content) for c in chunks) == "One two three four "
    assert chunks[-1].response_metadata["awaken"]["interruptions"] == []
    assert len(inner.calls) == 1


async def test_cancelling_the_caller_is_not_reported_as_a_stall() -> None:
    model, inner = wrap([*text("Slow start "), Stall(5.0), finish()], stream_idle_timeout=1.0)

    async def consume() -> None:
        async for _ in model.astream("x"):
            pass

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(inner.calls) == 1


async def test_a_read_is_never_cut_before_it_has_lasted_the_idle_timeout(drive: Drive) -> None:
    # Each read waits 0.15 s, well inside the timeout even on a loaded machine; together
    # they wait twice the timeout, so a watch that did not restart with each read would cut.
    waits = [step for chunk in text("a b c d e f g h ", size=2) for step in (Stall(0.15), chunk)]
    model, inner = wrap([*waits, finish()], stream_idle_timeout=0.6)
    message = await drive.invoke(model, "x")
    assert message.content == "a b c d e f g h "
    assert message.response_metadata["awaken"]["interruptions"] == []
    assert len(inner.calls) == 1


async def test_a_stalled_read_is_cut_soon_after_the_idle_timeout(drive: Drive) -> None:
    model, inner = wrap(
        [*text("Slow start "), Stall(3.0), *text("never seen")],
        [*text("then fine."), finish()],
        stream_idle_timeout=0.4,
    )
    started = time.monotonic()
    message = await drive.invoke(model, "x")
    took = time.monotonic() - started
    assert message.content == "Slow start then fine."
    assert len(inner.calls) == 2
    assert 0.4 <= took < 1.5  # cut once the wait lasted the timeout, long before the stall ends


async def test_a_read_begun_after_the_caller_held_the_stream_is_cut_on_time() -> None:
    model, inner = wrap(
        [*text("Slow start "), Stall(3.0), *text("never seen")],
        [*text("then fine."), finish()],
        stream_idle_timeout=0.3,
    )
    chunks: list[AIMessageChunk] = []
    began = 0.0
    async for chunk in model.astream("x"):
        chunks.append(chunk)
        if len(chunks) == 1:
            await asyncio.sleep(0.5)  # the watch looks while no read waits
            began = time.monotonic()
    took = time.monotonic() - began
    assert "".join(str(c.content) for c in chunks) == "Slow start then fine."
    assert len(inner.calls) == 2
    assert 0.3 <= took < 1.5


class _OwnClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock is not `time.monotonic` (as a test loop's virtual one)."""

    def time(self) -> float:
        return super().time() + 10_000.0


@pytest.mark.parametrize("stall", [False, True])
def test_an_event_loop_with_a_clock_of_its_own_times_reads_by_that_clock(stall: bool) -> None:
    pause = [Stall(3.0)] if stall else []
    # reads wait for most of 0.6 s: twice the timeout, never once for as long
    waits = [step for chunk in text("a b c d e f g h i j k l ") for step in (Stall(0.05), chunk)]
    model, inner = wrap(
        [*waits, *pause, *text("rest"), finish()],
        [*text("rest"), finish()],
        stream_idle_timeout=0.3,
    )

    async def read() -> tuple[str, float]:
        started = time.monotonic()
        message = await model.ainvoke("x")
        return str(message.content), time.monotonic() - started

    with asyncio.Runner(loop_factory=_OwnClockLoop) as runner:
        content, took = runner.run(read())
    assert content == "a b c d e f g h i j k l rest"
    assert len(inner.calls) == (2 if stall else 1)
    assert took < 2.0


async def test_a_stall_is_cut_when_every_chunk_is_read_in_a_task_of_its_own() -> None:
    """LangChain's parallel steps read each chunk of a stream in a new task."""
    model, inner = wrap(
        [*text("Slow start "), Stall(30.0), *text("never seen")],
        [*text("then fine."), finish()],
        stream_idle_timeout=0.1,
    )
    parallel = RunnableParallel(answer=model)
    chunks = await asyncio.wait_for(_collect(parallel.astream("x")), 10.0)
    assert "".join(str(chunk["answer"].content) for chunk in chunks) == "Slow start then fine."
    assert len(inner.calls) == 2


async def _collect(stream: AsyncIterator[Any]) -> list[Any]:
    return [item async for item in stream]


class _NotAGenerator:
    """An async iterator that is not an async generator, over one that is."""

    def __init__(self, inner: AsyncIterator[ChatGenerationChunk]) -> None:
        self._inner = inner
        self.closed = False

    def __aiter__(self) -> _NotAGenerator:
        return self

    async def __anext__(self) -> ChatGenerationChunk:
        return await self._inner.__anext__()

    async def aclose(self) -> None:
        self.closed = True
        await cast(AsyncGenerator[ChatGenerationChunk, None], self._inner).aclose()


class _IteratorModel(ScriptedChatModel):
    """Streams through an async iterator object instead of an async generator."""

    _opened: list[_NotAGenerator] = PrivateAttr(default_factory=list)

    @property
    def opened(self) -> list[_NotAGenerator]:
        return self._opened

    def _astream(self, *args: Any, **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:  # type: ignore[override]
        stream = _NotAGenerator(super()._astream(*args, **kwargs))
        self._opened.append(stream)
        return stream


async def test_a_stream_that_is_not_an_async_generator_times_out_and_is_closed() -> None:
    inner = _IteratorModel(
        scripts=[[*text("Slow start "), Stall(30.0)], [*text("then fine."), finish()]]
    )
    model = RecoveringChatModel(model=inner, retry_policy=NO_WAIT, stream_idle_timeout=0.1)
    chunks = await asyncio.wait_for(_collect(model.astream("x")), 10.0)
    assert "".join(str(chunk.content) for chunk in chunks) == "Slow start then fine."
    assert [stream.closed for stream in inner.opened] == [True, True]


def test_reasoning_models_get_the_longer_idle_timeout() -> None:
    model, _ = wrap([], stream_idle_timeout=1.0, reasoning_stream_idle_timeout=9.0)
    assert model._idle_timeout(model._inner(), {}) == 1.0
    assert model._idle_timeout(model._inner(), {"reasoning_effort": "high"}) == 9.0
    reasoning = RecoveringChatModel(
        model=ScriptedChatModel(model_name="o3-mini"), reasoning_stream_idle_timeout=9.0
    )
    assert reasoning._idle_timeout(reasoning._inner(), {}) == 9.0


# -- drop-in behaviour --------------------------------------------------------------------


class _Recorder(BaseCallbackHandler):
    def __init__(self) -> None:
        self.starts = 0
        self.tokens: list[str] = []
        self.events: list[tuple[str, Any]] = []

    def on_chat_model_start(self, *args: Any, **kwargs: Any) -> None:
        self.starts += 1

    def on_llm_new_token(self, token: str, **kwargs: Any) -> None:
        self.tokens.append(token)

    def on_custom_event(self, name: str, data: Any, **kwargs: Any) -> None:
        self.events.append((name, data))


async def test_callbacks_see_one_chat_model_run_and_each_token_once(drive: Drive) -> None:
    model, _ = wrap([*text("ab cd ef"), reset()], [*text("gh"), finish()])
    recorder = _Recorder()
    chunks = await drive.stream(model, "x", config={"callbacks": [recorder]})
    assert recorder.starts == 1
    assert "".join(recorder.tokens) == "".join(str(c.content) for c in chunks) == "ab cd efgh"


async def test_recovery_events_reach_callback_handlers(drive: Drive) -> None:
    model, _ = wrap([reset()], [*text("ab "), reset()], [*text("cd"), finish()])
    recorder = _Recorder()
    await drive.invoke(model, "x", config={"callbacks": [recorder]})
    names = [name for name, _ in recorder.events]
    assert names == ["awaken_retry", "awaken_continuation"]
    assert recorder.events[1][1]["plan"] == "R1"
    assert recorder.events[1][1]["cause"] == "connection"


async def test_recovery_events_appear_in_astream_events() -> None:
    model, _ = wrap([*text("ab "), reset()], [*text("cd"), finish()])
    events = [e async for e in model.astream_events("x", version="v2")]
    custom = [e for e in events if e["event"] == "on_custom_event"]
    assert [e["name"] for e in custom] == ["awaken_continuation"]
    streamed = [e for e in events if e["event"] == "on_chat_model_stream"]
    assert "".join(str(e["data"]["chunk"].content) for e in streamed) == "ab cd"


async def test_stream_invoke_and_batch_work(drive: Drive) -> None:
    model, _ = wrap(
        [*text("one "), reset()],
        [*text("two"), finish()],
        [*text("x"), finish()],
        [*text("y"), finish()],
        [*text("z"), finish()],
    )
    chunks = await drive.stream(model, "a")
    assert "".join(str(c.content) for c in chunks) == "one two"
    assert (await drive.invoke(model, "b")).content == "x"
    assert sorted(str(m.content) for m in await drive.batch(model, ["c", "d"])) == ["y", "z"]


async def test_bind_tools_keeps_the_wrapper_in_the_chain(drive: Drive) -> None:
    model, inner = wrap([*tool_call("add", '{"a": 1, "b": 2}', id="t"), finish("tool_calls")])

    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    bound = model.bind_tools([add], tool_choice="any")
    message = await drive.invoke(bound, "1+2")
    assert message.tool_calls[0]["args"] == {"a": 1, "b": 2}
    assert inner.calls[0].kwargs["tools"][0]["function"]["name"] == "add"
    assert inner.calls[0].kwargs["tool_choice"] == "any"
    assert bound.bound is model  # type: ignore[attr-defined]


async def test_with_structured_output_keeps_the_wrapper_in_the_chain(drive: Drive) -> None:
    class Answer(BaseModel):
        value: int

    model, _ = wrap(
        [*text("Thinking "), reset()],
        [*tool_call("Answer", '{"value": 42}', id="s"), finish("tool_calls")],
    )
    structured = model.with_structured_output(Answer)
    assert await drive.invoke(structured, "the answer") == Answer(value=42)


def test_settings_for_the_inner_model_are_forwarded_or_refused() -> None:
    with pytest.raises(ValueError, match="temperature"):
        RecoveringChatModel(model=ScriptedChatModel(), temperature=0)
    model = RecoveringChatModel(model=ScriptedChatModel(), model_name="renamed")
    assert model.model.model_name == "renamed"  # type: ignore[attr-defined]


async def test_langgraph_messages_mode_sees_each_token_once(drive: Drive) -> None:
    from langgraph.graph import END, START, MessagesState, StateGraph

    model, _ = wrap([*text("Hello there "), reset()], [*text("friend."), finish()])
    # a node that calls the model's invoke (ainvoke when the graph runs async)
    call = (
        RunnableLambda(lambda state: state["messages"])
        | model
        | RunnableLambda(lambda message: {"messages": [message]})
    )

    graph = StateGraph(MessagesState)
    graph.add_node("model", call)
    graph.add_edge(START, "model")
    graph.add_edge("model", END)
    app = graph.compile()
    parts = await drive.stream(app, {"messages": [HumanMessage("hi")]}, stream_mode="messages")
    streamed = [chunk for chunk, _meta in parts]
    text_seen = "".join(str(c.content) for c in streamed if isinstance(c, AIMessageChunk))
    assert text_seen == "Hello there friend."
