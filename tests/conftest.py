"""Shared pytest configuration.

Every checkpoint store runs the conformance suite in ``test_store_conformance.py``
through the ``store``/``store_factory`` fixtures below. A new backend costs one
:class:`StoreBackend` entry in :data:`STORE_BACKENDS`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncGenerator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import diskcache
import pytest

from awaken_langchain import (
    DiskCacheStreamCheckpointStore,
    FileStreamCheckpointStore,
    InMemoryStreamCheckpointStore,
    StreamCheckpointStore,
)
from awaken_langchain.stores._base import run_id_bytes
from tests.redis_server import corrupt_redis, redis_server, store_on

REPO_ROOT = Path(__file__).resolve().parent.parent

pytest_plugins = ["awaken_langchain.testing.pytest_plugin"]

__all__ = ["redis_server"]  # the session fixture, defined with the server helper


class FakeClock:
    """A settable wall clock for TTL tests."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass(frozen=True)
class StoreBackend:
    """How the conformance suite builds and pokes one kind of store.

    Attributes:
        name: Test id.
        make: Builds a store on ``location`` (a fresh path per test) with the
            given keyword arguments (``ttl``, ``clock``, ``max_checkpoint_bytes``).
        corrupt: Overwrites the stored ``part`` ("head" or "text") of a run
            with garbage, behind the store's back.
        durable: Stores built on the same location share their data.
        child_source: Python source of an expression that builds the store on
            ``location`` in another process (``None`` if it cannot be shared).
        uses_directory: The store keeps its data inside ``location``.
    """

    name: str
    make: Callable[..., StreamCheckpointStore]
    corrupt: Callable[[StreamCheckpointStore, Path, str, str], None]
    durable: bool
    child_source: str | None
    uses_directory: bool


def _corrupt_memory(store: StreamCheckpointStore, location: Path, run_id: str, part: str) -> None:
    assert isinstance(store, InMemoryStreamCheckpointStore)
    if part == "head":
        store._heads[run_id] = b'{"format": "not a head'
    else:
        store._texts[run_id] = bytearray(b"\xff\xfe\xfd")


def _corrupt_diskcache(
    store: StreamCheckpointStore, location: Path, run_id: str, part: str
) -> None:
    with diskcache.Cache(str(location)) as raw:
        if part == "head":
            raw.set(b"h\x00" + run_id_bytes(run_id), b"\x00garbage")
        else:
            raw.set(b"s\x00" + run_id_bytes(run_id) + b"\x000", b"\xff\xfe\xfd")


def _corrupt_file(store: StreamCheckpointStore, location: Path, run_id: str, part: str) -> None:
    assert isinstance(store, FileStreamCheckpointStore)
    log = location / f"{store._stem(run_id)}.log"
    if part == "head":
        log.write_bytes(b"\x00garbage")
    else:  # flip the last byte of the first frame's text: its checksum no longer matches
        data = bytearray(log.read_bytes())
        data[-1] ^= 0xFF
        log.write_bytes(bytes(data))


STORE_BACKENDS: list[StoreBackend] = [
    StoreBackend(
        name="memory",
        make=lambda location, **kwargs: InMemoryStreamCheckpointStore(**kwargs),
        corrupt=_corrupt_memory,
        durable=False,
        child_source=None,
        uses_directory=False,
    ),
    StoreBackend(
        name="diskcache",
        make=lambda location, **kwargs: DiskCacheStreamCheckpointStore(location, **kwargs),
        corrupt=_corrupt_diskcache,
        durable=True,
        child_source="DiskCacheStreamCheckpointStore(location)",
        uses_directory=True,
    ),
    StoreBackend(
        name="file",
        make=lambda location, **kwargs: FileStreamCheckpointStore(location, **kwargs),
        corrupt=_corrupt_file,
        durable=True,
        child_source="FileStreamCheckpointStore(location)",
        uses_directory=True,
    ),
    StoreBackend(
        name="redis",
        make=store_on,
        corrupt=corrupt_redis,
        durable=True,
        child_source="__import__('tests.redis_server', fromlist=['x']).store_on(location)",
        uses_directory=False,
    ),
]


