"""Concurrent turns: many async streams in one process, and several processes on one store.

Every turn streams its own answer (the text depends on the turn's question),
breaks once halfway with ``ConnectionResetError`` and is continued, while its
checkpoints go to the store at the default cadence (every 8 chunks or 0.25 s).
Cases: 256 concurrent ``astream`` turns in one process (memory, diskcache,
Redis), and 4 processes x 64 turns on one DiskCache directory (and on one
Redis server). The inner model gives other tasks a turn after every chunk, so
the streams interleave as network streams do.

The table shows throughput (chunks delivered per second over the whole run),
the p50/p99 latency of a checkpoint put as the turn sees it (``aput``, which
for the thread-backed stores includes the hop to a worker thread), and the
check: every turn completed with exactly its own text after one continuation,
and no checkpoint was left behind.

Paced cases (:func:`paced`) stream as a provider does, on a clock: 256 async
turns in one process at 30 chunks/s each (starts spread over one second), and
4 processes x 64 such turns on one DiskCache directory and on one Redis server,
next to the same turns on the bare inner model. The inner model only sleeps
until each chunk is due. Per turn they measure:

- store wait: what a checkpointing chunk spends in the writer's hand-over
  (``submit`` and the health check) on the stream's path, p50/p99/max; and the
  waits a turn makes at its start (claim) and its end (closing write), apart;
- checkpoint lag: from the moment a chunk reached the wrapper to the return of
  the store commit (``put_many`` or ``put``) of a checkpoint containing it;
- lateness: how long after its due time the caller received each chunk
  (goal: a store adds at most 20 ms to the bare stream's p99 in the same case);
- CPU per chunk of the process (all threads, the writer's too);
- put CPU: the committing thread's CPU per checkpoint, the part of it spent in
  garbage collections that began during a commit (set off by an allocation
  there, their length is the whole heap's), and both against the CPU of a plain
  diskcache ``set`` measured after the turns (the floor);
- the check: every turn delivered exactly its own text.

``--no-full-gc`` runs the paced cases with the garbage collector kept to its
young generations, to show what full collections (whose pause grows with every
object the process holds) add to lateness and lag, bare and wrapped alike.

Run: ``python -m benchmarks.concurrency [--streams 256] [--processes 4] [--chars 1024]
[--paced-chars 1200] [--rate 30] [--only unpaced|paced] [--no-full-gc]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

if __package__ in (None, ""):  # run as a script from a clone
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from awaken_langchain import RecoveringChatModel, RetryPolicy, StreamCheckpoint
from awaken_langchain.checkpoint import DeferredCheckpoint, built
from awaken_langchain.writer import _ATTRIBUTE, CheckpointWriter, writer_for
from benchmarks._common import (
    REPO_ROOT,
    ContinuingModel,
    PacedModel,
    TimedStore,
    answer_for,
    child_env,
    child_results,
    diskcache_set_floor,
    machine_line,
    make_store,
    median,
    paced_turn,
    percentile,
    redis_server,
    table,
    timed,
)

T = TypeVar("T")


async def _no_wait(_seconds: float) -> None:
    return None


async def _turns(
    store_name: str, location: str, streams: int, chars: int, tag: str
) -> dict[str, Any]:
    """Run ``streams`` concurrent turns against one store; return what was measured."""
    url = location if store_name == "redis" else None
    store = timed(make_store(store_name, Path(location), url))
    inner = ContinuingModel(chars=chars, chunk_chars=4, break_after=chars // 2, yield_every=1)
    model = RecoveringChatModel(
        model=inner,
        store=store,
        retry_policy=RetryPolicy(sleep=lambda _s: None, async_sleep=_no_wait),
    )

    async def turn(i: int) -> tuple[bool, int]:
        question = f"{tag}-{i}"
        chunks = [chunk async for chunk in model.astream(question)]
        text = "".join(str(c.content) for c in chunks)
        awaken = chunks[-1].response_metadata["awaken"]
        ok = text == answer_for(question, chars) and awaken["continuations"] == 1
        return ok, len(chunks)

    started = time.time()
    try:
        results = await asyncio.gather(*(turn(i) for i in range(streams)))
        finished = time.time()
        # a closing delete the turn stopped waiting for is still queued: let it land
        writer = writer_for(store)
        await writer.await_(writer.call(_landed), 60.0)
        left = len(store.list_run_ids())
    finally:
        store.close()
    return {
        "started": started,
        "finished": finished,
        "turns": streams,
        "ok": sum(ok for ok, _ in results),
        "chunks": sum(n for _, n in results),
        "puts": store.put_seconds,
        "left": left,
    }


def _left(store_name: str, location: str) -> int:
    """Checkpoints left in a shared store once every process has finished."""
    url = location if store_name == "redis" else None
    store = make_store(store_name, Path(location), url)
    try:
        return len(store.list_run_ids())
    finally:
        store.close()


def child(store_name: str, location: str, streams: int, chars: int, tag: str) -> None:
    """One of several processes: run the turns and print the measurements as JSON."""
    print(json.dumps(asyncio.run(_turns(store_name, location, streams, chars, tag))))


# -- paced turns -------------------------------------------------------------------------


class TimedWriter(CheckpointWriter):
    """A store's writer that times what a stream waits for on its own path.

    A checkpointing chunk calls ``submit`` then ``problem`` (no await between):
    their sum is that chunk's wait. ``await_`` is the wait of a turn's opening
    (claim and read) and closing write.
    """

    def __init__(self, store: Any) -> None:
        super().__init__(store)
        self.chunk_waits: list[float] = []
        self.turn_waits: list[float] = []
        self._submitted = 0.0

    def submit(
        self, checkpoint: StreamCheckpoint | DeferredCheckpoint, *, on_loop: bool = False
    ) -> None:
        start = time.perf_counter()
        super().submit(checkpoint, on_loop=on_loop)
        self._submitted = time.perf_counter() - start

    def problem(self, run_id: str, deadline: float) -> Any:
        start = time.perf_counter()
        try:
            return super().problem(run_id, deadline)
        finally:
            self.chunk_waits.append(self._submitted + time.perf_counter() - start)
            self._submitted = 0.0

    async def await_(self, future: Future[T], deadline: float) -> T:
        start = time.perf_counter()
        try:
            return await super().await_(future, deadline)
        finally:
            self.turn_waits.append(time.perf_counter() - start)


def _landed() -> None:
    """A no-op for the writer thread: its return means every earlier write landed."""


async def _paced_turns(
    store_name: str, location: str, streams: int, chars: int, rate: float, tag: str
) -> dict[str, Any]:
    """Run ``streams`` paced turns (``store_name`` "bare": no wrapper); return the samples."""
    inner = PacedModel(chars=chars, rate=rate)
    chunk_chars = inner.chunk_chars
    store: TimedStore | None = None
    writer: TimedWriter | None = None
    model: Any = inner
    questions: dict[str, str] = {}
    covered: dict[str, int] = {}
    lags: list[float] = []
    if store_name != "bare":
        url = location if store_name == "redis" else None
        store = timed(make_store(store_name, Path(location), url))
        writer = TimedWriter(store)
        store.__dict__[_ATTRIBUTE] = writer
        model = RecoveringChatModel(model=inner, store=store)

        def committed(checkpoints: Sequence[StreamCheckpoint], now: float) -> None:
            commits.append((list(checkpoints), now))  # read after the turns: not on their path

        store.on_commit = committed

    commits: list[tuple[list[StreamCheckpoint | DeferredCheckpoint], float]] = []

    def lags_of_commits() -> None:
        """Each chunk's lag from its sending to the first commit that held it."""
        for checkpoints, now in commits:
            for checkpoint in checkpoints:
                question = questions.get(checkpoint.run_id)
                if question is None:
                    continue
                sent = inner.sent[question]
                upto = min(len(built(checkpoint).partial_text) // chunk_chars, len(sent))
                for j in range(covered.get(question, 0), upto):
                    lags.append(now - sent[j])
                covered[question] = max(upto, covered.get(question, 0))

    late: list[float] = []

    async def turn(i: int) -> bool:
        await asyncio.sleep(i / streams)  # arrivals spread over one second
        question = f"{tag}{i}"
        run_id = uuid.uuid4()
        questions[str(run_id)] = question
        return await paced_turn(model, inner, question, late, run_id=run_id)

    cpu = time.process_time()
    try:
        results = await asyncio.gather(*(turn(i) for i in range(streams)))
        cpu = time.process_time() - cpu
        lags_of_commits()
        left = 0
        if store is not None and writer is not None:
            # a closing write the turn stopped waiting for is still queued: let it land
            await CheckpointWriter.await_(writer, writer.call(_landed), 60.0)
            left = len(store.list_run_ids())
    finally:
        if store is not None:
            store.close()
    return {
        "turns": streams,
        "ok": sum(results),
        "left": left,
        "chunks": len(late),
        "cpu": cpu,
        "late": late,
        "lags": lags,
        "chunk_waits": writer.chunk_waits if writer else [],
        "turn_waits": writer.turn_waits if writer else [],
        "batches": store.batches if store else [],
        "puts": len(store.put_seconds) if store else 0,
        "put_cpu": store.put_cpu_seconds if store else 0.0,
        "put_collector": store.put_collector_seconds if store else 0.0,
        "set_floor": diskcache_set_floor(Path(location) / "floor")
        if store_name == "diskcache"
        else None,
    }


@contextlib.contextmanager
def _full_collections(enabled: bool) -> Iterator[None]:
    """Leave the garbage collector as it is, or (``enabled=False``) keep it to its
    young generations: no full collection, whose pause grows with every object the
    process holds (LangChain keeps each chunk of a turn until the turn ends)."""
    before = gc.get_threshold()
    if not enabled:
        gc.set_threshold(before[0], before[1], 1_000_000_000)
    try:
        yield
    finally:
        gc.set_threshold(*before)


def paced_child(
    store_name: str,
    location: str,
    streams: int,
    chars: int,
    rate: float,
    tag: str,
    full_gc: bool = True,
) -> None:
    """One of several processes: run paced turns and print the samples as JSON."""
    with _full_collections(full_gc):
        result = asyncio.run(_paced_turns(store_name, location, streams, chars, rate, tag))
    print(json.dumps(result))


@dataclass
class PacedRow:
    """One paced case."""

    case: str
    store: str
    turns: int
    ok: int
    left: int
    cpu_us_per_chunk: float
    late_p99_ms: float
    wait_p50_ms: float
    wait_p99_ms: float
    wait_max_ms: float
    turn_wait_p99_ms: float
    lag_p50_ms: float
    lag_p99_ms: float
    lagged_chunks: int
    chunks: int
    batch_mean: float
    put_cpu_us: float
    put_collector_us: float
    set_floor_us: float | None


def _paced_row(case: str, store: str, results: list[dict[str, Any]]) -> PacedRow:
    def merged(key: str) -> list[float]:
        return [v for r in results for v in r[key]]

    chunks = sum(r["chunks"] for r in results)
    waits, turn_waits, lags = merged("chunk_waits"), merged("turn_waits"), merged("lags")
    batches = merged("batches")
    ms = 1e3
    return PacedRow(
        case,
        store,
        sum(r["turns"] for r in results),
        sum(r["ok"] for r in results),
        sum(r["left"] for r in results),
        sum(r["cpu"] for r in results) / chunks * 1e6,
        percentile(merged("late"), 0.99) * ms,
        percentile(waits, 0.5) * ms,
        percentile(waits, 0.99) * ms,
        max(waits, default=float("nan")) * ms,
        percentile(turn_waits, 0.99) * ms,
        percentile(lags, 0.5) * ms,
        percentile(lags, 0.99) * ms,
        len(lags),
        chunks,
        sum(batches) / len(batches) if batches else float("nan"),
        sum(r["put_cpu"] for r in results) / max(1, sum(r["puts"] for r in results)) * 1e6,
        sum(r["put_collector"] for r in results) / max(1, sum(r["puts"] for r in results)) * 1e6,
        None
        if results[0]["set_floor"] is None
        else median([r["set_floor"] for r in results]) * 1e6,
    )


def _paced_processes(
    store_name: str,
    location: str,
    processes: int,
    streams: int,
    chars: int,
    rate: float,
    full_gc: bool,
) -> list[dict[str, Any]]:
    children = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from benchmarks.concurrency import paced_child\n"
                f"paced_child({store_name!r}, {location!r}, {streams}, {chars}, {rate}, 'p{n}-', "
                f"{full_gc})\n",
            ],
            cwd=REPO_ROOT,
            env=child_env(),
            stdout=subprocess.PIPE,
            text=True,
        )
        for n in range(processes)
    ]
    return child_results(children, f"paced {store_name} worker")


