"""Recovery events: their names, payloads, the metadata a turn reports, one reporter.

Every recovery decision (a retry, a continuation, a resume, a checkpoint
warning) is reported the same way, whoever makes it (the wrapper, the callback
handler, the history helpers): a log record under ``awaken_langchain``, a
LangChain custom event (seen by callback handlers and ``astream_events``) when
the call has callbacks, and, for warnings, a `StreamCheckpointWarning`. A
retry or a continuation is also a LangChain retry callback (``on_retry``: a
``"retry"`` event of the model's run in a tracer's run tree). Inside a LangGraph
graph every event is also written to the graph's custom stream
(``stream_mode="custom"``), and with ``opentelemetry-api`` installed it is an
event of the turn's span (`awaken_langchain._telemetry`).

Log records carry the event as structured fields (``extra``), for JSON log
formatters and log pipelines: ``awaken_event`` (the event name),
``awaken_run_id`` (when known), and every payload field under its name
prefixed with ``awaken_`` (``awaken_key``, ``awaken_plan``, ``awaken_attempt``,
``awaken_delay``, ``awaken_cause``, ...).
"""

from __future__ import annotations

import contextlib
import enum
import logging
import sys
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, TypedDict

from langchain_core.callbacks import (
    AsyncCallbackManager,
    AsyncCallbackManagerForLLMRun,
    BaseCallbackManager,
    BaseRunManager,
    CallbackManager,
    CallbackManagerForLLMRun,
)
from langchain_core.runnables import RunnableConfig
from langchain_core.tracers import BaseTracer
from langchain_core.tracers.base import AsyncBaseTracer
from langchain_core.tracers.context import (
    _get_tracer_kwargs,
    _tracing_v2_is_enabled,
    tracing_v2_callback_var,
)
from langchain_core.tracers.langchain import LangChainTracer
from langchain_core.tracers.schemas import Run
from tenacity import RetryCallState, Retrying

from awaken_langchain import _telemetry
from awaken_langchain._secrets import redact
from awaken_langchain.errors import StreamCheckpointWarning

logger = logging.getLogger(__name__)

__all__ = [
    "AwakenMetadata",
    "NotExecutedCall",
    "RECOVERED_TAG",
    "RecoveryEvent",
    "Report",
    "Reporter",
    "TurnState",
    "WrittenBy",
]


class RecoveryEvent(enum.StrEnum):
    """The names of the custom events recovery reports."""

    RETRY = "awaken_retry"
    """A failure before any output: the request is sent again."""
    CONTINUATION = "awaken_continuation"
    """An interruption after output: the turn is continued from its prefix."""
    FINISH_WITH_TOOL_CALLS = "awaken_finish_with_tool_calls"
    """An interruption after whole tool calls: the turn ends with them (plan R2)."""
    FALLBACK = "awaken_fallback"
    """The model in effect spent its budget: the turn moves to the next fallback model
    (a fresh request before any output, a continuation from the prefix after it)."""
    RESUME = "awaken_resume"
    """A checkpoint of the turn was found and adopted."""
    CHECKPOINT_IGNORED = "awaken_checkpoint_ignored"
    """A checkpoint was found but not resumed (another model, request or thread; too old)."""
    CHECKPOINT_WARNING = "awaken_checkpoint_warning"
    """The store failed; the turn went on without (some) checkpoints."""
    CHECKPOINT_RECOVERED = "awaken_checkpoint_recovered"
    """The store answered again after a failure; checkpointing goes on."""
    PROVIDER_RESUME = "awaken_provider_resume"
    """An interruption resumed at the provider: the response's stream goes on from the
    last event received, and nothing is generated again."""
    STOPPED = "awaken_stopped"
    """Someone asked the run to stop (`awaken_langchain.request_stop`): the turn ends
    with the text so far, and a tool call cut off by the stop does not run."""
    PROVIDER_CANCEL = "awaken_provider_cancel"
    """A turn that did not finish (abandoned, out of budget) cancelled its background
    response, so the provider stops generating it."""
    TOOL_LEDGER_REPLAY = "awaken_tool_ledger_replay"
    """A tool call ran before under the same id: its result was replayed from the tool
    ledger and the tool was not called."""
    TOOL_LEDGER_WARNING = "awaken_tool_ledger_warning"
    """The tool ledger could not vouch for a call: its outcome is unknown (reported, not
    run again), or the store failed and the tool ran without a record."""

    @property
    def is_retry(self) -> bool:
        """Whether the event sends a request again (reported as a LangChain retry too)."""
        return self in (
            RecoveryEvent.RETRY,
            RecoveryEvent.CONTINUATION,
            RecoveryEvent.FALLBACK,
            RecoveryEvent.PROVIDER_RESUME,
        )

    @property
    def is_warning(self) -> bool:
        """Whether the event reports a problem (logged as a warning)."""
        return self in (
            RecoveryEvent.CHECKPOINT_IGNORED,
            RecoveryEvent.CHECKPOINT_WARNING,
            RecoveryEvent.TOOL_LEDGER_WARNING,
        )


