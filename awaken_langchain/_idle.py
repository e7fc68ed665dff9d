"""Idle timeouts for a stream: a chunk must arrive within ``timeout`` seconds.

The sync path reads the inner model's iterator in a worker thread so that a
wait can time out (`Pump`); the async path keeps one timer per stream and
cancels the waiting task when a wait lasts too long (`with_idle_timeout`).

A sync stream that turns out to read an HTTP/1 response (what the OpenAI and
Anthropic SDKs hold) is read by the worker only until its first chunk: from
then on the caller's thread reads it itself, and one watchdog thread for the
whole process shuts down the socket of a read that lasts too long. Handing
every chunk from one thread to another cost about 30 us of CPU per chunk
(two thread wake-ups) on a real SDK stream; a direct read costs a clock read.

Either way a stream the wrapper leaves is closed at once, so the provider stops
generating and no reader lingers. The async path cancels the read and closes
the iterator. A sync generator blocked in a read on another thread cannot be
closed from outside (``ValueError: generator already executing``), so the
socket of the HTTP response the generator holds is shut down: the blocked read
fails at once and the generator is closed on the thread that was reading it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import heapq
import itertools
import os
import queue
import socket
import threading
import time
import types
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any

from langchain_core.outputs import ChatGenerationChunk

from awaken_langchain.errors import StreamStalledError

__all__ = ["Pump", "with_idle_timeout"]


_PUMPING, _PARKED = "awaken-stream-pump", "awaken-stream-pump (idle)"


class _Workers:
    """Daemon threads that run pumps, each kept a while for the next one.

    Starting a thread costs about as much as a short turn's whole overhead; a
    sync stream with the idle timeout needs one per attempt. A worker left
    without work for ``idle`` seconds ends. A worker still blocked in a read
    that could not be interrupted is simply not free: the next pump gets
    another. Workers are daemons, so a blocked one never holds up the
    interpreter's exit.
    """

    def __init__(self, idle: float = 30.0) -> None:
        self._idle = idle
        self._lock = threading.Lock()
        self._parked: list[queue.SimpleQueue[Callable[[], object]]] = []

    def run(self, job: Callable[[], object]) -> None:
        """Run ``job`` on a parked worker, or on a new one."""
        with self._lock:
            inbox = self._parked.pop() if self._parked else None
        if inbox is not None:
            inbox.put(job)
            return
        inbox = queue.SimpleQueue()
        inbox.put(job)
        threading.Thread(target=self._work, args=(inbox,), name=_PUMPING, daemon=True).start()

    def _work(self, inbox: queue.SimpleQueue[Callable[[], object]]) -> None:
        me = threading.current_thread()
        job: Callable[[], object] | None = inbox.get()
        while job is not None:
            me.name = _PUMPING
            with contextlib.suppress(BaseException):  # a pump hands its errors to its reader
                job()
            job = None  # a parked worker keeps nothing of the stream it pumped
            me.name = _PARKED
            with self._lock:
                self._parked.append(inbox)
            try:
                job = inbox.get(timeout=self._idle)
            except queue.Empty:
                with self._lock:
                    if inbox in self._parked:  # nobody took this worker meanwhile: end
                        self._parked.remove(inbox)
                        return
                job = inbox.get()  # taken just as the wait ended: its job is on the way

    def forget(self) -> None:
        """Drop the parked workers (after ``fork``: their threads are not in the child)."""
        self._parked = []
        self._lock = threading.Lock()


_WORKERS = _Workers()
os.register_at_fork(after_in_child=_WORKERS.forget)


class Pump:
    """Reads a blocking iterator so that each wait for an item can time out.

    A worker thread reads the first item. When the source then holds an HTTP/1
    response whose socket can be shut down (`_sockets`), the worker hands the
    source over and the caller's thread reads the rest itself, watched by
    `_WATCHDOG`; otherwise the worker reads every item.

    When the consumer leaves before the source ends (an idle timeout, an error,
    a caller that stops reading), the source is closed: by the caller's thread
    once handed over, else by the worker at its next item, a read blocked in
    the meantime being cut short by shutting down the socket of any HTTP
    response the source holds (`_interrupt`). A source without one (a plain
    blocking iterator) keeps its worker until its read returns.
    """

    _ITEM, _END, _ERROR, _YOURS = 0, 1, 2, 3

    def __init__(self, source: Iterator[ChatGenerationChunk], timeout: float) -> None:
        self._source = source
        self._timeout = timeout
        self._queue: queue.SimpleQueue[tuple[int, Any]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._stopped = False  # the consumer left
        self._handed = False  # the consumer reads the source from now on
        self._ended = threading.Event()
        context = contextvars.copy_context()
        _WORKERS.run(functools.partial(context.run, self._run))

    def _run(self) -> None:
        put = self._queue.put
        source = self._source
        try:
            first = True
            for item in source:
                if self._stopped:
                    break
                put((self._ITEM, item))
                if first:
                    first = False
                    if _sockets(source):  # the caller's thread can read on by itself
                        with self._lock:
                            self._handed = not self._stopped
                        if self._handed:
                            put((self._YOURS, None))
                            return
            put((self._END, None))
        except BaseException as exc:
            put((self._ERROR, exc))
        finally:
            try:
                if not self._handed:
                    _close(source)
            finally:
                self._ended.set()

    def __iter__(self) -> Iterator[ChatGenerationChunk]:
        received = 0
        get = self._queue.get
        try:
            while True:
                try:
                    kind, item = get(timeout=self._timeout)
                except queue.Empty:
                    raise StreamStalledError(self._timeout, received) from None
                if kind == self._ITEM:
                    received += 1
                    yield item
                elif kind == self._END:
                    return
                elif kind == self._YOURS:
                    yield from self._direct(received)
                    return
                else:
                    raise item
        finally:
            with self._lock:
                self._stopped = True
                handed = self._handed
            if handed:
                _close(self._source)
            elif not self._ended.is_set():
                _interrupt(self._source)

    def _direct(self, received: int) -> Iterator[ChatGenerationChunk]:
        """Read the rest on this thread; the watchdog ends a read that lasts too long."""
        source, timeout = self._source, self._timeout
        read = _Read(source, timeout)
        clock = time.monotonic
        _WATCHDOG.watch(read, clock() + timeout)
        try:
            while True:
                read.since = clock()
                try:
                    item = next(source)
                except StopIteration:
                    if read.expired:  # a source that ends quietly when its socket is shut
                        raise StreamStalledError(timeout, received) from None
                    return
                except Exception:
                    if read.expired:
                        raise StreamStalledError(timeout, received) from None
                    raise
                finally:
                    read.since = None
                if read.expired:  # a read that came back as its socket was shut down
                    raise StreamStalledError(timeout, received)
                received += 1
                yield item
        finally:
            read.done = True
            read.source = None  # the watchdog keeps the entry until its check, not the stream


class _Read:
    """What the watchdog knows of one stream read on its caller's thread."""

    __slots__ = ("done", "expired", "since", "source", "timeout")

    def __init__(self, source: object, timeout: float) -> None:
        self.source: object = source
        self.timeout = timeout
        self.since: float | None = None  # when the read under way began
        self.expired = False
        self.done = False


