"""Per-chunk overhead of RecoveringChatModel against the bare inner model's stream().

A 20 000-chunk stream is consumed through ``inner.stream()`` (the baseline) and
through ``RecoveringChatModel(model=inner).stream()`` with no store, the
in-memory store and the DiskCache store at the default cadence (a checkpoint
every 8 chunks or 0.25 s), sync and async, each with and without the stream
idle timeout. With the timeout (the default, 60 s) the sync path reads the
inner stream in a pump thread; the async path keeps one timer per stream.
CPU time (``time.process_time``, all threads of the process) and wall time are
the minimum over interleaved rounds; ratios are against the baseline of the
same path (sync or async) in the same run.

Each case also runs a second time per round with the garbage collector off.
LangChain keeps every chunk of a streamed turn until it ends, so the
collector's full passes over that growing heap cost the bare stream and the
wrapper alike, and where they fall moves a single figure by 10 % and more
between runs. Without the collector, the ratio (best of the rounds) and the
range of one round's ratios (each round's case over the same round's bare
stream) show the wrapper's own cost and how far one measurement strays.

The inner model is ``TokenStreamModel`` (benchmarks/_common.py): it builds one
fresh chunk per token and does nothing else. ``ScriptedChatModel`` is not used
here: its deep copy of every scripted chunk costs about as much as the wrapper
itself, and would hide the overhead being measured.

Goals: no store at most 1.25x the bare CPU time; DiskCache at most 1.75x.

A second table streams ``--turns`` short turns (8 chunks each by default) per
case: what a turn costs to open and close (its set-up, the store's claim and
the turn's last write or delete) shows there.

Run: ``python -m benchmarks.overhead [--chunks 20000] [--rounds 3] [--turns 1000]
[--turn-chunks 8]``
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script from a clone
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from langchain_core.language_models import BaseChatModel

from awaken_langchain import RecoveringChatModel, StreamCheckpointStore
from benchmarks._common import TokenStreamModel, machine_line, make_store, table

IDLE_TIMEOUT = 60.0


@dataclass(frozen=True)
class Case:
    """One way of streaming the turn."""

    name: str
    store: str | None  # None: the bare inner model; "none": the wrapper without a store
    idle_timeout: float | None


CASES = (
    Case("bare inner model", None, None),
    Case("wrapper, no store, no idle timeout", "none", None),
    Case("wrapper, no store, idle timeout 60 s", "none", IDLE_TIMEOUT),
    Case("wrapper, memory, no idle timeout", "memory", None),
    Case("wrapper, memory, idle timeout 60 s", "memory", IDLE_TIMEOUT),
    Case("wrapper, diskcache, no idle timeout", "diskcache", None),
    Case("wrapper, diskcache, idle timeout 60 s", "diskcache", IDLE_TIMEOUT),
)


@dataclass
class Row:
    """Measured costs of one case on one path."""

    path: str
    case: str
    cpu_s: float
    wall_s: float
    cpu_ratio: float = 0.0
    wall_ratio: float = 0.0
    per_chunk_us: float = 0.0
    per_turn_us: float = 0.0
    cpu_s_without_gc: float = 0.0
    """Best CPU seconds with the garbage collector off."""
    ratio_without_gc: float = 0.0
    """``cpu_s_without_gc`` over the bare model's, both best of the rounds."""
    ratios_without_gc: tuple[float, float] = (0.0, 0.0)
    """Lowest and highest ratio without the collector of a single round (each round's
    case over the same round's bare model): how far one measurement can stray."""


def _timed(
    consume: Callable[[], int], chunks: int, *, collector: bool = True
) -> tuple[float, float]:
    gc.collect()  # each case starts from the same heap: a full collection left by the
    # previous case's garbage would otherwise land in this one's time
    if not collector:
        gc.disable()
    try:
        cpu, wall = time.process_time(), time.perf_counter()
        received = consume()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    finally:
        gc.enable()
    if received < chunks:
        raise RuntimeError(f"the stream ended after {received} of {chunks} chunks")
    return cpu, wall


def _model(
    case: Case, inner: TokenStreamModel, directory: Path
) -> tuple[BaseChatModel, StreamCheckpointStore | None]:
    """Return the model to stream and the store to close (or ``None``)."""
    if case.store is None:
        return inner, None
    store: StreamCheckpointStore | None = None
    if case.store != "none":
        store = make_store(case.store, directory / case.name.replace(" ", "_"))
    model = RecoveringChatModel(model=inner, store=store, stream_idle_timeout=case.idle_timeout)
    return model, store


