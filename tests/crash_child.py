"""The process a crash test kills: a LangGraph run through RecoveringChatModel.

A child of kind ``"agent"`` runs ``langchain.agents.create_agent`` over
``RecoveringChatModel(ChatOpenAI(...))`` pointed at the test's loopback
provider, with a real ``SqliteSaver`` on a SQLite file as the agent's memory
and a real checkpoint store (diskcache or file) in a directory. It streams one
turn (``stream_mode="messages"``; ``astream`` over an ``AsyncSqliteSaver`` for
the async path) and exits 0 when the graph has finished.

A child of kind ``"three_calls"`` runs a ``StateGraph`` whose one node asks the
same wrapped model the three :data:`QUESTIONS` in turn (``invoke``; ``ainvoke``
for the async path) and returns the answers in an ``answers`` state key, not as
messages; the same ``SqliteSaver`` file is its memory. It reports
``{"event": "answers", "answers"}`` when the graph run returned.

Nothing in the library knows about these processes. The child reports what it
does on a pipe to the test process, one dict per event, so the test can wait
for an exact point before it sends SIGKILL:

- ``{"event": "started", "library"}`` first, with the path of the
  ``awaken_langchain`` package the child imported;
- ``{"event": "claim", "run_id", "epoch"}`` after the store granted a claim;
- ``{"event": "get", "run_id", "found"}`` after the store was read;
- ``{"event": "put", "run_id", "text", "completed", "in_flight", "message_id",
  "complete", "epoch"}`` after a checkpoint write returned (the data is durable
  at that point);
- ``{"event": "delete", "run_id", "epoch"}`` after a checkpoint was deleted;
- ``{"event": "token", "text"}`` for every streamed message chunk;
- ``{"event": "blocked", "point"}`` when the child stopped at a test-only block
  point (below) and waits for the test to kill it or send ``"go"``;
- ``{"event": "answers", "answers"}`` when a ``three_calls`` graph run returned;
- ``{"event": "done"}`` when the graph run returned.

The store hooks are a subclass of the real store class that calls the real
method first and reports afterwards; the block points are a callback handler.
Both live here, in the test harness, not in the library:

- ``llm_end``: block in ``on_llm_end``, after the model turn completed (its
  checkpoint rewritten as complete) and before the agent node returned, that
  is before LangGraph wrote the turn to the SqliteSaver (the memory commit);
- ``after_run``: block after the graph run returned (LangGraph has committed
  the turn) and before ``release_committed`` deletes the turn's checkpoint;
- ``token:N``: block in ``on_llm_new_token`` on the N-th non-empty token,
  before the wrapper writes the checkpoint that includes it;
- ``complete_put``: block in the store's ``put`` when the wrapper is about to
  write the finished turn's complete checkpoint.

After each run the child calls ``awaken_langchain.history.release_committed``
with the thread's messages, as the library documents for the last turn of a
graph run, so a finished conversation leaves no checkpoint behind.

Checkpoint key: the child passes no run id. Inside a LangGraph node the wrapper
derives the key from the thread, the task and the request
(``<thread_id>:model:<task id>:<request fingerprint>``).
LangGraph's task id is a hash of the last saved graph checkpoint and the node,
so a replacement process that resumes the thread the usual way,
``agent.stream(None, {"configurable": {"thread_id": ...}})``, runs the same task
under the same key and finds the checkpoint. This is what users do after a
crash, and it needs no extra bookkeeping. The child runs the graph with
``durability="sync"``: LangGraph then saves each step's checkpoint before the
next step starts, so the checkpoint the model task was planned from is on disk
before the model is called. With the default ``"async"`` durability a crash
right after the model call began can lose that graph checkpoint; the
replacement would then re-plan the turn under a new task id and not find the
stream checkpoint. Users who want a turn to survive a crash should run the
graph with ``durability="sync"``.

Standard output and error of the child go to ``<output_dir>/<name>.out`` and
``.err``; the ``awaken_langchain`` logger writes to standard error.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sqlite3
import sys
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Literal, TypedDict

from langchain.agents import create_agent
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, StateGraph
from store_kinds import StoreKind, open_store, store_recipe

import awaken_langchain
from awaken_langchain import (
    RecoveringChatModel,
    StreamCheckpoint,
    StreamCheckpointStore,
)
from awaken_langchain.history import arelease_committed, release_committed

ChildKind = Literal["agent", "three_calls"]

QUESTIONS = ("Name a colour.", "Name a fruit.", "Name a city.")
"""What the ``three_calls`` node asks, one model call each, in this order."""

MODEL_NAME = "gpt-4o-mini"


@dataclass(frozen=True)
class ChildSpec:
    """What one child process does.

    Attributes:
        name: Names the child's output files.
        base_url: The loopback provider's OpenAI base URL.
        store_kind: Which checkpoint store to use.
        store_dir: The store's directory (for a server store, what names its
            tables or keys, see :func:`make_store`).
        db_path: The SqliteSaver database file (the agent's memory).
        thread_id: The LangGraph thread.
        tool_log: File the tool appends one JSON line per call to.
        output_dir: Where ``<name>.out`` and ``<name>.err`` are written.
        prompt: The user message of a new turn; ``None`` resumes the thread
            (``agent.stream(None, config)``), as a replacement process does.
        block: A test-only block point (``"llm_end"``, ``"token:N"``) or ``None``.
        checkpoint_every_chunks: The wrapper's checkpoint cadence.
        use_async: Run the graph with ``astream`` over an ``AsyncSqliteSaver``
            (the wrapper's async path) instead of ``stream`` over a ``SqliteSaver``.
        checkpoint_deadline: How long the wrapper waits for the store when it
            must; long here, because block points hold store writes on purpose.
        kind: ``"agent"`` (one agent turn) or ``"three_calls"`` (a node that
            makes three model calls).
        store_address: The server of a ``"postgres"`` (its DSN) or
            ``"redis-cluster"`` (``host:port`` of a node) store.
    """

    name: str
    base_url: str
    store_kind: StoreKind
    store_dir: str
    db_path: str
    thread_id: str
    tool_log: str
    output_dir: str
    prompt: str | None = None
    block: str | None = None
    checkpoint_every_chunks: int = 1
    use_async: bool = False
    checkpoint_deadline: float = 60.0
    kind: ChildKind = "agent"
    store_address: str = ""

    @property
    def stdout_path(self) -> Path:
        """The child's standard output file."""
        return Path(self.output_dir) / f"{self.name}.out"

    @property
    def stderr_path(self) -> Path:
        """The child's standard error file (log records go here)."""
        return Path(self.output_dir) / f"{self.name}.err"


def make_store(kind: StoreKind, directory: str, address: str = "") -> StreamCheckpointStore:
    """Build the real store of ``kind`` on ``directory``."""
    store: StreamCheckpointStore = open_store(kind, directory, address)
    return store


def _reporting_store(spec: ChildSpec, channel: Channel) -> StreamCheckpointStore:
    """The real store, reporting each operation after it returned."""
    report = channel.report
    block = spec.block
    base, args, kwargs = store_recipe(spec.store_kind, spec.store_dir, spec.store_address)

    batching: list[bool] = []  # non-empty while put_many runs (on the writer thread)

    class ReportingStore(base):  # type: ignore[misc]
        def claim(self, run_id: str) -> int:
            epoch = int(super().claim(run_id))
            report("claim", run_id=run_id, epoch=epoch)
            return epoch

        def get(self, run_id: str) -> StreamCheckpoint | None:
            found = super().get(run_id)
            report("get", run_id=run_id, found=found is not None)
            return found  # type: ignore[no-any-return]

        def put(self, checkpoint: StreamCheckpoint) -> None:
            if checkpoint.complete and block == "complete_put":
                channel.block("complete_put")
            super().put(checkpoint)
            if not batching:  # a batch reports once it is committed
                report("put", **describe_checkpoint(checkpoint))

        def put_many(self, checkpoints: Any) -> Any:
            batching.append(True)
            try:
                errors = super().put_many(checkpoints)
            finally:
                batching.pop()
            for checkpoint, error in zip(checkpoints, errors, strict=True):
                if error is None:  # reported once the batch is committed
                    report("put", **describe_checkpoint(checkpoint))
            return errors

        def delete(self, run_id: str, *, epoch: int | None = None) -> None:
            super().delete(run_id, epoch=epoch)
            report("delete", run_id=run_id, epoch=epoch)

    return ReportingStore(*args, **kwargs)


def describe_checkpoint(checkpoint: Any) -> dict[str, Any]:
    """The parts of a checkpoint a crash test waits for and asserts on."""
    in_flight = checkpoint.in_flight_tool_call
    return {
        "run_id": checkpoint.run_id,
        "text": checkpoint.partial_text,
        "completed": [call.name for call in checkpoint.completed_tool_calls],
        "in_flight": None if in_flight is None else in_flight.partial_args,
        "message_id": checkpoint.message_id,
        "complete": checkpoint.complete,
        "epoch": checkpoint.epoch,
    }


def run(spec: ChildSpec, conn: Connection) -> None:
    """Run one agent turn as described by ``spec``, reporting on ``conn``."""
    _redirect_output(spec)
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.WARNING,
        format="%(process)d %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("awaken_langchain").setLevel(logging.INFO)

    channel = Channel(conn)
    channel.report("started", library=str(Path(awaken_langchain.__file__).resolve()))
    if spec.kind == "three_calls":
        _run_three_calls(spec, channel)
        return
    payload = None if spec.prompt is None else {"messages": [("user", spec.prompt)]}
    if spec.use_async:
        asyncio.run(_arun(spec, channel, payload))
    else:
        saver = SqliteSaver(sqlite3.connect(spec.db_path, check_same_thread=False))
        agent, config, store = build_agent(spec, channel, saver)
        stream = agent.stream(payload, config, stream_mode="messages", durability="sync")
        for message, _metadata in stream:
            channel.report("token", text=message.text)
        # LangGraph has committed the run's messages to the SqliteSaver by now.
        if spec.block == "after_run":
            channel.block("after_run")
        release_committed(agent.get_state(config).values.get("messages", []), store)
    channel.report("done")
    sys.stdout.flush()
    sys.stderr.flush()


async def _arun(spec: ChildSpec, channel: Channel, payload: Any) -> None:
    """The async twin of the run: ``astream`` over an ``AsyncSqliteSaver``."""
    async with AsyncSqliteSaver.from_conn_string(spec.db_path) as saver:
        agent, config, store = build_agent(spec, channel, saver)
        stream = agent.astream(payload, config, stream_mode="messages", durability="sync")
        async for message, _metadata in stream:
            channel.report("token", text=message.text)
        if spec.block == "after_run":
            channel.block("after_run")
        state = await agent.aget_state(config)
        await arelease_committed(state.values.get("messages", []), store)


class Channel:
    """The child's end of the pipe to the test process."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def report(self, event: str, **data: Any) -> None:
        """Tell the test what just happened."""
        self.conn.send({"event": event, **data})

    def block(self, point: str) -> None:
        """Report ``point`` and wait until the test sends ``"go"`` (or kills us)."""
        self.report("blocked", point=point)
        message = self.conn.recv()
        if message != "go":
            raise RuntimeError(f"unexpected message from the test: {message!r}")


def build_agent(
    spec: ChildSpec, channel: Channel, saver: BaseCheckpointSaver[Any]
) -> tuple[Any, dict[str, Any], StreamCheckpointStore]:
    """The agent a user would build: ChatOpenAI wrapped, a tool, a SqliteSaver."""
    tool_log = spec.tool_log

    @tool
    def lookup(city: str) -> str:
        """Look up today's weather in a city."""
        with open(tool_log, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"name": "lookup", "args": {"city": city}}) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        return f"Sunny in {city}."

    class BlockPoints(BaseCallbackHandler):
        """Stops the child at an exact library point until it is killed or released."""

        raise_error = True

        def __init__(self, point: str | None) -> None:
            self.point = point
            self.tokens = 0

        def on_llm_new_token(self, token: Any, **kwargs: Any) -> None:
            if not token:
                return
            self.tokens += 1
            if self.point == f"token:{self.tokens}":
                channel.block(self.point)

        def on_llm_end(self, response: Any, **kwargs: Any) -> None:
            if self.point == "llm_end":
                channel.block("llm_end")

    inner = ChatOpenAI(model=MODEL_NAME, base_url=spec.base_url, api_key="x", max_retries=0)
    store = _reporting_store(spec, channel)
    model = RecoveringChatModel(
        model=inner,
        store=store,
        checkpoint_every_chunks=spec.checkpoint_every_chunks,
        checkpoint_deadline=spec.checkpoint_deadline,
    )
    agent = create_agent(model, tools=[lookup], checkpointer=saver)
    config = {
        "configurable": {"thread_id": spec.thread_id},
        "callbacks": [BlockPoints(spec.block)],
    }
    return agent, config, store


class Answers(TypedDict, total=False):
    """The state of the ``three_calls`` graph: the node's answers, no messages."""

    answers: list[str]


def _run_three_calls(spec: ChildSpec, channel: Channel) -> None:
    """Run (or, with ``prompt=None``, resume) the ``three_calls`` graph once."""
    payload: Answers | None = None if spec.prompt is None else {"answers": []}
    config: dict[str, Any] = {"configurable": {"thread_id": spec.thread_id}}
    if spec.use_async:

        async def arun() -> Any:
            async with AsyncSqliteSaver.from_conn_string(spec.db_path) as saver:
                graph = build_three_calls(spec, channel, saver)
                return await graph.ainvoke(payload, config, durability="sync")

        result = asyncio.run(arun())
    else:
        saver = SqliteSaver(sqlite3.connect(spec.db_path, check_same_thread=False))
        result = build_three_calls(spec, channel, saver).invoke(payload, config, durability="sync")
    channel.report("answers", answers=list(result["answers"]))
    channel.report("done")
    sys.stdout.flush()
    sys.stderr.flush()


def build_three_calls(spec: ChildSpec, channel: Channel, saver: BaseCheckpointSaver[Any]) -> Any:
    """A graph whose one node asks the wrapped ChatOpenAI three questions."""
    inner = ChatOpenAI(model=MODEL_NAME, base_url=spec.base_url, api_key="x", max_retries=0)
    store = _reporting_store(spec, channel)
    model = RecoveringChatModel(
        model=inner,
        store=store,
        checkpoint_every_chunks=spec.checkpoint_every_chunks,
        checkpoint_deadline=spec.checkpoint_deadline,
    )

    def ask(state: Answers) -> Answers:
        return {"answers": [model.invoke(question).text for question in QUESTIONS]}

    async def aask(state: Answers) -> Answers:
        return {"answers": [(await model.ainvoke(question)).text for question in QUESTIONS]}

    graph = StateGraph(Answers)
    graph.add_node("ask", aask if spec.use_async else ask)
    graph.add_edge(START, "ask")
    graph.add_edge("ask", END)
    return graph.compile(checkpointer=saver)


def _redirect_output(spec: ChildSpec) -> None:
    Path(spec.output_dir).mkdir(parents=True, exist_ok=True)
    for fd, path in ((1, spec.stdout_path), (2, spec.stderr_path)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(target, fd)
        os.close(target)


def _warm_up() -> None:
    """Build a throwaway model and agent, so lazy imports happen before any fork.

    The fork server imports this module once; the SDK client and LangGraph
    import more modules on first use, and doing that here spares every child
    the cost. No connection is made.
    """
    inner = ChatOpenAI(model=MODEL_NAME, base_url="http://127.0.0.1:9/v1", api_key="x")
    create_agent(RecoveringChatModel(model=inner), tools=[])


_warm_up()
