"""RetryPolicy: budgets, backoff, hints, deadline and cancellation, with injected time."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import email.utils
from collections.abc import Generator, Iterator, Sequence
from typing import Any

import anthropic
import httpx2
import openai
import pytest
from anthropic._error_classes import make_status_error as anthropic_status_error
from tenacity import RetryCallState

from awaken_langchain import ErrorInfo, ErrorKind, RetryPolicy
from awaken_langchain.retry import RetryPhase

NOW = 1_800_000_000.0


class FakeTime:
    """A monotonic clock that only moves when someone sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    async def async_sleep(self, seconds: float) -> None:
        self.sleep(seconds)


def status_error(
    status: int, headers: dict[str, str] | None = None, body: object = None
) -> anthropic.APIStatusError:
    response = httpx2.Response(
        status, headers=headers or {}, request=httpx2.Request("POST", "https://provider.test")
    )
    return anthropic_status_error(f"Error code: {status}", body=body, response=response)


def policy(fake: FakeTime, **overrides: Any) -> RetryPolicy:
    settings: dict[str, Any] = {
        "jitter": 0.0,
        "sleep": fake.sleep,
        "async_sleep": fake.async_sleep,
        "clock": fake.clock,
        "wall_clock": lambda: NOW,
    }
    settings.update(overrides)
    return RetryPolicy(**settings)


def run(retry_policy: RetryPolicy, failures: Sequence[BaseException]) -> tuple[int, object]:
    """Drive the before-output loop; each attempt raises the next failure, then succeeds."""
    calls = 0
    for attempt in retry_policy.retrying():
        with attempt:
            calls += 1
            if calls <= len(failures):
                raise failures[calls - 1]
            return calls, "ok"
    raise AssertionError("unreachable")


async def arun(retry_policy: RetryPolicy, failures: Sequence[BaseException]) -> tuple[int, object]:
    calls = 0
    async for attempt in retry_policy.async_retrying():
        with attempt:
            calls += 1
            if calls <= len(failures):
                raise failures[calls - 1]
            return calls, "ok"
    raise AssertionError("unreachable")


# --- configuration -----------------------------------------------------------------


def test_defaults_match_the_documented_policy() -> None:
    p = RetryPolicy()
    assert (p.max_attempts, p.max_continuations, p.max_retry_after, p.deadline) == (
        3,
        3,
        60.0,
        None,
    )
    assert p.overloaded_initial_delay > p.initial_delay


@pytest.mark.parametrize(
    ("settings", "error", "names"),
    [
        ({"max_attempts": 0}, ValueError, "max_attempts"),
        ({"max_attempts": True}, TypeError, "max_attempts"),
        ({"max_continuations": -1}, ValueError, "max_continuations"),
        ({"multiplier": 0.5}, ValueError, "multiplier"),
        ({"jitter": -1}, ValueError, "jitter"),
        ({"max_retry_after": float("inf")}, ValueError, "max_retry_after"),
        ({"initial_delay": 10.0}, ValueError, "max_delay"),
        ({"deadline": 0}, ValueError, "deadline"),
        ({"retry_on": 3}, TypeError, "retry_on"),
        ({"retry_on": (ValueError, "x")}, TypeError, "retry_on"),
        ({"sleep": "zzz"}, TypeError, "sleep"),
        ({"random": 0.5}, TypeError, "random"),
    ],
)
def test_invalid_settings_are_rejected_with_the_setting_named(
    settings: dict[str, Any], error: type[Exception], names: str
) -> None:
    with pytest.raises(error, match=names):
        RetryPolicy(**settings)


def test_policy_is_immutable() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        RetryPolicy().max_attempts = 5  # type: ignore[misc]


# --- backoff ----------------------------------------------------------------------


