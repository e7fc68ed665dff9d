"""Only complete assistant turns reach memory, once; checkpoints go after the commit.

Memory here is what users run: a LangGraph ``StateGraph`` and ``create_agent`` with
``SqliteSaver`` on a real SQLite file, and a chat message history kept in a real
SQLite file. Each "process" is a fresh wrapper, inner model and memory connection
over the same files; what is asserted is what users see: the messages memory holds
and how many requests reached the provider.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import uuid
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    ToolMessage,
    message_to_dict,
    messages_from_dict,
)
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph

from awaken_langchain import (
    DiskCacheStreamCheckpointStore,
    InMemoryStreamCheckpointStore,
    StreamCheckpoint,
    StreamCheckpointError,
    StreamCheckpointStore,
)
from awaken_langchain.checkpoint import checkpoint_from_dict
from awaken_langchain.errors import StreamCheckpointWarning, StreamInterruptedError
from awaken_langchain.history import (
    acommit_turn,
    arelease_committed,
    commit_turn,
    release_committed,
)
from awaken_langchain.model import RecoveringChatModel
from awaken_langchain.recovery import DEFAULT_CONTINUATION_PROMPT
from awaken_langchain.retry import RetryPolicy
from awaken_langchain.testing.scripted import ScriptedChatModel, finish, text, tool_call
from tests.conftest import Drive


async def _no_wait(_seconds: float) -> None:
    return None


def policy(**settings: Any) -> RetryPolicy:
    return RetryPolicy(sleep=lambda _s: None, async_sleep=_no_wait, **settings)


GIVE_UP = policy(max_attempts=1, max_continuations=0)


def reset() -> ConnectionResetError:
    return ConnectionResetError("connection reset by peer")


def model(
    store: StreamCheckpointStore, *scripts: list[Any], **settings: Any
) -> tuple[RecoveringChatModel, ScriptedChatModel]:
    inner = ScriptedChatModel(scripts=list(scripts))
    settings.setdefault("retry_policy", policy())
    return RecoveringChatModel(model=inner, store=store, **settings), inner


@pytest.fixture
def store(tmp_path: Path) -> Iterator[DiskCacheStreamCheckpointStore]:
    with DiskCacheStreamCheckpointStore(tmp_path / "checkpoints") as opened:
        yield opened


def contents(messages: Sequence[BaseMessage]) -> list[tuple[str, str]]:
    return [(m.type, str(m.content)) for m in messages]


# -- a chat message history in a real SQLite file (as a user would keep one) ------------


class SQLiteHistory(BaseChatMessageHistory):
    """One conversation in a SQLite file; ``add_messages`` is one transaction."""

    def __init__(self, path: Path, session: str) -> None:
        self.path = path
        self.session = session
        with sqlite3.connect(path) as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS messages "
                "(n INTEGER PRIMARY KEY AUTOINCREMENT, session TEXT, body TEXT)"
            )

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        with sqlite3.connect(self.path) as db:
            rows = db.execute(
                "SELECT body FROM messages WHERE session = ? ORDER BY n", (self.session,)
            ).fetchall()
        return messages_from_dict([json.loads(body) for (body,) in rows])

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        with sqlite3.connect(self.path) as db:
            db.executemany(
                "INSERT INTO messages (session, body) VALUES (?, ?)",
                [(self.session, json.dumps(message_to_dict(m))) for m in messages],
            )

    def clear(self) -> None:
        with sqlite3.connect(self.path) as db:
            db.execute("DELETE FROM messages WHERE session = ?", (self.session,))


def chat_turn(
    wrapper: RecoveringChatModel,
    history: BaseChatMessageHistory,
    question: str,
    run_id: uuid.UUID,
    store: StreamCheckpointStore,
    *,
    crash_before_commit: bool = False,
) -> AIMessage:
    """The application's turn: ask with the history, then commit [human, ai]."""
    human = HumanMessage(question)
    answer = wrapper.invoke([*history.messages, human], config={"run_id": run_id})
    if crash_before_commit:
        raise SystemExit("process killed before the commit")
    commit_turn(history, [human, answer], store=store)
    return answer


