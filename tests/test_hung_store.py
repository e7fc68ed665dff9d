"""A hung or failing checkpoint store never slows a turn, and checkpointing comes back.

Real sick stores: a ``redis-server`` frozen with SIGSTOP, a DiskCache whose
SQLite database another process holds locked, a file store on a disk whose
fsync takes seconds (simulated: the one stand-in here). Each turn is timed
against the same turn on the healthy store, measured in the same test: the sick
turn may take at most one ``checkpoint_deadline`` longer (the turn's last write
waits that long), plus a margin for a busy machine.

Also here: a sync stream that stalls is closed from the wrapper's side, so the
provider stops generating and no reader thread lingers.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessageChunk

from awaken_langchain import (
    DiskCacheStreamCheckpointStore,
    FileStreamCheckpointStore,
    InMemoryStreamCheckpointStore,
    RecoveringChatModel,
    RetryPolicy,
    StreamCheckpoint,
    StreamCheckpointStore,
)
from awaken_langchain import writer as writer_module
from awaken_langchain._idle import Pump
from awaken_langchain.accumulator import DeferredCheckpoint
from awaken_langchain.errors import (
    StreamCheckpointError,
    StreamCheckpointWarning,
    StreamStalledError,
)
from awaken_langchain.stores.redis import RedisStreamCheckpointStore
from awaken_langchain.testing import ScriptedChatModel, Stall, finish, text
from awaken_langchain.writer import CheckpointWriter, answers_at_once, writer_for
from tests.conftest import Drive
from tests.postgres_server import shared_postgres_server
from tests.redis_cluster import shared_redis_cluster
from tests.redis_server import RedisServer, shared_redis_server, unique_prefix
from tests.store_kinds import SERVER_KINDS, StoreKind, open_store, server_address

DEADLINE = 0.5
"""``checkpoint_deadline`` of every wrapper here."""
MARGIN = 1.5
"""Slack for a loaded CI machine on top of healthy time + one deadline."""
SICK_AT = 0.5
"""Seconds into the turn at which the store falls sick."""
T = TypeVar("T", bound=StreamCheckpointStore)
WARNING = "awaken_checkpoint_warning"
RECOVERED = "awaken_checkpoint_recovered"


def words(count: int) -> str:
    """``count`` four-character words: one chunk each."""
    return "".join(f"w{i:02d} " if i < 100 else f"{i:03d} " for i in range(count))


TEXT = words(80)
"""The answer of a normal turn: 80 chunks, streamed over about a second."""


def paced(answer: str, seconds: float) -> ScriptedChatModel:
    """A model that streams ``answer`` in 4-character chunks spread over ``seconds``."""
    chunks = text(answer)
    pause = seconds / len(chunks)
    steps: list[Any] = []
    for chunk in chunks:
        steps += [chunk, Stall(pause)]
    return ScriptedChatModel(default=[*steps, finish()])


def wrap(
    inner: ScriptedChatModel, store: StreamCheckpointStore, **settings: Any
) -> RecoveringChatModel:
    """The wrapper under test: one key per turn, complete turns kept in the store."""
    return RecoveringChatModel(
        model=inner,
        store=store,
        checkpoint_deadline=DEADLINE,
        keep_until_committed=True,
        checkpoint_key=lambda config: str(config["configurable"]["turn"]),
        **settings,
    )


class Events(BaseCallbackHandler):
    """Records the names of the recovery events a turn reports, as they come."""

    run_inline = True

    def __init__(self, names: list[str]) -> None:
        self.names = names

    def on_custom_event(self, name: str, data: Any, **kwargs: Any) -> None:
        self.names.append(name)


@dataclass
class Turn:
    """What the caller of one streamed turn saw."""

    key: str
    seconds: float = 0.0
    text: str = ""
    events: list[str] = field(default_factory=list)
    """Recovery events reported so far (filled while the turn streams)."""
    warnings: int = 0
    awaken: dict[str, Any] = field(default_factory=dict)


async def stream_turn(
    drive: Drive,
    model: RecoveringChatModel,
    *,
    at: tuple[float, Callable[[], None]] | None = None,
    each: Callable[[Turn], None] | None = None,
    turn: Turn | None = None,
) -> Turn:
    """Stream one turn under a new key, timing it from the call to the last chunk.

    Args:
        drive: Sync or async entry points.
        model: The wrapper.
        at: ``(seconds, action)``: run ``action`` on a timer thread that many
            seconds into the turn.
        each: Called with the turn so far after each chunk.
        turn: The record to fill (to watch it from another thread); a new one by default.
    """
    turn = turn or Turn(key=f"turn-{uuid.uuid4().hex[:8]}")
    config: Any = {"callbacks": [Events(turn.events)], "configurable": {"turn": turn.key}}
    timer = threading.Timer(at[0], at[1]) if at is not None else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", StreamCheckpointWarning)
        start = time.monotonic()
        if timer is not None:
            timer.start()
        try:
            async for chunk in drive.iterate(model, "Count.", config=config):
                assert isinstance(chunk, AIMessageChunk)
                turn.text += chunk.text
                turn.awaken = chunk.response_metadata.get("awaken", turn.awaken)
                if each is not None:
                    each(turn)
        finally:
            turn.seconds = time.monotonic() - start
            if timer is not None:
                timer.cancel()
    turn.warnings = sum(issubclass(w.category, StreamCheckpointWarning) for w in caught)
    return turn


def warm(store: T) -> T:
    """Open the store's connections, so that a first turn is not timed with them."""
    run_id = f"warm-up-{uuid.uuid4().hex[:8]}"
    store.claim(run_id)
    store.get(run_id)
    store.delete(run_id)
    return store