class _Watchdog:
    """One daemon thread that interrupts every directly read stream whose read lasts too long.

    Each stream is checked at most once per ``timeout`` while it is idle and
    once more when a read could first have lasted that long; a read only
    records when it began. The thread ends when no stream is watched.
    """

    def __init__(self, idle: float = 30.0) -> None:
        self._idle = idle
        self._cond = threading.Condition()
        self._due: list[tuple[float, int, _Read]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def watch(self, read: _Read, deadline: float) -> None:
        """Check ``read`` at ``deadline`` (and as often as needed after)."""
        with self._cond:
            heapq.heappush(self._due, (deadline, next(self._order), read))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="awaken-stream-watchdog", daemon=True
                )
                self._thread.start()
            elif self._due[0][2] is read:
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if not self._due:
                        if not self._cond.wait(self._idle) and not self._due:
                            self._thread = None
                            return
                        continue
                    now = time.monotonic()
                    deadline, _, read = self._due[0]
                    if deadline <= now:
                        heapq.heappop(self._due)
                        break
                    self._cond.wait(deadline - now)
            if read.done:
                continue
            since = read.since
            if since is not None and now - since >= read.timeout:
                read.expired = True
                with contextlib.suppress(Exception):  # never let one stream end the watchdog
                    _interrupt(read.source)
                continue
            with self._cond:
                next_check = (now if since is None else since) + read.timeout
                heapq.heappush(self._due, (next_check, next(self._order), read))

    def forget(self) -> None:
        """Drop every watch (after ``fork``: the thread is not in the child)."""
        self._due = []
        self._cond = threading.Condition()
        self._thread = None


