"""Recovery events: their names, payloads, the metadata a turn reports, one reporter.

Every recovery decision (a retry, a continuation, a resume, a checkpoint
warning) is reported the same way, whoever makes it (the wrapper, the callback
handler, the history helpers): a log record under ``awaken_langchain``, a
LangChain custom event (seen by callback handlers and ``astream_events``) when
the call has callbacks, and, for warnings, a `StreamCheckpointWarning`.

Log records carry the event as structured fields (``extra``), for JSON log
formatters and log pipelines: ``awaken_event`` (the event name),
``awaken_run_id`` (when known), and every payload field under its name
prefixed with ``awaken_`` (``awaken_key``, ``awaken_plan``, ``awaken_attempt``,
``awaken_delay``, ``awaken_cause``, ...).
"""

from __future__ import annotations

import enum
import logging
import uuid
import warnings
from dataclasses import dataclass
from typing import Any, TypedDict

from langchain_core.callbacks import (
    AsyncCallbackManager,
    AsyncCallbackManagerForLLMRun,
    CallbackManager,
    CallbackManagerForLLMRun,
)

from awaken_langchain.errors import StreamCheckpointWarning

logger = logging.getLogger(__name__)

__all__ = [
    "AwakenMetadata",
    "NotExecutedCall",
    "RecoveryEvent",
    "Report",
    "Reporter",
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

    @property
    def is_warning(self) -> bool:
        """Whether the event reports a problem (logged as a warning)."""
        return self in (RecoveryEvent.CHECKPOINT_IGNORED, RecoveryEvent.CHECKPOINT_WARNING)


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
    """A warning report whose payload names the checkpoint key and the message."""
    return Report(event, {"key": key, "message": message}, message)


def store_failure(key: str | None, what: str, exc: BaseException) -> Report:
    """The warning for a store failure that the caller carries on through."""
    return warning(RecoveryEvent.CHECKPOINT_WARNING, key, f"{what}; carrying on without it: {exc}")


class Reporter:
    """Reports a call's recovery events: log, callbacks, warnings.

    Built from what LangChain gave the call: the run manager when LangChain
    passes one (``invoke``, ``generate``), else the call's config.

    Args:
        run_id: The run the events belong to.
        settings: Arguments of ``CallbackManager.configure`` (callbacks, tags,
            metadata of the call and of the model), or ``None``.
        run_manager: LangChain's run manager for the call, when it passed one.
    """

    def __init__(
        self,
        run_id: uuid.UUID,
        settings: tuple[Any, ...] | None = None,
        run_manager: CallbackManagerForLLMRun | AsyncCallbackManagerForLLMRun | None = None,
    ) -> None:
        self.run_id = run_manager.run_id if run_manager is not None else run_id
        self._settings = settings
        self._run_manager = run_manager

    def _manager_args(self) -> dict[str, Any] | None:
        manager = self._run_manager
        if manager is None:
            return None
        return {
            "handlers": manager.handlers,
            "inheritable_handlers": manager.inheritable_handlers,
            "parent_run_id": manager.parent_run_id,
            "tags": manager.tags,
            "inheritable_tags": manager.inheritable_tags,
            "metadata": manager.metadata,
            "inheritable_metadata": manager.inheritable_metadata,
        }

    def report(self, report: Report) -> None:
        """Log ``report`` and send it to the call's callback handlers (sync)."""
        report.log(self.run_id)
        try:
            args = self._manager_args()
            if args is not None:
                manager = CallbackManager(**args)
            elif self._settings is not None:
                manager = CallbackManager.configure(*self._settings)
            else:
                return
            manager.on_custom_event(report.event.value, report.data, run_id=self.run_id)
        except Exception:  # a broken handler must not break the turn
            logger.exception("callback failed while reporting %s", report.event.value)

    async def areport(self, report: Report) -> None:
        """Log ``report`` and send it to the call's callback handlers (async)."""
        report.log(self.run_id)
        try:
            args = self._manager_args()
            if args is not None:
                manager = AsyncCallbackManager(**args)
            elif self._settings is not None:
                manager = AsyncCallbackManager.configure(*self._settings)
            else:
                return
            await manager.on_custom_event(report.event.value, report.data, run_id=self.run_id)
        except Exception:  # a broken handler must not break the turn
            logger.exception("callback failed while reporting %s", report.event.value)