def assert_not_slowed(sick: Turn, healthy: Turn, answer: str = TEXT) -> None:
    """The sick turn kept stream speed, delivered everything, and warned once."""
    assert healthy.text == answer
    assert healthy.events == []
    assert healthy.awaken["checkpoint_complete"] is True
    assert sick.seconds <= healthy.seconds + DEADLINE + MARGIN, (sick.seconds, healthy.seconds)
    assert sick.text == answer
    assert sick.events.count(WARNING) == 1, sick.events
    assert sick.warnings == 1
    # The closing write could not land: the turn does not claim a kept checkpoint.
    assert sick.awaken["checkpoint_complete"] is False


# -- a server frozen with SIGSTOP ------------------------------------------------------


def signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def server_processes(kind: StoreKind) -> list[int]:
    """The processes of the shared test server of ``kind``: freezing them all freezes it."""
    if kind == "postgres":
        return shared_postgres_server().processes()
    if kind == "redis-cluster":
        return [node.pid for node in shared_redis_cluster().processes]
    process = shared_redis_server().process
    assert process is not None
    return [process.pid]


@pytest.fixture(params=SERVER_KINDS)
def server_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A warm store of the shared server of each kind; the server is thawed afterwards."""
    kind: StoreKind = request.param
    # A short timeout frees the writer sooner; the bound does not rely on it.
    setting = {"timeout": 1.0} if kind == "postgres" else {"socket_timeout": 1.0}
    store = warm(open_store(kind, str(tmp_path / "store"), server_address(kind), **setting))
    store.kind = kind
    try:
        yield store
    finally:
        signal_all(server_processes(kind), signal.SIGCONT)
        store.close()


@pytest.mark.slow
async def test_a_frozen_server_costs_a_turn_one_warning_not_its_speed(
    drive: Drive, server_store: Any
) -> None:
    model = wrap(paced(TEXT, 1.0), server_store)
    healthy = await stream_turn(drive, model)
    frozen: list[int] = []

    def freeze_server() -> None:
        frozen.extend(server_processes(server_store.kind))
        signal_all(frozen, signal.SIGSTOP)

    try:
        sick = await stream_turn(drive, model, at=(SICK_AT, freeze_server))
    finally:
        signal_all(frozen, signal.SIGCONT)
    assert frozen
    assert_not_slowed(sick, healthy)


@pytest.mark.slow
@pytest.mark.redis
async def test_checkpointing_resumes_within_the_turn_once_redis_answers_again(
    drive: Drive, private_redis: RedisServer
) -> None:
    answer = words(160)  # about 2 s: frozen from 0.5 s until the turn has warned
    # The default socket timeout (5 s) outlasts the outage: the frozen call is
    # answered when Redis thaws instead of failing on its own.
    store = warm(RedisStreamCheckpointStore(private_redis.url, prefix=unique_prefix()))
    model = wrap(paced(answer, 2.0), store)
    turn = Turn(key="turn-recovers")
    thawed_with = -1  # characters the caller had when Redis answered again
    landed: list[str] = []  # checkpointed text read back while the turn streamed

    def outage() -> None:
        nonlocal thawed_with
        private_redis.freeze()
        deadline = time.monotonic() + 5.0
        while WARNING not in turn.events and time.monotonic() < deadline:
            time.sleep(0.01)
        private_redis.thaw()
        thawed_with = len(turn.text)

    sick = threading.Thread(target=outage)

    def read_back(turn: Turn) -> None:
        if len(turn.text) == 40:  # 0.5 s in, and the run surely open: fall sick
            sick.start()
        elif thawed_with >= 0 and len(turn.text) % 40 == 0:
            checkpoint = store.get(turn.key)
            if checkpoint is not None:
                landed.append(checkpoint.partial_text)

    try:
        await stream_turn(drive, model, each=read_back, turn=turn)
    finally:
        if sick.ident is not None:
            sick.join()
        private_redis.thaw()

    assert turn.text == answer
    assert turn.awaken["checkpoint_writes"] > 0
    assert thawed_with > 0
    assert turn.events.count(WARNING) == 1, turn.events
    assert turn.events.count(RECOVERED) == 1, turn.events
    assert turn.events.index(WARNING) < turn.events.index(RECOVERED)
    assert all(answer.startswith(partial) for partial in landed)
    assert any(len(partial) > thawed_with for partial in landed), (thawed_with, landed)
    # With the store back, the closing write landed too.
    assert turn.awaken["checkpoint_complete"] is True


# -- DiskCache locked by another process --------------------------------------------------

LOCKER = """
import os, select, sqlite3, sys
db = sqlite3.connect(sys.argv[1], timeout=10, isolation_level=None)
print("ready", flush=True)
os.read(0, 1)
db.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
select.select([0], [], [], float(sys.argv[2]))  # until told, or for the given time
db.execute("ROLLBACK")
db.close()
"""


class Locker:
    """Another process that, when told, holds an SQLite database locked for ``seconds``
    (or until told to let it go)."""

    def __init__(self, database: Path, seconds: float) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", LOCKER, str(database), str(seconds)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert self.read() == "ready"

    def read(self) -> str:
        assert self.process.stdout is not None
        return self.process.stdout.readline().decode().strip()

    def lock(self) -> None:
        """Take the lock now (returns before the child has it)."""
        self._tell()

    def let_go(self) -> None:
        """Release the lock now, if the child still holds it."""
        self._tell()

    def _tell(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(b"!")
        self.process.stdin.flush()

    def released(self) -> None:
        """Wait until the child took the lock and let it go again."""
        assert self.read() == "locked"
        self.process.wait(timeout=10)

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


@pytest.fixture
def diskcache_store(tmp_path: Path) -> Iterator[DiskCacheStreamCheckpointStore]:
    store = warm(DiskCacheStreamCheckpointStore(tmp_path / "cache"))
    yield store
    store.close()


@pytest.fixture
def locker(diskcache_store: DiskCacheStreamCheckpointStore) -> Iterator[Locker]:
    """A process that locks the DiskCache store's database for 1.3 s when told."""
    locker = Locker(diskcache_store.directory / "cache.db", 1.3)
    yield locker
    locker.close()


