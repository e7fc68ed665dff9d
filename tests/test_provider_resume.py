"""Provider resume: an interrupted Responses stream goes on at the provider, losslessly.

Through the real openai SDK and ``ChatOpenAI(use_responses_api=True)`` talking to
the loopback provider in background mode. What the caller sees is compared with
the bare model's uncut answer to the same scenario (each on a fresh server, so
item ids match), and the server's records say how many generations ran.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import ModelFallbackMiddleware
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessageChunk, HumanMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from awaken_langchain import (
    DiskCacheStreamCheckpointStore,
    InMemoryStreamCheckpointStore,
    RecoveringChatModel,
    RetryPolicy,
    StreamCheckpoint,
    StreamInterruptedError,
)
from awaken_langchain.checkpoint import decode_checkpoint, encode_checkpoint
from awaken_langchain.middleware import StreamRecoveryMiddleware
from awaken_langchain.testing import (
    BackgroundResponse,
    Fault,
    LoopbackProvider,
    Scenario,
    ScriptedChatModel,
    ScriptedThinking,
    ScriptedToolCall,
    TokenUsage,
    continuation_responder,
)
from awaken_langchain.testing._wire import (
    ResponseContext,
    responses_failed_frame,
    responses_frames,
)
from awaken_langchain.testing.server import RecordedRequest
from tests import provider_resume_child
from tests.conftest import Drive
from tests.fork_server import fork_server

MODEL = "gpt-5-mini"
# Three different sentences: a text that repeats a whole sentence, cut right after one
# of them, is continued as a restart would be (the seam's one ambiguity with real text).
TEXT = (
    "Paris is the capital of France, and it sits on the Seine. "
    "It has been the seat of government for most of the last thousand years. "
    "Its river divides the city into a left bank and a right bank. "
)
REASONING = "The user asks about France; its capital is Paris, on the Seine."
CALL = ScriptedToolCall("get_weather", {"city": "Paris", "unit": "celsius", "days": 3})
FULL = Scenario(text=TEXT, thinking=[ScriptedThinking(REASONING)], tool_calls=[CALL], chunk_size=7)


async def _no_wait(_seconds: float) -> None:
    return None


NO_WAIT = RetryPolicy(sleep=lambda _s: None, async_sleep=_no_wait)


def chat(server: LoopbackProvider, **kwargs: Any) -> ChatOpenAI:
    return ChatOpenAI(
        model=MODEL,
        base_url=server.base_url_openai,
        api_key="x",
        max_retries=0,
        use_responses_api=True,
        **kwargs,
    )


def wrapped(server: LoopbackProvider, **kwargs: Any) -> RecoveringChatModel:
    kwargs.setdefault("retry_policy", NO_WAIT)
    return RecoveringChatModel(model=chat(server), provider_resume=True, **kwargs)


def merge(chunks: list[Any]) -> AIMessageChunk:
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged = merged + chunk
    assert isinstance(merged, AIMessageChunk)
    return merged


def after(scenario: Scenario, event_type: str, nth: int = 1) -> int:
    """How many events precede the cut just after the ``nth`` event of ``event_type``."""
    ctx = ResponseContext(number=1, model=MODEL, usage=TokenUsage(input_tokens=1, output_tokens=1))
    frames = responses_frames(scenario, ctx)
    seen = 0
    for i, frame in enumerate(frames):
        if f"event: {event_type}\n".encode() in frame.data:
            seen += 1
            if seen == nth:
                return i + 1
    raise AssertionError(f"no {nth}th {event_type} event")


def uncut(scenario: Scenario) -> list[Any]:
    """The bare model's chunks for ``scenario`` without a fault (request 1 of a fresh server)."""
    with LoopbackProvider([dataclasses.replace(scenario, fault=None, resume_faults=())]) as server:
        return list(chat(server).stream("What is the capital of France?"))


