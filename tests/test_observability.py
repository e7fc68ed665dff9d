"""Recovery is visible where users already look: tracers, graph streams, spans, logs.

The real ChatOpenAI talks to the loopback provider through the openai SDK
(``max_retries=0``); tracers are LangChain's own ``BaseTracer``; graphs are real
LangGraph graphs; spans go through the real opentelemetry-sdk.
"""

from __future__ import annotations

import asyncio
import email.parser
import http.server
import json
import logging
import operator
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, ClassVar

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.runnables import RunnableLambda
from langchain_core.tracers import BaseTracer
from langchain_core.tracers.langchain import LangChainTracer
from langchain_core.tracers.schemas import Run
from langchain_openai import ChatOpenAI
from langgraph.graph import START, StateGraph
from langsmith import Client
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from typing_extensions import TypedDict

from awaken_langchain import (
    InMemoryStreamCheckpointStore,
    RecoveringChatModel,
    RetryPolicy,
    StreamInterruptedError,
)
from awaken_langchain.events import RECOVERED_TAG
from awaken_langchain.testing import Fault, LoopbackProvider, Scenario, continuation_responder
from tests.conftest import Drive

pytestmark = pytest.mark.asyncio(loop_scope="module")

REPO_ROOT = str(Path(__file__).resolve().parent.parent)
ANSWER = "The quick brown fox jumps over the lazy dog, then naps in the warm afternoon sun."
PROMPT = "Tell me about the fox"


async def _no_wait(_seconds: float) -> None:
    return None


@pytest.fixture
def server(shared_server: LoopbackProvider) -> LoopbackProvider:
    shared_server.reset()
    shared_server.default = continuation_responder(Scenario(text=ANSWER))
    return shared_server


def inner(server: LoopbackProvider) -> ChatOpenAI:
    return ChatOpenAI(
        model="gpt-4o-mini", base_url=server.base_url_openai, api_key="x", max_retries=0
    )


def wrapper(server: LoopbackProvider, **settings: Any) -> RecoveringChatModel:
    policy = RetryPolicy(sleep=lambda _s: None, async_sleep=_no_wait, **settings.pop("policy", {}))
    return RecoveringChatModel(model=inner(server), retry_policy=policy, **settings)


def retry_then_cut(server: LoopbackProvider) -> None:
    """An overload before output, then a connection dropped mid-answer."""
    server.enqueue(
        Scenario(fault=Fault.overloaded()),
        Scenario(text=ANSWER, fault=Fault.drop_after_events(6)),
    )


def text_of(chunks: list[AIMessageChunk]) -> str:
    return "".join(str(c.content) for c in chunks)


class RecordingTracer(BaseTracer):
    """A LangChain tracer that keeps the finished run trees, as LangSmith's would send them."""

    def __init__(self) -> None:
        super().__init__()
        self.roots: list[Run] = []

    def _persist_run(self, run: Run) -> None:
        self.roots.append(run)


def model_run(tracer: RecordingTracer) -> Run:
    """The chat model's run in the tracer's tree (the root, or the root's descendant)."""
    pending = list(tracer.roots)
    while pending:
        run = pending.pop()
        if run.run_type in ("llm", "chat_model"):
            return run
        pending.extend(run.child_runs)
    raise AssertionError("no model run was traced")


# -- tracers: LangChain's retry callback and the recovered mark ---------------------------


@pytest.mark.parametrize("call", ["stream", "invoke"])
async def test_a_tracer_sees_each_retry_and_continuation_as_a_retry_event_of_the_model_run(
    server: LoopbackProvider, drive: Drive, call: str
) -> None:
    retry_then_cut(server)
    tracer = RecordingTracer()
    model = wrapper(server)
    if call == "stream":
        answer = text_of(await drive.stream(model, PROMPT, config={"callbacks": [tracer]}))
    else:
        answer = str((await drive.invoke(model, PROMPT, config={"callbacks": [tracer]})).content)
    assert answer == ANSWER
    run = model_run(tracer)
    retries = [e["kwargs"] for e in run.events if e["name"] == "retry"]
    assert [r["outcome"] for r in retries] == ["failed", "failed"]
    assert [r["attempt"] for r in retries] == [1, 2]
    # what the provider integration raised: the overload, then the dropped connection
    assert [r["exception_type"] for r in retries] == ["OpenAIAPIError", "OpenAIConnectionError"]
    assert "529" in retries[0]["exception"]
    assert 0 < retries[0]["slept"] <= retries[1]["slept"]  # backoff so far, as tenacity counts
    names = [e["name"] for e in run.events]
    assert names.index("retry") < names.index("end")


