"""Checkpoint store backends.

Local stores are importable from here; the Redis store lives in
``awaken_langchain.stores.redis`` so that importing this package never needs redis.
"""

from awaken_langchain.stores.diskcache import DiskCacheStreamCheckpointStore
from awaken_langchain.stores.file import FileStreamCheckpointStore
from awaken_langchain.stores.memory import InMemoryStreamCheckpointStore

__all__ = [
    "DiskCacheStreamCheckpointStore",
    "FileStreamCheckpointStore",
    "InMemoryStreamCheckpointStore",
]
