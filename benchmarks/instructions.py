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

Importing LangChain costs about 3 000 million instructions, 13 s of CPU under
valgrind, far more than the streams measured. So one interpreter per seed is
started under valgrind, imports everything once and forks a process per stream;
valgrind reports each forked process's count separately, and that count
includes the parent's start-up, the same in both streams of a pair, which the
difference takes out. (The parent's few instructions between two forks do not
cancel: a few thousand, under one instruction per chunk.)

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
import json
import os
import subprocess
import sys
import tempfile
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


Job = tuple[str, str, int, bool]
"""One stream to count: path, case, chunks and whether the garbage collector runs."""


def _counts(seed: int, jobs: list[Job]) -> list[int]:
    """Instructions of each of ``jobs``, each streamed in a process forked from one interpreter."""
    spec = json.dumps(
        [[PATHS.index(p), CASES.index(c), n, collector] for p, c, n, collector in jobs]
    )
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "count"
        command = [
            *CACHEGRIND,
            f"--log-file={log}.%p",
            sys.executable,
            "-m",
            "benchmarks.instructions",
            "--forked",
            spec,
        ]
        env = {**child_env(), "PYTHONHASHSEED": str(seed)}
        done = subprocess.run(
            command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=3_600
        )
        what = f"valgrind run of seed {seed}"
        if done.returncode != 0:
            raise RuntimeError(f"{what} failed:\n{done.stderr[-2000:]}")
        pids = json.loads(done.stdout.strip().splitlines()[-1])
        counts = []
        for pid, (path, case, _, _) in zip(pids, jobs, strict=True):
            stream_log = log.with_name(f"count.{pid}").read_text()
            counts.append(counted_instructions(stream_log, f"valgrind run of {path} {case!r}"))
        return counts


def _forked(spec: str) -> None:
    """Stream each job of ``spec`` in a forked process, one after the other; print their pids."""
    pids: list[int] = []
    for path_index, case_index, size, collector in json.loads(spec):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                if not collector:
                    gc.disable()
                path, case = PATHS[path_index], CASES[case_index]
                code = 0 if stream(path, case, size) >= size else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        if status != 0:
            raise SystemExit(f"the stream of job {len(pids)} failed (wait status {status})")
        pids.append(pid)
    print(json.dumps(pids))


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
    jobs: list[Job] = [
        (path, case, size, collector)
        for path in paths
        for case in cases
        for collector in (True, False)
        for size in (short, chunks)
    ]
    with ThreadPoolExecutor(max_workers=cores()) as pool:
        per_seed = list(pool.map(lambda seed: _counts(seed, jobs), range(seeds)))
    counts = {
        (path, case, size, seed, collector): count
        for seed, seed_counts in enumerate(per_seed)
        for (path, case, size, collector), count in zip(jobs, seed_counts, strict=True)
    }

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
    parser.add_argument("--forked", metavar="JOBS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.forked:
        _forked(args.forked)
    else:
        main(args.chunks, args.short, args.seeds)
