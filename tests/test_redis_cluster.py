"""The Redis store on a real Redis Cluster: what the conformance kit cannot show.

The kit itself runs on the cluster in ``test_store_conformance.py``.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from awaken_langchain import StreamCheckpoint, StreamCheckpointError
from tests.redis_cluster import RedisCluster

pytestmark = [pytest.mark.slow, pytest.mark.redis]

redis_cluster = pytest.importorskip("redis.cluster")
from awaken_langchain.stores.redis import RedisStreamCheckpointStore  # noqa: E402


@pytest.fixture
def cluster() -> Iterator[RedisCluster]:
    """A cluster of this test alone, which it may reshard."""
    directory = Path(tempfile.mkdtemp(prefix="awaken-redis-cluster-"))
    made = RedisCluster(directory)
    try:
        made.start()
        yield made
    finally:
        made.stop()
        shutil.rmtree(directory, ignore_errors=True)


def cli(port: int, *args: str) -> str:
    done = subprocess.run(
        ["redis-cli", "-p", str(port), *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_turns_run_on_while_an_empty_slot_range_moves_to_another_node(
    cluster: RedisCluster,
) -> None:
    source, target = cluster.ports[0], cluster.ports[1]
    owned = [(start, end) for start, end, port in _slot_ranges(source) if port == source]
    moved = range(owned[0][0], owned[0][0] + 200)
    run_ids = [f"turn-{n}" for n in range(400)]
    outside = [r for r in run_ids if redis_cluster.key_slot(r.encode()) not in moved][:24]
    inside = [r for r in run_ids if redis_cluster.key_slot(r.encode()) in moved][:4]
    assert outside
    assert inside

    client = redis_cluster.RedisCluster(host="127.0.0.1", port=source)
    store = RedisStreamCheckpointStore(client=client, prefix="reshard")
    failures: list[BaseException] = []
    stop = threading.Event()
    done_turns = [0]

    def turns() -> None:
        while not stop.is_set():
            for run_id in outside:
                try:
                    epoch = store.claim(run_id)
                    text = ""
                    for step in range(3):
                        text += f"<{step}>"
                        store.put(
                            StreamCheckpoint(
                                run_id=run_id, partial_text=text, epoch=epoch, model="m"
                            )
                        )
                    got = store.get(run_id)
                    assert got is not None
                    assert got.partial_text == text
                    store.delete(run_id, epoch=epoch)
                    done_turns[0] += 1
                except (StreamCheckpointError, AssertionError) as exc:
                    failures.append(exc)

    worker = threading.Thread(target=turns)
    worker.start()
    try:
        source_id = cli(source, "cluster", "myid").strip()
        target_id = cli(target, "cluster", "myid").strip()
        for slot in moved:  # failover-free: each slot is handed over, no node goes down
            cli(target, "cluster", "setslot", str(slot), "importing", source_id)
            cli(source, "cluster", "setslot", str(slot), "migrating", target_id)
            for port in cluster.ports:
                cli(port, "cluster", "setslot", str(slot), "node", target_id)
    finally:
        stop.set()
        worker.join(timeout=60)
    assert failures == []
    assert done_turns[0] >= len(outside)
    for run_id in inside:  # the moved slots now live on the other node, and work there
        epoch = store.claim(run_id)
        store.put(StreamCheckpoint(run_id=run_id, partial_text="moved", epoch=epoch, model="m"))
        got = store.get(run_id)
        assert got is not None
        assert got.partial_text == "moved"
    assert all(entry[2] == target for entry in _slot_ranges(source) if entry[0] == moved[0])
    store.close()
    client.close()


def _slot_ranges(port: int) -> list[tuple[int, int, int]]:
    """``(first slot, last slot, port of its primary)`` of every range of the cluster."""
    import redis

    with redis.Redis(port=port) as raw:
        return [
            (start, end, node[1]) for start, end, node, *_ in raw.execute_command("CLUSTER SLOTS")
        ]
