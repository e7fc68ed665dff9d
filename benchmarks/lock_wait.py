"""How long a DiskCache write waits for another process's write, and what waiting costs.

Several processes (``--processes``) share one DiskCache directory. Each
commits groups of checkpoints back to back, as the checkpoint writer does: a
group puts ``--runs`` turns, each a few characters longer than before, in one
``put_many``, then the process pauses 0 to ``--pause`` ms (at random) and
commits the next, ``--groups`` times. Two cases run side by side, each on its
own directory, in alternating rounds:

- "polls": the store as it is. A transaction that finds the write lock taken
  tries again every 0.5 ms at first, then after an eighth of the time waited
  so far (at most every 25 ms).
- "SQLite sleeps": the same store with its transactions begun as diskcache
  begins its own: one ``BEGIN IMMEDIATE`` under SQLite's busy timeout, whose
  handler sleeps 1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50, then 100 ms between
  tries.

Every group is written in a transaction, whatever its size (the store writes a
group of up to four runs it wrote last in one guarded statement instead, which
waits for the lock through the same `_begin` only when it finds it taken).

Per case, over every group of every process: the wait for the write lock
(from asking to begin to begun) at p50/p99/max, the wall time of a whole
``put_many`` at p99, the CPU per group, and the check: every turn reads back
exactly as last written.

Run: ``python -m benchmarks.lock_wait [--processes 4] [--groups 400] [--runs 8]
[--pause 4] [--rounds 2]``
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script from a clone
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import diskcache

from awaken_langchain import DiskCacheStreamCheckpointStore, StreamCheckpoint
from benchmarks._common import child_env, child_results, machine_line, percentile, table

CASES = ("polls", "SQLite sleeps")


def _sqlite_begin(cache: Any) -> Callable[[], None]:
    """``BEGIN IMMEDIATE`` as diskcache issues it: SQLite's busy handler does the waiting,
    for as long as the connection's busy timeout (the store's ``timeout``, set when
    diskcache opened the connection)."""

    def begin() -> None:
        try:
            cache._con.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise diskcache.Timeout from exc

    return begin


def _timed(begin: Callable[[], None], waits: list[float]) -> Callable[[], None]:
    def timed() -> None:
        start = time.perf_counter()
        try:
            begin()
        finally:
            waits.append(time.perf_counter() - start)

    return timed


def child(case: str, directory: str, tag: str, groups: int, runs: int, pause: float) -> None:
    """One process: commit ``groups`` groups of ``runs`` turns; print the samples as JSON."""
    store = DiskCacheStreamCheckpointStore(directory)
    # every group is one transaction, begun by the case's `_begin`, as a group of more
    # than four runs is (a smaller one is written in one guarded statement)
    store._put_guarded = lambda plans, layouts: None  # type: ignore[method-assign]
    cache = store._cache
    waits: list[float] = []
    begin = cache._begin if case == "polls" else _sqlite_begin(cache)
    cache._begin = _timed(begin, waits)
    run_ids = [f"{tag}-{i}" for i in range(runs)]
    epochs = {run_id: store.claim(run_id) for run_id in run_ids}
    texts = dict.fromkeys(run_ids, "")
    chance = random.Random(tag)
    print("ready", flush=True)
    sys.stdin.readline()  # every process starts together
    waits.clear()
    commits: list[float] = []
    cpu = time.process_time()
    for _ in range(groups):
        group = []
        for run_id in run_ids:
            texts[run_id] += "tok " * 8
            group.append(
                StreamCheckpoint(run_id=run_id, partial_text=texts[run_id], epoch=epochs[run_id])
            )
        start = time.perf_counter()
        errors = store.put_many(group)
        commits.append(time.perf_counter() - start)
        if any(errors):
            raise RuntimeError(f"a put failed: {errors}")
        time.sleep(chance.uniform(0, pause))
    cpu = time.process_time() - cpu
    intact = all(
        (got := store.get(run_id)) is not None and got.partial_text == texts[run_id]
        for run_id in run_ids
    )
    store.close()
    print(json.dumps({"waits": waits, "commits": commits, "cpu": cpu, "intact": intact}))


@dataclass
class Row:
    """One case, over every process of every round."""

    case: str
    groups: int
    intact: bool
    wait_p50_ms: float
    wait_p99_ms: float
    wait_max_ms: float
    commit_p99_ms: float
    cpu_us_per_group: float


def _round(case: str, processes: int, groups: int, runs: int, pause: float) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        directory = str(Path(tmp) / "cache")
        DiskCacheStreamCheckpointStore(directory).close()  # created once, before they open it
        children = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.lock_wait",
                    "--child",
                    json.dumps([case, directory, f"p{i}", groups, runs, pause]),
                ],
                env=child_env(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for i in range(processes)
        ]
        for process in children:
            assert process.stdout is not None
            if process.stdout.readline().strip() != "ready":
                raise RuntimeError("a child process did not start")
        for process in children:
            assert process.stdin is not None
            process.stdin.write("go\n")
            process.stdin.flush()
        return child_results(children, f"{case} writer")


def main(
    processes: int = 4, groups: int = 400, runs: int = 8, pause: float = 4.0, rounds: int = 2
) -> list[Row]:
    """Run both cases in alternating rounds; print and return one row per case."""
    samples: dict[str, list[dict[str, Any]]] = {case: [] for case in CASES}
    for index in range(rounds):
        for case in CASES if index % 2 == 0 else CASES[::-1]:
            samples[case] += _round(case, processes, groups, runs, pause / 1000)
    rows = []
    for case in CASES:
        results = samples[case]
        waits = [w for r in results for w in r["waits"]]
        commits = [c for r in results for c in r["commits"]]
        rows.append(
            Row(
                case,
                len(commits),
                all(r["intact"] for r in results),
                percentile(waits, 0.5) * 1e3,
                percentile(waits, 0.99) * 1e3,
                max(waits) * 1e3,
                percentile(commits, 0.99) * 1e3,
                sum(r["cpu"] for r in results) / len(commits) * 1e6,
            )
        )
    print(
        f"## Waiting for another process's write: {processes} processes x {groups} groups of "
        f"{runs} turns, 0-{pause:g} ms apart, {rounds} rounds; {machine_line()}"
    )
    print(
        table(
            [
                "case",
                "groups",
                "intact",
                "lock wait p50 ms",
                "lock wait p99 ms",
                "lock wait max ms",
                "put_many p99 ms",
                "CPU us/group",
            ],
            [
                [
                    r.case,
                    r.groups,
                    "yes" if r.intact else "NO",
                    r.wait_p50_ms,
                    r.wait_p99_ms,
                    r.wait_max_ms,
                    r.commit_p99_ms,
                    r.cpu_us_per_group,
                ]
                for r in rows
            ],
        )
    )
    return rows


def _parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--groups", type=int, default=400, help="groups each process commits")
    parser.add_argument("--runs", type=int, default=8, help="turns in one group")
    parser.add_argument("--pause", type=float, default=4.0, help="longest pause, ms")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = _parse()
    if args.child:
        child(*json.loads(args.child))
    else:
        main(args.processes, args.groups, args.runs, args.pause, args.rounds)
