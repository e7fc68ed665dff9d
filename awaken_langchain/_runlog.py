"""A run's event log in its checkpoint store, and the producer side that writes it.

Every turn a `RecoveringChatModel` with a ``store`` runs gets a `Tap`: the
stream's thread only appends what it yields (chunks, recovery reports) to the
tap's list. Each store has its own `Publisher`, a daemon thread that runs while
the store has turns in flight (a store that hangs delays only its own runs'
events): it turns what the taps hold into events and appends them to the
run's log in the store:

- while nobody follows the run, at most every `QUIET_EVERY` seconds (the
  checkpoint cadence: a reader who attaches later replays the log);
- while someone follows it, every `LIVE_EVERY` seconds;
- the final event (``completed``, ``failed`` or ``stopped``) is written by the
  turn itself before it returns.

The publisher also asks the store, in one round for all the store's runs in
flight, which are followed and which were asked to stop: every `CHECK_EVERY`
seconds while one is followed; otherwise it keeps no timer and asks when a
turn's checkpoint falls due (`Tap.due`, every `QUIET_EVERY` at most), so a
turn nobody follows costs no wake-ups of its own. On the in-process store's log
the turn's own thread makes that quiet round itself and wakes the publisher
only once the run is followed. A stop reaches the turn
within that interval plus the wait for the provider's next chunk. When the
store's last run ends the publisher releases its connection (Redis).

Events are JSON objects ``{"type": ..., "data": {...}}``; a run's n-th event has
offset ``n`` (1-based). The log backends:

- in-process store: a list per run; an append wakes the run's followers;
- file and DiskCache stores: an ``events`` directory inside the store's
  directory, one JSON-lines file per run (appended with ``O_APPEND``), a
  ``.stop`` file for a stop request and a ``.watch`` file whose modification
  time a process with followers refreshes; one thread per process reads a
  followed run's file every ``poll_interval`` for all its followers there;
- Redis: a list ``<prefix>:{<run_id>}:events``, a channel of the same name on
  which each append publishes the new length and the new events, one per
  line (one subscription per process wakes its followers, no polling), a
  ``...:stop`` key; a run is followed while its channel has subscribers;
- PostgreSQL: rows in ``<table>_events``, the run's length, stop request and
  follower's mark in ``<table>_runlogs``; each append sends a ``NOTIFY`` on the
  store's channel, which one connection per process ``LISTEN``s on for its
  followers.

A follower waits on its own wake-up, which a thread or a coroutine can wait
on: the async follower (and the HTTP route) hold no thread while they wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import threading
import time
import weakref
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessageChunk, message_to_dict
from langchain_core.outputs import ChatGenerationChunk

from awaken_langchain.checkpoint import StreamCheckpointStore
from awaken_langchain.errors import StreamCheckpointError
from awaken_langchain.stores._base import make_private_directory, open_no_follow, run_id_bytes

logger = logging.getLogger(__name__)

LIVE_EVERY = 0.005
"""Seconds between the publisher's appends of a followed run's new events."""
QUIET_EVERY = 0.25
"""Seconds between appends of a run nobody follows (the checkpoint cadence)."""
CHECK_EVERY = 0.1
"""Seconds between the publisher's questions to the store (followed? stop requested?)
while one of its runs is followed; otherwise it asks when a checkpoint wakes it."""
QUIET_WAIT = 1.0
"""Seconds the publisher sleeps, at most, while nobody follows its store's runs: a turn's
checkpoints (every `QUIET_EVERY` at most) wake it sooner."""
WATCH_FOR = 2.0
"""Seconds a follower's mark lasts (local stores); followers renew it every `RENEW_EVERY`."""
RENEW_EVERY = 0.5
"""Seconds between a local follower's renewals of its mark."""
DEFAULT_POLL_INTERVAL = 0.01
"""Seconds between a process's reads of a followed local run's log (file and DiskCache stores)."""
END_DEADLINE = 0.5
"""Seconds a turn waits, at most, for its final event to be written."""
KEEP_FOR = 3600.0
"""Seconds a finished run's log stays readable (Redis, in-process); local log files
untouched this long are removed."""
PUBLISHED_KEPT = 1024
"""Latest events of a followed run that its process keeps for its followers (Redis, local)."""
IDLE_EXIT = 5.0
"""Seconds a store's idle publisher thread waits for a new run before it exits."""
SWEEP_EVERY = 60.0
"""Seconds between a process's sweeps of old log files (local stores), made as a run ends."""

FINAL_TYPES = frozenset({"completed", "failed", "stopped"})
"""The event types that end a run's log."""


class RunLog(ABC):
    """Where a store keeps its runs' event logs (one backend per kind of store)."""

    poll_interval: float | None = None
    """Seconds between a follower's reads, or ``None`` when the log wakes followers."""
    quick: bool = False
    """Appends only update this process's memory: a turn writes its final event itself."""

    @property
    def publisher(self) -> Publisher:
        """The thread that writes this log for the turns of this process."""
        found: Publisher | None = self.__dict__.get("_publisher")
        if found is None:
            with _LOGS_LOCK:
                found = self.__dict__.get("_publisher")
                if found is None:
                    found = self.__dict__["_publisher"] = Publisher(self)
        return found

    @abstractmethod
    def append(self, run_id: str, events: Sequence[bytes]) -> int:
        """Append encoded events; return the log's new length."""

    @abstractmethod
    def read(self, run_id: str, after: int) -> list[bytes] | None:
        """The encoded events past offset ``after``, or ``None`` if the run has no log."""

    @abstractmethod
    def request_stop(self, run_id: str) -> None:
        """Mark the run: its producer should stop."""

    @abstractmethod
    def stop_requested(self, run_id: str) -> bool:
        """Whether someone asked the run to stop."""

    @abstractmethod
    def followed(self, run_id: str) -> bool:
        """Whether a follower is attached to the run now."""

    def tail(self, run_id: str) -> Tail:
        """What a follower waits on between reads."""
        return _PollingTail(self, run_id)

    def check(self, run_ids: Sequence[str]) -> list[tuple[bool, bool]]:
        """For each run: (followed now, stop requested); one round trip where the store allows."""
        return [(self.followed(run), self.stop_requested(run)) for run in run_ids]

    def release(self) -> None:  # noqa: B027 - optional hook
        """The store's publisher has no run left: let go of what it holds (a connection)."""

    def finished(self, run_id: str) -> None:  # noqa: B027 - optional hook
        """The run's final event is written (a backend can start its expiry)."""

    def append_final(self, run_id: str, events: Sequence[bytes]) -> None:
        """Append the run's last events (the final one last), then mark it `finished`.

        A backend that can do both in one round trip overrides it: the turn
        waits for this before it returns.
        """
        try:
            self.append(run_id, events)
        finally:
            with contextlib.suppress(Exception):
                self.finished(run_id)

    def left(self, run_id: str) -> None:  # noqa: B027 - optional hook
        """A turn fenced out of the run ended: its log ends as a finished run's would.

        The run's new owner, finishing it later, starts the log's time again.
        """


class Tail:
    """A follower's wait for the next events of a run."""

    def wait(self, timeout: float) -> None:
        """Return when new events may be there, or after ``timeout`` seconds."""
        time.sleep(timeout)

    async def wait_async(self, seconds: float) -> None:
        """`wait` for a coroutine: it holds no thread while it waits."""
        await asyncio.sleep(seconds)

    def close(self) -> None:
        """Release what the tail holds (from any thread: a waiter returns at once)."""
        return None


