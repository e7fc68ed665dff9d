"""`RecoveringChatModel`: a drop-in chat model that makes a streamed turn recoverable.

The wrapper calls the inner model's ``_stream``/``_astream`` directly (never
``inner.stream()``, which would report every token twice). What a turn does is
decided by the turn engine (`awaken_langchain.engine`, no I/O); ``_run`` and
``_arun`` are twin drivers that move chunks, call the store, report events and
sleep or await, as the engine's steps say.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import uuid
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from typing import Any, cast

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import (
    BaseChatModel,
    LangSmithParams,
    LanguageModelInput,
    ModelProfile,
)
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.messages.tool import tool_call_chunk
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableConfig, ensure_config
from langchain_core.tools import BaseTool
from pydantic import ConfigDict, Field, field_validator, model_validator
from typing_extensions import override

from awaken_langchain._idle import Pump, with_idle_timeout
from awaken_langchain._parsed import aparsed_into, parsed_into, streamed_kwargs
from awaken_langchain._per_call import BoundPerCall
from awaken_langchain._provider_resume import provider_resume_problem
from awaken_langchain._reasoning import reasons
from awaken_langchain._rebind import replace_model, with_settings
from awaken_langchain._runlog import (
    Tap,
    aend_tap,
    askip_seen,
    end_tap,
    open_tap,
    skip_seen,
)
from awaken_langchain.accumulator import dumps_args
from awaken_langchain.checkpoint import (
    DeferredCheckpoint,
    StreamCheckpoint,
    StreamCheckpointStore,
    built,
    model_identifier,
)
from awaken_langchain.engine import Step, TurnEngine, TurnRequest, TurnSettings
from awaken_langchain.errors import StreamCheckpointError
from awaken_langchain.events import Report, Reporter, share_tracer
from awaken_langchain.fallback import (
    FallbackModel,
    call_kwargs_for,
    resolve_fallbacks,
    takes_stream_usage,
)
from awaken_langchain.history import last_kept_checkpoint
from awaken_langchain.recovery import DEFAULT_CONTINUATION_PROMPT
from awaken_langchain.request import (
    CallCounter,
    call_key,
    model_settings,
    one_document_request,
    request_fingerprint,
)
from awaken_langchain.retry import RetryPolicy
from awaken_langchain.writer import CheckpointWriter, writer_for

_CHECKPOINTER = "__pregel_checkpointer"
"""Where LangGraph puts a graph's checkpointer in a task's ``configurable``."""
_SCRATCHPAD = "__pregel_scratchpad"
"""LangGraph's per-task-execution object in a task's ``configurable``."""
_CALLS = CallCounter()
"""Numbers identical model calls within one LangGraph task execution."""


@dataclass(frozen=True, slots=True, kw_only=True)
class _CallContext:
    """What the public entry point knew about the call."""

    run_id: uuid.UUID
    key: str | None = None
    """The key the caller chose (``checkpoint_key``, an explicit ``run_id``)."""
    base: str | None = None
    """``<thread_id>:<checkpoint_ns>`` inside a LangGraph task."""
    task: object = None
    """LangGraph's scratchpad of the task execution, shared by its model calls."""
    thread_id: str | None = None
    config: RunnableConfig | None = None
    in_graph_memory: bool = False
    """Whether the call runs in a LangGraph task whose graph has a checkpointer."""
    streams: list[AsyncGenerator[ChatGenerationChunk, None]] = field(default_factory=list)
    """The generators of the async turns the call opened, for `_CallStream.aclose`."""


_CALL: contextvars.ContextVar[_CallContext | None] = contextvars.ContextVar(
    "awaken_langchain_call", default=None
)


def _take_call_context(
    run_manager: CallbackManagerForLLMRun | AsyncCallbackManagerForLLMRun | None,
) -> _CallContext:
    """Read (and clear, for nested wrappers) the context set by the entry point.

    Without one (``generate``/``agenerate`` called directly), the run id and
    thread come from LangChain's run manager, when it passed one.
    """
    ctx = _CALL.get()
    if ctx is not None:
        _CALL.set(None)
        return ctx
    if run_manager is not None:
        metadata = run_manager.metadata or {}
        thread = metadata.get("thread_id")
        return _CallContext(
            run_id=run_manager.run_id,
            key=str(run_manager.run_id),
            thread_id=str(thread) if thread is not None else None,
        )
    return _CallContext(run_id=uuid.uuid4())


class _CallStream:
    """What `RecoveringChatModel.astream` returns: LangChain's stream, closed like a generator.

    Its first read runs with the call's context set (LangChain begins the turn
    there); every later read is LangChain's own, handed on as it is: an async
    generator re-yielding each chunk would cost every chunk a resumption.
    ``aclose`` (a caller that stops reading) ends the call's turns before it
    returns: their handed-over writes land and their background responses are
    cancelled. A stream dropped unclosed ends its turns when they are collected.
    """

    __slots__ = ("_chunks", "_ctx", "_started")

    def __init__(self, chunks: AsyncIterator[AIMessageChunk], ctx: _CallContext) -> None:
        self._chunks = chunks
        self._ctx = ctx
        self._started = False

    def __aiter__(self) -> _CallStream:
        return self

    def __anext__(self) -> Awaitable[AIMessageChunk]:
        if self._started:
            return self._chunks.__anext__()
        return self._first()

    async def _first(self) -> AIMessageChunk:
        self._started = True
        token = _CALL.set(self._ctx)
        try:
            return await self._chunks.__anext__()
        finally:
            _CALL.reset(token)

    async def aclose(self) -> None:
        """Stop reading: end the call's turns now, not when they are collected."""
        close = getattr(self._chunks, "aclose", None)
        if close is not None:
            await close()
        for turn in self._ctx.streams:  # each settles its writes and cancels its responses
            await turn.aclose()


