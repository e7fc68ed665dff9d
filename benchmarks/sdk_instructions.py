"""The wrapper around the real ChatOpenAI and ChatAnthropic, counted in instructions.

`benchmarks.sdk_overhead` measures CPU time, which swings by 10 % and more on
a shared machine; `benchmarks.paced_instructions` counts instructions around
a fake inner model that costs a few percent of a real one. This benchmark
counts what a user pays on the real path: the official SDK, its HTTP client,
the SSE parsing and LangChain's chunk handling, with and without the wrapper.

Each case streams one answer of ``"word "`` deltas in its own client process
under valgrind (cachegrind, no cache simulation); the loopback provider runs
in another process, not counted. Every case runs at two answer lengths; the
difference in instructions divided by the difference in chunks is what one
chunk costs, with the interpreter's start-up, the imports and the per-turn
work taken out. Ratios are against the bare integration on the same path
measured in the same run.

Paced cases have the server wait ``1 / rate`` seconds between events, as a
provider does; the client then sleeps between chunks, and its threads and
event loop wake once a chunk. Timer wake-ups and collections make a paced
count vary a little from run to run, so each paced case runs ``--repeats``
times and the median per-chunk figure is reported; every case is also run
with the garbage collector off (``gc.disable()`` before the turn), the
column to compare two versions of the code with.

Cases: the bare integration; the wrapper with no store; with the in-memory
store; with DiskCache; with the file store and Redis (when redis-server is
installed), all at the default checkpoint cadence (`--every-chunks` sets
another; the goal lines then say so).

Needs ``valgrind`` on the ``PATH`` (Debian: ``apt-get install valgrind``).

Run: ``python -m benchmarks.sdk_instructions [--quick] [--short 200] [--long 2000]
[--paced-short 100] [--paced-long 500] [--rate 50] [--repeats 3]
[--provider openai|anthropic] [--path sync|async] [--every-chunks 8]``
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script from a clone
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from awaken_langchain import RecoveringChatModel
from benchmarks._common import (
    CACHEGRIND,
    child_env,
    cores,
    counted_instructions,
    machine_line,
    median,
    redis_server,
    require_valgrind,
    run_child,
    store_names,
    table,
)
from benchmarks.sdk_overhead import loopback_server

EVERY_CHUNKS: int = RecoveringChatModel.model_fields["checkpoint_every_chunks"].default
"""The wrapper's default cadence, at which the goals are set."""

CASES = ("bare", "none", "memory", "diskcache", "file", "redis")
"""``bare`` is the integration alone; the others name the wrapper's store (``none``: no store)."""

LABELS = {
    "bare": "bare integration",
    "none": "wrapper, no store",
    "memory": "wrapper, in-memory store",
    "diskcache": "wrapper, DiskCache",
    "file": "wrapper, file store",
    "redis": "wrapper, Redis",
}


def child(
    provider: str,
    path: str,
    case: str,
    url: str,
    redis_url: str | None,
    collector: bool,
    every_chunks: int = EVERY_CHUNKS,
) -> None:
    """Stream one answer from the loopback server at ``url``; print what was received."""
    from langchain_core.language_models import BaseChatModel

    from benchmarks._common import make_store

    inner: BaseChatModel
    if provider == "openai":
        from langchain_openai import ChatOpenAI

        inner = ChatOpenAI(model="gpt-4o-mini", base_url=url, api_key="x", max_retries=0)
    else:
        from langchain_anthropic import ChatAnthropic

        inner = ChatAnthropic(model="claude-loopback", base_url=url, api_key="x", max_retries=0)
    with tempfile.TemporaryDirectory() as tmp:
        store = None if case in ("bare", "none") else make_store(case, Path(tmp), redis_url)
        model: Any = (
            inner
            if case == "bare"
            else RecoveringChatModel(model=inner, store=store, checkpoint_every_chunks=every_chunks)
        )
        gc.collect()
        if not collector:
            gc.disable()
        chunks, writes = 0, 0

        def seen(chunk: Any) -> None:
            nonlocal chunks, writes
            if chunk.content:
                chunks += 1
            awaken = chunk.response_metadata.get("awaken")
            if awaken:
                writes = awaken["checkpoint_writes"]

        try:
            if path == "sync":
                for chunk in model.stream("Say the words."):
                    seen(chunk)
            else:

                async def drain() -> None:
                    async for chunk in model.astream("Say the words."):
                        seen(chunk)

                asyncio.run(drain())
        finally:
            if store is not None:
                store.close()
    print(json.dumps({"chunks": chunks, "writes": writes}))