def answer(message: AIMessageChunk) -> dict[str, Any]:
    """What a caller reads from a message, without the wrapper's own report."""
    metadata = {k: v for k, v in message.response_metadata.items() if k != "awaken"}
    return {
        "content": message.content,
        "tool_calls": message.tool_calls,
        "invalid_tool_calls": message.invalid_tool_calls,
        "additional_kwargs": message.additional_kwargs,
        "usage": message.usage_metadata,
        "response_metadata": metadata,
    }


def starting_after(request: RecordedRequest) -> int | None:
    """The event number a retrieval resumes after (``None``: from the first event)."""
    query = parse_qs(request.query)
    assert query["stream"] == ["true"]
    return int(query["starting_after"][0]) if "starting_after" in query else None


def text_of(chunks: list[Any]) -> str:
    return "".join(c.text for c in chunks)


async def recovered(drive: Drive, scenario: Scenario, **kwargs: Any) -> tuple[list[Any], Any]:
    """The wrapped model's chunks for ``scenario`` (request 1 of a fresh server), and the server."""
    server = LoopbackProvider([scenario]).start()
    try:
        chunks = await drive.stream(wrapped(server, **kwargs), "What is the capital of France?")
    finally:
        server.stop()
    assert not server.errors
    return chunks, server


def assert_lossless(chunks: list[Any], scenario: Scenario) -> None:
    bare = uncut(scenario)
    assert text_of(chunks) == text_of(bare)
    assert answer(merge(chunks)) == answer(merge(bare))


# -- construction -----------------------------------------------------------------------


def test_provider_resume_refuses_a_model_that_is_not_chat_openai() -> None:
    with pytest.raises(ValueError, match="needs an inner ChatOpenAI on the Responses API"):
        RecoveringChatModel(model=ScriptedChatModel(script=[]), provider_resume=True)


def test_provider_resume_refuses_chat_openai_on_chat_completions(
    loopback_provider: LoopbackProvider,
) -> None:
    model = ChatOpenAI(model="gpt-4o-mini", base_url=loopback_provider.base_url_openai, api_key="x")
    with pytest.raises(ValueError, match="use_responses_api=True"):
        RecoveringChatModel(model=model, provider_resume=True)


# -- one process -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "fault", [Fault.context_overflow(), Fault.http_error(401)], ids=["overflow", "auth"]
)
async def test_a_permanent_error_is_raised_as_the_bare_model_raises_it(
    drive: Drive, fault: Fault
) -> None:
    raised = []
    for model in ("bare", "wrapped"):
        with LoopbackProvider([Scenario(fault=fault)]) as server:
            chosen = chat(server) if model == "bare" else wrapped(server)
            with pytest.raises(Exception) as caught:
                await drive.invoke(chosen, "What is the capital of France?")
            raised.append(type(caught.value))
            assert len(server.requests) == 1
    assert raised[0].__module__.startswith("langchain_openai")
    assert raised[1] is raised[0]


async def test_without_a_fault_the_answer_equals_the_bare_model_and_runs_in_background(
    drive: Drive,
) -> None:
    chunks, server = await recovered(drive, FULL)
    assert_lossless(chunks, FULL)
    (created,) = server.requests_for("openai-responses")
    assert created.body["background"] is True
    assert created.body["store"] is True
    assert server.retrievals() == []
    assert server.cancellations() == []
    awaken = merge(chunks).response_metadata["awaken"]
    assert awaken["provider_resumes"] == 0
    assert awaken["provider_response_id"] == "resp_loopback_1"


@pytest.mark.parametrize(
    ("where", "nth"),
    [
        ("response.output_text.delta", 5),
        ("response.function_call_arguments.delta", 3),
        ("response.reasoning_summary_text.delta", 4),
        ("response.created", 1),
    ],
    ids=["mid-text", "mid-call-arguments", "mid-reasoning", "before-output"],
)
async def test_drop_resumes_the_provider_stream_with_no_new_generation(
    drive: Drive, where: str, nth: int
) -> None:
    cut = after(FULL, where, nth)
    chunks, server = await recovered(
        drive, dataclasses.replace(FULL, fault=Fault.drop_after_events(cut))
    )
    assert_lossless(chunks, FULL)
    assert len(server.requests_for("openai-responses")) == 1  # one generation, never repeated
    (retrieval,) = server.retrievals()
    assert starting_after(retrieval) == cut - 1
    awaken = merge(chunks).response_metadata["awaken"]
    assert awaken["plans"] == ["provider_resume"]
    assert awaken["provider_resumes"] == 1
    assert awaken["continuations"] == 0
    assert awaken["regenerated_output_tokens"] == 0
    assert server.cancellations() == []


