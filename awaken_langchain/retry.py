"""`RetryPolicy`: how often, how long and on what a streamed turn is retried.

A turn has two phases with separate budgets:

- **before output** (nothing reached the caller yet): the failed request is
  simply sent again, up to ``max_attempts`` requests in total;
- **after output** (some chunks were already yielded): each interruption costs
  one continuation, up to ``max_continuations``.

`RetryPolicy` is the one retry engine for both: `RetryPolicy.should_retry`
decides from the failure, its number within the phase and the time elapsed, and
returns the delay computed by `RetryPolicy.delay_for`. The streaming loop that
asks (`RecoveringChatModel`'s turn engine) sleeps with ``sleep`` or awaits
``async_sleep`` itself, so a half-consumed generator is simply opened again.
Both phases share the same classification (`classify_error`, or the
``classifier`` hook), the same backoff and the same optional overall
``deadline``. An overloaded or rate-limited provider is retried past the
attempt count until ``overload_deadline`` (five minutes by default), since
overload windows last minutes, not seconds. Cancellation is never retried: it always propagates.

Example:
    ```python
    policy = RetryPolicy(max_attempts=4, deadline=120)
    started, failures = policy.clock(), 0
    while True:
        try:
            first_chunk = next(stream_factory())
            break
        except Exception as exc:
            failures += 1
            decision = policy.should_retry(
                exc,
                attempt=failures,
                elapsed=policy.clock() - started,
                phase=RetryPhase.BEFORE_OUTPUT,
            )
            if not decision.retry:
                raise
            policy.sleep(decision.delay)
    ```
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import math
import random
import time
from collections.abc import Awaitable
from typing import Protocol, runtime_checkable

from awaken_langchain.classify import ErrorInfo, ErrorKind, classify_error, is_cancellation

__all__ = [
    "AsyncSleep",
    "Clock",
    "ErrorClassifier",
    "Random",
    "RetryDecision",
    "RetryPhase",
    "RetryPolicy",
    "RetryPredicate",
    "Sleep",
]


@runtime_checkable
class ErrorClassifier(Protocol):
    """A user hook that classifies an exception, or returns ``None`` to defer."""

    def __call__(self, exc: BaseException, /) -> ErrorInfo | None:
        """Classify ``exc``; ``None`` falls back to `classify_error`."""
        ...


@runtime_checkable
class RetryPredicate(Protocol):
    """A user hook that marks otherwise-unknown exceptions as retryable."""

    def __call__(self, exc: BaseException, /) -> bool:
        """Return ``True`` to retry ``exc``."""
        ...


@runtime_checkable
class Clock(Protocol):
    """A function returning the current time in seconds."""

    def __call__(self) -> float:
        """Return the current time in seconds."""
        ...


@runtime_checkable
class Random(Protocol):
    """A function returning a random float in ``[0, 1)``, like `random.random`."""

    def __call__(self) -> float:
        """Return a random float in ``[0, 1)``."""
        ...


@runtime_checkable
class Sleep(Protocol):
    """A blocking sleep."""

    def __call__(self, seconds: float, /) -> None:
        """Block for ``seconds``."""
        ...


@runtime_checkable
class AsyncSleep(Protocol):
    """An awaitable sleep."""

    def __call__(self, seconds: float, /) -> Awaitable[None]:
        """Return an awaitable that completes after ``seconds``."""
        ...


class RetryPhase(enum.StrEnum):
    """Where in a streamed turn a failure happened."""

    BEFORE_OUTPUT = "before_output"
    """No chunk reached the caller yet: the request is sent again."""
    AFTER_OUTPUT = "after_output"
    """Chunks were yielded: the turn is continued from its prefix."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RetryDecision:
    """The answer of `RetryPolicy.should_retry`.

    Attributes:
        retry: Whether to send another request.
        delay: Seconds to wait before it (0 when not retrying).
        error: The classification of the failure.
        reason: A short explanation, naming the setting that decided it.
    """

    retry: bool
    delay: float
    error: ErrorInfo
    reason: str