# -- chat message histories --------------------------------------------------------------


def test_a_committed_turn_is_the_human_message_and_the_whole_answer(
    tmp_path: Path, store: DiskCacheStreamCheckpointStore
) -> None:
    history = SQLiteHistory(tmp_path / "chat.sqlite", "s1")
    wrapper, inner = model(
        store,
        [*text("The answer "), reset()],
        [*text("continues."), finish()],
        keep_until_committed=True,
    )
    run_id = uuid.uuid4()
    chat_turn(wrapper, history, "question", run_id, store)
    assert contents(history.messages) == [
        ("human", "question"),
        ("ai", "The answer continues."),
    ]
    assert DEFAULT_CONTINUATION_PROMPT not in json.dumps(
        [message_to_dict(m) for m in history.messages]
    )
    assert len(inner.calls) == 2  # the continuation is one request
    assert store.get(str(run_id)) is None  # released after the commit


def test_a_turn_that_could_not_be_completed_leaves_the_history_unchanged(
    tmp_path: Path, store: DiskCacheStreamCheckpointStore
) -> None:
    history = SQLiteHistory(tmp_path / "chat.sqlite", "s1")
    history.add_messages([HumanMessage("earlier", id="h0"), AIMessage("reply", id="a0")])
    wrapper, _ = model(
        store, [*text("Half an ans"), reset()], retry_policy=GIVE_UP, keep_until_committed=True
    )
    with pytest.raises(StreamInterruptedError):
        chat_turn(wrapper, history, "question", uuid.uuid4(), store)
    assert contents(history.messages) == [("human", "earlier"), ("ai", "reply")]


def test_the_partial_output_of_an_interrupted_turn_is_refused(
    tmp_path: Path, store: DiskCacheStreamCheckpointStore
) -> None:
    history = SQLiteHistory(tmp_path / "chat.sqlite", "s1")
    wrapper, _ = model(store, [*text("Half an ans"), reset()], retry_policy=GIVE_UP)
    human = HumanMessage("question")
    with pytest.raises(StreamInterruptedError) as interrupted:
        wrapper.invoke([human])
    partial = interrupted.value.partial
    assert partial is not None
    assert partial.content == "Half an ans"
    with pytest.raises(ValueError, match="could not be completed"):
        commit_turn(history, [human, partial], store=store)
    assert history.messages == []


def test_a_turn_finished_before_a_crash_is_committed_without_a_new_request(
    tmp_path: Path, store: DiskCacheStreamCheckpointStore
) -> None:
    history = SQLiteHistory(tmp_path / "chat.sqlite", "s1")
    run_id = uuid.uuid4()
    first, _ = model(store, [*text("Finished answer."), finish()], keep_until_committed=True)
    with pytest.raises(SystemExit):
        chat_turn(first, history, "question", run_id, store, crash_before_commit=True)
    assert history.messages == []
    kept = store.get(str(run_id))
    assert kept is not None
    assert kept.complete
    assert kept.partial_text == "Finished answer."

    second, inner = model(store, keep_until_committed=True)  # no script: any request fails
    answer = chat_turn(second, history, "question", run_id, store)
    assert answer.content == "Finished answer."
    assert len(inner.calls) == 0
    assert contents(history.messages) == [("human", "question"), ("ai", "Finished answer.")]
    assert store.get(str(run_id)) is None


def test_committing_the_same_turn_twice_adds_it_once(
    tmp_path: Path, store: DiskCacheStreamCheckpointStore
) -> None:
    history = SQLiteHistory(tmp_path / "chat.sqlite", "s1")
    wrapper, _ = model(store, [*text("Only once."), finish()], keep_until_committed=True)
    human = HumanMessage("question")
    answer = wrapper.invoke([human], config={"run_id": uuid.uuid4()})
    added = commit_turn(history, [human, answer], store=store)
    again = commit_turn(history, [human, answer], store=store)  # crash after commit, rerun
    assert len(added) == 2
    assert again == []
    assert contents(history.messages) == [("human", "question"), ("ai", "Only once.")]


