"""Per-chunk overhead counted in instructions, the figure that does not move with the machine.

CPU time on a shared machine swings by 10 % and more between runs minutes apart
(docs/benchmarks.md), so a change worth 2 % of a chunk cannot be seen in
it. Valgrind's ``cachegrind`` counts the instructions a process executes; this
program runs one stream per process under it, at two lengths, and divides the
difference by the difference in chunks: what each chunk costs, with the
interpreter's start-up and the turn's set-up taken out. The counts repeat to
the instruction for a given ``PYTHONHASHSEED``; across seeds they move by about
1 % (string hashes change dictionary layouts), so each case runs under
``--seeds`` seeds and the table shows their mean and range.

Each case is counted twice: as it runs, and with the garbage collector off
(``gc.disable()`` before the turn). LangChain keeps every chunk of a streamed
turn until it ends, so the collector's passes over that growing heap cost about
15 000 instructions per chunk here, bare and wrapped alike (the same number of
collections of each generation: short-lived objects do not count towards
them). How much one run pays depends on where in the heap's growth its
collections fall, which moves with the hash seed and with unrelated changes to
the code by 1 000 to 3 000 instructions per chunk. Without the collector a
count usually moves by a few hundred across seeds, but for some versions of
the code by up to about 1 400: that column, as the mean over the seeds, is the
one to compare two versions of the code with; the first is what a process
really runs.

Cases: the bare inner model (``TokenStreamModel``, as in ``benchmarks.overhead``)
and the wrapper without a store, with and without the stream idle timeout,
sync and async, and async again with chunks that name their provider in their
``response_metadata``, as every chunk of the OpenAI and Anthropic
integrations does. Store cases are left out: under valgrind a process runs about
50 times slower, so the writer's timings (its 10 ms gather, the 0.25 s cadence)
meet far fewer chunks than at full speed and the count would describe another
program. Instructions are not time: a memory stall or a system call costs no
more here than an addition, so read these beside the CPU ratios, not instead.

Needs ``valgrind`` on the ``PATH`` (Debian: ``apt-get install valgrind``).

Run: ``python -m benchmarks.instructions [--chunks 20000] [--short 4000] [--seeds 3]``
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script from a clone
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from awaken_langchain import RecoveringChatModel
from benchmarks._common import (
    CACHEGRIND,
    REPO_ROOT,
    TokenStreamModel,
    child_env,
    cores,
    counted_instructions,
    machine_line,
    require_valgrind,
    table,
)

IDLE_TIMEOUT = 60.0
CASES = ("bare inner model", "wrapper, no idle timeout", "wrapper, idle timeout 60 s")
PATHS = ("sync", "async", "async, provider metadata")


@dataclass
class Row:
    """Instructions per chunk of one case on one path, over the seeds."""

    path: str
    case: str
    per_chunk: list[float]
    """With the garbage collector on, per seed."""
    without_gc: list[float]
    """With the garbage collector off, per seed."""
    ratio: float = 0.0
    ratio_without_gc: float = 0.0

    @property
    def mean(self) -> float:
        return sum(self.per_chunk) / len(self.per_chunk)

    @property
    def mean_without_gc(self) -> float:
        return sum(self.without_gc) / len(self.without_gc)


def stream(path: str, case: str, chunks: int) -> int:
    """Stream one turn of ``chunks`` chunks the way ``case`` says; return the chunks read."""
    inner = TokenStreamModel(tokens=chunks, provider="openai" if path == PATHS[2] else None)
    model = (
        inner
        if case == CASES[0]
        else RecoveringChatModel(
            model=inner, stream_idle_timeout=IDLE_TIMEOUT if case == CASES[2] else None
        )
    )
    if path == "sync":
        return sum(1 for _ in model.stream("hi"))

    async def drain() -> int:
        return len([chunk async for chunk in model.astream("hi")])

    return asyncio.run(drain())


def _count(path: str, case: str, chunks: int, seed: int, collector: bool) -> int:
    """Instructions one process executes to stream the turn (valgrind's count)."""
    command = [
        *CACHEGRIND,
        sys.executable,
        "-m",
        "benchmarks.instructions",
        "--child",
        str(PATHS.index(path)),
        str(CASES.index(case)),
        str(chunks),
        "1" if collector else "0",
    ]
    env = {**child_env(), "PYTHONHASHSEED": str(seed)}
    done = subprocess.run(
        command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    what = f"valgrind run of {path} {case!r}"
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{done.stderr[-2000:]}")
    return counted_instructions(done.stderr, what)


def measure(
    chunks: int,
    short: int,
    seeds: int,
    paths: tuple[str, ...] = PATHS,
    cases: tuple[str, ...] = CASES,
) -> list[Row]:
    """Instructions per chunk of ``cases`` on ``paths``, ratios against the first case."""
    require_valgrind()
    if chunks <= short:
        raise ValueError(f"--chunks ({chunks}) must be larger than --short ({short})")
    jobs = [
        (path, case, size, seed, collector)
        for path in paths
        for case in cases
        for seed in range(seeds)
        for collector in (True, False)
        for size in (short, chunks)
    ]
    with ThreadPoolExecutor(max_workers=cores()) as pool:
        counts = dict(zip(jobs, pool.map(lambda job: _count(*job), jobs), strict=True))

    def per_chunk(path: str, case: str, collector: bool) -> list[float]:
        return [
            (
                counts[(path, case, chunks, seed, collector)]
                - counts[(path, case, short, seed, collector)]
            )
            / (chunks - short)
            for seed in range(seeds)
        ]

    rows = []
    for path in paths:
        for case in cases:
            rows.append(Row(path, case, per_chunk(path, case, True), per_chunk(path, case, False)))
        bare = rows[-len(cases)]
        for row in rows[-len(cases) :]:
            row.ratio = row.mean / bare.mean
            row.ratio_without_gc = row.mean_without_gc / bare.mean_without_gc
    return rows


def check(chunks: int = 200) -> None:
    """Stream every case once at full speed, not counted: what ``--quick`` runs.

    Valgrind slows a process down about 50 times; a smoke run checks that each
    case streams its whole turn, and leaves the counting to the full run.

    Raises:
        RuntimeError: If a case's stream ended early.
    """
    for path in PATHS:
        for case in CASES:
            received = stream(path, case, chunks)
            if received < chunks:
                raise RuntimeError(f"the stream ended early ({path}, {case}): {received} chunks")
    print(
        f"instructions per chunk: not counted in a quick run; every case streamed its "
        f"{chunks} chunks ({len(PATHS)} paths, {len(CASES)} cases)"
    )


def main(chunks: int = 20_000, short: int = 4_000, seeds: int = 3) -> list[Row]:
    """Measure, print the table and return the rows."""
    rows = measure(chunks, short, seeds)
    print(
        f"## Instructions per chunk (valgrind cachegrind; {chunks:,} minus {short:,} chunks, "
        f"{seeds} hash seeds); {machine_line()}"
    )
    print(
        table(
            [
                "path",
                "case",
                "instructions/chunk",
                "range over seeds",
                "ratio",
                "without GC",
                "range",
                "ratio",
            ],
            [
                (
                    r.path,
                    r.case,
                    f"{r.mean:,.0f}",
                    f"{min(r.per_chunk):,.0f}-{max(r.per_chunk):,.0f}",
                    f"{r.ratio:.3f}x",
                    f"{r.mean_without_gc:,.0f}",
                    f"{min(r.without_gc):,.0f}-{max(r.without_gc):,.0f}",
                    f"{r.ratio_without_gc:.3f}x",
                )
                for r in rows
            ],
        )
    )
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=20_000)
    parser.add_argument("--short", type=int, default=4_000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--child", nargs=4, metavar=("PATH", "CASE", "CHUNKS", "GC"))
    args = parser.parse_args()
    if args.child:
        path, case, size = PATHS[int(args.child[0])], CASES[int(args.child[1])], int(args.child[2])
        if args.child[3] == "0":
            gc.disable()
        if stream(path, case, size) < size:
            raise SystemExit(f"the stream ended early ({path}, {case})")
    else:
        main(args.chunks, args.short, args.seeds)