def paced(
    streams: int = 256,
    processes: int = 4,
    chars: int = 1_200,
    rate: float = 30.0,
    stores: tuple[str, ...] = (),
    full_gc: bool = True,
) -> list[PacedRow]:
    """Run the paced cases (on ``stores``, default diskcache and Redis), print a table.

    ``full_gc=False`` runs them without full garbage collections, to show what
    those pauses add to lateness and lag (the same for the bare stream).
    """
    per_process = max(1, streams // processes)
    rows = []
    with redis_server() as server, tempfile.TemporaryDirectory() as tmp:
        names = [
            name
            for name in ["diskcache"] + (["redis"] if server else [])
            if not stores or name in stores
        ]
        for name in ["bare", *names[:1]]:
            location = f"{tmp}/one-{name}"
            with _full_collections(full_gc):
                result = asyncio.run(_paced_turns(name, location, streams, chars, rate, "one-"))
            rows.append(_paced_row(f"1 process x {streams}", name, [result]))
        for name in ["bare", *names]:
            location = server if name == "redis" and server else f"{tmp}/shared"
            results = _paced_processes(name, location, processes, per_process, chars, rate, full_gc)
            row = _paced_row(f"{processes} processes x {per_process}", name, results)
            if name != "bare":
                row.left = _left(name, location)
            rows.append(row)
    print(
        f"## Paced turns: {chars // 4} chunks of 4 characters at {rate:g} chunks/s each, "
        f"checkpoints at the default cadence{'' if full_gc else ', no full collections'}; "
        f"{machine_line()}"
    )
    print(
        table(
            [
                "case",
                "store",
                "own text",
                "left",
                "CPU us/chunk",
                "late p99 ms",
                "store wait p50/p99/max ms",
                "open+close wait p99 ms",
                "lag p50 ms",
                "lag p99 ms",
                "chunks in a checkpoint",
                "batch",
                "put CPU us",
                "of it GC us",
                "set floor us",
                "put/set",
                "put/set without GC",
            ],
            [
                (
                    r.case,
                    r.store,
                    f"{r.ok}/{r.turns}",
                    r.left,
                    r.cpu_us_per_chunk,
                    r.late_p99_ms,
                    "-"
                    if r.store == "bare"
                    else f"{r.wait_p50_ms:.3f}/{r.wait_p99_ms:.3f}/{r.wait_max_ms:.1f}",
                    None if r.store == "bare" else r.turn_wait_p99_ms,
                    None if r.store == "bare" else r.lag_p50_ms,
                    None if r.store == "bare" else r.lag_p99_ms,
                    None if r.store == "bare" else f"{r.lagged_chunks}/{r.chunks}",
                    None if r.store == "bare" else r.batch_mean,
                    None if r.store == "bare" else r.put_cpu_us,
                    None if r.store == "bare" else r.put_collector_us,
                    r.set_floor_us,
                    None if r.set_floor_us is None else f"{r.put_cpu_us / r.set_floor_us:.1f}x",
                    None
                    if r.set_floor_us is None
                    else f"{(r.put_cpu_us - r.put_collector_us) / r.set_floor_us:.1f}x",
                )
                for r in rows
            ],
        )
    )
    print()
    print(lateness_goal_line(rows))
    print()
    for r in rows:
        if r.ok != r.turns or r.left:
            raise RuntimeError(f"{r.case} on {r.store}: a turn lost its text or its checkpoint")
    return rows


LATENESS_GOAL_MS = 20.0
"""Most a checkpointing store may add to the bare stream's chunk lateness p99, per case."""


def lateness_goal_line(rows: list[PacedRow]) -> str:
    """Whether every store's turns were late at p99 by at most `LATENESS_GOAL_MS` more than
    the bare turns of the same case."""
    bare = {r.case: r.late_p99_ms for r in rows if r.store == "bare"}
    checked = [r for r in rows if r.store != "bare" and r.case in bare]
    added = {(r.case, r.store): r.late_p99_ms - bare[r.case] for r in checked}
    verdict = "met" if all(ms <= LATENESS_GOAL_MS for ms in added.values()) else "not met"
    figures = ", ".join(f"{case} {store} {ms:+.1f} ms" for (case, store), ms in added.items())
    return (
        f"Goal: chunk lateness p99 at most {LATENESS_GOAL_MS:g} ms over the bare stream's: "
        f"{verdict} ({figures})."
    )


@dataclass
class Row:
    """One concurrency case."""

    case: str
    store: str
    turns: int
    ok: int
    left: int
    chunks_per_s: float
    puts: int
    p50_ms: float
    p99_ms: float


def _row(case: str, store: str, results: list[dict[str, Any]], left: int) -> Row:
    puts = [p for r in results for p in r["puts"]]
    seconds = max(r["finished"] for r in results) - min(r["started"] for r in results)
    return Row(
        case,
        store,
        sum(r["turns"] for r in results),
        sum(r["ok"] for r in results),
        left,
        sum(r["chunks"] for r in results) / seconds,
        len(puts),
        percentile(puts, 0.5) * 1e3,
        percentile(puts, 0.99) * 1e3,
    )


def _processes(
    store_name: str, location: str, processes: int, streams: int, chars: int
) -> list[dict[str, Any]]:
    children = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from benchmarks.concurrency import child\n"
                f"child({store_name!r}, {location!r}, {streams}, {chars}, 'p{n}')\n",
            ],
            cwd=REPO_ROOT,
            env=child_env(),
            stdout=subprocess.PIPE,
            text=True,
        )
        for n in range(processes)
    ]
    return child_results(children, f"{store_name} worker")


