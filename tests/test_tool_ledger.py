"""The tool-call ledger's rules, on every checkpoint store (PostgreSQL too), sync and async.

Each test runs real LangChain tools wrapped by ``ToolLedger.wrap`` (and, where
the rule is about the agent form, ``ToolLedgerMiddleware`` in a real
``create_agent`` graph on the loopback provider). A "replacement process" is a
second ledger on a second store object over the same location (the stores that
keep data across objects), which is what a new process builds.
"""

from __future__ import annotations

import asyncio
import time
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Annotated, Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool, InjectedToolCallId, tool
from langgraph.types import Command

from awaken_langchain import InMemoryStreamCheckpointStore, StreamCheckpointStore, ToolLedger
from awaken_langchain.ledger import (
    InjectedIdempotencyKey,
    ToolLedgerConflictError,
    ToolLedgerError,
    idempotency_key,
)
from awaken_langchain.stores.redis import RedisStreamCheckpointStore
from tests.conftest import POSTGRES, STORE_BACKENDS, FakeClock, StoreBackend, StoreFactory
from tests.redis_server import RedisServer, unique_prefix

STORE_WAIT = 10.0
"""The ledger's store deadline in the rule tests: they state what a record makes a re-run
do, so a store slowed by a loaded machine must not send a call around it (the deadline
itself has its own test, with a hung store)."""


def ledger_on(store: StreamCheckpointStore, **settings: Any) -> ToolLedger:
    """A `ToolLedger` on ``store`` for the rule tests (see `STORE_WAIT`)."""
    return ToolLedger(store, deadline=STORE_WAIT, **settings)


@pytest.fixture(
    params=[
        *STORE_BACKENDS,
        pytest.param(POSTGRES, marks=[pytest.mark.slow, pytest.mark.postgres]),
    ],
    ids=lambda backend: backend.name,
)
def store_backend(request: pytest.FixtureRequest) -> StoreBackend:
    """Each store backend in turn, PostgreSQL too."""
    backend: StoreBackend = request.param
    return backend


class Died(BaseException):
    """What a process death looks like from inside the tool: nothing after it runs."""


