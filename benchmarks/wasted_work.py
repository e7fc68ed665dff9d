"""Wasted work: continuing an interrupted answer against restarting it or losing it.

On the loopback provider (``awaken_langchain.testing.LoopbackProvider``) with
``ChatOpenAI``, an answer of 2 000 tokens (four-character deltas, one event
every ``--event-delay`` seconds, standing in for the model's generation speed)
is cut by a dropped connection after 10 %, 50 % and 90 % of it. Three ways to
deal with it:

- **continuation**: ``RecoveringChatModel(model=ChatOpenAI(...))`` sends a
  continuation request with the prefix; the provider generates only the rest;
- **restart**: the request is sent again from scratch, which is what
  ``with_retry``, SDK retries or a re-run LangGraph node do (here
  ``ChatOpenAI(streaming=True).with_retry(...)``);
- **no recovery**: the error reaches the caller and the turn is lost.

The provider is scripted to continue faithfully: a continuation request is
answered with the rest of the answer after the prefix it carries. Output
tokens generated are counted on the server side (the deltas it sent, at four
characters per token); backoff is excluded for both retrying strategies. The
time is from the first request to the complete answer.

Run: ``python -m benchmarks.wasted_work [--tokens 2000] [--event-delay 0.001]``
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script from a clone
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from langchain_openai import ChatOpenAI

from awaken_langchain import RecoveringChatModel, RetryPolicy
from awaken_langchain.recovery import estimate_tokens
from awaken_langchain.testing import (
    Fault,
    FaultKind,
    LoopbackProvider,
    RecordedRequest,
    Scenario,
)
from benchmarks._common import TOKEN, answer_for, machine_line, table

QUESTION = "Explain recovery at length."
STRATEGIES = ("continuation", "restart", "no recovery")


@dataclass
class Row:
    """What one strategy cost at one interruption point."""

    fraction: float
    strategy: str
    requests: int
    generated_tokens: int
    seconds: float
    complete: bool


def _continuing_responder(answer: str, chunk: int, delay: float) -> object:
    """Answer a continuation request with the rest of ``answer`` after its prefix."""

    def respond(request: RecordedRequest) -> Scenario:
        prefix = ""
        for message in request.messages:
            if message.get("role") == "assistant":
                prefix = str(message.get("content") or "")
        if not answer.startswith(prefix):
            raise AssertionError("the continuation prefix is not the start of the answer")
        return Scenario(text=answer[len(prefix) :], chunk_size=chunk, delay=delay)

    return respond


def _generated_tokens(requests: list[RecordedRequest]) -> int:
    """Output tokens the provider sent, over every request."""
    chars = 0
    for request in requests:
        scenario = request.scenario
        if scenario is None:
            continue
        pieces = scenario.text_pieces()
        fault = scenario.fault
        if fault is not None and fault.kind is FaultKind.DROP_AFTER_EVENTS:
            pieces = pieces[: max(0, fault.count - 1)]  # the first event is the role chunk
        chars += sum(len(p) for p in pieces)
    return estimate_tokens(chars)


def run(strategy: str, fraction: float, tokens: int, delay: float) -> Row:
    """Stream the answer once with ``strategy``, cut at ``fraction`` of it."""
    chunk = len(TOKEN)
    answer = answer_for("answer", tokens * chunk)
    cut = round(fraction * tokens)
    first = Scenario(
        text=answer, chunk_size=chunk, delay=delay, fault=Fault.drop_after_events(1 + cut)
    )
    with LoopbackProvider(
        [first],
        default=_continuing_responder(answer, chunk, delay),  # type: ignore[arg-type]
    ) as server:
        openai = ChatOpenAI(
            model="gpt-4o-mini",
            base_url=server.base_url_openai,
            api_key="loopback",  # type: ignore[arg-type]
            max_retries=0,
            streaming=True,
        )
        text = ""
        start = time.perf_counter()
        if strategy == "continuation":
            model = RecoveringChatModel(
                model=openai, retry_policy=RetryPolicy(sleep=lambda _s: None)
            )
            text = "".join(str(c.content) for c in model.stream(QUESTION))
        elif strategy == "restart":
            retrying = openai.with_retry(stop_after_attempt=2, wait_exponential_jitter=False)
            text = str(retrying.invoke(QUESTION).content)
        else:
            try:
                for c in openai.stream(QUESTION):
                    text += str(c.content)
            except Exception:
                pass  # the turn is lost
        seconds = time.perf_counter() - start
        requests = server.requests
    complete = text == answer
    if strategy != "no recovery" and not complete:
        raise RuntimeError(f"{strategy} at {fraction:.0%} did not deliver the whole answer")
    return Row(fraction, strategy, len(requests), _generated_tokens(requests), seconds, complete)


def main(
    tokens: int = 2_000, fractions: tuple[float, ...] = (0.1, 0.5, 0.9), delay: float = 0.001
) -> list[Row]:
    """Run every strategy at every interruption point, print a table, return the rows."""
    rows = [run(s, f, tokens, delay) for f in fractions for s in STRATEGIES]
    print(
        f"## Wasted work: {tokens:,}-token answer, one event per {delay * 1e3:g} ms, "
        f"ChatOpenAI on the loopback provider; {machine_line()}"
    )
    by_point = {(r.fraction, r.strategy): r for r in rows}
    print(
        table(
            [
                "cut at",
                "strategy",
                "requests",
                "output tokens",
                "tokens vs answer",
                "time to answer s",
                "time vs continuation",
            ],
            [
                (
                    f"{r.fraction:.0%}",
                    r.strategy,
                    r.requests,
                    r.generated_tokens,
                    f"{r.generated_tokens / tokens:.2f}x",
                    r.seconds if r.complete else "lost",
                    f"{r.seconds / by_point[r.fraction, 'continuation'].seconds:.2f}x"
                    if r.complete
                    else "-",
                )
                for r in rows
            ],
        )
    )
    print()
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2_000, help="tokens in the answer")
    parser.add_argument(
        "--fractions", type=float, nargs="+", default=[0.1, 0.5, 0.9], help="cut points"
    )
    parser.add_argument("--event-delay", type=float, default=0.001, help="seconds per event")
    args = parser.parse_args()
    main(args.tokens, tuple(args.fractions), args.event_delay)