async def test_two_drops_in_one_turn_resume_twice_from_the_last_event(drive: Drive) -> None:
    first = after(FULL, "response.reasoning_summary_text.delta", 2)
    second = after(FULL, "response.output_text.delta", 3) - first
    scenario = dataclasses.replace(
        FULL,
        fault=Fault.drop_after_events(first),
        resume_faults=[Fault.drop_after_events(second)],
    )
    chunks, server = await recovered(drive, scenario)
    assert_lossless(chunks, FULL)
    assert len(server.requests_for("openai-responses")) == 1
    assert [starting_after(r) for r in server.retrievals()] == [first - 1, first + second - 1]
    awaken = merge(chunks).response_metadata["awaken"]
    assert awaken["provider_resumes"] == 2
    assert awaken["regenerated_output_tokens"] == 0


async def test_resume_after_the_response_completed_replays_the_rest(drive: Drive) -> None:
    # the drop comes after the last text, while the provider finished long ago
    cut = after(FULL, "response.output_item.done", 3)
    chunks, server = await recovered(
        drive, dataclasses.replace(FULL, fault=Fault.drop_after_events(cut))
    )
    assert_lossless(chunks, FULL)
    assert len(server.requests_for("openai-responses")) == 1


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_expired_response_is_continued_by_prompt(drive: Drive) -> None:
    clock = Clock()
    answer_ = Scenario(text=TEXT, chunk_size=7)

    def expire(_seconds: float) -> None:
        clock.now += 3600.0  # the backoff outlasts the provider's retention

    async def aexpire(seconds: float) -> None:
        expire(seconds)

    policy = RetryPolicy(sleep=expire, async_sleep=aexpire, jitter=0.0)
    cut = after(answer_, "response.output_text.delta", 4)
    with LoopbackProvider(
        [dataclasses.replace(answer_, fault=Fault.drop_after_events(cut))],
        default=continuation_responder(answer_),
        clock=clock,
        background_ttl=600.0,
    ) as server:
        chunks = await drive.stream(wrapped(server, retry_policy=policy), "Capital?")
    assert text_of(chunks) == TEXT
    assert len(server.requests_for("openai-responses")) == 2  # the continuation
    assert len(server.retrievals()) == 1
    awaken = merge(chunks).response_metadata["awaken"]
    assert awaken["plans"] == ["provider_resume", "R1"]
    assert awaken["continuations"] == 1


async def changed_during_the_backoff(
    drive: Drive, cut: int, change: Callable[[BackgroundResponse], None]
) -> tuple[list[Any], LoopbackProvider]:
    """The wrapped model's chunks when ``change`` alters the response while the turn waits."""
    answer_ = Scenario(text=TEXT, chunk_size=7)
    holder: dict[str, LoopbackProvider] = {}

    def meanwhile(_seconds: float) -> None:
        kept = holder["server"].background_response("resp_loopback_1")
        assert kept is not None
        change(kept)

    async def ameanwhile(seconds: float) -> None:
        meanwhile(seconds)

    policy = RetryPolicy(sleep=meanwhile, async_sleep=ameanwhile)
    with LoopbackProvider(
        [dataclasses.replace(answer_, fault=Fault.drop_after_events(cut))],
        default=continuation_responder(answer_),
    ) as server:
        holder["server"] = server
        chunks = await drive.stream(wrapped(server, retry_policy=policy), "Capital?")
    return chunks, server


