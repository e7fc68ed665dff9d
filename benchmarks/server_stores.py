"""What a checkpoint put costs on the server stores, against a plain PostgreSQL INSERT.

Each store runs the same turns: claim, ``puts`` checkpoints that each append
``delta`` characters to the turn's text, then the delete that ends the turn.
The floor is what the same turn costs as plain SQL: one autocommitted
``INSERT`` per put of as many bytes as the store's record grows by (the new
text plus its head), on a pool of the same size as the store's. Measured in
the same run, on throwaway local servers (PostgreSQL, Redis, a three-node
Redis Cluster) started from the test suite's helpers:

- instructions per put (``--instructions``, needs valgrind): the client
  process's instructions (cachegrind) for a turn of ``2 * puts`` puts minus a
  turn of ``puts`` puts, divided by ``puts``, so start-up and imports cancel
  out; the servers' own work is not in it;
- wall time per put, one turn at a time (mean and median) and its client CPU;
- put p99 and median under ``concurrent`` turns at once (one thread each,
  the sync API, the default pool sizes);
- bytes per turn: what the server wrote to its write-ahead log (PostgreSQL,
  ``pg_current_wal_insert_lsn``) or received from clients (Redis: the sum over the
  nodes of ``total_net_input_bytes``).

Run: ``python -m benchmarks.server_stores [--puts 40] [--delta 32]
[--concurrent 64] [--turns 20] [--instructions]``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script from a clone
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import (
    CACHEGRIND,
    counted_instructions,
    machine_line,
    percentile,
    require_valgrind,
    run_child,
    table,
)

KINDS = ("postgres", "postgres INSERT (floor)", "redis", "redis-cluster")


@dataclass
class Servers:
    """Where the throwaway servers listen."""

    dsn: str
    redis_url: str
    cluster_node: str


@contextmanager
def servers() -> Iterator[Servers]:
    """Start PostgreSQL, Redis and a three-node Redis Cluster; stop them afterwards."""
    from tests.postgres_server import PostgresServer
    from tests.redis_cluster import RedisCluster
    from tests.redis_server import RedisServer

    with ExitStack() as stack:
        pg_dir = Path(tempfile.mkdtemp(prefix="bench-postgres-"))
        postgres = PostgresServer(pg_dir)
        stack.callback(postgres.remove)
        postgres.start()
        redis_dir = Path(tempfile.mkdtemp(prefix="bench-redis-"))
        stack.callback(shutil.rmtree, redis_dir, ignore_errors=True)
        redis_server = RedisServer(redis_dir / "redis")
        stack.callback(redis_server.stop)
        redis_server.start()
        cluster = RedisCluster(redis_dir / "cluster")
        stack.callback(cluster.stop)
        cluster.start()
        yield Servers(postgres.dsn, redis_server.url, f"127.0.0.1:{cluster.ports[0]}")


# -- the turn each case runs -------------------------------------------------------------


class Floor:
    """The plain-SQL turn: an INSERT per put of the bytes the store's record grows by."""

    def __init__(self, dsn: str, record_bytes: int, max_connections: int = 10) -> None:
        import psycopg
        import psycopg_pool

        self.table = f"floor_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                f"CREATE TABLE {self.table} (run_id bytea NOT NULL, seq integer NOT NULL, "
                "data bytea NOT NULL, PRIMARY KEY (run_id, seq))"
            )
        self.pool = psycopg_pool.ConnectionPool(
            dsn, min_size=1, max_size=max_connections, open=True
        )
        self.payload = b"x" * record_bytes

    def turn(self, run_id: str, puts: int, timings: list[float]) -> None:
        key = run_id.encode()
        for seq in range(puts):
            start = time.perf_counter()
            with self.pool.connection() as conn:
                conn.execute(
                    f"INSERT INTO {self.table} VALUES (%s, %s, %s)", (key, seq, self.payload)
                )
            timings.append(time.perf_counter() - start)
        with self.pool.connection() as conn:
            conn.execute(f"DELETE FROM {self.table} WHERE run_id = %s", (key,))

    def close(self) -> None:
        self.pool.close()


