"""The turn engine: one recovering turn's state and decisions (pure, no I/O).

The engine takes the turn's settings and what happens (a checkpoint found, a
chunk received, a failure, a store answer) and returns what to do: chunks to
yield, a checkpoint to write or delete, events to report, a delay before the
next attempt, an error to raise. It logs nothing, calls no store and sleeps
never; the sync and async drivers in ``model.py`` carry its steps out.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.messages.tool import tool_call_chunk
from langchain_core.outputs import ChatGenerationChunk
from pydantic import ValidationError

from awaken_langchain._provider_resume import ProviderStream, ProviderStreamGoneError
from awaken_langchain.accumulator import (
    CheckpointCadence,
    TurnAccumulator,
    dumps_args,
    shared_phase,
)
from awaken_langchain.checkpoint import DeferredCheckpoint, ModelSpan, StreamCheckpoint
from awaken_langchain.classify import _raised_inside_provider_sdk
from awaken_langchain.errors import (
    StreamCheckpointError,
    StreamCheckpointFencedError,
    StreamEndedEarlyError,
    StreamInterruptedError,
)
from awaken_langchain.events import AwakenMetadata, RecoveryEvent, Report, WrittenBy, warning
from awaken_langchain.fallback import FallbackModel, reshaped_chunk
from awaken_langchain.recovery import (
    Plan,
    answer_invalid_tool_calls,
    choose_plan,
    continuation_messages,
    estimate_tokens,
)
from awaken_langchain.retry import RetryDecision, RetryPhase, RetryPolicy

__all__ = ["PROVIDER_RESUME", "Step", "TurnEngine", "TurnRequest", "TurnSettings"]

PROVIDER_RESUME = "provider_resume"
"""The plan of an interruption resumed at the provider: its stream goes on, nothing is
generated again (``RecoveringChatModel(provider_resume=True)``)."""


@dataclass(frozen=True, slots=True)
class TurnSettings:
    """What the wrapper's fields say about every turn."""

    policy: RetryPolicy
    model_id: str
    continuation_prompt: str
    checkpointing: bool
    """Whether a store is set."""
    every_chunks: int = 8
    every_seconds: float = 0.25
    keep_for: float | None = 3600.0
    """Horizon of a complete checkpoint kept until memory commits the turn."""
    resume_max_age: float | None = None
    standard_blocks: bool = False
    """The inner model shows LangChain's standard content blocks (``output_version="v1"``)."""
    provider_resume: bool = False
    """Create the response in the provider's background mode and resume its stream
    after an interruption (see `awaken_langchain._provider_resume`)."""


@dataclass(frozen=True, slots=True)
class TurnRequest:
    """One model call: who made it and what it asks."""

    run_id: uuid.UUID
    key: str
    thread_id: str | None
    messages: Sequence[BaseMessage]
    fingerprint: str
    stop: list[str] | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Call arguments passed on to the inner model (tools, tool choice...)."""
    keep: bool = False
    """Keep the finished turn's checkpoint, marked complete, until memory commits it."""
    one_document: bool = False
    """The answer must be one JSON document: never continued as text."""
    release_key: str | None = None
    """The kept checkpoint of the previous turn, which memory now holds (as the input
    history says: released only if `TurnEngine.releasable` confirms it)."""
    release_message_id: str | None = None
    """The id of the input history's assistant message that names ``release_key``."""
    model: Any = None
    """The chat model that answers (resolved from the call's config for a configurable one)."""
    fallbacks: tuple[FallbackModel, ...] = ()
    """The models the turn moves to, in order, when the model in effect is spent."""


@dataclass(slots=True)
class Step:
    """What a driver does next, in this order: yield, write or delete, report, wait or raise."""

    chunks: list[ChatGenerationChunk] = field(default_factory=list)
    write: StreamCheckpoint | DeferredCheckpoint | None = None
    delete: bool = False
    reports: list[Report] = field(default_factory=list)
    delay: float | None = None
    """Wait this long, then send the next attempt (``None``: no next attempt now)."""
    error: BaseException | None = None
    """Raise this (chained to the failure that caused it unless it is that failure)."""


def _wrap(chunks: Sequence[AIMessageChunk]) -> list[ChatGenerationChunk]:
    return [ChatGenerationChunk(message=chunk) for chunk in chunks]


