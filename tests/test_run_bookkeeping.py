"""What the library keeps about a run ends when the run ends, whatever its outcome.

A process serving many turns must return to its baseline: the checkpoint
writer forgets a run once its turn is over (finished, failed, fenced out by a
replacement process, or abandoned by its caller), and a store holds no epoch
record of a run whose owner ended it.
"""

from __future__ import annotations

import gc
import time
import tracemalloc
import uuid
from pathlib import Path
from typing import Any

import pytest

from awaken_langchain import (
    DiskCacheStreamCheckpointStore,
    InMemoryStreamCheckpointStore,
    StreamCheckpoint,
    StreamCheckpointStore,
    _runlog,
)
from awaken_langchain.errors import StreamCheckpointFencedError, StreamInterruptedError
from awaken_langchain.model import RecoveringChatModel
from awaken_langchain.retry import RetryPolicy
from awaken_langchain.stores._base import DEFAULT_EPOCH_GRACE
from awaken_langchain.testing.scripted import ScriptedChatModel, Stall, finish, text
from awaken_langchain.writer import writer_for
from tests.conftest import STORE_BACKENDS, Drive, FakeClock, StoreBackend, StoreFactory


async def _no_wait(_seconds: float) -> None:
    return None


def _model(store: StreamCheckpointStore, *scripts: list[Any], **settings: Any) -> Any:
    if settings.get("retry_policy", "") is None:  # no recovery: the first cut ends the turn
        settings["retry_policy"] = RetryPolicy(
            sleep=lambda _s: None, async_sleep=_no_wait, max_attempts=1, max_continuations=0
        )
    settings.setdefault("retry_policy", RetryPolicy(sleep=lambda _s: None, async_sleep=_no_wait))
    return RecoveringChatModel(
        model=ScriptedChatModel(scripts=list(scripts)), store=store, **settings
    )


def _store(backend: str, tmp_path: Path) -> StreamCheckpointStore:
    if backend == "memory":
        return InMemoryStreamCheckpointStore()
    return DiskCacheStreamCheckpointStore(tmp_path / "store")


PIECE = "x" * 4000
"""One chunk of a long turn: 30 of them make a turn of 120 000 characters."""


async def _fenced_turn(store: StreamCheckpointStore, drive: Drive) -> str:
    """One turn that a replacement process takes over after its first chunks."""
    run_id = uuid.uuid4()
    key = str(run_id)
    chunks = text(PIECE * 30, size=len(PIECE))
    paced = [step for chunk in chunks[6:12] for step in (Stall(0.03), chunk)]  # writes land
    script = [*chunks[:6], *paced, *chunks[12:], finish()]
    model = _model(store, script, checkpoint_every_chunks=2)
    stream = drive.iterate(model, "q", config={"run_id": run_id})
    received = [await anext(stream) for _ in range(6)]
    assert writer_for(store).flush(10.0)  # the turn's checkpoints are in the store
    epoch = store.claim(key)  # the replacement process
    store.put(StreamCheckpoint(run_id=key, partial_text="the new owner's", epoch=epoch))
    with pytest.warns(Warning, match="fenced out"):
        received += [chunk async for chunk in stream]
    assert "".join(str(c.content) for c in received) == PIECE * 30
    assert writer_for(store).flush(10.0)
    store.delete(key)  # the new owner finishes
    return key


@pytest.mark.parametrize("backend", ["memory", "diskcache"])
async def test_turns_fenced_out_by_a_replacement_process_leave_nothing_behind(
    backend: str, drive: Drive, tmp_path: Path
) -> None:
    store = _store(backend, tmp_path)
    writer = writer_for(store)
    for _ in range(2):  # warm up: first-use allocations are not what is measured
        await _fenced_turn(store, drive)
    gc.collect()
    tracemalloc.start()
    try:
        baseline = tracemalloc.get_traced_memory()[0]
        keys = [await _fenced_turn(store, drive) for _ in range(12)]
        # finished runs' event logs are kept for late readers on purpose (docs/readers.md),
        # and end with the store's ttl; what is measured here is what the turns leave
        _runlog.run_log(store).collect(-1.0)  # type: ignore[attr-defined]
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - baseline
    finally:
        tracemalloc.stop()
    assert [key for key in keys if writer.problem(key, 3600.0) is not None] == []
    assert held < 5 * len(PIECE) * 30  # a pinned turn holds its text, maybe more than once


def _seen_by_another_reader(path: Path, key: str, want: str, within: float) -> str:
    """What another process's store sees of ``key``, polled while this thread blocks."""
    reader = DiskCacheStreamCheckpointStore(path)
    until = time.monotonic() + within
    while True:
        saved = reader.get(key)
        seen = "" if saved is None else saved.partial_text
        if seen == want or time.monotonic() > until:
            return seen
        time.sleep(0.01)  # blocks the event loop, as a caller's synchronous work does


