"""A store failure's warning event reaches every callback handler, sync or async, and
``astream_events``, on both drivers.

The store fails where a turn meets it: when the turn opens (claim), while it
streams (a checkpoint write) and when it closes (the last delete). Handlers are
LangChain's own ``AsyncCallbackHandler`` and ``BaseCallbackHandler``; the store is
the in-process store with one operation made to fail.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from langchain_core.callbacks import AsyncCallbackHandler, BaseCallbackHandler

from awaken_langchain import (
    InMemoryStreamCheckpointStore,
    RecoveringChatModel,
    RetryPolicy,
    StreamCheckpoint,
    StreamCheckpointError,
)
from awaken_langchain.errors import StreamCheckpointWarning
from awaken_langchain.testing import ScriptedChatModel, Stall, finish, text
from tests.conftest import Drive

WARNING = "awaken_checkpoint_warning"
ANSWER = "The store fails, and the answer still arrives whole."


async def _no_wait(_seconds: float) -> None:
    return None


class FailingStore(InMemoryStreamCheckpointStore):
    """The in-process store, with the operation ``failing`` raising a storage error."""

    def __init__(self, failing: str) -> None:
        super().__init__()
        self.failing = failing

    def _fail(self, operation: str) -> None:
        if operation == self.failing:
            raise StreamCheckpointError(f"{operation} failed: disk unavailable")

    def claim(self, run_id: str) -> int:
        self._fail("claim")
        return super().claim(run_id)

    def put(self, checkpoint: StreamCheckpoint) -> None:
        self._fail("put")
        super().put(checkpoint)

    def put_many(self, checkpoints: list[StreamCheckpoint]) -> list[StreamCheckpointError | None]:
        self._fail("put")
        return super().put_many(checkpoints)

    def delete(self, run_id: str, *, epoch: int | None = None) -> None:
        self._fail("delete")
        super().delete(run_id, epoch=epoch)


class AsyncNames(AsyncCallbackHandler):
    def __init__(self) -> None:
        self.names: list[str] = []

    async def on_custom_event(self, name: str, data: Any, **kwargs: Any) -> None:
        self.names.append(name)


class SyncNames(BaseCallbackHandler):
    def __init__(self) -> None:
        self.names: list[str] = []

    def on_custom_event(self, name: str, data: Any, **kwargs: Any) -> None:
        self.names.append(name)


def wrapped(failing: str) -> RecoveringChatModel:
    steps: list[Any] = []
    for chunk in text(ANSWER):  # paced, so a failed write is seen while the turn streams
        steps += [chunk, Stall(0.02)]
    return RecoveringChatModel(
        model=ScriptedChatModel(scripts=[[*steps, finish()]]),
        store=FailingStore(failing),
        checkpoint_every_chunks=1,
        retry_policy=RetryPolicy(sleep=lambda _s: None, async_sleep=_no_wait),
    )


FAILING = pytest.mark.parametrize("failing", ["claim", "put", "delete"])


@FAILING
@pytest.mark.filterwarnings("ignore::awaken_langchain.errors.StreamCheckpointWarning")
async def test_a_store_failure_warning_reaches_async_and_sync_callback_handlers(
    drive: Drive, failing: str
) -> None:
    async_names, sync_names = AsyncNames(), SyncNames()
    config = {"callbacks": [async_names, sync_names]}
    chunks = await drive.stream(wrapped(failing), "q", config=config)
    assert "".join(c.text for c in chunks) == ANSWER
    assert async_names.names.count(WARNING) == 1
    assert sync_names.names.count(WARNING) == 1


@FAILING
async def test_a_store_failure_warning_shows_in_astream_events(failing: str) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", StreamCheckpointWarning)
        events = [e async for e in wrapped(failing).astream_events("q", version="v2")]
    streamed = "".join(
        e["data"]["chunk"].text for e in events if e["event"] == "on_chat_model_stream"
    )
    assert streamed == ANSWER
    custom = [e for e in events if e["event"] == "on_custom_event"]
    warned = [e for e in custom if e["name"] == WARNING]
    assert len(warned) == 1
    assert f"{failing} failed" in warned[0]["data"]["message"]
    assert sum(issubclass(w.category, StreamCheckpointWarning) for w in caught) == 1
