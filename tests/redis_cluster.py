"""A real three-node Redis Cluster for the tests, on free loopback ports.

Three ``redis-server --cluster-enabled yes`` primaries joined with
``redis-cli --cluster create`` (no replicas), started once per test process and
stopped at exit. Skipped or failed like the single server (``AWAKEN_REQUIRE_REDIS``).
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from tests.redis_server import REQUIRE_ENV, free_port, prefix_for, redis_server_binary

NODES_ENV = "AWAKEN_TEST_REDIS_CLUSTER"
"""``host:port`` of one node of the shared cluster; child processes of a test inherit it."""


def cluster_port() -> int:
    """A free port whose cluster bus port (``port + 10000``) is free and valid too."""
    while True:
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


class RedisCluster:
    """Three cluster-enabled ``redis-server`` primaries in one directory."""

    def __init__(self, directory: Path) -> None:
        self.binary = redis_server_binary()
        self.directory = directory
        self.ports = [cluster_port() for _ in range(3)]
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        """Start the three nodes and join them; on any failure, stop what was started."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        cli = shutil.which("redis-cli")
        if cli is None:
            message = "redis-cli is not installed; it joins the nodes of the Redis Cluster"
            if os.environ.get(REQUIRE_ENV) == "1":
                pytest.fail(message)
            pytest.skip(message)
        for port in self.ports:
            node = self.directory / str(port)
            node.mkdir(parents=True)
            self.processes.append(
                subprocess.Popen(
                    [
                        self.binary,
                        "--port",
                        str(port),
                        "--bind",
                        "127.0.0.1",
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                        "--logfile",
                        "redis.log",
                    ],
                    cwd=node,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.STDOUT,
                )
            )
        deadline = time.monotonic() + 10
        for port in self.ports:
            while (
                subprocess.run(
                    [cli, "-p", str(port), "ping"], capture_output=True, text=True, check=False
                ).stdout.strip()
                != "PONG"
            ):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"cluster node on port {port} did not start")
                time.sleep(0.05)
        nodes = [f"127.0.0.1:{port}" for port in self.ports]
        subprocess.run(
            [cli, "--cluster", "create", *nodes, "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True,
            check=True,
            timeout=60,
        )
        while (
            "cluster_state:ok"
            not in subprocess.run(
                [cli, "-p", str(self.ports[0]), "cluster", "info"],
                capture_output=True,
                text=True,
                check=False,
            ).stdout
        ):
            if time.monotonic() > deadline + 20:
                raise RuntimeError("the Redis Cluster did not reach cluster_state:ok")
            time.sleep(0.05)

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)
        self.processes = []


_shared: RedisCluster | None = None


def shared_redis_cluster() -> RedisCluster:
    """Return this process's shared cluster, starting it on first use."""
    global _shared
    if _shared is None:
        directory = Path(tempfile.mkdtemp(prefix="awaken-redis-cluster-"))
        cluster = RedisCluster(directory)
        cluster.start()
        atexit.register(shutil.rmtree, directory, ignore_errors=True)
        atexit.register(cluster.stop)
        os.environ[NODES_ENV] = f"127.0.0.1:{cluster.ports[0]}"
        _shared = cluster
    return _shared


def cluster_client() -> Any:
    """A ``redis.cluster.RedisCluster`` client of the shared cluster."""
    import redis.cluster

    node = os.environ.get(NODES_ENV) or f"127.0.0.1:{shared_redis_cluster().ports[0]}"
    host, _, port = node.rpartition(":")
    return redis.cluster.RedisCluster(host=host, port=int(port))


def cluster_store_on(location: Path, **kwargs: Any) -> Any:
    """A Redis store on the shared cluster whose keys are shared by every store on ``location``.

    The store borrows its cluster client; the client is closed with the store.
    """
    from awaken_langchain.stores.redis import RedisStreamCheckpointStore

    client = cluster_client()

    class ClusterStore(RedisStreamCheckpointStore):
        def close(self) -> None:
            super().close()
            client.close()

    return ClusterStore(client=client, prefix=prefix_for(location), **kwargs)


def cluster_let_time_pass(store: Any, location: Path, seconds: float) -> None:
    """Delete every key of the store whose time to live ends within ``seconds``."""
    client = cluster_client()
    try:
        for key in list(client.scan_iter(match=f"{prefix_for(location)}:*")):
            if 0 <= client.pttl(key) <= seconds * 1000:
                client.delete(key)
    finally:
        client.close()
