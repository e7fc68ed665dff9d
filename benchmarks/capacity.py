"""How many paced streams one core carries: the bare inner model against the wrapper with DiskCache.

Each trial runs ``n`` async turns in a fresh process pinned to one core
(``os.sched_setaffinity``; the checkpoint writer thread shares that core). Every
turn streams ``chars / 4`` chunks at ``rate`` chunks/s on a clock
(``PacedModel``), its start spread over the first second. A trial carries its
streams when the 99th percentile of lateness (how long after its due time the
caller received a chunk) stays within ``--late-ms``. The number of streams is
doubled until a trial falls behind, then bisected; the bare and the wrapped
searches step in turn, so that a busy machine slows both alike.

Two figures per case: the largest ``n`` that kept its schedule, and the
streams the measured CPU per chunk would carry on a whole core
(``1 / (rate * CPU per chunk)``, from the largest trial that kept up). The second
depends only on CPU time, so it moves less when other programs share the core.

The searches settle on different ``n`` for the two cases and from run to run,
and CPU per chunk moves with ``n`` (a batch of checkpoints is larger when more
streams share a commit): a third figure compares the two cases at one count,
the wrapped search's result, in ``--same-rounds`` more trials of each
(interleaved), as the ratio of their median CPU per chunk.

Run: ``python -m benchmarks.capacity [--rate 30] [--chars 600] [--late-ms 100]
[--same-rounds 3]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script from a clone
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import (
    PacedModel,
    machine_line,
    make_store,
    paced_turn,
    percentile,
    run_child,
    table,
)

KINDS = ("bare", "diskcache")


async def _trial(
    kind: str, streams: int, chars: int, rate: float, directory: str
) -> dict[str, Any]:
    from awaken_langchain import RecoveringChatModel

    inner = PacedModel(chars=chars, rate=rate)
    store = make_store("diskcache", Path(directory)) if kind == "diskcache" else None
    model: Any = inner if store is None else RecoveringChatModel(model=inner, store=store)
    late: list[float] = []

    async def turn(i: int) -> bool:
        await asyncio.sleep(i / streams)
        return await paced_turn(model, inner, f"c{i}", late, run_id=uuid.uuid4())

    cpu = time.process_time()
    try:
        results = await asyncio.gather(*(turn(i) for i in range(streams)))
        cpu = time.process_time() - cpu
    finally:
        if store is not None:
            store.close()
    return {
        "ok": sum(results),
        "chunks": len(late),
        "cpu": cpu,
        "late_p99": percentile(late, 0.99),
    }


def trial_child(kind: str, streams: int, chars: int, rate: float, directory: str) -> None:
    """One trial, in this process pinned to one core; prints its result as JSON."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    print(json.dumps(asyncio.run(_trial(kind, streams, chars, rate, directory))))


