"""Inside a LangGraph task every model call has its own checkpoint, and kept ones end.

A node may call the model several times: different questions, a ``batch``, the
same question twice to sample it twice. Each call is checkpointed under its own
key (``<thread_id>:<checkpoint_ns>:<request fingerprint>``, ``#n`` for the n-th
identical request of the task), the same keys again when the node is re-run
after a crash, and a checkpoint is used only for the request that made it.

Inside a graph with a checkpointer a finished turn's checkpoint is kept until
memory commits the turn; a graph that never stores the answer as a message
never commits it, so a kept checkpoint ends after ``keep_max_age``.

Everything here is what users run: the real ``ChatOpenAI`` against the
loopback provider, real ``StateGraph`` runs with ``InMemorySaver`` or a
``SqliteSaver`` file, real checkpoint stores, and for the crash a real process
killed with SIGKILL (the harness of ``test_crash_recovery.py``).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Iterator
from multiprocessing.context import ForkServerContext
from pathlib import Path
from typing import Any, TypedDict

import pytest
from crash_child import QUESTIONS
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from test_crash_recovery import (  # the crash harness: fork server, child, scripted provider
    STALL,
    Child,
    Script,
    World,
    fork_server,  # noqa: F401  (a fixture, used by the crash test)
)

from awaken_langchain import (
    DiskCacheStreamCheckpointStore,
    FileStreamCheckpointStore,
    InMemoryStreamCheckpointStore,
    RecoveringChatModel,
    RetryPolicy,
    StreamCheckpoint,
    StreamCheckpointStore,
    StreamInterruptedError,
)
from awaken_langchain.errors import StreamCheckpointWarning
from awaken_langchain.recovery import DEFAULT_CONTINUATION_PROMPT
from awaken_langchain.testing import (
    Fault,
    LoopbackProvider,
    RecordedRequest,
    Scenario,
    echo_responder,
)
from tests.conftest import Events, FakeClock

ECHO = "You said: "
"""What ``echo_responder`` puts before the question it answers."""


async def _no_wait(_seconds: float) -> None:
    return None


def chat(
    server: LoopbackProvider, store: StreamCheckpointStore, **settings: Any
) -> RecoveringChatModel:
    """``ChatOpenAI`` on the loopback provider, wrapped, checkpointing into ``store``."""
    inner = ChatOpenAI(
        model="gpt-4o-mini", base_url=server.base_url_openai, api_key="x", max_retries=0
    )
    settings.setdefault("retry_policy", RetryPolicy(sleep=lambda _s: None, async_sleep=_no_wait))
    return RecoveringChatModel(model=inner, store=store, **settings)


@pytest.fixture
def server(loopback_provider: LoopbackProvider) -> LoopbackProvider:
    """The loopback provider, echoing each question unless a test scripts it."""
    loopback_provider.default = echo_responder(ECHO)
    return loopback_provider


class Answers(TypedDict, total=False):
    answers: list[str]


Node = Callable[..., Any]


def one_node_graph(node: Node) -> Any:
    """``START -> node -> END`` over ``answers``, with an in-memory checkpointer."""
    graph = StateGraph(Answers)
    graph.add_node("ask", node)
    graph.add_edge(START, "ask")
    graph.add_edge("ask", END)
    return graph.compile(checkpointer=InMemorySaver())


def thread(name: str = "thread-1", *handlers: BaseCallbackHandler) -> RunnableConfig:
    return {"configurable": {"thread_id": name}, "callbacks": list(handlers)}


def questions(server: LoopbackProvider) -> list[str]:
    """The last user message of each request the provider received, in order."""
    return [r.messages[-1]["content"] for r in server.requests_for("openai")]


def kept(store: StreamCheckpointStore) -> dict[str, StreamCheckpoint]:
    """The store's checkpoints by key."""
    return {c.run_id: c for c in store.list_checkpoints()}


@pytest.fixture(params=["sync", "async"])
def use_async(request: pytest.FixtureRequest) -> bool:
    return bool(request.param == "async")


def run_node(
    use_async: bool, calls: Callable[[RunnableConfig], Any], acalls: Callable[..., Any]
) -> Node:
    """A node that makes its model calls with ``calls`` (sync) or ``acalls`` (async)."""

    def node(state: Answers, config: RunnableConfig) -> Answers:
        return {"answers": calls(config)}

    async def anode(state: Answers, config: RunnableConfig) -> Answers:
        return {"answers": await acalls(config)}

    return anode if use_async else node


