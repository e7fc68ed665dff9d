"""Readers: follow a run's answer from any process, and ask it to stop.

A turn of a `RecoveringChatModel` with a ``store`` writes its run's events to
that store (see ``_runlog.py``): what the turn yields (text, whole tool calls,
reasoning and other blocks), its recovery events, and one final event. A reader
replays the log from an offset, then follows it live until the final event.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Generator, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from langchain_core.messages import AIMessage, messages_from_dict

from awaken_langchain._runlog import FINAL_TYPES, RunLog, Tail, run_log
from awaken_langchain.checkpoint import StreamCheckpointStore, check_run_id
from awaken_langchain.errors import AwakenError

__all__ = [
    "RunEvent",
    "RunEventType",
    "RunOffsetError",
    "UnknownRunError",
    "afollow",
    "arequest_stop",
    "follow",
    "request_stop",
]

RunEventType = Literal[
    "started",
    "text",
    "tool_call",
    "reasoning",
    "block",
    "recovery",
    "completed",
    "failed",
    "stopped",
]
"""The kinds of a run's events; the last three end the run."""

WAIT_STEP = 1.0
"""Longest single wait of a follower before it reads the log again (a lost wake-up costs this)."""


class UnknownRunError(AwakenError, LookupError):
    """The store holds no event log for the run (never started, or expired)."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(
            f"no run {run_id!r} in this store: it has not started yet, or its log expired"
        )


class RunOffsetError(AwakenError, ValueError):
    """A follower asked for events after an offset the run's log does not reach."""

    def __init__(self, run_id: str, after: int, length: int) -> None:
        self.run_id = run_id
        self.after = after
        self.length = length
        super().__init__(
            f"run {run_id!r} has {length} events; cannot follow it after offset {after} "
            "(pass after=0 to read it from the start)"
        )


@dataclass(frozen=True, slots=True)
class RunEvent:
    """One event of a run, with its offset in the run's log.

    Attributes:
        offset: Position of the event in the run's log, from 1. Follow again with
            ``after=offset`` to get the events after this one.
        type: What happened (see `RunEventType`).
        data: The event's payload (JSON): ``{"text": ...}`` for text,
            ``{"id", "name", "args", "executable"}`` for a tool call, ``{"block": ...}``
            for reasoning and other blocks, ``{"event", "data"}`` for recovery,
            ``{"message": ...}`` for completed and stopped, ``{"error", "type"}``
            for failed.
    """

    offset: int
    type: RunEventType
    data: dict[str, Any]

    @property
    def text(self) -> str:
        """The event's text (empty for events without text)."""
        return str(self.data.get("text", "")) if self.type == "text" else ""

    @property
    def final(self) -> bool:
        """Whether the event ends the run (completed, failed or stopped)."""
        return self.type in FINAL_TYPES

    def message(self) -> AIMessage | None:
        """The final message of a completed or stopped run."""
        if "message" not in self.data:
            return None
        found = messages_from_dict([self.data["message"]])[0]
        return found if isinstance(found, AIMessage) else None


class _Follower:
    """The reading side of `follow` and `afollow`, in steps.

    The async twin waits without a thread (`anext`): an HTTP stream that waits
    for the next event holds no worker thread of the server.
    """

    def __init__(self, store: StreamCheckpointStore, run_id: str, after: int) -> None:
        if isinstance(after, bool) or not isinstance(after, int) or after < 0:
            raise ValueError(f"after must be an offset (an int >= 0), got {after!r}")
        self.run_id = check_run_id(run_id)
        self.log: RunLog = run_log(store)
        self.cursor = after
        self.tail: Tail | None = None
        self.done = False

    def open(self) -> list[RunEvent]:
        self.tail = self.log.tail(self.run_id)  # before the first read: nothing is missed
        found = self.log.read(self.run_id, 0 if self.cursor == 0 else self.cursor - 1)
        if found is None:
            self.close()
            raise UnknownRunError(self.run_id)
        if self.cursor > 0:
            if not found:
                self.close()
                raise RunOffsetError(self.run_id, self.cursor, self._length())
            if json.loads(found[0])["type"] in FINAL_TYPES:  # seen the end already
                self.done = True
                return []
            found = found[1:]
        return self._events(found)

    def _length(self) -> int:
        return len(self.log.read(self.run_id, 0) or ())

    def _events(self, raw: list[bytes]) -> list[RunEvent]:
        events = []
        for line in raw:
            decoded = json.loads(line)
            self.cursor += 1
            event = RunEvent(self.cursor, decoded["type"], decoded["data"])
            events.append(event)
            if event.final:
                self.done = True
                break
        return events

    def next(self, timeout: float = WAIT_STEP) -> list[RunEvent]:
        assert self.tail is not None
        self.tail.wait(timeout)
        return self._events(self.log.read(self.run_id, self.cursor) or [])

    async def anext(self, seconds: float = WAIT_STEP) -> list[RunEvent]:
        """`next` for a coroutine: the wait holds no thread, the read a short hop to one."""
        assert self.tail is not None
        await self.tail.wait_async(seconds)
        if self.tail is None:  # closed meanwhile
            return []
        if self.log.quick:  # this process's memory: nothing blocks
            raw = self.log.read(self.run_id, self.cursor)
        else:
            raw = await asyncio.to_thread(self.log.read, self.run_id, self.cursor)
        return self._events(raw or [])

    def close(self) -> None:
        if self.tail is not None:
            self.tail.close()
            self.tail = None


