"""Recovery across process replacement, with real processes killed by SIGKILL.

Every case runs the same agent a user would run (``tests/crash_child.py``):
``create_agent`` over ``RecoveringChatModel(ChatOpenAI(...))`` against this
process's loopback provider, with a real ``SqliteSaver`` file as memory and a
real checkpoint store directory. A first child is killed with SIGKILL at an
exact point; a replacement child resumes the same thread. The test then reads
the SqliteSaver, the checkpoint store, the tool-call log and the provider's
recorded requests.

Synchronisation is by events, never by sleeping: the provider stalls the
stream at a chosen SSE event (or a child blocks at a test-only callback point)
while the child reports each store operation on a pipe, and the test kills the
child once the report it waits for has arrived.

Children are forked from a multiprocessing fork server that imports LangChain,
LangGraph and the SDK once (with this repository first on ``sys.path``), so
each child is a fresh, separate OS process that costs a fork instead of ten
seconds of imports.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.context import ForkServerContext
from pathlib import Path
from typing import Any

import crash_child
import pytest
from crash_child import ChildSpec
from fork_server import fork_server as start_fork_server
from forked_child import WAIT, ForkedChild
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.sqlite import SqliteSaver

from awaken_langchain import StreamCheckpoint
from awaken_langchain.recovery import DEFAULT_CONTINUATION_PROMPT
from awaken_langchain.testing import (
    Fault,
    LoopbackProvider,
    RecordedRequest,
    Scenario,
    ScriptedToolCall,
)
from tests.store_kinds import StoreKind, server_address

pytestmark = pytest.mark.slow

STALL = 120.0
"""A provider stall that outlives the test (the server's shutdown ends it)."""
THREAD = "thread-1"
PROMPT = "What is the weather in Paris?"


# -- the harness ------------------------------------------------------------------


@pytest.fixture(scope="module")
def fork_server() -> ForkServerContext:
    """A fork server that has imported the child's code from this repository."""
    return start_fork_server("crash_child")


class Child(ForkedChild):
    """One ``crash_child`` process and its report pipe."""

    def __init__(self, context: ForkServerContext, spec: ChildSpec) -> None:
        super().__init__(context, crash_child.run, spec)

    def puts(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == "put"]


class Script:
    """The provider's answers, in order, with a signal as each request arrives.

    Installed as the server's default responder, so it is called (from the
    server's handler thread) the moment a request is received and before any
    byte of the answer is sent.
    """

    def __init__(self, *scenarios: Scenario) -> None:
        self._scenarios = list(scenarios)
        self._received = 0
        self._changed = threading.Condition()

    def __call__(self, request: RecordedRequest) -> Scenario:
        with self._changed:
            if not self._scenarios:
                raise AssertionError(f"unscripted request: {request.messages}")
            self._received += 1
            self._changed.notify_all()
            return self._scenarios.pop(0)

    def wait_for_request(self, number: int) -> None:
        """Block until the ``number``-th request has arrived."""
        with self._changed:
            if not self._changed.wait_for(lambda: self._received >= number, timeout=WAIT):
                pytest.fail(f"request {number} did not arrive within {WAIT} s")


@dataclass
class World:
    """One conversation's durable state: memory file, store directory, tool log."""

    server: LoopbackProvider
    context: ForkServerContext
    store_kind: StoreKind
    root: Path
    children: list[Child]
    store_address: str = ""

    def spec(
        self,
        name: str,
        *,
        prompt: str | None = None,
        block: str | None = None,
        use_async: bool = False,
    ) -> ChildSpec:
        return ChildSpec(
            name=name,
            base_url=self.server.base_url_openai,
            store_kind=self.store_kind,
            store_dir=str(self.root / "checkpoints"),
            store_address=self.store_address,
            db_path=str(self.root / "memory.sqlite"),
            thread_id=THREAD,
            tool_log=str(self.root / "tools.jsonl"),
            output_dir=str(self.root / "output"),
            prompt=prompt,
            block=block,
            use_async=use_async,
        )

    def script(self, *scenarios: Scenario) -> Script:
        script = Script(*scenarios)
        self.server.default = script
        return script

    def requests(self) -> list[list[tuple[str, str]]]:
        """Each provider request as (role, text) pairs."""
        return [_wire(r) for r in self.server.requests_for("openai")]

    def start(self, name: str, **settings: Any) -> Child:
        child = Child(self.context, self.spec(name, **settings))
        self.children.append(child)
        return child

    def memory(self) -> list[BaseMessage]:
        """The thread's messages in the latest SqliteSaver checkpoint."""
        with sqlite3.connect(self.root / "memory.sqlite") as conn:
            saved = SqliteSaver(conn).get_tuple({"configurable": {"thread_id": THREAD}})
        assert saved is not None, "the thread has no saved state"
        return list(saved.checkpoint["channel_values"].get("messages", []))

    def tool_calls(self) -> list[dict[str, Any]]:
        path = self.root / "tools.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]

    def checkpoints(self) -> list[StreamCheckpoint]:
        """Every checkpoint in the store (read after the writers are gone)."""
        store = crash_child.make_store(
            self.store_kind, str(self.root / "checkpoints"), self.store_address
        )
        try:
            return store.list_checkpoints()
        finally:
            store.close()


@pytest.fixture(
    params=[
        "diskcache",
        "file",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("redis-cluster", marks=pytest.mark.redis),
    ]
)
def world(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    loopback_provider: LoopbackProvider,
    fork_server: ForkServerContext,
) -> Iterator[World]:
    kind = request.param
    w = World(loopback_provider, fork_server, kind, tmp_path, [], server_address(kind))
    yield w
    for child in w.children:
        if child.process.is_alive():
            os.kill(child.pid, signal.SIGKILL)
            child.process.join(WAIT)


# -- helpers for assertions ----------------------------------------------------------


def _wire(request: RecordedRequest) -> list[tuple[str, str]]:
    return [(m["role"], m.get("content") or "") for m in request.messages]


FRESH = [("user", PROMPT)]
"""The first request of the turn, as sent when nothing of it was saved."""


def continuation(prefix: str) -> list[tuple[str, str]]:
    """A continuation request: the turn so far as the assistant, then the prompt."""
    return [("user", PROMPT), ("assistant", prefix), ("user", DEFAULT_CONTINUATION_PROMPT)]


def assert_memory_holds_one_complete_turn(world: World, *expected: BaseMessage) -> None:
    """Memory is the prompt and the expected answer messages, each complete, once."""
    memory = world.memory()
    assert [type(m) for m in memory] == [HumanMessage, *(type(m) for m in expected)]
    assert memory[0].content == PROMPT
    for got, want in zip(memory[1:], expected, strict=True):
        assert got.content == want.content
        if isinstance(want, AIMessage):
            assert isinstance(got, AIMessage)
            assert [(c["name"], c["args"]) for c in got.tool_calls] == [
                (c["name"], c["args"]) for c in want.tool_calls
            ]
            assert got.invalid_tool_calls == []
    for message in memory:
        assert DEFAULT_CONTINUATION_PROMPT not in str(message.content)


ANSWER = "The weather in Paris is sunny."


def _key_of(child: Child) -> str:
    return str(child.wait_event("claim")["run_id"])


# -- the crash matrix ----------------------------------------------------------------


def test_killed_before_the_first_token_the_replacement_sends_the_request_afresh(
    world: World,
) -> None:
    script = world.script(
        Scenario(text=ANSWER, fault=Fault.stall(STALL, after_events=0)),
        Scenario(text=ANSWER),
    )
    first = world.start("first", prompt=PROMPT)
    script.wait_for_request(1)  # the stream is open; not one event has been sent
    first.kill()
    assert first.puts() == []
    assert world.checkpoints() == []

    world.start("replacement").finish()

    assert world.requests() == [FRESH, FRESH]
    assert_memory_holds_one_complete_turn(world, AIMessage(ANSWER))
    assert world.checkpoints() == []
    assert world.tool_calls() == []


def test_killed_mid_text_the_replacement_continues_from_the_saved_prefix(world: World) -> None:
    prefix = "The weather in P"  # role chunk + four 4-character deltas
    world.script(
        Scenario(text=ANSWER, fault=Fault.stall(STALL, after_events=5)),
        Scenario(text="aris is sunny."),
    )
    first = world.start("first", prompt=PROMPT)
    saved = first.wait_event("put", text=prefix)
    first.kill()
    assert [c.partial_text for c in world.checkpoints()] == [prefix]

    replacement = world.start("replacement")
    assert replacement.wait_event("get")["found"] is True
    replacement.finish()

    assert world.requests() == [FRESH, continuation(prefix)]
    assert_memory_holds_one_complete_turn(world, AIMessage(ANSWER))
    assert world.memory()[1].id == saved["message_id"]  # one message id across processes
    assert world.checkpoints() == []


def test_killed_mid_text_a_replacement_answered_with_a_spaced_restart_repeats_nothing(
    world: World,
) -> None:
    answer = " ".join(f"w{n:03d}" for n in range(49, 60)) + "."
    prefix = answer[:16]  # role chunk + four 4-character deltas: "w049 w050 w051 w"
    world.script(
        Scenario(text=answer, fault=Fault.stall(STALL, after_events=5)),
        Scenario(text=answer[answer.index(" w051") :]),  # the model restarts " w051 w052 ..."
    )
    first = world.start("first", prompt=PROMPT)
    first.wait_event("put", text=prefix)
    first.kill()

    replacement = world.start("replacement")
    assert replacement.wait_event("get")["found"] is True
    replacement.finish()

    assert world.requests() == [FRESH, continuation(prefix)]
    assert_memory_holds_one_complete_turn(world, AIMessage(answer))
    assert world.checkpoints() == []


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_killed_mid_tool_arguments_the_cut_off_call_never_runs(
    world: World, use_async: bool
) -> None:
    call = ScriptedToolCall("lookup", ['{"city": ', '"Par', 'is"}'])
    world.script(
        # role, "Let ", "me c", "heck", ".", the call's head, '{"city": ', '"Par' | stall
        Scenario(text="Let me check.", tool_calls=[call], fault=Fault.stall(STALL, after_events=8)),
        Scenario(tool_calls=[ScriptedToolCall("lookup", {"city": "Paris"})]),
        Scenario(text="It is sunny in Paris."),
    )
    first = world.start("first", prompt=PROMPT, use_async=use_async)
    saved = first.wait_event("put", text="Let me check.", in_flight='{"city": "Par')
    first.kill()
    assert world.tool_calls() == []

    world.start("replacement", use_async=use_async).finish()

    requests = world.requests()
    assert requests[:2] == [FRESH, continuation("Let me check.")]
    assert len(requests) == 3  # then the tool's answer goes back to the model
    assert world.tool_calls() == [{"name": "lookup", "args": {"city": "Paris"}}]
    called = {"name": "lookup", "args": {"city": "Paris"}, "id": "x", "type": "tool_call"}
    assert_memory_holds_one_complete_turn(
        world,
        AIMessage("Let me check.", tool_calls=[called]),
        ToolMessage("Sunny in Paris.", tool_call_id="x"),
        AIMessage("It is sunny in Paris."),
    )
    assert world.memory()[1].id == saved["message_id"]
    assert world.checkpoints() == []


def test_killed_after_the_turn_completed_before_the_commit_no_request_is_repeated(
    world: World,
) -> None:
    world.script(Scenario(text=ANSWER))
    first = world.start("first", prompt=PROMPT, block="llm_end")
    first.wait_event("blocked", point="llm_end")
    first.kill()
    [kept] = world.checkpoints()
    assert kept.complete
    assert kept.partial_text == ANSWER
    assert [type(m) for m in world.memory()] == [HumanMessage]  # not committed yet

    replacement = world.start("replacement")
    assert replacement.wait_event("get")["found"] is True
    replacement.finish()

    assert world.requests() == [FRESH]  # the finished answer came from the checkpoint
    assert_memory_holds_one_complete_turn(world, AIMessage(ANSWER))
    assert world.memory()[1].id == kept.message_id
    assert world.checkpoints() == []


def test_killed_after_the_commit_before_the_checkpoint_was_released(world: World) -> None:
    world.script(Scenario(text=ANSWER))
    first = world.start("first", prompt=PROMPT, block="after_run")
    first.wait_event("blocked", point="after_run")
    first.kill()
    assert_memory_holds_one_complete_turn(world, AIMessage(ANSWER))
    [kept] = world.checkpoints()
    assert kept.complete
    assert kept.message_id == world.memory()[1].id

    world.start("replacement").finish()

    assert world.requests() == [FRESH]
    assert_memory_holds_one_complete_turn(world, AIMessage(ANSWER))
    assert world.checkpoints() == []


def test_killed_after_a_tool_call_turn_completed_the_tool_runs_once(world: World) -> None:
    world.script(
        Scenario(text="Let me check.", tool_calls=[ScriptedToolCall("lookup", {"city": "Paris"})]),
        Scenario(text="It is sunny in Paris."),
    )
    first = world.start("first", prompt=PROMPT, block="llm_end")
    first.wait_event("blocked", point="llm_end")
    first.kill()
    [kept] = world.checkpoints()
    assert kept.complete
    assert [c.args for c in kept.completed_tool_calls] == [{"city": "Paris"}]
    assert world.tool_calls() == []

    world.start("replacement").finish()

    requests = world.requests()
    assert len(requests) == 2  # the first turn was not asked for again
    assert requests[1][:2] == [("user", PROMPT), ("assistant", "Let me check.")]
    assert world.tool_calls() == [{"name": "lookup", "args": {"city": "Paris"}}]
    called = {"name": "lookup", "args": {"city": "Paris"}, "id": "x", "type": "tool_call"}
    assert_memory_holds_one_complete_turn(
        world,
        AIMessage("Let me check.", tool_calls=[called]),
        ToolMessage("Sunny in Paris.", tool_call_id="x"),
        AIMessage("It is sunny in Paris."),
    )
    memory = world.memory()
    assert memory[1].id == kept.message_id
    assert isinstance(memory[2], ToolMessage)
    assert memory[2].tool_call_id == kept.completed_tool_calls[0].id
    assert world.checkpoints() == []


def test_a_checkpoint_left_after_the_commit_is_released_by_the_threads_next_model_call(
    world: World,
) -> None:
    world.script(Scenario(text=ANSWER), Scenario(text="Mild tomorrow."))
    first = world.start("first", prompt=PROMPT, block="after_run")
    first.wait_event("blocked", point="after_run")
    first.kill()
    [kept] = world.checkpoints()
    assert kept.complete

    follow_up = "And tomorrow?"
    next_turn = world.start("next-turn", prompt=follow_up)
    next_turn.finish()

    deleted = [e for e in next_turn.events if e["event"] in ("delete", "claim")]
    # released with the kept record's epoch: a newer owner of the run would fence it
    assert deleted[0] == {"event": "delete", "run_id": kept.run_id, "epoch": kept.epoch}
    assert deleted[1]["event"] == "claim"
    assert deleted[1]["run_id"] != kept.run_id
    assert world.requests() == [FRESH, [*FRESH, ("assistant", ANSWER), ("user", follow_up)]]
    memory = world.memory()
    assert [(type(m), m.content) for m in memory] == [
        (HumanMessage, PROMPT),
        (AIMessage, ANSWER),
        (HumanMessage, follow_up),
        (AIMessage, "Mild tomorrow."),
    ]
    assert world.checkpoints() == []


# -- fencing -------------------------------------------------------------------------


def test_a_process_fenced_out_by_a_newer_owner_stops_writing_the_run(world: World) -> None:
    world.script(
        Scenario(text="The weather in Paris is mild."),  # the old owner's whole answer
        # the new owner continues from "The weat", then its stream stalls
        Scenario(text="her in Paris is sunny.", fault=Fault.stall(STALL, after_events=4)),
    )
    old = world.start("old-owner", prompt=PROMPT, block="token:3")
    old.wait_event("blocked", point="token:3")  # holds "her "
    old.wait_event("put", text="The weat")  # the background writer landed "The weat"
    key = _key_of(old)
    assert [p["text"] for p in old.puts()][-1] == "The weat"
    writes_before_the_race = len(old.puts())

    new = world.start("new-owner")  # resumes the same thread, hence the same run
    claimed = new.wait_event("claim")
    assert claimed["run_id"] == key
    newest = new.wait_event("put", text="The weather in Paris")
    assert newest["epoch"] == claimed["epoch"] > old.wait_event("claim")["epoch"]

    old.release()  # the old owner goes on streaming and tries to checkpoint again
    old.finish()
    assert old.puts()[writes_before_the_race:] == []  # not one more write went through
    assert (
        old.stderr().count("WARNING awaken_langchain.events: fenced out of run") == 1
    )  # one refused write, then no more
    assert "StreamCheckpointFencedError" not in old.stderr()  # logged, not raised

    new.kill()
    [stored] = world.checkpoints()
    assert stored.run_id == key
    assert stored.epoch == claimed["epoch"]
    assert stored.partial_text == "The weather in Paris"
    assert stored.message_id == newest["message_id"]


def test_a_process_fenced_at_its_closing_write_never_releases_the_new_owners_checkpoint(
    world: World,
) -> None:
    world.script(
        Scenario(text=ANSWER),  # the old owner's whole answer
        # the new owner continues after the old owner's last in-flight checkpoint
        Scenario(text=" More soon.", fault=Fault.stall(STALL, after_events=2)),
    )
    old = world.start("old-owner", prompt=PROMPT, block="complete_put")
    old.wait_event("blocked", point="complete_put")  # finished; about to write it complete
    key = _key_of(old)

    new = world.start("new-owner")
    claimed = new.wait_event("claim")
    assert claimed["run_id"] == key
    newest = new.wait_event("put", text=ANSWER + " Mor")

    old.release()  # its complete checkpoint is refused; then LangGraph commits its turn
    old.finish()
    assert old.stderr().count("WARNING awaken_langchain.events: fenced out of run") == 1
    assert not [e for e in old.events if e["event"] == "delete"]

    new.kill()
    [stored] = world.checkpoints()
    assert (stored.run_id, stored.epoch, stored.partial_text) == (
        key,
        claimed["epoch"],
        newest["text"],
    )
    assert not stored.complete