def main(
    streams: int = 256, processes: int = 4, chars: int = 1_024, stores: tuple[str, ...] = ()
) -> list[Row]:
    """Run every case (on ``stores``, default all), print a table, and return the rows."""
    per_process = max(1, streams // processes)
    rows = []
    with redis_server() as server, tempfile.TemporaryDirectory() as tmp:
        local = [
            name
            for name in ["memory", "diskcache"] + (["redis"] if server else [])
            if not stores or name in stores
        ]
        for name in local:
            location = server if name == "redis" and server else f"{tmp}/one-{name}"
            result = asyncio.run(_turns(name, location, streams, chars, "one"))
            rows.append(_row(f"1 process x {streams}", name, [result], result["left"]))
        shared = [name for name in local if name != "memory"]
        for name in shared:
            location = server if name == "redis" and server else f"{tmp}/shared"
            results = _processes(name, location, processes, per_process, chars)
            case = f"{processes} processes x {per_process}"
            rows.append(_row(case, name, results, _left(name, location)))
    print(
        f"## Concurrency: turns of {chars:,} characters (4 per chunk), each broken once "
        f"and continued; {machine_line()}"
    )
    print(
        table(
            [
                "case",
                "store",
                "turns",
                "own text",
                "left",
                "chunks/s",
                "puts",
                "put p50 ms",
                "put p99 ms",
            ],
            [
                (
                    r.case,
                    r.store,
                    r.turns,
                    f"{r.ok}/{r.turns}",
                    r.left,
                    r.chunks_per_s,
                    r.puts,
                    r.p50_ms,
                    r.p99_ms,
                )
                for r in rows
            ],
        )
    )
    print()
    for r in rows:
        if r.ok != r.turns or r.left:
            raise RuntimeError(f"{r.case} on {r.store}: a turn lost its text or its checkpoint")
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=256, help="concurrent turns in total")
    parser.add_argument("--processes", type=int, default=4, help="processes sharing one store")
    parser.add_argument("--chars", type=int, default=1_024, help="characters per answer")
    parser.add_argument("--stores", nargs="*", default=[], help="stores to measure (default: all)")
    parser.add_argument("--paced-chars", type=int, default=1_200, help="characters per paced turn")
    parser.add_argument("--rate", type=float, default=30.0, help="chunks/s of a paced stream")
    parser.add_argument("--only", choices=["unpaced", "paced"], help="run one kind of case")
    parser.add_argument(
        "--no-full-gc",
        action="store_true",
        help="paced cases without full garbage collections (young generations only)",
    )
    args = parser.parse_args()
    if args.only != "paced":
        main(args.streams, args.processes, args.chars, tuple(args.stores))
    if args.only != "unpaced":
        paced(
            args.streams,
            args.processes,
            args.paced_chars,
            args.rate,
            tuple(args.stores),
            full_gc=not args.no_full_gc,
        )
