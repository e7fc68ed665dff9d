"""RetryPolicy: budgets, backoff, hints, deadline and cancellation, with injected time.

Rules about what a caller sees run through `RecoveringChatModel` around the
scripted chat model; the decision API is also exercised directly.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import email.utils
import logging
import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx2
import openai
import pytest
from anthropic._error_classes import make_status_error as anthropic_status_error

from awaken_langchain import ErrorInfo, ErrorKind, RetryPolicy, StreamInterruptedError
from awaken_langchain.model import RecoveringChatModel
from awaken_langchain.retry import RetryPhase
from awaken_langchain.testing.scripted import ScriptedChatModel, finish, text
from tests.conftest import Drive

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


ANSWER = [*text("All good."), finish()]


def wrap(
    retry_policy: RetryPolicy, *scripts: list[Any]
) -> tuple[RecoveringChatModel, ScriptedChatModel]:
    """A recovering model around a scripted one: each script is one request's answer."""
    inner = ScriptedChatModel(scripts=list(scripts))
    return RecoveringChatModel(model=inner, retry_policy=retry_policy), inner


def retry_before_output(retry_policy: RetryPolicy, attempt: Callable[[], Any]) -> Any:
    """Call ``attempt`` until it returns, as `RetryPolicy.should_retry` decides."""
    started, failures = retry_policy.clock(), 0
    while True:
        try:
            return attempt()
        except Exception as exc:
            failures += 1
            decision = retry_policy.should_retry(
                exc,
                attempt=failures,
                elapsed=retry_policy.clock() - started,
                phase=RetryPhase.BEFORE_OUTPUT,
            )
            if not decision.retry:
                raise
            retry_policy.sleep(decision.delay)


# --- configuration -----------------------------------------------------------------


def test_defaults_match_the_documented_policy() -> None:
    p = RetryPolicy()
    assert (
        p.max_attempts,
        p.max_continuations,
        p.max_retry_after,
        p.deadline,
        p.overload_deadline,
    ) == (3, 3, 60.0, None, 300.0)
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
        ({"overload_deadline": -5}, ValueError, "overload_deadline"),
        ({"overload_deadline": "5m"}, TypeError, "overload_deadline"),
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


# --- retrying a turn before output -------------------------------------------------


async def test_retry_after_of_an_hour_waits_sixty_seconds(drive: Drive) -> None:
    fake = FakeTime()
    limited = status_error(429, {"retry-after": "3600"})
    model, inner = wrap(policy(fake), [limited], [limited], ANSWER)
    assert (await drive.invoke(model, "hi")).content == "All good."
    assert len(inner.calls) == 3
    assert fake.sleeps == [60.0, 60.0]


async def test_max_retry_after_is_configurable(drive: Drive) -> None:
    fake = FakeTime()
    limited = status_error(429, {"retry-after": "3600"})
    model, _ = wrap(policy(fake, max_retry_after=5), [limited], ANSWER)
    await drive.invoke(model, "hi")
    assert fake.sleeps == [5.0]


async def test_http_date_hint_is_parsed_against_the_injected_wall_clock(drive: Drive) -> None:
    fake = FakeTime()
    date = email.utils.formatdate(NOW + 30, usegmt=True)
    model, _ = wrap(policy(fake), [status_error(429, {"retry-after": date})], ANSWER)
    await drive.invoke(model, "hi")
    assert fake.sleeps == [30.0]


async def test_retry_after_ms_hint_is_honoured(drive: Drive) -> None:
    fake = FakeTime()
    model, _ = wrap(policy(fake), [status_error(429, {"retry-after-ms": "1500"})], ANSWER)
    await drive.invoke(model, "hi")
    assert fake.sleeps == [1.5]


async def test_overloaded_response_waits_longer_than_a_server_error(drive: Drive) -> None:
    overloaded, server = FakeTime(), FakeTime()
    for fake, failure in ((overloaded, status_error(529)), (server, status_error(500))):
        model, _ = wrap(policy(fake), [failure], ANSWER)
        await drive.invoke(model, "hi")
    assert (overloaded.sleeps, server.sleeps) == ([2.0], [0.5])


async def test_retryable_failures_are_retried_until_max_attempts_then_the_last_is_the_cause(
    drive: Drive,
) -> None:
    fake = FakeTime()
    failures = [status_error(500), status_error(502), status_error(504)]
    model, inner = wrap(policy(fake), *([failure] for failure in failures), ANSWER)
    with pytest.raises(StreamInterruptedError, match="max_attempts=3") as raised:
        await drive.invoke(model, "hi")
    assert raised.value.cause is failures[2]
    assert len(inner.calls) == 3
    assert fake.sleeps == [0.5, 1.0]