def measure(chunks: int, rounds: int, path: str, turns: int = 1) -> list[Row]:
    """Measure every case on the ``sync`` or ``async`` path: ``turns`` turns of ``chunks``."""
    inner = TokenStreamModel(tokens=chunks)
    best: dict[str, list[float]] = {c.name: [float("inf"), float("inf")] for c in CASES}
    without_gc: dict[str, list[float]] = {c.name: [] for c in CASES}  # per round
    with tempfile.TemporaryDirectory() as tmp:
        built = [(case, *_model(case, inner, Path(tmp))) for case in CASES]
        try:
            for _ in range(rounds):
                for case, model, _store in built:
                    if path == "sync":

                        def consume(model: BaseChatModel = model) -> int:
                            return sum(1 for i in range(turns) for _ in model.stream(f"hi {i}"))

                    else:

                        def consume(model: BaseChatModel = model) -> int:
                            async def drain() -> int:
                                n = 0
                                for i in range(turns):
                                    async for _ in model.astream(f"hi {i}"):
                                        n += 1
                                return n

                            return asyncio.run(drain())

                    cpu, wall = _timed(consume, chunks * turns)
                    best[case.name][0] = min(best[case.name][0], cpu)
                    best[case.name][1] = min(best[case.name][1], wall)
                    cpu, _ = _timed(consume, chunks * turns, collector=False)
                    without_gc[case.name].append(cpu)
        finally:
            for _, _, store in built:
                if store is not None:
                    store.close()
    base_cpu, base_wall = best[CASES[0].name]
    base_rounds = without_gc[CASES[0].name]
    rows = []
    for case in CASES:
        cpu, wall = best[case.name]
        rounds_cpu = without_gc[case.name]
        each = [c / b for c, b in zip(rounds_cpu, base_rounds, strict=True)]
        rows.append(
            Row(
                path,
                case.name,
                cpu,
                wall,
                cpu / base_cpu,
                wall / base_wall,
                (cpu - base_cpu) / (chunks * turns) * 1e6,
                (cpu - base_cpu) / turns * 1e6,
                min(rounds_cpu),
                min(rounds_cpu) / min(base_rounds),
                (min(each), max(each)),
            )
        )
    return rows


def main(
    chunks: int = 20_000, rounds: int = 3, turns: int = 1_000, turn_chunks: int = 8
) -> list[Row]:
    """Measure the sync and async paths, print the tables, and return the rows.

    One long stream gives the cost of a chunk; ``turns`` short turns of
    ``turn_chunks`` chunks each (``turns=0``: not measured) add what a turn
    costs to open and close (its claim, its last write or delete, its set-up).
    """
    rows = measure(chunks, rounds, "sync") + measure(chunks, rounds, "async")
    print(f"## Per-chunk overhead: {chunks:,} chunks, best of {rounds} rounds; {machine_line()}")
    print(
        table(
            [
                "path",
                "case",
                "CPU s",
                "wall s",
                "CPU ratio",
                "wall ratio",
                "extra CPU us/chunk",
                "CPU ratio without GC",
                "one round's, without GC",
            ],
            [
                (
                    r.path,
                    r.case,
                    r.cpu_s,
                    r.wall_s,
                    f"{r.cpu_ratio:.2f}x",
                    f"{r.wall_ratio:.2f}x",
                    r.per_chunk_us,
                    f"{r.ratio_without_gc:.2f}x",
                    f"{r.ratios_without_gc[0]:.2f}-{r.ratios_without_gc[1]:.2f}x",
                )
                for r in rows
            ],
        )
    )
    print()
    if turns <= 0:
        return rows
    short = measure(turn_chunks, rounds, "sync", turns) + measure(
        turn_chunks, rounds, "async", turns
    )
    print(
        f"## Per-turn overhead: {turns:,} turns of {turn_chunks} chunks, best of {rounds} "
        f"rounds; {machine_line()}"
    )
    print(
        table(
            ["path", "case", "CPU s", "CPU ratio", "CPU us/turn", "extra CPU us/turn"],
            [
                (
                    r.path,
                    r.case,
                    r.cpu_s,
                    f"{r.cpu_ratio:.2f}x",
                    r.cpu_s / turns * 1e6,
                    r.per_turn_us,
                )
                for r in short
            ],
        )
    )
    print()
    return rows + short


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=20_000, help="chunks per stream")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved repetitions")
    parser.add_argument("--turns", type=int, default=1_000, help="short turns (0: none)")
    parser.add_argument("--turn-chunks", type=int, default=8, help="chunks per short turn")
    args = parser.parse_args()
    main(args.chunks, args.rounds, args.turns, args.turn_chunks)