def describe(exc: BaseException) -> str:
    """``Type: message`` of an exception, shortened for events and errors."""
    text = str(exc)
    if len(text) > 300:
        text = text[:297] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _rejected_unfinished_answer(exc: Exception) -> bool:
    """Whether a provider SDK failed to assemble an answer that ended without its terminal event.

    The openai SDK's structured-output stream checks its final completion when the
    body ends: a document cut short fails validation (``pydantic.ValidationError``),
    an answer with no event at all fails an assertion. Either way the stream ended
    early, which is an interruption like any other.
    """
    return isinstance(exc, ValidationError | AssertionError) and _raised_inside_provider_sdk(exc)


class TurnEngine:
    """The state and decisions of one recovering turn.

    Args:
        settings: The wrapper's settings.
        request: The model call.
        clock: ``settings.policy.clock``'s reading when the turn started is taken now.
    """

    def __init__(self, settings: TurnSettings, request: TurnRequest) -> None:
        self.settings = settings
        self.policy = settings.policy
        self.request = request
        self.key = request.key
        self.messages = answer_invalid_tool_calls(request.messages)
        self.acc = TurnAccumulator(
            f"lc_run--{request.run_id}",
            hold_text=request.one_document,
            standard_blocks=settings.standard_blocks,
        )
        self.started = self.policy.clock()
        self.attempts = 0
        self.retries = 0
        self.continuations = 0
        self.waited = 0.0
        self.plans: list[str] = []
        self.interruptions: list[dict[str, Any]] = []
        self.resumed = False
        self.replayed = False
        self.continuing = False
        self.done = False
        self.epoch: int | None = None
        self.checkpointing = settings.checkpointing
        self.store_failing = False
        self.checkpoint_writes = 0
        self.kept = False
        self.stopped = False
        """Someone asked the run to stop; the turn ended with what it had."""
        self.fenced = False
        """A newer owner claimed the run: this turn no longer speaks for it (nor to its readers)."""
        self.provider = ProviderStream() if settings.provider_resume else None
        """The turn's background response at the provider, with provider resume."""
        self._reread = 0
        """Characters of output a replacement process reads again from the provider."""
        self.left_running: list[tuple[ProviderStream, Any]] = []
        """Background responses of models the turn moved away from (with their model),
        still running at the provider until cancelled."""
        self.cadence = CheckpointCadence(
            every_chunks=settings.every_chunks,
            every_seconds=settings.every_seconds,
            clock=self.policy.clock,
            phase=shared_phase(self.policy.clock),
        )
        self.fallbacks = request.fallbacks
        self.in_effect = 0
        """Which model answers: 0 the request's model, ``n`` its ``n``-th fallback."""
        self.model_started = self.started
        self.spent = (0, 0)
        """Retries and continuations made before the model in effect took over."""
        self.spans: list[tuple[str, int]] = [(settings.model_id, 0)]
        self.text_only_prefix = False
        """Continuations send the prefix as text only: another model wrote part of it."""
        self.reshape: bool | None = None
        """Move the text of the model in effect into the turn's shape: a list of blocks
        (``True``) or a string (``False``); ``None`` leaves chunks as they are."""

    # -- opening: adopt a checkpoint ---------------------------------------------------

    def claimed(self, epoch: int) -> None:
        """The store gave this process the run, at ``epoch``."""
        self.epoch = epoch

    def resume(self, checkpoint: StreamCheckpoint | None, now: float) -> Step:
        """Adopt a stored checkpoint of the turn, if it is usable for this request."""
        if checkpoint is None:
            return Step()
        reason = self._unusable(checkpoint, now)
        if reason is not None:
            return Step(reports=[warning(RecoveryEvent.CHECKPOINT_IGNORED, self.key, reason)])
        if checkpoint.complete and any(m.id == checkpoint.message_id for m in self.messages):
            return Step()  # a turn memory already holds; the next write replaces it
        self.acc = TurnAccumulator(
            checkpoint.message_id or self.acc.message_id,
            checkpoint,
            hold_text=self.request.one_document,
            standard_blocks=self.settings.standard_blocks,
        )
        self.resumed = True
        self._adopt_model(checkpoint)
        out = self.acc.replay()
        for call in checkpoint.completed_tool_calls:
            out.append(
                AIMessageChunk(
                    content=[] if self.acc.blocks else "",
                    id=self.acc.message_id,
                    tool_call_chunks=[
                        tool_call_chunk(
                            name=call.name,
                            args=dumps_args(call.args),
                            id=call.id or None,
                            index=call.index,
                        )
                    ],
                )
            )
        for chunk in out:  # a UI tells replayed text from new text by this mark
            chunk.response_metadata = {**chunk.response_metadata, "awaken": {"replayed": True}}
        self.replayed = bool(out)
        if checkpoint.complete:  # finished before memory committed it: no request needed
            self.done = True
            resumed_as = "complete"
        elif self.provider is not None and checkpoint.provider_response_id:
            # the provider still has the response: its stream goes on after the last
            # event the record holds, exactly where the record's text stops
            self.provider.adopt(
                checkpoint.provider_response_id,
                checkpoint.provider_sequence_number,
                has_reasoning=any(
                    b.block.get("type") == "reasoning" for b in checkpoint.completed_blocks
                ),
            )
            self.acc.begin_attempt(continuing=self._text_open(), exact=True)
            # a call the record holds cut off is read again, not generated again
            self._reread, self.acc.discarded_chars = self.acc.discarded_chars, 0
            self.plans.append(PROVIDER_RESUME)
            resumed_as = PROVIDER_RESUME
        else:
            plan = self._plan(
                text=checkpoint.partial_text,
                completed=len(checkpoint.completed_tool_calls),
                in_flight=checkpoint.in_flight_tool_call is not None,
            )
            self.plans.append(plan.value)
            if plan is Plan.FINISH_WITH_TOOL_CALLS:
                self.done = True
            else:
                self.continuing = plan in (Plan.CONTINUE_TEXT, Plan.DROP_TOOL_AND_CONTINUE)
            resumed_as = plan.value
        data = {
            "key": self.key,
            "plan": resumed_as,
            "chars": len(checkpoint.partial_text),
            "tool_calls": len(checkpoint.completed_tool_calls),
        }
        return Step(chunks=_wrap(out), reports=[Report(RecoveryEvent.RESUME, data)])

    def _text_open(self) -> bool:
        """Whether the adopted turn ends in text its provider may still add to.

        A Responses text block is closed by its ``output_text.done`` event, which
        gives the block its item ``id``; text after it begins a block of its own.
        """
        if not self.acc.blocks:
            return bool(self.acc.text)
        prefix = self.acc.content_prefix()
        last = prefix[-1] if prefix else None
        return isinstance(last, str) or (
            isinstance(last, dict) and last.get("type") == "text" and "id" not in last
        )

    @property
    def model_ids(self) -> tuple[str, ...]:
        """The request's model and its fallbacks, in order."""
        return (self.settings.model_id, *(f.model_id for f in self.fallbacks))

    @property
    def model_id(self) -> str:
        """The model in effect."""
        if not self.in_effect:
            return self.settings.model_id
        return self.model_ids[self.in_effect]

    def _adopt_model(self, checkpoint: StreamCheckpoint) -> None:
        """Go on with the model that was in effect when ``checkpoint`` was written."""
        if checkpoint.model_spans:
            self.spans = [(span.model, span.start) for span in checkpoint.model_spans]
        ids = self.model_ids
        if checkpoint.model and checkpoint.model != ids[0] and checkpoint.model in ids:
            self._use(ids.index(checkpoint.model), record_span=not checkpoint.model_spans)

    def _use(self, index: int, *, record_span: bool = True) -> None:
        """Make the ``index``-th model of the chain the one in effect, with a fresh budget."""
        self.in_effect = index
        fallback = self.fallbacks[index - 1]
        if self.provider is not None:  # provider resume is the primary model's setting
            if self.provider.resumable:
                self.left_running.append((self.provider, self.request.model))
            self.provider = None
        self.request = dataclasses.replace(
            self.request, model=fallback.model, kwargs=fallback.kwargs
        )
        self.model_started = self.policy.clock()
        self.spent = (self.retries, self.continuations)
        if record_span:
            self.spans.append((fallback.model_id, len(self.acc.text)))
        took_over_text = self.spans[-1][1] > 0  # another model wrote the start of the turn
        self.text_only_prefix = took_over_text
        self.reshape = self.acc.blocks if took_over_text else None

    def _unusable(self, checkpoint: StreamCheckpoint, now: float) -> str | None:
        key = self.key
        if checkpoint.model and checkpoint.model not in self.model_ids:
            models = self.model_ids
            expected = repr(models[0]) if len(models) == 1 else f"any of {list(models)!r}"
            return (
                f"checkpoint {key!r} was made for model {checkpoint.model!r}, "
                f"not {expected}; starting the turn afresh"
            )
        if checkpoint.fingerprint and checkpoint.fingerprint != self.request.fingerprint:
            return (
                f"checkpoint {key!r} was made for another request (different messages, "
                "tools or settings); starting the turn afresh"
            )
        thread = self.request.thread_id
        if checkpoint.thread_id and thread and checkpoint.thread_id != thread:
            return (
                f"checkpoint {key!r} belongs to thread {checkpoint.thread_id!r}, "
                f"not {thread!r}; starting the turn afresh"
            )
        max_age = self.settings.resume_max_age
        if max_age is not None and now - checkpoint.updated_at > max_age:
            return (
                f"checkpoint {key!r} is {now - checkpoint.updated_at:.0f} s old, "
                f"older than resume_max_age={max_age:g} s; starting the turn afresh"
            )
        return None

    # -- attempts ------------------------------------------------------------------------

    def next_request(self) -> list[BaseMessage] | None:
        """Begin an attempt and return the messages to send, or ``None`` when done."""
        if self.done:
            return None
        self.attempts += 1
        if self.provider is not None:
            if self.provider.response_id is not None:
                return list(self.messages)  # the provider's stream resumes: same attempt
            self.provider.forget(whole_turn=not self.continuing)  # a new response
        self.acc.begin_attempt(continuing=self.continuing)
        if self.continuing:
            return continuation_messages(
                self.messages,
                self.acc.text,
                self.settings.continuation_prompt,
                # blocks are sent back only to the model that wrote them
                blocks=(
                    self.acc.content_prefix()
                    if self.acc.blocks and not self.text_only_prefix
                    else None
                ),
            )
        return list(self.messages)

    def on_text(self, generation: ChatGenerationChunk) -> bool | None:
        """`on_chunk` for a chunk of nothing but text, which the driver yields as it is.

        Returns whether to checkpoint now, or ``None`` when the chunk is not
        such a chunk: nothing was taken, and `on_chunk` takes it. Most chunks
        of an answer are text; this path builds no list or tuple for them.
        """
        if self.reshape is not None or self.provider is not None:
            return None
        if not self.acc.take_text(generation):
            return None
        return self.checkpointing and self.cadence.observe()

    def on_chunk(self, generation: ChatGenerationChunk) -> tuple[list[AIMessageChunk], bool]:
        """Feed one inner chunk; return the chunks to yield and whether to checkpoint now."""
        if self.reshape is not None:
            generation = reshaped_chunk(generation, blocks=self.reshape)
        out = self.acc.feed(generation)
        provider = self.provider
        if provider is not None:
            provider.fed(generation)
            if self.acc.settled:
                provider.settle()
        return out, self.checkpointing and self.cadence.observe()

    def check_complete(self) -> None:
        """Raise `StreamEndedEarlyError` when the attempt ended without a terminal signal."""
        if not self.acc.terminal:
            raise StreamEndedEarlyError(chunks_received=self.acc.chunks_in_attempt)

    def _plan(self, *, text: str, completed: int, in_flight: bool) -> Plan:
        plan = choose_plan(text=text, completed_tool_calls=completed, in_flight_tool_call=in_flight)
        if self.request.one_document and plan in (Plan.CONTINUE_TEXT, Plan.DROP_TOOL_AND_CONTINUE):
            return Plan.RESTART  # held back, never shown: the document starts again
        return plan

    def on_failure(self, exc: Exception) -> Step:
        """Decide what to do about an interruption of the current attempt."""
        held = _wrap(self.acc.end_of_text())
        if self.acc.terminal and not (self.request.one_document and self.acc.nothing_shown):
            # the answer was complete; only the epilogue broke (one document not shown yet
            # is asked again: its epilogue, a parsed copy of it, is part of the answer)
            self.done = True
            return Step(chunks=held)
        if not self.acc.terminal and _rejected_unfinished_answer(exc):
            exc = StreamEndedEarlyError(chunks_received=self.acc.chunks_in_attempt)
        provider, gone = self.provider, isinstance(exc, ProviderStreamGoneError)
        if provider is not None and gone:  # continue by prompt instead
            provider.forget(whole_turn=False)
            self.acc.discarded_chars += self._reread  # generated again after all
            self._reread = 0
        resuming = provider is not None and provider.resumable
        text = self.acc.text
        plan = self._plan(
            text=text,
            completed=len(self.acc.completed),
            in_flight=self.acc.in_flight is not None or self.acc.block_in_flight,
        )
        label = PROVIDER_RESUME if resuming else plan.value
        phase = (
            RetryPhase.BEFORE_OUTPUT
            if plan is Plan.RESTART and not resuming
            else RetryPhase.AFTER_OUTPUT
        )
        retries, continuations = self.spent  # each model has its own budget
        resumed = provider.resumes if provider is not None else 0
        count = (
            self.retries - retries + 1
            if phase is RetryPhase.BEFORE_OUTPUT
            else self.continuations - continuations + resumed + 1
        )
        if plan is Plan.FINISH_WITH_TOOL_CALLS and not resuming:
            info = self.policy.classify(exc)
            if not info.retryable:
                return Step(chunks=held, write=self.snapshot(), error=exc)
            self.plans.append(plan.value)
            cut = self.acc.cut_off_in_flight()
            self.interruptions.append({"kind": info.kind.value, "plan": plan.value})
            self.done = True
            finished: dict[str, Any] = {
                "key": self.key,
                "plan": plan.value,
                "cause": info.kind.value,
                "error": describe(exc),
                "cut_off_tool_call": cut.name if cut else None,
            }
            return Step(
                chunks=held,
                write=self.snapshot(),
                reports=[Report(RecoveryEvent.FINISH_WITH_TOOL_CALLS, finished, failure=exc)],
            )
        now = self.policy.clock()
        decision = self.policy.should_retry(
            exc, attempt=count, elapsed=now - self.model_started, phase=phase
        )
        info = decision.error
        if not info.retryable:
            return Step(chunks=held, write=self.snapshot(), error=exc)
        self.interruptions.append({"kind": info.kind.value, "plan": label})
        past_deadline = self.policy.past_deadline(now - self.started, decision.delay)
        if not decision.retry and not past_deadline and self.in_effect < len(self.fallbacks):
            return self._fall_back(exc, plan, held, decision)
        if decision.retry and past_deadline:  # the deadline bounds the turn on every model
            decision = dataclasses.replace(
                decision,
                retry=False,
                reason=f"the turn would pass RetryPolicy.deadline={self.policy.deadline!r}",
            )
        if not decision.retry:
            if self.fallbacks:
                decision = dataclasses.replace(
                    decision,
                    reason=f"{decision.reason}, on the last of {len(self.model_ids)} models",
                )
            partial = (
                self.acc.message({**self.metadata(), "interrupted": True})
                if (text or self.acc.completed)
                else None
            )
            error = StreamInterruptedError(
                f"the streamed turn could not be recovered: {decision.reason}; "
                f"last failure: {describe(exc)}",
                partial=partial,
                cause=exc,
                attempts=self.attempts,
            )
            return Step(chunks=held, write=self.snapshot(), error=error)
        self.plans.append(label)
        self.waited += decision.delay
        data: dict[str, Any] = {
            "key": self.key,
            "plan": label,
            "cause": info.kind.value,
            "status_code": info.status_code,
            "retry_after": info.retry_after,
            "delay": decision.delay,
            "attempt": self.attempts,
            "error": describe(exc),
            "chars_so_far": len(text),
        }
        if resuming and provider is not None:
            data["response_id"] = provider.response_id
            data["starting_after"] = provider.sequence_number
            data["regenerated_output_tokens"] = 0
            return Step(
                chunks=held,
                write=self.snapshot(),
                reports=[Report(RecoveryEvent.PROVIDER_RESUME, data, failure=exc)],
                delay=decision.delay,
            )
        if phase is RetryPhase.BEFORE_OUTPUT:
            self.retries += 1
        else:
            self.continuations += 1
        self.continuing = plan is not Plan.RESTART
        if self.request.one_document:
            data["one_document"] = True
        if gone:
            data["provider_resume"] = str(exc)
        event = RecoveryEvent.RETRY if plan is Plan.RESTART else RecoveryEvent.CONTINUATION
        return Step(
            chunks=held,
            write=self.snapshot(),
            reports=[Report(event, data, failure=exc)],
            delay=decision.delay,
        )

    def _fall_back(
        self, exc: Exception, plan: Plan, held: list[ChatGenerationChunk], decision: RetryDecision
    ) -> Step:
        """The model in effect is spent: the turn moves on to the next model now.

        No backoff: the next model is another deployment or provider. The record
        written now names it as the model in effect, so a replacement process
        goes on with it.
        """
        info = decision.error
        spent = self.model_id
        self.plans.append(plan.value)
        if plan is Plan.RESTART:
            self.retries += 1
        else:
            self.continuations += 1
        self._use(self.in_effect + 1)
        self.continuing = plan is not Plan.RESTART
        data: dict[str, Any] = {
            "key": self.key,
            "plan": plan.value,
            "from_model": spent,
            "to_model": self.model_id,
            "cause": info.kind.value,
            "status_code": info.status_code,
            "reason": decision.reason,
            "attempt": self.attempts,
            "error": describe(exc),
            "chars_so_far": len(self.acc.text),
        }
        write = None
        if self.checkpointing:
            self.cadence.written()
            write = self._record()
        return Step(
            chunks=held,
            write=write,
            reports=[Report(RecoveryEvent.FALLBACK, data, failure=exc)],
            delay=0.0,
        )

    # -- checkpoints ---------------------------------------------------------------------

    def snapshot(self) -> DeferredCheckpoint | None:
        """The checkpoint to write now, or ``None`` when nothing changed since the last."""
        if not self.checkpointing or not self.cadence.dirty:
            return None
        self.cadence.written()
        return self.acc.capture(**self._fields())

    def _record(self, *, complete: bool = False) -> StreamCheckpoint:
        return self.acc.snapshot(**self._fields(complete=complete))

    def _fields(self, *, complete: bool = False) -> dict[str, Any]:
        """Every checkpoint field the accumulator does not hold."""
        self.checkpoint_writes += 1
        provider = self.provider
        whole = provider is not None and provider.whole_turn and provider.response_id is not None
        return {
            "provider_response_id": provider.response_id if whole and provider else None,
            "provider_sequence_number": provider.settled if whole and provider else None,
            "run_id": self.key,
            "thread_id": self.request.thread_id,
            "model": self.model_id,
            "model_spans": (
                tuple(ModelSpan(model=m, start=at) for m, at in self.spans)
                if len(self.spans) > 1
                else ()
            ),
            "fingerprint": self.request.fingerprint,
            "retry_count": self.retries + self.continuations,
            "epoch": self.epoch or 0,
            "complete": complete,
            "keep_for": self.settings.keep_for if complete else None,
        }

    def releasable(self, checkpoint: StreamCheckpoint | None) -> bool:
        """Whether ``checkpoint``, read under ``release_key``, is the previous turn's to delete.

        The input history is the caller's to write, so the key its last assistant
        message names is not trusted: the record must be a finished turn's, kept
        for that very message, and of this call's thread. An interrupted turn's
        record, or another thread's, is never deleted on the say-so of the input.
        """
        request = self.request
        return (
            checkpoint is not None
            and checkpoint.complete
            and request.release_message_id is not None
            and checkpoint.message_id == request.release_message_id
            and checkpoint.thread_id == request.thread_id
        )

    def store_unavailable(self, exc: StreamCheckpointError) -> list[Report]:
        """The store failed when the turn opened: the turn goes on without checkpoints."""
        self.checkpointing = False
        message = f"checkpoint store failed; the turn goes on without it: {exc}"
        return [warning(RecoveryEvent.CHECKPOINT_WARNING, self.key, message)]

    def release_failed(self, exc: StreamCheckpointError) -> list[Report]:
        """The previous turn's kept checkpoint could not be deleted."""
        message = f"could not delete the checkpoint of a turn memory has committed: {exc}"
        return [warning(RecoveryEvent.CHECKPOINT_WARNING, self.key, message)]

    def store_answered(self) -> list[Report]:
        """A store call succeeded: report the recovery of a failing store, once."""
        self.cadence.write_ended()
        if not self.store_failing:
            return []
        self.store_failing = False
        data = {"key": self.key}
        return [Report(RecoveryEvent.CHECKPOINT_RECOVERED, data, "checkpoint store answers again")]

    def store_failed(self, exc: StreamCheckpointError, *, closing: bool = False) -> list[Report]:
        """A store call failed: degrade checkpointing, reporting it once per outage."""
        self.cadence.write_ended()
        if closing:
            self.kept = False
        if isinstance(exc, StreamCheckpointFencedError):
            self.checkpointing = False
            self.fenced = True
            message = f"fenced out of run {self.key!r}; stopped checkpointing this turn: {exc}"
            return [warning(RecoveryEvent.CHECKPOINT_WARNING, self.key, message)]
        if self.store_failing:
            return []
        self.store_failing = True
        message = f"checkpoint store failed; the turn goes on without it: {exc}"
        return [warning(RecoveryEvent.CHECKPOINT_WARNING, self.key, message)]

    # -- the end ---------------------------------------------------------------------------

    def close(self) -> Step:
        """End the turn: release held text, then write the kept record or delete."""
        self.done = True
        held = _wrap(self.acc.end_of_turn())
        if not self.checkpointing:
            return Step(chunks=held)
        if self.request.keep:
            self.kept = True
            return Step(chunks=held, write=self._record(complete=True))
        return Step(chunks=held, delete=True)

    def stop(self) -> Step:
        """End the turn early, on a stop request: the text so far is the answer.

        Held text is released; a tool call cut off by the stop goes to the
        calls that do not run. `close` then ends the turn as usual.
        """
        self.stopped = True
        held = _wrap(self.acc.end_of_text())
        cut = self.acc.cut_off_in_flight()
        data = {
            "key": self.key,
            "chars": len(self.acc.text),
            "cut_off_tool_call": cut.name if cut else None,
        }
        report = Report(RecoveryEvent.STOPPED, data, "stopped on request")
        return Step(chunks=held, reports=[report])

    def metadata(self) -> AwakenMetadata:
        """What recovery happened, for ``response_metadata["awaken"]``."""
        regenerated = self.acc.discarded_chars + self.acc.seam_removed_chars
        return {
            "attempts": self.attempts,
            "plans": list(self.plans),
            "retries": self.retries,
            "continuations": self.continuations,
            "resumed": self.resumed,
            "replayed": self.replayed,
            "interruptions": list(self.interruptions),
            "seconds_waited": round(self.waited, 6),
            "regenerated_output_tokens": estimate_tokens(regenerated),
            "checkpoint_key": self.key if self.settings.checkpointing else None,
            "checkpoint_writes": self.checkpoint_writes,
            "checkpoint_complete": self.kept and self.checkpointing,
            "one_document": self.request.one_document,
            "not_executed": self.acc.not_executed(),
            "provider_resumes": self.provider.resumes if self.provider is not None else 0,
            "provider_response_id": self.provider.response_id if self.provider else None,
            "stopped": self.stopped,
            "models": self.written_by(),
        }

    def running_responses(self) -> list[tuple[ProviderStream, Any]]:
        """Background responses the turn leaves running, each with its model."""
        running = list(self.left_running)
        if self.provider is not None and self.provider.resumable:
            running.append((self.provider, self.request.model))
        return running

    def cancelled(self, response_id: str) -> list[Report]:
        """The turn left its background response running and cancelled it."""
        data = {"key": self.key, "response_id": response_id}
        message = f"cancelled background response {response_id!r}: the turn did not finish"
        return [Report(RecoveryEvent.PROVIDER_CANCEL, data, message)]

    def written_by(self) -> list[WrittenBy]:
        """The models in effect, in order, with the span of the text each wrote."""
        end = len(self.acc.text)
        starts = [at for _, at in self.spans[1:]] + [end]
        return [
            {"model": model, "start": at, "end": max(at, stop)}
            for (model, at), stop in zip(self.spans, starts, strict=True)
        ]

    def final(self) -> list[ChatGenerationChunk]:
        """The chunk that closes the turn: usage, metadata, calls that will not run."""
        return _wrap([self.acc.final_chunk(self.metadata())])

    def message(self) -> AIMessage:
        """The whole turn as one message (for ``invoke`` without streaming)."""
        return self.acc.message(self.metadata())