def test_backoff_grows_exponentially_up_to_max_delay() -> None:
    p = RetryPolicy(jitter=0.0)
    server = ErrorInfo(kind=ErrorKind.SERVER, retryable=True)
    assert [p.delay_for(server, n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0]


def test_overloaded_errors_get_the_longer_base() -> None:
    p = RetryPolicy(jitter=0.0)
    overloaded = ErrorInfo(kind=ErrorKind.OVERLOADED, retryable=True)
    assert [p.delay_for(overloaded, n) for n in range(1, 5)] == [2.0, 4.0, 8.0, 8.0]


def test_jitter_stays_within_its_bound_and_never_exceeds_max_delay() -> None:
    p = RetryPolicy(jitter=0.5)
    server = ErrorInfo(kind=ErrorKind.SERVER, retryable=True)
    for attempt in range(1, 8):
        base = min(0.5 * 2 ** (attempt - 1), 8.0)
        for _ in range(50):
            assert base <= p.delay_for(server, attempt) <= min(base + 0.5, 8.0)


def test_jitter_comes_from_the_injected_random_source_and_counts_within_max_delay() -> None:
    p = RetryPolicy(jitter=0.5, random=lambda: 0.5)
    server = ErrorInfo(kind=ErrorKind.SERVER, retryable=True)
    assert [p.delay_for(server, n) for n in range(1, 7)] == [0.75, 1.25, 2.25, 4.25, 8.0, 8.0]


def test_backoff_too_large_for_a_float_is_max_delay() -> None:
    p = RetryPolicy(jitter=0.0)
    assert p.delay_for(ErrorInfo(kind=ErrorKind.SERVER, retryable=True), 5000) == 8.0


def test_zero_base_and_zero_jitter_mean_no_wait() -> None:
    p = RetryPolicy(initial_delay=0, overloaded_initial_delay=0, jitter=0)
    assert p.delay_for(ErrorInfo(kind=ErrorKind.OVERLOADED, retryable=True), 3) == 0.0


def test_provider_hint_is_honoured_when_longer_than_the_backoff() -> None:
    p = RetryPolicy(jitter=0.0)
    assert (
        p.delay_for(ErrorInfo(kind=ErrorKind.RATE_LIMITED, retryable=True, retry_after=3), 1) == 3
    )
    assert p.delay_for(
        ErrorInfo(kind=ErrorKind.RATE_LIMITED, retryable=True, retry_after=0.1), 1
    ) == (0.5)


def test_delay_for_rejects_attempt_zero() -> None:
    with pytest.raises(ValueError, match="attempt"):
        RetryPolicy().delay_for(ErrorInfo(kind=ErrorKind.SERVER, retryable=True), 0)


# --- the tenacity loop (before output) -----------------------------------------------


def test_retry_after_of_an_hour_waits_sixty_seconds() -> None:
    fake = FakeTime()
    limited = status_error(429, {"retry-after": "3600"})
    assert run(policy(fake), [limited, limited]) == (3, "ok")
    assert fake.sleeps == [60.0, 60.0]


def test_max_retry_after_is_configurable() -> None:
    fake = FakeTime()
    run(policy(fake, max_retry_after=5), [status_error(429, {"retry-after": "3600"})])
    assert fake.sleeps == [5.0]


def test_http_date_hint_is_parsed_against_the_injected_wall_clock() -> None:
    fake = FakeTime()
    date = email.utils.formatdate(NOW + 30, usegmt=True)
    run(policy(fake), [status_error(429, {"retry-after": date})])
    assert fake.sleeps == [30.0]


def test_retry_after_ms_hint_is_used_by_the_loop() -> None:
    fake = FakeTime()
    run(policy(fake), [status_error(429, {"retry-after-ms": "1500"})])
    assert fake.sleeps == [1.5]


def test_overloaded_response_waits_longer_than_a_server_error() -> None:
    overloaded, server = FakeTime(), FakeTime()
    run(policy(overloaded), [status_error(529)])
    run(policy(server), [status_error(500)])
    assert (overloaded.sleeps, server.sleeps) == ([2.0], [0.5])


def test_retryable_failures_are_retried_until_max_attempts_then_the_last_one_raises() -> None:
    fake = FakeTime()
    failures = [status_error(500), status_error(502), status_error(503)]
    with pytest.raises(anthropic.InternalServerError) as caught:
        run(policy(fake), failures)
    assert caught.value is failures[2]
    assert len(fake.sleeps) == 2


@pytest.mark.parametrize("status", [400, 401, 403, 404, 413])
def test_permanent_errors_are_tried_exactly_once(status: int) -> None:
    fake = FakeTime()
    failure = status_error(status)
    with pytest.raises(anthropic.APIStatusError) as caught:
        run(policy(fake), [failure])
    assert caught.value is failure
    assert fake.sleeps == []


def test_deadline_stops_retries_before_a_wait_that_would_pass_it() -> None:
    fake = FakeTime()
    retry_policy = policy(fake, initial_delay=2.0, max_attempts=10, deadline=5.0)
    failures: list[BaseException] = [status_error(500) for _ in range(10)]
    with pytest.raises(anthropic.InternalServerError) as caught:
        run(retry_policy, failures)
    # attempt 1 fails at t=0 (wait 2), attempt 2 at t=2 (wait 4 -> t=6 > 5): stop.
    assert fake.sleeps == [2.0]
    assert caught.value is failures[1]


def test_deadline_counts_from_the_start_of_the_turn() -> None:
    fake = FakeTime()
    fake.now = 100.0
    retry_policy = policy(fake, deadline=5.0)
    calls = 0

    def turn() -> None:
        nonlocal calls
        for attempt in retry_policy.retrying(started_at=95.2):  # 4.8 s of the turn are gone
            with attempt:
                calls += 1
                raise status_error(500)

    with pytest.raises(anthropic.InternalServerError):
        turn()
    assert (calls, fake.sleeps) == (1, [])  # waiting 0.5 s would end past the deadline


def test_message_saying_rate_limit_without_structure_is_not_retried() -> None:
    fake = FakeTime()
    with pytest.raises(RuntimeError):
        run(policy(fake), [RuntimeError("Error 429: rate limit exceeded, please retry")])
    assert fake.sleeps == []


def test_retry_on_types_make_unknown_exceptions_retryable() -> None:
    fake = FakeTime()
    assert run(policy(fake, retry_on=(LookupError,)), [KeyError("flaky")]) == (2, "ok")


def test_retry_on_predicate_is_consulted_for_unknown_exceptions_only() -> None:
    fake = FakeTime()
    seen: list[BaseException] = []

    def always(exc: BaseException) -> bool:
        seen.append(exc)
        return True

    retry_policy = policy(fake, retry_on=always)
    assert run(retry_policy, [RuntimeError("flaky")]) == (2, "ok")
    with pytest.raises(anthropic.AuthenticationError):
        run(retry_policy, [status_error(401)])
    assert [type(e) for e in seen] == [RuntimeError]


def test_classifier_hook_overrides_and_defers() -> None:
    fake = FakeTime()

    def classifier(exc: BaseException) -> ErrorInfo | None:
        if isinstance(exc, ValueError):
            return ErrorInfo(kind=ErrorKind.SERVER, retryable=True, retry_after=4)
        return None

    retry_policy = policy(fake, classifier=classifier)
    assert run(retry_policy, [ValueError("custom transient")]) == (2, "ok")
    assert fake.sleeps == [4.0]
    assert retry_policy.classify(status_error(401)).kind is ErrorKind.AUTHENTICATION


def test_classifier_returning_garbage_is_reported() -> None:
    retry_policy = RetryPolicy(classifier=lambda exc: "retry please")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="classifier"):
        retry_policy.classify(ValueError())