class _DeleteFailsOnce(DiskCacheStreamCheckpointStore):
    """The process dies between the commit and the checkpoint's deletion."""

    armed = True

    def delete(self, run_id: str, *, epoch: int | None = None) -> None:
        if self.armed:
            self.armed = False
            raise SystemExit("process killed before the checkpoint was deleted")
        super().delete(run_id, epoch=epoch)


def test_rerunning_a_committed_turn_after_a_crash_leaves_memory_unchanged(
    tmp_path: Path,
) -> None:
    history = SQLiteHistory(tmp_path / "chat.sqlite", "s1")
    run_id = uuid.uuid4()
    with _DeleteFailsOnce(tmp_path / "checkpoints") as store:
        first, _ = model(store, [*text("Answer."), finish()], keep_until_committed=True)
        with pytest.raises(SystemExit):
            chat_turn(first, history, "question", run_id, store)
        assert [c.complete for c in store.list_checkpoints()] == [True]
        second, _ = model(store, [*text("Answer."), finish()], keep_until_committed=True)
        chat_turn(second, history, "question", run_id, store)  # the whole turn again
        assert store.list_run_ids() == []
    assert contents(history.messages) == [("human", "question"), ("ai", "Answer.")]


def test_a_turn_is_kept_complete_until_it_is_committed(
    tmp_path: Path, store: DiskCacheStreamCheckpointStore
) -> None:
    history = SQLiteHistory(tmp_path / "chat.sqlite", "s1")
    tools = tool_call("lookup", '{"q": "x"}', id="call_1")
    wrapper, _ = model(
        store, [*text("Let me look."), *tools, finish("tool_calls")], keep_until_committed=True
    )
    run_id = uuid.uuid4()
    answer = wrapper.invoke([HumanMessage("q")], config={"run_id": run_id})
    kept = store.get(str(run_id))
    assert kept is not None
    assert kept.complete
    assert [c.args for c in kept.completed_tool_calls] == [{"q": "x"}]
    assert answer.response_metadata["awaken"]["checkpoint_complete"] is True
    with pytest.raises(ValueError, match="without a ToolMessage"):
        commit_turn(history, [HumanMessage("q"), answer], store=store)
    assert history.messages == []
    assert store.get(str(run_id)) is not None  # nothing committed, nothing released
    commit_turn(
        history,
        [
            HumanMessage("q"),
            answer,
            ToolMessage("found", tool_call_id="call_1"),
            AIMessage("Done.", id="final"),
        ],
        store=store,  # releases the checkpoint kept for the tool-calling message
    )
    assert [m.type for m in history.messages] == ["human", "ai", "tool", "ai"]
    assert store.get(str(run_id)) is None


def test_without_keeping_the_checkpoint_is_deleted_when_the_turn_ends(
    store: DiskCacheStreamCheckpointStore,
) -> None:
    wrapper, _ = model(store, [*text("Plain."), finish()])
    run_id = uuid.uuid4()
    answer = wrapper.invoke("q", config={"run_id": run_id})
    assert store.get(str(run_id)) is None
    assert answer.response_metadata["awaken"]["checkpoint_complete"] is False


class _NoDeleteStore(InMemoryStreamCheckpointStore):
    def delete(self, run_id: str, *, epoch: int | None = None) -> None:
        raise StreamCheckpointError("disk is read-only", run_id=run_id)


def test_a_failed_deletion_after_the_commit_warns_and_keeps_the_turn(tmp_path: Path) -> None:
    store = _NoDeleteStore()
    history = SQLiteHistory(tmp_path / "chat.sqlite", "s1")
    wrapper, _ = model(store, [*text("Kept."), finish()], keep_until_committed=True)
    with pytest.warns(StreamCheckpointWarning, match="read-only"):
        chat_turn(wrapper, history, "question", uuid.uuid4(), store)
    assert contents(history.messages) == [("human", "question"), ("ai", "Kept.")]


