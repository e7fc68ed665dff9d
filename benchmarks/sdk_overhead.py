"""Overhead of RecoveringChatModel around the real ChatOpenAI and ChatAnthropic.

`benchmarks.overhead` measures the wrapper against a minimal inner model that
only builds chunks, so that nothing hides the wrapper's own cost. This one
measures what a user pays: the real LangChain integrations and the official
SDKs stream an answer of ``--chunks`` deltas from the loopback provider server,
which runs in a child process so that its work is not in the measured CPU.
Each case is the bare integration's ``stream()``/``astream()`` or the wrapper
around it with its defaults (the 60 s idle timeout) and no store, the
in-memory store or DiskCache; ``no idle timeout`` turns the idle timeout off.
CPU time is this process's (``time.process_time``, all threads), over
interleaved rounds: the table shows each case's best and median round, and
ratios of each against the bare integration's (best to best, median to
median) on the same path in the same run. Context switches (``getrusage``, all threads) are those
of the round with the least CPU: a background thread that needs the GIL
while the stream's thread keeps releasing it for network reads shows there.

The server streams as fast as it can (thousands of deltas per second), far
faster than a provider does (tens to about a hundred): what happens per
checkpoint weighs more here than it does in a real turn. The async cases
share one event loop, as an application does (the SDKs' async clients are
bound to the loop they first ran on).

Goal: the wrapper with DiskCache at most 1.05x the bare integration's CPU,
sync and async (the median ratio; printed as the last line).

Run: ``python -m benchmarks.sdk_overhead [--chunks 2000] [--rounds 5] [--delay 0]
[--provider openai|anthropic]``
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script from a clone
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from langchain_core.language_models import BaseChatModel

from awaken_langchain import RecoveringChatModel, StreamCheckpointStore
from benchmarks._common import child_env, machine_line, make_store, table

WORD = "word "
"""One streamed delta: the server sends the answer in pieces of this length."""

GOAL = 1.05
"""Most CPU the wrapper with DiskCache may cost, as a multiple of the bare integration's."""

CASES = (
    ("bare integration", None, True),
    ("wrapper, no store, no idle timeout", "none", False),
    ("wrapper, no store", "none", True),
    ("wrapper, memory", "memory", True),
    ("wrapper, diskcache", "diskcache", True),
)
"""(name, store, idle timeout on): ``None`` store is the bare integration."""


@dataclass
class Row:
    """Measured cost of one case on one provider and path."""

    provider: str
    path: str
    case: str
    cpu_s: float
    """The best round's CPU seconds."""
    chunks: int
    switches: int = 0
    cpu_ratio: float = 0.0
    """Best round against the bare integration's best."""
    extra_us_per_chunk: float = 0.0
    median_cpu_s: float = 0.0
    median_ratio: float = 0.0
    """Median round against the bare integration's median."""


