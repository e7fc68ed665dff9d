"""What the tool ledger costs per tool call, per store, next to the tool's own cost.

For each store (Redis too, on a throwaway local redis-server when one is
installed), the same trivial tool is invoked with a ``ToolCall``:

- **bare**: the tool itself (LangChain's ``invoke``: input parsing, callbacks,
  the ``ToolMessage``), the least a tool call costs;
- **first run**: through ``ToolLedger.wrap`` with a new call id each time (read,
  claim, read, ``started``, the tool, ``finished``);
- **replay**: the same calls again, answered from their records (one read).

It prints the median wall time and CPU time per call, and the ledger's cost as
a multiple of the bare call and in microseconds added. A real tool's own cost
(a network request: milliseconds) dwarfs the bare figure, so the microseconds
added are the figure to compare with it.

With ``--instructions`` (needs ``valgrind``) it also counts the instructions
per call of each case, the figure that does not move with the machine: each
case runs in a fresh process under valgrind's ``cachegrind`` at two numbers of
calls, and the difference divided by the difference in calls is one call's
cost, the interpreter's start-up and the imports taken out. A replay is
counted after first runs of the same calls, whose count is then subtracted.
The ledger's deadline is raised for these runs (valgrind runs a process about
50 times slower), so every call goes through the store as at full speed.
Instructions include the store's writer thread; time spent waiting on Redis
or on a disk sync costs none.

Run: ``python benchmarks/tool_ledger.py [--calls 300] [--instructions]``
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script from a clone
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from langchain_core.tools import tool

from awaken_langchain import ToolLedger
from benchmarks._common import (
    CACHEGRIND,
    counted_instructions,
    machine_line,
    make_store,
    median,
    redis_server,
    require_valgrind,
    run_child,
    store_names,
    table,
)


@tool
def lookup(city: str) -> str:
    """Look up a city."""
    return city


@dataclass
class Row:
    """One store's figures, in microseconds per call (medians)."""

    store: str
    bare_us: float
    first_us: float
    replay_us: float
    bare_cpu_us: float
    first_cpu_us: float
    replay_cpu_us: float


def _calls(prefix: str, count: int) -> list[dict[str, Any]]:
    return [
        {"type": "tool_call", "id": f"{prefix}-{n}", "name": "lookup", "args": {"city": "Paris"}}
        for n in range(count)
    ]


def _timed(invoke: Callable[[Any], Any], calls: list[dict[str, Any]]) -> tuple[float, float]:
    """Median wall and CPU microseconds of ``invoke`` over ``calls``."""
    walls, cpus = [], []
    for call in calls:
        wall, cpu = time.perf_counter(), time.process_time()
        invoke(call)
        walls.append((time.perf_counter() - wall) * 1e6)
        cpus.append((time.process_time() - cpu) * 1e6)
    return median(walls), median(cpus)


def measure(name: str, directory: Path, calls: int, redis_url: str | None) -> Row:
    """Time bare calls, first runs and replays on the store ``name``."""
    store = make_store(name, directory, redis_url)
    try:
        wrapped = ToolLedger(store).wrap(lookup)
        warm = _calls("warm", 20)
        _timed(lookup.invoke, warm)
        _timed(wrapped.invoke, warm)
        bare = _timed(lookup.invoke, _calls("bare", calls))
        fresh = _calls(f"{name}-{time.time_ns()}", calls)
        first = _timed(wrapped.invoke, fresh)
        replay = _timed(wrapped.invoke, fresh)
    finally:
        store.close()
    return Row(name, bare[0], first[0], replay[0], bare[1], first[1], replay[1])


_CHILD = """
import json
from pathlib import Path
from awaken_langchain import ToolLedger
from benchmarks._common import make_store
from benchmarks.tool_ledger import lookup, _calls
case, name, directory, url, count = {args!r}
calls = _calls(Path(directory).name, count)  # ids of their own (a shared Redis)
if case == "bare":
    for call in calls:
        lookup.invoke(call)
else:
    store = make_store(name, Path(directory), url)
    wrapped = ToolLedger(store, deadline=600.0).wrap(lookup)
    for call in calls:
        wrapped.invoke(call)
    if case == "replay":
        for call in calls:
            wrapped.invoke(call)
    store.close()
print(json.dumps({{"calls": count}}))
"""
"""One counted process: ``count`` calls of ``case`` (``replay``: first runs, then replays)."""