async def test_cancelled_response_is_continued_by_prompt(drive: Drive) -> None:
    def cancel(kept: BackgroundResponse) -> None:
        kept.status = "cancelled"

    cut = after(Scenario(text=TEXT, chunk_size=7), "response.output_text.delta", 2)
    chunks, server = await changed_during_the_backoff(drive, cut, cancel)
    assert text_of(chunks) == TEXT
    assert len(server.requests_for("openai-responses")) == 2
    assert merge(chunks).response_metadata["awaken"]["plans"] == ["provider_resume", "R1"]


# -- cancelling what nobody will read ---------------------------------------------------


async def test_abandoned_turn_cancels_its_background_response(drive: Drive) -> None:
    paced = dataclasses.replace(FULL, delay=0.02)  # the provider is still generating
    with LoopbackProvider([paced]) as server:
        chunks = drive.iterate(wrapped(server), "Capital?")
        await anext(chunks)
        await chunks.aclose()
        (cancel,) = server.cancellations()
    assert cancel.path == "/v1/responses/resp_loopback_1/cancel"
    kept = server.background_response("resp_loopback_1")
    assert kept is not None
    assert kept.status == "cancelled"


async def test_cancelled_task_cancels_its_background_response() -> None:
    paced = dataclasses.replace(FULL, delay=0.02)
    with LoopbackProvider([paced]) as server:
        model = wrapped(server)
        first = asyncio.Event()

        async def read() -> None:
            async for _chunk in model.astream("Capital?"):
                first.set()

        task = asyncio.create_task(read())
        await first.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert [r.path for r in server.cancellations()] == ["/v1/responses/resp_loopback_1/cancel"]


async def test_spent_budget_cancels_its_background_response(drive: Drive) -> None:
    cut = after(FULL, "response.output_text.delta", 2)
    policy = dataclasses.replace(NO_WAIT, max_continuations=0)
    with LoopbackProvider(
        [dataclasses.replace(FULL, fault=Fault.drop_after_events(cut))]
    ) as server:
        with pytest.raises(StreamInterruptedError):
            await drive.stream(wrapped(server, retry_policy=policy), "Capital?")
        assert len(server.cancellations()) == 1
        assert server.retrievals() == []


async def test_finished_turn_cancels_nothing(drive: Drive) -> None:
    chunks, server = await recovered(drive, FULL)
    assert chunks
    assert server.cancellations() == []


SLOW_CANCEL = 20.0
"""Seconds the provider holds its answer to a cancel in the slow-cancel tests."""
CANCEL_BOUND = 0.3
"""The cancel timeout those tests set (`_provider_resume.CANCEL_TIMEOUT`)."""


@pytest.fixture
def short_cancel(monkeypatch: pytest.MonkeyPatch) -> None:
    from awaken_langchain import _provider_resume

    monkeypatch.setattr(_provider_resume, "CANCEL_TIMEOUT", CANCEL_BOUND, raising=False)


async def _abandon(drive: Drive, server: LoopbackProvider) -> None:
    chunks = drive.iterate(wrapped(server), "Capital?")
    await anext(chunks)
    await chunks.aclose()


async def _spend(drive: Drive, server: LoopbackProvider) -> None:
    policy = dataclasses.replace(NO_WAIT, max_continuations=0)
    with pytest.raises(StreamInterruptedError):
        await drive.stream(wrapped(server, retry_policy=policy), "Capital?")


@pytest.mark.usefixtures("short_cancel")
@pytest.mark.parametrize("leave", [_abandon, _spend], ids=["abandoned", "spent-budget"])
async def test_a_turn_that_ends_early_never_waits_long_for_a_slow_cancel(
    drive: Drive, leave: Callable[[Drive, LoopbackProvider], Any]
) -> None:
    cut = after(FULL, "response.output_text.delta", 2)
    scenario = dataclasses.replace(
        FULL, delay=0.02, fault=Fault.drop_after_events(cut), cancel_delay=SLOW_CANCEL
    )
    with LoopbackProvider([scenario]) as server:
        started = asyncio.get_running_loop().time()
        await leave(drive, server)
        seconds = asyncio.get_running_loop().time() - started
        (cancel,) = server.cancellations()
        assert cancel.path == "/v1/responses/resp_loopback_1/cancel"
        kept = server.background_response("resp_loopback_1")
        assert kept is not None
        assert kept.status == "cancelled"  # the provider got the cancel all the same
    assert seconds < CANCEL_BOUND + 3.0, seconds  # not the provider's SLOW_CANCEL