@pytest.mark.slow
async def test_a_diskcache_locked_by_another_process_costs_a_turn_one_warning_not_its_speed(
    drive: Drive, diskcache_store: DiskCacheStreamCheckpointStore
) -> None:
    store = diskcache_store
    model = wrap(paced(TEXT, 1.0), store)
    healthy = await stream_turn(drive, model)

    # held until the turn returned, however slow the machine (a minute at most)
    locker = Locker(store.directory / "cache.db", 60)
    try:
        sick = await stream_turn(drive, model, at=(SICK_AT, locker.lock))
        locker.let_go()
        locker.released()
    finally:
        locker.close()

    assert_not_slowed(sick, healthy)

    # Lock released: the next turn checkpoints as usual while it streams.
    landed: list[str] = []

    def read_back(turn: Turn) -> None:
        if len(turn.text) % 40 == 0:
            checkpoint = store.get(turn.key)
            if checkpoint is not None and checkpoint.partial_text:
                landed.append(checkpoint.partial_text)

    after = await stream_turn(drive, wrap(paced(TEXT, 0.5), store), each=read_back)
    assert after.text == TEXT
    assert WARNING not in after.events
    assert landed
    assert all(TEXT.startswith(partial) for partial in landed)
    assert after.awaken["checkpoint_complete"] is True