class NotExecutedCall(TypedDict):
    """A tool call of the turn that is not executed, and why."""

    id: str | None
    name: str | None
    error: str
    interrupted: bool
    """True when the stream was cut off in the call's arguments; False when the
    model itself wrote arguments that are not a JSON object."""


class WrittenBy(TypedDict):
    """The part of a turn's text one model wrote."""

    model: str
    """The model's identifier (``"<llm type>:<model name>"``)."""
    start: int
    """Offset of the model's first character in the message's text."""
    end: int
    """Offset just past its last character (``start`` when it wrote no text)."""


class AwakenMetadata(TypedDict):
    """``response_metadata["awaken"]`` of a turn: what recovery happened."""

    attempts: int
    """Requests sent for the turn (0 when it was replayed from a complete checkpoint)."""
    plans: list[str]
    """The recovery plans applied, in order (``"R1"`` ... ``"R4"``)."""
    retries: int
    """Requests sent again before any output."""
    continuations: int
    """Continuation requests after output."""
    resumed: bool
    """Whether the turn started from a checkpoint."""
    replayed: bool
    """Whether chunks of the turn were replayed from a checkpoint. Each replayed
    chunk carries ``response_metadata["awaken"] == {"replayed": True}`` (new text
    carries no ``"awaken"`` key until the closing chunk), so merged chunks keep
    this value."""
    interruptions: list[dict[str, Any]]
    """One entry per failure: its kind and the plan chosen."""
    seconds_waited: float
    """Backoff slept or awaited over the whole turn."""
    regenerated_output_tokens: int
    """Estimated output tokens produced twice (discarded attempts, repeated seams)."""
    checkpoint_key: str | None
    """The key of the turn's checkpoint, when a store is set."""
    checkpoint_writes: int
    """Checkpoint writes made for the turn."""
    checkpoint_complete: bool
    """Whether a complete checkpoint of the turn is kept in the store until memory
    commits the turn (only when the closing write succeeded)."""
    one_document: bool
    """Whether the request asked for one JSON document (structured output, JSON
    mode, forced tool choice), which is never continued as text."""
    not_executed: list[NotExecutedCall]
    """Tool calls that will not run, with the reason."""
    provider_resumes: int
    """Interruptions resumed at the provider (``provider_resume=True``): the stream
    went on from the last event received; none of them regenerated a token."""
    provider_response_id: str | None
    """The provider's id of the turn's background response (``provider_resume=True``)."""
    stopped: bool
    """Whether the turn ended early because someone asked its run to stop
    (`awaken_langchain.request_stop`)."""
    models: list[WrittenBy]
    """The models that were in effect, in order, with the text each wrote: one entry
    unless the turn moved to a fallback model."""


