"""`StreamCheckpointHandler`: checkpoint any chat model's streamed turn from callbacks.

Attach the handler to a call (``config={"callbacks": [handler]}``) or to a graph or
agent (the config is inherited by every chat model run inside). For each chat
model run it accumulates the streamed text and tool-call chunks with the same
`TurnAccumulator` the wrapper uses, writes the turn to the store under the run's
id at the wrapper's cadence, writes what had arrived when the run fails (also
from the partial response LangChain hands to ``on_llm_error``), and deletes the
checkpoint when the run ends. A replacement process can then finish the turn with
``RecoveringChatModel(model=..., store=store)`` invoked with the same run id.

The handler never raises into the caller: a store failure is logged under
``awaken_langchain`` and reported as a `StreamCheckpointWarning`; a run whose
writer has been fenced out by a newer owner stops being captured.

Only streamed runs have anything to capture: ``stream``/``astream``, ``invoke`` on a
model with ``streaming=True``, or a graph or agent consumed with
``stream_mode="messages"`` (``create_agent`` calls ``invoke``, which streams only
then). Runs of `RecoveringChatModel` itself are not captured: the wrapper
checkpoints its own turns when given a store.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from langchain_core.callbacks import AsyncCallbackHandler, BaseCallbackHandler
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, GenerationChunk, LLMResult

from awaken_langchain.accumulator import CheckpointCadence, TurnAccumulator, shared_phase
from awaken_langchain.checkpoint import StreamCheckpoint, StreamCheckpointStore, model_identifier
from awaken_langchain.errors import (
    StreamCheckpointError,
    StreamCheckpointFencedError,
)
from awaken_langchain.events import store_failure

__all__ = ["AsyncStreamCheckpointHandler", "StreamCheckpointHandler"]

_WRAPPER_PREFIX = "awaken-"


@dataclass(slots=True)
class _Run:
    """What one chat model run has streamed so far."""

    key: str
    thread_id: str | None
    model: str
    acc: TurnAccumulator
    cadence: CheckpointCadence
    lock: threading.Lock = field(default_factory=threading.Lock)
    epoch: int | None = None
    tokens: int = 0
    written: bool = False
    active: bool = True


class _Capture:
    """The handlers' shared state and decisions: per-run accumulation, no store I/O."""

    def __init__(self, every_chunks: int, every_seconds: float, clock: Callable[[], float]) -> None:
        if every_chunks < 1:
            raise ValueError(f"checkpoint_every_chunks must be at least 1, got {every_chunks!r}")
        if every_seconds <= 0:
            raise ValueError(f"checkpoint_every_seconds must be positive, got {every_seconds!r}")
        self.every_chunks = every_chunks
        self.every_seconds = every_seconds
        self.clock = clock
        self._runs: dict[UUID, _Run] = {}
        self._lock = threading.Lock()

    def start(
        self,
        run_id: UUID,
        metadata: dict[str, Any] | None,
        params: dict[str, Any] | None,
    ) -> None:
        metadata = metadata or {}
        llm_type = str((params or {}).get("_type") or "")
        if llm_type.startswith(_WRAPPER_PREFIX):
            return
        thread = metadata.get("thread_id")
        run = _Run(
            key=str(run_id),
            thread_id=str(thread) if thread is not None else None,
            model=model_identifier(llm_type, metadata.get("ls_model_name")),
            acc=TurnAccumulator(f"lc_run--{run_id}"),
            cadence=CheckpointCadence(
                every_chunks=self.every_chunks,
                every_seconds=self.every_seconds,
                clock=self.clock,
                phase=shared_phase(self.clock),
            ),
        )
        with self._lock:
            self._runs[run_id] = run

    def get(self, run_id: UUID) -> _Run | None:
        with self._lock:
            return self._runs.get(run_id)

    def pop(self, run_id: UUID) -> _Run | None:
        with self._lock:
            return self._runs.pop(run_id, None)

    @property
    def active_runs(self) -> int:
        with self._lock:
            return len(self._runs)

    @staticmethod
    def token(run: _Run, chunk: GenerationChunk | ChatGenerationChunk | None) -> bool:
        """Feed a streamed chunk; return whether a checkpoint write is due."""
        if not isinstance(chunk, ChatGenerationChunk) or _closing_marker(chunk.message):
            return False
        run.tokens += 1
        run.acc.feed(chunk)
        return run.active and run.cadence.observe()

    @staticmethod
    def failed(run: _Run, response: LLMResult | None) -> bool:
        """Take what arrived before a failure; return whether there is anything to write."""
        if run.tokens == 0 and response is not None and response.generations:
            first = response.generations[0][0] if response.generations[0] else None
            if isinstance(first, ChatGenerationChunk):
                run.acc.feed(first)
            elif isinstance(first, ChatGeneration):
                run.acc.feed(ChatGenerationChunk(message=_as_chunk(first.message)))
        has_output = bool(run.acc.text or run.acc.completed or run.acc.in_flight)
        return run.active and (has_output or run.written)

    @staticmethod
    def snapshot(run: _Run) -> StreamCheckpoint:
        run.cadence.written()
        run.written = True
        return run.acc.snapshot(
            run_id=run.key, thread_id=run.thread_id, model=run.model, epoch=run.epoch or 0
        )

    @staticmethod
    def store_failed(run: _Run, exc: StreamCheckpointError) -> str:
        if isinstance(exc, StreamCheckpointFencedError):
            run.active = False
            return f"fenced out of run {run.key!r}; stopped checkpointing it"
        return f"checkpoint store failed for run {run.key!r}"


