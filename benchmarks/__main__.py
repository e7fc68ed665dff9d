"""Run every benchmark at its default size, one after the other.

Run: ``python -m benchmarks [--quick]``; ``--quick`` runs each at a small size
(a smoke run, not figures to quote).
"""

from __future__ import annotations

import argparse
import shutil
import time

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


def main(quick: bool = False) -> None:
    """Run the benchmarks in turn, each printing its own table."""
    started = time.perf_counter()
    if quick:
        overhead.main(chunks=2_000, rounds=1, turns=50)
        _instructions(chunks=1_000, short=200, seeds=1)
        sdk_overhead.main(chunks=200, rounds=1)
        checkpoint_put.main(size=20_000, small=2_000, puts=20)
        checkpoint_growth.main(tokens=(100, 1_000))
        recovery_latency.main(prefixes=(1_000, 10_000), repeats=3, processes=1)
        wasted_work.main(tokens=200, fractions=(0.5,), delay=0.0)
        concurrency.main(streams=16, processes=2, chars=128)
        concurrency.paced(streams=16, processes=2, chars=120)
        lock_wait.main(processes=2, groups=50, rounds=1)
        capacity.main(chars=60, start=8, limit=16)
        _paced_instructions(streams=4, chars=40)
        seam_accuracy.main(quick=True)
        store_size.main(turns=100)
        tool_ledger.main(calls=30)
        server_stores.main(puts=5, turns=2, concurrent=8)
        readers.quick()
    else:
        overhead.main()
        _instructions()
        sdk_overhead.main()
        _sdk_instructions()
        checkpoint_put.main()
        checkpoint_growth.main()
        recovery_latency.main()
        wasted_work.main()
        concurrency.main()
        concurrency.paced()
        lock_wait.main()
        capacity.main()
        _paced_instructions()
        seam_accuracy.main()
        store_size.main()
        tool_ledger.main()
        server_stores.main(instructions=shutil.which("valgrind") is not None)
        readers.main()
    print(f"all benchmarks ran in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Run every benchmark.")
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    main(parser.parse_args().quick)