async def test_a_recovered_turn_is_tagged_and_described_in_the_traced_model_run(
    server: LoopbackProvider, drive: Drive
) -> None:
    retry_then_cut(server)
    tracer = RecordingTracer()
    await drive.stream(wrapper(server), PROMPT, config={"callbacks": [tracer]})
    run = model_run(tracer)
    assert RECOVERED_TAG in run.tags
    metadata = run.extra["metadata"]
    assert metadata["awaken_recovered"] is True
    assert metadata["awaken_plans"] == ["R4", "R1"]
    assert (metadata["awaken_retries"], metadata["awaken_continuations"]) == (1, 1)
    assert metadata["awaken_resumed"] is False
    output = run.outputs["generations"][0][0]["message"]["kwargs"]  # type: ignore[index]
    assert output["response_metadata"]["awaken"]["plans"] == ["R4", "R1"]


async def test_a_turn_that_could_not_be_recovered_is_traced_with_its_retries_but_untagged(
    server: LoopbackProvider, drive: Drive
) -> None:
    server.default = Scenario(text=ANSWER, fault=Fault.drop_after_events(5))
    tracer = RecordingTracer()
    model = wrapper(server, policy={"max_continuations": 1})
    with pytest.raises(StreamInterruptedError):
        await drive.stream(model, PROMPT, config={"callbacks": [tracer]})
    run = model_run(tracer)
    assert run.error is not None
    assert [e["name"] for e in run.events].count("retry") == 1
    assert RECOVERED_TAG not in run.tags
    assert run.extra["metadata"]["awaken_recovered"] is False
    assert run.extra["metadata"]["awaken_plans"] == ["R1"]


async def test_a_turn_without_a_fault_leaves_the_traced_run_as_the_bare_model_leaves_it(
    server: LoopbackProvider, drive: Drive
) -> None:
    wrapped, bare = RecordingTracer(), RecordingTracer()
    await drive.stream(wrapper(server), PROMPT, config={"callbacks": [wrapped]})
    await drive.stream(inner(server), PROMPT, config={"callbacks": [bare]})
    run, bare_run = model_run(wrapped), model_run(bare)
    lifecycle = [e["name"] for e in run.events if e["name"] != "new_token"]
    assert lifecycle == [e["name"] for e in bare_run.events if e["name"] != "new_token"]
    assert lifecycle == ["start", "end"]
    assert run.tags == bare_run.tags
    assert not any(k.startswith("awaken_") for k in run.extra.get("metadata", {}))
    params, bare_params = run.extra["invocation_params"], bare_run.extra["invocation_params"]
    assert {k: v for k, v in params.items() if k not in ("_type", "awaken")} == {
        k: v for k, v in bare_params.items() if k != "_type"
    }  # model, temperature, ...: where tracing dashboards read them