@dataclass(frozen=True, slots=True)
class Report:
    """One recovery event to report: its name, its payload and a log message."""

    event: RecoveryEvent
    data: dict[str, Any]
    message: str = ""
    """A human sentence for the log (and the warning); the payload is logged when empty."""
    failure: BaseException | None = field(default=None, compare=False, repr=False)
    """The failure that caused the event (for a retry callback and a span event)."""

    def log(self, run_id: uuid.UUID | None = None) -> None:
        """Write the log record (and, for a warning, the Python warning).

        Args:
            run_id: The run the event belongs to, logged as ``awaken_run_id``.
        """
        extra = self.log_fields(run_id)
        if self.event.is_warning:
            text = self.message or f"{self.event.value} {self.data}"
            logger.warning("%s", text, extra=extra)
            if self.event is RecoveryEvent.CHECKPOINT_WARNING:
                warnings.warn(text, StreamCheckpointWarning, stacklevel=4)
        else:
            logger.info("%s %s", self.event.value, self.message or self.data, extra=extra)

    def log_fields(self, run_id: uuid.UUID | None = None) -> dict[str, Any]:
        """The structured fields of the log record: the event, the run, the payload."""
        fields: dict[str, Any] = {"awaken_event": self.event.value}
        if run_id is not None:
            fields["awaken_run_id"] = str(run_id)
        fields.update({f"awaken_{name}": value for name, value in self.data.items()})
        return fields


def warning(event: RecoveryEvent, key: str | None, message: str) -> Report:
    """A warning report whose payload names the checkpoint key and the message.

    Every warning's text is built here, once for all its outlets (the Python
    warning, the log record, the callback event and what tracers record of it):
    a connection URL's password in it is masked.
    """
    message = redact(message)
    return Report(event, {"key": key, "message": message}, message)


def store_failure(key: str | None, what: str, exc: BaseException) -> Report:
    """The warning for a store failure that the caller carries on through."""
    return warning(RecoveryEvent.CHECKPOINT_WARNING, key, f"{what}; carrying on without it: {exc}")


RECOVERED_TAG = "awaken:recovered"
"""The tag a recovered turn adds to its model run in a tracer's run tree."""


class TurnState(Protocol):
    """What the reporter reads from a turn when it ends (the turn engine)."""

    acc: Any
    """The turn's accumulator: ``response_metadata``, ``usage``, ``message_id``."""

    def metadata(self) -> AwakenMetadata:
        """What recovery happened."""
        ...


def _graph_writer() -> Callable[[Any], None] | None:
    """The running LangGraph graph's custom stream writer, or ``None`` outside a graph."""
    if "langgraph.pregel" not in sys.modules:  # no graph has run in this process
        return None
    try:
        from langgraph.config import get_stream_writer

        return get_stream_writer()
    except Exception:  # outside a graph task (no runnable context, no graph runtime)
        return None


def _retry_state(report: Report, waited: float) -> RetryCallState:
    """Tenacity's description of a retry, as LangChain's ``on_retry`` takes it."""
    state = RetryCallState(Retrying(), None, (), {})
    state.attempt_number = int(report.data.get("attempt") or 1)
    state.idle_for = waited  # as tenacity counts it: waits so far, this one included
    state.upcoming_sleep = float(report.data.get("delay") or 0.0)
    failure = report.failure
    if failure is not None:
        state.set_exception((type(failure), failure, failure.__traceback__))
    return state


def _traced_run(handler: Any, run_id: uuid.UUID) -> Run | None:
    """The run a LangChain tracer holds for ``run_id``, if it is one that does."""
    if not isinstance(handler, BaseTracer | AsyncBaseTracer):
        return None
    run = handler.run_map.get(str(run_id))
    return run if isinstance(run, Run) else None


def _knows_run(handler: Any, run_id: uuid.UUID) -> bool:
    """False for a tracer that never saw the run start (its ``on_retry`` would fail)."""
    return not isinstance(handler, BaseTracer | AsyncBaseTracer) or (
        _traced_run(handler, run_id) is not None
    )