class StoreFactory:
    """Builds stores of one backend on one per-test location."""

    def __init__(self, backend: StoreBackend, location: Path) -> None:
        self.backend = backend
        self.location = location
        self._made: list[StreamCheckpointStore] = []

    def __call__(self, **kwargs: Any) -> StreamCheckpointStore:
        store = self.backend.make(self.location, **kwargs)
        self._made.append(store)
        return store

    def corrupt(self, store: StreamCheckpointStore, run_id: str, part: str) -> None:
        self.backend.corrupt(store, self.location, run_id, part)

    def run_child(self, body: str, *args: str, timeout: float = 60) -> str:
        """Run ``body`` in a new Python process with ``store`` bound; return its stdout."""
        assert self.backend.child_source is not None
        source = (
            "import sys\n"
            "from pathlib import Path\n"
            "from awaken_langchain import *\n"
            "from awaken_langchain.checkpoint import StreamCheckpoint\n"
            f"location = Path({str(self.location)!r})\n"
            f"store = {self.backend.child_source}\n" + body
        )
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        done = subprocess.run(
            [sys.executable, "-c", source, *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def close(self) -> None:
        for store in self._made:
            store.close()


@pytest.fixture(params=STORE_BACKENDS, ids=lambda backend: backend.name)
def store_backend(request: pytest.FixtureRequest) -> StoreBackend:
    """Each store backend in turn."""
    backend: StoreBackend = request.param
    return backend


@pytest.fixture
def store_factory(store_backend: StoreBackend, tmp_path: Path) -> Iterator[StoreFactory]:
    """Builds stores of the current backend, all on the same location."""
    factory = StoreFactory(store_backend, tmp_path / "checkpoints")
    yield factory
    factory.close()


@pytest.fixture
def store(store_factory: StoreFactory) -> StreamCheckpointStore:
    """A fresh store of the current backend."""
    return store_factory()


@pytest.fixture
def clock() -> FakeClock:
    """A settable clock starting at a fixed time."""
    return FakeClock()


# -- the sync and the async driver -------------------------------------------------------


class Drive:
    """Calls a model through its sync or its async entry points, awaited alike.

    Attributes:
        mode: ``"sync"`` (``stream``/``invoke``/``batch``/``generate``) or
            ``"async"`` (``astream``/``ainvoke``/``abatch``/``agenerate``).
    """

    def __init__(self, mode: str) -> None:
        self.mode = mode

    async def stream(
        self, model: Any, input: Any, config: dict[str, Any] | None = None, **kwargs: Any
    ) -> list[Any]:
        """Every chunk of one streamed call."""
        if self.mode == "sync":
            return list(model.stream(input, config=config, **kwargs))
        return [chunk async for chunk in model.astream(input, config=config, **kwargs)]

    def iterate(
        self, model: Any, input: Any, config: dict[str, Any] | None = None, **kwargs: Any
    ) -> AsyncGenerator[Any, None]:
        """An open stream: pull with ``anext``, abandon with ``aclose``."""
        if self.mode == "sync":
            return _sync_chunks(model.stream(input, config=config, **kwargs))
        chunks: AsyncGenerator[Any, None] = model.astream(input, config=config, **kwargs)
        return chunks

    async def invoke(
        self, model: Any, input: Any, config: dict[str, Any] | None = None, **kwargs: Any
    ) -> Any:
        """The answer of one call."""
        if self.mode == "sync":
            return model.invoke(input, config=config, **kwargs)
        return await model.ainvoke(input, config=config, **kwargs)

    async def batch(
        self, model: Any, inputs: list[Any], config: Any = None, **kwargs: Any
    ) -> list[Any]:
        """The answers of one batch."""
        if self.mode == "sync":
            return list(model.batch(inputs, config=config, **kwargs))
        return list(await model.abatch(inputs, config=config, **kwargs))

    async def generate(self, model: Any, messages: list[Any], **kwargs: Any) -> Any:
        """The ``LLMResult`` of ``generate``/``agenerate``."""
        if self.mode == "sync":
            return model.generate(messages, **kwargs)
        return await model.agenerate(messages, **kwargs)


async def _sync_chunks(chunks: Iterator[Any]) -> AsyncGenerator[Any, None]:
    """A sync stream pulled one chunk per ``anext``, and closed when abandoned."""
    try:
        for chunk in chunks:
            yield chunk
    finally:
        getattr(chunks, "close", lambda: None)()


@pytest.fixture(params=["sync", "async"], ids=["sync", "async"])
def drive(request: pytest.FixtureRequest) -> Drive:
    """Each case runs through the sync and then the async driver."""
    return Drive(str(request.param))