@dataclass(frozen=True)
class Job:
    """One counted client process."""

    provider: str
    path: str
    case: str
    paced: bool
    long: bool
    collector: bool
    repeat: int


@dataclass
class Row:
    """Instructions per chunk of one case on one provider, path and pacing."""

    provider: str
    path: str
    pacing: str
    case: str
    per_chunk: float
    without_gc: float
    writes_per_1000: float
    spread: tuple[float, float] = (0.0, 0.0)
    """The least and most per-chunk figure over the repetitions (collector on)."""
    ratio: float = 0.0
    ratio_without_gc: float = 0.0


GOALS = (("none", 1.005), ("memory", 1.02), ("diskcache", 1.02))
"""Each case's most instructions per chunk, as a ratio to the bare integration."""


def goal_lines(rows: list[Row], every_chunks: int = EVERY_CHUNKS) -> list[str]:
    """Each goal, met or not, with every measured ratio it covers (worst first).

    The goals are set at the default cadence; at another, the lines say so.
    """
    cadence = (
        "" if every_chunks == EVERY_CHUNKS else f" [at checkpoint_every_chunks={every_chunks}]"
    )
    lines = []
    for case, goal in GOALS:
        checked = sorted((r for r in rows if r.case == case), key=lambda r: -r.ratio)
        if not checked:
            continue
        verdict = "met" if checked[0].ratio <= goal else "NOT met"
        figures = ", ".join(f"{r.provider} {r.path} {r.pacing} {r.ratio:.3f}x" for r in checked)
        lines.append(
            f"Goal: {LABELS[case]} <= {goal:g}x the bare integration{cadence}: "
            f"{verdict} ({figures})."
        )
    return lines


@dataclass
class Settings:
    """What to measure."""

    short: int = 200
    long: int = 2_000
    paced_short: int = 100
    paced_long: int = 500
    rate: float = 50.0
    repeats: int = 3
    providers: tuple[str, ...] = ("openai", "anthropic")
    paths: tuple[str, ...] = ("sync", "async")
    cases: tuple[str, ...] = CASES
    paced: bool = True
    collector_off: bool = True
    every_chunks: int = EVERY_CHUNKS
    """The wrapper's ``checkpoint_every_chunks``."""
    urls: dict[tuple[bool, bool], dict[str, str]] = field(default_factory=dict)


def _count(job: Job, settings: Settings, redis_url: str | None) -> tuple[int, int, int]:
    """Instructions of one client process, its chunks of text and its checkpoint writes."""
    url = settings.urls[(job.paced, job.long)][job.provider]
    code = (
        "from benchmarks.sdk_instructions import child\n"
        f"child({job.provider!r}, {job.path!r}, {job.case!r}, {url!r}, {redis_url!r}, "
        f"{job.collector}, {settings.every_chunks})\n"
    )
    what = f"valgrind run of {job}"
    result, stderr = run_child(
        code,
        what=what,
        under=CACHEGRIND,
        env={**child_env(), "PYTHONHASHSEED": "0"},
        timeout=3_600,
    )
    return counted_instructions(stderr, what), int(result["chunks"]), int(result["writes"])


def measure(settings: Settings) -> list[Row]:
    """Count every job, then derive each case's marginal instructions per chunk."""
    require_valgrind()
    cases = [c for c in settings.cases if c != "redis" or "redis" in store_names()]
    pacings = (False, True) if settings.paced else (False,)
    jobs = [
        Job(provider, path, case, paced, long, collector, repeat)
        for paced in pacings
        for repeat in range(settings.repeats if paced else 1)
        for provider in settings.providers
        for path in settings.paths
        for case in cases
        for collector in ((True, False) if settings.collector_off else (True,))
        for long in (False, True)
    ]
    with ExitStack() as stack:
        for paced in pacings:
            delay = 1 / settings.rate if paced else 0.0
            sizes = (
                (settings.paced_short, settings.paced_long)
                if paced
                else (
                    settings.short,
                    settings.long,
                )
            )
            for long, size in zip((False, True), sizes, strict=True):
                settings.urls[(paced, long)] = stack.enter_context(loopback_server(size, delay))
        redis_url = stack.enter_context(redis_server()) if "redis" in cases else None
        with ThreadPoolExecutor(max_workers=cores()) as pool:
            counted = dict(
                zip(jobs, pool.map(lambda job: _count(job, settings, redis_url), jobs), strict=True)
            )

    def per_chunk(job: Job) -> tuple[float, float]:
        from dataclasses import replace

        small, large = counted[replace(job, long=False)], counted[replace(job, long=True)]
        chunks = large[1] - small[1]
        return (large[0] - small[0]) / chunks, (large[2] - small[2]) / chunks

    rows = []
    for paced in pacings:
        repeats = range(settings.repeats if paced else 1)
        for provider in settings.providers:
            for path in settings.paths:
                group = []
                for case in cases:
                    on = [
                        per_chunk(Job(provider, path, case, paced, False, True, r)) for r in repeats
                    ]
                    off = (
                        [
                            per_chunk(Job(provider, path, case, paced, False, False, r))[0]
                            for r in repeats
                        ]
                        if settings.collector_off
                        else [float("nan")]
                    )
                    figures = [n for n, _ in on]
                    group.append(
                        Row(
                            provider,
                            path,
                            f"{settings.rate:g}/s" if paced else "unpaced",
                            case,
                            median(figures),
                            median(off),
                            median([w for _, w in on]) * 1_000,
                            (min(figures), max(figures)),
                        )
                    )
                for row in group:
                    row.ratio = row.per_chunk / group[0].per_chunk
                    row.ratio_without_gc = row.without_gc / group[0].without_gc
                rows += group
    return rows