class Effects:
    """A tool's external effect: lines appended to a file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def add(self, line: str) -> None:
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(line + "\n")

    @property
    def lines(self) -> list[str]:
        return self.path.read_text(encoding="utf-8").splitlines() if self.path.exists() else []


@pytest.fixture
def effects(tmp_path: Path) -> Effects:
    return Effects(tmp_path / "effects.txt")


def make_pay(effects: Effects, *, fail: BaseException | None = None) -> BaseTool:
    @tool
    def pay(amount: int, key: Annotated[str, InjectedIdempotencyKey]) -> str:
        """Pay an amount."""
        effects.add(f"paid {amount} {key}")
        if fail is not None:
            raise fail
        return f"paid {amount}"

    return pay


@pytest.fixture(params=["sync", "async"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def call(mode: str, runnable: BaseTool, input: Any, config: Any = None) -> Any:
    if mode == "sync":
        return runnable.invoke(input, config)
    return await runnable.ainvoke(input, config)


def tool_call(call_id: str = "call_1", amount: int = 5, name: str = "pay") -> dict[str, Any]:
    return {"type": "tool_call", "id": call_id, "name": name, "args": {"amount": amount}}


THREAD = {"configurable": {"thread_id": "thread-1"}}


async def test_a_finished_call_is_replayed_by_a_replacement_and_the_tool_is_not_called_again(
    store_factory: StoreFactory, effects: Effects, mode: str
) -> None:
    first = ledger_on(store_factory()).wrap(make_pay(effects))
    answer = await call(mode, first, tool_call(), THREAD)

    replacement_store = store_factory() if store_factory.backend.durable else first.ledger.store
    again = await call(
        mode, ledger_on(replacement_store).wrap(make_pay(effects)), tool_call(), THREAD
    )

    assert len(effects.lines) == 1
    assert isinstance(again, ToolMessage)
    assert again == answer
    assert (again.content, again.tool_call_id, again.status) == ("paid 5", "call_1", "success")


async def test_a_failed_call_is_run_again(
    store_factory: StoreFactory, effects: Effects, mode: str
) -> None:
    ledger = ledger_on(store_factory())
    with pytest.raises(RuntimeError, match="card declined"):
        await call(
            mode, ledger.wrap(make_pay(effects, fail=RuntimeError("card declined"))), tool_call()
        )

    answer = await call(mode, ledger.wrap(make_pay(effects)), tool_call())

    assert answer.content == "paid 5"
    assert len(effects.lines) == 2
    record = ledger.record("call_1")
    assert record is not None
    assert record.state == "finished"


async def test_a_tool_listed_in_replay_failures_gets_its_recorded_error_instead_of_a_rerun(
    store_factory: StoreFactory, effects: Effects, mode: str
) -> None:
    ledger = ledger_on(store_factory(), replay_failures=["pay"])
    with pytest.raises(RuntimeError):
        await call(
            mode, ledger.wrap(make_pay(effects, fail=RuntimeError("card declined"))), tool_call()
        )

    answer = await call(mode, ledger.wrap(make_pay(effects)), tool_call())

    assert answer.status == "error"
    assert "card declined" in answer.content
    assert len(effects.lines) == 1


async def test_a_call_that_started_and_never_finished_is_reported_with_its_key_and_not_run(
    store_factory: StoreFactory, effects: Effects, mode: str
) -> None:
    store = store_factory()
    with pytest.raises(Died):
        await call(mode, ledger_on(store).wrap(make_pay(effects, fail=Died())), tool_call(), THREAD)

    replacement = store_factory() if store_factory.backend.durable else store
    answer = await call(mode, ledger_on(replacement).wrap(make_pay(effects)), tool_call(), THREAD)

    key = idempotency_key("thread-1", "call_1")
    assert len(effects.lines) == 1
    assert isinstance(answer, ToolMessage)
    assert answer.status == "error"
    assert "outcome of this call is unknown" in answer.content
    assert key in answer.content
    assert answer.tool_call_id == "call_1"


async def test_the_rerun_policy_runs_a_call_of_unknown_outcome_again(
    store_factory: StoreFactory, effects: Effects, mode: str
) -> None:
    store = store_factory()
    with pytest.raises(Died):
        await call(mode, ledger_on(store).wrap(make_pay(effects, fail=Died())), tool_call())

    ledger = ledger_on(store, on_unknown={"pay": "rerun"})
    answer = await call(mode, ledger.wrap(make_pay(effects)), tool_call())

    assert answer.content == "paid 5"
    assert len(effects.lines) == 2
    # both attempts passed the same idempotency key to the external system
    assert effects.lines[0].split()[-1] == effects.lines[1].split()[-1]


async def test_reconcile_answers_a_call_of_unknown_outcome_from_the_external_system(
    store_factory: StoreFactory, effects: Effects, mode: str
) -> None:
    store = store_factory()
    with pytest.raises(Died):
        await call(mode, ledger_on(store).wrap(make_pay(effects, fail=Died())), tool_call())
    asked: list[str] = []

    def reconcile(tool_call: Any, key: str) -> str | None:
        asked.append(key)
        done = any(line.endswith(key) for line in effects.lines)
        return f"paid {tool_call['args']['amount']} (found by key)" if done else None

    ledger = ledger_on(store, on_unknown=reconcile)
    answer = await call(mode, ledger.wrap(make_pay(effects)), tool_call())
    again = await call(mode, ledger.wrap(make_pay(effects)), tool_call())

    assert answer.content == again.content == "paid 5 (found by key)"
    assert asked == [idempotency_key("default", "call_1")]  # the second time it was recorded
    assert len(effects.lines) == 1


async def test_reconcile_that_finds_no_effect_lets_the_tool_run(
    store_factory: StoreFactory, effects: Effects, mode: str
) -> None:
    store = store_factory()
    with pytest.raises(Died):
        await call(mode, ledger_on(store).wrap(make_pay(InertEffects(), fail=Died())), tool_call())

    async def reconcile(tool_call: Any, key: str) -> None:
        return None

    def sync_reconcile(tool_call: Any, key: str) -> None:
        return None

    ledger = ledger_on(store, on_unknown=reconcile if mode == "async" else sync_reconcile)
    answer = await call(mode, ledger.wrap(make_pay(effects)), tool_call())

    assert answer.content == "paid 5"
    assert len(effects.lines) == 1


class InertEffects(Effects):
    """Effects that never happen (the tool died before its effect)."""

    def __init__(self) -> None:
        super().__init__(Path("/nonexistent"))

    def add(self, line: str) -> None:
        return None


async def test_the_same_call_id_with_other_arguments_is_refused_loudly(
    store_factory: StoreFactory, effects: Effects, mode: str
) -> None:
    ledger = ledger_on(store_factory())
    await call(mode, ledger.wrap(make_pay(effects)), tool_call(amount=5))

    with pytest.raises(ToolLedgerConflictError, match="other arguments") as refused:
        await call(mode, ledger.wrap(make_pay(effects)), tool_call(amount=500))

    assert refused.value.key == idempotency_key("default", "call_1")
    assert len(effects.lines) == 1


def test_the_idempotency_key_reaches_the_tool_is_stable_and_is_hidden_from_the_model(
    effects: Effects,
) -> None:
    wrapped = ledger_on(InMemoryStreamCheckpointStore()).wrap(make_pay(effects))
    wrapped.invoke(tool_call("call_1"), THREAD)
    wrapped.invoke(tool_call("call_1"), {"configurable": {"thread_id": "thread-2"}})

    assert "key" not in wrapped.tool_call_schema.model_json_schema()["properties"]  # type: ignore[union-attr]
    keys = [line.split()[-1] for line in effects.lines]
    assert keys == [idempotency_key("thread-1", "call_1"), idempotency_key("thread-2", "call_1")]
    assert idempotency_key("thread-1", "call_1") == idempotency_key("thread-1", "call_1")
    assert keys[0] != keys[1]


@pytest.mark.parametrize(
    "call_id",
    ["../../../etc/passwd", "a/b\\c", "line\nbreak\x1b[31m\x7f", "x" * 200_000, "é\udcff"],
    ids=["dotdot", "separators", "control", "huge", "surrogate"],
)
def test_hostile_tool_call_ids_stay_inside_the_store(
    store_factory: StoreFactory, effects: Effects, tmp_path: Path, call_id: str
) -> None:
    store = store_factory()
    ledger = ledger_on(store)
    ledger.wrap(make_pay(effects)).invoke(tool_call(call_id))
    answer = ledger.wrap(make_pay(effects)).invoke(tool_call(call_id))

    assert answer.content == "paid 5"
    assert len(effects.lines) == 1
    assert store.list_run_ids() == ["tool-ledger:" + idempotency_key("default", call_id)]
    outside = {p.name for p in tmp_path.iterdir()} - {"checkpoints", "effects.txt"}
    assert not outside


async def test_a_record_too_large_for_the_store_is_refused_before_the_tool_runs(
    store_factory: StoreFactory, effects: Effects, mode: str
) -> None:
    @tool
    def note(text: str) -> str:
        """Write a note."""
        effects.add("noted")
        return "ok"

    ledger = ledger_on(store_factory(max_checkpoint_bytes=8192))
    big = {"type": "tool_call", "id": "call_1", "name": "note", "args": {"text": "x" * 20_000}}

    with pytest.raises(ToolLedgerError, match="max_checkpoint_bytes"):
        await call(mode, ledger.wrap(note), big)

    assert effects.lines == []


async def test_a_result_too_large_to_keep_is_not_run_again_and_says_why(
    store_factory: StoreFactory, effects: Effects, mode: str
) -> None:
    @tool
    def fetch(page: int) -> str:
        """Fetch a page."""
        effects.add("fetched")
        return "y" * 20_000

    ledger = ledger_on(store_factory(max_checkpoint_bytes=8192))
    first = await call(
        mode, ledger.wrap(fetch), {**tool_call(), "name": "fetch", "args": {"page": 1}}
    )
    again = await call(
        mode, ledger.wrap(fetch), {**tool_call(), "name": "fetch", "args": {"page": 1}}
    )

    assert len(first.content) == 20_000
    assert again.status == "error"
    assert "already finished" in again.content
    assert "max_checkpoint_bytes" in again.content
    assert effects.lines == ["fetched"]


async def test_artifacts_and_commands_are_replayed_as_the_framework_received_them(
    store_factory: StoreFactory, effects: Effects, mode: str
) -> None:
    @tool(response_format="content_and_artifact")
    def search(query: str) -> tuple[str, dict[str, Any]]:
        """Search."""
        effects.add("searched")
        return "2 hits", {"hits": [1, 2]}

    @tool
    def handoff(to: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> Command[Any]:
        """Hand off."""
        effects.add("handed off")
        return Command(
            update={
                "messages": [ToolMessage("handed", tool_call_id=tool_call_id)],
                "owner": to,
            },
            goto="billing",
        )

    ledger = ledger_on(store_factory())
    searched = [
        await call(
            mode, ledger.wrap(search), {**tool_call("s1"), "name": "search", "args": {"query": "q"}}
        )
        for _ in range(2)
    ]
    handed = [
        await call(
            mode,
            ledger.wrap(handoff),
            {**tool_call("h1"), "name": "handoff", "args": {"to": "bob"}},
        )
        for _ in range(2)
    ]

    assert searched[0] == searched[1]
    assert searched[1].artifact == {"hits": [1, 2]}
    assert handed[0] == handed[1]
    assert handed[1].goto == "billing"
    assert handed[1].update["owner"] == "bob"
    assert isinstance(handed[1].update["messages"][0], ToolMessage)
    assert effects.lines == ["searched", "handed off"]


async def test_parallel_calls_each_get_their_own_record(
    store_factory: StoreFactory, effects: Effects
) -> None:
    ledger = ledger_on(store_factory())
    wrapped = ledger.wrap(make_pay(effects))
    calls = [tool_call(f"call_{n}", amount=n) for n in range(4)]

    first = await asyncio.gather(*(wrapped.ainvoke(c, THREAD) for c in calls))
    again = await asyncio.gather(*(wrapped.ainvoke(c, THREAD) for c in calls))

    assert (
        [m.content for m in first] == [m.content for m in again] == [f"paid {n}" for n in range(4)]
    )
    assert len(effects.lines) == 4


def test_a_stale_process_cannot_overwrite_the_record_of_a_newer_one(
    store_factory: StoreFactory, effects: Effects
) -> None:
    store = store_factory()
    newer = ledger_on(store, on_unknown="rerun")

    @tool
    def slow_pay(amount: int) -> str:
        """Pay, while another process takes the call over."""
        effects.add("stale paid")
        newer.wrap(make_pay(effects)).invoke(tool_call(name="pay"))  # takes the record over
        return "stale result"

    events = Events()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ledger_on(store).wrap(slow_pay).invoke(
            {**tool_call(name="pay"), "name": "pay"}, {"callbacks": [events]}
        )

    record = newer.record("call_1")
    assert record is not None
    assert record.state == "finished"
    assert record.result is not None
    assert "paid 5" in str(record.result)
    assert "awaken_tool_ledger_warning" in events.names


class Events(BaseCallbackHandler):
    def __init__(self) -> None:
        self.names: list[str] = []
        self.data: list[Any] = []

    def on_custom_event(self, name: str, data: Any, **kwargs: Any) -> None:
        self.names.append(name)
        self.data.append(data)


def test_records_expire_after_the_ledger_ttl(
    store_factory: StoreFactory, effects: Effects, clock: FakeClock
) -> None:
    store = store_factory(clock=clock)
    ledger = ledger_on(store, ttl=60)
    ledger.wrap(make_pay(effects)).invoke(tool_call())
    store_factory.let_time_pass(store, clock, 61)

    ledger.wrap(make_pay(effects)).invoke(tool_call())

    assert len(effects.lines) == 2
    assert store.gc() >= 0


def test_a_replay_is_reported_as_an_event(effects: Effects) -> None:
    ledger = ledger_on(InMemoryStreamCheckpointStore())
    events = Events()
    ledger.wrap(make_pay(effects)).invoke(tool_call(), {"callbacks": [events]})
    ledger.wrap(make_pay(effects)).invoke(tool_call(), {"callbacks": [events]})

    assert events.names == ["awaken_tool_ledger_replay"]
    assert events.data[0]["key"] == idempotency_key("default", "call_1")


# -- a store that is down or hung ----------------------------------------------------------


@pytest.mark.slow
@pytest.mark.redis
async def test_a_hung_store_costs_a_tool_call_the_deadline_then_it_runs_with_a_warning(
    private_redis: RedisServer, effects: Effects, mode: str
) -> None:
    store = RedisStreamCheckpointStore(
        private_redis.url, prefix=unique_prefix(), socket_timeout=5.0
    )
    ledger = ToolLedger(store, deadline=0.2)
    ledger.wrap(make_pay(effects)).invoke(tool_call("warm"))  # connected
    events = Events()
    private_redis.freeze()
    try:
        began = time.monotonic()
        answer = await call(
            mode, ledger.wrap(make_pay(effects)), tool_call(), {"callbacks": [events]}
        )
        took = time.monotonic() - began
    finally:
        private_redis.thaw()

    assert answer.content == "paid 5"
    assert len(effects.lines) == 2
    assert took < 0.2 + 1.5  # the frozen socket alone would hold it 5 s
    assert events.names == ["awaken_tool_ledger_warning"]
    assert "without a record" in events.data[0]["message"]
    store.close()


async def test_a_store_that_is_down_refuses_the_call_when_the_policy_says_so(
    tmp_path: Path, effects: Effects, mode: str
) -> None:
    store = RedisStreamCheckpointStore(
        "redis://127.0.0.1:9/0", prefix=unique_prefix(), socket_timeout=0.2
    )
    ledger = ledger_on(store, on_store_failure="refuse")

    with pytest.raises(ToolLedgerError, match="store failed"):
        await call(mode, ledger.wrap(make_pay(effects)), tool_call())

    assert effects.lines == []
    store.close()


def test_a_store_that_is_down_runs_the_tool_and_warns_by_default(effects: Effects) -> None:
    store = RedisStreamCheckpointStore(
        "redis://127.0.0.1:9/0", prefix=unique_prefix(), socket_timeout=0.2
    )
    events = Events()

    answer = ledger_on(store).wrap(make_pay(effects)).invoke(tool_call(), {"callbacks": [events]})

    assert answer.content == "paid 5"
    assert len(effects.lines) == 1
    assert events.names == ["awaken_tool_ledger_warning"]
    store.close()


def test_plain_arguments_without_a_call_id_run_the_tool_unrecorded(effects: Effects) -> None:
    store: StreamCheckpointStore = InMemoryStreamCheckpointStore()

    @tool
    def lookup(city: str) -> str:
        """Look up a city."""
        effects.add(city)
        return city.upper()

    wrapped = ledger_on(store).wrap(lookup)

    assert wrapped.invoke({"city": "paris"}) == "PARIS"
    assert wrapped.name == "lookup"
    assert wrapped.args == lookup.args
    assert store.list_run_ids() == []


async def test_a_wrapped_tool_in_a_plain_tool_node_gets_its_key_and_runs_once(
    effects: Effects, mode: str
) -> None:
    from langchain_core.messages import AIMessage
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode

    builder = StateGraph(MessagesState)
    builder.add_node(
        "tools", ToolNode([ledger_on(InMemoryStreamCheckpointStore()).wrap(make_pay(effects))])
    )
    builder.add_edge(START, "tools")
    builder.add_edge("tools", END)
    node = builder.compile()
    state = {
        "messages": [
            AIMessage("", tool_calls=[{"id": "call_1", "name": "pay", "args": {"amount": 5}}])
        ]
    }

    outputs = [
        node.invoke(state, THREAD) if mode == "sync" else await node.ainvoke(state, THREAD)
        for _ in range(2)
    ]

    assert [o["messages"][-1].content for o in outputs] == ["paid 5", "paid 5"]
    assert effects.lines == [f"paid 5 {idempotency_key('thread-1', 'call_1')}"]


def test_a_call_still_running_elsewhere_is_reported_and_its_owner_still_records_the_result(
    store_factory: StoreFactory, effects: Effects
) -> None:
    store = store_factory()
    answers: list[Any] = []

    @tool
    def pay(amount: int) -> str:
        """Pay, while a second process re-runs the same call."""
        effects.add("paid")
        answers.append(ledger_on(store).wrap(make_pay(effects)).invoke(tool_call()))
        return f"paid {amount}"

    owner = ledger_on(store).wrap(pay).invoke(tool_call())
    later = ledger_on(store).wrap(make_pay(effects)).invoke(tool_call())

    assert answers[0].status == "error"
    assert "unknown" in answers[0].content
    assert owner.content == later.content == "paid 5"
    assert effects.lines == ["paid"]


def test_a_record_that_cannot_be_read_is_reported_not_run_again(
    store_factory: StoreFactory, effects: Effects
) -> None:
    from awaken_langchain import StreamCheckpoint
    from awaken_langchain.ledger import LEDGER_MODEL

    store = store_factory()
    run_id = "tool-ledger:" + idempotency_key("default", "call_1")
    epoch = store.claim(run_id)
    store.put(
        StreamCheckpoint(run_id=run_id, model=LEDGER_MODEL, partial_text="{not json", epoch=epoch)
    )

    answer = ledger_on(store).wrap(make_pay(effects)).invoke(tool_call())

    assert answer.status == "error"
    assert "cannot be read" in answer.content
    assert f"checkpoints rm {run_id}" in answer.content
    assert effects.lines == []


async def test_parallel_tool_calls_of_an_agent_each_get_their_own_record_and_key(
    tmp_path: Path, effects: Effects, mode: str
) -> None:
    from langchain.agents import create_agent
    from langchain_openai import ChatOpenAI
    from langgraph.checkpoint.memory import InMemorySaver

    from awaken_langchain import DiskCacheStreamCheckpointStore
    from awaken_langchain.middleware import StreamRecoveryMiddleware, ToolLedgerMiddleware
    from awaken_langchain.testing import LoopbackProvider, Scenario, ScriptedToolCall

    ledger = ledger_on(DiskCacheStreamCheckpointStore(tmp_path / "ledger"))
    calls = [ScriptedToolCall("pay", {"amount": n}, id=f"call_{n}") for n in (1, 2)]
    with LoopbackProvider() as server:
        server.enqueue(Scenario(tool_calls=calls), Scenario(text="Done."))
        agent = create_agent(
            ChatOpenAI(model="gpt-4o-mini", base_url=server.base_url_openai, api_key="x"),
            tools=[make_pay(effects)],
            middleware=[StreamRecoveryMiddleware(), ToolLedgerMiddleware(ledger)],
            checkpointer=InMemorySaver(),
        )
        payload = {"messages": [("user", "Pay 1 and 2.")]}
        if mode == "sync":
            state = agent.invoke(payload, THREAD)
        else:
            state = await agent.ainvoke(payload, THREAD)

    assert sorted(effects.lines) == [
        f"paid {n} {idempotency_key('thread-1', f'call_{n}')}" for n in (1, 2)
    ]
    records = [ledger.record(f"call_{n}", THREAD) for n in (1, 2)]
    assert [r.state if r else None for r in records] == ["finished", "finished"]
    assert [m.content for m in state["messages"] if isinstance(m, ToolMessage)] == [
        "paid 1",
        "paid 2",
    ]


async def run_agent(agent: Any, mode: str, payload: Any) -> Any:
    if mode == "sync":
        return agent.invoke(payload, THREAD)
    return await agent.ainvoke(payload, THREAD)


def _generator_tools(effects: Effects) -> list[BaseTool]:
    from langchain_core.tools import StructuredTool

    @tool
    def pay_in_parts(amount: int) -> Iterator[str]:
        """Pay an amount, reporting each part."""
        effects.add(f"paid {amount}")
        yield "part 1"
        yield "part 2"

    async def apay_in_parts(amount: int) -> AsyncIterator[str]:
        effects.add(f"paid {amount}")
        yield "part 1"

    async_generator = StructuredTool.from_function(
        coroutine=apay_in_parts, name="apay_in_parts", description="Pay in parts."
    )
    return [pay_in_parts, async_generator]


class StreamingPay(BaseTool):
    """A tool class whose stream yields chunks of its own."""

    name: str = "pay"
    description: str = "Pay an amount."

    def _run(self, amount: int) -> str:
        return f"paid {amount}"

    def stream(self, input: Any, config: Any = None, **kwargs: Any) -> Iterator[Any]:
        yield "paid "
        yield "5"


def test_wrap_refuses_a_tool_that_streams_before_any_call(effects: Effects) -> None:
    ledger = ledger_on(InMemoryStreamCheckpointStore())
    for streaming in [*_generator_tools(effects), StreamingPay()]:
        with pytest.raises(ToolLedgerError, match="streams and cannot go through a ToolLedger"):
            ledger.wrap(streaming)
    with pytest.raises(ToolLedgerError, match="is a generator: invoke would return"):
        ledger.wrap(_generator_tools(effects)[0])
    with pytest.raises(ToolLedgerError, match="StreamingPay overrides stream"):
        ledger.wrap(StreamingPay())
    assert effects.lines == []


async def test_streaming_a_wrapped_tool_yields_its_one_result_recorded_and_replayed(
    effects: Effects, mode: str
) -> None:
    wrapped = ledger_on(InMemoryStreamCheckpointStore()).wrap(make_pay(effects))
    if mode == "sync":
        first = list(wrapped.stream(tool_call(), THREAD))
        again = list(wrapped.stream(tool_call(), THREAD))
    else:
        first = [chunk async for chunk in wrapped.astream(tool_call(), THREAD)]
        again = [chunk async for chunk in wrapped.astream(tool_call(), THREAD)]

    assert len(effects.lines) == 1
    assert [m.content for m in first] == ["paid 5"]
    assert again == first


async def test_the_middleware_refuses_a_generator_tool_before_running_it(
    tmp_path: Path, effects: Effects, mode: str
) -> None:
    from langchain.agents import create_agent
    from langchain_openai import ChatOpenAI
    from langgraph.checkpoint.memory import InMemorySaver

    from awaken_langchain.middleware import ToolLedgerMiddleware
    from awaken_langchain.testing import LoopbackProvider, Scenario, ScriptedToolCall

    generator = _generator_tools(effects)[0]
    ledger = ledger_on(InMemoryStreamCheckpointStore())
    with LoopbackProvider() as server:
        server.enqueue(
            Scenario(tool_calls=[ScriptedToolCall("pay_in_parts", {"amount": 5}, id="call_1")]),
            Scenario(text="Done."),
        )
        agent = create_agent(
            ChatOpenAI(model="gpt-4o-mini", base_url=server.base_url_openai, api_key="x"),
            tools=[generator],
            middleware=[ToolLedgerMiddleware(ledger)],
            checkpointer=InMemorySaver(),
        )
        payload = {"messages": [("user", "Pay 5.")]}
        with pytest.raises(ToolLedgerError, match="'pay_in_parts' streams"):
            await run_agent(agent, mode, payload)

    assert effects.lines == []
    assert ledger.record("call_1", THREAD) is None