def test_before_sleep_hook_sees_each_retry() -> None:
    fake = FakeTime()
    attempts: list[int] = []

    def before_sleep(state: RetryCallState) -> None:
        attempts.append(state.attempt_number)

    calls = 0
    for attempt in policy(fake).retrying(before_sleep=before_sleep):
        with attempt:
            calls += 1
            if calls < 3:
                raise status_error(503)
    assert attempts == [1, 2]


def test_half_consumed_generator_is_retried_with_the_attempt_loop() -> None:
    fake = FakeTime()
    opened = 0

    def provider_stream() -> Iterator[str]:
        nonlocal opened
        opened += 1
        if opened == 1:
            raise httpx2.RemoteProtocolError("peer closed connection before headers")
        yield from ["Hel", "lo"]

    received: list[str] = []
    for attempt in policy(fake).retrying():
        with attempt:
            stream = provider_stream()
            received.append(next(stream))  # retried only until the first chunk arrives
    received.extend(stream)
    assert (received, opened) == (["Hel", "lo"], 2)


# --- cancellation -----------------------------------------------------------------


@pytest.mark.parametrize("cancel", [KeyboardInterrupt, SystemExit, asyncio.CancelledError])
def test_cancellation_propagates_through_retrying_untouched(cancel: type[BaseException]) -> None:
    fake = FakeTime()
    failure = cancel()
    with pytest.raises(cancel) as caught:
        run(policy(fake, retry_on=BaseException), [failure])
    assert caught.value is failure
    assert fake.sleeps == []


def test_hooks_cannot_make_cancellation_retryable() -> None:
    retry_policy = RetryPolicy(
        classifier=lambda exc: ErrorInfo(kind=ErrorKind.SERVER, retryable=True),
        retry_on=BaseException,
    )
    assert retry_policy.is_retryable(ValueError())
    for cancel in (KeyboardInterrupt(), concurrent.futures.CancelledError()):
        assert retry_policy.classify(cancel).kind is ErrorKind.CANCELLED
        assert not retry_policy.is_retryable(cancel)


