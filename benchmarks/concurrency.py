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

Run: ``python -m benchmarks.concurrency [--streams 256] [--processes 4] [--chars 1024]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script from a clone
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from awaken_langchain import RecoveringChatModel, RetryPolicy
from benchmarks._common import (
    REPO_ROOT,
    ContinuingModel,
    TimedStore,
    answer_for,
    child_env,
    machine_line,
    make_store,
    percentile,
    redis_server,
    table,
)


async def _no_wait(_seconds: float) -> None:
    return None


async def _turns(
    store_name: str, location: str, streams: int, chars: int, tag: str
) -> dict[str, Any]:
    """Run ``streams`` concurrent turns against one store; return what was measured."""
    url = location if store_name == "redis" else None
    store = TimedStore(make_store(store_name, Path(location), url))
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
    results = []
    for process in children:
        out, _ = process.communicate(timeout=600)
        if process.returncode != 0:
            raise RuntimeError(f"a {store_name} worker process failed ({process.returncode})")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


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
    args = parser.parse_args()
    main(args.streams, args.processes, args.chars, tuple(args.stores))