RetryOn = RetryPredicate | type[BaseException] | tuple[type[BaseException], ...]
"""What `RetryPolicy.retry_on` accepts: a predicate or exception types."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """Attempts, backoff and deadline for recovering a streamed turn.

    Attributes:
        max_attempts: Requests sent in total before any output reached the
            caller (1 means no retry).
        max_continuations: Continuation requests after output was yielded
            (0 means an interruption after output is not recovered).
        initial_delay: Backoff before the first retry, in seconds.
        multiplier: Factor by which the backoff grows per retry.
        max_delay: Upper bound of the computed backoff, in seconds.
        jitter: Up to this many random seconds are added to each backoff; the
            sum is still capped at ``max_delay``.
        overloaded_initial_delay: Initial backoff for overloaded providers
            (HTTP 503/529, ``overloaded_error``), longer than ``initial_delay``.
        max_retry_after: Cap on a provider's ``retry-after`` hint, in seconds. A
            hint is honoured only when the provider sends one, and the wait is
            the larger of the hint (capped) and the backoff.
        deadline: Seconds from the start of the turn after which no retry or
            continuation is started (``None``: no deadline). A retry whose wait
            would end past the deadline is not started either.
        overload_deadline: For an overloaded or rate-limited provider
            (`ErrorKind.OVERLOADED`, `ErrorKind.RATE_LIMITED`), keep retrying
            past ``max_attempts`` (before output) or ``max_continuations``
            (after output) until this many seconds since the start of the turn
            (with ``fallbacks``, since the model in effect took the turn over):
            overload windows last minutes. Each wait is the usual backoff (at
            most ``max_delay``) or the provider's hint (at most
            ``max_retry_after``); a retry whose wait would end past this time is
            not started. ``deadline``, when set, still wins. ``None`` stops at
            the attempt count for every error.
        retry_on: Makes exceptions that classification does not recognise
            (`ErrorKind.UNKNOWN`) retryable: a predicate, an exception type or a
            tuple of them. Never makes a permanent error or a cancellation
            retryable.
        classifier: A hook classifying exceptions before `classify_error`;
            returning ``None`` defers to it. Cancellation is never retried,
            whatever the hook says.
        sleep: Blocking sleep used by the sync paths.
        async_sleep: Awaitable sleep used by the async paths.
        clock: Monotonic clock measuring the deadline.
        wall_clock: Wall clock (epoch seconds) for HTTP-date ``retry-after``.
        random: Source of the jitter, a float in ``[0, 1)`` per delay
            (``random.random``); inject a constant for deterministic delays.
    """

    max_attempts: int = 3
    max_continuations: int = 3
    initial_delay: float = 0.5
    multiplier: float = 2.0
    max_delay: float = 8.0
    jitter: float = 0.5
    overloaded_initial_delay: float = 2.0
    max_retry_after: float = 60.0
    deadline: float | None = None
    overload_deadline: float | None = 300.0
    retry_on: RetryOn | None = None
    classifier: ErrorClassifier | None = None
    sleep: Sleep = time.sleep
    async_sleep: AsyncSleep = asyncio.sleep
    clock: Clock = time.monotonic
    wall_clock: Clock = time.time
    random: Random = random.random

    def __post_init__(self) -> None:
        _check_int("max_attempts", self.max_attempts, minimum=1, hint="1 means no retry")
        _check_int(
            "max_continuations",
            self.max_continuations,
            minimum=0,
            hint="0 means an interruption after output is not continued",
        )
        for name in ("initial_delay", "max_delay", "jitter", "overloaded_initial_delay"):
            _check_seconds(name, getattr(self, name))
        _check_seconds("max_retry_after", self.max_retry_after)
        _check_number("multiplier", self.multiplier)
        if self.multiplier < 1:
            raise ValueError(
                f"RetryPolicy(multiplier={self.multiplier!r}): the backoff multiplier must be "
                "at least 1 (1 keeps the delay constant)"
            )
        for name in ("initial_delay", "overloaded_initial_delay"):
            if getattr(self, name) > self.max_delay:
                raise ValueError(
                    f"RetryPolicy({name}={getattr(self, name)!r}) exceeds "
                    f"max_delay={self.max_delay!r}; raise max_delay or lower {name}"
                )
        for name in ("deadline", "overload_deadline"):
            value = getattr(self, name)
            if value is None:
                continue
            _check_number(name, value)
            if value <= 0:
                raise ValueError(
                    f"RetryPolicy({name}={value!r}): must be a positive number of seconds, "
                    "or None for no such deadline"
                )
        _check_retry_on(self.retry_on)
        for name in ("classifier", "sleep", "async_sleep", "clock", "wall_clock", "random"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise TypeError(
                    f"RetryPolicy({name}={value!r}): expected a callable, "
                    f"got {type(value).__name__}"
                )

    # --- classification ------------------------------------------------------

    def classify(self, exc: BaseException) -> ErrorInfo:
        """Classify ``exc`` with the ``classifier`` hook, `classify_error` and ``retry_on``.

        Args:
            exc: The failure.

        Returns:
            Its classification. Cancellation is always `ErrorKind.CANCELLED`
            and never retryable.

        Raises:
            TypeError: If the ``classifier`` hook returned something other than
                an `ErrorInfo` or ``None``.
        """
        if is_cancellation(exc):
            return classify_error(exc)
        info: ErrorInfo | None = None
        if self.classifier is not None:
            info = self.classifier(exc)
            if info is not None and not isinstance(info, ErrorInfo):
                raise TypeError(
                    "RetryPolicy(classifier=...) must return an ErrorInfo or None, "
                    f"got {type(info).__name__}"
                )
        if info is None:
            info = classify_error(exc, now=self.wall_clock())
        if info.kind is ErrorKind.UNKNOWN and not info.retryable and self._retry_on(exc):
            info = dataclasses.replace(info, retryable=True)
        return info

    def is_retryable(self, exc: BaseException) -> bool:
        """Whether ``exc`` may succeed on retry under this policy."""
        return self.classify(exc).retryable

    def _retry_on(self, exc: BaseException) -> bool:
        retry_on = self.retry_on
        if retry_on is None:
            return False
        if isinstance(retry_on, type | tuple):
            return isinstance(exc, retry_on)
        return bool(retry_on(exc))

    # --- timing --------------------------------------------------------------

    def delay_for(self, error: ErrorInfo, attempt: int) -> float:
        """Seconds to wait after the ``attempt``-th failure of a phase.

        Exponential backoff with jitter: ``initial_delay`` (for overloaded
        providers ``overloaded_initial_delay``) times ``multiplier`` per earlier
        failure, plus up to ``jitter`` random seconds, all capped at
        ``max_delay``; or the provider's hint capped at ``max_retry_after`` when
        that is longer.

        Args:
            error: The classified failure.
            attempt: 1 for the first failure in the phase, 2 for the second, ...

        Returns:
            The delay in seconds.

        Raises:
            ValueError: If ``attempt`` is below 1.
        """
        _check_attempt(attempt)
        initial = (
            self.overloaded_initial_delay
            if error.kind is ErrorKind.OVERLOADED
            else self.initial_delay
        )
        jitter = self.jitter * self.random()
        try:
            backoff = initial * self.multiplier ** (attempt - 1) + jitter
        except OverflowError:  # a float power this large is past any max_delay
            backoff = self.max_delay
        delay = max(0.0, min(backoff, self.max_delay))
        if error.retry_after is not None:
            delay = max(delay, min(error.retry_after, self.max_retry_after))
        return float(delay)

    def budget(self, phase: RetryPhase) -> int:
        """How many failures in ``phase`` are recovered (retries or continuations)."""
        if phase is RetryPhase.BEFORE_OUTPUT:
            return self.max_attempts - 1
        return self.max_continuations

    def past_deadline(self, elapsed: float, delay: float = 0.0) -> bool:
        """Whether a retry after ``delay`` would start past the ``deadline``."""
        return self.deadline is not None and elapsed + delay > self.deadline

    def should_retry(
        self,
        exc: BaseException,
        *,
        attempt: int,
        elapsed: float,
        phase: RetryPhase,
    ) -> RetryDecision:
        """Decide whether to recover from ``exc`` and how long to wait first.

        Args:
            exc: The failure.
            attempt: The number of this failure within ``phase``, from 1. Before
                output it is the number of requests sent so far; after output,
                the number of interruptions after output including this one.
            elapsed: Seconds since the turn started, measured with ``clock``.
            phase: Whether any output had reached the caller.

        Returns:
            The decision, with the delay to sleep (sync) or await (async).
        """
        _check_attempt(attempt)
        info = self.classify(exc)
        if not info.retryable:
            return RetryDecision(
                retry=False,
                delay=0.0,
                error=info,
                reason=f"{info.kind.value} is not retryable"
                + (" (RetryPolicy.retry_on can allow unknown errors)" if _unknown(info) else ""),
            )
        budget = self.budget(phase)
        overload_deadline = self.overload_deadline if info.kind in _OVERLOAD_KINDS else None
        setting = (
            f"RetryPolicy.max_attempts={self.max_attempts}"
            if phase is RetryPhase.BEFORE_OUTPUT
            else f"RetryPolicy.max_continuations={self.max_continuations}"
        )
        if attempt > budget and overload_deadline is None:
            return RetryDecision(
                retry=False,
                delay=0.0,
                error=info,
                reason=f"budget exhausted after {attempt} {phase.value} failures ({setting})",
            )
        delay = self.delay_for(info, attempt)
        if (
            attempt > budget
            and overload_deadline is not None
            and elapsed + delay > overload_deadline
        ):
            return RetryDecision(
                retry=False,
                delay=0.0,
                error=info,
                reason=(
                    f"{info.kind.value} past {setting}, and a retry in {delay:.3g} s at "
                    f"{elapsed:.3g} s would pass "
                    f"RetryPolicy.overload_deadline={overload_deadline!r}"
                ),
            )
        if self.past_deadline(elapsed, delay):
            return RetryDecision(
                retry=False,
                delay=0.0,
                error=info,
                reason=(
                    f"a retry in {delay:.3g} s at {elapsed:.3g} s would pass "
                    f"RetryPolicy.deadline={self.deadline!r}"
                ),
            )
        return RetryDecision(
            retry=True,
            delay=delay,
            error=info,
            reason=(
                f"{info.kind.value}: retry {attempt} of {budget} in {delay:.3g} s"
                if attempt <= budget
                else f"{info.kind.value}: retry {attempt} in {delay:.3g} s, within "
                f"RetryPolicy.overload_deadline={self.overload_deadline!r} at {elapsed:.3g} s"
            ),
        )


_OVERLOAD_KINDS = frozenset({ErrorKind.OVERLOADED, ErrorKind.RATE_LIMITED})
"""Failures that ``overload_deadline`` retries past the attempt count."""


def _unknown(info: ErrorInfo) -> bool:
    return info.kind is ErrorKind.UNKNOWN


def _check_int(name: str, value: object, *, minimum: int, hint: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"RetryPolicy: {name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"RetryPolicy({name}={value!r}): must be at least {minimum} ({hint})")


def _check_attempt(attempt: object) -> None:
    if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 1:
        raise ValueError(f"attempt must be an int counted from 1, got {attempt!r}")


def _check_number(name: str, value: object) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise TypeError(f"RetryPolicy: {name} must be a number of seconds, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"RetryPolicy({name}={value!r}): must be finite")


def _check_seconds(name: str, value: object) -> None:
    _check_number(name, value)
    assert isinstance(value, int | float)
    if value < 0:
        raise ValueError(f"RetryPolicy({name}={value!r}): must not be negative")


def _check_retry_on(retry_on: object) -> None:
    if retry_on is None or (callable(retry_on) and not isinstance(retry_on, type)):
        return
    types = retry_on if isinstance(retry_on, tuple) else (retry_on,)
    if not types or not all(isinstance(t, type) and issubclass(t, BaseException) for t in types):
        raise TypeError(
            "RetryPolicy(retry_on=...) must be a predicate (exc) -> bool, an exception "
            f"type or a non-empty tuple of exception types, got {retry_on!r}"
        )