@pytest.mark.usefixtures("short_cancel")
async def test_a_cancelled_task_never_waits_long_for_a_slow_cancel() -> None:
    paced = dataclasses.replace(FULL, delay=0.02, cancel_delay=SLOW_CANCEL)
    with LoopbackProvider([paced]) as server:
        model = wrapped(server)
        first = asyncio.Event()

        async def read() -> None:
            async for _chunk in model.astream("Capital?"):
                first.set()

        task = asyncio.create_task(read())
        await first.wait()
        started = asyncio.get_running_loop().time()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        seconds = asyncio.get_running_loop().time() - started
        assert [r.path for r in server.cancellations()] == ["/v1/responses/resp_loopback_1/cancel"]
    assert seconds < CANCEL_BOUND + 3.0, seconds


# -- a replacement process --------------------------------------------------------------


def kill_mid_turn(
    server: LoopbackProvider,
    directory: Path,
    run_id: str,
    tokens: int,
    ready: Callable[[StreamCheckpoint], bool] | None = None,
) -> str:
    """Run the worker until it has streamed ``tokens`` chunks and checkpointed a response
    id (and, if given, until its checkpoint is ``ready``), then SIGKILL it; return the
    text it had shown."""
    context = fork_server("tests.provider_resume_child")
    conn, child_end = context.Pipe()
    process = context.Process(
        target=provider_resume_child.worker,
        args=(server.base_url_openai, str(directory), run_id, child_end),
        daemon=True,
    )
    process.start()
    child_end.close()
    shown = []
    store = DiskCacheStreamCheckpointStore(directory)
    try:
        while tokens:
            assert conn.poll(30), "the worker sent nothing for 30 s"
            event = conn.recv()
            assert event["event"] == "token", "the worker finished before it was killed"
            shown.append(event["text"])
            if len(shown) >= tokens:
                saved = store.get(run_id)
                if saved is not None and saved.provider_response_id and saved.partial_text:
                    break
        while ready is not None:
            saved = store.get(run_id)
            if saved is not None and ready(saved):
                break
            assert process.is_alive(), "the worker finished before its checkpoint was ready"
        os.kill(process.pid or 0, signal.SIGKILL)
        process.join(30)
        assert process.exitcode == -signal.SIGKILL
    finally:
        conn.close()
        store.close()
    return "".join(shown)


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return tmp_path / "checkpoints"


def _mid_text(_saved: StreamCheckpoint) -> bool:
    return True


def _mid_call(saved: StreamCheckpoint) -> bool:
    call = saved.in_flight_tool_call
    return call is not None and len(call.partial_args) > 5


def _mid_reasoning(server: LoopbackProvider, delay: float) -> Callable[[StreamCheckpoint], bool]:
    """Ready once the provider has generated the reasoning summary's third delta."""
    generated = after(FULL, "response.reasoning_summary_text.delta", 3)

    def ready(saved: StreamCheckpoint) -> bool:
        kept = server.background_response(saved.provider_response_id or "")
        return kept is not None and time.monotonic() > kept.started + (generated + 1) * delay

    return ready