def _has_langsmith_tracer(callbacks: Any) -> bool:
    handlers = callbacks.handlers if isinstance(callbacks, BaseCallbackManager) else callbacks
    return any(isinstance(h, LangChainTracer) for h in handlers or [])


def share_tracer(config: RunnableConfig, model_callbacks: Any = None) -> None:
    """Give a call traced by LangSmith one tracer for its run and its recovery events.

    With tracing turned on by the environment (``LANGSMITH_TRACING``), LangChain
    makes a new ``LangChainTracer`` each time it sets up the callbacks of a call
    that brings none; the model's run would start in one tracer while its
    retries went to another that never saw it. Adding the tracer LangChain would
    make to the call's callbacks makes every set-up of the call use it, as a
    parent chain's tracer is used by its children.

    Args:
        config: The call's config, changed in place.
        model_callbacks: The model's own ``callbacks``.
    """
    if tracing_v2_callback_var.get() is not None or not _tracing_v2_is_enabled():
        return  # not traced, or every set-up already takes the context's tracer
    callbacks = config.get("callbacks")
    if _has_langsmith_tracer(callbacks) or _has_langsmith_tracer(model_callbacks):
        return
    try:
        tracer = LangChainTracer(**_get_tracer_kwargs())
    except Exception:  # LangChain would warn and go on untraced; so does this call
        return
    if isinstance(callbacks, BaseCallbackManager):
        manager = callbacks.copy()
        manager.add_handler(tracer, inherit=True)
        config["callbacks"] = manager
    else:
        config["callbacks"] = [*(callbacks or []), tracer]


def _manager_fields(manager: BaseCallbackManager | BaseRunManager) -> dict[str, Any]:
    """The handlers, parent, tags and metadata a callback manager is built from."""
    return {
        "handlers": manager.handlers,
        "inheritable_handlers": manager.inheritable_handlers,
        "parent_run_id": manager.parent_run_id,
        "tags": manager.tags,
        "inheritable_tags": manager.inheritable_tags,
        "metadata": manager.metadata,
        "inheritable_metadata": manager.inheritable_metadata,
    }


