"""One process of the multi-host fencing test (run by tests/test_process_fencing.py).

The process drives every one of the shared runs at once: it claims a run, then
repeatedly reads the stored text and writes it back with one more segment
``<epoch.worker.round.step>``. Other processes claim the same runs at random
times, so this process keeps writing with epochs that have gone stale: those
writes must be refused. Because every accepted write extends the text it read,
the final text is the history of every write that landed.

Usage: ``python fencing_worker.py KIND ADDRESS LOCATION WORKER WORKERS RUNS ROUNDS MODE``
where KIND, ADDRESS and LOCATION name the store (see ``store_kinds.py``) and
MODE is ``async`` (one task per run on the store's async methods) or
``threads`` (the sync API from a thread pool). The workers start together (a
barrier of files in LOCATION), so their claims overlap. Prints one JSON object:
claims, accepted and fenced writes.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from store_kinds import open_store

from awaken_langchain.checkpoint import StreamCheckpoint, StreamCheckpointStore
from awaken_langchain.errors import StreamCheckpointFencedError


class Log:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.claims: list[list[Any]] = []
        self.accepted: list[list[Any]] = []
        self.fenced = 0

    def dump(self) -> str:
        return json.dumps({"claims": self.claims, "accepted": self.accepted, "fenced": self.fenced})


def segment(epoch: int, worker: int, round_: int, step: int) -> str:
    return f"<{epoch}.{worker}.{round_}.{step}>"


async def drive_async(
    store: StreamCheckpointStore,
    run_id: str,
    worker: int,
    rounds: int,
    rng: random.Random,
    log: Log,
) -> None:
    for round_ in range(rounds):
        epoch = await store.aclaim(run_id)
        log.claims.append([run_id, epoch])
        for step in range(rng.randint(1, 3)):
            current = await store.aget(run_id)
            text = (current.partial_text if current else "") + segment(epoch, worker, round_, step)
            try:
                await store.aput(StreamCheckpoint(run_id=run_id, partial_text=text, epoch=epoch))
            except StreamCheckpointFencedError:
                log.fenced += 1  # keep writing like a zombie that has not noticed
            else:
                log.accepted.append([run_id, segment(epoch, worker, round_, step)])
            await asyncio.sleep(rng.random() * 0.002)
    await zombie_write_async(store, run_id, worker, rounds, log)


async def zombie_write_async(
    store: StreamCheckpointStore, run_id: str, worker: int, rounds: int, log: Log
) -> None:
    """Write once more with this worker's first epoch, which its own later claim made stale.

    However the processes were scheduled, this write races a newer owner, so
    every run sees at least one takeover attempt that must be refused.
    """
    first = next(epoch for rid, epoch in log.claims if rid == run_id)
    current = await store.aget(run_id)
    text = (current.partial_text if current else "") + segment(first, worker, rounds, 0)
    try:
        await store.aput(StreamCheckpoint(run_id=run_id, partial_text=text, epoch=first))
    except StreamCheckpointFencedError:
        log.fenced += 1
    else:
        log.accepted.append([run_id, segment(first, worker, rounds, 0)])


def drive_sync(
    store: StreamCheckpointStore,
    run_id: str,
    worker: int,
    rounds: int,
    seed: int,
    log: Log,
) -> None:
    rng = random.Random(seed)
    for round_ in range(rounds):
        epoch = store.claim(run_id)
        with log.lock:
            log.claims.append([run_id, epoch])
        for step in range(rng.randint(1, 3)):
            current = store.get(run_id)
            text = (current.partial_text if current else "") + segment(epoch, worker, round_, step)
            try:
                store.put(StreamCheckpoint(run_id=run_id, partial_text=text, epoch=epoch))
            except StreamCheckpointFencedError:
                with log.lock:
                    log.fenced += 1
            else:
                with log.lock:
                    log.accepted.append([run_id, segment(epoch, worker, round_, step)])
    with log.lock:
        first = next(epoch for rid, epoch in log.claims if rid == run_id)
    current = store.get(run_id)
    text = (current.partial_text if current else "") + segment(first, worker, rounds, 0)
    try:  # a zombie write with the first epoch: stale by this worker's own later claim
        store.put(StreamCheckpoint(run_id=run_id, partial_text=text, epoch=first))
    except StreamCheckpointFencedError:
        with log.lock:
            log.fenced += 1
    else:
        with log.lock:
            log.accepted.append([run_id, segment(first, worker, rounds, 0)])


async def main_async(store: StreamCheckpointStore, worker: int, runs: int, rounds: int) -> Log:
    log = Log()
    await asyncio.gather(
        *(
            drive_async(store, f"run-{i}", worker, rounds, random.Random(worker * 1000 + i), log)
            for i in range(runs)
        )
    )
    aclose = getattr(store, "aclose", None)
    if aclose is not None:  # the clients of this event loop, before it ends
        await aclose()
    return log


def main(argv: list[str], out: Path | None = None) -> None:
    """Race as worker ``argv[3]``; write the log to ``out`` (standard output when ``None``)."""
    kind, address, location, worker_s, workers_s, runs_s, rounds_s, mode = argv[:8]
    worker, runs, rounds = int(worker_s), int(runs_s), int(rounds_s)
    store = open_store(kind, location, address)  # type: ignore[arg-type]
    store.list_run_ids()  # connected (and a new database's tables made) before the start
    barrier = Path(location) / "ready"
    barrier.mkdir(parents=True, exist_ok=True)
    (barrier / str(worker)).touch()
    while len(list(barrier.iterdir())) < int(workers_s):
        time.sleep(0.005)
    if mode == "async":
        log = asyncio.run(main_async(store, worker, runs, rounds))
    else:
        log = Log()
        with ThreadPoolExecutor(max_workers=16) as pool:
            for future in [
                pool.submit(drive_sync, store, f"run-{i}", worker, rounds, worker * 1000 + i, log)
                for i in range(runs)
            ]:
                future.result()
    store.close()
    if out is None:
        print(log.dump())
    else:
        out.write_text(log.dump())


if __name__ == "__main__":
    main(sys.argv[1:])