@pytest.mark.parametrize("where", ["mid-text", "mid-tool-call", "mid-reasoning"])
async def test_killed_worker_is_finished_by_a_fresh_process_resuming_after_the_checkpoint(
    drive: Drive, store_dir: Path, where: str
) -> None:
    run_id = str(uuid.uuid4())
    delay = 0.04
    paced = dataclasses.replace(FULL, delay=delay)
    with LoopbackProvider([paced]) as server:
        if where == "mid-reasoning":
            shown = kill_mid_turn(
                server, store_dir, run_id, tokens=0, ready=_mid_reasoning(server, delay)
            )
            assert shown == ""  # a reasoning item is shown whole
        else:
            ready = _mid_text if where == "mid-text" else _mid_call
            shown = kill_mid_turn(server, store_dir, run_id, tokens=12, ready=ready)
            assert shown
            assert TEXT.startswith(shown)
        store = DiskCacheStreamCheckpointStore(store_dir)
        saved = store.get(run_id)
        assert saved is not None
        assert saved.provider_sequence_number is not None
        if where == "mid-reasoning":  # killed before the reasoning item was whole
            assert saved.completed_blocks == ()
        model = wrapped(server, store=store)
        chunks = await drive.stream(
            model, provider_resume_child.QUESTION, config={"run_id": uuid.UUID(run_id)}
        )
        store.close()
    assert server.errors == []
    assert len(server.requests_for("openai-responses")) == 1  # zero new generations
    # the stream goes on after the checkpoint's last event: nothing before it is read again
    assert [starting_after(r) for r in server.retrievals()] == [saved.provider_sequence_number]
    assert server.cancellations() == []
    assert_lossless(chunks, paced)  # no repeated and no missing text, block or call
    awaken = merge(chunks).response_metadata["awaken"]
    assert awaken["resumed"] is True
    assert awaken["plans"] == ["provider_resume"]
    assert awaken["regenerated_output_tokens"] == 0


async def test_killed_worker_whose_response_expired_is_continued_by_prompt(
    drive: Drive, store_dir: Path
) -> None:
    run_id = str(uuid.uuid4())
    clock = Clock()
    answer_ = Scenario(text=TEXT, chunk_size=7, delay=0.04)
    with LoopbackProvider(
        [answer_], default=continuation_responder(answer_), clock=clock, background_ttl=600.0
    ) as server:
        kill_mid_turn(server, store_dir, run_id, tokens=6)
        clock.now += 601.0
        store = DiskCacheStreamCheckpointStore(store_dir)
        model = wrapped(server, store=store)
        chunks = await drive.stream(
            model, provider_resume_child.QUESTION, config={"run_id": uuid.UUID(run_id)}
        )
        store.close()
    assert text_of(chunks) == TEXT
    assert len(server.requests_for("openai-responses")) == 2  # the continuation
    assert len(server.retrievals()) == 1  # answered 404
    assert merge(chunks).response_metadata["awaken"]["plans"] == ["provider_resume", "R1"]


async def test_checkpoint_without_a_response_id_is_continued_by_prompt(drive: Drive) -> None:
    answer_ = Scenario(text=TEXT, chunk_size=7)
    store = InMemoryStreamCheckpointStore()
    run_id = str(uuid.uuid4())
    with LoopbackProvider(default=continuation_responder(answer_)) as server:
        model = wrapped(server, store=store)
        fingerprint_probe = await drive.stream(model, "Capital?", config={"run_id": uuid.uuid4()})
        assert text_of(fingerprint_probe) == TEXT
        server.reset()
        # a record written without provider resume (or by an older release)
        record = StreamCheckpoint(
            run_id=run_id,
            model=model._model_id(),
            partial_text=TEXT[:40],
            message_id="lc_run--prior",
        )
        store.put(record)
        chunks = await drive.stream(model, "Capital?", config={"run_id": uuid.UUID(run_id)})
    assert text_of(chunks) == TEXT
    assert server.retrievals() == []
    (continuation,) = server.requests_for("openai-responses")
    prefix = continuation.messages[-2]
    assert prefix["role"] == "assistant"
    assert [part["text"] for part in prefix["content"]] == [TEXT[:40].rstrip()]
    assert merge(chunks).response_metadata["awaken"]["plans"] == ["R1"]


def test_checkpoint_keeps_the_response_id_and_sequence_number_and_reads_older_records() -> None:
    record = StreamCheckpoint(
        run_id="turn-1", provider_response_id="resp_1", provider_sequence_number=41
    )
    assert decode_checkpoint(encode_checkpoint(record)) == record
    older = {"schema_version": 3, "run_id": "turn-1", "partial_text": "Paris"}
    loaded = decode_checkpoint(json.dumps(older))
    assert loaded.provider_response_id is None
    assert loaded.provider_sequence_number is None