@pytest.mark.parametrize("call", ["stream", "invoke"])
async def test_callbacks_tags_and_metadata_set_on_the_inner_model_reach_its_run(
    server: LoopbackProvider, drive: Drive, call: str
) -> None:
    def configured(tracer: RecordingTracer) -> ChatOpenAI:
        model = inner(server)  # its metadata names the langchain-openai version
        metadata = {**(model.metadata or {}), "tenant": "t1"}
        return model.model_copy(
            update={"callbacks": [tracer], "tags": ["team-a"], "metadata": metadata}
        )

    wrapped, bare = RecordingTracer(), RecordingTracer()
    policy = RetryPolicy(sleep=lambda _s: None, async_sleep=_no_wait)
    model = RecoveringChatModel(model=configured(wrapped), retry_policy=policy)
    await getattr(drive, call)(model, PROMPT, config={"tags": ["per-call"]})
    await getattr(drive, call)(configured(bare), PROMPT, config={"tags": ["per-call"]})
    run, bare_run = model_run(wrapped), model_run(bare)
    assert sorted(run.tags or []) == sorted(bare_run.tags or []) == ["per-call", "team-a"]
    metadata = run.extra["metadata"]
    assert metadata["tenant"] == "t1"
    assert metadata["lc_versions"] == bare_run.extra["metadata"]["lc_versions"]
    assert "langchain-openai" in metadata["lc_versions"]


async def test_a_tracer_inside_a_chain_sees_the_retries_under_the_model_run(
    server: LoopbackProvider, drive: Drive
) -> None:
    retry_then_cut(server)
    tracer = RecordingTracer()
    model = wrapper(server)
    chain = RunnableLambda(lambda q: q) | model
    answer = await drive.invoke(chain, PROMPT, config={"callbacks": [tracer]})
    assert answer.content == ANSWER
    assert tracer.roots[0].run_type == "chain"
    run = model_run(tracer)
    assert [e["name"] for e in run.events].count("retry") == 2
    assert RECOVERED_TAG in run.tags


class LangSmithRecorder(http.server.BaseHTTPRequestHandler):
    """A local LangSmith endpoint: keeps what run creates and updates carry.

    A JSON request is kept as ``(method, body)``; a multipart batch as one
    ``(part name, part)`` per part (``"patch.<run id>.events"``, ...).
    """

    bodies: ClassVar[list[tuple[str, Any]]] = []

    def _record(self) -> None:
        data = self.rfile.read(int(self.headers.get("content-length") or 0))
        kind = self.headers.get("content-type") or ""
        if kind == "application/json" and data:
            self.bodies.append((self.command, json.loads(data)))
        elif kind.startswith("multipart/") and data:
            head = f"content-type: {kind}\r\n\r\n".encode()
            message = email.parser.BytesParser().parsebytes(head + data)
            for part in message.get_payload():
                name = part.get_param("name", header="content-disposition")
                self.bodies.append((str(name), json.loads(part.get_payload(decode=True))))
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}")

    do_GET = do_POST = do_PATCH = _record

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def langsmith() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), LangSmithRecorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    thread.join()


async def test_langsmith_receives_the_retry_events_tag_and_metadata_of_a_recovered_run(
    server: LoopbackProvider, drive: Drive, langsmith: str
) -> None:
    LangSmithRecorder.bodies.clear()
    client = Client(api_url=langsmith, api_key="x", auto_batch_tracing=False)
    tracer = LangChainTracer(client=client, project_name="observability")
    retry_then_cut(server)
    chunks = await drive.stream(wrapper(server), PROMPT, config={"callbacks": [tracer]})
    assert text_of(chunks) == ANSWER
    tracer.wait_for_futures()
    (end,) = [body for method, body in LangSmithRecorder.bodies if method == "PATCH"]
    assert [e["kwargs"]["attempt"] for e in end["events"] if e["name"] == "retry"] == [1, 2]
    assert RECOVERED_TAG in end["tags"]
    assert end["extra"]["metadata"]["awaken_recovered"] is True
    assert end["extra"]["metadata"]["awaken_plans"] == ["R4", "R1"]


_TRACED_BY_ENVIRONMENT = """
import asyncio, sys
from langchain_core.tracers.langchain import wait_for_all_tracers
from langchain_openai import ChatOpenAI
from awaken_langchain import RecoveringChatModel, RetryPolicy

async def no_wait(seconds):
    pass

inner = ChatOpenAI(model="gpt-4o-mini", base_url=sys.argv[1], api_key="x", max_retries=0)
policy = RetryPolicy(sleep=lambda s: None, async_sleep=no_wait)
model = RecoveringChatModel(model=inner, retry_policy=policy)
if sys.argv[2] == "sync":
    chunks = list(model.stream("Tell me about the fox"))
else:
    async def main():
        return [c async for c in model.astream("Tell me about the fox")]
    chunks = asyncio.run(main())
wait_for_all_tracers()
print("".join(c.content for c in chunks))
"""


