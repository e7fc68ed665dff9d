"""RecoveringChatModel with a checkpoint store: cadence, resume, fencing, failures."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler

from awaken_langchain import (
    FileStreamCheckpointStore,
    InMemoryStreamCheckpointStore,
    StreamCheckpoint,
    StreamCheckpointStore,
)
from awaken_langchain.checkpoint import CompletedToolCall, InFlightToolCall
from awaken_langchain.errors import StreamCheckpointWarning, StreamInterruptedError
from awaken_langchain.model import RecoveringChatModel
from awaken_langchain.recovery import DEFAULT_CONTINUATION_PROMPT
from awaken_langchain.retry import RetryPolicy
from awaken_langchain.testing.scripted import ScriptedChatModel, finish, text
from tests.conftest import Drive, FakeClock


async def _no_wait(_seconds: float) -> None:
    return None


def policy(**settings: Any) -> RetryPolicy:
    return RetryPolicy(sleep=lambda _s: None, async_sleep=_no_wait, **settings)


def process(
    store: StreamCheckpointStore, *scripts: list[Any], **settings: Any
) -> tuple[RecoveringChatModel, ScriptedChatModel]:
    """One 'process': a fresh wrapper and inner model over a shared store."""
    inner = ScriptedChatModel(scripts=list(scripts))
    settings.setdefault("retry_policy", policy())
    return RecoveringChatModel(model=inner, store=store, **settings), inner


def reset() -> ConnectionResetError:
    return ConnectionResetError("connection reset by peer")


def run_config(run_id: uuid.UUID) -> dict[str, Any]:
    return {"run_id": run_id}


async def test_checkpoint_is_keyed_by_the_callers_run_id_and_kept_when_recovery_fails(
    drive: Drive,
) -> None:
    store = InMemoryStreamCheckpointStore()
    run_id = uuid.uuid4()
    model, _ = process(
        store, [*text("Partial answer "), reset()], retry_policy=policy(max_continuations=0)
    )
    with pytest.raises(StreamInterruptedError):
        await drive.invoke(model, "q", config=run_config(run_id))
    saved = store.get(str(run_id))
    assert saved is not None
    assert saved.partial_text == "Partial answer "
    assert saved.model == "scripted:scripted"


async def test_checkpoint_is_deleted_once_the_turn_is_complete(drive: Drive) -> None:
    store = InMemoryStreamCheckpointStore()
    run_id = uuid.uuid4()
    model, _ = process(store, [*text("one "), reset()], [*text("two"), finish()])
    assert (await drive.invoke(model, "q", config=run_config(run_id))).content == "one two"
    assert store.get(str(run_id)) is None
    assert store.list_run_ids() == []


async def test_no_more_than_the_configured_chunks_of_output_are_at_risk(drive: Drive) -> None:
    store = InMemoryStreamCheckpointStore()
    run_id = uuid.uuid4()
    model, _ = process(store, [*text("x" * 40, size=1), finish()], checkpoint_every_chunks=8)
    stream = drive.iterate(model, "q", config=run_config(run_id))
    seen = "".join([str((await anext(stream)).content) for _ in range(20)])
    await stream.aclose()  # the consumer dies mid-answer
    saved = store.get(str(run_id))
    assert saved is not None
    assert len(seen) - len(saved.partial_text) <= 8


class SlowStore(InMemoryStreamCheckpointStore):
    """A store whose every put takes a second of the turn's clock."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.turn_clock = clock
        self.puts = 0

    def put(self, checkpoint: StreamCheckpoint) -> None:
        self.turn_clock.advance(1.0)
        self.puts += 1
        super().put(checkpoint)


async def test_a_slow_store_is_written_at_the_chunk_cadence_not_on_every_chunk(
    drive: Drive,
) -> None:
    clock = FakeClock()
    store = SlowStore(clock)
    model, _ = process(
        store, [*text("x" * 256), finish()], retry_policy=policy(clock=clock)
    )  # 64 chunks; only the puts take time
    await drive.invoke(model, "q")
    assert 1 <= store.puts <= 64 // 8  # the background writer may coalesce some


