"""What a store keeps after many finished turns and a ``gc``: it must return to its baseline.

Run: ``python -m benchmarks.store_size [--turns 1000]``.

Each store (memory, diskcache, file, and Redis on a throwaway local
redis-server when one is installed) serves ``--turns`` turns with ``ttl=1``:
nine in ten claim their run, write three checkpoints and delete with their
epoch (a finished turn); one in ten claims, writes and is abandoned (a crashed
process, left to expire). The store's clock is then moved past the ttl and the
epoch records' grace period, and ``gc`` runs. The table shows what the store
holds before the turns, right after them, and after ``gc``: records (dictionary
entries, diskcache keys, files, Redis keys) and, for Redis, how many keys have
no expiry (they would stay forever). Redis expires keys on its own clock, which
the benchmark cannot move: its store is built with ``epoch_grace=1`` and its
last count is taken after ``ttl + epoch_grace`` and a little more of real time.
"""

from __future__ import annotations

import argparse
import inspect
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from awaken_langchain import (
    DiskCacheStreamCheckpointStore,
    FileStreamCheckpointStore,
    InMemoryStreamCheckpointStore,
    StreamCheckpoint,
    StreamCheckpointStore,
)

TTL = 1.0


class _Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _memory_size(store: Any) -> str:
    held = sum(len(getattr(store, name)) for name in ("_heads", "_texts", "_write_ids", "_epochs"))
    return f"{held} entries"


def _diskcache_size(store: Any) -> str:
    return f"{len(store._cache)} keys"


def _file_size(store: Any) -> str:
    return f"{sum(1 for _ in Path(store.directory).iterdir())} files"


def _redis_size(store: Any) -> str:
    client = store._sync.client
    keys = list(client.scan_iter(match=f"{store.prefix}:*".encode()))
    forever = sum(1 for key in keys if client.pttl(key) == -1)
    return f"{len(keys)} keys ({forever} never expire)"


def _turns(store: StreamCheckpointStore, turns: int) -> None:
    for n in range(turns):
        run_id = f"turn-{n}"
        epoch = store.claim(run_id)
        text = ""
        for step in range(3):
            text += f"token {step} "
            store.put(StreamCheckpoint(run_id=run_id, partial_text=text, epoch=epoch))
        if n % 10 != 9:
            store.delete(run_id, epoch=epoch)


def _grace(store_class: type[StreamCheckpointStore]) -> float:
    """The epoch records' grace period the store was built with (0 where there is none)."""
    parameter = inspect.signature(store_class).parameters.get("epoch_grace")
    return 0.0 if parameter is None else float(parameter.default)


def measure(
    name: str,
    make: Callable[[_Clock], StreamCheckpointStore],
    size: Any,
    turns: int,
    real_wait: float = 0.0,
) -> None:
    """Print one row: the store's size before, after the turns and after gc.

    Args:
        name: The row's name.
        make: Builds the store on the given clock.
        size: Describes what the store holds.
        turns: How many turns to serve.
        real_wait: Seconds of real time to wait after ``gc`` (for Redis's expiry).
    """
    clock = _Clock()
    store = make(clock)
    try:
        before = size(store)
        _turns(store, turns)
        after_turns = size(store)
        clock.now += TTL + getattr(store, "epoch_grace", _grace(type(store))) + 1
        store.gc()
        time.sleep(real_wait)
        after_gc = size(store)
    finally:
        store.close()
    print(f"| {name} | {before} | {after_turns} | {after_gc} |")


def main(turns: int = 1000) -> None:
    """Measure every store and print the table."""
    scratch = Path(tempfile.mkdtemp(prefix="bench-size-"))
    print(f"{turns} turns, ttl={TTL:g} s, then the clock moves past ttl + grace and gc runs\n")
    print("| store | empty | after the turns | after gc |")
    print("|---|---|---|---|")
    try:
        measure(
            "memory",
            lambda clock: InMemoryStreamCheckpointStore(ttl=TTL, clock=clock),
            _memory_size,
            turns,
        )
        measure(
            "diskcache",
            lambda clock: DiskCacheStreamCheckpointStore(scratch / "dc", ttl=TTL, clock=clock),
            _diskcache_size,
            turns,
        )
        measure(
            "file",
            lambda clock: FileStreamCheckpointStore(
                scratch / "file", ttl=TTL, clock=clock, fsync=False
            ),
            _file_size,
            turns,
        )
        if shutil.which("redis-server") is None:
            print("redis: left out (no redis-server installed)")
            return
        from awaken_langchain.stores.redis import RedisStreamCheckpointStore
        from tests.redis_server import RedisServer

        server = RedisServer(scratch / "redis")
        server.start()
        grace = {"epoch_grace": 1.0} if _grace(RedisStreamCheckpointStore) else {}
        try:
            measure(
                "redis (" + ("epoch_grace=1 s, " if grace else "") + "3 s of real time after gc)",
                lambda clock: RedisStreamCheckpointStore(
                    server.url,
                    prefix=f"size-{uuid.uuid4().hex[:8]}",
                    ttl=TTL,
                    clock=clock,
                    **grace,
                ),
                _redis_size,
                turns,
                real_wait=3.0,
            )
        finally:
            server.stop()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=1000)
    main(parser.parse_args().turns)