async def invoke(app: Any, use_async: bool, payload: Any, config: RunnableConfig) -> Any:
    if use_async:
        return await app.ainvoke(payload, config, durability="sync")
    return app.invoke(payload, config, durability="sync")


# -- one key per model call -----------------------------------------------------------


async def test_a_node_asking_three_questions_gets_three_answers_from_three_requests(
    server: LoopbackProvider, use_async: bool
) -> None:
    store = InMemoryStreamCheckpointStore()
    model = chat(server, store)

    async def acalls(config: RunnableConfig) -> list[str]:
        return [(await model.ainvoke(q)).text for q in QUESTIONS]

    app = one_node_graph(
        run_node(use_async, lambda config: [model.invoke(q).text for q in QUESTIONS], acalls)
    )
    result = await invoke(app, use_async, {"answers": []}, thread())

    assert result["answers"] == [ECHO + q for q in QUESTIONS]
    assert questions(server) == list(QUESTIONS)
    checkpoints = kept(store)  # kept, complete, until memory commits (it never will here)
    assert len(checkpoints) == 3
    assert sorted(c.partial_text for c in checkpoints.values()) == sorted(result["answers"])
    assert all(c.complete for c in checkpoints.values())
    assert len({key.rsplit(":", 1)[0] for key in checkpoints}) == 1  # one thread and task


async def test_three_streamed_calls_in_a_node_stream_three_answers(
    server: LoopbackProvider, use_async: bool
) -> None:
    store = InMemoryStreamCheckpointStore()
    model = chat(server, store)

    def calls(config: RunnableConfig) -> list[str]:
        return ["".join(c.text for c in model.stream(q)) for q in QUESTIONS]

    async def acalls(config: RunnableConfig) -> list[str]:
        return ["".join([c.text async for c in model.astream(q)]) for q in QUESTIONS]

    app = one_node_graph(run_node(use_async, calls, acalls))
    streamed: dict[str, str] = {}
    if use_async:
        parts = [p async for p in app.astream({"answers": []}, thread(), stream_mode="messages")]
    else:
        parts = list(app.stream({"answers": []}, thread(), stream_mode="messages"))
    for chunk, _metadata in parts:
        streamed[str(chunk.id)] = streamed.get(str(chunk.id), "") + chunk.text

    assert list(streamed.values()) == [ECHO + q for q in QUESTIONS]  # each token once
    assert questions(server) == list(QUESTIONS)
    assert len(kept(store)) == 3


@pytest.mark.parametrize("max_concurrency", [1, 3])
async def test_batch_in_a_node_answers_each_input_without_fencing(
    server: LoopbackProvider, use_async: bool, max_concurrency: int
) -> None:
    store = InMemoryStreamCheckpointStore()
    model = chat(server, store)
    events = Events()

    def calls(config: RunnableConfig) -> list[str]:
        batch = model.batch(list(QUESTIONS), {**config, "max_concurrency": max_concurrency})
        return [m.text for m in batch]

    async def acalls(config: RunnableConfig) -> list[str]:
        batch = await model.abatch(list(QUESTIONS), {**config, "max_concurrency": max_concurrency})
        return [m.text for m in batch]

    app = one_node_graph(run_node(use_async, calls, acalls))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = await invoke(app, use_async, {"answers": []}, thread("thread-1", events))

    assert result["answers"] == [ECHO + q for q in QUESTIONS]
    assert sorted(questions(server)) == sorted(QUESTIONS)
    assert events.named("awaken_checkpoint_warning") == []
    assert [w for w in caught if issubclass(w.category, StreamCheckpointWarning)] == []
    checkpoints = kept(store)
    assert sorted(c.partial_text for c in checkpoints.values()) == sorted(result["answers"])