async def test_a_replacement_process_resumes_the_turn_without_repeating_text(drive: Drive) -> None:
    store = InMemoryStreamCheckpointStore()
    run_id = uuid.uuid4()
    first, _ = process(
        store, [*text("The answer begins "), reset()], retry_policy=policy(max_continuations=0)
    )
    with pytest.raises(StreamInterruptedError):
        await drive.invoke(first, "q", config=run_config(run_id))

    second, inner = process(store, [*text("and ends."), finish()])
    chunks = await drive.stream(second, "q", config=run_config(run_id))
    assert "".join(str(c.content) for c in chunks) == "The answer begins and ends."
    request = inner.calls[0].messages
    assert [m.content for m in request[1:]] == ["The answer begins", DEFAULT_CONTINUATION_PROMPT]
    awaken = chunks[-1].response_metadata["awaken"]
    assert awaken["resumed"] is True
    assert store.get(str(run_id)) is None


async def test_resuming_costs_no_retry_budget(drive: Drive) -> None:
    store = InMemoryStreamCheckpointStore()
    run_id = uuid.uuid4()
    first, _ = process(store, [*text("Alpha "), reset()], retry_policy=policy(max_continuations=0))
    with pytest.raises(StreamInterruptedError):
        await drive.invoke(first, "q", config=run_config(run_id))
    second, inner = process(
        store,
        [*text("beta "), reset()],
        [*text("gamma."), finish()],
        retry_policy=policy(max_continuations=1),
    )
    message = await drive.invoke(second, "q", config=run_config(run_id))
    assert message.content == "Alpha beta gamma."
    assert len(inner.calls) == 2


async def test_resume_with_complete_tool_calls_finishes_without_a_request(drive: Drive) -> None:
    store = InMemoryStreamCheckpointStore()
    run_id = str(uuid.uuid4())
    store.put(
        StreamCheckpoint(
            run_id=run_id,
            model="scripted:scripted",
            partial_text="Looking it up. ",
            completed_tool_calls=(CompletedToolCall(id="a", name="lookup", args={"q": "x"}),),
            in_flight_tool_call=InFlightToolCall(
                id="b", name="transfer", index=1, partial_args='{"to": "b'
            ),
            message_id="lc_run--stable",
        )
    )
    model, inner = process(store)
    message = await drive.invoke(model, "q", config=run_config(uuid.UUID(run_id)))
    assert inner.calls == []
    assert message.content == "Looking it up. "
    assert [c["name"] for c in message.tool_calls] == ["lookup"]
    assert [c["name"] for c in message.invalid_tool_calls] == ["transfer"]
    assert message.id == "lc_run--stable"


async def test_checkpoint_made_for_another_model_is_ignored_with_a_warning(
    caplog: pytest.LogCaptureFixture, drive: Drive
) -> None:
    store = InMemoryStreamCheckpointStore()
    run_id = uuid.uuid4()
    store.put(StreamCheckpoint(run_id=str(run_id), model="other:gpt", partial_text="Stale "))
    model, inner = process(store, [*text("Fresh."), finish()])
    with caplog.at_level(logging.WARNING, logger="awaken_langchain"):
        message = await drive.invoke(model, "q", config=run_config(run_id))
    assert message.content == "Fresh."
    assert len(inner.calls[0].messages) == 1
    assert "other:gpt" in caplog.text


async def test_checkpoint_of_another_thread_is_ignored(drive: Drive) -> None:
    store = InMemoryStreamCheckpointStore()
    run_id = uuid.uuid4()
    store.put(
        StreamCheckpoint(
            run_id=str(run_id), model="scripted:scripted", thread_id="t-1", partial_text="Other "
        )
    )
    model, _ = process(store, [*text("Mine."), finish()])
    config = {"run_id": run_id, "configurable": {"thread_id": "t-2"}}
    assert (await drive.invoke(model, "q", config=config)).content == "Mine."


async def test_checkpoint_older_than_resume_max_age_is_ignored(drive: Drive) -> None:
    now = [1000.0]
    store = InMemoryStreamCheckpointStore(clock=lambda: now[0])
    run_id = uuid.uuid4()
    store.put(StreamCheckpoint(run_id=str(run_id), model="scripted:scripted", partial_text="Old "))
    now[0] += 3600
    model, _ = process(store, [*text("New."), finish()], resume_max_age=60)
    assert (await drive.invoke(model, "q", config=run_config(run_id))).content == "New."


async def test_langgraph_thread_and_task_give_the_key_when_no_run_id_is_passed(
    drive: Drive,
) -> None:
    store = InMemoryStreamCheckpointStore()
    config = {"configurable": {"thread_id": "thread-7", "checkpoint_ns": "model:task-1"}}
    model, _ = process(store, [*text("Cut "), reset()], retry_policy=policy(max_continuations=0))
    with pytest.raises(StreamInterruptedError):
        await drive.invoke(model, "q", config=config)
    (key,) = store.list_run_ids()
    assert key.startswith("thread-7:model:task-1:")
    saved = store.get(key)
    assert saved is not None
    assert saved.thread_id == "thread-7"