# -- a file store on a slow disk ------------------------------------------------------------


class SlowDiskStore(FileStreamCheckpointStore):
    """A file store whose fsync takes ``seconds`` once ``slow`` is set (a sick disk)."""

    def __init__(self, directory: Path, seconds: float) -> None:
        super().__init__(directory)
        self.slow = threading.Event()
        self.seconds = seconds
        self.slow_syncs = 0

    def _sync(self, fd: int) -> None:
        if self.slow.is_set():
            self.slow_syncs += 1
            time.sleep(self.seconds)
        super()._sync(fd)


@pytest.mark.slow
async def test_a_file_store_on_a_slow_disk_costs_a_turn_one_warning_not_its_speed(
    drive: Drive, tmp_path: Path
) -> None:
    store = warm(SlowDiskStore(tmp_path / "files", seconds=2.0))
    model = wrap(paced(TEXT, 1.0), store)
    healthy = await stream_turn(drive, model)

    sick = await stream_turn(drive, model, at=(SICK_AT, store.slow.set))

    assert store.slow_syncs > 0  # the slow fsync really was in the writes' path
    assert_not_slowed(sick, healthy)


# -- a stalled sync stream is closed ------------------------------------------------------


def pump_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "awaken-stream-pump"]


async def _no_sleep(seconds: float) -> None:
    await asyncio.sleep(0)


@pytest.mark.slow
async def test_a_stalled_stream_is_closed_as_soon_as_the_wrapper_gives_up_on_it(
    drive: Drive,
) -> None:
    from langchain_openai import ChatOpenAI

    from awaken_langchain.testing import Fault, LoopbackProvider, Scenario

    idle = 0.5
    with LoopbackProvider() as server:
        server.enqueue(Scenario(text=TEXT, fault=Fault.stall(30, after_events=5)))
        inner = ChatOpenAI(
            model="gpt-4o-mini", base_url=server.base_url_openai, api_key="x", max_retries=0
        )
        model = RecoveringChatModel(
            model=inner,
            stream_idle_timeout=idle,
            retry_policy=RetryPolicy(sleep=lambda seconds: None, async_sleep=_no_sleep),
        )
        chunks = await drive.stream(model, "Count.")
        answer = "".join(chunk.text for chunk in chunks)
        stalled = server.requests[0]

        assert len(server.requests) == 2  # the wrapper gave up on the stall and continued
        assert answer.startswith(TEXT[:4])
        # The client closed the stalled connection when it moved on, not 30 s later.
        hangup = server.hangups.get(stalled.number)
        assert hangup is not None, server.hangups
        assert hangup - stalled.received_at < idle + 1.0
        # ... and no reader thread is left waiting for the stalled stream.
        for thread in pump_threads():
            thread.join(timeout=1.0)
        assert pump_threads() == []


def test_sync_streams_one_after_another_are_read_by_one_reused_thread() -> None:
    readers: list[threading.Thread] = []

    def source() -> Iterator[str]:
        readers.append(threading.current_thread())
        yield "x"

    for _ in range(20):
        assert list(Pump(source(), 5.0)) == ["x"]
    # a stream may start before the previous reader is free again: at most one more
    assert len(set(readers)) <= 2


def test_a_reader_stuck_in_an_uninterruptible_read_does_not_hold_up_the_next_stream() -> None:
    release = threading.Event()

    def stuck() -> Iterator[Any]:
        release.wait(10)
        yield from ()

    try:
        with pytest.raises(StreamStalledError):
            list(Pump(stuck(), 0.1))
        follow = list(Pump(iter(["x", "y"]), 5.0))
        assert follow == ["x", "y"]
    finally:
        release.set()


