"""The library's error tree.

```
AwakenError
├── StreamCheckpointError            a checkpoint store failed (run id and cause attached)
│   └── StreamCheckpointFencedError  a newer owner has claimed the run; this writer must stop
├── StreamInterruptedError           recovery was exhausted; carries the partial message and cause
├── StreamStalledError (TimeoutError) no chunk arrived within ``stream_idle_timeout``
└── StreamEndedEarlyError            the stream ended without a finish/stop reason

StreamCheckpointWarning (RuntimeWarning)  a store failure the turn carried on through
```

`StreamStalledError` and `StreamEndedEarlyError` describe one interrupted attempt
and are recovered like a dropped connection; the caller sees them only as the
``cause`` of a `StreamInterruptedError` once recovery is exhausted.

Provider errors that are not recoverable (authentication, bad request, ...) are
never wrapped: they propagate exactly as the provider SDK raised them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from langchain_core.messages import AIMessage


class AwakenError(Exception):
    """Base class of every error this library raises itself."""


class StreamCheckpointError(AwakenError):
    """A checkpoint store could not read, write or delete a run's checkpoint.

    Attributes:
        run_id: The run whose checkpoint was being accessed, if one was.
        cause: The underlying exception, if there was one.
    """

    def __init__(
        self,
        message: str,
        *,
        run_id: str | None = None,
        cause: BaseException | None = None,
    ) -> None:
        self.run_id = run_id
        self.cause = cause
        parts = [message]
        if run_id is not None:
            parts.append(f"run_id={_short(run_id)!r}")
        if cause is not None:
            parts.append(f"cause: {type(cause).__name__}: {cause}")
        super().__init__("; ".join(parts))
        if cause is not None:
            self.__cause__ = cause


class StreamCheckpointFencedError(StreamCheckpointError):
    """A put or delete carried an epoch older than the run's current one.

    Another owner claimed the run (``claim`` returned a larger epoch to it), so
    this writer has been fenced out and must stop writing checkpoints.

    Attributes:
        epoch: The stale epoch the writer presented.
        current_epoch: The run's current epoch in the store.
    """

    def __init__(self, run_id: str, *, epoch: int, current_epoch: int, ended: bool = False) -> None:
        self.epoch = epoch
        self.current_epoch = current_epoch
        if ended:
            message = (
                f"fenced: the run has ended (its epoch record is gone, and epoch {epoch} "
                f"is not above the store's epoch floor {current_epoch}); another owner "
                "finished it or its checkpoint expired, so this writer stops checkpointing it"
            )
        else:
            message = (
                f"fenced: epoch {epoch} is older than the run's current epoch {current_epoch}; "
                "another process has claimed this run, so this writer stops checkpointing it"
            )
        super().__init__(message, run_id=run_id)


class StreamInterruptedError(AwakenError):
    """A streamed turn was interrupted and recovery ran out of budget.

    Attributes:
        partial: The part of the turn that was produced before recovery gave up
            (text and whole tool calls only), or ``None`` if nothing arrived.
        cause: The last interruption (a provider or transport exception).
        attempts: How many requests were sent for this turn.
    """

    def __init__(
        self,
        message: str,
        *,
        partial: AIMessage | None,
        cause: BaseException | None,
        attempts: int,
    ) -> None:
        self.partial = partial
        self.cause = cause
        self.attempts = attempts
        super().__init__(message)
        if cause is not None:
            self.__cause__ = cause


class StreamStalledError(AwakenError, TimeoutError):
    """No chunk arrived from the provider within the idle timeout.

    Attributes:
        idle_timeout: The timeout in seconds that elapsed.
        chunks_received: Chunks received in the attempt before it stalled.
    """

    def __init__(self, idle_timeout: float, chunks_received: int) -> None:
        self.idle_timeout = idle_timeout
        self.chunks_received = chunks_received
        super().__init__(
            f"no chunk arrived for {idle_timeout:g} s after {chunks_received} chunks; "
            "raise RecoveringChatModel(stream_idle_timeout=...) for slower models"
        )


class StreamEndedEarlyError(AwakenError):
    """The provider stream ended without a terminal signal.

    A turn is complete only when the provider says so (``finish_reason``,
    ``stop_reason``). A stream that simply stops was cut off somewhere between
    the model and this process, so it is an interruption: retried before output,
    continued after output.

    Attributes:
        chunks_received: Chunks received in the attempt before the stream ended.
    """

    def __init__(self, chunks_received: int) -> None:
        self.chunks_received = chunks_received
        super().__init__(
            f"the provider stream ended after {chunks_received} chunks without a finish "
            "or stop reason, so the turn is incomplete; it is recovered like a dropped "
            "connection within RetryPolicy(max_attempts=..., max_continuations=...)"
        )


class StreamCheckpointWarning(RuntimeWarning):
    """A checkpoint could not be written or deleted; the turn itself went on.

    Store failures never fail a turn: they are logged under ``awaken_langchain``
    and reported with this warning category (filter it with
    ``warnings.simplefilter("ignore", StreamCheckpointWarning)``).
    """


def _short(text: str, limit: int = 80) -> str:
    """Shorten a possibly huge identifier for an error message."""
    return text if len(text) <= limit else text[: limit - 3] + "..."
