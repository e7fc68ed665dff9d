"""Paced streams with a checkpoint store, counted in instructions on a virtual clock.

The capacity benchmark's scenario (``benchmarks.capacity``: async turns of
``chars / 4`` chunks at ``rate`` chunks/s each, their starts spread over the
first second), run on a virtual clock (`benchmarks._virtual_clock`): the event
loop moves the clock forward instead of sleeping, so the checkpoint cadence,
the writer's gathering and its batches behave as at full speed while
valgrind counts the instructions. CPU time on a shared machine swings by
10 % and more from run to run; these counts repeat to the instruction.

Each case runs in its own process, at two stream counts; the difference,
divided by the difference in chunks, is what one chunk costs with the
interpreter's start-up taken out (the per-turn work, claims and closing
deletes included, is shared out over the turn's chunks). The DiskCache case
runs under callgrind, counting from just before its turns (its start-up runs
uncounted, about five times faster), which also tells how many of those
instructions SQLite executed itself (not the C library calls it makes), the
part of a checkpoint no Python code can save.

Cases: the bare inner model; the wrapper without a store; with the
in-process store; with DiskCache; and with DiskCache whose store operations
do nothing (what the turn's checkpoint bookkeeping, the capture and the
hand-over cost before the store does any work). Each case runs as a process
runs (the collector on) and with the garbage collector off (``gc.disable()``
before the turns), the figure to compare two versions of the code with, as in
``benchmarks.instructions``.

Instructions are not time: a cache miss or a system call costs no more here
than an addition, and a paced process runs each chunk on colder caches than
these counts see. Read them beside ``benchmarks.capacity``, not instead.

Needs ``valgrind`` on the ``PATH`` (Debian: ``apt-get install valgrind``).

Run: ``python -m benchmarks.paced_instructions [--streams 100] [--chars 600] [--rate 30]``
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import json
import random
import re
import sys
import tempfile
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script from a clone
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import (
    CACHEGRIND,
    CALLGRIND_FROM_HERE,
    COUNT_FROM_HERE,
    child_env,
    cores,
    counted_instructions,
    machine_line,
    require_valgrind,
    run_child,
    table,
)

CASES = (
    "bare inner model",
    "wrapper, no store",
    "wrapper, memory",
    "wrapper, diskcache",
    "wrapper, diskcache, store work skipped",
)
_SQLITE = "libsqlite3"


@dataclass
class Row:
    """Instructions per chunk of one case."""

    case: str
    per_chunk: float
    without_gc: float
    writes_per_chunk: float
    """Checkpoint writes per chunk of text (the turns' own count, closing writes included)."""
    sqlite: float | None = None
    """Of ``per_chunk``, the instructions executed inside SQLite's library."""
    ratio: float = 0.0
    ratio_without_gc: float = 0.0


@dataclass
class Measured:
    """Every case's row, and what the store's work costs per checkpoint."""

    rows: list[Row]
    set_instructions: float
    """One plain diskcache ``set`` of 600 bytes in its own transaction."""

    def store_work_per_write(self) -> float | None:
        """DiskCache's work per checkpoint write: its case less the case that skips it.

        The turn's claim, read and closing delete are shared out over its writes.
        """
        by_case = {row.case: row for row in self.rows}
        done, skipped = by_case.get(CASES[3]), by_case.get(CASES[4])
        if done is None or skipped is None or done.writes_per_chunk == 0:
            return None
        return (done.per_chunk - skipped.per_chunk) / done.writes_per_chunk


_SETS = (500, 5_500)
"""How many diskcache ``set`` calls the two runs of the floor make."""


def _skipping_store(directory: Path) -> Any:
    """A DiskCache store whose operations do nothing (and, like it, never wait)."""
    from awaken_langchain import DiskCacheStreamCheckpointStore

    class Skipping(DiskCacheStreamCheckpointStore):
        def claim(self, run_id: str) -> int:
            return 1

        def get(self, run_id: str) -> Any:
            return None

        def delete(self, run_id: str, *, epoch: int | None = None) -> None:
            return None

        def put_many(self, checkpoints: Any) -> list[Any]:
            return [None] * len(checkpoints)

        def put_many_now(self, checkpoints: Any) -> list[Any]:
            return [None] * len(checkpoints)

        def call_now(self, action: Any) -> tuple[bool, Any]:
            return True, action()

    return Skipping(directory)


async def _turns(
    case: str, streams: int, chars: int, rate: float, directory: Path
) -> tuple[int, int]:
    """Stream the turns of ``case``; return the chunks of text and the checkpoint writes."""
    from awaken_langchain import RecoveringChatModel
    from benchmarks._common import PacedModel, answer_for, make_store

    inner = PacedModel(chars=chars, rate=rate)
    store: Any = None
    if case == CASES[2]:
        store = make_store("memory", directory)
    elif case == CASES[3]:
        store = make_store("diskcache", directory)
    elif case == CASES[4]:
        store = _skipping_store(directory)
    model: Any = inner if case == CASES[0] else RecoveringChatModel(model=inner, store=store)
    ids = random.Random(0)  # the same run ids in every run: the same keys, the same pages

    async def turn(i: int, run_id: uuid.UUID) -> tuple[bool, int, int]:
        await asyncio.sleep(i / streams)
        question, text, writes = f"c{i}", [], 0
        async for chunk in model.astream(question, config={"run_id": run_id}):
            if chunk.content:
                text.append(str(chunk.content))
            awaken = chunk.response_metadata.get("awaken")
            if awaken:
                writes = awaken["checkpoint_writes"]
        return "".join(text) == answer_for(question, chars), len(text), writes

    runs = [uuid.UUID(int=ids.getrandbits(128)) for _ in range(streams)]
    try:
        results = await asyncio.gather(*(turn(i, run) for i, run in enumerate(runs)))
    finally:
        if store is not None:
            store.close()
    if not all(ok for ok, _, _ in results):
        raise RuntimeError(f"{case}: a turn did not deliver its own text")
    return sum(n for _, n, _ in results), sum(w for _, _, w in results)


def child(case: int, streams: int, chars: int, rate: float, collector: bool) -> None:
    """Run one case's turns on the virtual clock (`benchmarks._virtual_clock.install` first)."""
    from benchmarks._virtual_clock import VirtualClockLoop

    if not collector:
        gc.disable()
    import awaken_langchain.model  # noqa: F401  (imported before counting starts)
    from benchmarks._common import count_from_here

    loop = VirtualClockLoop()
    count_from_here()
    with tempfile.TemporaryDirectory() as tmp:
        chunks, writes = loop.run_until_complete(
            _turns(CASES[case], streams, chars, rate, Path(tmp))
        )
    loop.close()
    print(json.dumps({"chunks": chunks, "writes": writes}))


def check_child(streams: int, chars: int, rate: float) -> None:
    """Run every case's turns once on the virtual clock (`child` of each, in one process)."""
    from benchmarks._virtual_clock import VirtualClockLoop

    done = {}
    for case in range(len(CASES)):
        loop = VirtualClockLoop()
        with tempfile.TemporaryDirectory() as tmp:
            done[CASES[case]] = loop.run_until_complete(
                _turns(CASES[case], streams, chars, rate, Path(tmp))
            )
        loop.close()
    print(json.dumps(done))


def check(streams: int = 4, chars: int = 40, rate: float = 30.0) -> None:
    """Run every case once, not counted (one process, full speed): what ``--quick`` runs.

    Each case's turns must each deliver their own text; the counting, under
    valgrind, is left to the full run.

    Raises:
        RuntimeError: If a turn did not deliver its own text.
    """
    code = (
        "import benchmarks._virtual_clock as v; v.install()\n"
        "from benchmarks.paced_instructions import check_child\n"
        f"check_child({streams}, {chars}, {rate})\n"
    )
    result, _ = run_child(code, what="paced instructions check")  # raises if a turn failed
    if set(result) != set(CASES) or not all(chunks for chunks, _ in result.values()):
        raise RuntimeError(f"not every case streamed: {result}")
    print(
        f"paced instructions per chunk: not counted in a quick run; every case's "
        f"{streams} turns delivered their text on the virtual clock"
    )


def set_child(sets: int) -> None:
    """Write ``sets`` values of 600 bytes with plain diskcache ``set`` calls (over 64 keys)."""
    import diskcache

    with tempfile.TemporaryDirectory() as tmp:
        cache = diskcache.Cache(tmp, eviction_policy="none", statistics=False)
        value = b"x" * 600
        for i in range(sets):
            cache.set(b"key-%d" % (i % 64), value)
        cache.close()
    print(json.dumps({"chunks": sets, "writes": 0}))


def _self_costs_by_object(path: Path) -> tuple[int, dict[str, int]]:
    """The total, and each object's own instructions, of a callgrind output file."""
    names: dict[str, str] = {}
    costs: collections.Counter[str] = collections.Counter()
    current, skip, total = "?", False, 0
    pattern = re.compile(r"c?ob=\((\d+)\)(?: (.*))?")
    with path.open(errors="replace") as lines:
        for line in lines:
            first = line[:1]
            if first.isdigit() or first in "+-*":
                if skip:  # the cost of a call, counted in the callee's own lines
                    skip = False
                    continue
                parts = line.split()
                if len(parts) > 1:
                    costs[current] += int(parts[1])
            elif line.startswith(("ob=", "cob=")):
                found = pattern.match(line.strip())
                if found is None:
                    continue
                number, name = found.groups()
                if name:
                    names[number] = name
                if line.startswith("ob="):
                    current = number
            elif line.startswith("calls="):
                skip = True
            elif line.startswith(("summary:", "totals:")):
                total = int(line.split()[1])
    return total, {names.get(k, k): v for k, v in costs.items()}


def _count(
    case: int, streams: int, chars: int, rate: float, collector: bool
) -> tuple[int, int, int, int]:
    """Instructions of one child process, and what it did.

    Returns:
        All its instructions, SQLite's own, the chunks of text streamed and the
        checkpoint writes made. ``case`` -1 makes ``streams`` diskcache ``set``
        calls instead (their count takes the place of the chunks).
    """
    callgrind = case >= 0 and CASES[case] == "wrapper, diskcache"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        under = (*CALLGRIND_FROM_HERE, f"--callgrind-out-file={out}")
        code = (
            (
                "import benchmarks._virtual_clock as v; v.install()\n"
                "from benchmarks.paced_instructions import child\n"
                f"child({case}, {streams}, {chars}, {rate}, {collector})\n"
            )
            if case >= 0
            else f"from benchmarks.paced_instructions import set_child\nset_child({streams})\n"
        )
        what = f"valgrind run of {CASES[case] if case >= 0 else 'diskcache set'!r}"
        result, stderr = run_child(
            code,
            what=what,
            under=under if callgrind else CACHEGRIND,
            env={
                **child_env(),
                "PYTHONHASHSEED": "0",
                **({COUNT_FROM_HERE: "1"} if callgrind else {}),
            },
            timeout=3_600,
        )
        chunks, writes = int(result["chunks"]), int(result["writes"])
        if callgrind:
            total, by_object = _self_costs_by_object(out)
            sqlite = sum(n for name, n in by_object.items() if _SQLITE in name)
            return total, sqlite, chunks, writes
    return counted_instructions(stderr, what), 0, chunks, writes


def measure(
    streams: int = 100,
    chars: int = 600,
    rate: float = 30.0,
    cases: tuple[str, ...] = CASES,
) -> Measured:
    """Instructions per chunk of ``cases`` at ``streams`` streams, less ``streams / 2``."""
    require_valgrind()
    if streams < 2:
        raise ValueError(f"--streams must be at least 2, got {streams}")
    sizes = (streams // 2, streams)
    jobs = [
        (CASES.index(case), size, chars, rate, collector)
        for case in cases
        for collector in (True, False)
        for size in sizes
    ]
    jobs += [(-1, sets, 0, 0.0, True) for sets in _SETS]
    with ThreadPoolExecutor(max_workers=cores()) as pool:
        counts = dict(zip(jobs, pool.map(lambda job: _count(*job), jobs), strict=True))

    def per_chunk(case: int, collector: bool, part: int, runs: tuple[int, ...] = sizes) -> float:
        small, large = (
            counts[(case, n, chars if case >= 0 else 0, rate if case >= 0 else 0.0, collector)]
            for n in runs
        )
        return (large[part] - small[part]) / (large[2] - small[2])

    rows = []
    for case in cases:
        index = CASES.index(case)
        rows.append(
            Row(
                case,
                per_chunk(index, True, 0),
                per_chunk(index, False, 0),
                per_chunk(index, True, 3),
                per_chunk(index, True, 1) if case == CASES[3] else None,
            )
        )
    bare = rows[0]
    for row in rows:
        row.ratio = row.per_chunk / bare.per_chunk
        row.ratio_without_gc = row.without_gc / bare.without_gc
    return Measured(rows, per_chunk(-1, True, 0, _SETS))


def main(streams: int = 100, chars: int = 600, rate: float = 30.0) -> Measured:
    """Measure, print the table and return what was measured."""
    measured = measure(streams, chars, rate)
    print(
        f"## Paced streams on a virtual clock, instructions per chunk ({streams} minus "
        f"{streams // 2} streams of {chars // 4} chunks at {rate:g} chunks/s; valgrind); "
        f"{machine_line()}"
    )
    print(
        table(
            [
                "case",
                "instructions/chunk",
                "ratio",
                "of it in SQLite",
                "without GC",
                "ratio",
                "streams by instructions, of bare",
                "chunks per write",
            ],
            [
                (
                    r.case,
                    f"{r.per_chunk:,.0f}",
                    f"{r.ratio:.3f}x",
                    "-" if r.sqlite is None else f"{r.sqlite:,.0f}",
                    f"{r.without_gc:,.0f}",
                    f"{r.ratio_without_gc:.3f}x",
                    f"{1 / r.ratio:.0%}",
                    f"{1 / r.writes_per_chunk:.2f}" if r.writes_per_chunk else "-",
                )
                for r in measured.rows
            ],
        )
    )
    work = measured.store_work_per_write()
    if work is not None:
        print(
            f"DiskCache's work per checkpoint write: {work:,.0f} instructions; a plain "
            f"diskcache set of 600 bytes: {measured.set_instructions:,.0f} "
            f"({work / measured.set_instructions:.2f}x)"
        )
    return measured


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=100, help="streams of the larger run")
    parser.add_argument("--chars", type=int, default=600, help="characters per turn (4 a chunk)")
    parser.add_argument("--rate", type=float, default=30.0, help="chunks/s of each stream")
    args = parser.parse_args()
    main(args.streams, args.chars, args.rate)