def _config_in_effect() -> RunnableConfig | None:
    """The config of the call in progress, set by the public entry point."""
    ctx = _CALL.get()
    return ctx.config if ctx is not None else None


def _names_a_model(model: Any, config: RunnableConfig | None) -> bool:
    """Whether ``init_chat_model``'s configurable ``model`` names its model with ``config``.

    It names it by default (``init_chat_model("openai:gpt-4o", configurable_fields=...)``)
    or in the config's ``configurable``. Another configurable runnable is taken to.
    """
    default = getattr(model, "_default_config", None)
    params = getattr(model, "_model_params", None)
    if not isinstance(default, dict) or not callable(params):
        return True
    return bool({**default, **params(config)}.get("model"))


def _open_run(
    store: StreamCheckpointStore, engine: TurnEngine
) -> tuple[StreamCheckpoint | None, StreamCheckpointError | None]:
    """Through the store's writer: release the committed turn, claim the run, read it."""
    released: StreamCheckpointError | None = None
    release = engine.request.release_key
    if release is not None:  # memory holds the previous turn now, if the input says true
        try:
            kept = store.get(release)
            if kept is not None and engine.releasable(kept):
                store.delete(release, epoch=kept.epoch)  # unless a new owner claimed it
        except StreamCheckpointError as exc:
            released = exc
    engine.claimed(store.claim(engine.key))
    return store.get(engine.key), released


def _opened(engine: TurnEngine) -> tuple[str, ...]:
    """The runs `_open_run` touches: the turn's own and the committed turn it releases."""
    release = engine.request.release_key
    return (engine.key,) if release is None else (engine.key, release)


def _last_action(store: StreamCheckpointStore, engine: TurnEngine, step: Step) -> Any:
    """The write (or delete) a turn waits for before it returns or raises."""
    if step.write is not None:
        return functools.partial(store.put, built(step.write))
    return functools.partial(store.delete, engine.key, epoch=engine.epoch)


def _nothing() -> None:
    """A no-op for the writer thread: its result means every earlier write landed."""


def _store_health(engine: TurnEngine, writer: CheckpointWriter, deadline: float) -> list[Report]:
    """Tell the engine whether the run's writes are reaching the store."""
    problem = writer.problem(engine.key, deadline)
    if problem is not None:
        return engine.store_failed(problem)
    return engine.store_answered()


async def _one(chunk: ChatGenerationChunk) -> AsyncIterator[ChatGenerationChunk]:
    yield chunk