# -- agents -------------------------------------------------------------------------------


async def test_middleware_forwards_provider_resume_to_the_agents_model(drive: Drive) -> None:
    @tool
    def get_weather(city: str, unit: str, days: int) -> str:
        """The weather forecast for a city."""
        return f"Sunny in {city} for {days} days"

    calls = Scenario(tool_calls=[CALL], chunk_size=7)
    cut = after(calls, "response.function_call_arguments.delta", 2)
    with LoopbackProvider(
        [dataclasses.replace(calls, fault=Fault.drop_after_events(cut)), Scenario(text=TEXT)]
    ) as server:
        agent = create_agent(
            chat(server),
            [get_weather],
            middleware=[StreamRecoveryMiddleware(retry_policy=NO_WAIT, provider_resume=True)],
        )
        state = {"messages": [HumanMessage("Weather in Paris?")]}
        if drive.mode == "sync":
            thread = agent.invoke(state)["messages"]
        else:
            thread = (await agent.ainvoke(state))["messages"]
    assert [c["args"] for c in thread[1].tool_calls] == [
        {"city": "Paris", "unit": "celsius", "days": 3}
    ]
    assert thread[2].content == "Sunny in Paris for 3 days"
    assert thread[-1].text == TEXT
    assert len(server.requests_for("openai-responses")) == 2  # two turns, no recovery request
    assert len(server.retrievals()) == 1


async def test_a_model_fallback_middleware_model_that_cannot_resume_answers_by_prompt(
    drive: Drive,
) -> None:
    plain = Scenario(text=TEXT, chunk_size=7)
    cut = after(plain, "response.output_text.delta", 3)
    fallback_model = "gpt-4o-mini"

    def respond(request: RecordedRequest) -> Scenario:
        if (request.body or {}).get("model") == MODEL:  # the Responses model is overloaded
            return Scenario(fault=Fault.overloaded())
        return continuation_responder(plain)(request)

    with LoopbackProvider(default=respond) as server:
        # the fallback (Chat Completions) is cut mid-answer once
        server.enqueue(
            dataclasses.replace(plain, provider="openai", fault=Fault.drop_after_events(cut))
        )
        fallback = ChatOpenAI(
            model=fallback_model, base_url=server.base_url_openai, api_key="x", max_retries=0
        )
        agent = create_agent(
            chat(server),
            [],
            middleware=[
                ModelFallbackMiddleware(fallback),
                StreamRecoveryMiddleware(
                    retry_policy=dataclasses.replace(
                        NO_WAIT, max_attempts=1, overload_deadline=None
                    ),
                    provider_resume=True,
                ),
            ],
        )
        state = {"messages": [HumanMessage("What is the capital of France?")]}
        if drive.mode == "sync":
            thread = agent.invoke(state)["messages"]
        else:
            thread = (await agent.ainvoke(state))["messages"]
    assert thread[-1].text == TEXT
    assert thread[-1].response_metadata["awaken"]["plans"] == ["R1"]  # continued by prompt
    assert server.retrievals() == []


async def test_response_that_failed_meanwhile_is_continued_by_prompt(drive: Drive) -> None:
    cut = after(Scenario(text=TEXT, chunk_size=7), "response.output_text.delta", 3)

    def fail(kept: BackgroundResponse) -> None:
        failed = responses_failed_frame(
            kept.scenario, kept.ctx, code="server_error", message="failed", sequence_number=cut
        )
        kept.frames[cut:] = [failed]  # the provider failed after what the caller received

    chunks, server = await changed_during_the_backoff(drive, cut, fail)
    assert text_of(chunks) == TEXT
    assert len(server.retrievals()) == 1
    assert len(server.requests_for("openai-responses")) == 2
    assert merge(chunks).response_metadata["awaken"]["plans"] == ["provider_resume", "R1"]


