"""Step a: a 429 with a retry hint before any output, retried after the hint."""

from __future__ import annotations

from awaken_langchain.demo.conversation import A_RATE, Q_RATE
from awaken_langchain.demo.stage import Stage, Step, StepResult, index_of, is_token
from awaken_langchain.testing.server import Fault

RETRY_HINT = 2.0
"""The 429's retry hint at speed 1, in seconds."""


class RateLimitStep(Step):
    """Step a: the provider answers the first request 429 with a retry hint."""

    title = "429 with a retry hint, before output"
    short_title = "429 + hint"
    question = Q_RATE
    answer = A_RATE

    def run(self, stage: Stage, result: StepResult) -> None:
        """A 429 with a retry hint before any output: retried after the hint."""
        hint = RETRY_HINT / stage.speed
        stage.model.schedule(
            Q_RATE,
            Fault.rate_limited(retry_after_ms=max(1, round(hint * 1000))),
        )
        stage.screen.heading(
            "a. HTTP 429 with a retry hint, before any output",
            f"The provider answers the first request 429 with retry-after-ms: {hint * 1000:.0f}.",
        )
        stage.turn(result, Q_RATE)

    def verify(self, stage: Stage, result: StepResult) -> None:
        """Check step a against the facts."""
        requests = result.requests
        first = requests[0] if requests else None
        fault = first.scenario.fault if first is not None and first.scenario else None
        hint = RETRY_HINT / stage.speed
        result.check(
            "the provider answered the first request 429 with a retry hint",
            fault is not None and fault.status == 429 and "retry-after-ms" in fault.headers,
        )
        retries = result.events("awaken_retry")
        result.check(
            "the wrapper waited at least the hinted time, then retried",
            len(retries) == 1
            and float(retries[0].get("delay") or 0) >= hint - 1e-6
            and result.waited() >= hint - 1e-6,
            f"hint {hint:.3f} s, waited {result.waited():.3f} s",
        )
        retry_at = index_of(result.records, lambda r: r.get("name") == "awaken_retry")
        first_token = index_of(result.records, is_token)
        result.check(
            "the retry happened before any output reached the caller",
            retry_at != -1 and (first_token == -1 or retry_at < first_token),
        )
        result.check(
            "the retry sent the very same request again",
            len(requests) == 2 and requests[0].messages == requests[1].messages,
            f"{len(requests)} requests",
        )
        result.check("the answer arrived whole", result.text() == A_RATE)
