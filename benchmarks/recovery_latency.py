"""Recovery latency inside the library, and resume time in a fresh process.

In-process: an inner model streams a 1 KB or 100 KB prefix (64-character
chunks), then its stream breaks with ``ConnectionResetError``. The latency is
from the moment the inner model raises to the moment the wrapper hands the
continuation request to the inner model (its ``_stream``/``_astream`` is
entered), as wall time and as CPU time of the process (a busy machine inflates
the first, much less the second): classifying the failure, choosing the plan,
the checkpoint put on interruption (when a store is set), the recovery event,
building the continuation request, and, on the sync path, starting the pump
thread that reads the new stream (idle timeout on, the default). Backoff is excluded: the
policy's sleep does nothing. Goal: under 5 ms at 100 KB.

Fresh process: a 100 KB DiskCache checkpoint is left by a turn whose recovery
failed; a new Python process imports the library, opens the store, builds the
wrapper ("process ready") and streams the same run id. The figure is from
ready to the continuation request reaching the inner model (claim, get,
replaying the stored text, building the request). Goal: under 20 ms.

Run: ``python -m benchmarks.recovery_latency [--repeats 20] [--processes 5]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script from a clone
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import contextlib

from awaken_langchain import (
    DiskCacheStreamCheckpointStore,
    RecoveringChatModel,
    RetryPolicy,
    StreamCheckpointStore,
    StreamInterruptedError,
)
from benchmarks._common import (
    ContinuingModel,
    answer_for,
    machine_line,
    make_store,
    median,
    percentile,
    run_child,
    table,
)

CHUNK = 64
REST = 256
"""Characters of the answer after the prefix."""
QUESTION = "latency"


async def _no_wait(_seconds: float) -> None:
    return None


def no_backoff(**settings: Any) -> RetryPolicy:
    """A retry policy that never waits (backoff is not part of the latency)."""
    return RetryPolicy(sleep=lambda _s: None, async_sleep=_no_wait, **settings)


@dataclass
class Row:
    """Latency of one case."""

    path: str
    store: str
    prefix: int
    median_ms: float
    p90_ms: float
    max_ms: float
    cpu_median_ms: float


def _one(path: str, store: StreamCheckpointStore | None, prefix: int) -> tuple[float, float]:
    """Return the wall and CPU milliseconds from the break to the continuation request."""
    inner = ContinuingModel(chars=prefix + REST, chunk_chars=CHUNK, break_after=prefix)
    model = RecoveringChatModel(model=inner, store=store, retry_policy=no_backoff())
    if path == "sync":
        caught_up = threading.Event()
        inner.break_when(caught_up)
        pieces = []
        received = 0
        for chunk in model.stream(QUESTION):
            pieces.append(str(chunk.content))
            received += len(pieces[-1])
            if received >= prefix:
                caught_up.set()
        text = "".join(pieces)
    else:

        async def drain() -> str:
            return "".join([str(c.content) async for c in model.astream(QUESTION)])

        text = asyncio.run(drain())
    if text != answer_for(QUESTION, prefix + REST):
        raise RuntimeError("the continued answer differs from the expected one")
    (interruption,) = inner.interruptions
    assert interruption.continued_at is not None
    assert interruption.continued_cpu is not None
    return (
        (interruption.continued_at - interruption.raised_at) * 1e3,
        (interruption.continued_cpu - interruption.raised_cpu) * 1e3,
    )


def in_process(prefixes: tuple[int, ...], repeats: int) -> list[Row]:
    """Measure the in-process latency for every path, store and prefix."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for path in ("sync", "async"):
            for name in ("none", "memory", "diskcache"):
                store = None if name == "none" else make_store(name, Path(tmp) / f"{path}-{name}")
                try:
                    for prefix in prefixes:
                        _one(path, store, prefix)  # warm up
                        measured = [_one(path, store, prefix) for _ in range(repeats)]
                        samples = [wall for wall, _ in measured]
                        rows.append(
                            Row(
                                path,
                                name,
                                prefix,
                                median(samples),
                                percentile(samples, 0.9),
                                max(samples),
                                median([cpu for _, cpu in measured]),
                            )
                        )
                finally:
                    if store is not None:
                        store.close()
    return rows


# -- fresh process ---------------------------------------------------------------------------


