"""Every real store the process-level tests run on, opened by name in any process.

A test process names a store by its kind, a location (a directory; a server
store keeps its records under a table or key prefix made from it, so every
store on one location shares them) and, for a server store, the address of the
shared test server (:func:`server_address`). Child processes get the three as
arguments and open the same store with :func:`open_store`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import pytest

StoreKind = Literal["diskcache", "file", "redis", "redis-cluster", "postgres"]

SERVER_KINDS = [
    pytest.param("redis", marks=pytest.mark.redis),
    pytest.param("redis-cluster", marks=pytest.mark.redis),
    pytest.param("postgres", marks=pytest.mark.postgres),
]
"""The server stores, as parameters that carry their markers."""


def server_address(kind: StoreKind) -> str:
    """Where the shared test server of ``kind`` listens, starting it on first use."""
    if kind == "redis":
        from tests.redis_server import shared_redis_server

        return shared_redis_server().url
    if kind == "redis-cluster":
        from tests.redis_cluster import shared_redis_cluster

        return f"127.0.0.1:{shared_redis_cluster().ports[0]}"
    if kind == "postgres":
        from tests.postgres_server import shared_postgres_server

        return shared_postgres_server().dsn
    return ""


def store_recipe(
    kind: StoreKind, location: str, address: str = ""
) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """The store class of ``kind`` and the arguments that open it on ``location``."""
    if kind == "diskcache":
        from awaken_langchain import DiskCacheStreamCheckpointStore

        return DiskCacheStreamCheckpointStore, (location,), {}
    if kind == "file":
        from awaken_langchain import FileStreamCheckpointStore

        return FileStreamCheckpointStore, (location,), {}
    if kind == "postgres":
        from awaken_langchain.stores.postgres import PostgresStreamCheckpointStore
        from tests.postgres_server import table_for

        return PostgresStreamCheckpointStore, (address,), {"table": table_for(Path(location))}
    from awaken_langchain.stores.redis import RedisStreamCheckpointStore
    from tests.redis_server import prefix_for

    prefix = prefix_for(Path(location))
    if kind == "redis":
        return RedisStreamCheckpointStore, (address,), {"prefix": prefix}
    import redis.cluster

    host, _, port = address.rpartition(":")
    client = redis.cluster.RedisCluster(host=host, port=int(port))

    class ClusterStore(RedisStreamCheckpointStore):
        """Closes the cluster client it was given when it closes."""

        def close(self) -> None:
            super().close()
            client.close()

    return ClusterStore, (), {"client": client, "prefix": prefix}


def open_store(kind: StoreKind, location: str, address: str = "", **settings: Any) -> Any:
    """The real store of ``kind`` on ``location``."""
    base, args, kwargs = store_recipe(kind, location, address)
    return base(*args, **kwargs, **settings)