class Reporter:
    """Reports a call's recovery events: log, callbacks, warnings, graph stream, span.

    Built from what LangChain gave the call: the run manager when LangChain
    passes one (``invoke``, ``generate``), else the call's config.

    Args:
        run_id: The run the events belong to.
        settings: Arguments of ``CallbackManager.configure`` (callbacks, tags,
            metadata of the call and of the model), or ``None``.
        run_manager: LangChain's run manager for the call, when it passed one.
        model: The requested model's name (for the turn's span).
        provider: The provider's name, as LangChain's ``ls_provider`` gives it.
    """

    def __init__(
        self,
        run_id: uuid.UUID,
        settings: tuple[Any, ...] | None = None,
        run_manager: CallbackManagerForLLMRun | AsyncCallbackManagerForLLMRun | None = None,
        *,
        model: str | None = None,
        provider: str | None = None,
    ) -> None:
        self.run_id = run_manager.run_id if run_manager is not None else run_id
        self._settings = settings
        self._run_manager = run_manager
        self._model = model
        self._provider = provider
        self._writer = _graph_writer()
        self._span: _telemetry.TurnSpan | None = None
        self._waited = 0.0
        self.tap: Any = None
        """The turn's way to its run's event log (`awaken_langchain._runlog.Tap`), if any."""

    def _manager_args(self) -> dict[str, Any] | None:
        manager = self._run_manager
        return None if manager is None else _manager_fields(manager)

    def _run_args(self, manager: BaseCallbackManager) -> dict[str, Any]:
        """A run manager's arguments for the model run, without tracers that miss it."""
        return {
            **_manager_fields(manager),
            "run_id": self.run_id,
            "handlers": [h for h in manager.handlers if _knows_run(h, self.run_id)],
        }

    def _publish(self, report: Report) -> None:
        """The parts of reporting that need no callback manager: span, graph stream, run log."""
        if self.tap is not None:
            self.tap.add(report)
        if self._span is not None:
            self._span.event(report.event.value, report.data)
        if report.event.is_retry:
            self._waited += float(report.data.get("delay") or 0.0)
        if self._writer is not None:
            try:
                self._writer(
                    {"event": report.event.value, "run_id": str(self.run_id), "data": report.data}
                )
            except Exception:  # a broken stream consumer must not break the turn
                logger.exception("graph stream writer failed while reporting %s", report.event)

    def report(self, report: Report) -> None:
        """Report ``report`` everywhere it is seen (sync callbacks)."""
        report.log(self.run_id)
        self._publish(report)
        try:
            args = self._manager_args()
            if args is not None:
                manager = CallbackManager(**args)
            elif self._settings is not None:
                manager = CallbackManager.configure(*self._settings)
            else:
                return
            manager.on_custom_event(report.event.value, report.data, run_id=self.run_id)
            if report.event.is_retry:
                run = CallbackManagerForLLMRun(**self._run_args(manager))
                run.on_retry(_retry_state(report, self._waited))
        except Exception:  # a broken handler must not break the turn
            logger.exception("callback failed while reporting %s", report.event.value)

    async def areport(self, report: Report) -> None:
        """Report ``report`` everywhere it is seen (async callbacks)."""
        report.log(self.run_id)
        self._publish(report)
        try:
            args = self._manager_args()
            if args is not None:
                manager = AsyncCallbackManager(**args)
            elif self._settings is not None:
                manager = AsyncCallbackManager.configure(*self._settings)
            else:
                return
            await manager.on_custom_event(report.event.value, report.data, run_id=self.run_id)
            if report.event.is_retry:
                run = AsyncCallbackManagerForLLMRun(**self._run_args(manager))
                await run.on_retry(_retry_state(report, self._waited))
        except Exception:  # a broken handler must not break the turn
            logger.exception("callback failed while reporting %s", report.event.value)

    @contextlib.contextmanager
    def turn(self, state: TurnState) -> Iterator[None]:
        """Cover one turn, all its attempts: its span, and the run's recovery marks.

        On the way out (before LangChain ends the model's run), a turn that
        needed recovery adds ``awaken_*`` metadata to the run that LangChain
        tracers hold for it, and, when it ended with an answer, `RECOVERED_TAG`.
        """
        self._span = _telemetry.start_turn(self._model, self._provider)
        failure: BaseException | None = None
        try:
            yield
        except BaseException as exc:
            failure = exc
            raise
        finally:
            metadata = state.metadata()
            if self._span is not None:
                self._span.end(state.acc, metadata, failure)
                self._span = None
            if metadata["plans"] or metadata["resumed"]:
                self._mark_runs(metadata, recovered=failure is None)

    def _mark_runs(self, metadata: AwakenMetadata, *, recovered: bool) -> None:
        try:
            if self._run_manager is not None:
                handlers = self._run_manager.handlers
            elif self._settings is not None:
                handlers = CallbackManager.configure(*self._settings).handlers
            else:
                return
            for handler in handlers:
                run = _traced_run(handler, self.run_id)
                if run is None:
                    continue
                if recovered and RECOVERED_TAG not in (run.tags or []):
                    run.tags = [*(run.tags or []), RECOVERED_TAG]
                run.extra.setdefault("metadata", {}).update(
                    {
                        "awaken_recovered": recovered,
                        "awaken_plans": list(metadata["plans"]),
                        "awaken_retries": metadata["retries"],
                        "awaken_continuations": metadata["continuations"],
                        "awaken_resumed": metadata["resumed"],
                    }
                )
        except Exception:  # a tracer's run is best effort; the turn goes on
            logger.exception("could not mark the traced run as recovered")