@pytest.mark.parametrize("status", [400, 401, 403, 404, 413])
async def test_permanent_errors_are_tried_exactly_once(drive: Drive, status: int) -> None:
    fake = FakeTime()
    failure = status_error(status)
    model, inner = wrap(policy(fake), [failure], ANSWER)
    with pytest.raises(anthropic.APIStatusError) as raised:
        await drive.invoke(model, "hi")
    assert raised.value is failure
    assert (len(inner.calls), fake.sleeps) == (1, [])


async def test_deadline_stops_retries_before_a_wait_that_would_pass_it(drive: Drive) -> None:
    fake = FakeTime()
    retry_policy = policy(fake, initial_delay=2.0, max_attempts=10, deadline=5.0)
    failures = [status_error(500) for _ in range(10)]
    model, inner = wrap(retry_policy, *([failure] for failure in failures))
    with pytest.raises(StreamInterruptedError, match="deadline") as raised:
        await drive.invoke(model, "hi")
    # request 1 fails at t=0 (wait 2), request 2 at t=2 (wait 4 -> t=6 > 5): stop.
    assert fake.sleeps == [2.0]
    assert len(inner.calls) == 2
    assert raised.value.cause is failures[1]


async def test_deadline_counts_from_the_start_of_the_turn(drive: Drive) -> None:
    fake = FakeTime()
    fake.now = 100.0
    model, inner = wrap(
        policy(fake, deadline=5.0), [*text("Hello, world"), ConnectionResetError("reset")], ANSWER
    )
    chunks = drive.iterate(model, "hi")
    await anext(chunks)
    fake.now += 4.8  # the caller read slowly: 4.8 s of the turn are gone
    with pytest.raises(StreamInterruptedError, match="deadline"):
        async for _ in chunks:
            pass
    assert (len(inner.calls), fake.sleeps) == (1, [])  # waiting 0.5 s would end past it


async def test_message_saying_rate_limit_without_structure_is_not_retried(drive: Drive) -> None:
    fake = FakeTime()
    failure = RuntimeError("Error 429: rate limit exceeded, please retry")
    model, inner = wrap(policy(fake), [failure], ANSWER)
    with pytest.raises(RuntimeError) as raised:
        await drive.invoke(model, "hi")
    assert raised.value is failure
    assert (len(inner.calls), fake.sleeps) == (1, [])


async def test_retry_on_types_make_unknown_exceptions_retryable(drive: Drive) -> None:
    retry_policy = policy(FakeTime(), retry_on=(LookupError,))
    model, inner = wrap(retry_policy, [KeyError("flaky")], ANSWER)
    assert (await drive.invoke(model, "hi")).content == "All good."
    assert len(inner.calls) == 2


async def test_retry_on_predicate_is_consulted_for_unknown_exceptions_only(drive: Drive) -> None:
    seen: list[BaseException] = []

    def always(exc: BaseException) -> bool:
        seen.append(exc)
        return True

    model, inner = wrap(
        policy(FakeTime(), retry_on=always), [RuntimeError("flaky")], ANSWER, [status_error(401)]
    )
    assert (await drive.invoke(model, "hi")).content == "All good."
    with pytest.raises(anthropic.AuthenticationError):
        await drive.invoke(model, "again")
    assert len(inner.calls) == 3
    assert [type(e) for e in seen] == [RuntimeError]


async def test_classifier_hook_overrides_and_defers(drive: Drive) -> None:
    fake = FakeTime()

    def classifier(exc: BaseException) -> ErrorInfo | None:
        if isinstance(exc, ValueError):
            return ErrorInfo(kind=ErrorKind.SERVER, retryable=True, retry_after=4)
        return None

    retry_policy = policy(fake, classifier=classifier)
    model, inner = wrap(retry_policy, [ValueError("custom transient")], ANSWER, [status_error(401)])
    assert (await drive.invoke(model, "hi")).content == "All good."
    assert fake.sleeps == [4.0]
    with pytest.raises(anthropic.AuthenticationError):
        await drive.invoke(model, "again")
    assert len(inner.calls) == 3
    assert retry_policy.classify(status_error(401)).kind is ErrorKind.AUTHENTICATION


def test_classifier_returning_garbage_is_reported() -> None:
    retry_policy = RetryPolicy(classifier=lambda exc: "retry please")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="classifier"):
        retry_policy.classify(ValueError())


