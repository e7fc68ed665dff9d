"""Wasted work: continuing an interrupted answer against restarting it or losing it.

On the loopback provider (``awaken_langchain.testing.LoopbackProvider``) with
``ChatOpenAI``, an answer of 2 000 tokens (four-character deltas, one event
every ``--event-delay`` seconds, standing in for the model's generation speed)
is cut by a dropped connection after 10 %, 50 % and 90 % of it. Four ways to
deal with it:

- **provider resume**: ``RecoveringChatModel(model=ChatOpenAI(use_responses_api=True),
  provider_resume=True)`` creates the response in background mode; the
  provider goes on generating after the drop, and the wrapper resumes its
  stream after the last event received (Responses API; the loopback provider
  generates a background response at the scenario's pace whether or not a
  client reads it);
- **continuation**: ``RecoveringChatModel(model=ChatOpenAI(...))`` sends a
  continuation request with the prefix; the provider generates only the rest;
- **restart**: the request is sent again from scratch, which is what
  ``with_retry``, SDK retries or a re-run LangGraph node do (here
  ``ChatOpenAI(streaming=True).with_retry(...)``);
- **no recovery**: the error reaches the caller and the turn is lost.

The provider is scripted to continue faithfully: a continuation request is
answered with the rest of the answer after the prefix it carries. Output
tokens generated are counted on the server side (the deltas it sent, at four
characters per token); backoff is excluded for the retrying strategies. The
time is from the first request to the complete answer, and is compared with the
uncut stream of the same API (Chat Completions, or Responses for provider
resume), measured in the same run. *Regenerated* counts output tokens the
provider made beyond the answer; *prefix re-sent* counts the answer tokens a
strategy sent back to the provider as input.

Run: ``python -m benchmarks.wasted_work [--tokens 2000] [--event-delay 0.001] [--repeat 3]``
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
STRATEGIES = ("provider resume", "continuation", "restart", "no recovery")
_RESPONSES_PREAMBLE = 4
"""Responses API events before the first text delta (created, in_progress, item and part added)."""


@dataclass
class Row:
    """What one strategy cost at one interruption point."""

    fraction: float
    strategy: str
    requests: int
    generated_tokens: int
    seconds: float
    complete: bool
    resent_tokens: int = 0
    """Answer tokens sent back to the provider as input (a continuation's prefix)."""


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


def _responses_chat(server: LoopbackProvider, **kwargs: Any) -> ChatOpenAI:
    return ChatOpenAI(
        model="gpt-5-mini",
        base_url=server.base_url_openai,
        api_key="loopback",  # type: ignore[arg-type]
        max_retries=0,
        use_responses_api=True,
        **kwargs,
    )


def uncut(api: str, tokens: int, delay: float) -> float:
    """Seconds to stream the whole answer without a fault with the bare model.

    ``api`` is ``chat`` (Chat Completions) or ``responses`` (a background response,
    as provider resume creates it).
    """
    chunk = len(TOKEN)
    answer = answer_for("answer", tokens * chunk)
    with LoopbackProvider([Scenario(text=answer, chunk_size=chunk, delay=delay)]) as server:
        if api == "responses":
            model = _responses_chat(server, store=True, model_kwargs={"background": True})
        else:
            model = ChatOpenAI(
                model="gpt-4o-mini",
                base_url=server.base_url_openai,
                api_key="loopback",  # type: ignore[arg-type]
                max_retries=0,
                streaming=True,
            )
        start = time.perf_counter()
        text = "".join(c.text for c in model.stream(QUESTION))
        seconds = time.perf_counter() - start
    if text != answer:
        raise RuntimeError(f"the uncut {api} stream did not deliver the whole answer")
    return seconds


def run_provider_resume(fraction: float, tokens: int, delay: float) -> Row:
    """Stream the answer through the Responses API in background mode, cut at ``fraction``."""
    chunk = len(TOKEN)
    answer = answer_for("answer", tokens * chunk)
    cut = round(fraction * tokens)
    first = Scenario(
        text=answer,
        chunk_size=chunk,
        delay=delay,
        fault=Fault.drop_after_events(_RESPONSES_PREAMBLE + cut),
    )
    with LoopbackProvider([first]) as server:
        model = RecoveringChatModel(
            model=_responses_chat(server),
            provider_resume=True,
            retry_policy=RetryPolicy(sleep=lambda _s: None),
        )
        start = time.perf_counter()
        text = "".join(c.text for c in model.stream(QUESTION))
        seconds = time.perf_counter() - start
        created = server.requests_for("openai-responses")
        requests = len(server.requests)
    if text != answer or len(created) != 1:
        raise RuntimeError(f"provider resume at {fraction:.0%} did not deliver the answer once")
    # a background response is generated whole, once; its retrieval generates nothing
    generated = estimate_tokens(sum(len(p) for p in first.text_pieces()))
    return Row(fraction, "provider resume", requests, generated, seconds, True)


def run(strategy: str, fraction: float, tokens: int, delay: float) -> Row:
    """Stream the answer once with ``strategy``, cut at ``fraction`` of it."""
    if strategy == "provider resume":
        return run_provider_resume(fraction, tokens, delay)
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
    resent = cut if strategy == "continuation" else 0
    generated = _generated_tokens(requests)
    return Row(fraction, strategy, len(requests), generated, seconds, complete, resent)


def main(
    tokens: int = 2_000,
    fractions: tuple[float, ...] = (0.1, 0.5, 0.9),
    delay: float = 0.001,
    repeat: int = 3,
) -> list[Row]:
    """Run every strategy at every interruption point, print a table, return the rows.

    Each run is repeated ``repeat`` times, interleaved with the uncut runs of both
    APIs; times are medians.
    """
    for api in ("chat", "responses"):  # warm up: the first call of a process sets things up
        uncut(api, 50, 0.0)
    run_provider_resume(0.5, 50, 0.0)
    rows: list[Row] = []
    reference: dict[tuple[float, str], float] = {}
    for fraction in fractions:  # each cut point is compared with uncut runs next to it
        times: dict[str, list[float]] = {}
        first: dict[str, Row] = {}
        for _ in range(repeat):
            for api in ("chat", "responses"):
                times.setdefault(api, []).append(uncut(api, tokens, delay))
            for strategy in STRATEGIES:
                row = run(strategy, fraction, tokens, delay)
                first.setdefault(strategy, row)
                times.setdefault(strategy, []).append(row.seconds)
        for api in ("chat", "responses"):
            reference[fraction, api] = statistics.median(times[api])
        rows += [
            dataclasses.replace(first[s], seconds=statistics.median(times[s])) for s in STRATEGIES
        ]
    print(
        f"## Wasted work: {tokens:,}-token answer, one event per {delay * 1e3:g} ms, "
        f"ChatOpenAI on the loopback provider; median of {repeat} runs; {machine_line()}"
    )
    for fraction in fractions:
        print(
            f"uncut stream next to the {fraction:.0%} cut: "
            f"{reference[fraction, 'chat']:.3f} s (Chat Completions), "
            f"{reference[fraction, 'responses']:.3f} s (Responses, background)"
        )
    by_point = {(r.fraction, r.strategy): r for r in rows}

    def uncut_of(row: Row) -> float:
        api = "responses" if row.strategy == "provider resume" else "chat"
        return reference[row.fraction, api]

    print(
        table(
            [
                "cut at",
                "strategy",
                "requests",
                "output tokens",
                "tokens vs answer",
                "regenerated",
                "prefix re-sent",
                "time to answer s",
                "time vs uncut",
                "time vs continuation",
            ],
            [
                (
                    f"{r.fraction:.0%}",
                    r.strategy,
                    r.requests,
                    r.generated_tokens,
                    f"{r.generated_tokens / tokens:.2f}x",
                    max(0, r.generated_tokens - tokens) if r.complete else "-",
                    r.resent_tokens,
                    r.seconds if r.complete else "lost",
                    f"{r.seconds / uncut_of(r):.2f}x" if r.complete else "-",
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
    parser.add_argument("--repeat", type=int, default=3, help="runs per case (median time)")
    args = parser.parse_args()
    main(args.tokens, tuple(args.fractions), args.event_delay, args.repeat)