_WATCHDOG = _Watchdog()
os.register_at_fork(after_in_child=_WATCHDOG.forget)


def _close(source: object) -> None:
    """Close a sync source that can be closed (a generator: its ``finally`` runs now)."""
    close = getattr(source, "close", None)
    if close is not None:
        close()


_HOPS = 8
"""How deep `_responses` follows generators delegating to generators."""


def _responses(source: object) -> list[Any]:
    """HTTP responses (httpx) that a generator, or generators it delegates to, holds open.

    LangChain's provider models stream from a generator that keeps the SDK's
    stream object (``openai.Stream``, ``anthropic.Stream``: ``.response`` is the
    httpx response) or the httpx response itself in a local variable.
    """
    found: list[Any] = []
    seen: set[int] = set()
    pending: list[tuple[object, int]] = [(source, 0)]
    while pending:
        value, depth = pending.pop()
        if id(value) in seen or depth > _HOPS:
            continue
        seen.add(id(value))
        if isinstance(value, types.GeneratorType):
            frame = value.gi_frame
            if frame is not None:
                pending += [(local, depth + 1) for local in list(frame.f_locals.values())]
            if value.gi_yieldfrom is not None:
                pending.append((value.gi_yieldfrom, depth + 1))
            continue
        for candidate in (value, getattr(value, "response", None)):
            extensions = getattr(candidate, "extensions", None)
            if (
                isinstance(extensions, Mapping)
                and "network_stream" in extensions
                and hasattr(candidate, "is_closed")
                and hasattr(candidate, "http_version")
            ):
                found.append(candidate)
                break
    return found


def _sockets(source: object) -> list[socket.socket]:
    """The sockets under the open HTTP/1 responses ``source`` holds, which can be shut down.

    Only a response still being read owns its connection: a closed one may
    have handed it back to the pool, and an HTTP/2 connection carries other
    streams too.
    """
    found = []
    for response in _responses(source):
        if response.http_version not in ("HTTP/1.1", "HTTP/1.0") or response.is_closed:
            continue
        stream = response.extensions.get("network_stream")
        get_extra_info = getattr(stream, "get_extra_info", None)
        if get_extra_info is None:
            continue
        try:
            sock = get_extra_info("socket")
        except Exception:  # an unfamiliar transport: nothing we can shut down
            continue
        if isinstance(sock, socket.socket):
            found.append(sock)
    return found


def _interrupt(source: object) -> None:
    """Make a read blocked in ``source`` on another thread fail now.

    Shuts down (not closes) the socket under each open HTTP/1 response the
    source holds: shutdown wakes a ``recv`` blocked in another thread, where
    closing the descriptor does not (Linux). The reader's own cleanup then
    closes the response and releases the connection; this thread only reads
    the response's state.
    """
    for sock in _sockets(source):
        # The base class's shutdown: a TLS socket's own would also drop its SSL
        # object, which the reading thread is still using. OSError: already closed.
        with contextlib.suppress(OSError):
            socket.socket.shutdown(sock, socket.SHUT_RDWR)