async def test_the_same_question_asked_twice_in_a_node_is_sent_twice(
    server: LoopbackProvider, use_async: bool
) -> None:
    server.enqueue(Scenario(text="Heads."), Scenario(text="Tails."))
    store = InMemoryStreamCheckpointStore()
    model = chat(server, store, temperature=1.0)
    flip = "Flip a coin."

    def calls(config: RunnableConfig) -> list[str]:
        return [model.invoke(flip).text, model.invoke(flip).text]

    async def acalls(config: RunnableConfig) -> list[str]:
        return [(await model.ainvoke(flip)).text, (await model.ainvoke(flip)).text]

    app = one_node_graph(run_node(use_async, calls, acalls))
    result = await invoke(app, use_async, {"answers": []}, thread())

    assert result["answers"] == ["Heads.", "Tails."]
    assert questions(server) == [flip, flip]
    first, second = sorted(kept(store))
    assert second == f"{first}#1"  # the second identical request of the task
    assert (kept(store)[first].partial_text, kept(store)[second].partial_text) == (
        "Heads.",
        "Tails.",
    )


class Crash(BaseException):
    """The process dies mid-node (not an exception the graph could handle)."""


async def test_a_rerun_node_finds_each_identical_calls_own_finished_answer(
    server: LoopbackProvider, use_async: bool
) -> None:
    server.enqueue(Scenario(text="Heads."), Scenario(text="Tails."))
    store = InMemoryStreamCheckpointStore()
    model = chat(server, store)
    flip = "Flip a coin."
    crash = [False, True]  # popped from the end: crash on the first run only

    def calls(config: RunnableConfig) -> list[str]:
        answers = [model.invoke(flip).text, model.invoke(flip).text]
        if crash.pop():
            raise Crash("killed after both calls answered, before the node returned")
        return answers

    async def acalls(config: RunnableConfig) -> list[str]:
        answers = [(await model.ainvoke(flip)).text, (await model.ainvoke(flip)).text]
        if crash.pop():
            raise Crash("killed after both calls answered, before the node returned")
        return answers

    app = one_node_graph(run_node(use_async, calls, acalls))
    with pytest.raises(Crash):
        await invoke(app, use_async, {"answers": []}, thread())
    result = await invoke(app, use_async, None, thread())  # the node runs again

    assert result["answers"] == ["Heads.", "Tails."]
    assert questions(server) == [flip, flip]  # both answers came from their checkpoints


async def test_a_checkpoint_of_another_request_under_the_key_is_ignored_and_answered_afresh(
    server: LoopbackProvider, use_async: bool
) -> None:
    store = InMemoryStreamCheckpointStore()
    # A key function that does not tell the node's calls apart: all share one key.
    model = chat(server, store, checkpoint_key=lambda config: "shared")
    events = Events()
    first, second = QUESTIONS[:2]

    def calls(config: RunnableConfig) -> list[str]:
        return [model.invoke(first).text, model.invoke(second).text]

    async def acalls(config: RunnableConfig) -> list[str]:
        return [(await model.ainvoke(first)).text, (await model.ainvoke(second)).text]

    app = one_node_graph(run_node(use_async, calls, acalls))
    result = await invoke(app, use_async, {"answers": []}, thread("thread-1", events))

    assert result["answers"] == [ECHO + first, ECHO + second]  # not the first answer twice
    assert questions(server) == [first, second]
    [ignored] = events.named("awaken_checkpoint_ignored")
    assert ignored["key"] == "shared"
    assert "another request" in ignored["message"]
    assert events.named("awaken_resume") == []
    assert kept(store)["shared"].partial_text == ECHO + second


async def test_a_cut_off_turn_of_another_request_is_never_continued(
    server: LoopbackProvider, use_async: bool
) -> None:
    store = InMemoryStreamCheckpointStore()
    give_up = RetryPolicy(
        max_attempts=1, max_continuations=0, sleep=lambda _s: None, async_sleep=_no_wait
    )
    cut = chat(server, store, checkpoint_key=lambda config: "shared", retry_policy=give_up)
    server.enqueue(Scenario(text="The first answer, cut.", fault=Fault.drop_after_events(3)))
    with pytest.raises(StreamInterruptedError):
        cut.invoke(QUESTIONS[0])
    [saved] = kept(store).values()
    assert saved.partial_text
    assert not saved.complete

    model = chat(server, store, checkpoint_key=lambda config: "shared")
    events = Events()
    config: RunnableConfig = {"callbacks": [events]}
    if use_async:
        answer = await model.ainvoke(QUESTIONS[1], config)
    else:
        answer = model.invoke(QUESTIONS[1], config)

    assert answer.text == ECHO + QUESTIONS[1]
    last = server.requests_for("openai")[-1].messages
    assert [(m["role"], m["content"]) for m in last] == [("user", QUESTIONS[1])]
    assert [e["key"] for e in events.named("awaken_checkpoint_ignored")] == ["shared"]
    assert answer.response_metadata["awaken"]["resumed"] is False