class _Events(BaseCallbackHandler):
    def __init__(self) -> None:
        self.names: list[str] = []

    def on_custom_event(self, name: str, data: Any, **kwargs: Any) -> None:
        self.names.append(name)


async def test_a_failing_store_never_fails_the_turn(tmp_path: Path, drive: Drive) -> None:
    store = FileStreamCheckpointStore(tmp_path / "store")
    (tmp_path / "store").rename(tmp_path / "moved")
    (tmp_path / "store").write_text("not a directory")
    model, _ = process(store, [*text("Still "), reset()], [*text("fine."), finish()])
    events = _Events()
    with pytest.warns(StreamCheckpointWarning, match="the turn goes on without it"):
        message = await drive.invoke(model, "q", config={"callbacks": [events]})
    assert message.content == "Still fine."
    assert "awaken_checkpoint_warning" in events.names


async def test_a_writer_fenced_out_stops_checkpointing_and_still_finishes(drive: Drive) -> None:
    store = InMemoryStreamCheckpointStore()
    run_id = uuid.uuid4()
    key = str(run_id)
    model, _ = process(store, [*text("a" * 30, size=1), finish()], checkpoint_every_chunks=4)
    stream = drive.iterate(model, "q", config=run_config(run_id))
    received = [await anext(stream) for _ in range(10)]
    new_epoch = store.claim(key)  # another process takes the run over
    store.put(
        StreamCheckpoint(run_id=key, partial_text="owned by the new process", epoch=new_epoch)
    )
    with pytest.warns(StreamCheckpointWarning, match="fenced out"):
        received += [c async for c in stream]
    assert "".join(str(c.content) for c in received) == "a" * 30
    saved = store.get(key)
    assert saved is not None
    assert saved.partial_text == "owned by the new process"


def _fenced_at_the_closing_write(store: StreamCheckpointStore, run_id: uuid.UUID) -> None:
    """Another process takes the run over after the last cadence write."""
    key = str(run_id)
    store.put(StreamCheckpoint(run_id=key, partial_text="the new owner's", epoch=store.claim(key)))


async def test_a_turn_fenced_at_its_closing_write_does_not_claim_a_kept_checkpoint(
    drive: Drive,
) -> None:
    store = InMemoryStreamCheckpointStore()
    run_id = uuid.uuid4()
    model, _ = process(
        store,
        [*text("Done."), finish()],
        keep_until_committed=True,
        checkpoint_every_chunks=1000,
        checkpoint_every_seconds=3600,
    )
    stream = drive.iterate(model, "q", config=run_config(run_id))
    received = [await anext(stream)]
    _fenced_at_the_closing_write(store, run_id)
    with pytest.warns(StreamCheckpointWarning, match="fenced out"):
        received += [c async for c in stream]
    awaken = received[-1].response_metadata["awaken"]
    assert awaken["checkpoint_complete"] is False  # release_committed must not delete the run
    saved = store.get(str(run_id))
    assert saved is not None
    assert (saved.partial_text, saved.complete) == ("the new owner's", False)


async def test_the_in_process_store_holds_a_turns_first_checkpoint_as_soon_as_it_is_due(
    drive: Drive,
) -> None:
    """The in-process store is written on the stream's own thread: a reader in the same
    process sees the turn's first checkpoint while the stream goes on.

    Only the chunk rule is in play: a shared time moment falling at the first
    chunk would write it then, and the in-process store would hold the write
    due at chunk 9 back for the writer's gathering time (a run is written on
    the stream's thread at most once per gathering time), so what a reader
    sees after 17 chunks would depend on the moment and the machine's speed."""
    store = InMemoryStreamCheckpointStore()
    answer = "".join(f"w{i:02d} " for i in range(40))
    model, _ = process(store, [*text(answer), finish()], checkpoint_every_seconds=1e9)
    run_id = uuid.uuid4()
    stream = drive.iterate(model, "q", config=run_config(run_id))
    seen = ""
    for _ in range(17):  # past the checkpoints due at chunks 8 and 16 (written at 8)
        seen += (await anext(stream)).text
    kept = store.get(str(run_id))
    assert kept is not None
    assert answer.startswith(kept.partial_text)
    assert len(kept.partial_text) >= 8 * 4  # at least the first cadence window's text
    assert seen.startswith(kept.partial_text)
    await stream.aclose()