async def test_async_commit_adds_the_turn_once_and_releases_it(
    tmp_path: Path, store: DiskCacheStreamCheckpointStore
) -> None:
    history = SQLiteHistory(tmp_path / "chat.sqlite", "s1")
    wrapper, _ = model(
        store, [*text("Async "), reset()], [*text("answer."), finish()], keep_until_committed=True
    )
    run_id = uuid.uuid4()
    human = HumanMessage("question")
    answer = await wrapper.ainvoke([human], config={"run_id": run_id})
    assert (await store.aget(str(run_id))) is not None
    await acommit_turn(history, [human, answer], store=store)
    await acommit_turn(history, [human, answer], store=store)
    assert contents(history.messages) == [("human", "question"), ("ai", "Async answer.")]
    assert (await store.aget(str(run_id))) is None


def test_records_written_before_complete_existed_still_load() -> None:
    old = {
        "schema_version": 1,
        "run_id": "r1",
        "partial_text": "abc",
        "completed_tool_calls": [],
        "in_flight_tool_call": None,
        "retry_count": 0,
        "epoch": 1,
        "updated_at": 5.0,
    }
    checkpoint = checkpoint_from_dict(old)
    assert checkpoint.complete is False
    assert checkpoint.invalid_tool_calls == ()


# -- LangGraph: StateGraph with SqliteSaver on a real file ----------------------------------


class Crash(BaseException):
    """The process dies (not an exception the graph could handle)."""