# -- kept complete checkpoints end ----------------------------------------------------

STORE_KINDS: dict[str, Callable[[Path, FakeClock], StreamCheckpointStore]] = {
    "memory": lambda path, clock: InMemoryStreamCheckpointStore(clock=clock),
    "diskcache": lambda path, clock: DiskCacheStreamCheckpointStore(path, clock=clock),
    "file": lambda path, clock: FileStreamCheckpointStore(path, clock=clock),
}


@pytest.fixture(params=sorted(STORE_KINDS))
def local_store(
    request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock
) -> Iterator[StreamCheckpointStore]:
    store = STORE_KINDS[request.param](tmp_path / "checkpoints", clock)
    yield store
    store.close()


class Question(TypedDict, total=False):
    question: str
    answer: str


def answer_graph(model: RecoveringChatModel) -> Any:
    """A graph whose node keeps the model's answer as a string, never as a message."""

    def answer(state: Question) -> Question:
        return {"answer": model.invoke(state["question"]).text}

    graph = StateGraph(Question)
    graph.add_node("answer", answer)
    graph.add_edge(START, "answer")
    graph.add_edge("answer", END)
    return graph.compile(checkpointer=InMemorySaver())


def test_kept_checkpoints_of_a_graph_that_never_stores_messages_end_after_keep_max_age(
    server: LoopbackProvider, local_store: StreamCheckpointStore, clock: FakeClock
) -> None:
    app = answer_graph(chat(server, local_store))  # keep_max_age: the default hour
    for n in range(5):
        result = app.invoke({"question": f"Question {n}?"}, thread())
        assert result["answer"] == f"{ECHO}Question {n}?"

    left = kept(local_store)
    assert len(left) == 5
    assert all(c.complete for c in left.values())
    clock.advance(3599)
    assert all(local_store.get(key) is not None for key in left)

    clock.advance(2)
    assert [local_store.get(key) for key in left] == [None] * 5
    assert local_store.list_run_ids() == []
    assert local_store.gc() == 5
    assert local_store.gc() == 0
    clock.now -= 3601  # back to when they were written: nothing is left to find
    assert local_store.list_run_ids() == []


def test_keep_max_age_sets_how_long_a_kept_checkpoint_outlives_its_turn(
    server: LoopbackProvider, clock: FakeClock
) -> None:
    store = InMemoryStreamCheckpointStore(clock=clock)
    result = answer_graph(chat(server, store, keep_max_age=60)).invoke(
        {"question": "Short-lived?"}, thread()
    )
    [key] = kept(store)
    assert store.get(key) is not None
    clock.advance(61)
    assert store.get(key) is None
    assert store.gc() == 1
    assert result["answer"] == ECHO + "Short-lived?"


async def test_the_threads_next_model_call_releases_the_kept_checkpoint_memory_committed(
    server: LoopbackProvider, use_async: bool
) -> None:
    store = InMemoryStreamCheckpointStore()
    model = chat(server, store)

    def call_model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    async def acall_model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", acall_model if use_async else call_model)
    graph.add_edge(START, "model")
    graph.add_edge("model", END)
    app = graph.compile(checkpointer=InMemorySaver())

    first = await invoke(app, use_async, {"messages": [HumanMessage("first")]}, thread())
    first_key = first["messages"][-1].response_metadata["awaken"]["checkpoint_key"]
    assert list(kept(store)) == [first_key]
    second = await invoke(app, use_async, {"messages": [HumanMessage("second")]}, thread())

    second_key = second["messages"][-1].response_metadata["awaken"]["checkpoint_key"]
    assert [m.text for m in second["messages"]] == [
        "first",
        ECHO + "first",
        "second",
        ECHO + "second",
    ]
    assert list(kept(store)) == [second_key]
    assert second_key != first_key


# -- a process killed mid-node ------------------------------------------------------------


UNCUT = ("Blue, like the sea.", "A ripe mango.", "Paris, of course.")
"""The provider's whole answers to the three questions, in order."""