async def test_a_closing_write_the_turn_gave_up_waiting_for_still_lands() -> None:
    """An async turn that stops waiting for a slow store does not cancel its last write."""
    release = threading.Event()

    class Slow(InMemoryStreamCheckpointStore):
        def put(self, checkpoint: StreamCheckpoint) -> None:
            release.wait(5)  # the writer is stuck here while the turn ends
            super().put(checkpoint)

    store = Slow()
    inner = ScriptedChatModel(scripts=[[*text("x" * 64), finish()]])
    model = RecoveringChatModel(model=inner, store=store, checkpoint_deadline=0.2)
    run_id = uuid.uuid4()
    with pytest.warns(StreamCheckpointWarning, match="did not answer within 0.2 s"):
        answer = await model.ainvoke("q", config={"run_id": run_id})
    assert answer.content == "x" * 64  # the turn did not wait for the store
    release.set()
    writer = writer_for(store)
    await writer.await_(writer.call(lambda: None), 5.0)
    assert store.get(str(run_id)) is None  # its closing delete still landed, after the puts


EXITS_RIGHT_AFTER = """
import sys, time
from awaken_langchain import DiskCacheStreamCheckpointStore, StreamCheckpoint
from awaken_langchain.writer import writer_for
store = DiskCacheStreamCheckpointStore(sys.argv[1])
writer = writer_for(store)
store.put(StreamCheckpoint(run_id="done", partial_text="finished turn"))
writer.call(lambda: time.sleep(0.3))  # a slow store: the delete below is still queued
writer.call(lambda: store.delete("done"))
writer.submit(StreamCheckpoint(run_id="open", partial_text="in flight"))
"""


def test_a_process_that_ends_lets_its_queued_writes_land(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-c", EXITS_RIGHT_AFTER, str(tmp_path / "cache")],
        check=True,
        timeout=60,
    )
    with DiskCacheStreamCheckpointStore(tmp_path / "cache") as store:
        assert store.list_run_ids() == ["open"]