def follow(store: StreamCheckpointStore, run_id: str, *, after: int = 0) -> Iterator[RunEvent]:
    """Yield a run's events after offset ``after``: replay, live tail, one final event.

    The events are what the producing turn yielded, seam-cleaned across
    continuations, so the concatenated ``text`` of a run's events is its
    answer. A reader that reconnects with ``after`` set to the last offset it
    saw gets every later event once.

    Live events reach a follower of a Redis store as the producer appends them
    (pub/sub, no polling; one subscription per process for all its
    followers), and of a PostgreSQL store likewise (``LISTEN`` on a connection
    a process's followers share; a follower reads the log at least every
    0.5 s); a process's followers of a local store (file, DiskCache) share one
    thread that reads the log every 10 ms (``DEFAULT_POLL_INTERVAL`` in
    ``_runlog``); an in-process store wakes its followers. A producer appends a followed run's
    events every 5 ms, a run nobody follows every 250 ms.

    Args:
        store: The store the producing model writes to (any process, any host
            that shares it).
        run_id: The run's key: the ``run_id`` (or ``checkpoint_key``) of the
            model call.
        after: Offset of the last event already seen; 0 reads from the start.

    Raises:
        UnknownRunError: If the store holds no log for the run.
        RunOffsetError: If ``after`` is past the end of the run's log.
        TypeError: If the store keeps no event logs.
    """
    follower = _Follower(store, run_id, after)
    return _Events(follower, follower.open())


class _Events(Iterator[RunEvent]):
    """What `follow` returns: the events, and ``close``, which detaches the follower.

    A generator closed before its first event never runs its ``finally``: the
    follower would stay attached (an in-process store would count the run as
    followed) until it is garbage-collected.
    """

    def __init__(self, follower: _Follower, replayed: list[RunEvent]) -> None:
        self._follower = follower
        self._events = _follow(follower, replayed)

    def __next__(self) -> RunEvent:
        return next(self._events)

    def close(self) -> None:
        """Stop following the run (at any point, also before the first event)."""
        self._events.close()
        self._follower.close()


def _follow(follower: _Follower, replayed: list[RunEvent]) -> Generator[RunEvent, None, None]:
    try:
        yield from replayed
        while not follower.done:
            yield from follower.next()
    finally:
        follower.close()


async def afollow(
    store: StreamCheckpointStore, run_id: str, *, after: int = 0
) -> AsyncIterator[RunEvent]:
    """Async twin of `follow` (its waits hold no thread; its reads hop to one).

    The run and the offset are checked when the first event is awaited.
    """
    follower = _Follower(store, run_id, after)
    try:
        for event in await asyncio.to_thread(follower.open):
            yield event
        while not follower.done:
            for event in await follower.anext():
                yield event
    finally:
        await asyncio.to_thread(follower.close)


def request_stop(store: StreamCheckpointStore, run_id: str) -> None:
    """Ask a run to stop, from any process that shares its store.

    The producing process, whichever it is, notices the request within 0.1 s
    (``CHECK_EVERY``) while the run is followed, otherwise at the turn's next
    checkpoint (0.25 s at most by default), plus the wait for the provider's
    next chunk, ends the
    turn with the text so far as a normal message marked
    ``response_metadata["awaken"]["stopped"]`` (a tool call cut off by the stop
    never runs), and its followers get a ``stopped`` event. Asking a finished
    run to stop does nothing.

    Raises:
        UnknownRunError: If the store holds no log for the run.
    """
    run_id = check_run_id(run_id)
    log = run_log(store)
    found = log.read(run_id, 0)
    if found is None:
        raise UnknownRunError(run_id)
    if found and json.loads(found[-1])["type"] in FINAL_TYPES:
        return
    log.request_stop(run_id)


async def arequest_stop(store: StreamCheckpointStore, run_id: str) -> None:
    """Async twin of `request_stop`."""
    await asyncio.to_thread(request_stop, store, run_id)