def _task_lookup() -> Callable[[asyncio.AbstractEventLoop], asyncio.Task[Any] | None]:
    """`asyncio.current_task` for a given loop, read the cheapest way this Python allows.

    Where ``current_task`` is a Python function returning ``_current_tasks.get(loop)``
    (3.11), that dictionary's own ``get`` gives the same answer for about 900 fewer
    instructions per call, and the idle watch makes that call for every chunk.
    """
    current = asyncio.current_task
    code = getattr(current, "__code__", None)
    tasks = getattr(current, "__globals__", {}).get("_current_tasks")
    if code is not None and "_current_tasks" in code.co_names and isinstance(tasks, dict):
        return tasks.get
    return current


_TASK_OF = _task_lookup()


def _clock(loop: asyncio.AbstractEventLoop) -> Callable[[], float]:
    """``loop.time``, or `time.monotonic` itself where ``loop.time`` only calls it."""
    if type(loop).time is asyncio.BaseEventLoop.time:
        return time.monotonic
    return loop.time


class _IdleWatch:
    """One timer for a whole stream, cancelling the task whose wait for a chunk ran too long.

    A timer per wait (``asyncio.timeout`` around each read) costs about as much
    as the chunk itself. Here each wait only records when it began and which
    task waits (in `_watched`, the one reader, which sets ``_since`` and
    ``_task``); the single timer, armed when the stream starts, cancels the
    waiting task when it fires and the current wait has lasted ``timeout``
    seconds, and otherwise re-arms itself: for that wait's deadline, or, when
    no read is waiting, for ``timeout`` seconds later (so a read never checks
    the timer). Time the caller spends between reads never counts.
    """

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.expired = False
        self._loop = asyncio.get_running_loop()
        self._task: asyncio.Task[Any] | None = None
        self._since: float | None = None
        self._handle: asyncio.TimerHandle | None = None

    def stalled(self) -> bool:
        """After a cancellation: whether it was this watch's, and the only one pending."""
        return self.expired and self._task is not None and self._task.uncancel() == 0

    def close(self) -> None:
        """Stop the timer."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _check(self) -> None:
        loop, since = self._loop, self._since
        if since is None or self._task is None:  # not waiting: look again a timeout from now
            self._handle = loop.call_at(loop.time() + self.timeout, self._check)
            return
        deadline = since + self.timeout
        if loop.time() >= deadline:
            self._handle = None
            self.expired = True
            self._task.cancel()
        else:
            self._handle = loop.call_at(deadline, self._check)


def with_idle_timeout(
    source: AsyncIterator[ChatGenerationChunk], idle_timeout: float | None
) -> AsyncIterator[ChatGenerationChunk]:
    """Yield from ``source``, raising `StreamStalledError` after ``idle_timeout`` idle seconds."""
    if idle_timeout is None:
        return _closing(source.__aiter__())
    return _watched(source.__aiter__(), idle_timeout)


async def _closing(
    iterator: AsyncIterator[ChatGenerationChunk],
) -> AsyncIterator[ChatGenerationChunk]:
    try:
        async for item in iterator:
            yield item
    finally:
        close = getattr(iterator, "aclose", None)
        if close is not None:
            await close()


async def _watched(
    iterator: AsyncIterator[ChatGenerationChunk], idle_timeout: float
) -> AsyncIterator[ChatGenerationChunk]:
    # the watch's state is set here, not through methods: this loop runs once per chunk
    received = 0
    watch = _IdleWatch(idle_timeout)
    loop, read, task_of, clock = watch._loop, iterator.__anext__, _TASK_OF, _clock(watch._loop)
    watch._handle = loop.call_at(loop.time() + idle_timeout, watch._check)
    try:
        while True:
            watch._task = task_of(loop)
            watch._since = clock()
            try:
                item = await read()
            except StopAsyncIteration:
                return
            except asyncio.CancelledError:
                if watch.stalled():
                    raise StreamStalledError(idle_timeout, received) from None
                raise
            finally:
                watch._since = None
            received += 1
            yield item
    finally:
        watch.close()
        close = getattr(iterator, "aclose", None)
        if close is not None:
            await close()