def test_half_consumed_generator_is_retried_by_opening_a_new_one() -> None:
    fake = FakeTime()
    opened = 0

    def provider_stream() -> Iterator[str]:
        nonlocal opened
        opened += 1
        if opened == 1:
            raise httpx2.RemoteProtocolError("peer closed connection before headers")
        yield from ["Hel", "lo"]

    def first_chunk() -> tuple[str, Iterator[str]]:
        stream = provider_stream()
        return next(stream), stream  # retried only until the first chunk arrives

    head, rest = retry_before_output(policy(fake), first_chunk)
    assert ([head, *rest], opened) == (["Hel", "lo"], 2)
    assert fake.sleeps == [0.5]


# --- cancellation -----------------------------------------------------------------


@pytest.mark.parametrize("cancel", [KeyboardInterrupt, SystemExit, asyncio.CancelledError])
def test_cancellation_propagates_untouched_and_is_never_retried(
    cancel: type[BaseException],
) -> None:
    # The sync path: KeyboardInterrupt escaping a task would stop the test's event loop.
    fake = FakeTime()
    failure = cancel()
    model, inner = wrap(policy(fake, retry_on=BaseException), [failure], ANSWER)
    with pytest.raises(cancel) as raised:
        model.invoke("hi")
    assert raised.value is failure
    assert (len(inner.calls), fake.sleeps) == (1, [])


async def test_async_cancellation_propagates_untouched_and_is_never_retried() -> None:
    fake = FakeTime()
    failure = asyncio.CancelledError()
    model, inner = wrap(policy(fake, retry_on=BaseException), [failure], ANSWER)
    with pytest.raises(asyncio.CancelledError) as raised:
        _ = [chunk async for chunk in model.astream("hi")]
    assert raised.value is failure
    assert (len(inner.calls), fake.sleeps) == (1, [])


def test_hooks_cannot_make_cancellation_retryable() -> None:
    retry_policy = RetryPolicy(
        classifier=lambda exc: ErrorInfo(kind=ErrorKind.SERVER, retryable=True),
        retry_on=BaseException,
    )
    assert retry_policy.is_retryable(ValueError())
    for cancel in (KeyboardInterrupt(), concurrent.futures.CancelledError()):
        assert retry_policy.classify(cancel).kind is ErrorKind.CANCELLED
        assert not retry_policy.is_retryable(cancel)


async def test_closing_the_stream_mid_attempt_is_not_retried(drive: Drive) -> None:
    fake = FakeTime()
    model, inner = wrap(policy(fake), [*text("Hello, world"), finish()], ANSWER)
    chunks = drive.iterate(model, "hi")
    await anext(chunks)
    await chunks.aclose()  # GeneratorExit inside the attempt
    assert (len(inner.calls), fake.sleeps) == (1, [])


async def test_async_turn_awaits_the_async_sleep() -> None:
    fake = FakeTime()

    def forbidden(seconds: float) -> None:
        raise AssertionError("the async path must not block")

    model, inner = wrap(
        policy(fake, sleep=forbidden),
        [status_error(529)],
        [status_error(429, {"retry-after": "9"})],
        ANSWER,
    )
    chunks = [chunk async for chunk in model.astream("hi")]
    assert "".join(str(chunk.content) for chunk in chunks) == "All good."
    assert len(inner.calls) == 3
    assert fake.sleeps == [2.0, 9.0]


async def test_cancelling_during_backoff_stops_the_turn() -> None:
    started = asyncio.Event()

    async def never(seconds: float) -> None:
        started.set()
        await asyncio.Event().wait()

    failure = openai.APIConnectionError(request=httpx2.Request("POST", "https://provider.test"))
    model, inner = wrap(RetryPolicy(async_sleep=never), [failure], ANSWER)

    async def turn() -> list[Any]:
        return [chunk async for chunk in model.astream("hi")]

    task = asyncio.create_task(turn())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(inner.calls) == 1


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


# --- overload windows: a time budget past the attempt count -----------------------------


async def test_an_overloaded_provider_is_retried_past_max_attempts_within_overload_deadline(
    drive: Drive,
) -> None:
    fake = FakeTime()
    overloaded = [[status_error(529)] for _ in range(20)]
    model, inner = wrap(policy(fake), *overloaded, ANSWER)
    message = await drive.invoke(model, "hi")
    assert message.text == "All good."
    assert len(inner.calls) == 21
    assert fake.sleeps == [2.0, 4.0, *[8.0] * 18]  # backoff still capped at max_delay
    assert message.response_metadata["awaken"]["retries"] == 20