def _closing_marker(message: BaseMessage) -> bool:
    """Whether ``message`` is the empty last chunk LangChain adds when a stream ends.

    ``stream()`` adds it whenever the model's generator returns, with or without
    a finish reason, so it is no terminal signal: a stream that ended without
    one was interrupted.
    """
    return (
        isinstance(message, AIMessageChunk)
        and message.chunk_position == "last"
        and not message.content
        and not message.response_metadata
        and not message.usage_metadata
        and not message.tool_call_chunks
    )


def _as_chunk(message: BaseMessage) -> AIMessageChunk:
    if isinstance(message, AIMessageChunk):
        return message
    if isinstance(message, AIMessage):
        return AIMessageChunk(
            content=message.content,
            response_metadata=dict(message.response_metadata),
            id=message.id,
        )
    return AIMessageChunk(content="")


class StreamCheckpointHandler(BaseCallbackHandler):
    """Checkpoints every chat model run it observes into a store (sync store calls).

    The handler runs inline (``run_inline = True``), so in async runs its events
    keep their order; there its store writes briefly block the event loop, at
    most once per ``checkpoint_every_chunks`` chunks. For async applications
    `AsyncStreamCheckpointHandler` awaits the store's async methods instead.

    Args:
        store: Where the in-flight turns are written, keyed by the run id.
        checkpoint_every_chunks: Write after at most this many chunks of output.
        checkpoint_every_seconds: Write when this many seconds of output are unsaved
            (with the default clock, at moments the process's runs share).
        clock: Monotonic time source for the cadence (injectable for tests).

    Example:
        ```python
        handler = StreamCheckpointHandler(DiskCacheStreamCheckpointStore("./checkpoints"))
        for chunk in ChatOpenAI(model="gpt-4o-mini").stream(
            "Tell me a story", config={"callbacks": [handler], "run_id": run_id}
        ):
            print(chunk.content, end="")
        ```
    """

    run_inline: bool = True
    raise_error: bool = False

    def __init__(
        self,
        store: StreamCheckpointStore,
        *,
        checkpoint_every_chunks: int = 8,
        checkpoint_every_seconds: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self._capture = _Capture(checkpoint_every_chunks, checkpoint_every_seconds, clock)

    @property
    def active_runs(self) -> int:
        """How many chat model runs are being captured now."""
        return self._capture.active_runs

    def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Begin capturing the run."""
        self._capture.start(run_id, metadata, kwargs.get("invocation_params"))

    def on_llm_new_token(
        self,
        token: str | list[str | dict[str, Any]],
        *,
        chunk: GenerationChunk | ChatGenerationChunk | None = None,
        run_id: UUID,
        **kwargs: Any,
    ) -> None:
        """Accumulate the chunk; write the turn when the cadence says so."""
        run = self._capture.get(run_id)
        if run is None:
            return
        with run.lock:
            if self._capture.token(run, chunk):
                self._write(run)

    def on_llm_error(
        self,
        error: BaseException,
        *,
        run_id: UUID,
        response: LLMResult | None = None,
        **kwargs: Any,
    ) -> None:
        """Write what had arrived, so the turn can be finished elsewhere."""
        run = self._capture.pop(run_id)
        if run is None:
            return
        with run.lock:
            if self._capture.failed(run, response):
                self._write(run)

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        """Delete the checkpoint of a complete turn; keep one that ended without a signal."""
        run = self._capture.pop(run_id)
        if run is None or not run.active:
            return
        with run.lock:
            if run.tokens and not run.acc.terminal:  # no finish or stop reason: interrupted
                if self._capture.failed(run, response):
                    self._write(run)
                return
            if not run.written:
                return
            try:
                self.store.delete(run.key, epoch=run.epoch)
            except StreamCheckpointError as exc:
                store_failure(run.key, self._capture.store_failed(run, exc), exc).log()

    def _write(self, run: _Run) -> None:
        try:
            if run.epoch is None:
                run.epoch = self.store.claim(run.key)
            self.store.put(self._capture.snapshot(run))
        except StreamCheckpointError as exc:
            store_failure(run.key, self._capture.store_failed(run, exc), exc).log()
        run.cadence.write_ended()


class AsyncStreamCheckpointHandler(AsyncCallbackHandler):
    """Async twin of `StreamCheckpointHandler`: awaits the store's async methods.

    For sync calls use `StreamCheckpointHandler`: LangChain runs an async
    handler's events in a separate event loop there, one per event.

    Args:
        store: Where the in-flight turns are written, keyed by the run id.
        checkpoint_every_chunks: Write after at most this many chunks of output.
        checkpoint_every_seconds: Write when this many seconds of output are unsaved
            (with the default clock, at moments the process's runs share).
        clock: Monotonic time source for the cadence (injectable for tests).
    """

    raise_error: bool = False

    def __init__(
        self,
        store: StreamCheckpointStore,
        *,
        checkpoint_every_chunks: int = 8,
        checkpoint_every_seconds: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self._capture = _Capture(checkpoint_every_chunks, checkpoint_every_seconds, clock)

    @property
    def active_runs(self) -> int:
        """How many chat model runs are being captured now."""
        return self._capture.active_runs

    async def on_chat_model_start(
        self,
        serialized: dict[str, Any],
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Begin capturing the run."""
        self._capture.start(run_id, metadata, kwargs.get("invocation_params"))

    async def on_llm_new_token(
        self,
        token: str | list[str | dict[str, Any]],
        *,
        chunk: GenerationChunk | ChatGenerationChunk | None = None,
        run_id: UUID,
        **kwargs: Any,
    ) -> None:
        """Accumulate the chunk; write the turn when the cadence says so."""
        run = self._capture.get(run_id)
        if run is not None and self._capture.token(run, chunk):
            await self._write(run)

    async def on_llm_error(
        self,
        error: BaseException,
        *,
        run_id: UUID,
        response: LLMResult | None = None,
        **kwargs: Any,
    ) -> None:
        """Write what had arrived, so the turn can be finished elsewhere."""
        run = self._capture.pop(run_id)
        if run is not None and self._capture.failed(run, response):
            await self._write(run)

    async def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        """Delete the checkpoint of a complete turn; keep one that ended without a signal."""
        run = self._capture.pop(run_id)
        if run is None or not run.active:
            return
        if run.tokens and not run.acc.terminal:  # no finish or stop reason: interrupted
            if self._capture.failed(run, response):
                await self._write(run)
            return
        if not run.written:
            return
        try:
            await self.store.adelete(run.key, epoch=run.epoch)
        except StreamCheckpointError as exc:
            store_failure(run.key, self._capture.store_failed(run, exc), exc).log()

    async def _write(self, run: _Run) -> None:
        try:
            if run.epoch is None:
                run.epoch = await self.store.aclaim(run.key)
            await self.store.aput(self._capture.snapshot(run))
        except StreamCheckpointError as exc:
            store_failure(run.key, self._capture.store_failed(run, exc), exc).log()
        run.cadence.write_ended()