async def test_a_turns_checkpoint_catches_up_while_its_caller_does_synchronous_work(
    tmp_path: Path, drive: Drive
) -> None:
    """A burst of chunks handed over faster than the gathering time reaches the store
    while the caller keeps its thread (and, async, its event loop) busy.

    A chunk's checkpoint is handed over when the caller asks for the next one, so
    the store may lack the chunk being read, and nothing before it.
    """
    store = DiskCacheStreamCheckpointStore(tmp_path / "store")
    answer = "abcd" * 300
    model = _model(store, [*text(answer, size=4), finish()], checkpoint_every_chunks=1)
    run_id = uuid.uuid4()
    stream = drive.iterate(model, "q", config={"run_id": run_id})
    received = ""
    while len(received) < len(answer):
        received += str((await anext(stream)).content)
    before_last = received[:-4]
    seen = _seen_by_another_reader(tmp_path / "store", str(run_id), before_last, within=2.0)
    assert len(seen) >= len(before_last)
    assert received.startswith(seen)
    rest = [chunk async for chunk in stream]
    assert received + "".join(str(c.content) for c in rest) == answer


LOCAL_BACKENDS = [backend for backend in STORE_BACKENDS if backend.name != "redis"]
"""Stores whose epoch records end by the store's own hand (Redis expires its keys itself)."""


@pytest.mark.parametrize("backend", LOCAL_BACKENDS, ids=lambda backend: backend.name)
def test_a_stores_epoch_records_end_with_the_turns_that_made_them(
    backend: StoreBackend, tmp_path: Path, clock: FakeClock
) -> None:
    """Forty turns, ended every way a turn ends, leave the store as it was once their
    checkpoints expire and gc runs: well before ``epoch_grace`` has passed."""
    factory = StoreFactory(backend, tmp_path / "store")
    store = factory(ttl=60, clock=clock)
    empty = factory.records(store)
    broken = [*text("cut off", size=1), ConnectionResetError("connection reset by peer")]
    for turn in range(40):
        key = str(uuid.uuid4())
        config = {"run_id": uuid.UUID(key)}
        if turn % 4 == 0:  # finished: the turn deletes its checkpoint
            _model(store, [*text("done", size=1), finish()]).invoke("q", config=config)
        elif turn % 4 == 1:  # finished and kept until memory commits it (commit_turn)
            kept = _model(store, [*text("kept", size=1), finish()], keep_until_committed=True)
            kept.invoke("q", config=config)
            store.delete(key)
        elif turn % 4 == 2:  # failed: its checkpoint stays for a resume, until it expires
            failing = _model(store, broken, broken, retry_policy=None)
            with pytest.raises(StreamInterruptedError):
                failing.invoke("q", config=config)
            assert store.get(key) is not None
        else:  # taken over by a replacement process, which finishes the turn
            stale = store.claim(key)
            store.put(StreamCheckpoint(run_id=key, partial_text="the first owner's", epoch=stale))
            _model(store, [*text("done", size=1), finish()]).invoke("q", config=config)
            with pytest.raises(StreamCheckpointFencedError):  # the first owner wakes up
                store.put(StreamCheckpoint(run_id=key, partial_text="late", epoch=stale))
    factory.let_time_pass(store, clock, 61)  # past the ttl, far from the epoch grace
    store.gc()
    assert factory.records(store) - empty <= 1  # at most the epoch floor (diskcache, file)
    factory.close()


def test_the_in_process_store_removes_what_expired_without_anyone_calling_gc(
    clock: FakeClock,
) -> None:
    """Nothing outside the process can collect an in-process store: its claims do."""
    store = InMemoryStreamCheckpointStore(ttl=60, clock=clock)
    memory = next(backend for backend in STORE_BACKENDS if backend.name == "memory")
    broken = [*text("cut off", size=1), ConnectionResetError("connection reset by peer")]
    for _ in range(10):  # failed turns: their checkpoints stay for a resume until they expire
        with pytest.raises(StreamInterruptedError):
            _model(store, broken, retry_policy=None).invoke("q")
    for _ in range(10):  # turns that crashed between their claim and their first write
        store.claim(str(uuid.uuid4()))
    assert len(store.list_run_ids()) == 10
    clock.advance(DEFAULT_EPOCH_GRACE + 61)  # every checkpoint and record has expired
    _model(store, [*text("done", size=1), finish()]).invoke("q")  # the next turn
    assert memory.records(store, Path()) == 0