async def test_provider_resume_is_reported_to_callbacks_with_nothing_regenerated(
    drive: Drive,
) -> None:
    class Events(BaseCallbackHandler):
        def __init__(self) -> None:
            self.seen: list[tuple[str, Any]] = []

        def on_custom_event(self, name: str, data: Any, **kwargs: Any) -> None:
            self.seen.append((name, data))

    events = Events()
    cut = after(FULL, "response.output_text.delta", 2)
    with LoopbackProvider([dataclasses.replace(FULL, fault=Fault.drop_after_events(cut))]) as srv:
        await drive.stream(wrapped(srv), "Capital?", config={"callbacks": [events]})
    ((name, data),) = events.seen
    assert name == "awaken_provider_resume"
    assert data["response_id"] == "resp_loopback_1"
    assert data["starting_after"] == cut - 1
    assert data["regenerated_output_tokens"] == 0


async def test_stalled_stream_is_resumed_at_the_provider_after_the_idle_timeout(
    drive: Drive,
) -> None:
    bare = uncut(FULL)  # also builds the SDK's event models, whose first use is slow
    cut = after(FULL, "response.output_text.delta", 3)
    stalled = dataclasses.replace(FULL, fault=Fault.stall(30.0, after_events=cut))
    chunks, server = await recovered(  # gpt-5-mini reasons: its own idle timeout applies
        drive, stalled, stream_idle_timeout=2.0, reasoning_stream_idle_timeout=2.0
    )
    assert text_of(chunks) == text_of(bare)
    assert answer(merge(chunks)) == answer(merge(bare))
    assert len(server.requests_for("openai-responses")) == 1
    assert [starting_after(r) for r in server.retrievals()] == [cut - 1]
    assert merge(chunks).response_metadata["awaken"]["interruptions"] == [
        {"kind": "timeout", "plan": "provider_resume"}
    ]


async def test_invoke_is_resumed_at_the_provider_too(drive: Drive) -> None:
    cut = after(FULL, "response.function_call_arguments.delta", 2)
    with LoopbackProvider([dataclasses.replace(FULL, fault=Fault.drop_after_events(cut))]) as srv:
        message = await drive.invoke(wrapped(srv), "What is the capital of France?")
    bare = merge(uncut(FULL))
    assert message.text == bare.text
    assert message.tool_calls == bare.tool_calls
    assert [b["type"] for b in message.content] == [b["type"] for b in bare.content]
    assert len(srv.requests_for("openai-responses")) == 1
    assert message.response_metadata["awaken"]["plans"] == ["provider_resume"]


# -- with fallback models ---------------------------------------------------------------


async def test_turn_moved_to_a_fallback_finishes_there_and_cancels_the_primarys_response(
    drive: Drive,
) -> None:
    plain = Scenario(text=TEXT, chunk_size=7)
    cut = after(plain, "response.output_text.delta", 3)
    fallback_model = "gpt-4o-mini"
    with LoopbackProvider(
        [dataclasses.replace(plain, fault=Fault.drop_after_events(cut))],
        default=continuation_responder(plain),
    ) as server:
        fallback = ChatOpenAI(
            model=fallback_model, base_url=server.base_url_openai, api_key="x", max_retries=0
        )
        model = wrapped(
            server,
            fallbacks=[fallback],
            retry_policy=dataclasses.replace(NO_WAIT, max_continuations=0),
        )
        chunks = await drive.stream(model, "What is the capital of France?")
        assert not server.errors
        assert text_of(chunks) == TEXT
        assert server.retrievals() == []  # the spent primary is not resumed at the provider
        assert [r.path for r in server.cancellations()] == ["/v1/responses/resp_loopback_1/cancel"]
        (continued,) = [r for r in server.requests if (r.body or {}).get("model") == fallback_model]
        assert "background" not in continued.body
        awaken = merge(chunks).response_metadata["awaken"]
        assert [m["model"] for m in awaken["models"]] == [
            f"openai-chat:{MODEL}",
            f"openai-chat:{fallback_model}",
        ]
        assert awaken["provider_resumes"] == 0
