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
)
from awaken_langchain.model import RecoveringChatModel
from awaken_langchain.retry import RetryPolicy
from awaken_langchain.testing.scripted import ScriptedChatModel, Stall, finish, text
from awaken_langchain.writer import writer_for
from tests.conftest import Drive


async def _no_wait(_seconds: float) -> None:
    return None


def _model(store: StreamCheckpointStore, *scripts: list[Any], **settings: Any) -> Any:
    return RecoveringChatModel(
        model=ScriptedChatModel(scripts=list(scripts)),
        store=store,
        retry_policy=RetryPolicy(sleep=lambda _s: None, async_sleep=_no_wait),
        **settings,
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