def fresh(question: str) -> list[tuple[str, str]]:
    return [("user", question)]


def wire(request: RecordedRequest) -> list[tuple[str, str]]:
    return [(m["role"], m.get("content") or "") for m in request.messages]


@pytest.mark.slow
@pytest.mark.parametrize("child_async", [False, True], ids=["sync", "async"])
def test_a_node_killed_during_its_third_call_resumes_each_call_from_its_own_checkpoint(
    tmp_path: Path,
    loopback_provider: LoopbackProvider,
    fork_server: ForkServerContext,  # noqa: F811
    child_async: bool,
) -> None:
    world = World(loopback_provider, fork_server, "diskcache", tmp_path, [])
    prefix = UNCUT[2][:8]  # role chunk + two 4-character deltas, then the stream stalls
    script: Script = world.script(
        Scenario(text=UNCUT[0]),
        Scenario(text=UNCUT[1]),
        Scenario(text=UNCUT[2], fault=Fault.stall(STALL, after_events=3)),
        Scenario(text=UNCUT[2][len(prefix) :]),
    )

    def start(name: str, prompt: str | None) -> Child:
        spec = world.spec(name, prompt=prompt, use_async=child_async)
        child = Child(fork_server, dataclasses.replace(spec, kind="three_calls"))
        world.children.append(child)
        return child

    try:
        first = start("first", "go")
        first.wait_event("put", text=prefix, complete=False)
        script.wait_for_request(3)
        first.kill()
        saved = {c.run_id: c for c in world.checkpoints()}
        finished = sorted(c.partial_text for c in saved.values() if c.complete)
        assert finished == sorted(UNCUT[:2])
        [cut] = [c for c in saved.values() if not c.complete]
        assert cut.partial_text == prefix
        first_keys = {e["run_id"] for e in first.events if e["event"] == "claim"}
        assert first_keys == set(saved)  # three calls, three keys

        replacement = start("replacement", None)  # graph.invoke(None, thread)
        replacement.finish()
    finally:
        for child in world.children:
            if child.process.is_alive():
                child.kill()

    assert replacement.wait_event("answers")["answers"] == list(UNCUT)
    found = [e for e in replacement.events if e["event"] == "get"]
    assert {e["run_id"] for e in found} == first_keys  # the same keys, each found
    assert all(e["found"] for e in found)
    requests = [wire(r) for r in loopback_provider.requests_for("openai")]
    assert requests[:3] == [fresh(q) for q in QUESTIONS]
    assert requests[3:] == [  # calls 1 and 2 were replayed: one continuation, for call 3
        [("user", QUESTIONS[2]), ("assistant", prefix), ("user", DEFAULT_CONTINUATION_PROMPT)]
    ]
    stored = sorted(c.partial_text for c in world.checkpoints())
    assert stored == sorted(UNCUT)  # kept complete, until keep_max_age ends them


async def test_a_node_that_feeds_one_answer_into_its_next_call_keeps_both_until_it_returns(
    server: LoopbackProvider, use_async: bool
) -> None:
    server.enqueue(Scenario(text="A first draft."), Scenario(text="A better draft."))
    store = InMemoryStreamCheckpointStore()
    model = chat(server, store)
    ask, improve = HumanMessage("Draft a slogan."), HumanMessage("Improve it.")
    crash = [False, True]  # popped from the end: crash on the first run only

    def calls(config: RunnableConfig) -> list[str]:
        draft = model.invoke([ask])
        better = model.invoke([ask, draft, improve])
        if crash.pop():
            raise Crash("killed after both calls answered, before the node returned")
        return [draft.text, better.text]

    async def acalls(config: RunnableConfig) -> list[str]:
        draft = await model.ainvoke([ask])
        better = await model.ainvoke([ask, draft, improve])
        if crash.pop():
            raise Crash("killed after both calls answered, before the node returned")
        return [draft.text, better.text]

    app = one_node_graph(run_node(use_async, calls, acalls))
    with pytest.raises(Crash):
        await invoke(app, use_async, {"answers": []}, thread())
    assert len(kept(store)) == 2  # the draft is not committed: its node never returned
    result = await invoke(app, use_async, None, thread())

    assert result["answers"] == ["A first draft.", "A better draft."]
    assert questions(server) == ["Draft a slogan.", "Improve it."]
