"""Shared pytest configuration.

Every checkpoint store runs the conformance suite in ``test_store_conformance.py``
through the ``store``/``store_factory`` fixtures below. A new backend costs one
:class:`StoreBackend` entry in :data:`STORE_BACKENDS`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import weakref
from collections.abc import AsyncGenerator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import diskcache
import pytest
from hypothesis import settings
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models import BaseChatModel

from awaken_langchain import (
    DiskCacheStreamCheckpointStore,
    FileStreamCheckpointStore,
    InMemoryStreamCheckpointStore,
    StreamCheckpointStore,
)
from awaken_langchain.stores._base import run_id_bytes
from awaken_langchain.testing import LoopbackProvider, RecordedRequest
from tests.postgres_server import corrupt_postgres, postgres_records, postgres_store_on
from tests.redis_server import (
    corrupt_redis,
    private_redis,
    redis_let_time_pass,
    redis_records,
    redis_server,
    store_on,
)

REPO_ROOT = Path(__file__).resolve().parent.parent

# Property tests check what holds for every input, not how fast one example runs:
# hypothesis's 200 ms per-example deadline fails them on a loaded machine (several
# test workers on two cores) without saying anything about the code.
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")


def _cache_child_bytecode() -> None:
    """Let the suite's child interpreters keep their bytecode, outside the checkout.

    Hundreds of tests start a Python process (the CLI, crash and replacement
    workers, README examples, valgrind's counted runs). With
    ``PYTHONDONTWRITEBYTECODE`` set each of them compiles this package's modules
    again, about a quarter of its start-up. The children instead write and read
    their bytecode under a private per-user cache directory
    (``PYTHONPYCACHEPREFIX``), so nothing is written next to the sources, as the
    setting asked.
    """
    if not os.environ.get("PYTHONDONTWRITEBYTECODE") or os.environ.get("PYTHONPYCACHEPREFIX"):
        return
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    prefix = cache / "awaken-langchain-tests" / "pycache"
    try:
        prefix.mkdir(mode=0o700, parents=True, exist_ok=True)
        owned = prefix.stat().st_uid == os.getuid() and prefix.stat().st_mode & 0o022 == 0
    except OSError:
        return
    if owned:
        os.environ["PYTHONPYCACHEPREFIX"] = str(prefix)
        del os.environ["PYTHONDONTWRITEBYTECODE"]


_cache_child_bytecode()


def _read_the_trust_store_on_demand() -> None:
    """Point TLS at the system's hashed certificate directory instead of its bundle file.

    The suite builds thousands of real SDK clients (each loopback server has its
    own port, so LangChain's per-URL client cache does not help), and every
    client's HTTP transport makes an SSL context. Given the bundle file
    (``SSL_CERT_FILE``, or OpenSSL's default) OpenSSL parses all of its ~140
    certificates each time: about 25 ms of CPU, a third of the CPU of the tests
    that talk to the loopback provider. Given the same certificates as a hashed
    directory (Debian's ``/etc/ssl/certs``), it reads one only when a TLS
    handshake needs it, and the loopback provider speaks plain HTTP. A bundle
    of the user's own (anywhere else) is kept.
    """
    certs = Path("/etc/ssl/certs")
    bundle, directory = os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR")
    if not certs.is_dir() or (directory and Path(directory).resolve() != certs.resolve()):
        return
    if bundle and Path(bundle).resolve().parent != certs.resolve():
        return
    if not any(name.endswith(".0") for name in os.listdir(certs)):
        return  # not hashed: OpenSSL could not find a certificate in it
    os.environ.pop("SSL_CERT_FILE", None)
    os.environ["SSL_CERT_DIR"] = str(certs)


_read_the_trust_store_on_demand()


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: two workers more than this process may use cores.

    About a third of the suite's time is spent waiting, not computing: paced
    streams, stalls and deadlines that must run out, child processes starting.
    More workers keep the cores busy meanwhile. Measured on 2 idle cores (6,392
    tests): 5 min 12 s with 3 workers, 4 min 50 s with 4, 4 min 51 s with 5
    (and 5 % more CPU).
    """
    return len(os.sched_getaffinity(0)) + 2


pytest_plugins = ["awaken_langchain.testing.pytest_plugin"]

__all__ = ["private_redis", "redis_server"]  # fixtures defined with the server helper


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
        records: Counts what the store holds: entries, keys or files (the
            store's lock file excluded).
        let_time_pass: Does what the backend's own expiry does after that
            many seconds (Redis); stores that expire only by ``gc`` do nothing.
    """

    name: str
    make: Callable[..., StreamCheckpointStore]
    corrupt: Callable[[StreamCheckpointStore, Path, str, str], None]
    durable: bool
    child_source: str | None
    uses_directory: bool
    records: Callable[[StreamCheckpointStore, Path], int]
    let_time_pass: Callable[[StreamCheckpointStore, Path, float], None] = (
        lambda store, location, seconds: None
    )


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


def _memory_records(store: StreamCheckpointStore, location: Path) -> int:
    assert isinstance(store, InMemoryStreamCheckpointStore)
    return sum(len(held) for held in (store._heads, store._texts, store._write_ids, store._epochs))


def _diskcache_records(store: StreamCheckpointStore, location: Path) -> int:
    with diskcache.Cache(str(location)) as raw:
        return len(raw)


def _file_records(store: StreamCheckpointStore, location: Path) -> int:
    return sum(1 for path in location.iterdir() if path.name != ".lock")


STORE_BACKENDS: list[StoreBackend] = [
    StoreBackend(
        name="memory",
        make=lambda location, **kwargs: InMemoryStreamCheckpointStore(**kwargs),
        corrupt=_corrupt_memory,
        durable=False,
        child_source=None,
        uses_directory=False,
        records=_memory_records,
    ),
    StoreBackend(
        name="diskcache",
        make=lambda location, **kwargs: DiskCacheStreamCheckpointStore(location, **kwargs),
        corrupt=_corrupt_diskcache,
        durable=True,
        child_source="DiskCacheStreamCheckpointStore(location)",
        uses_directory=True,
        records=_diskcache_records,
    ),
    StoreBackend(
        name="file",
        make=lambda location, **kwargs: FileStreamCheckpointStore(location, **kwargs),
        corrupt=_corrupt_file,
        durable=True,
        child_source="FileStreamCheckpointStore(location)",
        uses_directory=True,
        records=_file_records,
    ),
    StoreBackend(
        name="redis",
        make=store_on,
        corrupt=corrupt_redis,
        durable=True,
        child_source="__import__('tests.redis_server', fromlist=['x']).store_on(location)",
        uses_directory=False,
        records=redis_records,
        let_time_pass=redis_let_time_pass,
    ),
]

POSTGRES = StoreBackend(
    name="postgres",
    make=postgres_store_on,
    corrupt=corrupt_postgres,
    durable=True,
    child_source="__import__('tests.postgres_server', fromlist=['x']).postgres_store_on(location)",
    uses_directory=False,
    records=postgres_records,
)
"""The PostgreSQL store, on tables of its own per test in the server the suite starts."""


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

    def records(self, store: StreamCheckpointStore) -> int:
        return self.backend.records(store, self.location)

    def let_time_pass(self, store: StreamCheckpointStore, clock: FakeClock, seconds: float) -> None:
        """Move the store's clock, and the backend's own expiry with it."""
        clock.advance(seconds)
        self.backend.let_time_pass(store, self.location, seconds)

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


# -- real clients on the loopback provider ---------------------------------------------

LOOPBACK_MODELS = {"openai": "gpt-4o-mini", "anthropic": "claude-loopback"}
"""The model each real client asks the loopback provider for, unless a test names another."""

_LOOPBACK_CLIENTS: weakref.WeakKeyDictionary[LoopbackProvider, dict[str, BaseChatModel]] = (
    weakref.WeakKeyDictionary()
)
"""Clients kept per server object: a later server can get a stopped one's port, and a
client kept by port would send its first request on a pooled connection to the old one."""


def loopback_client(provider: str, server: LoopbackProvider, **settings: Any) -> BaseChatModel:
    """The real ``ChatOpenAI`` or ``ChatAnthropic`` talking to ``server``, built once.

    The SDK does not retry (``max_retries=0``): only the wrapper under test does.
    Clients are costly to build, so one is kept per provider, server and settings.

    Args:
        provider: ``"openai"`` (Chat Completions) or ``"anthropic"``.
        server: The loopback provider.
        settings: More constructor settings (``model`` replaces the default one).
    """
    kept = _LOOPBACK_CLIENTS.setdefault(server, {})
    values = {"model": LOOPBACK_MODELS[provider], "api_key": "x", "max_retries": 0, **settings}
    key = f"{provider}:{sorted(values.items())!r}"
    if key not in kept:
        if provider == "openai":
            from langchain_openai import ChatOpenAI

            kept[key] = ChatOpenAI(base_url=server.base_url_openai, **values)
        else:
            from langchain_anthropic import ChatAnthropic

            kept[key] = ChatAnthropic(base_url=server.base_url_anthropic, **values)
    return kept[key]


class Sleeps:
    """Records the waits the policy asked for, advancing a fake clock instead of sleeping."""

    def __init__(self) -> None:
        self.waits: list[float] = []
        self.now = 0.0

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds

    async def asleep(self, seconds: float) -> None:
        self(seconds)

    def clock(self) -> float:
        return self.now


class Events(BaseCallbackHandler):
    """The recovery events a call reported (custom events), in order."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, Any]] = []

    def on_custom_event(self, name: str, data: Any, **kwargs: Any) -> None:
        self.seen.append((name, data))

    def named(self, name: str) -> list[Any]:
        return [data for seen, data in self.seen if seen == name]


def answered_a_tool(request: RecordedRequest) -> bool:
    """Whether an OpenAI or Anthropic request carries a tool result."""
    for message in request.messages:
        if message.get("role") == "tool":
            return True
        content = message.get("content")
        if isinstance(content, list) and any(
            isinstance(b, dict) and b.get("type") == "tool_result" for b in content
        ):
            return True
    return False


@pytest.fixture(scope="module")
def shared_server() -> Iterator[LoopbackProvider]:
    """One loopback provider per test module (the clients built on it are kept)."""
    with LoopbackProvider() as provider:
        yield provider


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
