"""The process a tool-ledger crash test kills: a ``create_agent`` agent whose tool has an effect.

The agent is what a user builds: ``ChatOpenAI`` against the test's loopback
provider, ``StreamRecoveryMiddleware`` and ``ToolLedgerMiddleware`` over a real
checkpoint store (diskcache or file) in a directory, and a real ``SqliteSaver``
file as memory (``AsyncSqliteSaver`` for the async path). Its one tool, ``pay``,
appends a line with its idempotency key to a file (the external effect) and
returns ``"paid <amount>"``.

The child reports on a pipe, one dict per event: ``{"event": "started",
"library"}``, ``{"event": "blocked", "point"}`` when it stopped at a block
point and waits for the test to kill it (or send ``"go"``), ``{"event":
"done"}`` when the graph run returned. Block points (test harness only):

- ``before_effect``: inside the tool, before its effect (the ledger holds
  ``started``);
- ``after_effect``: inside the tool, after its effect is on disk and before it
  returns (the ledger holds ``started``);
- ``before_tool``: outside the ledger, before the tool call reaches it;
- ``after_tool``: outside the ledger, after the tool returned and the ledger
  recorded it, before the tools step's write reaches the SqliteSaver;
- ``after_save``: before the model call that follows the tool, when the tools
  step is saved.

Two forms of the same agent (``form``): ``"middleware"`` is ``create_agent``
with ``ToolLedgerMiddleware`` (block points in a middleware outside it);
``"toolnode"`` is a hand-built ``StateGraph`` whose ``ToolNode`` runs
``ledger.wrap(pay)`` (block points in a tool around the wrapped one and in the
model node).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import sys
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Annotated, Any, Literal

from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool, tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

import awaken_langchain
from awaken_langchain import (
    DiskCacheStreamCheckpointStore,
    FileStreamCheckpointStore,
    StreamCheckpointStore,
    ToolLedger,
)
from awaken_langchain.ledger import InjectedIdempotencyKey
from awaken_langchain.middleware import StreamRecoveryMiddleware, ToolLedgerMiddleware

StoreKind = Literal["diskcache", "file", "redis", "postgres"]
Form = Literal["middleware", "toolnode"]


@dataclass(frozen=True)
class LedgerChildSpec:
    """What one child does.

    Attributes:
        name: Names the child's output files.
        base_url: The loopback provider's OpenAI base URL.
        store_kind: The ledger's checkpoint store.
        store_dir: The store's directory (for Redis: the key prefix; for
            PostgreSQL: the table).
        db_path: The SqliteSaver database file.
        thread_id: The LangGraph thread.
        effects: The file the tool appends its effect to.
        output_dir: Where ``<name>.err`` is written.
        prompt: The user message of a new run; ``None`` resumes the thread.
        block: A block point (above) or ``None``.
        use_async: ``astream`` over an ``AsyncSqliteSaver`` instead of ``stream``.
        form: ``"middleware"`` or ``"toolnode"``.
        redis_url: The ``redis-server`` of a ``"redis"`` store.
        postgres_dsn: The PostgreSQL server of a ``"postgres"`` store.
    """

    name: str
    base_url: str
    store_kind: StoreKind
    store_dir: str
    db_path: str
    thread_id: str
    effects: str
    output_dir: str
    prompt: str | None = None
    block: str | None = None
    use_async: bool = False
    form: Form = "middleware"
    redis_url: str | None = None
    postgres_dsn: str | None = None


class Channel:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def report(self, event: str, **data: Any) -> None:
        self.conn.send({"event": event, **data})

    def block(self, point: str) -> None:
        self.report("blocked", point=point)
        if self.conn.recv() != "go":
            raise RuntimeError("unexpected message from the test")


def make_store(spec: LedgerChildSpec) -> StreamCheckpointStore:
    if spec.store_kind == "redis":
        from awaken_langchain.stores.redis import RedisStreamCheckpointStore

        assert spec.redis_url is not None
        return RedisStreamCheckpointStore(spec.redis_url, prefix=spec.store_dir)
    if spec.store_kind == "postgres":
        from awaken_langchain.stores.postgres import PostgresStreamCheckpointStore

        assert spec.postgres_dsn is not None
        return PostgresStreamCheckpointStore(spec.postgres_dsn, table=spec.store_dir)
    if spec.store_kind == "diskcache":
        return DiskCacheStreamCheckpointStore(spec.store_dir)
    return FileStreamCheckpointStore(spec.store_dir)


def build_agent(spec: LedgerChildSpec, channel: Channel, saver: Any) -> Any:
    @tool
    def pay(amount: int, key: Annotated[str, InjectedIdempotencyKey]) -> str:
        """Pay an amount."""
        if spec.block == "before_effect":
            channel.block("before_effect")
        with open(spec.effects, "a", encoding="utf-8") as handle:
            handle.write(f"paid {amount} {key}\n")
            handle.flush()
            os.fsync(handle.fileno())
        if spec.block == "after_effect":
            channel.block("after_effect")
        return f"paid {amount}"

    model = ChatOpenAI(model="gpt-4o-mini", base_url=spec.base_url, api_key="x", max_retries=0)
    ledger = ToolLedger(make_store(spec))

    def after_save(messages: list[Any]) -> None:
        if spec.block == "after_save" and isinstance(messages[-1], ToolMessage):
            channel.block("after_save")

    if spec.form == "toolnode":
        return tool_node_graph(spec, channel, saver, model, ledger.wrap(pay), after_save)

    class BlockPoints(AgentMiddleware):  # type: ignore[type-arg]
        def wrap_tool_call(self, request: Any, handler: Any) -> Any:
            if spec.block == "before_tool":
                channel.block("before_tool")
            result = handler(request)
            if spec.block == "after_tool":
                channel.block("after_tool")
            return result

        async def awrap_tool_call(self, request: Any, handler: Any) -> Any:
            if spec.block == "before_tool":
                channel.block("before_tool")
            result = await handler(request)
            if spec.block == "after_tool":
                channel.block("after_tool")
            return result

        def wrap_model_call(self, request: Any, handler: Any) -> Any:
            after_save(request.messages)
            return handler(request)

        async def awrap_model_call(self, request: Any, handler: Any) -> Any:
            after_save(request.messages)
            return await handler(request)

    return create_agent(
        model,
        tools=[pay],
        middleware=[StreamRecoveryMiddleware(), BlockPoints(), ToolLedgerMiddleware(ledger)],
        checkpointer=saver,
    )


def tool_node_graph(
    spec: LedgerChildSpec,
    channel: Channel,
    saver: Any,
    model: ChatOpenAI,
    wrapped: BaseTool,
    after_save: Any,
) -> Any:
    """A model node and a ``ToolNode`` running the wrapped tool, built by hand."""

    class BlockingTool(BaseTool):
        """The wrapped tool, with the harness's block points around it."""

        inner: BaseTool

        def invoke(self, input: Any, config: Any = None, **kwargs: Any) -> Any:
            if spec.block == "before_tool":
                channel.block("before_tool")
            result = self.inner.invoke(input, config, **kwargs)
            if spec.block == "after_tool":
                channel.block("after_tool")
            return result

        async def ainvoke(self, input: Any, config: Any = None, **kwargs: Any) -> Any:
            if spec.block == "before_tool":
                channel.block("before_tool")
            result = await self.inner.ainvoke(input, config, **kwargs)
            if spec.block == "after_tool":
                channel.block("after_tool")
            return result

        def _run(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    bound = model.bind_tools([wrapped])

    def call_model(state: MessagesState) -> dict[str, Any]:
        after_save(state["messages"])
        return {"messages": [bound.invoke(state["messages"])]}

    async def acall_model(state: MessagesState) -> dict[str, Any]:
        after_save(state["messages"])
        return {"messages": [await bound.ainvoke(state["messages"])]}

    tool = BlockingTool(
        name=wrapped.name,
        description=wrapped.description,
        args_schema=wrapped.args_schema,
        inner=wrapped,
    )
    builder = StateGraph(MessagesState)
    builder.add_node("model", acall_model if spec.use_async else call_model)
    builder.add_node("tools", ToolNode([tool]))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition)
    builder.add_edge("tools", "model")
    return builder.compile(checkpointer=saver)


def run(spec: LedgerChildSpec, conn: Connection) -> None:
    """Run (or, with ``prompt=None``, resume) the thread once, reporting on ``conn``."""
    Path(spec.output_dir).mkdir(parents=True, exist_ok=True)
    target = os.open(Path(spec.output_dir) / f"{spec.name}.err", os.O_WRONLY | os.O_CREAT, 0o600)
    os.dup2(target, 2)
    os.close(target)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO)
    channel = Channel(conn)
    channel.report("started", library=str(Path(awaken_langchain.__file__).resolve()))
    payload = None if spec.prompt is None else {"messages": [("user", spec.prompt)]}
    config = {"configurable": {"thread_id": spec.thread_id}}
    if spec.use_async:

        async def arun() -> None:
            async with AsyncSqliteSaver.from_conn_string(spec.db_path) as saver:
                agent = build_agent(spec, channel, saver)
                await agent.ainvoke(payload, config, durability="sync")

        asyncio.run(arun())
    else:
        saver = SqliteSaver(sqlite3.connect(spec.db_path, check_same_thread=False))
        build_agent(spec, channel, saver).invoke(payload, config, durability="sync")
    channel.report("done")
    sys.stderr.flush()