async def test_overload_deadline_stops_a_retry_whose_wait_would_pass_it(drive: Drive) -> None:
    fake = FakeTime()
    failures = [status_error(529) for _ in range(30)]
    model, inner = wrap(policy(fake, overload_deadline=30.0), *([f] for f in failures))
    with pytest.raises(StreamInterruptedError, match=re.escape("overload_deadline=30.0")) as raised:
        await drive.invoke(model, "hi")
    assert fake.sleeps == [2.0, 4.0, 8.0, 8.0, 8.0]  # 30 s: a sixth wait of 8 s would pass it
    assert len(inner.calls) == 6
    assert raised.value.cause is failures[5]


async def test_a_rate_limit_hint_past_max_attempts_is_still_capped_by_max_retry_after(
    drive: Drive,
) -> None:
    fake = FakeTime()
    limited = [status_error(429, {"retry-after": "3600"}) for _ in range(10)]
    model, inner = wrap(policy(fake), *([f] for f in limited))
    with pytest.raises(StreamInterruptedError, match="overload_deadline"):
        await drive.invoke(model, "hi")
    assert fake.sleeps == [60.0] * 5  # the sixth wait would end past 300 s
    assert len(inner.calls) == 6


async def test_deadline_wins_over_overload_deadline(drive: Drive) -> None:
    fake = FakeTime()
    failures = [[status_error(529)] for _ in range(10)]
    model, inner = wrap(policy(fake, deadline=10.0), *failures)
    with pytest.raises(StreamInterruptedError, match=re.escape("RetryPolicy.deadline=10.0")):
        await drive.invoke(model, "hi")
    assert fake.sleeps == [2.0, 4.0]
    assert len(inner.calls) == 3


async def test_overload_deadline_none_stops_overload_at_max_attempts(drive: Drive) -> None:
    fake = FakeTime()
    failures = [[status_error(529)] for _ in range(5)]
    model, inner = wrap(policy(fake, overload_deadline=None), *failures)
    with pytest.raises(StreamInterruptedError, match="max_attempts=3"):
        await drive.invoke(model, "hi")
    assert len(inner.calls) == 3


async def test_overload_after_output_is_continued_past_max_continuations(drive: Drive) -> None:
    fake = FakeTime()
    overloaded_event = status_error(
        200, body={"type": "error", "error": {"type": "overloaded_error"}}
    )
    pieces = ["One", " two", " three", " four", " five"]
    scripts = [[*text(piece), overloaded_event] for piece in pieces]
    model, inner = wrap(policy(fake, max_continuations=2), *scripts, [*text(" six."), finish()])
    message = await drive.invoke(model, "count")
    assert message.text == "One two three four five six."
    assert len(inner.calls) == 6
    assert message.response_metadata["awaken"]["continuations"] == 5


def test_other_retryable_errors_stop_at_the_attempt_count_despite_overload_deadline() -> None:
    p = RetryPolicy(jitter=0.0)
    decision = p.should_retry(
        status_error(500), attempt=3, elapsed=0.0, phase=RetryPhase.BEFORE_OUTPUT
    )
    assert not decision.retry
    assert "max_attempts=3" in decision.reason
    overloaded = p.should_retry(
        status_error(529), attempt=3, elapsed=0.0, phase=RetryPhase.BEFORE_OUTPUT
    )
    assert overloaded.retry
    assert "overload_deadline=300.0" in overloaded.reason


# --- logging -------------------------------------------------------------------------


def test_recovery_log_records_carry_the_event_as_structured_fields(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = FakeTime()
    model, _ = wrap(policy(fake), [status_error(529)], ANSWER)
    run_id = uuid.uuid4()
    with caplog.at_level(logging.INFO, logger="awaken_langchain"):
        model.invoke("hi", config={"run_id": run_id})
    [record] = [r for r in caplog.records if getattr(r, "awaken_event", None) == "awaken_retry"]
    assert record.name == "awaken_langchain.events"
    assert record.levelno == logging.INFO
    fields = {name: value for name, value in vars(record).items() if name.startswith("awaken_")}
    assert fields == {
        "awaken_event": "awaken_retry",
        "awaken_run_id": str(run_id),
        "awaken_key": str(run_id),  # the checkpoint key: the caller's run id here
        "awaken_plan": "R4",
        "awaken_cause": "overloaded",
        "awaken_status_code": 529,
        "awaken_retry_after": None,
        "awaken_delay": 2.0,
        "awaken_attempt": 1,
        "awaken_error": fields["awaken_error"],
        "awaken_chars_so_far": 0,
    }
    assert "529" in fields["awaken_error"]


def test_the_package_logger_is_silent_until_the_application_configures_logging() -> None:
    handlers = logging.getLogger("awaken_langchain").handlers
    assert any(isinstance(h, logging.NullHandler) for h in handlers)
