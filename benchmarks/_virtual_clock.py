"""A virtual clock for paced benchmarks: the event loop's sleeps take no time.

`install` replaces ``time.monotonic`` and ``time.perf_counter`` with one
virtual clock, before the code under test is imported (so defaults such as
``RetryPolicy.clock`` and the checkpoint cadence's shared write moments use it
too). `VirtualClockLoop` is an event loop whose selector, instead of blocking
until its next timer, moves that clock forward to it. Streams paced on that
clock then see exactly the times they would at full speed: chunks fall due
on schedule, checkpoints fall due by the 0.25 s rule, the writer gathers for
its 10 ms, whatever the process's real speed. A run is as fast as the CPU
allows and repeats to the instruction under valgrind (with `random` seeded), which slows a process
down about 50 times and would otherwise turn a paced run into another
program.

Only code that waits through the event loop's timers is paced: a real wait
for another thread (a condition variable, a lock) still takes real time, and
the loop blocks for real when it has no timer at all (it waits for another
thread's wake-up).
"""

from __future__ import annotations

import asyncio
import random
import selectors
import time
from typing import Any

START = 1_000.0
"""Where the virtual clock starts (seconds)."""

_now = [START]


def now() -> float:
    """The virtual clock's time, in seconds."""
    return _now[0]


def install() -> None:
    """Make ``time.monotonic`` and ``time.perf_counter`` read the virtual clock.

    Also seeds `random`, so that what the code under test draws from it when
    it is imported (the phase of a process's shared write moments) repeats
    from run to run.
    """
    time.monotonic = now
    time.perf_counter = now
    random.seed(0)


class _Selector(selectors.DefaultSelector):
    """A selector that moves the virtual clock forward instead of sleeping."""

    def select(self, timeout: float | None = None) -> list[Any]:
        ready: list[Any] = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:  # no timer: only another thread can wake the loop
            return super().select(None)
        _now[0] += timeout
        return []


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """An event loop on the virtual clock (call `install` first)."""

    def __init__(self) -> None:
        super().__init__(_Selector())