def _leave_checkpoint(directory: Path, run_id: uuid.UUID, prefix: int) -> None:
    """Run a turn that breaks after ``prefix`` characters and cannot recover."""
    store = DiskCacheStreamCheckpointStore(directory)
    try:
        inner = ContinuingModel(chars=prefix + REST, chunk_chars=CHUNK, break_after=prefix)
        model = RecoveringChatModel(
            model=inner, store=store, retry_policy=no_backoff(max_continuations=0)
        )
        with contextlib.suppress(StreamInterruptedError):
            model.invoke(QUESTION, config={"run_id": run_id})
        saved = store.get(str(run_id))
        if saved is None or len(saved.partial_text) != prefix:
            raise RuntimeError("the broken turn left no checkpoint of the expected size")
    finally:
        store.close()


def child(started: float, directory: str, run_id: str, prefix: int) -> None:
    """The fresh process: import, open, build, resume; print the timings as JSON."""
    import time

    opened = time.perf_counter()
    store = DiskCacheStreamCheckpointStore(directory)
    inner = ContinuingModel(chars=prefix + REST, chunk_chars=CHUNK)
    model = RecoveringChatModel(model=inner, store=store, retry_policy=no_backoff())
    ready, ready_cpu = time.perf_counter(), time.process_time()
    chunks = list(model.stream(QUESTION, config={"run_id": uuid.UUID(run_id)}))
    text = "".join(str(c.content) for c in chunks)
    awaken = chunks[-1].response_metadata["awaken"]
    store.close()
    print(
        json.dumps(
            {
                "imports_ms": (opened - started) * 1e3,
                "open_and_build_ms": (ready - opened) * 1e3,
                "ready_to_request_ms": (inner.requests[0] - ready) * 1e3,
                "ready_to_request_cpu_ms": (inner.request_cpu[0] - ready_cpu) * 1e3,
                "requests": len(inner.requests),
                "resumed": awaken["resumed"],
                "complete": text == answer_for(QUESTION, prefix + REST),
            }
        )
    )


def fresh_process(prefix: int, processes: int) -> list[dict[str, Any]]:
    """Resume a ``prefix``-character checkpoint in ``processes`` fresh processes, one by one."""
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "checkpoints"
        for _ in range(processes):
            run_id = uuid.uuid4()
            _leave_checkpoint(directory, run_id, prefix)
            code = (
                "import time; started = time.perf_counter()\n"
                "from benchmarks.recovery_latency import child\n"
                f"child(started, {str(directory)!r}, {str(run_id)!r}, {prefix})\n"
            )
            result, _ = run_child(code, what="a fresh process resuming the turn", timeout=120)
            if not (result["resumed"] and result["complete"] and result["requests"] == 1):
                raise RuntimeError(f"the fresh process did not resume the turn: {result}")
            results.append(result)
    return results


def main(
    prefixes: tuple[int, ...] = (1_000, 100_000), repeats: int = 20, processes: int = 5
) -> tuple[list[Row], list[dict[str, Any]]]:
    """Measure both figures, print them, and return them."""
    rows = in_process(prefixes, repeats)
    print(
        f"## Recovery latency in-process (interruption -> continuation request), "
        f"{repeats} runs each, backoff excluded; {machine_line()}"
    )
    print(
        table(
            ["path", "store", "prefix chars", "median ms", "p90 ms", "max ms", "CPU median ms"],
            [
                (r.path, r.store, r.prefix, r.median_ms, r.p90_ms, r.max_ms, r.cpu_median_ms)
                for r in rows
            ],
        )
    )
    print()
    resumed = fresh_process(max(prefixes), processes)
    print(
        f"## Resume in a fresh process from a {max(prefixes):,}-character DiskCache "
        f"checkpoint, {processes} processes; {machine_line()}"
    )
    keys = ("imports_ms", "open_and_build_ms", "ready_to_request_ms", "ready_to_request_cpu_ms")
    print(
        table(
            ["phase", "median ms", "max ms"],
            [
                (key.removesuffix("_ms").replace("_", " "), median(values), max(values))
                for key in keys
                for values in [[r[key] for r in resumed]]
            ],
        )
    )
    print()
    return rows, resumed


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--prefixes", type=int, nargs="+", default=[1_000, 100_000], help="prefix characters"
    )
    parser.add_argument("--repeats", type=int, default=20, help="runs per in-process case")
    parser.add_argument("--processes", type=int, default=5, help="fresh processes to time")
    args = parser.parse_args()
    main(tuple(args.prefixes), args.repeats, args.processes)