class _Batches(InMemoryStreamCheckpointStore):
    """Records each group commit the writer makes, with when it began."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[tuple[float, list[str]]] = []

    def put_many(self, checkpoints: Any) -> Any:
        self.batches.append((time.monotonic(), [c.partial_text for c in checkpoints]))
        return super().put_many(checkpoints)


def test_checkpoints_gather_while_they_arrive_and_one_after_a_quiet_spell_is_written_at_once() -> (
    None
):
    store = _Batches()
    writer = CheckpointWriter(store, gather=0.3)
    writer.submit(StreamCheckpoint(run_id="a", partial_text="1"))  # the writer starts: gathers
    writer.submit(StreamCheckpoint(run_id="b", partial_text="2"))
    assert writer.flush(5.0)
    assert [texts for _, texts in store.batches] == [["1", "2"]]
    time.sleep(0.4)  # quiet for longer than the gathering time
    submitted = time.monotonic()
    writer.submit(StreamCheckpoint(run_id="a", partial_text="3"))
    assert writer.flush(5.0)
    began, texts = store.batches[-1]
    assert texts == ["3"]
    assert began - submitted < 0.2  # not held for the gathering time


def test_a_checkpoint_that_cannot_be_built_is_reported_and_the_writer_goes_on() -> None:
    class Broken(DeferredCheckpoint):
        def build(self) -> StreamCheckpoint:
            raise RuntimeError("cannot build")

    store = InMemoryStreamCheckpointStore()
    writer = writer_for(store)
    writer.submit(Broken({"run_id": "broken"}, "", [], 0))
    assert writer.flush(5.0)
    problem = writer.problem("broken", 60.0)
    assert isinstance(problem, StreamCheckpointError)
    assert isinstance(problem.cause, RuntimeError)

    epoch = store.claim("fine")
    writer.submit(StreamCheckpoint(run_id="fine", partial_text="kept", epoch=epoch))
    assert writer.flush(5.0)
    kept = store.get("fine")
    assert kept is not None
    assert kept.partial_text == "kept"
    assert store.get("broken") is None


class _Queued(InMemoryStreamCheckpointStore):
    """The in-process store with every operation on the writer thread (a subclass
    does not inherit ``answers_at_once``)."""


_RUNS = st.sampled_from(["a", "b", "c"])
_WRITER_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), _RUNS, st.text("xyz", min_size=1, max_size=4)),
        st.tuples(st.just("claim"), _RUNS),
        st.tuples(st.just("get"), _RUNS),
        st.tuples(st.just("last put"), _RUNS, st.text("xyz", min_size=1, max_size=4)),
        st.tuples(st.just("delete"), _RUNS),
        st.tuples(
            st.just("everything"),
        ),
    ),
    max_size=14,
)


def _drive_writer(
    store: StreamCheckpointStore, steps: list[tuple[Any, ...]], *, on_loop: bool = False
) -> list[Any]:
    """Run ``steps`` through the store's writer as turns do; return what each step saw.

    ``on_loop``: hand checkpoints over as an async turn does (the caller runs an event loop).
    """
    writer = CheckpointWriter(store, gather=0.02)  # submitted checkpoints stay pending a while
    epochs: dict[str, int] = {}
    seen: list[Any] = []

    def outcome(action: Callable[[], Any], **where: Any) -> Any:
        try:
            return writer.wait(writer.call(action, **where), 5.0)
        except StreamCheckpointError as exc:
            return type(exc).__name__

    for step in steps:
        kind, run = step[0], step[1] if len(step) > 1 else ""
        if kind == "put":
            writer.submit(
                StreamCheckpoint(run_id=run, partial_text=step[2], epoch=epochs.get(run, 0)),
                on_loop=on_loop,
            )
            continue
        if kind == "claim":
            result = outcome(functools.partial(store.claim, run), runs=(run,))
            if isinstance(result, int):
                epochs[run] = result
        elif kind == "get":
            got = outcome(functools.partial(store.get, run), runs=(run,))
            result = got.partial_text if isinstance(got, StreamCheckpoint) else got
        elif kind == "last put":
            last = StreamCheckpoint(run_id=run, partial_text=step[2], epoch=epochs.get(run, 0))
            result = outcome(functools.partial(store.put, last), runs=(run,), closes=run)
        elif kind == "delete":
            delete = functools.partial(store.delete, run, epoch=epochs.get(run))
            result = outcome(delete, runs=(run,), closes=run)
        else:
            result = outcome(lambda: sorted(store.list_run_ids()))
        seen.append((step, result))
    assert writer.flush(5.0)
    kept = {run: store.get(run) for run in ("a", "b", "c")}
    seen.append({run: c.partial_text if c else None for run, c in kept.items()})
    # A turn reads its run's problem only until its closing write or delete (then it
    # forgets the run); after it, whether a put still pending when the close came was
    # attempted (and refused) or dropped as older depends on timing.
    closing = ("delete", "last put")
    last = {step[1]: step[0] for step in steps if len(step) > 1}
    open_runs = [run for run in ("a", "b", "c") if last.get(run) not in closing]
    seen.append({run: type(writer.problem(run, 60.0)).__name__ for run in open_runs})
    return seen


@settings(max_examples=60, deadline=None)
@given(steps=_WRITER_STEPS)
def test_the_in_process_store_on_the_turns_thread_sees_and_keeps_what_a_hop_would(
    steps: list[tuple[Any, ...]],
) -> None:
    """Claims, reads, last writes and deletes run on the caller's thread when nothing of
    their runs is pending; each sees, and leaves, exactly what it would after a hop."""
    assert answers_at_once(InMemoryStreamCheckpointStore())
    assert not answers_at_once(_Queued())
    assert _drive_writer(InMemoryStreamCheckpointStore(), steps) == _drive_writer(_Queued(), steps)


def test_a_slow_subclass_of_the_in_process_store_still_cannot_hold_up_a_turn() -> None:
    """A subclass may make any operation slow, so its turns keep the writer's deadline."""
    release = threading.Event()

    class SlowDelete(InMemoryStreamCheckpointStore):
        def delete(self, run_id: str, *, epoch: int | None = None) -> None:
            release.wait(5)
            super().delete(run_id, epoch=epoch)

    store = SlowDelete()
    inner = ScriptedChatModel(scripts=[[*text("x" * 40), finish()]])
    model = RecoveringChatModel(model=inner, store=store, checkpoint_deadline=0.2)
    run_id = uuid.uuid4()
    began = time.monotonic()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StreamCheckpointWarning)
        answer = model.invoke("q", config={"run_id": run_id})
    took = time.monotonic() - began
    release.set()
    assert answer.content == "x" * 40
    assert took < 0.2 + MARGIN
    assert writer_for(store).flush(5.0)
    assert store.get(str(run_id)) is None  # the delete still landed