def store_turn(store: Any, run_id: str, puts: int, delta: int, timings: list[float]) -> None:
    """One turn on ``store``: claim, ``puts`` appending puts, the closing delete."""
    from awaken_langchain import StreamCheckpoint

    epoch = store.claim(run_id)
    text = ""
    for _ in range(puts):
        text += "y" * delta
        checkpoint = StreamCheckpoint(
            run_id=run_id, thread_id="thread-1", model="gpt-test", partial_text=text, epoch=epoch
        )
        start = time.perf_counter()
        store.put(checkpoint)
        timings.append(time.perf_counter() - start)
    store.delete(run_id, epoch=epoch)


def open_case(kind: str, where: Servers, delta: int) -> tuple[Callable[..., None], Any]:
    """The turn function of ``kind`` and what to close afterwards."""
    if kind == "postgres INSERT (floor)":
        floor = Floor(where.dsn, record_bytes(delta))
        return lambda run_id, puts, timings: floor.turn(run_id, puts, timings), floor
    if kind == "postgres":
        from awaken_langchain.stores.postgres import PostgresStreamCheckpointStore

        store: Any = PostgresStreamCheckpointStore(
            where.dsn, table=f"bench_{uuid.uuid4().hex[:12]}"
        )
    elif kind == "redis":
        from awaken_langchain.stores.redis import RedisStreamCheckpointStore

        store = RedisStreamCheckpointStore(where.redis_url, prefix=f"bench-{uuid.uuid4().hex}")
    else:
        import redis.cluster

        from awaken_langchain.stores.redis import RedisStreamCheckpointStore

        host, _, port = where.cluster_node.rpartition(":")
        client = redis.cluster.RedisCluster(host=host, port=int(port))
        store = RedisStreamCheckpointStore(client=client, prefix=f"bench-{uuid.uuid4().hex}")

        class Both:
            def close(self) -> None:
                store.close()
                client.close()

        return lambda run_id, puts, timings: store_turn(store, run_id, puts, delta, timings), Both()
    return lambda run_id, puts, timings: store_turn(store, run_id, puts, delta, timings), store


def record_bytes(delta: int) -> int:
    """Bytes a put's record grows by: the head the store rewrites plus the new text."""
    from awaken_langchain.checkpoint import StreamCheckpoint, encode_checkpoint

    head = StreamCheckpoint(run_id="run-0", thread_id="thread-1", model="gpt-test", epoch=1)
    return len(encode_checkpoint(head)) + delta


def written(kind: str, where: Servers) -> int:
    """What the servers of ``kind`` have written (PostgreSQL WAL) or received (Redis) so far."""
    if kind.startswith("postgres"):
        import psycopg

        with psycopg.connect(where.dsn, autocommit=True) as conn:
            row = conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()
        assert row is not None
        return int(row[0])
    import redis

    urls = (
        [where.redis_url]
        if kind == "redis"
        else [f"redis://{node['host']}:{node['port']}" for node in _cluster_nodes(where)]
    )
    total = 0
    for url in urls:
        with redis.Redis.from_url(url) as client:
            total += int(client.info("stats")["total_net_input_bytes"])
    return total


def _cluster_nodes(where: Servers) -> list[dict[str, Any]]:
    import redis.cluster

    host, _, port = where.cluster_node.rpartition(":")
    with redis.cluster.RedisCluster(host=host, port=int(port)) as client:
        return [{"host": n.host, "port": n.port} for n in client.get_nodes()]


# -- the measurements ---------------------------------------------------------------------


@dataclass
class Row:
    kind: str
    put_us: float
    put_median_us: float
    put_cpu_us: float
    concurrent_p99_us: float
    concurrent_median_us: float
    bytes_per_turn: float
    instructions: int | None = None