async def test_langsmith_from_the_environment_sees_the_retries_of_a_bare_stream(
    server: LoopbackProvider, drive: Drive, langsmith: str
) -> None:
    LangSmithRecorder.bodies.clear()
    retry_then_cut(server)
    traced = {"LANGSMITH_TRACING": "true", "LANGSMITH_ENDPOINT": langsmith}
    done = await python(
        _TRACED_BY_ENVIRONMENT,
        server.base_url_openai,
        drive.mode,
        env={**traced, "LANGSMITH_API_KEY": "x"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ANSWER
    parts = dict(LangSmithRecorder.bodies)
    (end,) = [name for name in parts if name.startswith("patch.") and name.count(".") == 1]
    events = parts[f"{end}.events"]
    assert [e["kwargs"]["attempt"] for e in events if e["name"] == "retry"] == [1, 2]
    assert RECOVERED_TAG in parts[end]["tags"]
    assert parts[f"{end}.extra"]["metadata"]["awaken_plans"] == ["R4", "R1"]


# -- LangGraph: the graph's custom stream --------------------------------------------------


class State(TypedDict):
    messages: Annotated[list[BaseMessage], operator.add]


def graph_of(model: RecoveringChatModel) -> Any:
    def call_model(state: State) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    async def acall_model(state: State) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(State)
    builder.add_node("model", RunnableLambda(call_model, afunc=acall_model))
    builder.add_edge(START, "model")
    return builder.compile()


async def test_recovery_events_reach_the_graphs_custom_stream(
    server: LoopbackProvider, drive: Drive
) -> None:
    retry_then_cut(server)
    graph = graph_of(wrapper(server))
    state = {"messages": [("user", PROMPT)]}
    if drive.mode == "sync":
        parts = list(graph.stream(state, stream_mode=["custom", "values"]))
    else:
        parts = [part async for part in graph.astream(state, stream_mode=["custom", "values"])]
    custom = [data for mode, data in parts if mode == "custom"]
    assert [c["event"] for c in custom] == ["awaken_retry", "awaken_continuation"]
    assert [c["data"]["plan"] for c in custom] == ["R4", "R1"]
    assert custom[0]["data"]["cause"] == "overloaded"
    assert all(uuid.UUID(c["run_id"]) for c in custom)
    final = [data for mode, data in parts if mode == "values"][-1]
    assert final["messages"][-1].content == ANSWER


async def test_a_graph_without_faults_streams_no_custom_events(
    server: LoopbackProvider, drive: Drive
) -> None:
    graph = graph_of(wrapper(server))
    state = {"messages": [("user", PROMPT)]}
    if drive.mode == "sync":
        custom = list(graph.stream(state, stream_mode="custom"))
    else:
        custom = [part async for part in graph.astream(state, stream_mode="custom")]
    assert custom == []


async def test_outside_a_graph_recovery_needs_no_graph_stream(
    server: LoopbackProvider, drive: Drive
) -> None:
    graph_of(wrapper(server))  # LangGraph is loaded, but this call is not in a graph
    retry_then_cut(server)
    chain = RunnableLambda(lambda q: q) | wrapper(server)
    assert (await drive.invoke(chain, PROMPT)).content == ANSWER


# -- OpenTelemetry: one span per turn ------------------------------------------------------

_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


def turn_spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name.startswith("chat")]


async def test_a_recovered_turn_is_one_span_with_an_event_per_recovery(
    server: LoopbackProvider, drive: Drive, spans: InMemorySpanExporter
) -> None:
    retry_then_cut(server)
    chunks = await drive.stream(wrapper(server), PROMPT, stream_usage=True)
    assert text_of(chunks) == ANSWER
    (span,) = turn_spans(spans)
    assert span.name == "chat gpt-4o-mini"
    assert span.kind is trace.SpanKind.CLIENT
    attributes = dict(span.attributes or {})
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.provider.name"] == "openai"
    assert attributes["gen_ai.request.model"] == "gpt-4o-mini"
    assert attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert attributes["gen_ai.usage.output_tokens"] > 0
    assert attributes["gen_ai.usage.input_tokens"] > 0
    assert attributes["gen_ai.response.model"] == "gpt-4o-mini"
    assert (attributes["awaken.attempts"], attributes["awaken.retries"]) == (3, 1)
    assert attributes["awaken.plans"] == ("R4", "R1")
    assert span.status.status_code is StatusCode.UNSET
    events = [(e.name, dict(e.attributes or {})) for e in span.events]
    assert [name for name, _ in events] == ["awaken_retry", "awaken_continuation"]
    retry, continuation = (attrs for _, attrs in events)
    assert (retry["awaken.plan"], retry["awaken.cause"], retry["awaken.attempt"]) == (
        "R4",
        "overloaded",
        1,
    )
    assert continuation["awaken.plan"] == "R1"
    assert continuation["awaken.attempt"] == 2
    assert isinstance(retry["awaken.delay"], float)


async def test_a_turn_without_a_fault_is_one_span_without_events(
    server: LoopbackProvider, drive: Drive, spans: InMemorySpanExporter
) -> None:
    await drive.invoke(wrapper(server), PROMPT)
    (span,) = turn_spans(spans)
    assert list(span.events) == []
    assert dict(span.attributes or {})["awaken.attempts"] == 1


async def test_a_failed_turn_ends_its_span_with_an_error_status(
    server: LoopbackProvider, drive: Drive, spans: InMemorySpanExporter
) -> None:
    server.default = Scenario(text=ANSWER, fault=Fault.drop_after_events(5))
    model = wrapper(server, policy={"max_continuations": 1})
    with pytest.raises(StreamInterruptedError):
        await drive.stream(model, PROMPT)
    (span,) = turn_spans(spans)
    assert span.status.status_code is StatusCode.ERROR
    assert dict(span.attributes or {})["error.type"] == "StreamInterruptedError"
    names = [e.name for e in span.events]
    assert names == ["awaken_continuation", "exception"]


async def test_a_resumed_turn_has_a_resume_event_in_its_span(
    server: LoopbackProvider, drive: Drive, spans: InMemorySpanExporter
) -> None:
    store = InMemoryStreamCheckpointStore()
    config = {"run_id": uuid.uuid4()}
    server.enqueue(Scenario(text=ANSWER, fault=Fault.drop_after_events(8)))
    first = wrapper(server, store=store, policy={"max_continuations": 0})
    with pytest.raises(StreamInterruptedError):
        await drive.invoke(first, PROMPT, config=config)
    second = wrapper(server, store=store)
    assert (await drive.invoke(second, PROMPT, config=config)).content == ANSWER
    failed, resumed = turn_spans(spans)
    assert failed.status.status_code is StatusCode.ERROR
    (event,) = resumed.events
    assert event.name == "awaken_resume"
    assert dict(event.attributes or {})["awaken.plan"] == "R1"
    assert dict(resumed.attributes or {})["awaken.resumed"] is True


# -- replayed chunks -----------------------------------------------------------------------


async def test_chunks_replayed_from_a_checkpoint_are_marked_and_merge_into_the_answer(
    server: LoopbackProvider, drive: Drive
) -> None:
    store = InMemoryStreamCheckpointStore()
    config = {"run_id": uuid.uuid4()}
    server.enqueue(Scenario(text=ANSWER, fault=Fault.drop_after_events(8)))
    first = wrapper(server, store=store, policy={"max_continuations": 0})
    with pytest.raises(StreamInterruptedError) as raised:
        await drive.invoke(first, PROMPT, config=config)
    assert raised.value.partial is not None
    saved = str(raised.value.partial.content)

    chunks = await drive.stream(wrapper(server, store=store), PROMPT, config=config)
    replayed = [c for c in chunks if c.response_metadata.get("awaken") == {"replayed": True}]
    assert text_of(replayed) == saved
    assert chunks[: len(replayed)] == replayed  # replayed first, then new text
    new = chunks[len(replayed) : -1]
    assert text_of(new) == ANSWER[len(saved) :]
    assert all("awaken" not in c.response_metadata for c in new)
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged += chunk
    assert merged.content == ANSWER
    awaken = merged.response_metadata["awaken"]
    assert awaken == chunks[-1].response_metadata["awaken"]
    assert (awaken["resumed"], awaken["replayed"]) == (True, True)


async def test_a_turn_that_resumed_nothing_reports_nothing_replayed(
    server: LoopbackProvider, drive: Drive
) -> None:
    answer = await drive.invoke(wrapper(server, store=InMemoryStreamCheckpointStore()), PROMPT)
    assert isinstance(answer, AIMessage)
    assert answer.response_metadata["awaken"]["replayed"] is False


# -- logging -------------------------------------------------------------------------------


async def test_the_package_logger_has_a_null_handler_and_modules_log_under_it() -> None:
    package = logging.getLogger("awaken_langchain")
    assert any(isinstance(h, logging.NullHandler) for h in package.handlers)
    from awaken_langchain import engine, events, model, writer

    for module in (events, model, writer, engine):
        name = module.__name__
        assert name.startswith("awaken_langchain.")
        logger = getattr(module, "logger", None)
        assert logger is None or logger.name == name


async def test_recovery_log_records_carry_the_event_as_structured_fields(
    server: LoopbackProvider, drive: Drive, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="awaken_langchain")
    retry_then_cut(server)
    config = {"run_id": uuid.uuid4()}
    await drive.stream(wrapper(server), PROMPT, config=config)
    records = [r for r in caplog.records if hasattr(r, "awaken_event")]
    assert [r.awaken_event for r in records] == ["awaken_retry", "awaken_continuation"]
    retry = records[0]
    assert retry.name == "awaken_langchain.events"
    assert retry.awaken_run_id == str(config["run_id"])
    assert (retry.awaken_plan, retry.awaken_cause, retry.awaken_attempt) == (
        "R4",
        "overloaded",
        1,
    )
    assert isinstance(retry.awaken_delay, float)


# -- without the optional packages ---------------------------------------------------------

_WITHOUT_OPTIONALS = """
import sys
sys.modules["opentelemetry"] = None  # neither installed: imports fail
sys.modules["langgraph"] = None

from langchain_openai import ChatOpenAI
from awaken_langchain import RecoveringChatModel, RetryPolicy, _telemetry

inner = ChatOpenAI(model="gpt-4o-mini", base_url=sys.argv[1], api_key="x", max_retries=0)
model = RecoveringChatModel(model=inner, retry_policy=RetryPolicy(sleep=lambda s: None))
answer = model.invoke("Tell me about the fox")
assert answer.response_metadata["awaken"]["plans"] == ["R4", "R1"], answer.response_metadata
assert _telemetry.start_turn("gpt-4o-mini", "openai") is None
assert "opentelemetry.trace" not in sys.modules
print(answer.content)
"""

_WITHOUT_SDK = """
from awaken_langchain import _telemetry
assert _telemetry.start_turn("gpt-4o-mini", "openai") is None  # the API alone records nothing
"""


async def python(
    source: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``source`` in a fresh interpreter that imports this checkout."""
    env = {**os.environ, **(env or {}), "PYTHONPATH": REPO_ROOT}
    command = [sys.executable, "-c", source, *args]
    return await asyncio.to_thread(
        subprocess.run, command, env=env, capture_output=True, text=True, timeout=120
    )


async def test_recovery_works_without_opentelemetry_or_langgraph_installed(
    server: LoopbackProvider,
) -> None:
    retry_then_cut(server)
    done = await python(_WITHOUT_OPTIONALS, server.base_url_openai)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ANSWER


async def test_without_a_tracer_provider_a_turn_makes_no_span() -> None:
    done = await python(_WITHOUT_SDK)
    assert done.returncode == 0, done.stderr
