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

- ``after_effect``: inside the tool, after its effect is on disk and before it
  returns (the ledger holds ``started``);
- ``after_tool``: in a middleware outside the ledger, after the tool returned
  and the ledger recorded it, before the tools step's write reaches the
  SqliteSaver.
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
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

import awaken_langchain
from awaken_langchain import (
    DiskCacheStreamCheckpointStore,
    FileStreamCheckpointStore,
    StreamCheckpointStore,
    ToolLedger,
)
from awaken_langchain.ledger import InjectedIdempotencyKey
from awaken_langchain.middleware import StreamRecoveryMiddleware, ToolLedgerMiddleware

StoreKind = Literal["diskcache", "file"]


@dataclass(frozen=True)
class LedgerChildSpec:
    """What one child does.

    Attributes:
        name: Names the child's output files.
        base_url: The loopback provider's OpenAI base URL.
        store_kind: The ledger's checkpoint store.
        store_dir: The store's directory.
        db_path: The SqliteSaver database file.
        thread_id: The LangGraph thread.
        effects: The file the tool appends its effect to.
        output_dir: Where ``<name>.err`` is written.
        prompt: The user message of a new run; ``None`` resumes the thread.
        block: ``"after_effect"``, ``"after_tool"`` or ``None``.
        use_async: ``astream`` over an ``AsyncSqliteSaver`` instead of ``stream``.
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


class Channel:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def report(self, event: str, **data: Any) -> None:
        self.conn.send({"event": event, **data})

    def block(self, point: str) -> None:
        self.report("blocked", point=point)
        if self.conn.recv() != "go":
            raise RuntimeError("unexpected message from the test")


def make_store(kind: StoreKind, directory: str) -> StreamCheckpointStore:
    if kind == "diskcache":
        return DiskCacheStreamCheckpointStore(directory)
    return FileStreamCheckpointStore(directory)


def build_agent(spec: LedgerChildSpec, channel: Channel, saver: Any) -> Any:
    @tool
    def pay(amount: int, key: Annotated[str, InjectedIdempotencyKey]) -> str:
        """Pay an amount."""
        with open(spec.effects, "a", encoding="utf-8") as handle:
            handle.write(f"paid {amount} {key}\n")
            handle.flush()
            os.fsync(handle.fileno())
        if spec.block == "after_effect":
            channel.block("after_effect")
        return f"paid {amount}"

    class AfterTool(AgentMiddleware):  # type: ignore[type-arg]
        def wrap_tool_call(self, request: Any, handler: Any) -> Any:
            result = handler(request)
            if spec.block == "after_tool":
                channel.block("after_tool")
            return result

        async def awrap_tool_call(self, request: Any, handler: Any) -> Any:
            result = await handler(request)
            if spec.block == "after_tool":
                channel.block("after_tool")
            return result

    model = ChatOpenAI(model="gpt-4o-mini", base_url=spec.base_url, api_key="x", max_retries=0)
    ledger = ToolLedger(make_store(spec.store_kind, spec.store_dir))
    return create_agent(
        model,
        tools=[pay],
        middleware=[StreamRecoveryMiddleware(), AfterTool(), ToolLedgerMiddleware(ledger)],
        checkpointer=saver,
    )


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
