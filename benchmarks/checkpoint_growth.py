"""Checkpoint write cost against the length of the turn, for every store.

One turn of 1 000, 10 000 and 100 000 tokens (a token is one four-character
chunk) is streamed through ``RecoveringChatModel`` with a checkpoint every 8
chunks (the default chunk cadence; the time rule is switched off, so that a
busy machine adds no writes) into each store: memory, file, diskcache, and
Redis when ``awaken_langchain.stores.redis`` and a ``redis-server`` binary are
available (a private server on a free loopback port). The table shows the puts
the store received (at most one per 8 chunks: the background writer coalesces a
run's writes the store has not taken yet), the bytes written (``wchar`` of
``/proc/self/io`` for the local stores, the bytes the Redis server received for
Redis; the memory store writes nothing), the time spent inside the store
(claim, get, puts, delete: wall time, and the CPU time of the calling thread,
which a busy machine disturbs less; for Redis the CPU time is the client's
only) and, for each tenfold longer turn, how many times the cost grew: a store
whose put costs its delta grows about tenfold.

Run: ``python -m benchmarks.checkpoint_growth [--tokens 1000 10000 100000]``
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script from a clone
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from awaken_langchain import RecoveringChatModel
from benchmarks._common import (
    TokenStreamModel,
    machine_line,
    make_store,
    net_input_bytes,
    redis_server,
    store_names,
    table,
    timed,
    written_bytes,
)


@dataclass
class Row:
    """The cost of one turn of one length in one store."""

    store: str
    tokens: int
    puts: int
    bytes_written: int | None
    store_s: float
    store_cpu_s: float
    bytes_growth: float | None = None
    time_growth: float | None = None
    cpu_growth: float | None = None


def measure(store_name: str, tokens: int, directory: Path, redis_url: str | None = None) -> Row:
    """Stream one turn of ``tokens`` tokens into a fresh store and measure the writes."""
    store = timed(make_store(store_name, directory, redis_url))
    try:
        # Writes follow the chunk cadence only: a time-based write would make the
        # count depend on how busy the machine is.
        model = RecoveringChatModel(
            model=TokenStreamModel(tokens=tokens),
            store=store,
            stream_idle_timeout=None,
            checkpoint_every_seconds=1e9,
        )
        before = _bytes(store_name, redis_url)
        text = "".join(str(chunk.content) for chunk in model.stream("hi"))
        after = _bytes(store_name, redis_url)
    finally:
        store.close()
    if len(text) != 4 * tokens:
        raise RuntimeError(f"{store_name}: the turn has {len(text)} characters, not {4 * tokens}")
    written = None if before is None or after is None else after - before
    return Row(
        store_name,
        tokens,
        len(store.put_seconds),
        written,
        store.total_seconds,
        store.cpu_seconds,
    )


def _bytes(store_name: str, redis_url: str | None) -> int | None:
    if store_name == "memory":
        return None
    if store_name == "redis":
        return None if redis_url is None else net_input_bytes(redis_url)
    return written_bytes()


def main(
    tokens: tuple[int, ...] = (1_000, 10_000, 100_000), stores: tuple[str, ...] = ()
) -> list[Row]:
    """Measure every store at every length, print a table, and return the rows."""
    rows: list[Row] = []
    with redis_server() as redis_url, tempfile.TemporaryDirectory() as tmp:
        names = stores or tuple(store_names(redis=redis_url is not None))
        for name in names:
            previous: Row | None = None
            for n in tokens:
                row = measure(name, n, Path(tmp) / f"{name}-{n}", redis_url)
                if previous is not None:
                    if row.bytes_written is not None and previous.bytes_written:
                        row.bytes_growth = row.bytes_written / previous.bytes_written
                    row.time_growth = row.store_s / previous.store_s
                    row.cpu_growth = row.store_cpu_s / previous.store_cpu_s
                rows.append(row)
                previous = row
    print(f"## Checkpoint write cost against turn length; {machine_line()}")
    print(
        table(
            [
                "store",
                "tokens",
                "puts",
                "bytes written",
                "bytes/token",
                "store ms",
                "store CPU ms",
                "CPU us/put",
                "bytes growth",
                "time growth",
                "CPU growth",
            ],
            [
                (
                    r.store,
                    r.tokens,
                    r.puts,
                    r.bytes_written,
                    None if r.bytes_written is None else r.bytes_written / r.tokens,
                    r.store_s * 1e3,
                    r.store_cpu_s * 1e3,
                    r.store_cpu_s / max(1, r.puts) * 1e6,
                    None if r.bytes_growth is None else f"{r.bytes_growth:.1f}x",
                    None if r.time_growth is None else f"{r.time_growth:.1f}x",
                    None if r.cpu_growth is None else f"{r.cpu_growth:.1f}x",
                )
                for r in rows
            ],
        )
    )
    print()
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tokens", type=int, nargs="+", default=[1_000, 10_000, 100_000], help="turn lengths"
    )
    parser.add_argument("--stores", nargs="*", default=[], help="stores to measure (default: all)")
    args = parser.parse_args()
    main(tuple(args.tokens), tuple(args.stores))
