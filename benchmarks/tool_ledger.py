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

Run: ``python benchmarks/tool_ledger.py [--calls 300]``
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script from a clone
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from langchain_core.tools import tool

from awaken_langchain import ToolLedger
from benchmarks._common import machine_line, make_store, median, redis_server, store_names, table


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


def main(calls: int = 300, *, redis: bool = True) -> list[Row]:
    """Measure every store and print the table."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-ledger-") as root, redis_server() as url:
        for name in store_names(redis=redis and url is not None):
            rows.append(measure(name, Path(root) / name, calls, url))
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
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    main(parser.parse_args().calls)
