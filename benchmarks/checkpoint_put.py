"""Cost of a checkpoint put that appends a few characters to a long partial turn.

A streamed turn is checkpointed every few tokens, so each put adds a small
delta to an ever longer ``partial_text``. This program measures, for each store
(Redis and PostgreSQL too, on throwaway local servers when they are installed), the mean and median
time and the bytes written per put when 16 characters are appended to a 200 KB
partial and to a 2 KB partial, side by side, and prints the ratio (the goal is
about 2x or less: a put should cost its delta, not the turn). A "rewrite"
column shows what a put costs when the text does not extend the stored one and
the whole record must be written.

Run: ``python benchmarks/checkpoint_put.py [--size 200000] [--small 2000] [--puts 200]``
(``--redis-url redis://...`` measures an existing server instead). For Redis the
bytes column counts what the server received (its ``total_net_input_bytes``),
for PostgreSQL what it wrote to its write-ahead log.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script from a clone
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from awaken_langchain import (
    DiskCacheStreamCheckpointStore,
    FileStreamCheckpointStore,
    InMemoryStreamCheckpointStore,
    StreamCheckpoint,
    StreamCheckpointStore,
)


class _Redis:
    """The Redis server the benchmark measures, and a counter of bytes it received."""

    url: str | None = None
    client: Any = None
    info_bytes = 0
    info_calls = 0

    @classmethod
    def start(cls, url: str | None) -> Callable[[], None] | None:
        """Use ``url``, or start a throwaway local redis-server.

        Returns:
            A function that stops what was started, or ``None`` when there is no
            ``url`` and no ``redis-server`` binary (Redis is then left out).
        """
        import redis

        server = None
        if url is None:
            if shutil.which("redis-server") is None:
                return None
            from tests.redis_server import RedisServer

            server = RedisServer(Path(tempfile.mkdtemp(prefix="bench-redis-")))
            server.start()
            url = server.url
        cls.url, cls.client = url, redis.Redis.from_url(url)
        first = cls.received_bytes()
        cls.info_bytes = cls.received_bytes() - first  # the size of one INFO request

        def stop() -> None:
            cls.client.close()
            if server is not None:
                server.stop()
                shutil.rmtree(server.directory, ignore_errors=True)

        return stop

    @classmethod
    def received_bytes(cls) -> int:
        """Bytes the server has received so far, not counting these INFO requests."""
        cls.info_calls += 1
        total = int(cls.client.info("stats")["total_net_input_bytes"])
        return total - cls.info_calls * cls.info_bytes

    @classmethod
    def store(cls, directory: Path) -> StreamCheckpointStore:
        from awaken_langchain.stores.redis import RedisStreamCheckpointStore

        assert cls.url is not None
        return RedisStreamCheckpointStore(
            cls.url, prefix=f"bench-{directory.name}", max_checkpoint_bytes=1 << 30
        )


class _Postgres:
    """The PostgreSQL server the benchmark measures, and the bytes of WAL it wrote."""

    dsn: str | None = None

    @classmethod
    def start(cls) -> Callable[[], None] | None:
        """Start a throwaway PostgreSQL; ``None`` when PostgreSQL or psycopg is missing."""
        import glob
        from importlib.util import find_spec

        if find_spec("psycopg_pool") is None or not (
            glob.glob("/usr/lib/postgresql/*/bin/initdb") or shutil.which("initdb")
        ):
            return None
        from tests.postgres_server import PostgresServer

        server = PostgresServer(Path(tempfile.mkdtemp(prefix="bench-postgres-")))
        server.start()
        cls.dsn = server.dsn

        def stop() -> None:
            cls.dsn = None
            server.remove()

        return stop

    @classmethod
    def wal_bytes(cls) -> int:
        import psycopg

        assert cls.dsn is not None
        with psycopg.connect(cls.dsn, autocommit=True) as conn:
            row = conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()
        assert row is not None
        return int(row[0])

    @classmethod
    def store(cls, directory: Path) -> StreamCheckpointStore:
        from awaken_langchain.stores.postgres import PostgresStreamCheckpointStore

        assert cls.dsn is not None
        return PostgresStreamCheckpointStore(
            cls.dsn, table=f"bench_{directory.name.replace('-', '_')}", max_checkpoint_bytes=1 << 30
        )


STORES: dict[str, Callable[[Path], StreamCheckpointStore]] = {
    "memory": lambda directory: InMemoryStreamCheckpointStore(max_checkpoint_bytes=1 << 30),
    "diskcache": lambda directory: DiskCacheStreamCheckpointStore(
        directory, max_checkpoint_bytes=1 << 30
    ),
    "file": lambda directory: FileStreamCheckpointStore(directory, max_checkpoint_bytes=1 << 30),
    "redis": _Redis.store,
    "postgres": _Postgres.store,
}


@dataclass(frozen=True)
class Measurement:
    """Mean cost of one put for one store and one partial size."""

    store: str
    partial_chars: int
    append_us: float
    append_median_us: float
    append_bytes: float | None
    rewrite_us: float


def _written_bytes() -> int | None:
    """Bytes this process has passed to write() so far (Linux), else ``None``."""
    try:
        with open("/proc/self/io") as handle:
            for line in handle:
                if line.startswith("wchar:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def measure(store_name: str, sizes: tuple[int, ...], *, delta: int, puts: int) -> list[Measurement]:
    """Measure appends and rewrites on partials of each size, interleaved.

    One store per size; the puts to them alternate, so that a change of machine
    load during the run affects every size alike and the ratio stays fair.
    """
    counted = {"redis": _Redis.received_bytes, "postgres": _Postgres.wal_bytes}.get(
        store_name, _written_bytes
    )
    with tempfile.TemporaryDirectory() as tmp:
        stores = [STORES[store_name](Path(tmp) / f"store-{size}") for size in sizes]
        try:
            texts = ["x" * size for size in sizes]
            for store, text in zip(stores, texts, strict=True):
                store.put(StreamCheckpoint(run_id="bench", partial_text=text))
            chunk = "y" * delta
            append_s: list[list[float]] = [[] for _ in sizes]
            written = [0] * len(sizes)
            for _ in range(puts):
                for i, store in enumerate(stores):
                    texts[i] += chunk
                    checkpoint = StreamCheckpoint(run_id="bench", partial_text=texts[i])
                    before = counted()
                    start = time.perf_counter()
                    store.put(checkpoint)
                    append_s[i].append(time.perf_counter() - start)
                    after = counted()
                    if before is not None and after is not None:
                        written[i] += after - before
            for store, text in zip(stores, texts, strict=True):
                got = store.get("bench")
                if got is None or got.partial_text != text:
                    raise RuntimeError(f"{store_name}: the text read back differs from the put")

            rewrites = max(1, puts // 4)
            rewrite_s = [0.0] * len(sizes)
            for step in range(rewrites):
                for i, store in enumerate(stores):
                    # A new first character: the text no longer extends the stored one.
                    texts[i] = ("a" if step % 2 else "b") + texts[i][1:]
                    checkpoint = StreamCheckpoint(run_id="bench", partial_text=texts[i])
                    start = time.perf_counter()
                    store.put(checkpoint)
                    rewrite_s[i] += time.perf_counter() - start
        finally:
            for store in stores:
                store.close()
    measurable = store_name != "memory" and counted() is not None
    return [
        Measurement(
            store_name,
            size,
            statistics.fmean(append_s[i]) * 1e6,
            statistics.median(append_s[i]) * 1e6,
            written[i] / puts if measurable else None,
            rewrite_s[i] / rewrites * 1e6,
        )
        for i, size in enumerate(sizes)
    ]


def main(
    size: int = 200_000,
    small: int = 2_000,
    *,
    delta: int = 16,
    puts: int = 200,
    stores: tuple[str, ...] | None = None,
) -> list[tuple[Measurement, Measurement]]:
    """Measure every store at both sizes, print a table, and return the pairs.

    By default every store is measured, Redis and PostgreSQL only once
    ``_Redis.start`` and ``_Postgres.start`` found them.
    """
    if stores is None:
        servers = {"redis": _Redis.url, "postgres": _Postgres.dsn}
        stores = tuple(name for name in STORES if name not in servers or servers[name] is not None)
    pairs = []
    print(f"append {delta} chars per put, {puts} puts per case; times per put")
    print(
        f"{'store':<10} {'partial':>8} {'append us':>10} {'median us':>10} {'bytes/put':>10} "
        f"{'rewrite us':>11} {'ratio (mean)':>13} {'ratio (median)':>15}"
    )
    for name in stores:
        base, large = measure(name, (small, size), delta=delta, puts=puts)
        pairs.append((large, base))
        for row in (base, large):
            written = "-" if row.append_bytes is None else f"{row.append_bytes:,.0f}"
            ratio = f"{large.append_us / base.append_us:.2f}x" if row is large else ""
            median_ratio = (
                f"{large.append_median_us / base.append_median_us:.2f}x" if row is large else ""
            )
            print(
                f"{row.store:<10} {row.partial_chars:>8,} {row.append_us:>10.1f} "
                f"{row.append_median_us:>10.1f} "
                f"{written:>10} {row.rewrite_us:>11.1f} {ratio:>13} {median_ratio:>15}"
            )
    return pairs


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=200_000, help="large partial, characters")
    parser.add_argument("--small", type=int, default=2_000, help="small partial, characters")
    parser.add_argument("--delta", type=int, default=16, help="characters appended per put")
    parser.add_argument("--puts", type=int, default=200, help="puts measured per case")
    parser.add_argument("--redis-url", help="measure this Redis instead of a throwaway server")
    args = parser.parse_args()
    stop_redis = _Redis.start(args.redis_url)
    if stop_redis is None:
        print("redis: left out (no redis-server installed; pass --redis-url to measure one)")
    stop_postgres = _Postgres.start()
    if stop_postgres is None:
        print("postgres: left out (PostgreSQL or psycopg is not installed)")
    try:
        main(args.size, args.small, delta=args.delta, puts=args.puts)
    finally:
        if stop_redis is not None:
            stop_redis()
        if stop_postgres is not None:
            stop_postgres()