def test_a_checkpoint_the_in_process_store_left_for_later_lands_at_the_next_flush() -> None:
    """A run written on the caller's thread within the gathering time keeps its newest
    checkpoint pending; nothing is lost: a flush writes it."""
    store = InMemoryStreamCheckpointStore()
    writer = CheckpointWriter(store, gather=60.0)
    epoch = store.claim("run")
    writer.submit(StreamCheckpoint(run_id="run", partial_text="first", epoch=epoch))
    writer.submit(StreamCheckpoint(run_id="run", partial_text="first second", epoch=epoch))
    kept = store.get("run")
    assert kept is not None
    assert kept.partial_text == "first"  # written at once; the second came too soon after
    assert writer.flush(5.0)
    kept = store.get("run")
    assert kept is not None
    assert kept.partial_text == "first second"


# -- DiskCache commits on the stream's thread -----------------------------------------------


def test_a_diskcache_commit_that_cannot_start_now_writes_nothing_and_waits_for_nothing(
    diskcache_store: DiskCacheStreamCheckpointStore, locker: Locker
) -> None:
    """`put_many_now` and `call_now` never wait for another process's lock; `put_many` still
    does, and a write refused for the lock was not made."""
    store = diskcache_store
    epoch = store.claim("run")
    first = StreamCheckpoint(run_id="run", partial_text="first", epoch=epoch)
    assert store.put_many_now([first]) == [None]

    locker.lock()
    assert locker.read() == "locked"  # held for 1.3 s from now
    began = time.monotonic()
    later = StreamCheckpoint(run_id="run", partial_text="first second", epoch=epoch)
    assert store.put_many_now([later]) is None
    assert store.call_now(functools.partial(store.claim, "other")) == (False, None)
    assert time.monotonic() - began < 0.5
    assert store.put_many([later]) == [None]  # waits for the lock, as every write does
    assert time.monotonic() - began > 0.5
    locker.process.wait(timeout=10)

    kept = DiskCacheStreamCheckpointStore(store.directory, read_only=True).get("run")
    assert kept is not None
    assert kept.partial_text == "first second"
    assert store.claim("other") == store.claim("never claimed before") == 1  # "other" was not


def test_a_subclass_of_diskcache_commits_on_the_writer_thread(tmp_path: Path) -> None:
    """Only the class that defines ``put_many_now`` is written on the stream's thread."""

    class Traced(DiskCacheStreamCheckpointStore):
        def put_many(self, checkpoints: Any) -> list[StreamCheckpointError | None]:
            threads.append(threading.current_thread().name)
            return super().put_many(checkpoints)

    threads: list[str] = []
    store = Traced(tmp_path / "cache")
    writer = CheckpointWriter(store)
    epoch = store.claim("run")
    writer.submit(StreamCheckpoint(run_id="run", partial_text="x", epoch=epoch))
    assert writer.flush(5.0)
    assert threads == ["awaken-checkpoint-writer"]
    store.close()


