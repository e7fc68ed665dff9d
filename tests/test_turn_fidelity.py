"""Fidelity: the wrapped turn is the bare turn, and a recovered turn is the uncut one.

Each test runs sync and async through one fixture. Real clients (ChatOpenAI,
ChatAnthropic) talk to the loopback provider; the scripted model is used where
a test needs an exact chunk sequence.
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from typing import Any

import pytest
from langchain_core.callbacks import AsyncCallbackHandler, BaseCallbackHandler
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, ToolMessage
from pydantic import BaseModel

from awaken_langchain import (
    InMemoryStreamCheckpointStore,
    RecoveringChatModel,
    RetryPolicy,
    StreamCheckpoint,
    StreamCheckpointError,
    StreamCheckpointHandler,
    StreamCheckpointWarning,
)
from awaken_langchain.recovery import DEFAULT_CONTINUATION_PROMPT, INVALID_ARGS_MARKER
from awaken_langchain.testing import (
    Fault,
    LoopbackProvider,
    Scenario,
    ScriptedToolCall,
)
from awaken_langchain.testing.scripted import ScriptedChatModel, finish, text, tool_call
from tests.conftest import Drive, loopback_client

pytestmark = pytest.mark.asyncio(loop_scope="module")

PROVIDERS = ["openai", "anthropic"]


async def _no_wait(_seconds: float) -> None:
    return None


NO_WAIT = RetryPolicy(sleep=lambda _s: None, async_sleep=_no_wait)


def reset() -> ConnectionResetError:
    return ConnectionResetError("connection reset by peer")


def merged(chunks: list[AIMessageChunk]) -> AIMessageChunk:
    total = chunks[0]
    for chunk in chunks[1:]:
        total = total + chunk
    return total


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(
        b if isinstance(b, str) else str(b.get("text", ""))
        for b in content
        if isinstance(b, str) or b.get("type") == "text"
    )


# -- real clients on the loopback provider ------------------------------------------------


@pytest.fixture
def server(shared_server: LoopbackProvider) -> LoopbackProvider:
    shared_server.reset()
    return shared_server


def client(provider: str, server: LoopbackProvider) -> BaseChatModel:
    return loopback_client(provider, server)


def wrapped(provider: str, server: LoopbackProvider, **settings: Any) -> RecoveringChatModel:
    return RecoveringChatModel(model=client(provider, server), retry_policy=NO_WAIT, **settings)


def _comparable(message: AIMessage, *, metadata: bool = True) -> dict[str, Any]:
    """What a user reads from a message (the wrapper's own metadata aside)."""
    found = {
        "content": message.content,
        "tool_calls": message.tool_calls,
        "invalid_tool_calls": message.invalid_tool_calls,
        "tool_call_chunks": getattr(message, "tool_call_chunks", None),
        "usage": message.usage_metadata,
        "finish": message.response_metadata.get("finish_reason")
        or message.response_metadata.get("stop_reason"),
        "model": message.response_metadata.get("model_name"),
    }
    if metadata:
        found["metadata"] = {k: v for k, v in message.response_metadata.items() if k != "awaken"}
    return found


WEATHER = ScriptedToolCall("get_weather", {"city": "Paris", "unit": "celsius"}, id="call_w")
TIME = ScriptedToolCall("get_time", {"zone": "Europe/Paris"}, id="call_t")


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_with_no_fault_the_wrapped_message_equals_the_bare_one(
    server: LoopbackProvider, provider: str, drive: Drive
) -> None:
    scenario = Scenario(text="Let me check.\n  Indented line.", tool_calls=[WEATHER, TIME])
    server.default = scenario
    bare = client(provider, server)
    wrapper = wrapped(provider, server)
    # invoke: the bare client asks for one JSON answer, the wrapper streams it, so
    # only the metadata of the transport differs
    expected = _comparable(await drive.invoke(bare, "q"), metadata=False)
    found = _comparable(await drive.invoke(wrapper, "q"), metadata=False)
    assert found == expected
    streamed_bare = _comparable(merged(await drive.stream(bare, "q")))
    streamed = _comparable(merged(await drive.stream(wrapper, "q")))
    assert streamed == streamed_bare


# -- whitespace before a restart -----------------------------------------------------------


async def test_whitespace_before_a_restart_is_never_shown_twice(drive: Drive) -> None:
    inner = ScriptedChatModel(scripts=[[*text("\n", size=1), reset()], [*text("\n{}"), finish()]])
    chunks = await drive.stream(RecoveringChatModel(model=inner, retry_policy=NO_WAIT), "q")
    assert "".join(str(c.content) for c in chunks) == "\n{}"
    assert merged(chunks).content == "\n{}"
    assert merged(chunks).response_metadata["awaken"]["plans"] == ["R4"]


async def test_whitespace_only_answer_is_kept_when_it_is_the_whole_answer(drive: Drive) -> None:
    inner = ScriptedChatModel(scripts=[[*text("\n\n", size=1), finish()]])
    chunks = await drive.stream(RecoveringChatModel(model=inner, retry_policy=NO_WAIT), "q")
    assert merged(chunks).content == "\n\n"


# -- one JSON document ---------------------------------------------------------------------


class Answer(BaseModel):
    city: str
    temperature: int
    summary: str


ANSWER = Answer(city="Paris", temperature=21, summary="Mild and sunny, light wind from the west.")
DOCUMENT = json.dumps(ANSWER.model_dump(), indent=2)


@pytest.mark.parametrize("method", ["json_schema", "json_mode"])
@pytest.mark.parametrize("cut", [6, 14])
async def test_a_structured_answer_cut_mid_document_is_restarted_not_continued(
    server: LoopbackProvider, method: str, cut: int, drive: Drive
) -> None:
    server.enqueue(
        Scenario(text=DOCUMENT, chunk_size=3, fault=Fault.drop_after_events(cut)),
        Scenario(text=DOCUMENT, chunk_size=3),
    )
    structured = wrapped("openai", server).with_structured_output(
        Answer, method=method, include_raw=True
    )
    result = await drive.invoke(structured, "weather in Paris as JSON")
    assert result["parsed"] == ANSWER
    assert result["parsing_error"] is None
    raw = result["raw"]
    assert raw.content == DOCUMENT  # one document, never two glued together
    assert raw.response_metadata["awaken"]["plans"] == ["R4"]
    assert raw.response_metadata["awaken"]["one_document"] is True
    requests = server.requests
    assert len(requests) == 2
    assert requests[1].body["messages"] == requests[0].body["messages"]  # the same request


async def test_a_streamed_json_mode_answer_reaches_the_caller_whole(
    server: LoopbackProvider, drive: Drive
) -> None:
    server.enqueue(
        Scenario(text=DOCUMENT, chunk_size=3, fault=Fault.drop_after_events(9)),
        Scenario(text=DOCUMENT, chunk_size=3),
    )
    model = wrapped("openai", server).bind(response_format={"type": "json_object"})
    chunks = await drive.stream(model, "weather in Paris as JSON")
    texts = [str(c.content) for c in chunks if c.content]
    assert texts == [DOCUMENT]
    assert json.loads(merged(chunks).content) == ANSWER.model_dump()


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_forced_tool_call_cut_mid_arguments_is_sent_again(
    server: LoopbackProvider, provider: str, drive: Drive
) -> None:
    answer = ScriptedToolCall("Answer", ANSWER.model_dump(), id="call_a")
    server.enqueue(
        Scenario(tool_calls=[answer], chunk_size=5, fault=Fault.drop_after_events(5)),
        Scenario(tool_calls=[answer], chunk_size=5),
    )
    settings = {"method": "function_calling"} if provider == "openai" else {}
    structured = wrapped(provider, server).with_structured_output(Answer, **settings)
    assert await drive.invoke(structured, "weather") == ANSWER
    assert len(server.requests) == 2


# -- cut-off tool calls: stream and invoke agree, the guard never reaches a provider --------


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_cut_off_call_is_reported_alike_by_stream_and_invoke(
    server: LoopbackProvider, provider: str, drive: Drive
) -> None:
    # the events up to the second call's first argument fragment
    cut = {"openai": 17, "anthropic": 20}[provider]

    def cut_in_second_call() -> Scenario:
        return Scenario(
            text="Checking both.",
            tool_calls=[WEATHER, TIME],
            chunk_size=4,
            fault=Fault.drop_after_events(cut),
        )

    server.enqueue(cut_in_second_call(), cut_in_second_call())
    model = wrapped(provider, server)
    invoked = await drive.invoke(model, "weather and time")
    streamed = merged(await drive.stream(model, "weather and time"))
    assert (
        invoked.tool_calls
        == streamed.tool_calls
        == [{"name": "get_weather", "args": WEATHER.arguments, "id": "call_w", "type": "tool_call"}]
    )
    (cut_invoked,) = invoked.invalid_tool_calls
    (cut_streamed,) = streamed.invalid_tool_calls
    assert cut_invoked["id"] == cut_streamed["id"] == "call_t"
    assert cut_invoked["name"] == cut_streamed["name"] == "get_time"
    assert "interrupted" in (cut_invoked["error"] or "")
    assert cut_streamed["args"] in (cut_invoked["args"], INVALID_ARGS_MARKER + cut_invoked["args"])
    for message in (invoked, streamed):
        (reason,) = message.response_metadata["awaken"]["not_executed"]
        assert reason["id"] == "call_t"
        assert reason["interrupted"] is True

    # the next request, built from what memory holds after streaming
    server.default = Scenario(text="Paris is mild; I could not get the time.")
    history = [HumanMessage("weather and time"), streamed]
    history.append(ToolMessage("21 C", tool_call_id="call_w"))
    await drive.invoke(model, history)
    sent = server.requests[-1].raw_body.decode()
    assert "[awaken" not in sent  # the guard never reaches a provider
    assert "cut off" in sent  # the call is answered as not executed


# -- the callback handler -------------------------------------------------------------------


async def test_the_handler_keeps_the_checkpoint_of_a_turn_that_ended_without_a_finish(
    drive: Drive,
) -> None:
    store = InMemoryStreamCheckpointStore()
    handler = StreamCheckpointHandler(store, checkpoint_every_chunks=100)
    model = ScriptedChatModel(scripts=[text("The answer was cut")])
    run_id = uuid.uuid4()
    await drive.stream(model, "q", config={"callbacks": [handler], "run_id": run_id})
    saved = store.get(str(run_id))
    assert saved is not None
    assert saved.partial_text == "The answer was cut"


async def test_the_handler_deletes_the_checkpoint_of_a_finished_turn(drive: Drive) -> None:
    store = InMemoryStreamCheckpointStore()
    handler = StreamCheckpointHandler(store, checkpoint_every_chunks=1)
    model = ScriptedChatModel(scripts=[[*text("Done."), finish()]])
    run_id = uuid.uuid4()
    await drive.stream(model, "q", config={"callbacks": [handler], "run_id": run_id})
    assert store.get(str(run_id)) is None


# -- generate() keys and events --------------------------------------------------------------


class Events(BaseCallbackHandler):
    def __init__(self) -> None:
        self.seen: list[tuple[str, uuid.UUID]] = []

    def on_custom_event(self, name: str, data: Any, *, run_id: uuid.UUID, **kwargs: Any) -> None:
        self.seen.append((name, run_id))


async def test_generate_keys_the_checkpoint_by_the_callers_run_id_and_reports_events(
    drive: Drive,
) -> None:
    inner = ScriptedChatModel(scripts=[[*text("Half an "), reset()], [*text("answer."), finish()]])
    store = InMemoryStreamCheckpointStore()
    model = RecoveringChatModel(model=inner, store=store, retry_policy=NO_WAIT)
    events = Events()
    run_id = uuid.uuid4()
    messages = [[HumanMessage("q")]]
    result = await drive.generate(model, messages, callbacks=[events], run_id=run_id)
    message = result.generations[0][0].message
    assert message.content == "Half an answer."
    assert message.response_metadata["awaken"]["checkpoint_key"] == str(run_id)
    assert ("awaken_continuation", run_id) in events.seen


# -- the closing write ------------------------------------------------------------------------


class RefusesCompleteRecords(InMemoryStreamCheckpointStore):
    """A store whose disk is full by the time the turn's closing record is written."""

    def put(self, checkpoint: StreamCheckpoint) -> None:
        if checkpoint.complete:
            raise StreamCheckpointError("disk full", run_id=checkpoint.run_id)
        super().put(checkpoint)


async def test_checkpoint_complete_is_false_when_the_closing_write_failed(drive: Drive) -> None:
    inner = ScriptedChatModel(scripts=[[*text("All of it."), finish()]])
    store = RefusesCompleteRecords()
    model = RecoveringChatModel(
        model=inner, store=store, retry_policy=NO_WAIT, keep_until_committed=True
    )
    with pytest.warns(StreamCheckpointWarning, match="disk full"):
        answer = await drive.invoke(model, "q")
    assert answer.content == "All of it."
    assert answer.response_metadata["awaken"]["checkpoint_complete"] is False


async def test_checkpoint_complete_is_true_when_the_closing_write_succeeded(drive: Drive) -> None:
    inner = ScriptedChatModel(scripts=[[*text("All of it."), finish()]])
    store = InMemoryStreamCheckpointStore()
    model = RecoveringChatModel(
        model=inner, store=store, retry_policy=NO_WAIT, keep_until_committed=True
    )
    answer = await drive.invoke(model, "q")
    assert answer.response_metadata["awaken"]["checkpoint_complete"] is True
    kept = store.get(answer.response_metadata["awaken"]["checkpoint_key"])
    assert kept is not None
    assert kept.complete
    assert kept.partial_text == "All of it."


# -- events of the async path stay on its event loop ----------------------------------------------


class LoopRecorder(AsyncCallbackHandler):
    def __init__(self) -> None:
        self.where: list[tuple[str, int, asyncio.AbstractEventLoop]] = []

    async def on_custom_event(self, name: str, data: Any, **kwargs: Any) -> None:
        self.where.append((name, threading.get_ident(), asyncio.get_running_loop()))


async def test_async_turns_report_warnings_on_the_callers_event_loop() -> None:
    store = InMemoryStreamCheckpointStore()
    run_id = uuid.uuid4()
    store.put(StreamCheckpoint(run_id=str(run_id), model="other:model", partial_text="Old "))
    inner = ScriptedChatModel(scripts=[[*text("Fresh."), finish()]])
    model = RecoveringChatModel(model=inner, store=store, retry_policy=NO_WAIT)
    recorder = LoopRecorder()
    answer = await model.ainvoke("q", config={"run_id": run_id, "callbacks": [recorder]})
    assert answer.content == "Fresh."
    assert [name for name, _, _ in recorder.where] == ["awaken_checkpoint_ignored"]
    (_, thread, loop) = recorder.where[0]
    assert thread == threading.get_ident()
    assert loop is asyncio.get_running_loop()


# -- a checkpoint belongs to its request ---------------------------------------------------------


async def test_a_checkpoint_of_another_request_is_never_resumed(drive: Drive) -> None:
    store = InMemoryStreamCheckpointStore()
    run_id = uuid.uuid4()
    store.put(
        StreamCheckpoint(
            run_id=str(run_id),
            model="scripted:scripted",
            fingerprint="0" * 64,
            partial_text="An answer to another question ",
        )
    )
    inner = ScriptedChatModel(scripts=[[*text("Fresh."), finish()]])
    model = RecoveringChatModel(model=inner, store=store, retry_policy=NO_WAIT)
    events = Events()
    answer = await drive.invoke(model, "q", {"run_id": run_id, "callbacks": [events]})
    assert answer.content == "Fresh."
    assert [name for name, _ in events.seen] == ["awaken_checkpoint_ignored"]
    assert inner.calls[0].messages[-1].content == "q"  # not a continuation


async def test_a_checkpoint_of_the_same_request_is_resumed(drive: Drive) -> None:
    store = InMemoryStreamCheckpointStore()
    run_id = uuid.uuid4()
    first = ScriptedChatModel(scripts=[[*text("The first half "), reset()]])
    breaking = RecoveringChatModel(
        model=first, store=store, retry_policy=RetryPolicy(max_continuations=0)
    )
    with pytest.raises(Exception, match="could not be recovered"):
        await drive.invoke(breaking, "q", {"run_id": run_id})
    inner = ScriptedChatModel(scripts=[[*text("and the rest."), finish()]])
    model = RecoveringChatModel(model=inner, store=store, retry_policy=NO_WAIT)
    answer = await drive.invoke(model, "q", {"run_id": run_id})
    assert answer.content == "The first half and the rest."
    assert inner.calls[0].messages[-1].content == DEFAULT_CONTINUATION_PROMPT


async def test_a_cut_off_call_streams_its_unrepairable_arguments_as_written(drive: Drive) -> None:
    inner = ScriptedChatModel(
        scripts=[
            [
                *tool_call("lookup", '{"q": "a"}', id="c1"),
                *tool_call("lookup", "not json at all", id="c2", index=1),
                finish("tool_calls"),
            ]
        ]
    )
    chunks = await drive.stream(RecoveringChatModel(model=inner, retry_policy=NO_WAIT), "q")
    final = merged(chunks)
    assert [c["id"] for c in final.tool_calls] == ["c1"]
    (bad,) = final.invalid_tool_calls
    assert bad["args"] == "not json at all"
    (reason,) = final.response_metadata["awaken"]["not_executed"]
    assert reason["interrupted"] is False  # malformed by the model, not cut off
