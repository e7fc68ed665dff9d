"""Run every benchmark at its default size, one after the other.

Run: ``python -m benchmarks [--quick]``; ``--quick`` runs each at a small size
(a smoke run, not figures to quote: a minute or two). Each benchmark still
checks what it claims (every stream delivers its text, every store holds its
turn); the ones that count instructions under valgrind, which slows a process
down about 50 times, run their cases once at full speed instead, uncounted.
"""

from __future__ import annotations

import argparse
import shutil
import time
from collections.abc import Callable

from benchmarks import (
    capacity,
    checkpoint_growth,
    checkpoint_put,
    concurrency,
    instructions,
    lock_wait,
    overhead,
    paced_instructions,
    readers,
    recovery_latency,
    sdk_instructions,
    sdk_overhead,
    seam_accuracy,
    server_stores,
    snapshot_instructions,
    store_size,
    tool_ledger,
    wasted_work,
)


def _instructions(**sizes: int) -> None:
    if shutil.which("valgrind") is None:  # the only benchmarks that need it
        print("instructions per chunk: skipped, valgrind is not installed\n")
        return
    instructions.main(**sizes)
    print()


def _paced_instructions(**sizes: int) -> None:
    if shutil.which("valgrind") is None:
        print("paced instructions per chunk: skipped, valgrind is not installed\n")
        return
    paced_instructions.main(**sizes)
    print()


def _sdk_instructions() -> None:
    if shutil.which("valgrind") is None:
        print("instructions around the real integrations: skipped, valgrind is not installed\n")
        return
    sdk_instructions.main()


def _snapshot_instructions() -> None:
    if shutil.which("valgrind") is None:
        print("instructions per checkpoint: skipped, valgrind is not installed\n")
        return
    snapshot_instructions.main()
    print()


def _quick_steps() -> list[tuple[str, Callable[[], object]]]:
    """Each benchmark at a small size; valgrind counts are replaced by uncounted runs."""
    return [
        ("overhead", lambda: overhead.main(chunks=500, rounds=1, turns=20)),
        ("instructions", lambda: instructions.check(chunks=200)),
        ("sdk_overhead", lambda: sdk_overhead.main(chunks=200, rounds=1)),
        ("snapshot_instructions", snapshot_instructions.check),
        ("checkpoint_put", lambda: checkpoint_put.main(size=20_000, small=2_000, puts=20)),
        ("checkpoint_growth", lambda: checkpoint_growth.main(tokens=(100, 1_000))),
        (
            "recovery_latency",
            lambda: recovery_latency.main(prefixes=(1_000, 10_000), repeats=3, processes=1),
        ),
        ("wasted_work", lambda: wasted_work.main(tokens=100, fractions=(0.5,), delay=0.0)),
        ("concurrency", lambda: concurrency.main(streams=8, processes=2, chars=64)),
        ("concurrency, paced", lambda: concurrency.paced(streams=8, processes=2, chars=60)),
        ("lock_wait", lambda: lock_wait.main(processes=2, groups=20, rounds=1)),
        (  # one trial per case: the search itself is the full run's
            "capacity",
            lambda: capacity.main(chars=60, start=8, limit=8, late_ms=1_000.0, same_rounds=1),
        ),
        ("paced_instructions", lambda: paced_instructions.check(streams=4, chars=40)),
        ("seam_accuracy", lambda: seam_accuracy.main(quick=True)),
        ("store_size", lambda: store_size.main(turns=100)),
        ("tool_ledger", lambda: tool_ledger.main(calls=30)),
        ("server_stores", lambda: server_stores.main(puts=5, turns=2, concurrent=8)),
        ("readers", readers.quick),
    ]


def _full_steps() -> list[tuple[str, Callable[[], object]]]:
    return [
        ("overhead", overhead.main),
        ("instructions", _instructions),
        ("sdk_overhead", sdk_overhead.main),
        ("sdk_instructions", _sdk_instructions),
        ("snapshot_instructions", _snapshot_instructions),
        ("checkpoint_put", checkpoint_put.main),
        ("checkpoint_growth", checkpoint_growth.main),
        ("recovery_latency", recovery_latency.main),
        ("wasted_work", wasted_work.main),
        ("concurrency", concurrency.main),
        ("concurrency, paced", concurrency.paced),
        ("lock_wait", lock_wait.main),
        ("capacity", capacity.main),
        ("paced_instructions", _paced_instructions),
        ("seam_accuracy", seam_accuracy.main),
        ("store_size", store_size.main),
        ("tool_ledger", tool_ledger.main),
        (
            "server_stores",
            lambda: server_stores.main(instructions=shutil.which("valgrind") is not None),
        ),
        ("readers", readers.main),
    ]


def main(quick: bool = False) -> None:
    """Run the benchmarks in turn, each printing its own table, then how long each took."""
    started = time.perf_counter()
    took = []
    for name, run in _quick_steps() if quick else _full_steps():
        began = time.perf_counter()
        run()
        took.append((name, time.perf_counter() - began))
    print(", ".join(f"{name} {seconds:.0f} s" for name, seconds in took))
    print(f"all benchmarks ran in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Run every benchmark.")
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    main(parser.parse_args().quick)