@contextmanager
def loopback_server(chunks: int, delay: float = 0.0) -> Iterator[dict[str, str]]:
    """Run the loopback provider in a child process; yield its base URLs by provider."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "awaken_langchain.testing.server",
            "--text",
            WORD * chunks,
            "--chunk-size",
            str(len(WORD)),
            "--delay",
            str(delay),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        if "openai=" not in line:
            raise RuntimeError(f"the loopback server did not start: {line!r}")
        urls = dict(part.split("=", 1) for part in line.split() if "=" in part)
        yield urls
    finally:
        child.terminate()
        child.wait(timeout=10)


def _client(provider: str, urls: dict[str, str]) -> BaseChatModel:
    if provider == "openai":
        from langchain_openai import ChatOpenAI

        return ChatOpenAI(model="gpt-4o-mini", base_url=urls["openai"], api_key="x", max_retries=0)
    from langchain_anthropic import ChatAnthropic

    return ChatAnthropic(
        model="claude-loopback", base_url=urls["anthropic"], api_key="x", max_retries=0
    )


def _models(
    inner: BaseChatModel, directory: Path
) -> list[tuple[str, BaseChatModel, StreamCheckpointStore | None]]:
    built: list[tuple[str, BaseChatModel, StreamCheckpointStore | None]] = []
    for name, store_kind, idle in CASES:
        if store_kind is None:
            built.append((name, inner, None))
            continue
        store = None
        if store_kind != "none":
            store = make_store(store_kind, directory / name.replace(" ", "_").replace(",", ""))
        settings: dict[str, Any] = {} if idle else {"stream_idle_timeout": None}
        built.append((name, RecoveringChatModel(model=inner, store=store, **settings), store))
    return built


def measure(provider: str, urls: dict[str, str], chunks: int, rounds: int) -> list[Row]:
    """Stream every case ``rounds`` times, sync then async; keep every round's CPU."""
    inner = _client(provider, urls)
    best: dict[tuple[str, str], float] = {}
    spent_all: dict[tuple[str, str], list[float]] = {}
    received: dict[tuple[str, str], int] = {}
    switched: dict[tuple[str, str], int] = {}
    with tempfile.TemporaryDirectory() as tmp, asyncio.Runner() as runner:
        models = _models(inner, Path(tmp))
        try:
            for _ in range(rounds):
                for path in ("sync", "async"):
                    for name, model, _store in models:
                        gc.collect()
                        before = _context_switches()
                        began = time.process_time()
                        if path == "sync":
                            count = sum(1 for _ in model.stream("Say the words."))
                        else:
                            count = runner.run(_drain(model))
                        spent = time.process_time() - began
                        key = (path, name)
                        spent_all.setdefault(key, []).append(spent)
                        if spent < best.get(key, float("inf")):
                            best[key] = spent
                            switched[key] = _context_switches() - before
                        received[key] = count
        finally:
            for _, _, store in models:
                if store is not None:
                    store.close()
    rows = []
    for path in ("sync", "async"):
        base = best[path, CASES[0][0]]
        base_median = statistics.median(spent_all[path, CASES[0][0]])
        for name, _, _ in CASES:
            cpu, count = best[path, name], received[path, name]
            median = statistics.median(spent_all[path, name])
            if count < chunks:
                raise RuntimeError(f"{provider} {path} {name}: {count} of {chunks} chunks")
            rows.append(
                Row(
                    provider,
                    path,
                    name,
                    cpu,
                    count,
                    switched[path, name],
                    cpu / base,
                    (cpu - base) / count * 1e6,
                    median,
                    median / base_median,
                )
            )
    return rows


def _context_switches() -> int:
    """Times this process's threads have given up a CPU so far (blocked, or preempted)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_nvcsw + usage.ru_nivcsw


async def _drain(model: BaseChatModel) -> int:
    count = 0
    async for _ in model.astream("Say the words."):
        count += 1
    return count


def main(
    chunks: int = 2_000,
    rounds: int = 5,
    providers: tuple[str, ...] = ("openai", "anthropic"),
    delay: float = 0.0,
) -> list[Row]:
    """Measure every provider, print the table and return the rows.

    ``delay``: seconds the server waits between events (0: as fast as it can).
    """
    rows: list[Row] = []
    with loopback_server(chunks, delay) as urls:
        for provider in providers:
            rows += measure(provider, urls, chunks, rounds)
    print(
        f"## Overhead around the real integrations: {chunks:,} deltas"
        f"{f' {delay:g} s apart' if delay else ''}, best and median of {rounds} interleaved "
        f"rounds; {machine_line()}"
    )
    print(
        table(
            [
                "provider",
                "path",
                "case",
                "CPU s, best",
                "CPU ratio, best",
                "CPU ratio, median",
                "extra CPU us/chunk",
                "context switches",
            ],
            [
                (
                    r.provider,
                    r.path,
                    r.case,
                    r.cpu_s,
                    f"{r.cpu_ratio:.2f}x",
                    f"{r.median_ratio:.2f}x",
                    r.extra_us_per_chunk,
                    r.switches,
                )
                for r in rows
            ],
        )
    )
    print()
    print(goal_line(rows))
    print()
    return rows


def goal_line(rows: list[Row]) -> str:
    """Whether the wrapper with DiskCache kept within `GOAL` of the bare CPU, per path."""
    checked = [r for r in rows if r.case == CASES[-1][0]]
    worst = max(checked, key=lambda r: r.median_ratio)
    verdict = "met" if worst.median_ratio <= GOAL else "not met"
    figures = ", ".join(f"{r.provider} {r.path} {r.median_ratio:.3f}x" for r in checked)
    return (
        f"Goal: wrapper with DiskCache <= {GOAL:g}x the bare CPU (median): {verdict} ({figures})."
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=2_000, help="text deltas per answer")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved repetitions")
    parser.add_argument(
        "--provider", action="append", choices=["openai", "anthropic"], help="default: both"
    )
    parser.add_argument(
        "--delay", type=float, default=0.0, help="seconds between events (0: as fast as it can)"
    )
    args = parser.parse_args()
    main(args.chunks, args.rounds, tuple(args.provider or ("openai", "anthropic")), args.delay)