def test_closing_a_generator_mid_attempt_is_not_retried() -> None:
    fake = FakeTime()
    attempts = 0

    def turn() -> Generator[str, None, None]:
        nonlocal attempts
        for attempt in policy(fake).retrying():
            with attempt:
                attempts += 1
                yield "chunk"
                yield "more"

    gen = turn()
    assert next(gen) == "chunk"
    gen.close()  # GeneratorExit inside the attempt
    assert (attempts, fake.sleeps) == (1, [])


async def test_async_retrying_awaits_the_async_sleep() -> None:
    fake = FakeTime()

    def forbidden(seconds: float) -> None:
        raise AssertionError("the async path must not block")

    retry_policy = policy(fake, sleep=forbidden)
    assert await arun(
        retry_policy, [status_error(529), status_error(429, {"retry-after": "9"})]
    ) == (
        3,
        "ok",
    )
    assert fake.sleeps == [2.0, 9.0]


async def test_async_cancellation_propagates_through_async_retrying() -> None:
    fake = FakeTime()
    failure = asyncio.CancelledError()
    with pytest.raises(asyncio.CancelledError) as caught:
        await arun(policy(fake), [failure])
    assert caught.value is failure
    assert fake.sleeps == []


async def test_cancelling_during_backoff_stops_the_retry_loop() -> None:
    started = asyncio.Event()
    calls = 0

    async def never(seconds: float) -> None:
        started.set()
        await asyncio.Event().wait()

    async def loop() -> None:
        nonlocal calls
        async for attempt in RetryPolicy(async_sleep=never).async_retrying():
            with attempt:
                calls += 1
                raise openai.APIConnectionError(
                    request=httpx2.Request("POST", "https://provider.test")
                )

    task = asyncio.create_task(loop())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert calls == 1


# --- the decision API (after output) ---------------------------------------------------


def test_before_output_budget_counts_total_attempts() -> None:
    p = RetryPolicy(jitter=0.0)
    exc = status_error(500)
    decisions = [
        p.should_retry(exc, attempt=n, elapsed=0, phase=RetryPhase.BEFORE_OUTPUT) for n in (1, 2, 3)
    ]
    assert [d.retry for d in decisions] == [True, True, False]
    assert [d.delay for d in decisions] == [0.5, 1.0, 0.0]
    assert "max_attempts=3" in decisions[2].reason


def test_after_output_budget_counts_continuations() -> None:
    p = RetryPolicy(jitter=0.0, max_continuations=2)
    exc = httpx2.RemoteProtocolError("peer closed connection")
    decisions = [
        p.should_retry(exc, attempt=n, elapsed=0, phase=RetryPhase.AFTER_OUTPUT) for n in (1, 2, 3)
    ]
    assert [d.retry for d in decisions] == [True, True, False]
    assert "max_continuations=2" in decisions[2].reason
    assert decisions[0].error.kind is ErrorKind.CONNECTION


def test_zero_continuations_never_continues() -> None:
    decision = RetryPolicy(max_continuations=0).should_retry(
        TimeoutError(), attempt=1, elapsed=0, phase=RetryPhase.AFTER_OUTPUT
    )
    assert not decision.retry


def test_mid_stream_hint_is_honoured_and_capped() -> None:
    p = RetryPolicy(jitter=0.0)
    exc = status_error(429, {"retry-after": "90"})
    decision = p.should_retry(exc, attempt=1, elapsed=0, phase=RetryPhase.AFTER_OUTPUT)
    assert (decision.retry, decision.delay) == (True, 60.0)


def test_deadline_refuses_a_continuation_that_would_start_too_late() -> None:
    p = RetryPolicy(jitter=0.0, deadline=10.0)
    exc = status_error(503)
    early = p.should_retry(exc, attempt=1, elapsed=7.0, phase=RetryPhase.AFTER_OUTPUT)
    late = p.should_retry(exc, attempt=1, elapsed=8.5, phase=RetryPhase.AFTER_OUTPUT)
    assert (early.retry, early.delay) == (True, 2.0)
    assert not late.retry
    assert "deadline" in late.reason


def test_permanent_and_cancelled_failures_are_never_continued() -> None:
    p = RetryPolicy(retry_on=BaseException)
    for exc in (status_error(401), asyncio.CancelledError(), KeyboardInterrupt()):
        decision = p.should_retry(exc, attempt=1, elapsed=0, phase=RetryPhase.AFTER_OUTPUT)
        assert (decision.retry, decision.delay) == (False, 0.0)
        assert "not retryable" in decision.reason