class _Wakeup:
    """A flag set from any thread, waited on by one thread or one coroutine.

    A set that comes while nobody waits is kept: the next wait returns at once
    (a follower reads the log again, and may find nothing new). Once closed,
    every wait returns at once.
    """

    __slots__ = ("_closed", "_cond", "_flag", "_waiter")

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._flag = False
        self._closed = False
        self._waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None

    def close(self) -> None:
        self._closed = True
        self.set()

    def set(self) -> None:
        with self._cond:
            self._flag = True
            self._cond.notify_all()
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            loop, future = waiter
            with contextlib.suppress(RuntimeError):  # its loop is closed: nobody waits
                loop.call_soon_threadsafe(_resolve, future)

    def wait(self, timeout: float) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._flag or self._closed, timeout)
            self._flag = False

    async def wait_async(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._cond:
            if self._flag or self._closed:
                self._flag = False
                return
            self._waiter = (loop, future)
        try:
            await asyncio.wait((future,), timeout=seconds)
        finally:
            with self._cond:
                self._flag = False
                if self._waiter is not None and self._waiter[1] is future:
                    self._waiter = None


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class _PollingTail(Tail):
    def __init__(self, log: RunLog, run_id: str) -> None:
        self._log = log
        self._run_id = run_id
        self._renewed = 0.0
        self._closed = _Wakeup()

    def _renew_due(self) -> bool:
        now = time.monotonic()
        if now - self._renewed >= RENEW_EVERY and getattr(self._log, "watch", None) is not None:
            self._renewed = now
            return True
        return False

    def wait(self, timeout: float) -> None:
        if self._renew_due():
            self._log.watch(self._run_id)  # type: ignore[attr-defined]
        self._closed.wait(min(timeout, self._log.poll_interval or timeout))

    async def wait_async(self, seconds: float) -> None:
        if self._renew_due():  # a file's mtime: a short hop to a thread
            await asyncio.to_thread(self._log.watch, self._run_id)  # type: ignore[attr-defined]
        await self._closed.wait_async(min(seconds, self._log.poll_interval or seconds))

    def close(self) -> None:
        self._closed.close()


# -- in-process ---------------------------------------------------------------------


class MemoryRunLog(RunLog):
    """Logs of an in-process store: an append wakes its run's followers (same process)."""

    quick = True

    def __init__(self, clock: Any = time.time) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._logs: dict[str, list[bytes]] = {}
        self._stops: set[str] = set()
        self._tails: dict[str, set[_Wakeup]] = {}
        """Per run, the wake-ups of its followers in this process."""
        self._ended: dict[str, float] = {}
        """Finished runs, with when they finished (monotonic), oldest first."""

    def append(self, run_id: str, events: Sequence[bytes]) -> int:
        with self._lock:
            log = self._logs.setdefault(run_id, [])
            log.extend(events)
            for tail in self._tails.get(run_id, ()):
                tail.set()
            return len(log)

    def read(self, run_id: str, after: int) -> list[bytes] | None:
        with self._lock:
            log = self._logs.get(run_id)
            return None if log is None else log[after:]

    def request_stop(self, run_id: str) -> None:
        with self._lock:
            self._stops.add(run_id)

    def stop_requested(self, run_id: str) -> bool:
        return run_id in self._stops

    def followed(self, run_id: str) -> bool:
        return bool(self._tails.get(run_id))

    def tail(self, run_id: str) -> Tail:
        return _MemoryTail(self, run_id)

    def collect(self, keep_for: float) -> None:
        """Remove the logs of runs that finished more than ``keep_for`` ago."""
        now = float(self.clock())
        with self._lock:
            for run in [run for run, at in self._ended.items() if now - at > keep_for]:
                del self._ended[run]
                self._logs.pop(run, None)

    def left(self, run_id: str) -> None:
        with self._lock:
            self._ended.setdefault(run_id, float(self.clock()))

    def finished(self, run_id: str) -> None:
        now = float(self.clock())
        with self._lock:
            self._ended.pop(run_id, None)  # ends after the newest
            self._stops.discard(run_id)
            self._ended[run_id] = now
            expired = [run for run, at in self._ended.items() if now - at > KEEP_FOR]
            for run in expired:  # finished logs end, as in the durable stores
                del self._ended[run]
                self._logs.pop(run, None)


class _MemoryTail(Tail):
    def __init__(self, log: MemoryRunLog, run_id: str) -> None:
        self._log = log
        self._run_id = run_id
        self._wakeup = _Wakeup()
        with log._lock:
            log._tails.setdefault(run_id, set()).add(self._wakeup)

    def wait(self, timeout: float) -> None:
        self._wakeup.wait(timeout)

    async def wait_async(self, seconds: float) -> None:
        await self._wakeup.wait_async(seconds)

    def close(self) -> None:
        log = self._log
        with log._lock:
            tails = log._tails.get(self._run_id)
            if tails is not None:
                tails.discard(self._wakeup)
                if not tails:
                    del log._tails[self._run_id]
        self._wakeup.close()


# -- a directory (file and DiskCache stores) ----------------------------------------


class DirectoryRunLog(RunLog):
    """Logs in ``<store directory>/events``: one JSON-lines file per run.

    Args:
        directory: The store's directory.
        poll_interval: Seconds between the process's reads of a followed run's file.
    """

    def __init__(
        self,
        directory: Path,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        clock: Any = time.time,
    ) -> None:
        self.clock = clock
        self.directory = directory / "events"
        self.poll_interval = poll_interval
        self._made = False
        self._cursors: dict[str, tuple[int, int]] = {}
        """Per run: the last (offset, byte position) read, so a follower reads only what is new."""
        self._lock = threading.Lock()
        self._swept = 0.0
        self._watcher: _FileWatcher | None = None
        self._stems: dict[str, str] = {}
        """Per run: its files' path without the suffix (a publisher writes them at every wake)."""

    def _path(self, run_id: str, suffix: str) -> Path:
        return Path(self._file(run_id, suffix))

    def _file(self, run_id: str, suffix: str) -> str:
        """The path of one of the run's files, as a string (its stem hashed once per run)."""
        stem = self._stems.get(run_id)
        if stem is None:
            digest = hashlib.sha256(run_id_bytes(run_id)).hexdigest()
            stem = os.path.join(self.directory, digest)
            with self._lock:
                self._stems[run_id] = stem
                if len(self._stems) > 1024:
                    self._stems.pop(next(iter(self._stems)))
        return stem + suffix

    def _make(self) -> None:
        if not self._made:
            make_private_directory(self.directory)
            self._made = True

    def append(self, run_id: str, events: Sequence[bytes]) -> int:
        self._make()
        fd = open_no_follow(self._file(run_id, ".log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            os.write(fd, b"".join(event + b"\n" for event in events))
        finally:
            os.close(fd)
        return -1

    def tail(self, run_id: str) -> Tail:
        with self._lock:
            if self._watcher is None:
                self._watcher = _FileWatcher(self)
        return _WokenTail(self._watcher, run_id)  # woken by its process's `_FileWatcher`

    def read(self, run_id: str, after: int) -> list[bytes] | None:
        if self._watcher is not None:  # followers in this process: read once for them all
            known = self._watcher.kept(run_id, after)
            if known is not None:
                return known
        try:
            fd = open_no_follow(self._path(run_id, ".log"), os.O_RDONLY)
        except FileNotFoundError:
            return None
        except StreamCheckpointError as exc:
            if isinstance(exc.__cause__, FileNotFoundError):
                return None
            raise
        with self._lock:
            offset, position = self._cursors.get(run_id, (0, 0))
        if offset > after:
            offset, position = 0, 0
        try:
            with os.fdopen(fd, "rb") as file:
                file.seek(position)
                data = file.read()
        except OSError as exc:
            raise StreamCheckpointError(f"could not read the event log of {run_id!r}") from exc
        end = data.rfind(b"\n") + 1  # a line being written is read next time
        lines = data[:end].split(b"\n")[:-1]
        with self._lock:
            self._cursors[run_id] = (offset + len(lines), position + end)
            if len(self._cursors) > 1024:
                self._cursors.pop(next(iter(self._cursors)))
        return lines[after - offset :]

    def request_stop(self, run_id: str) -> None:
        self._make()
        os.close(open_no_follow(self._path(run_id, ".stop"), os.O_WRONLY | os.O_CREAT))

    def collect(self, keep_for: float) -> None:
        """Remove the logs of runs that finished more than ``keep_for`` ago (store clock)."""
        now = float(self.clock())
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return
        for name in names:
            if not name.endswith(".end"):
                continue
            path = self.directory / name
            try:
                ended = float(path.read_text())
            except (OSError, ValueError):
                ended = now - keep_for - 1  # unreadable: ended long ago
            if now - ended <= keep_for:
                continue
            stem = name[: -len(".end")]
            for suffix in (".log", ".watch", ".stop", ".end"):
                with contextlib.suppress(FileNotFoundError):
                    (self.directory / f"{stem}{suffix}").unlink()
        with contextlib.suppress(OSError):  # only when empty
            self.directory.rmdir()
            self._made = False

    def stop_requested(self, run_id: str) -> bool:
        return os.path.exists(self._file(run_id, ".stop"))

    def watch(self, run_id: str) -> None:
        """Mark the run as followed for `WATCH_FOR` seconds."""
        self._make()
        path = self._path(run_id, ".watch")
        os.close(open_no_follow(path, os.O_WRONLY | os.O_CREAT))
        os.utime(path)

    def followed(self, run_id: str) -> bool:
        try:
            return time.time() - os.stat(self._file(run_id, ".watch")).st_mtime < WATCH_FOR
        except FileNotFoundError:
            return False

    def finished(self, run_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(run_id, ".stop").unlink()
        end = self._path(run_id, ".end")
        fd = open_no_follow(end, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            os.write(fd, repr(float(self.clock())).encode())
        finally:
            os.close(fd)
        if time.time() - self._swept >= SWEEP_EVERY:
            self._swept = time.time()
            self.collect(KEEP_FOR)


class _Reader(Protocol):
    """A process's one reader of followed runs, waking their followers' wake-ups."""

    def add(self, key: Any, wakeup: _Wakeup) -> None: ...

    def remove(self, key: Any, wakeup: _Wakeup) -> None: ...


class _WokenTail(Tail):
    """A follower woken by its process's reader of the run (``key`` names the run there)."""

    def __init__(self, reader: _Reader, key: Any) -> None:
        self._reader = reader
        self._key = key
        self._wakeup = _Wakeup()
        reader.add(key, self._wakeup)

    def wait(self, timeout: float) -> None:
        self._wakeup.wait(timeout)

    async def wait_async(self, seconds: float) -> None:
        await self._wakeup.wait_async(seconds)

    def close(self) -> None:
        if not self._wakeup._closed:
            self._wakeup.close()  # a waiter returns at once
            self._reader.remove(self._key, self._wakeup)


class _FileWatcher:
    """The thread that reads a process's followed local runs, for all their followers.

    Every ``poll_interval`` it reads what is new in each followed run's file,
    keeps the run's latest `PUBLISHED_KEPT` events, and wakes the run's
    followers if there were any; followers read them from here. It renews the
    runs' follow marks every `RENEW_EVERY`. One reader per run and process,
    instead of one per follower: a hundred followers polling every 20 ms were
    5000 file reads a second, and each a wake-up of a thread. The thread runs
    while the process has followers.
    """

    def __init__(self, log: DirectoryRunLog) -> None:
        self._log = log
        self._lock = threading.Lock()
        self._waiting: dict[str, set[_Wakeup]] = {}
        self._kept: dict[str, tuple[int, int, list[bytes]]] = {}
        """Per followed run: (offset of the last line read, byte position after it, its lines)."""
        self._renewed: dict[str, float] = {}
        self._thread: threading.Thread | None = None

    def add(self, run_id: str, wakeup: _Wakeup) -> None:
        with self._lock:
            self._waiting.setdefault(run_id, set()).add(wakeup)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="awaken-run-followers", daemon=True
                )
                self._thread.start()
        self._renew(run_id)  # followed from now on: the producer publishes live

    def remove(self, run_id: str, wakeup: _Wakeup) -> None:
        with self._lock:
            waiting = self._waiting.get(run_id)
            if waiting is None:
                return
            waiting.discard(wakeup)
            if not waiting:
                del self._waiting[run_id]
                self._kept.pop(run_id, None)
                self._renewed.pop(run_id, None)

    def kept(self, run_id: str, after: int) -> list[bytes] | None:
        """The lines past offset ``after``, or ``None`` if not all are kept."""
        with self._lock:
            found = self._kept.get(run_id)
            if found is None:
                return None
            end, _, lines = found
            start = end - len(lines)
            return lines[after - start :] if start <= after <= end else None

    def _renew(self, run_id: str) -> None:
        now = time.monotonic()
        if now - self._renewed.get(run_id, 0.0) >= RENEW_EVERY:
            self._renewed[run_id] = now
            try:
                self._log.watch(run_id)
            except Exception as exc:  # the store's directory went away: followers see it
                logger.debug("could not mark run %r as followed: %s", run_id, exc)

    def _loop(self) -> None:
        while True:
            with self._lock:
                runs = list(self._waiting)
                if not runs:
                    self._thread = None
                    return
            for run_id in runs:
                self._renew(run_id)
                try:
                    grew = self._read(run_id)
                except Exception as exc:  # followers read the file themselves meanwhile
                    logger.debug("could not read the event log of %r: %s", run_id, exc)
                    grew = True
                if grew:
                    with self._lock:
                        for wakeup in self._waiting.get(run_id, ()):
                            wakeup.set()
            time.sleep(self._log.poll_interval or DEFAULT_POLL_INTERVAL)

    def _read(self, run_id: str) -> bool:
        """Read what is new in the run's file; whether there was anything."""
        with self._lock:
            found = self._kept.get(run_id)
        if found is None:  # start where this process last read the file
            with self._log._lock:
                end, position = self._log._cursors.get(run_id, (0, 0))
            found = (end, position, [])
        end, position, lines = found
        try:
            fd = open_no_follow(self._log._path(run_id, ".log"), os.O_RDONLY)
        except FileNotFoundError:
            return False
        with os.fdopen(fd, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            if size == position:
                return False
            if size < position:  # a new file under the run's name: start again
                end, position, lines = 0, 0, []
            file.seek(position)
            data = file.read()
        cut = data.rfind(b"\n") + 1  # a line being written is read next time
        new = data[:cut].split(b"\n")[:-1]
        lines = lines + new
        del lines[: max(0, len(lines) - PUBLISHED_KEPT)]
        with self._lock:
            if run_id in self._waiting:
                self._kept[run_id] = (end + len(new), position + cut, lines)
        return bool(new)


# -- Redis ----------------------------------------------------------------------------

_APPEND = """
local length = redis.call('RPUSH', KEYS[1], unpack(ARGV))
redis.call('PUBLISH', KEYS[1], length .. '\\n' .. table.concat(ARGV, '\\n'))
return length
"""
"""Append a run's events and publish them, after the log's new length, one per line."""


class RedisRunLog(RunLog):
    """Logs in Redis lists; followers block on the run's channel (no polling)."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self._channels: _Channels | None = None
        self._script: Any = None
        self._own: Any = None
        """The publisher's client: its own connection, closed when the store's runs end."""

    def _key(self, run_id: str, suffix: bytes) -> bytes:
        return bytes(self._store._prefix_bytes + b":{" + run_id_bytes(run_id) + b"}:" + suffix)

    @property
    def _redis(self) -> Any:
        return self._store._client().client

    @property
    def _publishing(self) -> Any:
        """The publisher thread's client (the only thread that writes the logs of a Redis store)."""
        if self._own is None:
            shared = self._redis
            pool = getattr(shared, "connection_pool", None)
            if pool is None or not hasattr(pool, "connection_kwargs"):  # a cluster client
                return shared
            own_pool = type(pool)(connection_class=pool.connection_class, **pool.connection_kwargs)
            self._own = type(shared)(connection_pool=own_pool)
            self._script = self._own.register_script(_APPEND)
        return self._own

    def release(self) -> None:
        own, self._own = self._own, None
        if own is not None:
            own.connection_pool.disconnect()
            self._script = None

    def append(self, run_id: str, events: Sequence[bytes]) -> int:
        client = self._publishing
        if self._script is None:
            self._script = client.register_script(_APPEND)
        return int(self._script(keys=[self._key(run_id, b"events")], args=list(events)))

    def check(self, run_ids: Sequence[str]) -> list[tuple[bool, bool]]:
        pipe = self._publishing.pipeline(transaction=False)
        for run_id in run_ids:
            pipe.pubsub_numsub(self._key(run_id, b"events"))
            pipe.exists(self._key(run_id, b"stop"))
        answers = pipe.execute()
        return [
            (bool(counts and counts[0][1]), bool(stop))
            for counts, stop in zip(answers[::2], answers[1::2], strict=True)
        ]

    def read(self, run_id: str, after: int) -> list[bytes] | None:
        if self._channels is not None:  # followers in this process got them published
            known = self._channels.published(self._key(run_id, b"events"), after)
            if known is not None:
                return known
        found = self._redis.lrange(self._key(run_id, b"events"), after, -1)
        if not found and after == 0:
            return None
        if not found and not self._redis.exists(self._key(run_id, b"events")):
            return None
        return list(found)

    def request_stop(self, run_id: str) -> None:
        self._redis.set(self._key(run_id, b"stop"), b"1", ex=int(KEEP_FOR))

    def stop_requested(self, run_id: str) -> bool:
        return bool(self._redis.exists(self._key(run_id, b"stop")))

    def followed(self, run_id: str) -> bool:
        counts = self._redis.pubsub_numsub(self._key(run_id, b"events"))
        return bool(counts and counts[0][1])

    def tail(self, run_id: str) -> Tail:
        if self._channels is None:
            with _LOGS_LOCK:
                if self._channels is None:
                    self._channels = _Channels(self._redis)
        return _WokenTail(self._channels, self._key(run_id, b"events"))  # by `_Channels`

    def finished(self, run_id: str) -> None:
        pipe = self._publishing.pipeline(transaction=False)
        pipe.expire(self._key(run_id, b"events"), int(KEEP_FOR))
        pipe.delete(self._key(run_id, b"stop"))
        pipe.execute()


def _count_down(counts: dict[bytes, int], channel: bytes) -> None:
    """One of ``channel``'s requests was confirmed: count it off (the key goes at zero)."""
    left = counts.get(channel, 0) - 1
    if left > 0:
        counts[channel] = left
    else:
        counts.pop(channel, None)


class _Channels:
    """A process's subscriptions to its followed runs' channels, on one connection.

    One thread reads the connection and wakes the followers of the run whose
    channel got an append. An append publishes its events too: the thread
    keeps a run's latest `PUBLISHED_KEPT` events while the run has followers
    here, and they read new events from it instead of each asking Redis
    (one round trip per follower per append otherwise). A follower per
    connection and thread (the obvious way) costs a Redis connection and a
    thread blocked on it per follower; a process with many followers then
    spends its time switching between them. The thread starts with the first
    follower and, `IDLE_EXIT` seconds after the last one left, exits and
    releases the connection.
    """

    def __init__(self, client: Any) -> None:
        self._client = client
        self._lock = threading.Condition()
        self._waiting: dict[bytes, set[_Wakeup]] = {}
        self._sent: dict[bytes, int] = {}
        """Per channel, the SUBSCRIBE commands sent and not yet confirmed."""
        self._unsent: dict[bytes, int] = {}
        """Per channel, the UNSUBSCRIBE commands sent and not yet confirmed."""
        self._published: dict[bytes, tuple[int, list[bytes]]] = {}
        """Per channel, the latest events published since the subscription: (their end, them)."""
        self._pubsub: Any = None
        self._thread: threading.Thread | None = None

    def add(self, channel: bytes, wakeup: _Wakeup) -> None:
        """Subscribe ``wakeup`` to ``channel``; return once Redis confirmed the subscription."""
        with self._lock:
            if self._pubsub is None:
                self._pubsub = self._client.pubsub()
            waiting = self._waiting.setdefault(channel, set())
            waiting.add(wakeup)
            first = len(waiting) == 1
            if first:
                self._sent[channel] = self._sent.get(channel, 0) + 1
                self._pubsub.subscribe(channel)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="awaken-run-followers", daemon=True
                )
                self._thread.start()
            # no append is missed once the subscription is confirmed
            self._lock.wait_for(lambda: not self._sent.get(channel), 1.0)

    def remove(self, channel: bytes, wakeup: _Wakeup) -> None:
        with self._lock:
            waiting = self._waiting.get(channel)
            if waiting is None or wakeup not in waiting:
                return
            waiting.discard(wakeup)
            if not waiting:
                del self._waiting[channel]
                self._published.pop(channel, None)
                try:
                    self._pubsub.unsubscribe(channel)
                except Exception:  # a lost connection drops it anyway
                    return
                self._unsent[channel] = self._unsent.get(channel, 0) + 1
                # the run no longer counts as followed from here once Redis confirmed it
                # (a producer asking right after the close sees the change)
                self._lock.wait_for(
                    lambda: not self._unsent.get(channel) or channel in self._waiting, 1.0
                )

    def _loop(self) -> None:
        idle_since: float | None = None
        while True:
            with self._lock:
                pubsub = self._pubsub
                if self._waiting:
                    idle_since = None
                elif idle_since is None:
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since >= IDLE_EXIT:
                    self._thread = None
                    self._pubsub = None
                    self._sent.clear()
                    self._unsent.clear()
                    self._published.clear()
                    with contextlib.suppress(Exception):
                        pubsub.close()
                    return
            try:
                message = pubsub.get_message(timeout=1.0)
            except Exception as exc:  # the client reconnects and subscribes again
                logger.debug("reading the runs' channels failed: %s", exc)
                self._wake_all()
                time.sleep(0.05)
                continue
            if message is not None:
                self._handle(message)

    def published(self, channel: bytes, after: int) -> list[bytes] | None:
        """The events past offset ``after`` as published, or ``None`` if not all are kept."""
        with self._lock:
            kept = self._published.get(channel)
            if kept is None:
                return None
            end, events = kept
            start = end - len(events)
            return events[after - start :] if start <= after <= end else None

    def _keep(self, channel: bytes, data: bytes) -> None:
        head, newline, body = data.partition(b"\n")
        kept = self._published.get(channel)
        if not newline or not head.isdigit() or channel not in self._waiting:
            self._published.pop(channel, None)  # a wake-up only (an older producer)
            return
        end = int(head)
        events = body.split(b"\n")
        if kept is not None and kept[0] == end - len(events):  # the next ones: kept on
            kept[1].extend(events)
            events = kept[1]
            del events[: max(0, len(events) - PUBLISHED_KEPT)]
        self._published[channel] = (end, events)

    def _handle(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        channel = message["channel"]
        with self._lock:
            if kind == "message":
                self._keep(channel, message["data"])
                for wakeup in self._waiting.get(channel, ()):
                    wakeup.set()
            elif kind == "subscribe":
                self._published.pop(channel, None)  # what came while unsubscribed is unknown
                _count_down(self._sent, channel)
                self._lock.notify_all()
                for wakeup in self._waiting.get(channel, ()):  # resubscribed: read again
                    wakeup.set()
            elif kind == "unsubscribe":
                _count_down(self._unsent, channel)
                self._lock.notify_all()

    def _wake_all(self) -> None:
        with self._lock:
            self._published.clear()
            self._unsent.clear()  # the connection is gone, and its subscriptions with it
            self._lock.notify_all()
            for waiting in self._waiting.values():
                for wakeup in waiting:
                    wakeup.set()


# -- PostgreSQL -----------------------------------------------------------------------


_APPEND_SQL = (  # one round trip: the run's new length, its events, the NOTIFY
    "WITH grown AS (INSERT INTO {{runlogs}} AS r VALUES (%(run)s, %(n)s, false, 0, %(ended)s) "
    "ON CONFLICT (run_id) DO UPDATE SET length = r.length + EXCLUDED.length, "
    "stop = {stop}, ended_at = EXCLUDED.ended_at RETURNING length), "
    "added AS (INSERT INTO {{events}} SELECT %(run)s, grown.length - %(n)s + t.i, t.event "
    "FROM grown, unnest(%(events)s::bytea[]) WITH ORDINALITY AS t(event, i)) "
    "SELECT length, pg_notify(%(channel)s, %(payload)s) FROM grown"
)
"""An append; ``ended`` is set (the store's clock) with the final event, else ``NULL``."""


class PostgresRunLog(RunLog):
    """Logs in the store's ``<table>_events`` and ``<table>_runlogs`` tables.

    An append and its ``NOTIFY`` commit together, on one channel per store whose
    payload names the run. The followers of a process share one connection that
    ``LISTEN``s on it (`_PostgresListener`), so a follow costs no connection of
    its own. A follower marks the run as followed every `RENEW_EVERY` seconds
    (``watched_at``, on the server's clock) and reads the log at least that
    often, so a lost notification costs it that long at most.
    """

    def __init__(self, store: Any) -> None:
        from psycopg import sql

        self._store = store
        names = store._names
        self._sql = {
            key: sql.SQL(text).format(**names)
            for key, text in {
                "append": _APPEND_SQL.format(stop="r.stop"),
                "append_final": _APPEND_SQL.format(stop="false"),
                "read": (  # no row: no such run; one row without an event: nothing new
                    "SELECT e.event FROM {runlogs} r LEFT JOIN {events} e "
                    "ON e.run_id = r.run_id AND e.seq > %s WHERE r.run_id = %s ORDER BY e.seq"
                ),
                "stop": (
                    "INSERT INTO {runlogs} AS r VALUES (%s, 0, true, 0, NULL) "
                    "ON CONFLICT (run_id) DO UPDATE SET stop = true"
                ),
                "watch": (
                    "UPDATE {runlogs} SET watched_at = extract(epoch FROM clock_timestamp()) "
                    "WHERE run_id = %s"
                ),
                "check": (
                    "SELECT run_id, extract(epoch FROM clock_timestamp()) - watched_at < %s, "
                    "stop FROM {runlogs} WHERE run_id = ANY(%s)"
                ),
                "finished": "UPDATE {runlogs} SET stop = false, ended_at = %s WHERE run_id = %s",
                "collect_events": (
                    "DELETE FROM {events} e USING {runlogs} r WHERE e.run_id = r.run_id "
                    "AND r.ended_at < %s"
                ),
                "collect_runs": "DELETE FROM {runlogs} WHERE ended_at < %s",
            }.items()
        }
        prefix = names["heads"].as_string(None).encode()
        self.channel = "awaken_" + hashlib.sha256(prefix).hexdigest()[:40]
        """The store's channel (a digest: a safe identifier); each payload names a run."""
        self._listener = _PostgresListener(self)
        self._swept = 0.0

    @staticmethod
    def payload(run_id: str) -> str:
        """What an append of ``run_id`` sends on the store's channel."""
        return hashlib.sha256(run_id_bytes(run_id)).hexdigest()[:32]

    def _run(self, action: str, run_id: str | None, use: Any) -> Any:
        with self._store._backend_errors(action, run_id), self._store._connection() as conn:
            return use(conn)

    def append(self, run_id: str, events: Sequence[bytes]) -> int:
        return self._append("append", run_id, events, None)

    def append_final(self, run_id: str, events: Sequence[bytes]) -> None:
        """The last events and the run's end (``ended_at``, the stop cleared) in one statement."""
        self._append("append_final", run_id, events, float(self._store.clock()))
        self._sweep()

    def _append(
        self, statement: str, run_id: str, events: Sequence[bytes], ended: float | None
    ) -> int:
        params = {
            "run": run_id_bytes(run_id),
            "n": len(events),
            "ended": ended,
            "events": list(events),
            "channel": self.channel,
            "payload": self.payload(run_id),
        }

        def use(conn: Any) -> int:
            return int(conn.execute(self._sql[statement], params).fetchone()[0])

        return int(self._run("event log append", run_id, use))

    def read(self, run_id: str, after: int) -> list[bytes] | None:
        key = run_id_bytes(run_id)

        def use(conn: Any) -> list[bytes] | None:
            rows = conn.execute(self._sql["read"], (after, key)).fetchall()
            if not rows:
                return None
            return [bytes(row[0]) for row in rows if row[0] is not None]

        found: list[bytes] | None = self._run("event log read", run_id, use)
        return found

    def request_stop(self, run_id: str) -> None:
        key = run_id_bytes(run_id)
        self._run("stop request", run_id, lambda c: c.execute(self._sql["stop"], (key,)))

    def stop_requested(self, run_id: str) -> bool:
        return self.check([run_id])[0][1]

    def watch(self, run_id: str) -> None:
        """Mark the run as followed for `WATCH_FOR` seconds (the server's clock)."""
        key = run_id_bytes(run_id)
        self._run("event log watch", run_id, lambda c: c.execute(self._sql["watch"], (key,)))

    def followed(self, run_id: str) -> bool:
        return self.check([run_id])[0][0]

    def check(self, run_ids: Sequence[str]) -> list[tuple[bool, bool]]:
        keys = [run_id_bytes(run_id) for run_id in run_ids]
        rows = self._run(
            "event log check",
            None,
            lambda c: c.execute(self._sql["check"], (WATCH_FOR, keys)).fetchall(),
        )
        found = {bytes(key): (bool(watched), bool(stop)) for key, watched, stop in rows}
        return [found.get(key, (False, False)) for key in keys]

    def tail(self, run_id: str) -> Tail:
        return _PostgresTail(self, run_id)

    def finished(self, run_id: str) -> None:
        ended = float(self._store.clock())
        self._run(
            "event log end",
            run_id,
            lambda c: c.execute(self._sql["finished"], (ended, run_id_bytes(run_id))),
        )
        self._sweep()

    def _sweep(self) -> None:
        if time.time() - self._swept >= SWEEP_EVERY:
            self._swept = time.time()
            self.collect(KEEP_FOR)

    def collect(self, keep_for: float) -> None:
        """Remove the logs of runs that finished more than ``keep_for`` ago (store clock)."""
        before = float(self._store.clock()) - keep_for

        def use(conn: Any) -> None:
            conn.execute(self._sql["collect_events"], (before,))
            conn.execute(self._sql["collect_runs"], (before,))

        self._run("event log collection", None, use)

    def close(self) -> None:
        """The store closes: the followers' shared connection closes too."""
        self._listener.stop()


class _PostgresListener:
    """The connection that ``LISTEN``s on a store's channel for this process's followers.

    A thread holds it while followers are attached, and for `IDLE_EXIT` seconds
    after the last one leaves (a follower that retries until a run starts
    reuses it). It wakes the followers of the run each notification names. If
    the connection breaks, every follower is woken (each reads the log) and the
    thread connects again.
    """

    def __init__(self, log: PostgresRunLog) -> None:
        self._log = log
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._runs: dict[str, set[_Wakeup]] = {}
        """Per run (its notification payload), the wake-ups of its followers here."""
        self._thread: threading.Thread | None = None
        self._listening = False
        self._error: BaseException | None = None
        self._stopping = False

    def add(self, run_id: str, wakeup: _Wakeup) -> None:
        """Register a follower of ``run_id``; return once the channel is listened to.

        Raises:
            StreamCheckpointError: If the listening connection cannot be made.
        """
        payload = PostgresRunLog.payload(run_id)
        with self._lock:
            self._runs.setdefault(payload, set()).add(wakeup)
            self._stopping = False
            if self._thread is None:
                self._error = None
                self._thread = threading.Thread(
                    target=self._loop, name="awaken-run-log-listen", daemon=True
                )
                self._thread.start()
            self._changed.wait_for(
                lambda: self._listening or self._error is not None, self._log._store.timeout
            )
            error = None if self._listening else self._error or TimeoutError("no LISTEN yet")
        if error is not None:
            self.remove(run_id, wakeup)
            with self._log._store._backend_errors("event log listen", run_id):
                raise error

    def remove(self, run_id: str, wakeup: _Wakeup) -> None:
        payload = PostgresRunLog.payload(run_id)
        with self._lock:
            waiting = self._runs.get(payload)
            if waiting is not None:
                waiting.discard(wakeup)
                if not waiting:
                    del self._runs[payload]

    def stop(self) -> None:
        with self._lock:
            self._stopping = True

    def _wake_all(self) -> None:
        for waiting in self._runs.values():
            for wakeup in waiting:
                wakeup.set()

    def _loop(self) -> None:
        conn: Any = None
        idle_since: float | None = None
        try:
            while True:
                with self._lock:
                    now = time.monotonic()
                    if self._runs:
                        idle_since = None
                    elif idle_since is None:
                        idle_since = now
                    if self._stopping or (
                        idle_since is not None and now - idle_since >= IDLE_EXIT
                    ):  # decided under the lock: a follower attaching now starts a thread
                        self._thread = None
                        self._listening = False
                        return
                if conn is None:
                    conn = self._connect()
                    if conn is None:
                        time.sleep(RENEW_EVERY)
                        continue
                try:
                    for notify in conn.notifies(timeout=RENEW_EVERY):
                        with self._lock:
                            for wakeup in self._runs.get(notify.payload, ()):
                                wakeup.set()
                except Exception as exc:  # the connection broke: connect again
                    logger.debug("the event log's LISTEN connection failed: %s", exc)
                    with contextlib.suppress(Exception):
                        conn.close()
                    conn = None
                    with self._lock:
                        self._listening = False
                        self._wake_all()
        finally:
            with self._lock:
                if self._thread is threading.current_thread():  # an unexpected error
                    self._listening = False
                    self._thread = None
                self._wake_all()
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()

    def _connect(self) -> Any:
        import psycopg

        pool = self._log._store._pool
        conn = None
        try:
            conn = psycopg.connect(pool.conninfo, **{**(pool.kwargs or {}), "autocommit": True})
            conn.execute(f"LISTEN {self._log.channel}")
        except Exception as exc:
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.close()
            with self._lock:
                self._error = exc
                self._changed.notify_all()
            return None
        with self._lock:
            self._listening = True
            self._error = None
            self._changed.notify_all()
            self._wake_all()  # what was appended while nobody listened is read now
        return conn


class _PostgresTail(_WokenTail):
    """A follower of a PostgreSQL run: woken by its process's `_PostgresListener`.

    It renews the run's followed mark as it waits.
    """

    def __init__(self, log: PostgresRunLog, run_id: str) -> None:
        self._log, self._run_id = log, run_id
        self._renewed = 0.0
        super().__init__(log._listener, run_id)

    def _renew_due(self) -> bool:
        now = time.monotonic()
        if now - self._renewed >= RENEW_EVERY:
            self._renewed = now
            return True
        return False

    def wait(self, timeout: float) -> None:
        if self._renew_due():
            self._log.watch(self._run_id)
        super().wait(min(timeout, RENEW_EVERY))

    async def wait_async(self, seconds: float) -> None:
        if self._renew_due():  # one short statement: a hop to a thread
            await asyncio.to_thread(self._log.watch, self._run_id)
        await super().wait_async(min(seconds, RENEW_EVERY))


# -- which log a store has ------------------------------------------------------------

_LOGS: weakref.WeakKeyDictionary[StreamCheckpointStore, RunLog] = weakref.WeakKeyDictionary()
_LOGS_LOCK = threading.Lock()


def run_log(store: StreamCheckpointStore) -> RunLog:
    """The event log of ``store``'s runs.

    Raises:
        TypeError: If the store keeps no event logs.
    """
    with _LOGS_LOCK:
        found = _LOGS.get(store)
        if found is not None:
            return found
        log = _make_log(store)
        _LOGS[store] = log
        return log


def _make_log(store: StreamCheckpointStore) -> RunLog:
    from awaken_langchain.stores import (
        DiskCacheStreamCheckpointStore,
        FileStreamCheckpointStore,
        InMemoryStreamCheckpointStore,
    )

    if isinstance(store, InMemoryStreamCheckpointStore):
        return MemoryRunLog(store.clock)
    if isinstance(store, FileStreamCheckpointStore | DiskCacheStreamCheckpointStore):
        return DirectoryRunLog(store.directory, clock=store.clock)
    if type(store).__name__ == "RedisStreamCheckpointStore":
        return RedisRunLog(store)
    if type(store).__name__ == "PostgresStreamCheckpointStore":
        return PostgresRunLog(store)
    raise TypeError(
        f"{type(store).__name__} keeps no event logs for readers yet; follow runs of an "
        "in-process, file, DiskCache, Redis or PostgreSQL store"
    )


def collect_run_logs(store: StreamCheckpointStore) -> None:
    """Remove the logs of ``store``'s runs that finished longer ago than its ``ttl``.

    A store's ``gc`` calls it; a store without a ``ttl`` keeps finished logs
    `KEEP_FOR` seconds.
    """
    log = _LOGS.get(store)
    collect = getattr(log, "collect", None)
    if collect is not None:
        with contextlib.suppress(OSError):
            collect(store.ttl if store.ttl is not None else KEEP_FOR)


def close_run_log(store: StreamCheckpointStore) -> None:
    """``store`` closes: release what its log holds in this process (a listening connection)."""
    close = getattr(_LOGS.get(store), "close", None)
    if close is not None:
        close()


def has_run_log(store: StreamCheckpointStore) -> bool:
    """Whether ``store``'s runs can be followed."""
    try:
        run_log(store)
    except TypeError:
        return False
    return True


# -- the producer -----------------------------------------------------------------------


_EVENT_ENCODER = json.JSONEncoder(ensure_ascii=False, default=str)
"""What ``json.dumps(..., ensure_ascii=False, default=str)`` builds anew on every call."""


def encode_event(kind: str, data: dict[str, Any]) -> bytes:
    """One event as the log holds it (JSON, never pickle)."""
    return _EVENT_ENCODER.encode({"type": kind, "data": data}).encode()


def _chunk_items(chunk: BaseMessageChunk, skip: list[int], into: list[str | bytes]) -> None:
    """Add to ``into`` what one yielded chunk shows readers: its text (``str``) and its events.

    Whole tool calls only, as the turn yields them. Text is kept as ``str`` so
    that consecutive text becomes one event, encoded once.
    """
    content = chunk.content
    if isinstance(content, str) and not skip[0]:  # the common chunk: text and nothing more
        if content:
            into.append(content)
    else:
        blocks: list[Any] = [content] if isinstance(content, str) else list(content)
        for block in blocks:
            if isinstance(block, str):
                text = block
            elif isinstance(block, dict) and block.get("type") == "text":
                text = str(block.get("text") or "")
            elif isinstance(block, dict):
                kind = "reasoning" if block.get("type") in ("thinking", "reasoning") else "block"
                into.append(encode_event(kind, {"block": block}))
                continue
            else:
                continue
            if skip[0]:  # followers saw this text from the process before
                cut = min(skip[0], len(text))
                skip[0] -= cut
                text = text[cut:]
            if text:
                into.append(text)
    for call in getattr(chunk, "tool_call_chunks", ()):
        try:
            args = json.loads(call.get("args") or "{}")
        except ValueError:
            continue  # the turn yields only whole calls; anything else is not a call to run
        data = {"id": call.get("id"), "name": call.get("name"), "args": args}
        into.append(encode_event("tool_call", {**data, "executable": True}))


def _merged_text(items: list[str | bytes]) -> list[bytes]:
    """Consecutive text as one event (fewer offsets, less to store, one encoding)."""
    merged: list[bytes] = []
    texts: list[str] = []
    for item in items:
        if isinstance(item, str):
            texts.append(item)
            continue
        if texts:
            merged.append(encode_event("text", {"text": "".join(texts)}))
            texts = []
        merged.append(item)
    if texts:
        merged.append(encode_event("text", {"text": "".join(texts)}))
    return merged


class Tap:
    """What one turn yields, on its way to the run's log.

    The stream's thread calls only `add` and `due` and reads `stopping`; the
    publisher thread and the turn's end do the rest.
    """

    __slots__ = (
        "_lock",
        "_skip",
        "ended",
        "failing",
        "fenced",
        "final",
        "followed",
        "landed",
        "log",
        "next_flush",
        "next_wake",
        "pending",
        "run_id",
        "stopping",
    )

    def __init__(
        self, log: RunLog, run_id: str, fenced: Callable[[], bool] = lambda: False
    ) -> None:
        self.fenced = fenced
        self.log = log
        self.run_id = run_id
        self.pending: deque[Any] = deque()
        self.stopping = False
        self.followed = False
        self.ended = False
        self.failing = False
        self.final: bytes | None = None
        self.landed = threading.Event()
        self.next_flush = 0.0
        self.next_wake = 0.0
        self._lock = threading.Lock()
        self._skip = [0]

    def add(self, item: Any) -> None:
        """Queue a yielded chunk or a recovery report (the stream's only cost)."""
        self.pending.append(item)

    def due(self) -> None:
        """A checkpoint of the turn is due: the publisher's quiet round rides on it.

        While nobody follows the store's runs the publisher keeps no timer of
        its own: it wakes here, at most every `QUIET_EVERY` seconds, to ask
        the store about followers and stops and to append what the turn yielded.
        On an in-process log (`RunLog.quick`) the turn's own thread makes
        that round instead: a thread woken during a fast async stream waits
        for the GIL through hundreds of the event loop's network reads
        (measured: about 300 context switches per wake-up, 5 % of a
        2,000-chunk ChatOpenAI stream's CPU), far more than a list append.
        A log in files or on a server stays with the publisher: the turns of
        a process share their checkpoint moments, and 256 turns appending to
        their files on one event loop at once delay its chunks (chunk
        lateness p99 15 ms without full collections, 21 to 27 ms so).
        """
        now = time.monotonic()
        if now >= self.next_wake:
            self.next_wake = now + QUIET_EVERY
            if self.log.quick:
                self.log.publisher.quiet_round(self, now)
            else:
                self.log.publisher.wake()

    def skip_replayed(self, chars: int) -> None:
        """Text that followers already saw: a replacement process replays it, unpublished."""
        self._skip[0] = chars

    def _events(self, items: list[Any]) -> list[bytes]:
        found: list[str | bytes] = []
        skip = self._skip
        for item in items:
            if type(item) is AIMessageChunk and not skip[0]:
                # the common chunk, text and nothing more, read without a call
                fields = item.__dict__
                content = fields.get("content")
                if type(content) is str and not fields.get("tool_call_chunks"):
                    if content:
                        found.append(content)
                    continue
            if isinstance(item, ChatGenerationChunk):
                item = item.message
            if isinstance(item, BaseMessageChunk):
                _chunk_items(item, self._skip, found)
            elif item is _STARTED:
                found.append(encode_event("started", {"pid": os.getpid()}))
            else:  # a recovery report
                data = {"event": item.event.value, "data": item.data}
                if item.message:
                    data["message"] = item.message
                found.append(encode_event("recovery", data))
        return _merged_text(found)

    def flush(self, final: bytes | None = None) -> None:
        """Append what is queued (and the final event) to the log."""
        with self._lock:
            items = []
            pending = self.pending
            while pending:  # appends from the stream's thread go on meanwhile
                items.append(pending.popleft())
            if self.fenced():  # the run's new owner writes its log now
                if final is not None:
                    with contextlib.suppress(Exception):
                        self.log.left(self.run_id)
                return
            events = self._events(items)
            if final is not None:
                events.append(final)
            if not events:
                return
            try:
                if final is None:
                    self.log.append(self.run_id, events)
                else:
                    self.log.append_final(self.run_id, events)
            except Exception as exc:  # a failing log never fails the turn
                if not self.failing:
                    logger.warning("could not write the event log of %r: %s", self.run_id, exc)
                self.failing = True
                if final is None:
                    pending.extendleft(reversed(items))
            else:
                self.failing = False

    def abandon(self) -> None:
        """The turn ended without an outcome (its caller stopped reading).

        The publisher appends what it yielded, and the log stays open for a
        process that resumes the run.
        """
        self.ended = True
        self.log.publisher.wake()

    def end(self, kind: str, data: dict[str, Any]) -> None:
        """Write the run's final event before the turn returns, waiting `END_DEADLINE` at most.

        The publisher's thread writes it after everything the turn yielded; a
        store that does not answer in time costs the turn that long, once.
        """
        self.final = encode_event(kind, data)
        self.ended = True
        if self.log.quick:
            self.log.publisher.remove(self)
            self.flush(self.final)
            return
        self.log.publisher.wake()
        if not self.landed.wait(END_DEADLINE):
            logger.warning(
                "the final event of run %r was not written within %s s; followers see it late",
                self.run_id,
                END_DEADLINE,
            )


def message_data(message: AIMessage) -> dict[str, Any]:
    """A final message as a JSON object (``langchain_core.messages.messages_from_dict``)."""
    return message_to_dict(message)


class Publisher:
    """The thread that moves one store's taps into their logs.

    Each store has its own, so a store that hangs (a frozen server, a socket
    waiting out its timeout) delays the events of its own runs only. The
    thread starts with the store's first run in flight and exits, releasing
    what its log holds, when the last one has ended.
    """

    def __init__(self, log: RunLog) -> None:
        self.log = log
        self._taps: list[Tap] = []
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._next_check = 0.0

    def add(self, tap: Tap) -> None:
        with self._wake:
            self._taps.append(tap)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="awaken-run-log", daemon=True
                )
                self._thread.start()
            self._wake.notify()

    def wake(self) -> None:
        with self._wake:
            self._wake.notify()

    def remove(self, tap: Tap) -> None:
        with self._wake, contextlib.suppress(ValueError):
            self._taps.remove(tap)

    def _loop(self) -> None:
        while True:
            with self._wake:
                if not self._taps:  # the store's last run ended: nothing is held meanwhile
                    with contextlib.suppress(Exception):
                        self.log.release()
                    if not self._wake.wait_for(lambda: bool(self._taps), IDLE_EXIT):
                        self._thread = None
                        return
                taps = list(self._taps)
            now = time.monotonic()
            if now >= self._next_check:  # woken by a checkpoint, a new turn, or live
                self._next_check = now + CHECK_EVERY
                self._check(taps)
            for tap in taps:
                try:
                    self._serve(tap, now)
                except Exception:  # the publisher never dies
                    logger.exception("event log of %r: publishing failed", tap.run_id)
            with self._wake:  # a turn that ends wakes the thread
                if self._taps:
                    live = any(tap.followed for tap in self._taps)
                    self._wake.wait(LIVE_EVERY if live else QUIET_WAIT)

    def quiet_round(self, tap: Tap, now: float) -> None:
        """One turn's quiet round on the turn's own thread (an in-process log): check, append.

        A run found followed wakes the thread, which appends its events every
        `LIVE_EVERY` seconds from then on.
        """
        self._check([tap])
        tap.next_flush = now + QUIET_EVERY - LIVE_EVERY
        tap.flush()
        if tap.followed:
            self.wake()

    def _check(self, taps: list[Tap]) -> None:
        """Ask the store, once for all its runs in flight: followed? stop requested?"""
        try:
            answers = self.log.check([tap.run_id for tap in taps])
        except Exception as exc:  # a failing store never fails the turns
            logger.debug("could not check the runs' followers and stops: %s", exc)
            return
        for tap, (followed, stop) in zip(taps, answers, strict=True):
            tap.followed = followed
            if stop:
                tap.stopping = True

    def _serve(self, tap: Tap, now: float) -> None:
        if tap.ended:  # finished, or abandoned by its caller
            tap.flush(tap.final)
            self.remove(tap)
            with self._wake:
                if not self._taps:  # released before the turn returns
                    with contextlib.suppress(Exception):
                        self.log.release()
            tap.landed.set()
            return
        if tap.pending and (tap.followed or now >= tap.next_flush):
            tap.next_flush = now + QUIET_EVERY - LIVE_EVERY  # a checkpoint's wake finds it due
            tap.flush()


def open_tap(
    store: StreamCheckpointStore, run_id: str, fenced: Callable[[], bool] = lambda: False
) -> Tap | None:
    """A tap for a turn of ``store``'s run, or ``None`` if the store keeps no event logs.

    ``fenced`` tells whether a newer owner (a replacement process) claimed the
    run: from then on the turn writes nothing more to the run's log.
    """
    try:
        log = run_log(store)
    except TypeError:
        return None
    tap = Tap(log, run_id, fenced)
    tap.add(_STARTED)
    log.publisher.add(tap)
    return tap


class _Started:
    """The first event of every turn of a run (a replacement process's turn adds one)."""


_STARTED = _Started()


def _outcome(engine: Any, failure: BaseException | None) -> tuple[str, dict[str, Any]] | None:
    if engine.done and (failure is None or isinstance(failure, GeneratorExit)):
        kind = "stopped" if engine.stopped else "completed"
        return kind, {"message": message_data(engine.message())}
    if failure is None or isinstance(failure, GeneratorExit):
        return None
    return "failed", {"error": str(failure), "type": type(failure).__name__}


def end_tap(tap: Tap, engine: Any, failure: BaseException | None) -> None:
    """Publish how the turn ended: its final event, or (abandoned) what it yielded."""
    outcome = _outcome(engine, failure)
    if outcome is None:
        tap.abandon()
    else:
        tap.end(*outcome)


_T = TypeVar("_T")


async def _log_work(log: RunLog, work: Callable[..., _T], *args: Any) -> _T:
    """Do an async turn's write or read of its run's log, in a worker thread.

    On an in-process log (`RunLog.quick`) it is done at once: it takes
    microseconds, where a hop to the loop's default executor costs about 70 us
    of CPU and waits for a free worker.
    """
    if log.quick:
        return work(*args)
    return await asyncio.to_thread(work, *args)


async def aend_tap(tap: Tap, engine: Any, failure: BaseException | None) -> None:
    """`end_tap` for an async turn (the log is written by `_log_work`)."""
    outcome = _outcome(engine, failure)
    if outcome is None:
        tap.abandon()
    else:
        await _log_work(tap.log, tap.end, *outcome)


def skip_seen(tap: Tap) -> None:
    """A replacement process's turn: do not publish again the replayed text followers saw."""
    tap.skip_replayed(published_text(tap.log, tap.run_id))


async def askip_seen(tap: Tap) -> None:
    """`skip_seen` for an async turn (the log is read by `_log_work`)."""
    tap.skip_replayed(await _log_work(tap.log, published_text, tap.log, tap.run_id))


def published_text(log: RunLog, run_id: str) -> int:
    """Characters of text the run's log holds (what followers have seen)."""
    try:
        found = log.read(run_id, 0)
    except Exception:
        return 0
    chars = 0
    for raw in found or ():
        event = json.loads(raw)
        if event["type"] == "text":
            chars += len(event["data"]["text"])
        elif event["type"] in FINAL_TYPES:
            chars = 0
    return chars


def iter_events(raw: list[bytes]) -> Iterator[dict[str, Any]]:
    """Decode events as the log holds them."""
    for line in raw:
        yield json.loads(line)