@dataclass
class InstructionRow:
    """One store's instructions per call."""

    store: str
    bare: float
    first: float
    replay: float


def instructions_of(case: str, name: str, directory: Path, url: str | None, count: int) -> int:
    """Instructions a process making ``count`` calls of ``case`` on store ``name`` executes."""
    what = f"valgrind run of {case} on {name} ({count} calls)"
    code = _CHILD.format(args=(case, name, str(directory), url, count))
    _, stderr = run_child(code, what=what, under=CACHEGRIND, timeout=900)
    return counted_instructions(stderr, what)


def run_case(case: str, name: str, directory: Path, url: str | None, count: int) -> int:
    """Run what `instructions_of` counts, without valgrind; return the calls made."""
    code = _CHILD.format(args=(case, name, str(directory), url, count))
    figures, _ = run_child(code, what=f"{case} on {name}")
    return int(figures["calls"])


def count_instructions(
    names: list[str],
    root: Path,
    url: str | None,
    short: int,
    long: int,
    count: Callable[[str, str, Path, str | None, int], int] = instructions_of,
) -> list[InstructionRow]:
    """Instructions per call of the bare tool, first runs and replays on each store.

    ``count`` counts one process (`instructions_of`; tests give another).
    """
    if count is instructions_of:
        require_valgrind()
    if long <= short:
        raise ValueError(f"the long run ({long} calls) must make more calls than {short}")
    jobs = [("bare", "memory")] + [(case, name) for name in names for case in ("first", "replay")]
    sized = [(case, name, size) for case, name in jobs for size in (short, long)]

    def one(job: tuple[str, str, int]) -> int:
        case, name, size = job
        return count(case, name, root / f"count-{case}-{name}-{size}", url, size)

    with ThreadPoolExecutor(max_workers=2) as pool:
        counts = dict(zip(sized, pool.map(one, sized), strict=True))

    def per_call(case: str, name: str) -> float:
        return (counts[(case, name, long)] - counts[(case, name, short)]) / (long - short)

    bare = per_call("bare", "memory")
    return [
        InstructionRow(
            name,
            bare,
            per_call("first", name),
            per_call("replay", name) - per_call("first", name),
        )
        for name in names
    ]


def main(
    calls: int = 300,
    *,
    redis: bool = True,
    instructions: bool = False,
    counted: tuple[int, int] = (10, 60),
) -> list[Row]:
    """Measure every store and print the table (and the instruction counts, if asked)."""
    rows = []
    counts: list[InstructionRow] = []
    with tempfile.TemporaryDirectory(prefix="bench-ledger-") as root, redis_server() as url:
        names = store_names(redis=redis and url is not None)
        for name in names:
            rows.append(measure(name, Path(root) / name, calls, url))
        if instructions:
            counts = count_instructions(names, Path(root), url, *counted)
    print(f"## Tool ledger cost per tool call ({calls} calls per case; medians)")
    print(machine_line())
    print(
        table(
            [
                "store",
                "bare µs",
                "first run µs",
                "replay µs",
                "first run / bare",
                "added µs",
                "first run CPU µs",
                "replay CPU µs",
            ],
            [
                (
                    r.store,
                    r.bare_us,
                    r.first_us,
                    r.replay_us,
                    r.first_us / r.bare_us,
                    r.first_us - r.bare_us,
                    r.first_cpu_us,
                    r.replay_cpu_us,
                )
                for r in rows
            ],
        )
    )
    if counts:
        print()
        print(f"## Instructions per tool call (valgrind; {counted[1]} calls less {counted[0]})")
        print(
            table(
                ["store", "bare", "first run", "first run / bare", "added", "replay"],
                [
                    (c.store, c.bare, c.first, c.first / c.bare, c.first - c.bare, c.replay)
                    for c in counts
                ],
            )
        )
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument(
        "--instructions", action="store_true", help="count instructions per call (valgrind)"
    )
    options = parser.parse_args()
    main(options.calls, instructions=options.instructions)