def _whole_message_chunk(message: BaseMessage) -> ChatGenerationChunk:
    """Turn a non-streamed inner answer into one terminal chunk."""
    ai = cast(AIMessage, message)
    calls = [
        tool_call_chunk(name=c["name"], args=dumps_args(c["args"]), id=c.get("id"), index=i)
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

    model: BaseChatModel | Runnable[Any, Any]
    """The chat model whose turns are recovered: a chat model, or a configurable one
    (``init_chat_model(configurable_fields=...)``), resolved per call from the
    call's config. A configurable model with no default model
    (``init_chat_model(temperature=0)``) answers calls whose config names one."""
    retry_policy: RetryPolicy = Field(default_factory=RetryPolicy)
    """Attempts before output, continuations after output, backoff and deadline."""
    fallbacks: tuple[BaseChatModel, ...] = ()
    """Models the turn moves to, in order, when the model in effect has spent its
    retry budget on retryable failures: chat models, or ``"provider:model"``
    strings (resolved once, here, with ``init_chat_model``).

    Before any output the next model gets the request afresh; after output it
    continues the turn from the text so far (the same continuation request as
    for one model, with the prefix as text only: thinking blocks, reasoning items
    and other blocks stay in the answer but are not sent to another model). Each
    model gets ``retry_policy``'s budget afresh (attempts, continuations,
    ``overload_deadline`` counted from when it takes over); ``deadline`` bounds
    the whole turn. Permanent errors are raised without trying a fallback. A
    fallback of another chat model class gets the call's tools bound with its own
    ``bind_tools``, and none of the call's other arguments but ``stop`` and
    ``stream_usage`` (the rest are the primary provider's own); a request whose
    answer must be one JSON document (structured output, JSON mode, forced tool
    choice) moves only to fallbacks of the primary's class, which take its
    arguments as they are."""
    store: StreamCheckpointStore | None = Field(default=None, exclude=True)
    """Where the in-flight turn is checkpointed; ``None`` recovers in-process only."""
    checkpoint_every_chunks: int = Field(default=8, ge=1)
    """Write a checkpoint after at most this many chunks of output."""
    checkpoint_every_seconds: float = Field(default=0.25, gt=0)
    """Write a checkpoint when this many seconds of output are unsaved. With the
    default clock the write comes at the next of the moments, this far apart,
    that the process's turns share (`CheckpointCadence`), so that one commit
    carries every turn due then."""
    checkpoint_deadline: float = Field(default=0.5, gt=0)
    """Seconds a turn waits for its store when it must (opening the run, its last
    write). Other writes never make the stream wait for the store: its writer
    commits them (a background thread; with DiskCache, an async stream commits a
    batch itself at most every 10 ms, waiting at most 5 ms for another process's
    lock). A store that does not answer in time degrades checkpointing with one
    warning; the turn goes on at stream speed, and checkpointing resumes when the
    store answers."""
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
    keep_max_age: float | None = Field(default=3600.0, gt=0)
    """Seconds a kept complete checkpoint outlives its turn when memory never
    commits it (a graph that does not store the answer as a state message): the
    store's ``get`` then ignores it and its ``gc`` removes it. ``None`` keeps it
    until it is released or the store's ``ttl`` ends it."""
    keep_until_committed: bool | None = None
    """Keep a finished turn's checkpoint, marked complete, until memory commits it.

    A process that finds a complete checkpoint returns the answer without asking
    the provider, so a crash between the end of the turn and its commit costs
    nothing. ``None`` keeps it inside a LangGraph graph with a checkpointer (the
    thread's next model call, seeing the committed message, deletes it) and
    deletes it at turn end elsewhere; ``True`` always keeps it (commit with
    `awaken_langchain.history.commit_turn`, which deletes it); ``False`` deletes
    it when the turn ends."""
    provider_resume: bool = False
    """Resume an interrupted stream at the provider instead of continuing by prompt.

    Needs an inner ``ChatOpenAI(use_responses_api=True)``: each turn's response is
    created in background mode (``background=True``, ``store=True``), so the
    provider keeps it running when the connection drops, and an interruption
    resumes its stream after the last event received: no token is generated
    again and the answer equals the uncut one. With a ``store``, a replacement
    process resumes the same response. A response that is gone (expired,
    cancelled, failed) is continued by prompt. A turn that does not finish
    (abandoned, out of budget) cancels its response. Background responses are
    stored by the provider (data retention): leave this off when that is not
    allowed."""

    @field_validator("fallbacks", mode="before")
    @classmethod
    def _resolve_fallbacks(cls, value: Any) -> tuple[BaseChatModel, ...]:
        return resolve_fallbacks(value)

    @model_validator(mode="before")
    @classmethod
    def _forward_inner_settings(cls, data: Any) -> Any:
        """Forward settings meant for the inner model (``temperature=...``) to it."""
        if not isinstance(data, dict) or "model" not in data:
            return data
        own = set(cls.model_fields)
        own |= {f.alias for f in cls.model_fields.values() if f.alias}
        extra = {k: v for k, v in data.items() if k not in own}
        inner = data["model"]
        if not isinstance(inner, BaseChatModel):
            return data
        if data.get("output_version", inner.output_version) != inner.output_version:
            # the inner model builds the content blocks the wrapper's callers asked for
            extra["output_version"] = data["output_version"]
        if not extra:
            return data
        return {k: v for k, v in data.items() if k in own} | {"model": with_settings(inner, extra)}

    @model_validator(mode="after")
    def _inner_output_version(self) -> RecoveringChatModel:
        """Shape the answer's content as the inner model does (its ``output_version``)."""
        if not isinstance(self.model, BaseChatModel) and not callable(
            getattr(self.model, "_model", None)
        ):
            raise ValueError(
                "RecoveringChatModel(model=...) takes a chat model or a configurable one "
                f"(init_chat_model(configurable_fields=...)), not {type(self.model).__name__}"
            )
        if "output_version" not in self.model_fields_set:
            known = self._known_inner()  # none yet: a configurable model no default names
            if known is not None:
                self.output_version = getattr(known, "output_version", None)
        if self.provider_resume and isinstance(self.model, BaseChatModel):
            problem = provider_resume_problem(self.model)
            if problem is not None:
                raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _inner_run_settings(self) -> RecoveringChatModel:
        """Trace the turn as the inner model's run: its callbacks, tags and metadata.

        The wrapper calls the inner model's ``_stream``, so the inner model starts no
        run of its own: what it would have put on its run goes on the wrapper's, and
        the inner model's cache answers the wrapper's calls.
        """
        inner = self.model
        if not isinstance(inner, BaseChatModel):
            return self
        if self.cache is None and inner.cache is not None:
            self.cache = inner.cache
        if inner.callbacks:
            own = self.callbacks
            if own is None:
                self.callbacks = (
                    list(inner.callbacks) if isinstance(inner.callbacks, list) else inner.callbacks
                )
            elif isinstance(own, list) and isinstance(inner.callbacks, list):
                self.callbacks = [*own, *(h for h in inner.callbacks if h not in own)]
        if inner.tags:
            tags = list(self.tags or [])
            self.tags = [*tags, *(t for t in inner.tags if t not in tags)]
        if inner.metadata:
            own_metadata = dict(self.metadata or {})
            versions = {
                **(inner.metadata.get("lc_versions") or {}),
                **(own_metadata.get("lc_versions") or {}),
            }
            self.metadata = {**inner.metadata, **own_metadata}
            if versions:
                self.metadata["lc_versions"] = versions
        return self

    def _inner(self, config: RunnableConfig | None = None) -> BaseChatModel:
        """The chat model that answers a call with ``config`` (default: the call in progress).

        Raises:
            TypeError: If a configurable model resolves to something else (tools
                bound on the configurable model: bind them on the wrapper), or
                names no model (as the configurable model itself raises).
        """
        model = self.model
        if isinstance(model, BaseChatModel):
            return model
        if config is None:
            config = _config_in_effect()
        resolved = getattr(model, "_model")(config)  # noqa: B009 - init_chat_model's resolver
        if not isinstance(resolved, BaseChatModel):
            raise TypeError(
                f"the configurable model resolved to {type(resolved).__name__}, not a chat "
                "model; bind tools and structured output on RecoveringChatModel instead"
            )
        return resolved

    def _known_inner(self) -> BaseChatModel | None:
        """`_inner` where nothing may name the model.

        ``None`` for a configurable model with no default model
        (``init_chat_model(temperature=0)``) outside a call whose config names one.
        """
        model = self.model
        if isinstance(model, BaseChatModel):
            return model
        config = _config_in_effect()
        return self._inner(config) if _names_a_model(model, config) else None

    # -- LangChain identity --------------------------------------------------------------

    @property
    def _llm_type(self) -> str:
        inner = self._known_inner()
        inner_type = inner._llm_type if inner is not None else "configurable"
        return f"awaken-{inner_type}"  # callbacks skip the wrapper's own runs by it

    @property
    def model_name(self) -> str | None:
        """The inner model's name, where LangChain reads a model's name.

        Agents choose how to ask for structured output by the model's name
        (``model_name``, else ``model``): the wrapper's ``model`` is the inner
        model itself, so the name is answered here.
        """
        inner = self._known_inner()
        name = inner._get_ls_params().get("ls_model_name") if inner is not None else None
        return str(name) if name else None

    def _resolve_model_profile(self) -> ModelProfile | None:
        inner = self._known_inner()
        return inner.profile if inner is not None else None

    @property
    def _identifying_params(self) -> dict[str, Any]:
        """The inner model's parameters, where tracers read them, and the wrapper's own."""
        inner = self._known_inner()
        awaken: dict[str, Any] = {
            "inner_llm_type": inner._llm_type if inner is not None else "configurable",
            "max_attempts": self.retry_policy.max_attempts,
            "max_continuations": self.retry_policy.max_continuations,
        }
        if self.fallbacks:
            awaken["fallbacks"] = [self._model_id(m) for m in self.fallbacks]
        own = inner._identifying_params if inner is not None else {}
        return {**own, "awaken": awaken}

    @override
    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> Any:
        inner = self._known_inner()
        if inner is None:
            return LangSmithParams(ls_model_type="chat", **({"ls_stop": stop} if stop else {}))
        return inner._get_ls_params(stop=stop, **kwargs)

    def _model_id(
        self, inner: BaseChatModel | None = None, params: Mapping[str, Any] | None = None
    ) -> str:
        inner = inner or self._inner()
        params = inner._get_ls_params() if params is None else params
        return model_identifier(inner._llm_type, params.get("ls_model_name"))

    # -- public entry points: capture the run id and config ------------------------------

    def _context(self, config: RunnableConfig | None) -> tuple[RunnableConfig, _CallContext]:
        config = ensure_config(config)
        share_tracer(config, self.callbacks)
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
        namespace = configurable.get("checkpoint_ns") or metadata.get("langgraph_checkpoint_ns")
        base = f"{thread_id}:{namespace}" if thread_id is not None and namespace else None
        in_graph_memory = base is not None and configurable.get(_CHECKPOINTER) is not None
        return config, _CallContext(
            run_id=run_id,
            key=key,
            base=base,
            task=configurable.get(_SCRATCHPAD),
            thread_id=thread_id,
            config=config,
            in_graph_memory=in_graph_memory,
        )

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
    def astream(
        self,
        input: LanguageModelInput,
        config: RunnableConfig | None = None,
        *,
        stop: list[str] | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[AIMessageChunk]:
        config, ctx = self._context(config)
        return _CallStream(super().astream(input, config, stop=stop, **kwargs), ctx)

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
        if not isinstance(self.model, BaseChatModel):  # configurable: bound at each call
            return BoundPerCall(self._wrapper_for, "bind_tools", (tools,), kwargs)
        bound = self._bindable().bind_tools(tools, **kwargs)
        return cast(Runnable[LanguageModelInput, AIMessage], self._rebind(bound))

    @override
    def with_structured_output(
        self, schema: Any, *, include_raw: bool = False, **kwargs: Any
    ) -> Runnable[LanguageModelInput, Any]:
        """Structured output as the inner model builds it, with this wrapper in the chain."""
        if not isinstance(self.model, BaseChatModel):  # configurable: built at each call
            kwargs["include_raw"] = include_raw
            return BoundPerCall(self._wrapper_for, "with_structured_output", (schema,), kwargs)
        runnable = self._bindable().with_structured_output(
            schema, include_raw=include_raw, **kwargs
        )
        return cast(Runnable[LanguageModelInput, Any], self._rebind(runnable))

    def _wrapper_for(self, config: RunnableConfig | None) -> RecoveringChatModel:
        """This wrapper around the chat model a call with ``config`` resolves to."""
        return self.model_copy(update={"model": self._inner(config)})

    def _bindable(self) -> BaseChatModel:
        return self._inner()

    def _rebind(self, runnable: Any) -> Any:
        replaced = replace_model(runnable, self._bindable(), self)
        if replaced is runnable and runnable is not self.model:
            raise NotImplementedError(
                f"{type(self.model).__name__} returned a runnable in which the model could "
                "not be replaced by RecoveringChatModel; bind tools on the wrapper's "
                "inner model class's standard binding instead"
            )
        return replaced

    # -- one turn: what the engine is told ------------------------------------------------

    def _begin(
        self,
        ctx: _CallContext,
        messages: list[BaseMessage],
        stop: list[str] | None,
        run_manager: CallbackManagerForLLMRun | AsyncCallbackManagerForLLMRun | None,
        kwargs: dict[str, Any],
        *,
        whole: bool = False,
    ) -> tuple[TurnEngine, Reporter]:
        """Build the turn's engine and reporter from the call's context.

        ``whole`` marks a call answered as one message (``invoke``): the bare
        model would not stream it and would report its usage, so the inner model
        is asked to stream its usage too, when it can.
        """
        inner = self._inner(ctx.config)
        problem = provider_resume_problem(inner) if self.provider_resume else None
        if problem is not None:  # a configurable model resolved to another model
            raise ValueError(problem)
        params = inner._get_ls_params()
        model_id = self._model_id(inner, params)
        settings = model_settings(inner)
        fingerprint = request_fingerprint(
            messages, stop=stop, kwargs=kwargs, model=model_id, settings=settings
        )
        if ctx.key is not None:
            key = ctx.key
        elif ctx.base is not None:
            occurrence = _CALLS.next(ctx.task, fingerprint) if ctx.task is not None else 0
            key = call_key(ctx.base, fingerprint, occurrence)
        else:
            key = str(ctx.run_id)
        release, release_message_id = last_kept_checkpoint(messages) or (None, None)
        if release is not None and ctx.base is not None and release.startswith(f"{ctx.base}:"):
            release = None  # an earlier call of this task: memory commits it when the task ends
        keep = self.keep_until_committed
        request = TurnRequest(
            run_id=ctx.run_id,
            key=key,
            thread_id=ctx.thread_id,
            messages=messages,
            fingerprint=fingerprint,
            stop=stop,
            kwargs=self._usage_kwargs(inner, kwargs) if whole else kwargs,
            keep=ctx.in_graph_memory if keep is None else keep,
            one_document=one_document_request(kwargs, settings),
            release_key=release,
            release_message_id=release_message_id,
            model=inner,
        )
        if self.fallbacks:
            request = dataclasses.replace(
                request, fallbacks=self._fallback_chain(inner, request, kwargs, whole=whole)
            )
        turn = TurnSettings(
            policy=self.retry_policy,
            model_id=model_id,
            continuation_prompt=self.continuation_prompt,
            checkpointing=self.store is not None,
            every_chunks=self.checkpoint_every_chunks,
            every_seconds=self.checkpoint_every_seconds,
            keep_for=self.keep_max_age,
            resume_max_age=self.resume_max_age,
            # a whole answer is translated once it is whole, as for the inner model
            standard_blocks=not whole and getattr(inner, "output_version", None) == "v1",
            provider_resume=self.provider_resume,
        )
        reporter = Reporter(
            ctx.run_id,
            self._callback_settings(ctx),
            run_manager,
            model=params.get("ls_model_name"),
            provider=params.get("ls_provider"),
        )
        return TurnEngine(turn, request), reporter

    def _fallback_chain(
        self,
        inner: BaseChatModel,
        request: TurnRequest,
        kwargs: dict[str, Any],
        *,
        whole: bool,
    ) -> tuple[FallbackModel, ...]:
        """The fallbacks a turn can move to, each with the call's arguments as it takes them."""
        chain: list[FallbackModel] = []
        for model in self.fallbacks:
            if request.one_document and type(model) is not type(inner):
                continue  # the arguments that ask for one document are the primary's own
            own = call_kwargs_for(inner, model, kwargs)
            chain.append(
                FallbackModel(
                    model=model,
                    model_id=self._model_id(model),
                    kwargs=self._usage_kwargs(model, own) if whole else own,
                )
            )
        return tuple(chain)

    def _usage_kwargs(self, inner: BaseChatModel, kwargs: dict[str, Any]) -> dict[str, Any]:
        """``kwargs`` asking the inner model to stream usage, when it has the setting."""
        if "stream_usage" in kwargs or not takes_stream_usage(type(inner)):
            return kwargs
        responses = getattr(inner, "_use_responses_api", None)
        settings = {**kwargs, **(getattr(inner, "model_kwargs", None) or {})}
        if callable(responses) and responses(settings):  # the Responses API always sends usage
            return kwargs
        return {**kwargs, "stream_usage": True}

    def _callback_settings(self, ctx: _CallContext) -> tuple[Any, ...] | None:
        """Arguments of ``CallbackManager.configure`` for the call's recovery events."""
        config = ctx.config
        if config is None:
            return None
        return (
            config.get("callbacks"),
            self.callbacks,
            self.verbose,
            config.get("tags"),
            self.tags,
            config.get("metadata"),
            self.metadata,
        )

    # -- the sync driver ------------------------------------------------------------------

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        ctx = _take_call_context(run_manager)
        engine, reporter = self._begin(ctx, messages, stop, run_manager, kwargs)
        return self._run(engine, reporter)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        ctx = _take_call_context(run_manager)
        engine, reporter = self._begin(ctx, messages, stop, run_manager, kwargs, whole=True)
        for _ in self._run(engine, reporter):
            pass
        return ChatResult(generations=[ChatGeneration(message=engine.message())])

    def _run(self, engine: TurnEngine, reporter: Reporter) -> Iterator[ChatGenerationChunk]:
        """Drive one turn: open it, stream its attempts, close it.

        One generator for the whole turn, like its async twin `_arun`, where
        every level of generators costs each chunk a resumption.
        """
        tap = reporter.tap = self._tap(engine)
        failure: BaseException | None = None
        try:
            with reporter.turn(engine):
                yield from self._open(engine, reporter)
                while (request := engine.next_request()) is not None:
                    try:
                        stopping = tap is not None and tap.stopping
                        for generation in self._inner_chunks(engine, request):
                            due = engine.on_text(generation)
                            if due is None:
                                out, due = engine.on_chunk(generation)
                                if tap is not None:
                                    tap.pending.extend(out)
                                for chunk in out:  # a chunk passed on whole keeps its generation
                                    yield (
                                        generation
                                        if chunk is generation.message
                                        else ChatGenerationChunk(message=chunk)
                                    )
                            else:  # text passed on whole, the most common chunk
                                if tap is not None:
                                    tap.pending.append(generation.message)
                                yield generation
                            if due:
                                for report in self._hand_over(engine, engine.snapshot()):
                                    reporter.report(report)
                                if tap is not None:
                                    tap.due()
                            if tap is not None and tap.stopping:
                                stopping = True
                                break
                        if stopping:  # the inner stream, left, is closed: its connection ends
                            yield from self._carry_out(engine, reporter, engine.stop())
                            break
                        engine.check_complete()
                        break
                    except Exception as exc:
                        step = engine.on_failure(exc)
                        yield from self._carry_out(engine, reporter, step)
                        if step.error is exc:
                            raise
                        if step.error is not None:
                            raise step.error from exc
                        if step.delay is not None:
                            self.retry_policy.sleep(step.delay)
                yield from self._carry_out(engine, reporter, engine.close(), closing=True)
                yield from engine.final()
        except BaseException as exc:
            failure = exc
            raise
        finally:
            if not engine.done:  # the caller stopped reading: land what was handed over
                self._settle(engine)
            self._forget(engine)
            self._cancel_background(engine, reporter)
            if tap is not None:
                end_tap(tap, engine, failure)

    def _tap(self, engine: TurnEngine) -> Tap | None:
        """The turn's way to its run's event log, when its store keeps one."""
        store = self.store
        if store is None:
            return None
        return open_tap(store, engine.key, lambda: engine.fenced)

    def _open(self, engine: TurnEngine, reporter: Reporter) -> Iterator[ChatGenerationChunk]:
        store = self.store
        if store is None:
            return
        writer = writer_for(store)
        opening = writer.call(functools.partial(_open_run, store, engine), runs=_opened(engine))
        try:
            checkpoint, released = writer.wait(opening, self.checkpoint_deadline)
        except StreamCheckpointError as exc:
            for report in engine.store_unavailable(exc):
                reporter.report(report)
            return
        if released is not None:
            for report in engine.release_failed(released):
                reporter.report(report)
        step = engine.resume(checkpoint, store.clock())
        if reporter.tap is not None and engine.resumed:
            skip_seen(reporter.tap)
        yield from self._carry_out(engine, reporter, step)

    def _carry_out(
        self, engine: TurnEngine, reporter: Reporter, step: Step, *, closing: bool = False
    ) -> Iterator[ChatGenerationChunk]:
        if reporter.tap is not None:
            reporter.tap.pending.extend(step.chunks)
        yield from step.chunks
        self._store_step(engine, reporter, step, closing=closing)
        for report in step.reports:
            reporter.report(report)

    def _hand_over(
        self,
        engine: TurnEngine,
        write: StreamCheckpoint | DeferredCheckpoint | None,
        *,
        on_loop: bool = False,
    ) -> list[Report]:
        """Give the store's writer the turn's newest checkpoint; the stream goes on.

        ``on_loop``: the turn runs on the thread's event loop (an async stream),
        which gets control back between chunks.
        """
        store = self.store
        if store is None or write is None:
            return []
        writer = writer_for(store)
        writer.submit(write, on_loop=on_loop)
        return _store_health(engine, writer, self.checkpoint_deadline)

    def _ahand_over(
        self, engine: TurnEngine, write: StreamCheckpoint | DeferredCheckpoint | None
    ) -> list[Report]:
        """`_hand_over` for an async turn (not a coroutine: it never waits)."""
        return self._hand_over(engine, write, on_loop=True)

    def _store_step(
        self, engine: TurnEngine, reporter: Reporter, step: Step, *, closing: bool = False
    ) -> None:
        store = self.store
        if store is None or (step.write is None and not step.delete):
            return
        if step.write is not None and not closing and step.error is None:
            reports = self._hand_over(engine, step.write)
        else:  # the turn ends: its last write or delete lands before it returns
            writer = writer_for(store)
            try:
                last = writer.call(
                    _last_action(store, engine, step), runs=(engine.key,), closes=engine.key
                )
                writer.wait(last, self.checkpoint_deadline)
            except StreamCheckpointError as exc:
                reports = engine.store_failed(exc, closing=closing)
            else:
                reports = engine.store_answered()
            writer.forget(engine.key)
        for report in reports:
            reporter.report(report)

    def _settle(self, engine: TurnEngine) -> None:
        store = self.store
        if store is None or not engine.checkpointing:
            return
        writer = writer_for(store)
        with contextlib.suppress(StreamCheckpointError):
            writer.wait(writer.call(_nothing, runs=(engine.key,)), self.checkpoint_deadline)
        writer.forget(engine.key)

    def _forget(self, engine: TurnEngine) -> None:
        """The turn is over, however it ended: the store's writer keeps nothing of it.

        Fenced out, failed, abandoned by its caller or finished: a writer that
        remembered such runs would grow with every turn of the process.
        """
        if self.store is not None:
            writer_for(self.store).forget(engine.key)

    def _cancel_background(self, engine: TurnEngine, reporter: Reporter) -> None:
        for provider, model in engine.running_responses():
            response_id = provider.cancel(cast(BaseChatModel, model))
            if response_id is None:
                continue
            for report in engine.cancelled(response_id):
                reporter.report(report)

    def _inner_chunks(
        self, engine: TurnEngine, messages: list[BaseMessage]
    ) -> Iterator[ChatGenerationChunk]:
        request = engine.request
        inner = cast(BaseChatModel, request.model)
        if inner.rate_limiter is not None:
            inner.rate_limiter.acquire(blocking=True)
        if type(inner)._stream is BaseChatModel._stream:
            result = inner._generate(messages, stop=request.stop, **request.kwargs)
            return iter([_whole_message_chunk(result.generations[0].message)])
        if engine.provider is not None:
            source = engine.provider.stream(inner, messages, request.stop, request.kwargs)
        else:
            kwargs, schema = streamed_kwargs(inner, request.kwargs)
            source = inner._stream(messages, stop=request.stop, **kwargs)
            if schema is not None:
                source = parsed_into(source, schema)
        timeout = self._idle_timeout(inner, request.kwargs)
        return iter(Pump(source, timeout)) if timeout is not None else source

    # -- the async driver (twin of the sync one) --------------------------------------------

    def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        ctx = _take_call_context(run_manager)
        engine, reporter = self._begin(ctx, messages, stop, run_manager, kwargs)
        turn = self._arun(engine, reporter)
        # an async generator function's result: `_CallStream.aclose` ends it at once
        ctx.streams.append(cast(AsyncGenerator[ChatGenerationChunk, None], turn))
        return turn  # returned, not re-yielded: a layer costs every chunk

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        ctx = _take_call_context(run_manager)
        engine, reporter = self._begin(ctx, messages, stop, run_manager, kwargs, whole=True)
        async for _ in self._arun(engine, reporter):
            pass
        return ChatResult(generations=[ChatGeneration(message=engine.message())])

    async def _arun(
        self, engine: TurnEngine, reporter: Reporter
    ) -> AsyncIterator[ChatGenerationChunk]:
        """`_run` for an async turn."""
        tap = reporter.tap = self._tap(engine)
        failure: BaseException | None = None
        try:
            with reporter.turn(engine):
                async for opened in self._aopen(engine, reporter):
                    yield opened
                while (request := engine.next_request()) is not None:
                    try:
                        stopping = tap is not None and tap.stopping
                        async for generation in await self._ainner_chunks(engine, request):
                            due = engine.on_text(generation)
                            if due is None:
                                out, due = engine.on_chunk(generation)
                                if tap is not None:
                                    tap.pending.extend(out)
                                for chunk in out:  # a chunk passed on whole keeps its generation
                                    yield (
                                        generation
                                        if chunk is generation.message
                                        else ChatGenerationChunk(message=chunk)
                                    )
                            else:  # text passed on whole, the most common chunk
                                if tap is not None:
                                    tap.pending.append(generation.message)
                                yield generation
                            if due:
                                for report in self._ahand_over(engine, engine.snapshot()):
                                    await reporter.areport(report)
                                if tap is not None:
                                    tap.due()
                            if tap is not None and tap.stopping:
                                stopping = True
                                break
                        if stopping:  # the inner stream, left, is closed: its connection ends
                            async for held in self._acarry_out(engine, reporter, engine.stop()):
                                yield held
                            break
                        engine.check_complete()
                        break
                    except Exception as exc:
                        step = engine.on_failure(exc)
                        async for held in self._acarry_out(engine, reporter, step):
                            yield held
                        if step.error is exc:
                            raise
                        if step.error is not None:
                            raise step.error from exc
                        if step.delay is not None:
                            await self.retry_policy.async_sleep(step.delay)
                async for closing in self._acarry_out(
                    engine, reporter, engine.close(), closing=True
                ):
                    yield closing
                for final in engine.final():
                    yield final
        except BaseException as exc:
            failure = exc
            raise
        finally:
            if not engine.done:  # the caller stopped reading: land what was handed over
                await self._asettle(engine)
            self._forget(engine)
            await self._acancel_background(engine, reporter)
            if tap is not None:
                await aend_tap(tap, engine, failure)

    async def _aopen(
        self, engine: TurnEngine, reporter: Reporter
    ) -> AsyncIterator[ChatGenerationChunk]:
        store = self.store
        if store is None:
            return
        writer = writer_for(store)
        opening = writer.call(functools.partial(_open_run, store, engine), runs=_opened(engine))
        try:
            checkpoint, released = await writer.await_(opening, self.checkpoint_deadline)
        except StreamCheckpointError as exc:
            for report in engine.store_unavailable(exc):
                await reporter.areport(report)
            return
        if released is not None:
            for report in engine.release_failed(released):
                await reporter.areport(report)
        step = engine.resume(checkpoint, store.clock())
        if reporter.tap is not None and engine.resumed:
            await askip_seen(reporter.tap)
        async for replayed in self._acarry_out(engine, reporter, step):
            yield replayed

    async def _acarry_out(
        self, engine: TurnEngine, reporter: Reporter, step: Step, *, closing: bool = False
    ) -> AsyncIterator[ChatGenerationChunk]:
        if reporter.tap is not None:
            reporter.tap.pending.extend(step.chunks)
        for chunk in step.chunks:
            yield chunk
        await self._astore_step(engine, reporter, step, closing=closing)
        for report in step.reports:
            await reporter.areport(report)

    async def _astore_step(
        self, engine: TurnEngine, reporter: Reporter, step: Step, *, closing: bool = False
    ) -> None:
        store = self.store
        if store is None or (step.write is None and not step.delete):
            return
        if step.write is not None and not closing and step.error is None:
            reports = self._ahand_over(engine, step.write)
        else:  # the turn ends: its last write or delete lands before it returns
            writer = writer_for(store)
            try:
                last = writer.call(
                    _last_action(store, engine, step), runs=(engine.key,), closes=engine.key
                )
                await writer.await_(last, self.checkpoint_deadline)
            except StreamCheckpointError as exc:
                reports = engine.store_failed(exc, closing=closing)
            else:
                reports = engine.store_answered()
            writer.forget(engine.key)
        for report in reports:
            await reporter.areport(report)

    async def _asettle(self, engine: TurnEngine) -> None:
        store = self.store
        if store is None or not engine.checkpointing:
            return
        writer = writer_for(store)
        with contextlib.suppress(StreamCheckpointError):
            await writer.await_(writer.call(_nothing, runs=(engine.key,)), self.checkpoint_deadline)
        writer.forget(engine.key)

    async def _acancel_background(self, engine: TurnEngine, reporter: Reporter) -> None:
        for provider, model in engine.running_responses():
            response_id = await provider.acancel(cast(BaseChatModel, model))
            if response_id is None:
                continue
            for report in engine.cancelled(response_id):
                await reporter.areport(report)

    async def _ainner_chunks(
        self, engine: TurnEngine, messages: list[BaseMessage]
    ) -> AsyncIterator[ChatGenerationChunk]:
        """The inner model's chunks: returned, not re-yielded (a layer costs every chunk)."""
        request = engine.request
        inner = cast(BaseChatModel, request.model)
        if inner.rate_limiter is not None:
            await inner.rate_limiter.aacquire(blocking=True)
        cls = type(inner)
        if cls._astream is BaseChatModel._astream and cls._stream is BaseChatModel._stream:
            result = await inner._agenerate(messages, stop=request.stop, **request.kwargs)
            return _one(_whole_message_chunk(result.generations[0].message))
        if engine.provider is not None:
            source = engine.provider.astream(inner, messages, request.stop, request.kwargs)
        else:
            kwargs, schema = streamed_kwargs(inner, request.kwargs)
            source = inner._astream(messages, stop=request.stop, **kwargs)
            if schema is not None:
                source = aparsed_into(source, schema)
        return with_idle_timeout(source, self._idle_timeout(inner, request.kwargs))

    # -- helpers ----------------------------------------------------------------------------------

    def _idle_timeout(self, inner: BaseChatModel, kwargs: dict[str, Any]) -> float | None:
        if self.reasoning_stream_idle_timeout == self.stream_idle_timeout:
            return self.stream_idle_timeout
        if reasons(inner, kwargs):
            return self.reasoning_stream_idle_timeout
        return self.stream_idle_timeout


RecoveringChatModel.model_rebuild()