def main(settings: Settings | None = None) -> list[Row]:
    """Measure, print the table and return the rows."""
    settings = settings or Settings()
    rows = measure(settings)
    print(
        f"## Real integrations, instructions per chunk (client process only; valgrind): "
        f"{settings.long:,} minus {settings.short:,} deltas unpaced, "
        f"{settings.paced_long:,} minus {settings.paced_short:,} at {settings.rate:g}/s "
        f"(median of {settings.repeats}); checkpoint_every_chunks={settings.every_chunks}; "
        f"{machine_line()}"
    )
    print(
        table(
            [
                "provider",
                "path",
                "pacing",
                "case",
                "instructions/chunk",
                "ratio",
                "without GC",
                "ratio",
                "writes per 1,000 chunks",
                "spread",
            ],
            [
                (
                    r.provider,
                    r.path,
                    r.pacing,
                    LABELS[r.case],
                    f"{r.per_chunk:,.0f}",
                    f"{r.ratio:.3f}x",
                    "-" if r.without_gc != r.without_gc else f"{r.without_gc:,.0f}",  # nan: not run
                    "-" if r.without_gc != r.without_gc else f"{r.ratio_without_gc:.3f}x",
                    f"{r.writes_per_1000:.0f}",
                    "-"
                    if r.spread[0] == r.spread[1]
                    else f"{r.spread[0]:,.0f}..{r.spread[1]:,.0f}",
                )
                for r in rows
            ],
        )
    )
    print()
    for line in goal_lines(rows, settings.every_chunks):
        print(line)
    print()
    return rows


def quick() -> Settings:
    """A small run (a minute or two on two cores): OpenAI, the main cases, short answers."""
    return Settings(
        short=50,
        long=250,
        paced_short=20,
        paced_long=60,
        repeats=1,
        providers=("openai",),
        cases=("bare", "none", "memory", "diskcache"),
        collector_off=False,
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small run (OpenAI, main cases)")
    parser.add_argument("--short", type=int, default=200, help="deltas of the short answer")
    parser.add_argument("--long", type=int, default=2_000, help="deltas of the long answer")
    parser.add_argument("--paced-short", type=int, default=100, help="short paced answer")
    parser.add_argument("--paced-long", type=int, default=500, help="long paced answer")
    parser.add_argument("--rate", type=float, default=50.0, help="paced deltas per second")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each paced case")
    parser.add_argument("--no-paced", action="store_true", help="unpaced cases only")
    parser.add_argument("--provider", action="append", choices=["openai", "anthropic"])
    parser.add_argument("--path", action="append", choices=["sync", "async"])
    parser.add_argument("--case", action="append", choices=list(CASES))
    parser.add_argument(
        "--every-chunks",
        type=int,
        default=EVERY_CHUNKS,
        help="the wrapper's checkpoint_every_chunks",
    )
    args = parser.parse_args()
    chosen = (
        quick()
        if args.quick
        else Settings(
            args.short,
            args.long,
            args.paced_short,
            args.paced_long,
            args.rate,
            args.repeats,
        )
    )
    if args.provider:
        chosen.providers = tuple(args.provider)
    if args.path:
        chosen.paths = tuple(args.path)
    if args.case:
        chosen.cases = tuple(["bare", *[c for c in args.case if c != "bare"]])
    if args.no_paced:
        chosen.paced = False
    chosen.every_chunks = args.every_chunks
    main(chosen)
