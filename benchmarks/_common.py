"""What the benchmarks share: inner models, store factories, timing, tables.

Every benchmark measures a case against its baseline in the same run and
prints the ratio, so that a slow or busy machine shifts both alike. Timings
are taken as the minimum (or median) of interleaved repetitions.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from pydantic import PrivateAttr

from awaken_langchain import (
    DiskCacheStreamCheckpointStore,
    FileStreamCheckpointStore,
    InMemoryStreamCheckpointStore,
    StreamCheckpoint,
    StreamCheckpointStore,
)
from awaken_langchain.errors import StreamCheckpointError
from awaken_langchain.writer import takes_deferred

REPO_ROOT = Path(__file__).resolve().parent.parent

TOKEN = "tok "
"""One streamed token: four characters, the size the library estimates a token at."""

T = TypeVar("T")


def cores() -> int:
    """CPU cores this process may run on (what ``nproc`` prints)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def machine_line() -> str:
    """One line naming the machine the figures come from."""
    return f"python {sys.version.split()[0]}, {cores()} cores (nproc)"


def written_bytes() -> int | None:
    """Bytes this process has passed to write() so far (Linux), else ``None``."""
    try:
        with open("/proc/self/io") as handle:
            for line in handle:
                if line.startswith("wchar:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def percentile(values: Sequence[float], fraction: float) -> float:
    """The ``fraction`` quantile of ``values`` (nearest rank)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[rank]


def median(values: Sequence[float]) -> float:
    """The median of ``values`` (``nan`` when empty)."""
    return statistics.median(values) if values else float("nan")


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Format rows as a plain-text table, first column left-aligned."""
    cells = [[str(h) for h in headers], *[[_cell(v) for v in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        parts = [
            value.ljust(widths[i]) if i == 0 else value.rjust(widths[i])
            for i, value in enumerate(row)
        ]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


# -- inner models ---------------------------------------------------------------


class TokenStreamModel(BaseChatModel):
    """A minimal inner model: streams ``tokens`` chunks of ``"tok "`` then a finish chunk.

    It builds one fresh chunk per token, as any provider integration does, and
    nothing else, so the wrapper's cost is not hidden behind the inner model's.
    """

    tokens: int = 1_000
    """Text chunks streamed before the terminal chunk."""
    provider: str | None = None
    """Name each chunk's provider in its ``response_metadata`` (``model_provider``),
    as the OpenAI and Anthropic integrations do on every chunk."""

    def _last(self) -> dict[str, Any]:
        """The metadata of the terminal chunk."""
        if self.provider is None:
            return {"finish_reason": "stop"}
        return {"finish_reason": "stop", "model_provider": self.provider}

    @property
    def _llm_type(self) -> str:
        return "token-stream"

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        raise NotImplementedError("TokenStreamModel only streams")

    def _stream(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> Iterator[ChatGenerationChunk]:
        provider = self.provider
        for _ in range(self.tokens):  # a fresh chunk per token, naming its provider if any
            if provider is None:
                yield ChatGenerationChunk(message=AIMessageChunk(content=TOKEN))
            else:
                yield ChatGenerationChunk(
                    message=AIMessageChunk(
                        content=TOKEN, response_metadata={"model_provider": provider}
                    )
                )
        yield ChatGenerationChunk(
            message=AIMessageChunk(content="", response_metadata=self._last())
        )

    async def _astream(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> AsyncIterator[ChatGenerationChunk]:
        provider = self.provider
        for _ in range(self.tokens):  # a fresh chunk per token, naming its provider if any
            if provider is None:
                yield ChatGenerationChunk(message=AIMessageChunk(content=TOKEN))
            else:
                yield ChatGenerationChunk(
                    message=AIMessageChunk(
                        content=TOKEN, response_metadata={"model_provider": provider}
                    )
                )
        yield ChatGenerationChunk(
            message=AIMessageChunk(content="", response_metadata=self._last())
        )


def answer_for(request: str, chars: int) -> str:
    """The deterministic answer of :class:`ContinuingModel` to one request text."""
    words = []
    size = 0
    n = 0
    while size < chars:
        word = f"{request}-{n:05d} "
        words.append(word)
        size += len(word)
        n += 1
    return "".join(words)[:chars]


@dataclass
class Interruption:
    """When a :class:`ContinuingModel` attempt broke and when the next one began."""

    raised_at: float
    raised_cpu: float
    continued_at: float | None = None
    continued_cpu: float | None = None


class ContinuingModel(BaseChatModel):
    """An inner model that answers each request with its own text and continues faithfully.

    The answer depends on the last user message of the original request (so
    concurrent turns have distinct texts). A first attempt streams
    ``break_after`` characters and raises ``ConnectionResetError``; a
    continuation request (one carrying the assistant prefix) streams the rest
    of the answer after that prefix, as a model continuing exactly would.
    The moments of each break and of the next request are recorded.
    """

    chars: int = 4_000
    """Length of every answer, in characters."""
    chunk_chars: int = 4
    """Characters per streamed chunk."""
    break_after: int | None = None
    """Characters of a first attempt sent before it breaks; ``None`` never breaks."""
    yield_every: int = 0
    """Async only: give other tasks a turn after this many chunks (0 never)."""

    _interruptions: list[Interruption] = PrivateAttr(default_factory=list)
    _requests: list[float] = PrivateAttr(default_factory=list)
    _request_cpu: list[float] = PrivateAttr(default_factory=list)
    _gate: threading.Event | None = PrivateAttr(default=None)

    def break_when(self, gate: threading.Event) -> None:
        """Break a first attempt only once ``gate`` is set.

        The sync wrapper reads the inner stream in a pump thread that runs
        ahead of the caller; the caller sets the gate when it has received the
        whole prefix, so the break reaches a wrapper that has caught up, as it
        does when chunks come over a network.
        """
        self._gate = gate

    @property
    def _llm_type(self) -> str:
        return "continuing"

    @property
    def interruptions(self) -> list[Interruption]:
        """Every break, with the moment the following request arrived."""
        return self._interruptions

    @property
    def requests(self) -> list[float]:
        """The moment (``time.perf_counter()``) each request arrived."""
        return self._requests

    @property
    def request_cpu(self) -> list[float]:
        """The process CPU time (``time.process_time()``) when each request arrived."""
        return self._request_cpu

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        raise NotImplementedError("ContinuingModel only streams")

    def _plan(self, messages: list[BaseMessage]) -> tuple[str, int, int | None]:
        """Return the answer, where this attempt starts in it, and where it breaks."""
        now = time.perf_counter()
        self._requests.append(now)
        self._request_cpu.append(time.process_time())
        if self._interruptions and self._interruptions[-1].continued_at is None:
            self._interruptions[-1].continued_at = now
            self._interruptions[-1].continued_cpu = self._request_cpu[-1]
        prefix = ""
        original = messages
        if len(messages) >= 3 and isinstance(messages[-2], AIMessage):
            prefix = str(messages[-2].content)
            original = messages[:-2]
        answer = answer_for(str(original[-1].content), self.chars)
        if prefix:
            if not answer.startswith(prefix):
                raise AssertionError("the continuation prefix is not the start of the answer")
            return answer, len(prefix), None
        return answer, 0, self.break_after

    def _pieces(self, answer: str, start: int, stop: int | None) -> Iterator[str]:
        end = len(answer) if stop is None else stop
        for i in range(start, end, self.chunk_chars):
            yield answer[i : min(i + self.chunk_chars, end)]

    def _broke(self) -> ConnectionResetError:
        self._interruptions.append(Interruption(time.perf_counter(), time.process_time()))
        return ConnectionResetError("connection reset by peer")

    def _stream(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> Iterator[ChatGenerationChunk]:
        answer, start, stop = self._plan(messages)
        for piece in self._pieces(answer, start, stop):
            yield ChatGenerationChunk(message=AIMessageChunk(content=piece))
        if stop is not None:
            if self._gate is not None and not self._gate.wait(timeout=60):
                raise RuntimeError("the caller never received the prefix")
            raise self._broke()
        yield ChatGenerationChunk(
            message=AIMessageChunk(content="", response_metadata={"finish_reason": "stop"})
        )

    async def _astream(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> AsyncIterator[ChatGenerationChunk]:
        answer, start, stop = self._plan(messages)
        for n, piece in enumerate(self._pieces(answer, start, stop), 1):
            yield ChatGenerationChunk(message=AIMessageChunk(content=piece))
            if self.yield_every and n % self.yield_every == 0:
                await asyncio.sleep(0)
        if stop is not None:
            raise self._broke()
        yield ChatGenerationChunk(
            message=AIMessageChunk(content="", response_metadata={"finish_reason": "stop"})
        )


# -- stores ---------------------------------------------------------------------------

LARGE = 1 << 30
"""A checkpoint size limit no benchmark reaches."""


def redis_available() -> bool:
    """Whether the Redis store exists in this checkout and a redis-server binary is installed."""
    return (
        find_spec("awaken_langchain.stores.redis") is not None
        and find_spec("redis") is not None
        and shutil.which("redis-server") is not None
    )


def net_input_bytes(url: str) -> int:
    """Bytes the Redis server at ``url`` has received from clients so far."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        return int(client.info("stats")["total_net_input_bytes"])
    finally:
        client.close()


@contextlib.contextmanager
def redis_server() -> Iterator[str | None]:
    """The URL of a private redis-server, or ``None`` when Redis is not available.

    The server is the test suite's (tests/redis_server.py): a free loopback port,
    a temporary directory, nothing persisted; it is stopped afterwards.
    """
    if not redis_available():
        yield None
        return
    from tests.redis_server import RedisServer

    directory = Path(tempfile.mkdtemp(prefix="bench-redis-"))
    server = RedisServer(directory)
    server.start()
    try:
        yield server.url
    finally:
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)


def store_names(*, redis: bool = True) -> list[str]:
    """The stores to measure: the local ones, and Redis when it is available."""
    names = ["memory", "file", "diskcache"]
    if redis and redis_available():
        names.append("redis")
    return names


def make_store(name: str, directory: Path, redis_url: str | None = None) -> StreamCheckpointStore:
    """Build the named store over ``directory`` (or the Redis server at ``redis_url``)."""
    if name == "memory":
        return InMemoryStreamCheckpointStore(max_checkpoint_bytes=LARGE)
    if name == "file":
        return FileStreamCheckpointStore(directory, max_checkpoint_bytes=LARGE)
    if name == "diskcache":
        return DiskCacheStreamCheckpointStore(directory, max_checkpoint_bytes=LARGE)
    if name == "redis":
        if redis_url is None:
            raise ValueError("the redis store needs the URL of a running redis-server")
        from awaken_langchain.stores.redis import RedisStreamCheckpointStore

        return RedisStreamCheckpointStore(redis_url, prefix="bench", max_checkpoint_bytes=LARGE)
    raise ValueError(f"unknown store {name!r}; choose from memory, file, diskcache, redis")


class _CollectorTime:
    """CPU seconds the garbage collector spent on each thread (a ``gc.callbacks`` hook).

    A collection runs on the thread whose allocation set it off, for as long
    as the process's heap takes; one that starts inside a store call is timed
    with it, though the store did not cause it.
    """

    def __init__(self) -> None:
        self._threads = threading.local()

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        here = self._threads
        if phase == "start":
            here.started = time.thread_time()
        elif hasattr(here, "started"):
            here.total = self.seconds() + time.thread_time() - here.started
            del here.started

    def seconds(self) -> float:
        """Collector CPU seconds on this thread so far."""
        total: float = getattr(self._threads, "total", 0.0)
        return total


COLLECTOR_TIME = _CollectorTime()


class TimedStore(StreamCheckpointStore):
    """Delegates to another store and records how long each call took.

    A stream's captures reach the inner store unbuilt, as they reach a store
    that takes them (`takes_deferred`, every store here): `timed` wraps no other.
    """

    takes_deferred: ClassVar[bool] = True

    def __init__(self, inner: StreamCheckpointStore) -> None:
        super().__init__(ttl=inner.ttl, max_checkpoint_bytes=inner.max_checkpoint_bytes)
        self.inner = inner
        self.clock = inner.clock
        self.put_seconds: list[float] = []
        """How long each checkpoint took to land (a batch's time, for each of its checkpoints)."""
        self.batches: list[int] = []
        """Checkpoints per ``put_many`` call."""
        self.on_commit: Callable[[Sequence[StreamCheckpoint], float], None] | None = None
        """Called with the checkpoints a put or put_many wrote and ``time.perf_counter()``."""
        self.other_seconds = 0.0
        self.cpu_seconds = 0.0
        """CPU time of the calling thread inside the sync calls (the store's own work)."""
        self.put_cpu_seconds = 0.0
        """The part of ``cpu_seconds`` spent in ``put`` and ``put_many``."""
        self.put_collector_seconds = 0.0
        """The part of ``put_cpu_seconds`` spent in garbage collections."""
        if COLLECTOR_TIME not in gc.callbacks:
            gc.callbacks.append(COLLECTOR_TIME)

    @property
    def total_seconds(self) -> float:
        """Time spent in every call."""
        return sum(self.put_seconds) + self.other_seconds

    def get(self, run_id: str) -> StreamCheckpoint | None:
        start, cpu = time.perf_counter(), time.thread_time()
        try:
            return self.inner.get(run_id)
        finally:
            self.cpu_seconds += time.thread_time() - cpu
            self.other_seconds += time.perf_counter() - start

    @contextlib.contextmanager
    def _timing_puts(self, count: int) -> Iterator[None]:
        """Time a block that puts ``count`` checkpoints (its wall time counts for each)."""
        start, cpu = time.perf_counter(), time.thread_time()
        collected = COLLECTOR_TIME.seconds()
        try:
            yield
        finally:
            cpu = time.thread_time() - cpu
            self.cpu_seconds += cpu
            self.put_cpu_seconds += cpu
            self.put_collector_seconds += COLLECTOR_TIME.seconds() - collected
            self.put_seconds.extend([time.perf_counter() - start] * count)

    def put(self, checkpoint: StreamCheckpoint) -> None:
        with self._timing_puts(1):
            self.inner.put(checkpoint)
        if self.on_commit is not None:
            self.on_commit([checkpoint], time.perf_counter())

    def put_many(
        self, checkpoints: Sequence[StreamCheckpoint]
    ) -> list[StreamCheckpointError | None]:
        errors = self._timed_batch(self.inner.put_many, checkpoints)
        assert errors is not None
        return errors

    def _timed_batch(
        self,
        put: Callable[[Sequence[StreamCheckpoint]], list[StreamCheckpointError | None] | None],
        checkpoints: Sequence[StreamCheckpoint],
    ) -> list[StreamCheckpointError | None] | None:
        try:
            with self._timing_puts(len(checkpoints)):
                errors = put(checkpoints)
        finally:
            self.batches.append(len(checkpoints))
        if self.on_commit is not None and errors is not None:
            written = [c for c, e in zip(checkpoints, errors, strict=True) if e is None]
            self.on_commit(written, time.perf_counter())
        return errors

    def delete(self, run_id: str, *, epoch: int | None = None) -> None:
        start, cpu = time.perf_counter(), time.thread_time()
        try:
            self.inner.delete(run_id, epoch=epoch)
        finally:
            self.cpu_seconds += time.thread_time() - cpu
            self.other_seconds += time.perf_counter() - start

    def claim(self, run_id: str) -> int:
        start, cpu = time.perf_counter(), time.thread_time()
        try:
            return self.inner.claim(run_id)
        finally:
            self.cpu_seconds += time.thread_time() - cpu
            self.other_seconds += time.perf_counter() - start

    def list_run_ids(self) -> list[str]:
        return self.inner.list_run_ids()

    def gc(self) -> int:
        return self.inner.gc()

    def close(self) -> None:
        self.inner.close()

    async def aget(self, run_id: str) -> StreamCheckpoint | None:
        start = time.perf_counter()
        try:
            return await self.inner.aget(run_id)
        finally:
            self.other_seconds += time.perf_counter() - start

    async def aput(self, checkpoint: StreamCheckpoint) -> None:
        start = time.perf_counter()
        try:
            await self.inner.aput(checkpoint)
        finally:
            self.put_seconds.append(time.perf_counter() - start)

    async def adelete(self, run_id: str, *, epoch: int | None = None) -> None:
        start = time.perf_counter()
        try:
            await self.inner.adelete(run_id, epoch=epoch)
        finally:
            self.other_seconds += time.perf_counter() - start

    async def aclaim(self, run_id: str) -> int:
        start = time.perf_counter()
        try:
            return await self.inner.aclaim(run_id)
        finally:
            self.other_seconds += time.perf_counter() - start


def diskcache_set_floor(directory: Path, sets: int = 2_000, size: int = 32) -> float:
    """CPU seconds of one plain diskcache ``set`` of ``size`` bytes (its own transaction).

    The floor a DiskCache checkpoint put is compared with: keys cycle over 256
    runs, as the paced streams' checkpoints do.
    """
    import diskcache

    cache = diskcache.Cache(str(directory), eviction_policy="none", statistics=False)
    value = b"x" * size
    try:
        for i in range(256):  # the rows exist, as a run's head does after its first put
            cache.set(b"k%d" % i, value)
        cpu = time.thread_time()
        for i in range(sets):
            cache.set(b"k%d" % (i % 256), value)
        return (time.thread_time() - cpu) / sets
    finally:
        cache.close()


def child_env() -> dict[str, str]:
    """Environment for a child process that must import this checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


def last_json(stdout: str) -> dict[str, Any]:
    """The JSON object a child process printed last (its figures; earlier lines are its own)."""
    result: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    return result


def child_results(children: Sequence[subprocess.Popen[str]], what: str) -> list[dict[str, Any]]:
    """The JSON object each child process printed last, in order.

    Raises:
        RuntimeError: If a child (a ``what``) exited with an error.
    """
    results = []
    for process in children:
        out, _ = process.communicate(timeout=600)
        if process.returncode != 0:
            raise RuntimeError(f"a {what} process failed ({process.returncode})")
        results.append(last_json(out))
    return results


def run_child(
    code: str,
    *,
    what: str,
    under: Sequence[str] = (),
    env: dict[str, str] | None = None,
    timeout: float = 600,
) -> tuple[dict[str, Any], str]:
    """Run ``code`` in a fresh interpreter that imports this checkout, and wait for it.

    Args:
        code: What the interpreter runs (``python -c``); it prints its figures
            as a JSON object on its last line.
        what: What the child is, for the error.
        under: A command the interpreter runs under, as `CACHEGRIND`.
        env: Its environment; `child_env` when ``None``.
        timeout: Most seconds to wait.

    Returns:
        The JSON object it printed last, and what it wrote to stderr.

    Raises:
        RuntimeError: If it exited with an error (the end of its stderr is in the message).
    """
    done = subprocess.run(
        [*under, sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env=child_env() if env is None else env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return last_json(done.stdout), done.stderr


CACHEGRIND = ("valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null")
"""valgrind counting every instruction a command executes (the total goes to stderr)."""

_REFS = re.compile(r"I\s+refs:\s+([\d,]+)")

CALLGRIND_FROM_HERE = ("valgrind", "--tool=callgrind", "--instr-atstart=no")
"""callgrind that counts nothing until the program calls `count_from_here`.

Valgrind runs an interpreter's start-up and imports about five times faster
uninstrumented; a benchmark that takes the start-up out by difference anyway
need not pay for counting it. Run the child with `COUNT_FROM_HERE` set in its
environment.
"""

COUNT_FROM_HERE = "AWAKEN_BENCHMARK_COUNT_FROM_HERE"


def count_from_here() -> None:
    """Turn on counting in this process, when it runs under `CALLGRIND_FROM_HERE`.

    valgrind's own ``vgdb`` asks this process's valgrind to instrument from now
    on; anywhere else this does nothing.

    Raises:
        RuntimeError: If valgrind did not take the request.
    """
    if os.environ.get(COUNT_FROM_HERE) != "1":
        return
    done = subprocess.run(
        ["vgdb", f"--pid={os.getpid()}", "instrumentation", "on"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        raise RuntimeError(f"vgdb could not turn on counting ({done.returncode}): {done.stderr}")


def require_valgrind() -> None:
    """Raise `RuntimeError` naming the fix when valgrind is not installed."""
    if shutil.which("valgrind") is None:
        raise RuntimeError("valgrind is not on the PATH: install it (apt-get install valgrind)")


def counted_instructions(stderr: str, what: str) -> int:
    """The instruction total valgrind wrote to ``stderr`` for ``what`` (a cachegrind run)."""
    found = _REFS.search(stderr)
    if found is None:
        raise RuntimeError(f"no instruction count in the output of {what}:\n{stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


# -- paced streams ----------------------------------------------------------------------


class PacedModel(BaseChatModel):
    """An async inner model that streams each request's answer on a clock, ``rate`` chunks/s.

    Chunk ``i`` of a turn is due ``i / rate`` seconds after the request; the
    model sleeps until then and yields it, and does nothing else (no provider
    simulation in the measured CPU). The answer is ``answer_for(question,
    chars)`` in chunks of ``chunk_chars`` characters, so concurrent turns have
    distinct texts. For each question it records when every chunk was due and
    when it was handed to the caller (``time.perf_counter()``).
    """

    chars: int = 1_200
    """Length of every answer, in characters."""
    chunk_chars: int = 4
    """Characters per streamed chunk."""
    rate: float = 30.0
    """Chunks per second of each stream."""

    _due: dict[str, list[float]] = PrivateAttr(default_factory=dict)
    _sent: dict[str, list[float]] = PrivateAttr(default_factory=dict)

    @property
    def _llm_type(self) -> str:
        return "paced"

    @property
    def due(self) -> dict[str, list[float]]:
        """For each question, when each chunk was due."""
        return self._due

    @property
    def sent(self) -> dict[str, list[float]]:
        """For each question, when each chunk was handed to the caller."""
        return self._sent

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        raise NotImplementedError("PacedModel only streams")

    async def _astream(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> AsyncIterator[ChatGenerationChunk]:
        question = str(messages[-1].content)
        answer = answer_for(question, self.chars)
        due = self._due.setdefault(question, [])
        sent = self._sent.setdefault(question, [])
        clock = time.perf_counter
        start = clock()
        step = 1.0 / self.rate
        for n, i in enumerate(range(0, len(answer), self.chunk_chars)):
            at = start + n * step
            wait = at - clock()
            if wait > 0:
                await asyncio.sleep(wait)
            due.append(at)
            sent.append(clock())
            yield ChatGenerationChunk(
                message=AIMessageChunk(content=answer[i : i + self.chunk_chars])
            )
        yield ChatGenerationChunk(
            message=AIMessageChunk(content="", response_metadata={"finish_reason": "stop"})
        )


async def paced_turn(
    model: Any, inner: PacedModel, question: str, late: list[float], **config: Any
) -> bool:
    """Stream one paced turn through ``model``; return whether it delivered its own text.

    Appends to ``late`` how long after its due time the caller received each
    chunk of text. ``config`` is the call's config (``run_id=...``).
    """
    parts = []
    n = 0
    async for chunk in model.astream(question, config=config):
        if chunk.content:
            late.append(time.perf_counter() - inner.due[question][n])
            n += 1
            parts.append(str(chunk.content))
    return "".join(parts) == answer_for(question, inner.chars)


class _TimedNow(TimedStore):
    """A `TimedStore` over a store that can work without waiting (`put_many_now`, `call_now`)."""

    takes_deferred: ClassVar[bool] = True  # declared by each class itself (`takes_deferred`)

    def put_many_now(
        self, checkpoints: Sequence[StreamCheckpoint]
    ) -> list[StreamCheckpointError | None] | None:
        return self._timed_batch(self.inner.put_many_now, checkpoints)

    def call_now(self, action: Callable[[], T]) -> tuple[bool, T | None]:
        return self.inner.call_now(action)  # ``action`` calls this store, which times it


def timed(inner: StreamCheckpointStore) -> TimedStore:
    """``inner`` behind a `TimedStore`, committed on the stream's thread if ``inner`` is."""
    if not takes_deferred(inner):
        raise TypeError(f"{type(inner).__name__} does not take captures unbuilt")
    if "put_many_now" in type(inner).__dict__:
        return _TimedNow(inner)
    return TimedStore(inner)