def _run_trial(kind: str, streams: int, chars: int, rate: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        result, _ = run_child(
            "from benchmarks.capacity import trial_child\n"
            f"trial_child({kind!r}, {streams}, {chars}, {rate}, {tmp!r})\n",
            what=f"a {kind} trial of {streams} streams",
        )
    if result["ok"] != streams:
        raise RuntimeError(f"{kind}: {streams - result['ok']} turns lost their text")
    return result


@dataclass
class _Search:
    """Doubling, then bisection, of the streams one core carries."""

    kind: str
    start: int
    limit: int
    good: int = 0
    bad: int | None = None
    best: dict[str, Any] | None = None
    first: dict[str, Any] | None = None
    trials: int = 0

    def next(self, precision: float) -> int | None:
        if self.bad is None:
            n = self.start if self.good == 0 else self.good * 2
            return n if n <= self.limit else None
        if self.bad - self.good <= max(1, int(self.good * precision)):
            return None
        return (self.good + self.bad) // 2

    def record(self, n: int, result: dict[str, Any], late_s: float) -> None:
        self.trials += 1
        if self.first is None:
            self.first = result
        if result["late_p99"] <= late_s:
            if n > self.good:
                self.good, self.best = n, result
        elif self.bad is None or n < self.bad:
            self.bad = n


def _same_count(streams: int, rounds: int, chars: int, rate: float) -> tuple[float, float]:
    """Median CPU per chunk (us) of the bare and the wrapped case at ``streams`` streams."""
    per_chunk: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for _ in range(rounds):
        for kind in KINDS:
            result = _run_trial(kind, streams, chars, rate)
            per_chunk[kind].append(result["cpu"] / result["chunks"] * 1e6)
    bare, wrapped = (statistics.median(per_chunk[kind]) for kind in KINDS)
    return bare, wrapped


@dataclass
class Row:
    """The capacity of one case."""

    kind: str
    streams: int
    capped: bool
    late_p99_ms: float
    cpu_us_per_chunk: float
    cpu_streams: float
    trials: int
    same_count_us: float | None = None
    """Median CPU per chunk over the trials at the count both cases are compared at."""


def main(
    rate: float = 30.0,
    chars: int = 600,
    late_ms: float = 100.0,
    start: int = 64,
    limit: int = 8_192,
    precision: float = 0.05,
    same_rounds: int = 3,
) -> list[Row]:
    """Find each case's capacity, print a table with the ratio, and return the rows."""
    searches = [_Search(kind, start, limit) for kind in KINDS]
    while True:
        steps = [(s, n) for s in searches if (n := s.next(precision)) is not None]
        if not steps:
            break
        for search, n in steps:
            search.record(n, _run_trial(search.kind, n, chars, rate), late_ms / 1e3)
    rows = []
    for s in searches:
        best = s.best or s.first  # no trial kept up: the CPU figure of the first
        assert best is not None
        per_chunk = best["cpu"] / best["chunks"]
        rows.append(
            Row(
                s.kind,
                s.good,
                s.bad is None,
                best["late_p99"] * 1e3,
                per_chunk * 1e6,
                1 / (rate * per_chunk),
                s.trials,
            )
        )
    bare, wrapped = rows
    same = max(1, wrapped.streams)
    if same_rounds > 0:
        bare.same_count_us, wrapped.same_count_us = _same_count(same, same_rounds, chars, rate)
    print(
        f"## Capacity of one core: streams at {rate:g} chunks/s of {chars // 4} chunks each, "
        f"late p99 <= {late_ms:g} ms; {machine_line()}"
    )
    print(
        table(
            [
                "case",
                "streams kept on schedule",
                "late p99 ms",
                "CPU us/chunk",
                "streams by CPU",
                "trials",
            ],
            [
                (
                    "bare inner model" if r.kind == "bare" else "wrapper, diskcache",
                    f">= {r.streams}" if r.capped else r.streams,
                    r.late_p99_ms,
                    r.cpu_us_per_chunk,
                    r.cpu_streams,
                    r.trials,
                )
                for r in rows
            ],
        )
    )
    print(
        f"wrapped / bare: {wrapped.streams / max(1, bare.streams):.0%} of the streams on "
        f"schedule, {wrapped.cpu_streams / bare.cpu_streams:.0%} by CPU per chunk"
    )
    if bare.same_count_us is not None and wrapped.same_count_us is not None:
        print(
            f"at {same} streams each, median of {same_rounds} trials: CPU per chunk "
            f"{bare.same_count_us:.1f} us bare, {wrapped.same_count_us:.1f} us wrapped: "
            f"{bare.same_count_us / wrapped.same_count_us:.0%} by CPU per chunk"
        )
    print()
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=30.0, help="chunks/s of each stream")
    parser.add_argument("--chars", type=int, default=600, help="characters per turn (4 a chunk)")
    parser.add_argument("--late-ms", type=float, default=100.0, help="allowed p99 lateness")
    parser.add_argument("--start", type=int, default=64, help="streams of the first trial")
    parser.add_argument("--limit", type=int, default=8_192, help="most streams tried")
    parser.add_argument(
        "--same-rounds", type=int, default=3, help="trials of each case at one count (0: none)"
    )
    args = parser.parse_args()
    main(
        args.rate,
        args.chars,
        args.late_ms,
        args.start,
        args.limit,
        same_rounds=args.same_rounds,
    )
