"""A tool's effect happens once across SIGKILL, with real processes and a real agent.

A first child (``tests/ledger_crash_child.py``: ``create_agent`` with
``StreamRecoveryMiddleware`` and ``ToolLedgerMiddleware``, a ``SqliteSaver``
file as memory, a real store directory) is killed with SIGKILL at an exact
point around its tool, whose effect is a line appended to a file. A replacement
child resumes the thread the usual way (``invoke(None, config)``). The test
then reads the effect file, the thread's messages and the provider's requests.
Synchronisation is by the child's reports, never by sleeping.
"""

from __future__ import annotations

import os
import signal
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.context import ForkServerContext
from pathlib import Path

import ledger_crash_child
import pytest
from fork_server import fork_server as start_fork_server
from forked_child import WAIT, ForkedChild
from langchain_core.messages import BaseMessage, ToolMessage
from langgraph.checkpoint.sqlite import SqliteSaver
from ledger_crash_child import LedgerChildSpec

from awaken_langchain.ledger import idempotency_key
from awaken_langchain.testing import LoopbackProvider, Scenario, ScriptedToolCall
from tests.postgres_server import shared_postgres_server, table_for
from tests.redis_server import prefix_for

pytestmark = pytest.mark.slow

THREAD = "thread-1"
CALL_ID = "call_pay_1"


@pytest.fixture(scope="module")
def fork_server() -> ForkServerContext:
    """A fork server that has imported the child's code from this repository."""
    return start_fork_server("ledger_crash_child")


class Child(ForkedChild):
    """One ``ledger_crash_child`` process and its report pipe."""

    def __init__(self, context: ForkServerContext, spec: LedgerChildSpec) -> None:
        super().__init__(context, ledger_crash_child.run, spec)


@dataclass
class World:
    server: LoopbackProvider
    context: ForkServerContext
    store_kind: str
    root: Path
    use_async: bool
    form: str
    children: list[Child]
    redis_url: str | None = None
    postgres_dsn: str | None = None

    def store_location(self) -> str:
        if self.store_kind == "redis":
            return prefix_for(self.root)
        if self.store_kind == "postgres":
            return table_for(self.root)
        return str(self.root / "ledger")

    def start(self, name: str, *, prompt: str | None = None, block: str | None = None) -> Child:
        spec = LedgerChildSpec(
            name=name,
            base_url=self.server.base_url_openai,
            store_kind=self.store_kind,  # type: ignore[arg-type]
            store_dir=self.store_location(),
            db_path=str(self.root / "memory.sqlite"),
            thread_id=THREAD,
            effects=str(self.root / "effects.txt"),
            output_dir=str(self.root / "output"),
            prompt=prompt,
            block=block,
            use_async=self.use_async,
            form=self.form,  # type: ignore[arg-type]
            redis_url=self.redis_url,
            postgres_dsn=self.postgres_dsn,
        )
        child = Child(self.context, spec)
        self.children.append(child)
        return child

    def effects(self) -> list[str]:
        path = self.root / "effects.txt"
        return path.read_text(encoding="utf-8").splitlines() if path.exists() else []

    def memory(self) -> list[BaseMessage]:
        with sqlite3.connect(self.root / "memory.sqlite") as conn:
            saved = SqliteSaver(conn).get_tuple({"configurable": {"thread_id": THREAD}})
        assert saved is not None
        return list(saved.checkpoint["channel_values"].get("messages", []))

    def tool_messages(self) -> list[ToolMessage]:
        return [m for m in self.memory() if isinstance(m, ToolMessage)]


WORLDS = [
    (form, kind, use_async)
    for form, kinds in (
        ("middleware", ("diskcache", "file", "redis", "postgres")),
        ("toolnode", ("diskcache",)),
    )
    for kind in kinds
    for use_async in (False, True)
]
"""Every store under the middleware; ``ledger.wrap`` in a ToolNode (the same ledger code
underneath) on one store, to keep the matrix's wall time small."""


@pytest.fixture(
    params=[
        pytest.param(
            world,
            id=f"{world[0]}-{world[1]}-{'async' if world[2] else 'sync'}",
            marks={"redis": [pytest.mark.redis], "postgres": [pytest.mark.postgres]}.get(
                world[1], []
            ),
        )
        for world in WORLDS
    ],
)
def world(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    loopback_provider: LoopbackProvider,
    fork_server: ForkServerContext,
) -> Iterator[World]:
    form, kind, use_async = request.param
    loopback_provider.enqueue(
        Scenario(tool_calls=[ScriptedToolCall("pay", {"amount": 5}, id=CALL_ID)]),
        Scenario(text="Paid."),
    )
    w = World(loopback_provider, fork_server, kind, tmp_path, use_async, form, [])
    if kind == "redis":
        w.redis_url = request.getfixturevalue("redis_server").url
    if kind == "postgres":
        w.postgres_dsn = shared_postgres_server().dsn
    yield w
    for child in w.children:
        if child.process.is_alive():
            os.kill(child.process.pid or 0, signal.SIGKILL)
            child.process.join(WAIT)


def kill_at(world: World, point: str) -> None:
    first = world.start("first", prompt="Pay 5.", block=point)
    assert first.wait_event("blocked")["point"] == point
    first.kill()


PAID = f"paid 5 {idempotency_key(THREAD, CALL_ID)}"


def assert_one_tool_message(world: World, content: str, status: str) -> ToolMessage:
    [message] = world.tool_messages()
    assert message.tool_call_id == CALL_ID
    assert message.status == status
    assert content in message.content
    assert world.memory()[-1].content == "Paid."
    assert len(world.server.requests_for("openai")) == 2
    return message


def test_killed_before_the_tool_started_the_replacement_runs_it_once(world: World) -> None:
    kill_at(world, "before_tool")
    assert world.effects() == []

    world.start("replacement").finish()

    assert world.effects() == [PAID]
    assert_one_tool_message(world, "paid 5", "success")


def test_killed_during_the_tool_before_its_effect_the_replacement_reports_it_and_pays_never(
    world: World,
) -> None:
    kill_at(world, "before_effect")

    world.start("replacement").finish()

    assert world.effects() == []  # "report" errs towards unknown, never towards a second run
    assert_one_tool_message(world, "outcome of this call is unknown", "error")


def test_killed_during_the_tool_after_its_effect_the_replacement_reports_it_and_never_pays_twice(
    world: World,
) -> None:
    kill_at(world, "after_effect")

    world.start("replacement").finish()

    key = idempotency_key(THREAD, CALL_ID)
    assert world.effects() == [PAID]
    assert_one_tool_message(world, "outcome of this call is unknown", "error")
    told = world.server.requests_for("openai")[1].messages[-1]
    assert key in str(told["content"])  # the model was told, with the key


def test_killed_after_the_tool_returned_the_replacement_replays_the_result_and_pays_once(
    world: World,
) -> None:
    kill_at(world, "after_tool")
    assert world.tool_messages() == []  # the tools step never reached memory

    world.start("replacement").finish()

    assert world.effects() == [PAID]
    assert_one_tool_message(world, "paid 5", "success")


def test_killed_after_the_tools_step_was_saved_the_replacement_goes_on_from_memory(
    world: World,
) -> None:
    kill_at(world, "after_save")

    world.start("replacement").finish()

    assert world.effects() == [PAID]
    assert_one_tool_message(world, "paid 5", "success")