def measure(
    kind: str, where: Servers, *, puts: int, delta: int, turns: int, concurrent: int
) -> Row:
    """Sequential turns, then ``concurrent`` turns at once, on one store (or the floor)."""
    turn, closing = open_case(kind, where, delta)
    try:
        turn("warm-up", puts, [])
        sequential: list[float] = []
        before, cpu = written(kind, where), time.process_time()
        for i in range(turns):
            turn(f"run-{i}", puts, sequential)
        cpu = time.process_time() - cpu
        bytes_per_turn = (written(kind, where) - before) / turns
        together: list[float] = []
        lock = threading.Lock()

        def one(i: int) -> None:
            mine: list[float] = []
            turn(f"together-{i}", puts, mine)
            with lock:
                together.extend(mine)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(concurrent)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        closing.close()
    return Row(
        kind,
        statistics.fmean(sequential) * 1e6,
        statistics.median(sequential) * 1e6,
        cpu / len(sequential) * 1e6,
        percentile(together, 0.99) * 1e6,
        statistics.median(together) * 1e6,
        bytes_per_turn,
    )


_CHILD = """
import json, sys
sys.argv = ["x"]
from benchmarks.server_stores import Servers, open_case
where = Servers({dsn!r}, {redis_url!r}, {cluster_node!r})
turn, closing = open_case({kind!r}, where, {delta})
turn("run-1", {puts}, [])
closing.close()
print(json.dumps({{}}))
"""


def instructions_per_put(kind: str, where: Servers, *, puts: int, delta: int) -> int:
    """Client instructions of a turn of ``2 * puts`` puts minus one of ``puts``, per put."""
    counts = []
    for n in (puts, 2 * puts):
        code = _CHILD.format(
            dsn=where.dsn,
            redis_url=where.redis_url,
            cluster_node=where.cluster_node,
            kind=kind,
            delta=delta,
            puts=n,
        )
        _, stderr = run_child(code, what=f"{kind} under valgrind", under=CACHEGRIND)
        counts.append(counted_instructions(stderr, kind))
    return round((counts[1] - counts[0]) / puts)


def main(
    *,
    puts: int = 40,
    delta: int = 32,
    turns: int = 20,
    concurrent: int = 64,
    instructions: bool = False,
) -> list[Row]:
    """Measure every server store and the floor; print the table and return its rows."""
    if instructions:
        require_valgrind()
    rows = []
    with servers() as where:
        for kind in KINDS:
            row = measure(kind, where, puts=puts, delta=delta, turns=turns, concurrent=concurrent)
            if instructions:
                row.instructions = instructions_per_put(kind, where, puts=puts, delta=delta)
            rows.append(row)
    floor = rows[1]
    print(
        f"server stores: turns of {puts} puts appending {delta} characters; floor: an INSERT "
        f"of {record_bytes(delta)} bytes per put; {concurrent} turns at once; {machine_line()}"
    )
    print(
        table(
            [
                "store",
                "instructions/put",
                "put us",
                "median us",
                "CPU us/put",
                f"p99 us x{concurrent}",
                f"median us x{concurrent}",
                "bytes/turn",
                "put / floor",
                "p99 / floor",
            ],
            [
                [
                    r.kind,
                    r.instructions,
                    r.put_us,
                    r.put_median_us,
                    r.put_cpu_us,
                    r.concurrent_p99_us,
                    r.concurrent_median_us,
                    round(r.bytes_per_turn),
                    f"{r.put_median_us / floor.put_median_us:.2f}x",
                    f"{r.concurrent_p99_us / floor.concurrent_p99_us:.2f}x",
                ]
                for r in rows
            ],
        )
    )
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--puts", type=int, default=40, help="puts per turn")
    parser.add_argument("--delta", type=int, default=32, help="characters appended per put")
    parser.add_argument("--turns", type=int, default=20, help="sequential turns measured")
    parser.add_argument("--concurrent", type=int, default=64, help="turns at once")
    parser.add_argument("--instructions", action="store_true", help="count them (valgrind)")
    args = parser.parse_args()
    main(
        puts=args.puts,
        delta=args.delta,
        turns=args.turns,
        concurrent=args.concurrent,
        instructions=args.instructions,
    )