@pytest.mark.slow
async def test_what_a_stream_hands_over_just_before_it_pauses_is_durable_during_the_pause(
    drive: Drive, tmp_path: Path
) -> None:
    """A stream commits DiskCache on its own thread at most once per gathering time; what it
    hands over sooner is still written within about that time when no more chunks come."""
    store = warm(DiskCacheStreamCheckpointStore(tmp_path / "cache"))
    # Commits at most every 0.2 s: the checkpoint handed over at chunk 40 comes sooner
    # after the last commit, so it is left pending when the pause begins. Only the chunk
    # rule writes (every 8 chunks, so at chunk 40): a time-rule write would move it.
    store.__dict__[writer_module._ATTRIBUTE] = CheckpointWriter(store, gather=0.2)
    before = words(40)
    after = words(48)[len(before) :]
    inner = ScriptedChatModel(default=[*text(before), Stall(1.5), *text(after), finish()])
    seen: list[str | None] = []

    def read_in_another_process_way() -> None:
        reader = DiskCacheStreamCheckpointStore(store.directory, read_only=True)
        try:
            checkpoint = reader.get(turn.key)
            seen.append(None if checkpoint is None else checkpoint.partial_text)
        finally:
            reader.close()

    timer = threading.Timer(0.6, read_in_another_process_way)

    def at_the_pause(turn: Turn) -> None:
        if turn.text == before:
            timer.start()

    turn = Turn(key="paused")
    try:
        model = wrap(inner, store, checkpoint_every_seconds=3600.0)
        await stream_turn(drive, model, each=at_the_pause, turn=turn)
    finally:
        timer.join()
    assert turn.text == before + after
    assert seen == [before]
    store.close()


class _QueuedDisk(DiskCacheStreamCheckpointStore):
    """DiskCache with every write on the writer thread (a subclass does not inherit
    ``put_many_now``)."""


async def _drive_writer_on_a_loop(store: StreamCheckpointStore, steps: list[Any]) -> list[Any]:
    # an event loop runs; blocked by the steps, its timers fire only at the end
    return _drive_writer(store, steps, on_loop=True)


@settings(max_examples=40, deadline=None)
@given(steps=_WRITER_STEPS, on_a_loop=st.booleans())
def test_diskcache_written_on_the_streams_thread_sees_and_keeps_what_the_writer_thread_would(
    steps: list[tuple[Any, ...]], on_a_loop: bool
) -> None:
    """Checkpoints committed on the caller's thread (and left for a loop's timer) come in the
    same order with claims, reads, last writes and deletes as through the writer thread."""

    def run(store: DiskCacheStreamCheckpointStore) -> list[Any]:
        try:
            if on_a_loop:
                return asyncio.run(_drive_writer_on_a_loop(store, steps))
            return _drive_writer(store, steps)
        finally:
            store.close()

    with tempfile.TemporaryDirectory() as directory:
        here = run(DiskCacheStreamCheckpointStore(Path(directory) / "here"))
        queued = run(_QueuedDisk(Path(directory) / "queued"))
    assert here == queued


def test_a_stream_on_another_event_loop_is_not_left_waiting_for_a_busy_loops_timer(
    tmp_path: Path,
) -> None:
    """Each event loop gets its own timer for what its streams leave pending: a timer set
    on a loop whose thread went off to do something else cannot hold another's back."""
    store = DiskCacheStreamCheckpointStore(tmp_path / "cache")
    writer = CheckpointWriter(store, gather=0.1)
    epochs = {run: store.claim(run) for run in ("first", "a", "b")}
    a_left = threading.Event()
    seen: list[str | None] = []

    def checkpoint(run: str) -> StreamCheckpoint:
        return StreamCheckpoint(run_id=run, partial_text=f"text of {run}", epoch=epochs[run])

    async def on_a() -> None:
        writer.submit(checkpoint("first"), on_loop=True)  # committed here: a batch taken now
        writer.submit(checkpoint("a"), on_loop=True)  # too soon: left for this loop's timer
        a_left.set()
        time.sleep(1.0)  # noqa: ASYNC251 - this thread blocks: its loop runs no timer for 1 s

    async def on_b() -> None:
        assert a_left.wait(5)
        writer.submit(checkpoint("b"), on_loop=True)  # too soon as well
        await asyncio.sleep(0.4)  # this loop is free
        with DiskCacheStreamCheckpointStore(store.directory, read_only=True) as reader:
            kept = reader.get("b")
        seen.append(None if kept is None else kept.partial_text)

    threads = [threading.Thread(target=asyncio.run, args=(main(),)) for main in (on_a, on_b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == ["text of b"]
    assert writer.flush(5.0)
    assert store.get("a") is not None
    store.close()
