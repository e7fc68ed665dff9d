"""`RecoveringChatModel`: a drop-in chat model that makes a streamed turn recoverable.

The wrapper calls the inner model's ``_stream``/``_astream`` directly (never
``inner.stream()``, which would report every token twice) and owns the stream
loop: it retries before any output, continues after partial output, releases
tool calls only whole, and checkpoints the in-flight turn when a store is set.

The turn logic lives in `_Turn` (no I/O); ``_stream`` and ``_astream`` are near
twins that only move chunks, call the store, emit events, and sleep or await.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import queue
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from langchain_core.callbacks import (
    AsyncCallbackManager,
    AsyncCallbackManagerForLLMRun,
    CallbackManager,
    CallbackManagerForLLMRun,
)
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.messages.tool import tool_call_chunk
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import (
    Runnable,
    RunnableBinding,
    RunnableConfig,
    RunnableParallel,
    RunnableSequence,
    ensure_config,
)
from langchain_core.tools import BaseTool
from pydantic import ConfigDict, Field, model_validator
from typing_extensions import override

from awaken_langchain.accumulator import INVALID_ARGS_MARKER, CheckpointCadence, TurnAccumulator
from awaken_langchain.checkpoint import (
    StreamCheckpoint,
    StreamCheckpointStore,
    model_identifier,
)
from awaken_langchain.errors import (
    StreamCheckpointError,
    StreamCheckpointFencedError,
    StreamEndedEarlyError,
    StreamInterruptedError,
    StreamStalledError,
)
from awaken_langchain.history import last_kept_checkpoint_key
from awaken_langchain.recovery import (
    DEFAULT_CONTINUATION_PROMPT,
    Plan,
    answer_invalid_tool_calls,
    choose_plan,
    continuation_messages,
    estimate_tokens,
)
from awaken_langchain.retry import RetryPhase, RetryPolicy

logger = logging.getLogger("awaken_langchain")

_LANGGRAPH_CHECKPOINTER = "__pregel_checkpointer"
"""Where LangGraph puts a graph's checkpointer in a task's ``configurable``."""
_REASONING_MARKERS = ("o1", "o3", "o4", "reasoning", "thinking", "r1")
_REASONING_KWARGS = ("reasoning_effort", "reasoning", "thinking")


@dataclass(frozen=True, slots=True)
class _CallContext:
    """What the public entry point knew about the call."""

    run_id: uuid.UUID
    key: str
    thread_id: str | None
    config: RunnableConfig
    in_graph_memory: bool = False
    """Whether the call runs in a LangGraph task whose graph has a checkpointer."""


_CALL: contextvars.ContextVar[_CallContext | None] = contextvars.ContextVar(
    "awaken_langchain_call", default=None
)


def _take_call_context(config: RunnableConfig | None = None) -> _CallContext:
    """Read (and clear, for nested wrappers) the context set by the entry point."""
    ctx = _CALL.get()
    if ctx is not None:
        _CALL.set(None)
        return ctx
    run_id = uuid.uuid4()
    return _CallContext(run_id, str(run_id), None, config or {})


@dataclass(slots=True)
class _Decision:
    action: Literal["retry", "finish", "raise"]
    delay: float = 0.0
    plan: Plan | None = None
    error: BaseException | None = None
    event: dict[str, Any] = field(default_factory=dict)

    @property
    def event_name(self) -> str:
        """The recovery event that reports this decision."""
        if self.action == "finish":
            return "awaken_finish_with_tool_calls"
        return "awaken_retry" if self.plan is Plan.RESTART else "awaken_continuation"


class _Turn:
    """The state and decisions of one recovering turn (no I/O)."""

    def __init__(
        self,
        wrapper: RecoveringChatModel,
        ctx: _CallContext,
        messages: list[BaseMessage],
        stop: list[str] | None,
        kwargs: dict[str, Any],
    ) -> None:
        self.wrapper = wrapper
        self.policy = wrapper.retry_policy
        self.ctx = ctx
        self.messages = answer_invalid_tool_calls(messages, interrupted_marker=INVALID_ARGS_MARKER)
        self.stop = stop
        self.kwargs = kwargs
        self.acc = TurnAccumulator(f"lc_run--{ctx.run_id}")
        self.model_id = wrapper._model_id()
        self.started = self.policy.clock()
        self.attempts = 0
        self.retries = 0
        self.continuations = 0
        self.waited = 0.0
        self.plans: list[str] = []
        self.interruptions: list[dict[str, Any]] = []
        self.resumed = False
        self.continuing = False
        self.done = False
        self.epoch: int | None = None
        self.checkpointing = wrapper.store is not None
        self.checkpoint_writes = 0
        self.cadence = CheckpointCadence(
            every_chunks=wrapper.checkpoint_every_chunks,
            every_seconds=wrapper.checkpoint_every_seconds,
            clock=self.policy.clock,
        )
        keep = wrapper.keep_until_committed
        self.keep = ctx.in_graph_memory if keep is None else keep
        self.committed_key = last_kept_checkpoint_key(messages)
        self.closing: StreamCheckpoint | None = None
        self.event: dict[str, Any] = {}

    # -- resume ---------------------------------------------------------------------

    def resume(self, checkpoint: StreamCheckpoint | None, now: float) -> list[ChatGenerationChunk]:
        """Adopt a stored checkpoint, if it is usable; return the chunks to replay."""
        if checkpoint is None:
            return []
        reason = self._unusable(checkpoint, now)
        if reason is not None:
            self.wrapper._warn(self, "awaken_checkpoint_ignored", reason)
            return []
        if checkpoint.complete and any(m.id == checkpoint.message_id for m in self.messages):
            logger.info("checkpoint %r is a turn memory already holds; ignoring it", self.ctx.key)
            return []
        self.acc = TurnAccumulator(checkpoint.message_id or self.acc.message_id, checkpoint)
        self.resumed = True
        out: list[AIMessageChunk] = []
        if checkpoint.partial_text:
            out.append(AIMessageChunk(content=checkpoint.partial_text, id=self.acc.message_id))
        for call in checkpoint.completed_tool_calls:
            out.append(
                AIMessageChunk(
                    content="",
                    id=self.acc.message_id,
                    tool_call_chunks=[
                        tool_call_chunk(
                            name=call.name,
                            args=_dumps(call.args),
                            id=call.id or None,
                            index=call.index,
                        )
                    ],
                )
            )
        if checkpoint.complete:  # finished before memory committed it: no request needed
            self.done = True
            resumed_as = "complete"
        else:
            plan = choose_plan(
                text=checkpoint.partial_text,
                completed_tool_calls=len(checkpoint.completed_tool_calls),
                in_flight_tool_call=checkpoint.in_flight_tool_call is not None,
            )
            self.plans.append(plan.value)
            if plan is Plan.FINISH_WITH_TOOL_CALLS:
                self.done = True
            else:
                self.continuing = plan in (Plan.CONTINUE_TEXT, Plan.DROP_TOOL_AND_CONTINUE)
            resumed_as = plan.value
        self.event = {
            "key": self.ctx.key,
            "plan": resumed_as,
            "chars": len(checkpoint.partial_text),
            "tool_calls": len(checkpoint.completed_tool_calls),
        }
        return [ChatGenerationChunk(message=chunk) for chunk in out]

    def _unusable(self, checkpoint: StreamCheckpoint, now: float) -> str | None:
        if checkpoint.model and checkpoint.model != self.model_id:
            return (
                f"checkpoint {self.ctx.key!r} was made for model {checkpoint.model!r}, "
                f"not {self.model_id!r}; starting the turn afresh"
            )
        if (
            checkpoint.thread_id
            and self.ctx.thread_id
            and checkpoint.thread_id != self.ctx.thread_id
        ):
            return (
                f"checkpoint {self.ctx.key!r} belongs to thread {checkpoint.thread_id!r}, "
                f"not {self.ctx.thread_id!r}; starting the turn afresh"
            )
        max_age = self.wrapper.resume_max_age
        if max_age is not None and now - checkpoint.updated_at > max_age:
            return (
                f"checkpoint {self.ctx.key!r} is {now - checkpoint.updated_at:.0f} s old, "
                f"older than resume_max_age={max_age:g} s; starting the turn afresh"
            )
        return None

    # -- attempts -------------------------------------------------------------------------

    def request(self) -> list[BaseMessage]:
        """Begin an attempt and return the messages to send."""
        self.attempts += 1
        self.acc.begin_attempt(continuing=self.continuing)
        if self.continuing:
            return continuation_messages(
                self.messages, self.acc.text, self.wrapper.continuation_prompt
            )
        return self.messages

    def on_chunk(self, generation: ChatGenerationChunk) -> tuple[list[AIMessageChunk], bool]:
        """Feed one inner chunk; return chunks to yield and whether to checkpoint now."""
        out = self.acc.feed(generation)
        due = self.cadence.observe()
        return out, due and self.checkpointing

    def check_complete(self) -> None:
        """Raise when the attempt ended without a terminal signal."""
        if not self.acc.terminal:
            raise StreamEndedEarlyError(chunks_received=self.acc.chunks_in_attempt)

    def on_failure(self, exc: Exception) -> _Decision:
        """Decide what to do about an interruption."""
        text = self.acc.text
        in_flight = self.acc.in_flight is not None
        plan = choose_plan(
            text=text, completed_tool_calls=len(self.acc.completed), in_flight_tool_call=in_flight
        )
        phase = RetryPhase.BEFORE_OUTPUT if plan is Plan.RESTART else RetryPhase.AFTER_OUTPUT
        count = self.retries + 1 if phase is RetryPhase.BEFORE_OUTPUT else self.continuations + 1
        if plan is Plan.FINISH_WITH_TOOL_CALLS:
            info = self.policy.classify(exc)
            if not info.retryable:
                return _Decision("raise", error=exc)
            self.plans.append(plan.value)
            cut = self.acc.cut_off_in_flight()
            self.interruptions.append({"kind": info.kind.value, "plan": plan.value})
            return _Decision(
                "finish",
                plan=plan,
                event={
                    "plan": plan.value,
                    "cause": info.kind.value,
                    "error": _describe(exc),
                    "cut_off_tool_call": cut.name if cut else None,
                },
            )
        decision = self.policy.should_retry(
            exc, attempt=count, elapsed=self.policy.clock() - self.started, phase=phase
        )
        info = decision.error
        if not info.retryable:
            return _Decision("raise", error=exc)
        self.interruptions.append({"kind": info.kind.value, "plan": plan.value})
        if not decision.retry:
            partial = (
                self.acc.message({**self.metadata(), "interrupted": True})
                if (text or self.acc.completed)
                else None
            )
            return _Decision(
                "raise",
                error=StreamInterruptedError(
                    f"the streamed turn could not be recovered: {decision.reason}; "
                    f"last failure: {_describe(exc)}",
                    partial=partial,
                    cause=exc,
                    attempts=self.attempts,
                ),
            )
        self.plans.append(plan.value)
        if phase is RetryPhase.BEFORE_OUTPUT:
            self.retries += 1
        else:
            self.continuations += 1
        self.continuing = plan is not Plan.RESTART
        self.waited += decision.delay
        return _Decision(
            "retry",
            delay=decision.delay,
            plan=plan,
            event={
                "plan": plan.value,
                "cause": info.kind.value,
                "status_code": info.status_code,
                "retry_after": info.retry_after,
                "delay": decision.delay,
                "attempt": self.attempts,
                "error": _describe(exc),
                "chars_so_far": len(text),
            },
        )

    # -- checkpoints ----------------------------------------------------------------------

    def snapshot(self) -> StreamCheckpoint | None:
        """The checkpoint to write now, or ``None`` when nothing changed."""
        if not self.checkpointing or not self.cadence.dirty:
            return None
        self.cadence.written()
        return self._record()

    def _closing_snapshot(self) -> StreamCheckpoint | None:
        """The complete checkpoint to keep until memory commits the turn, if kept."""
        if not self.checkpointing or not self.keep:
            return None
        return self._record(complete=True)

    def _record(self, *, complete: bool = False) -> StreamCheckpoint:
        self.checkpoint_writes += 1
        return self.acc.snapshot(
            run_id=self.ctx.key,
            thread_id=self.ctx.thread_id,
            model=self.model_id,
            retry_count=self.retries + self.continuations,
            epoch=self.epoch or 0,
            complete=complete,
        )

    def saved(self) -> None:
        """A checkpoint write ended (see `CheckpointCadence.write_ended`)."""
        self.cadence.write_ended()

    def store_failed(self, exc: StreamCheckpointError) -> str:
        """Record a store failure; a fenced writer stops checkpointing."""
        if isinstance(exc, StreamCheckpointFencedError):
            self.checkpointing = False
            return f"fenced out of run {self.ctx.key!r}; stopped checkpointing this turn: {exc}"
        return f"checkpoint store failed; the turn goes on without it: {exc}"

    # -- the end ------------------------------------------------------------------------------

    def metadata(self) -> dict[str, Any]:
        """What recovery happened, for ``response_metadata["awaken"]``."""
        regenerated = self.acc.discarded_chars + self.acc.seam_removed_chars
        return {
            "attempts": self.attempts,
            "plans": list(self.plans),
            "retries": self.retries,
            "continuations": self.continuations,
            "resumed": self.resumed,
            "interruptions": list(self.interruptions),
            "seconds_waited": round(self.waited, 6),
            "regenerated_output_tokens": estimate_tokens(regenerated),
            "checkpoint_key": self.ctx.key if self.wrapper.store is not None else None,
            "checkpoint_writes": self.checkpoint_writes,
            "checkpoint_complete": self.checkpointing and self.keep,
        }

    def close(self) -> list[AIMessageChunk]:
        """End the turn: release held text and build the complete checkpoint to keep.

        Returns the held text chunks; `finish` builds the closing chunks once the
        complete checkpoint was written (or refused), so that the final chunk's
        ``checkpoint_complete`` tells whether this process really kept one.
        """
        self.done = True
        held = self.acc.end_of_text()
        self.closing = self._closing_snapshot()
        return held

    def finish(self, held: list[AIMessageChunk]) -> list[ChatGenerationChunk]:
        """The chunks that close the turn: held text, then the final chunk."""
        out = [*held, self.acc.final_chunk(self.metadata())]
        return [ChatGenerationChunk(message=chunk) for chunk in out]


def _dumps(args: dict[str, Any]) -> str:
    import json

    return json.dumps(args, ensure_ascii=False)


def _release_failed(exc: StreamCheckpointError) -> str:
    return f"could not delete the checkpoint of a turn memory has committed: {exc}"


def _describe(exc: BaseException) -> str:
    text = str(exc)
    if len(text) > 300:
        text = text[:297] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _Pump:
    """Reads a blocking iterator in a worker thread so waits can time out."""

    _ITEM, _END, _ERROR = 0, 1, 2

    def __init__(self, source: Iterator[ChatGenerationChunk], timeout: float) -> None:
        self._source = source
        self._timeout = timeout
        self._queue: queue.SimpleQueue[tuple[int, Any]] = queue.SimpleQueue()
        self._stop = threading.Event()
        context = contextvars.copy_context()
        self._thread = threading.Thread(target=context.run, args=(self._run,), daemon=True)
        self._thread.start()

    def _run(self) -> None:
        put = self._queue.put
        try:
            for item in self._source:
                put((self._ITEM, item))
                if self._stop.is_set():
                    break
            put((self._END, None))
        except BaseException as exc:
            put((self._ERROR, exc))
        finally:
            close = getattr(self._source, "close", None)
            if close is not None:
                close()

    def __iter__(self) -> Iterator[ChatGenerationChunk]:
        received = 0
        get = self._queue.get
        try:
            while True:
                try:
                    kind, item = get(timeout=self._timeout)
                except queue.Empty:
                    raise StreamStalledError(self._timeout, received) from None
                if kind == self._ITEM:
                    received += 1
                    yield item
                elif kind == self._END:
                    return
                else:
                    raise item
        finally:
            self._stop.set()


class _IdleWatch:
    """One timer for a whole stream, cancelling the task whose wait for a chunk ran too long.

    A timer per wait (``asyncio.timeout`` around each read) costs about as much
    as the chunk itself. Here each wait only records when it began; the single
    timer, when it fires, cancels the waiting task if the current wait has
    lasted ``timeout`` seconds, and otherwise re-arms itself for that wait's
    deadline. Time the caller spends between reads never counts.
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.expired = False
        self._loop = asyncio.get_running_loop()
        self._task: asyncio.Task[Any] | None = None
        self._since: float | None = None
        self._handle: asyncio.TimerHandle | None = None

    def begin(self) -> None:
        """A wait for the next chunk starts now."""
        self._task = asyncio.current_task()
        self._since = now = self._loop.time()
        if self._handle is None:
            self._handle = self._loop.call_at(now + self.timeout, self._check)

    def end(self) -> None:
        """The wait is over (a chunk, the end, or an error arrived)."""
        self._since = None

    def stalled(self) -> bool:
        """After a cancellation: whether it was this watch's, and the only one pending."""
        return self.expired and self._task is not None and self._task.uncancel() == 0

    def close(self) -> None:
        """Stop the timer."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _check(self) -> None:
        self._handle = None
        if self._since is None or self._task is None:
            return  # not waiting: the next wait arms the timer again
        deadline = self._since + self.timeout
        if self._loop.time() >= deadline:
            self.expired = True
            self._task.cancel()
        else:
            self._handle = self._loop.call_at(deadline, self._check)


async def _with_idle_timeout(
    source: AsyncIterator[ChatGenerationChunk], idle_timeout: float | None
) -> AsyncIterator[ChatGenerationChunk]:
    """Yield from ``source``, raising `StreamStalledError` after ``idle_timeout`` idle seconds."""
    iterator = source.__aiter__()
    received = 0
    watch = _IdleWatch(idle_timeout) if idle_timeout is not None else None
    try:
        if watch is None:
            async for item in iterator:
                yield item
            return
        while True:
            watch.begin()
            try:
                item = await anext(iterator)
            except StopAsyncIteration:
                return
            except asyncio.CancelledError:
                if watch.stalled():
                    raise StreamStalledError(watch.timeout, received) from None
                raise
            finally:
                watch.end()
            received += 1
            yield item
    finally:
        if watch is not None:
            watch.close()
        close = getattr(iterator, "aclose", None)
        if close is not None:
            await close()


def _generation(chunk: AIMessageChunk, received: ChatGenerationChunk) -> ChatGenerationChunk:
    """Wrap a chunk to yield; the received generation is reused when it carries it."""
    if chunk is received.message:
        return received
    return ChatGenerationChunk(message=chunk)


def _whole_message_chunk(message: BaseMessage) -> ChatGenerationChunk:
    """Turn a non-streamed inner answer into one terminal chunk."""
    ai = cast(AIMessage, message)
    calls = [
        tool_call_chunk(name=c["name"], args=_dumps(c["args"]), id=c.get("id"), index=i)
        for i, c in enumerate(getattr(ai, "tool_calls", []) or [])
    ]
    return ChatGenerationChunk(
        message=AIMessageChunk(
            content=ai.content,
            additional_kwargs={
                k: v for k, v in ai.additional_kwargs.items() if k not in ("tool_calls",)
            },
            tool_call_chunks=calls,
            usage_metadata=getattr(ai, "usage_metadata", None),
            response_metadata=dict(ai.response_metadata),
            chunk_position="last",
        )
    )


class RecoveringChatModel(BaseChatModel):
    """Wraps any chat model and makes its streamed turn recoverable.

    - Retryable failures before any output are retried; the caller never sees
      anything of a failed attempt.
    - A retryable interruption after output is continued from the text so far
      (original messages + assistant prefix + a user continuation prompt); text
      the provider repeats at the seam is removed before it is yielded.
    - Tool calls are yielded only whole; a call cut off mid-arguments is never
      released as a valid call.
    - With a ``store``, the in-flight turn is checkpointed so a replacement
      process resumes it under the same key.

    Example:
        ```python
        from langchain_openai import ChatOpenAI
        from awaken_langchain import RecoveringChatModel

        model = RecoveringChatModel(model=ChatOpenAI(model="gpt-4o-mini", max_retries=0))
        for chunk in model.stream("Write a haiku about resilience"):
            print(chunk.content, end="")
        ```
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    model: BaseChatModel
    """The chat model whose turns are recovered."""
    retry_policy: RetryPolicy = Field(default_factory=RetryPolicy)
    """Attempts before output, continuations after output, backoff and deadline."""
    store: StreamCheckpointStore | None = Field(default=None, exclude=True)
    """Where the in-flight turn is checkpointed; ``None`` recovers in-process only."""
    checkpoint_every_chunks: int = Field(default=8, ge=1)
    """Write a checkpoint after at most this many chunks of output."""
    checkpoint_every_seconds: float = Field(default=0.25, gt=0)
    """Write a checkpoint when this many seconds of output are unsaved."""
    stream_idle_timeout: float | None = Field(default=60.0, gt=0)
    """Seconds without a chunk after which the stream counts as interrupted."""
    reasoning_stream_idle_timeout: float | None = Field(default=180.0, gt=0)
    """The idle timeout for reasoning models, which pause longer while thinking."""
    continuation_prompt: str = Field(default=DEFAULT_CONTINUATION_PROMPT, min_length=1)
    """The user message that asks the model to continue an interrupted answer."""
    resume_max_age: float | None = Field(default=None, gt=0)
    """Ignore (with a warning) checkpoints older than this many seconds."""
    checkpoint_key: Callable[[RunnableConfig], str | None] | None = Field(
        default=None, exclude=True
    )
    """Derives the checkpoint key from the call's config; ``None`` uses the default."""
    keep_until_committed: bool | None = None
    """Keep a finished turn's checkpoint, marked complete, until memory commits it.

    A process that finds a complete checkpoint returns the answer without asking
    the provider, so a crash between the end of the turn and its commit costs
    nothing. ``None`` keeps it inside a LangGraph graph with a checkpointer (the
    thread's next model call, seeing the committed message, deletes it) and
    deletes it at turn end elsewhere; ``True`` always keeps it (commit with
    `awaken_langchain.history.commit_turn`, which deletes it); ``False`` deletes
    it when the turn ends."""

    @model_validator(mode="before")
    @classmethod
    def _forward_inner_settings(cls, data: Any) -> Any:
        """Forward settings meant for the inner model (``temperature=...``) to it."""
        if not isinstance(data, dict) or "model" not in data:
            return data
        own = set(cls.model_fields)
        own |= {f.alias for f in cls.model_fields.values() if f.alias}
        extra = {k: v for k, v in data.items() if k not in own}
        if not extra:
            return data
        inner = data["model"]
        if not isinstance(inner, BaseChatModel):
            return data
        return {k: v for k, v in data.items() if k in own} | {"model": _with_settings(inner, extra)}

    # -- LangChain identity --------------------------------------------------------------

    @property
    def _llm_type(self) -> str:
        return f"awaken-{self.model._llm_type}"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {
            "inner": {"llm_type": self.model._llm_type, **self.model._identifying_params},
            "max_attempts": self.retry_policy.max_attempts,
            "max_continuations": self.retry_policy.max_continuations,
        }

    @override
    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> Any:
        return self.model._get_ls_params(stop=stop, **kwargs)

    def _model_id(self) -> str:
        params = self.model._get_ls_params()
        return model_identifier(self.model._llm_type, params.get("ls_model_name"))

    # -- public entry points: capture the run id and config ------------------------------

    def _context(self, config: RunnableConfig | None) -> tuple[RunnableConfig, _CallContext]:
        config = ensure_config(config)
        explicit = config.get("run_id")
        run_id = explicit if isinstance(explicit, uuid.UUID) else uuid.uuid4()
        config["run_id"] = run_id
        configurable = config.get("configurable") or {}
        metadata = config.get("metadata") or {}
        thread = configurable.get("thread_id") or metadata.get("thread_id")
        thread_id = str(thread) if thread is not None else None
        key: str | None = None
        if self.checkpoint_key is not None:
            key = self.checkpoint_key(config)
        if key is None and explicit is not None:
            key = str(explicit)
        if key is None and thread_id is not None:
            namespace = configurable.get("checkpoint_ns") or metadata.get("langgraph_checkpoint_ns")
            if namespace:
                key = f"{thread_id}:{namespace}"
        in_graph_memory = (
            thread_id is not None
            and bool(configurable.get("checkpoint_ns") or metadata.get("langgraph_checkpoint_ns"))
            and configurable.get(_LANGGRAPH_CHECKPOINTER) is not None
        )
        return config, _CallContext(run_id, key or str(run_id), thread_id, config, in_graph_memory)

    @override
    def invoke(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> AIMessage:
        config, ctx = self._context(config)
        token = _CALL.set(ctx)
        try:
            return super().invoke(input, config, stop=stop, **kwargs)
        finally:
            _CALL.reset(token)

    @override
    async def ainvoke(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> AIMessage:
        config, ctx = self._context(config)
        token = _CALL.set(ctx)
        try:
            return await super().ainvoke(input, config, stop=stop, **kwargs)
        finally:
            _CALL.reset(token)

    @override
    def stream(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> Iterator[AIMessageChunk]:
        config, ctx = self._context(config)
        token = _CALL.set(ctx)
        try:
            chunks = super().stream(input, config, stop=stop, **kwargs)
            first = next(chunks, None)
        finally:
            _CALL.reset(token)
        if first is None:
            return
        yield first
        yield from chunks

    @override
    async def astream(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[AIMessageChunk]:
        config, ctx = self._context(config)
        token = _CALL.set(ctx)
        try:
            chunks = super().astream(input, config, stop=stop, **kwargs)
            first = await anext(chunks, None)
        finally:
            _CALL.reset(token)
        if first is None:
            return
        yield first
        async for chunk in chunks:
            yield chunk

    # -- tools and structured output: delegate to the inner model -------------------------

    @override
    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools the way the inner model does, keeping this wrapper in the chain."""
        if tool_choice is not None:
            kwargs["tool_choice"] = tool_choice
        bound = self.model.bind_tools(tools, **kwargs)
        return cast(Runnable[LanguageModelInput, AIMessage], self._rebind(bound))

    @override
    def with_structured_output(
        self, schema: Any, *, include_raw: bool = False, **kwargs: Any
    ) -> Runnable[LanguageModelInput, Any]:
        """Structured output as the inner model builds it, with this wrapper in the chain."""
        runnable = self.model.with_structured_output(schema, include_raw=include_raw, **kwargs)
        return cast(Runnable[LanguageModelInput, Any], self._rebind(runnable))

    def _rebind(self, runnable: Any) -> Any:
        replaced = _replace_model(runnable, self.model, self)
        if replaced is runnable and runnable is not self.model:
            raise NotImplementedError(
                f"{type(self.model).__name__} returned a runnable in which the model could "
                "not be replaced by RecoveringChatModel; bind tools on the wrapper's "
                "inner model class's standard binding instead"
            )
        return replaced

    # -- the turn: sync --------------------------------------------------------------------------

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        turn = _Turn(self, _take_call_context(), messages, stop, kwargs)
        return self._run(turn)

    def _run(self, turn: _Turn) -> Iterator[ChatGenerationChunk]:
        store = self.store
        if store is not None:
            checkpoint = None
            if turn.committed_key is not None:  # memory holds the previous turn now
                try:
                    store.delete(turn.committed_key)
                except StreamCheckpointError as exc:
                    self._warn(turn, "awaken_checkpoint_warning", _release_failed(exc))
            try:
                turn.epoch = store.claim(turn.ctx.key)
                checkpoint = store.get(turn.ctx.key)
            except StreamCheckpointError as exc:
                turn.checkpointing = False
                self._warn(turn, "awaken_checkpoint_warning", turn.store_failed(exc))
            replay = turn.resume(checkpoint, store.clock())
            if turn.resumed:
                self._event(turn, "awaken_resume", turn.event)
            yield from replay
        while not turn.done:
            request = turn.request()
            try:
                for generation in self._inner_chunks(turn, request):
                    out, due = turn.on_chunk(generation)
                    for chunk in out:
                        yield _generation(chunk, generation)
                    if due:
                        self._save(turn)
                turn.check_complete()
            except Exception as exc:
                for held in turn.acc.end_of_text():
                    yield ChatGenerationChunk(message=held)
                if turn.acc.terminal:  # the answer was complete; only the epilogue broke
                    logger.info("stream failed after its terminal signal: %s", _describe(exc))
                    break
                decision = turn.on_failure(exc)
                self._save(turn)
                if decision.action == "raise":
                    assert decision.error is not None
                    if decision.error is exc:
                        raise
                    raise decision.error from exc
                self._event(turn, decision.event_name, decision.event)
                if decision.action == "retry":
                    self.retry_policy.sleep(decision.delay)
                    continue
                break
            break
        tail = turn.close()
        if store is not None and turn.checkpointing:
            try:
                if turn.closing is not None:  # kept until memory commits the turn
                    store.put(turn.closing)
                else:
                    store.delete(turn.ctx.key, epoch=turn.epoch)
            except StreamCheckpointError as exc:
                self._warn(turn, "awaken_checkpoint_warning", turn.store_failed(exc))
        yield from turn.finish(tail)

    def _inner_chunks(
        self, turn: _Turn, messages: list[BaseMessage]
    ) -> Iterator[ChatGenerationChunk]:
        inner = self.model
        if inner.rate_limiter is not None:
            inner.rate_limiter.acquire(blocking=True)
        if type(inner)._stream is BaseChatModel._stream:
            result = inner._generate(messages, stop=turn.stop, **turn.kwargs)
            return iter([_whole_message_chunk(result.generations[0].message)])
        source = inner._stream(messages, stop=turn.stop, **turn.kwargs)
        timeout = self._idle_timeout(turn.kwargs)
        return iter(_Pump(source, timeout)) if timeout is not None else source

    def _save(self, turn: _Turn) -> None:
        checkpoint = turn.snapshot()
        if checkpoint is None or self.store is None:
            return
        try:
            self.store.put(checkpoint)
        except StreamCheckpointError as exc:
            self._warn(turn, "awaken_checkpoint_warning", turn.store_failed(exc))
        turn.saved()

    def _event(self, turn: _Turn, name: str, data: dict[str, Any]) -> None:
        logger.info("%s %s", name, data)
        self._dispatch(turn, name, data)

    def _warn(self, turn: _Turn, name: str, message: str) -> None:
        logger.warning("%s", message)
        self._dispatch(turn, name, {"key": turn.ctx.key, "message": message})

    def _dispatch(self, turn: _Turn, name: str, data: dict[str, Any]) -> None:
        try:
            manager = CallbackManager.configure(*self._callback_settings(turn))
            manager.on_custom_event(name, data, run_id=turn.ctx.run_id)
        except Exception:  # a broken handler must not break the turn
            logger.exception("callback failed while reporting %s", name)

    def _callback_settings(self, turn: _Turn) -> tuple[Any, ...]:
        """Arguments of ``CallbackManager.configure`` for the call's recovery events."""
        config = turn.ctx.config
        return (
            config.get("callbacks"),
            self.callbacks,
            self.verbose,
            config.get("tags"),
            self.tags,
            config.get("metadata"),
            self.metadata,
        )

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        turn = _Turn(self, _take_call_context(), messages, stop, kwargs)
        for _ in self._run(turn):
            pass
        return ChatResult(generations=[ChatGeneration(message=turn.acc.message(turn.metadata()))])

    # -- the turn: async (twin of the sync shell) -------------------------------------------------

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        turn = _Turn(self, _take_call_context(), messages, stop, kwargs)
        async for chunk in self._arun(turn):
            yield chunk

    async def _arun(self, turn: _Turn) -> AsyncIterator[ChatGenerationChunk]:
        store = self.store
        if store is not None:
            checkpoint = None
            if turn.committed_key is not None:  # memory holds the previous turn now
                try:
                    await store.adelete(turn.committed_key)
                except StreamCheckpointError as exc:
                    await self._awarn(turn, "awaken_checkpoint_warning", _release_failed(exc))
            try:
                turn.epoch = await store.aclaim(turn.ctx.key)
                checkpoint = await store.aget(turn.ctx.key)
            except StreamCheckpointError as exc:
                turn.checkpointing = False
                await self._awarn(turn, "awaken_checkpoint_warning", turn.store_failed(exc))
            replay = turn.resume(checkpoint, store.clock())
            if turn.resumed:
                await self._aevent(turn, "awaken_resume", turn.event)
            for replayed in replay:
                yield replayed
        while not turn.done:
            request = turn.request()
            try:
                async for generation in self._ainner_chunks(turn, request):
                    out, due = turn.on_chunk(generation)
                    for chunk in out:
                        yield _generation(chunk, generation)
                    if due:
                        await self._asave(turn)
                turn.check_complete()
            except Exception as exc:
                for held in turn.acc.end_of_text():
                    yield ChatGenerationChunk(message=held)
                if turn.acc.terminal:  # the answer was complete; only the epilogue broke
                    logger.info("stream failed after its terminal signal: %s", _describe(exc))
                    break
                decision = turn.on_failure(exc)
                await self._asave(turn)
                if decision.action == "raise":
                    assert decision.error is not None
                    if decision.error is exc:
                        raise
                    raise decision.error from exc
                await self._aevent(turn, decision.event_name, decision.event)
                if decision.action == "retry":
                    await self.retry_policy.async_sleep(decision.delay)
                    continue
                break
            break
        tail = turn.close()
        if store is not None and turn.checkpointing:
            try:
                if turn.closing is not None:  # kept until memory commits the turn
                    await store.aput(turn.closing)
                else:
                    await store.adelete(turn.ctx.key, epoch=turn.epoch)
            except StreamCheckpointError as exc:
                await self._awarn(turn, "awaken_checkpoint_warning", turn.store_failed(exc))
        for closing_chunk in turn.finish(tail):
            yield closing_chunk

    async def _ainner_chunks(
        self, turn: _Turn, messages: list[BaseMessage]
    ) -> AsyncIterator[ChatGenerationChunk]:
        inner = self.model
        if inner.rate_limiter is not None:
            await inner.rate_limiter.aacquire(blocking=True)
        cls = type(inner)
        if cls._astream is BaseChatModel._astream and cls._stream is BaseChatModel._stream:
            result = await inner._agenerate(messages, stop=turn.stop, **turn.kwargs)
            yield _whole_message_chunk(result.generations[0].message)
            return
        source = inner._astream(messages, stop=turn.stop, **turn.kwargs)
        async for item in _with_idle_timeout(source, self._idle_timeout(turn.kwargs)):
            yield item

    async def _asave(self, turn: _Turn) -> None:
        checkpoint = turn.snapshot()
        if checkpoint is None or self.store is None:
            return
        try:
            await self.store.aput(checkpoint)
        except StreamCheckpointError as exc:
            await self._awarn(turn, "awaken_checkpoint_warning", turn.store_failed(exc))
        turn.saved()

    async def _aevent(self, turn: _Turn, name: str, data: dict[str, Any]) -> None:
        logger.info("%s %s", name, data)
        await self._adispatch(turn, name, data)

    async def _awarn(self, turn: _Turn, name: str, message: str) -> None:
        logger.warning("%s", message)
        await self._adispatch(turn, name, {"key": turn.ctx.key, "message": message})

    async def _adispatch(self, turn: _Turn, name: str, data: dict[str, Any]) -> None:
        try:
            manager = AsyncCallbackManager.configure(*self._callback_settings(turn))
            await manager.on_custom_event(name, data, run_id=turn.ctx.run_id)
        except Exception:  # a broken handler must not break the turn
            logger.exception("callback failed while reporting %s", name)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        turn = _Turn(self, _take_call_context(), messages, stop, kwargs)
        async for _ in self._arun(turn):
            pass
        return ChatResult(generations=[ChatGeneration(message=turn.acc.message(turn.metadata()))])

    # -- helpers ----------------------------------------------------------------------------------

    def _idle_timeout(self, kwargs: dict[str, Any]) -> float | None:
        if self._is_reasoning(kwargs):
            return self.reasoning_stream_idle_timeout
        return self.stream_idle_timeout

    def _is_reasoning(self, kwargs: dict[str, Any]) -> bool:
        if any(kwargs.get(k) for k in _REASONING_KWARGS):
            return True
        if any(getattr(self.model, k, None) for k in _REASONING_KWARGS):
            return True
        name = str(self.model._get_ls_params().get("ls_model_name") or "").lower()
        return any(
            name.startswith(marker) or f"-{marker}" in name or marker in name.split("-")
            for marker in _REASONING_MARKERS
        ) or any(marker in name for marker in ("reasoning", "thinking"))


def _with_settings(inner: BaseChatModel, settings: dict[str, Any]) -> BaseChatModel:
    """Rebuild ``inner`` with constructor settings that were given to the wrapper."""
    fields = type(inner).model_fields
    names = set(fields) | {f.alias for f in fields.values() if f.alias}
    unknown = sorted(k for k in settings if k not in names)
    if unknown:
        raise ValueError(
            f"RecoveringChatModel does not know the setting(s) {unknown} and the inner model "
            f"{type(inner).__name__} has no such field; set them on the inner model, "
            "or check the spelling"
        )
    current = {
        name: getattr(inner, name)
        for name in inner.model_fields_set
        if name in fields and not fields[name].exclude
    }
    return type(inner)(**{**current, **settings})


def _replace_model(runnable: Any, old: BaseChatModel, new: RecoveringChatModel) -> Any:
    """Return ``runnable`` with every reference to ``old`` replaced by ``new``."""
    # imported here: the fallbacks module pulls in an HTTP client at import time
    from langchain_core.runnables.fallbacks import RunnableWithFallbacks

    if runnable is old:
        return new
    if isinstance(runnable, RunnableBinding):
        bound = _replace_model(runnable.bound, old, new)
        if bound is runnable.bound:
            return runnable
        return runnable.model_copy(update={"bound": bound})
    if isinstance(runnable, RunnableSequence):
        steps = [_replace_model(step, old, new) for step in runnable.steps]
        if all(a is b for a, b in zip(steps, runnable.steps, strict=True)):
            return runnable
        return RunnableSequence(*steps, name=runnable.name)
    if isinstance(runnable, RunnableParallel):
        branches = {k: _replace_model(v, old, new) for k, v in runnable.steps__.items()}
        if all(branches[k] is v for k, v in runnable.steps__.items()):
            return runnable
        return RunnableParallel(branches)
    if isinstance(runnable, RunnableWithFallbacks):
        primary = _replace_model(runnable.runnable, old, new)
        fallbacks = [_replace_model(f, old, new) for f in runnable.fallbacks]
        if primary is runnable.runnable and all(
            a is b for a, b in zip(fallbacks, runnable.fallbacks, strict=True)
        ):
            return runnable
        return runnable.model_copy(update={"runnable": primary, "fallbacks": fallbacks})
    return runnable


RecoveringChatModel.model_rebuild()