def chat_graph(
    wrapper: RecoveringChatModel, path: Path, *, crash_after_model: bool = False
) -> tuple[CompiledStateGraph[Any, Any, Any, Any], sqlite3.Connection]:
    def call_model(state: MessagesState) -> dict[str, Any]:
        answer = wrapper.invoke(state["messages"])
        if crash_after_model:
            raise Crash("killed after the model answered, before the node returned")
        return {"messages": [answer]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", call_model)
    graph.add_edge(START, "model")
    graph.add_edge("model", END)
    connection = sqlite3.connect(path, check_same_thread=False)
    return graph.compile(checkpointer=SqliteSaver(connection)), connection


THREAD = {"configurable": {"thread_id": "thread-1"}}


def memory(path: Path) -> list[BaseMessage]:
    connection = sqlite3.connect(path, check_same_thread=False)
    try:
        saved = SqliteSaver(connection).get_tuple(THREAD)
        return [] if saved is None else list(saved.checkpoint["channel_values"]["messages"])
    finally:
        connection.close()


def test_graph_memory_holds_only_the_complete_turn_without_continuation_prompts(
    tmp_path: Path, store: DiskCacheStreamCheckpointStore
) -> None:
    db = tmp_path / "graph.sqlite"
    wrapper, inner = model(store, [*text("Streaming "), reset()], [*text("is fine."), finish()])
    app, connection = chat_graph(wrapper, db)
    app.invoke({"messages": [HumanMessage("question")]}, THREAD)
    connection.close()
    saved = memory(db)
    assert contents(saved) == [("human", "question"), ("ai", "Streaming is fine.")]
    assert all(DEFAULT_CONTINUATION_PROMPT not in str(m.content) for m in saved)
    assert len(inner.calls) == 2


def test_graph_turn_that_could_not_be_completed_leaves_memory_unchanged_and_resumes(
    tmp_path: Path, store: DiskCacheStreamCheckpointStore
) -> None:
    db = tmp_path / "graph.sqlite"
    first, _ = model(store, [*text("The first half "), reset()], retry_policy=GIVE_UP)
    app, connection = chat_graph(first, db)
    with pytest.raises(StreamInterruptedError):
        app.invoke({"messages": [HumanMessage("question")]}, THREAD)
    connection.close()
    assert contents(memory(db)) == [("human", "question")]

    second, inner = model(store, [*text("and the second half."), finish()])
    app, connection = chat_graph(second, db)
    app.invoke(None, THREAD)  # a replacement process resumes the pending step
    connection.close()
    assert contents(memory(db)) == [
        ("human", "question"),
        ("ai", "The first half and the second half."),
    ]
    assert len(inner.calls) == 1
    assert inner.calls[0].messages[-1].content == DEFAULT_CONTINUATION_PROMPT


def test_graph_turn_finished_before_a_crash_is_committed_without_a_new_request(
    tmp_path: Path, store: DiskCacheStreamCheckpointStore
) -> None:
    db = tmp_path / "graph.sqlite"
    first, first_inner = model(store, [*text("Complete answer."), finish()])
    app, connection = chat_graph(first, db, crash_after_model=True)
    with pytest.raises(Crash):
        app.invoke({"messages": [HumanMessage("question")]}, THREAD)
    connection.close()
    assert contents(memory(db)) == [("human", "question")]
    assert len(first_inner.calls) == 1
    assert [c.complete for c in store.list_checkpoints()] == [True]

    second, inner = model(store)  # no script: any request would fail
    app, connection = chat_graph(second, db)
    app.invoke(None, THREAD)
    connection.close()
    assert len(inner.calls) == 0
    assert contents(memory(db)) == [("human", "question"), ("ai", "Complete answer.")]


def test_graph_releases_a_committed_turn_at_the_threads_next_model_call(
    tmp_path: Path, store: DiskCacheStreamCheckpointStore
) -> None:
    db = tmp_path / "graph.sqlite"
    wrapper, _ = model(store, [*text("One."), finish()], [*text("Two."), finish()])
    app, connection = chat_graph(wrapper, db)
    app.invoke({"messages": [HumanMessage("first")]}, THREAD)
    first_key = memory(db)[-1].response_metadata["awaken"]["checkpoint_key"]
    assert store.get(first_key) is not None  # kept until the commit is observed
    app.invoke({"messages": [HumanMessage("second")]}, THREAD)
    connection.close()
    saved = memory(db)
    assert store.get(first_key) is None
    assert contents(saved) == [
        ("human", "first"),
        ("ai", "One."),
        ("human", "second"),
        ("ai", "Two."),
    ]
    release_committed(saved, store)
    assert store.list_run_ids() == []


def test_graph_without_a_checkpointer_deletes_the_checkpoint_at_turn_end(
    store: DiskCacheStreamCheckpointStore,
) -> None:
    wrapper, _ = model(store, [*text("Stateless."), finish()])

    def call_model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [wrapper.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", call_model)
    graph.add_edge(START, "model")
    graph.add_edge("model", END)
    result = graph.compile().invoke({"messages": [HumanMessage("q")]}, THREAD)
    assert result["messages"][-1].content == "Stateless."
    assert store.list_run_ids() == []


def test_committed_checkpoint_found_again_is_not_replayed(
    store: DiskCacheStreamCheckpointStore,
) -> None:
    run_id = uuid.uuid4()
    store.put(
        StreamCheckpoint(
            run_id=str(run_id),
            model="scripted:scripted",
            message_id="answered",
            partial_text="Old answer.",
            complete=True,
        )
    )
    wrapper, inner = model(store, [*text("New answer."), finish()])
    history = [HumanMessage("q1"), AIMessage("Old answer.", id="answered"), HumanMessage("q2")]
    assert wrapper.invoke(history, config={"run_id": run_id}).content == "New answer."
    assert len(inner.calls) == 1


def test_stream_replays_a_complete_checkpoint_as_the_finished_message(
    store: DiskCacheStreamCheckpointStore,
) -> None:
    run_id = uuid.uuid4()
    first, _ = model(store, [*text("Whole reply."), finish()], keep_until_committed=True)
    first.invoke("q", config={"run_id": run_id})
    second, inner = model(store, keep_until_committed=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        chunks = list(second.stream("q", config={"run_id": run_id}))
    assert "".join(str(c.content) for c in chunks) == "Whole reply."
    assert chunks[-1].response_metadata["awaken"]["resumed"] is True
    assert len(inner.calls) == 0


async def test_async_graph_turn_finished_before_a_crash_is_committed_once_and_released(
    tmp_path: Path, store: DiskCacheStreamCheckpointStore
) -> None:
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    db = str(tmp_path / "graph.sqlite")

    def graph(wrapper: RecoveringChatModel, *, crash_after_model: bool = False) -> Any:
        async def call_model(state: MessagesState) -> dict[str, Any]:
            answer = await wrapper.ainvoke(state["messages"])
            if crash_after_model:
                raise Crash("killed after the model answered")
            return {"messages": [answer]}

        builder = StateGraph(MessagesState)
        builder.add_node("model", call_model)
        builder.add_edge(START, "model")
        builder.add_edge("model", END)
        return builder

    first, _ = model(store, [*text("Async complete."), finish()])
    async with AsyncSqliteSaver.from_conn_string(db) as saver:
        with pytest.raises(Crash):
            await (
                graph(first, crash_after_model=True)
                .compile(checkpointer=saver)
                .ainvoke({"messages": [HumanMessage("question")]}, THREAD)
            )

    second, inner = model(store, [*text("Next answer."), finish()])
    async with AsyncSqliteSaver.from_conn_string(db) as saver:
        app = graph(second).compile(checkpointer=saver)
        await app.ainvoke(None, THREAD)
        assert len(inner.calls) == 0  # the finished turn came from its checkpoint
        await app.ainvoke({"messages": [HumanMessage("again")]}, THREAD)
        saved = (await app.aget_state(THREAD)).values["messages"]
    assert contents(saved) == [
        ("human", "question"),
        ("ai", "Async complete."),
        ("human", "again"),
        ("ai", "Next answer."),
    ]
    assert len(inner.calls) == 1
    assert [c.partial_text for c in store.list_checkpoints()] == ["Next answer."]


def test_a_failed_release_by_the_next_model_call_warns_and_the_turn_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    class FailingRelease(InMemoryStreamCheckpointStore):
        refused: str | None = None

        def delete(self, run_id: str, *, epoch: int | None = None) -> None:
            if run_id == self.refused:  # the release of the committed turn
                raise StreamCheckpointError("delete refused", run_id=run_id)
            super().delete(run_id, epoch=epoch)

    store = FailingRelease()
    db = tmp_path / "graph.sqlite"
    wrapper, _ = model(store, [*text("One."), finish()], [*text("Two."), finish()])
    app, connection = chat_graph(wrapper, db)
    app.invoke({"messages": [HumanMessage("first")]}, THREAD)
    store.refused = memory(db)[-1].response_metadata["awaken"]["checkpoint_key"]
    with (
        caplog.at_level(logging.WARNING, logger="awaken_langchain"),
        pytest.warns(StreamCheckpointWarning, match="delete refused"),
    ):
        app.invoke({"messages": [HumanMessage("second")]}, THREAD)
    connection.close()
    assert "delete refused" in caplog.text
    assert contents(memory(db)) == [
        ("human", "first"),
        ("ai", "One."),
        ("human", "second"),
        ("ai", "Two."),
    ]


def hostile(key: str, message_id: str | None = "forged") -> list[BaseMessage]:
    """An input history whose last assistant message claims checkpoint ``key`` as its own."""
    awaken = {"checkpoint_complete": True, "checkpoint_key": key}
    return [
        HumanMessage("hi"),
        AIMessage("hello", id=message_id, response_metadata={"awaken": awaken}),
        HumanMessage("and now?"),
    ]


async def test_an_input_history_cannot_delete_another_threads_interrupted_turn(
    drive: Drive, store: DiskCacheStreamCheckpointStore
) -> None:
    victim = {"run_id": uuid.uuid4(), "configurable": {"thread_id": "thread-a"}}
    first, _ = model(store, [*text("The first half "), reset()], retry_policy=GIVE_UP)
    with pytest.raises(StreamInterruptedError):
        await drive.invoke(first, "question", config=victim)
    key = str(victim["run_id"])
    interrupted = store.get(key)
    assert interrupted is not None

    other, _ = model(store, [*text("Fine."), finish()])
    config = {"configurable": {"thread_id": "thread-b"}}
    assert (await drive.invoke(other, hostile(key), config=config)).content == "Fine."
    assert store.get(key) == interrupted  # the interrupted turn is still there to resume

    second, inner = model(store, [*text("and the second half."), finish()])
    resumed = await drive.invoke(second, "question", config=victim)
    assert resumed.content == "The first half and the second half."
    assert len(inner.calls) == 1  # a continuation, not the whole question again


async def test_an_input_history_cannot_delete_another_threads_kept_turn(
    drive: Drive, store: DiskCacheStreamCheckpointStore
) -> None:
    victim = {"run_id": uuid.uuid4(), "configurable": {"thread_id": "thread-a"}}
    first, _ = model(store, [*text("Kept answer."), finish()], keep_until_committed=True)
    answer = await drive.invoke(first, "question", config=victim)
    key = answer.response_metadata["awaken"]["checkpoint_key"]
    kept = store.get(key)
    assert kept is not None
    assert kept.complete

    other, _ = model(store, *([*text("Fine."), finish()] for _ in range(4)))
    for forged in (hostile(key), hostile(key, message_id=answer.id)):  # even with its id
        for thread in ("thread-b", None):
            config = {"configurable": {"thread_id": thread}} if thread else {}
            assert (await drive.invoke(other, forged, config=config)).content == "Fine."
    assert store.get(key) == kept

    # the thread's own next call, whose history holds the committed answer, releases it
    mine, _ = model(store, [*text("Next."), finish()])
    own = {"configurable": {"thread_id": "thread-a"}}
    assert (await drive.invoke(mine, ["question", answer, "next"], config=own)).content == "Next."
    assert store.get(key) is None


async def test_committing_or_releasing_a_hostile_history_deletes_no_other_turns_checkpoint(
    tmp_path: Path, store: DiskCacheStreamCheckpointStore
) -> None:
    run_id = uuid.uuid4()
    first, _ = model(store, [*text("The first half "), reset()], retry_policy=GIVE_UP)
    with pytest.raises(StreamInterruptedError):
        first.invoke("question", config={"run_id": run_id})
    interrupted = store.get(str(run_id))
    assert interrupted is not None
    kept_id = uuid.uuid4()
    other, _ = model(store, [*text("Kept."), finish()], keep_until_committed=True)
    answer = other.invoke("other question", config={"run_id": kept_id})
    kept = store.get(str(kept_id))
    assert kept is not None

    history = SQLiteHistory(tmp_path / "chat.sqlite", "s1")
    for forged in (hostile(str(run_id)), hostile(str(kept_id))):  # not the kept message's id
        release_committed(forged, store)
        await arelease_committed(forged, store)
        commit_turn(history, forged[:2], store=store)
        await acommit_turn(history, forged[:2], store=store)
    assert store.get(str(run_id)) == interrupted
    assert store.get(str(kept_id)) == kept

    release_committed([HumanMessage("other question"), answer], store)  # its own message
    assert store.get(str(kept_id)) is None


@pytest.mark.filterwarnings("ignore::langchain_core._api.deprecation.LangChainDeprecationWarning")
def test_runnable_with_message_history_stores_only_the_recovered_whole_turn(
    tmp_path: Path,
) -> None:
    from langchain_core.runnables.history import RunnableWithMessageHistory

    history = SQLiteHistory(tmp_path / "chat.sqlite", "s1")
    wrapper, _ = model(
        InMemoryStreamCheckpointStore(),
        [*text("Recovered "), reset()],
        [*text("answer."), finish()],
        [*text("Lost"), reset()],
    )
    chat = RunnableWithMessageHistory(wrapper, lambda _session: history)
    config = {"configurable": {"session_id": "s1"}}
    assert "".join(str(c.content) for c in chat.stream("first", config)) == "Recovered answer."
    wrapper.retry_policy = GIVE_UP
    with pytest.raises(StreamInterruptedError):
        chat.invoke("second", config)
    stored = history.messages  # RunnableWithMessageHistory keeps a streamed turn as a chunk
    assert [str(m.content) for m in stored] == ["first", "Recovered answer."]
    assert isinstance(stored[1], AIMessage)
