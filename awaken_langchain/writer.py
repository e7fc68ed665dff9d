"""Checkpoint writes off the stream's path: a writer per store, coalescing and batching.

A stream never waits for its store. It hands the latest state of its turn to
the store's writer and goes on; the writer, a background thread, keeps only the
newest checkpoint of each run (a checkpoint holds the whole turn so far, so an
older one adds nothing) and commits every pending run in one batch
(`StreamCheckpointStore.put_many`: one transaction, one pipeline), after
letting a batch gather for a few milliseconds. Operations a
turn must see the end of (opening a run, the closing write, a delete before a
memory commit) go through the same thread, after the run's pending writes, and
are waited for at most ``deadline`` seconds. On a store that answers at once
(the in-process one) such an operation, and a checkpoint at most once per run
and gathering time, runs on the turn's own thread instead when the writer is
not at work: the order is the same, without thread wake-ups. A store that can
begin a write without waiting for anyone (DiskCache, when no other connection
holds SQLite's write lock: `StreamCheckpointStore.put_many_now`) is committed
by an async stream itself, every pending run in one batch, at most once per
gathering time (what is handed over sooner, by a timer on its event loop, or
by the writer thread if that timer is `LOOP_GRACE` late: a caller doing
synchronous work keeps its loop from running it; the thread looks every
`WATCH_EVERY` seconds while such streams run rather than being woken for each
batch), and its opening and
closing operations run on the turn's thread; a sync
stream's checkpoints, and whatever the store cannot begin at once, go to the
writer thread. A background thread that
needs the GIL while an event loop keeps taking it back for network reads waits
for it hundreds of times per commit; committing on the thread that holds the
GIL anyway costs the commit and nothing more.

A store that fails or hangs therefore costs a stream one warning, not its
speed: `CheckpointWriter.problem` tells the turn that writes of its run failed
or that the writer has been stuck longer than the deadline, and the turn goes
on; when the store answers again, pending writes go through and the turn
reports the recovery. (A commit on the stream's thread waits a few
milliseconds at most for a lock; a disk that stops answering in the middle of
a write, such as a hung network filesystem, would hold that stream up, which
is one reason DiskCache belongs on a local disk.)

Durability: after a crash, the store holds a turn up to its last committed
batch, at most one cadence window, the gathering time (`GATHER`) and one batch
behind the stream; a record
is never torn or mixed (each store write is atomic), and a run's closing write
or delete is never reordered with its earlier writes.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import math
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import CancelledError as FutureCancelled
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar, cast

from awaken_langchain._process import PROCESS
from awaken_langchain.checkpoint import (
    DeferredCheckpoint,
    StreamCheckpoint,
    StreamCheckpointStore,
    built,
)
from awaken_langchain.errors import StreamCheckpointError

__all__ = ["CheckpointWriter", "StoreStalledError", "answers_at_once", "writer_for"]

T = TypeVar("T")

_IDLE_EXIT = 5.0
"""Seconds the writer thread waits for work before it exits (it restarts on demand)."""
GATHER = 0.01
"""Seconds the writer lets checkpoints gather after the first of a batch arrives.

Many streams checkpoint at different moments; committing each as it arrives
makes batches of one or two, each costing a thread wake-up and a transaction.
Waiting this long (an operation a turn waits for is never delayed) lets one
commit carry every run that checkpointed meanwhile, and lets a fast stream's
successive checkpoints coalesce; it adds at most this much to the time a
checkpoint takes to become durable. A checkpoint that finds the writer idle
for at least this long is written at once: nothing else was arriving."""
WATCH_EVERY = 0.25
"""Seconds between the writer thread's looks for a batch an event loop's timer left
(`LOOP_GRACE`), while async streams commit on their loops: the time rule of the default
checkpoint cadence, so the store is at most that much more behind a loop kept busy."""
WATCH_FOR = 1.0
"""Seconds the writer thread keeps looking on its timer after an async stream's last
hand-over before it waits to be woken again."""
LOOP_GRACE = 0.05
"""Seconds the writer thread leaves, past the gathering time, to an event loop's timer.

What an async stream hands over sooner than one gathering time after the last
commit waits for a timer on its event loop (`CheckpointWriter.submit`). A
caller that then keeps its loop busy with synchronous work would keep the
timer from running, and the store behind what the caller received; the writer
thread commits the batch itself once the timer is this late."""
_ATTRIBUTE = "_awaken_writer"
_REGISTRY_LOCK = threading.Lock()
EXIT_DRAIN = 5.0
"""Seconds the interpreter's exit waits, at most, for writes still queued in writers.

The writer thread is a daemon: without this wait, a process that ends right
after its turns would drop the closing writes and deletes those turns stopped
waiting for (after ``checkpoint_deadline``), and leave their checkpoints behind."""
_LIVE: weakref.WeakSet[CheckpointWriter] = weakref.WeakSet()


@atexit.register
def _drain_at_exit() -> None:
    until = time.monotonic() + EXIT_DRAIN
    for writer in list(_LIVE):
        if writer._pid == os.getpid():
            writer.flush(max(0.0, until - time.monotonic()))


class StoreStalledError(StreamCheckpointError):
    """The store did not answer within the checkpoint deadline."""


class CheckpointWriter:
    """Commits checkpoints of many runs to one store from a background thread.

    Args:
        store: The store written to.
        clock: Monotonic clock, to measure how long the store has been busy.
    """

    def __init__(
        self,
        store: StreamCheckpointStore,
        *,
        clock: Callable[[], float] = time.monotonic,
        gather: float = GATHER,
    ) -> None:
        self.store = store
        self._clock = clock
        self._gather = gather
        self._mutex = threading.RLock()
        """Held for every look at the writer's state (a `Condition`'s own ``with`` is two
        interpreted calls more, on every hand-over)."""
        self._cond = threading.Condition(self._mutex)
        self._puts: dict[str, StreamCheckpoint | DeferredCheckpoint] = {}
        self._ops: deque[tuple[Callable[[], Any], Future[Any]]] = deque()
        self._failed: dict[str, StreamCheckpointError] = {}
        self._runs: set[str] = set()
        """Runs handed over and not yet forgotten: only their failures are kept."""
        self._busy_since: float | None = None
        self._thread: threading.Thread | None = None
        self._sleeping = False  # the writer waits for a notification, not on a timer
        self._watching = False
        """The writer looks on a timer for what async streams' loops left (`WATCH_FOR`)."""
        self._on_loop_at = -math.inf
        """When an async stream last handed a checkpoint over to commit on its loop."""
        self._pid = os.getpid()
        self._inline = answers_at_once(store)
        self._deferred = takes_deferred(store)
        """Whether the store's class takes captures unbuilt (`takes_deferred`)."""
        self._written: dict[str, float] = {}
        """When `submit` last wrote each run on its own thread (a store that answers at once)."""
        self._put_now: (
            Callable[[list[StreamCheckpoint]], list[StreamCheckpointError | None] | None] | None
        ) = _declared(store, "put_many_now")
        self._call_now: Callable[[Callable[[], Any]], tuple[bool, Any]] | None = _declared(
            store, "call_now"
        )
        self._last = -math.inf
        """When the last batch was taken, by the writer thread or by a stream (monotonic)."""
        self._timers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, float] = (
            weakref.WeakKeyDictionary()
        )
        """When each event loop's timer set by `submit` commits what streams left pending
        (one per loop: another loop's thread may be busy, or its loop closed)."""

    # -- what streams call ------------------------------------------------------------

    def submit(
        self, checkpoint: StreamCheckpoint | DeferredCheckpoint, *, on_loop: bool = False
    ) -> None:
        """Hand over the newest state of a run; returns at once.

        A `DeferredCheckpoint` is written only if no newer one of its run
        arrives before the writer takes it; it is built then, unless the
        store's class takes it unbuilt (`takes_deferred`: the store writes
        what was appended since its last write of the run, without joining
        the turn's whole text).

        A store that answers at once (`answers_at_once`) is written on the
        calling thread instead, when the writer is not at work: a background
        thread that keeps waking makes an event loop doing network reads give
        up the GIL and block about twice per chunk (measured: 3 000 context
        switches in a 2 000-chunk ChatOpenAI stream, against 5 without it),
        which costs more than the put. A run is written so at most once per
        gathering time (building a checkpoint copies the turn's whole text);
        a newer checkpoint handed over sooner waits for the run's next
        hand-over, its closing write or delete, or `flush`.

        A store that can begin a write without waiting (`put_many_now`) is
        committed here by an async turn (``on_loop``: its event loop gets
        control back between chunks), every pending run in one batch, when
        the writer thread is idle and no batch was taken within the gathering
        time; what is handed over sooner waits for the next such hand-over or
        for a timer on the loop, and the writer thread takes it if the timer
        has not run `LOOP_GRACE` after it was due (the caller may keep its
        loop busy with synchronous work): while such turns hand checkpoints
        over, the thread looks every `WATCH_EVERY` seconds, and is not woken
        for each batch. A sync turn leaves it to the writer thread:
        a sync stream read by a reader thread would hand the GIL to that
        thread at every SQLite call (measured: 1.17x to 1.44x the bare
        stream's CPU), and one read on the caller's thread gains nothing
        measurable.
        """
        run_id = checkpoint.run_id
        with self._mutex:
            self._runs.add(run_id)
            if self._here():
                now = time.monotonic()
                if now - self._written.get(run_id, -math.inf) >= self._gather:
                    self._puts.pop(run_id, None)  # older than this one
                    self._written[run_id] = now
                    self._commit([checkpoint])
                else:
                    self._puts[run_id] = checkpoint
                return
            self._puts[run_id] = checkpoint
            if (
                on_loop
                and self._put_now is not None
                and self._idle()
                and (loop := _running_loop()) is not None
            ):
                due = self._last + self._gather
                now = self._on_loop_at = time.monotonic()
                if now >= due:
                    if self._commit_here():
                        return
                else:
                    self._remind(loop, due, now)
                    if not self._sleeping and self._thread is not None and self._thread.is_alive():
                        return  # the writer thread looks on its own, after the loop's timer
            thread = self._thread
            if self._sleeping or self._watching or thread is None or not thread.is_alive():
                self._wake()  # else the writer is busy or gathering, and looks on its own

    def call(
        self,
        action: Callable[[], T],
        *,
        runs: tuple[str, ...] | None = None,
        closes: str | None = None,
    ) -> Future[T]:
        """Run ``action`` after the writes pending now; the future holds its outcome.

        ``action`` runs on the writer thread, or, for a store that answers at
        once (`answers_at_once`) or that can run it without waiting for a lock
        (`StreamCheckpointStore.call_now`; if it cannot, the writer thread runs
        it), on the calling thread when nothing it must follow is pending: no
        operation, no batch being committed, and no pending write of the runs
        it touches (``runs``; ``None``: any run).
        ``closes`` names the run whose last write or delete ``action`` is: that
        run's pending checkpoint is older than what ``action`` writes, so it is
        dropped rather than waited for. A thread hop costs about as much as a
        short turn's whole stream; the in-process store's operations take
        microseconds and cannot hang.
        """
        future: Future[T] = Future()
        with self._mutex:
            if (self._inline or self._call_now is not None) and self._idle():
                puts = self._puts
                if closes is not None:
                    puts.pop(closes, None)
                if not (puts if runs is None else any(run in puts for run in runs)):
                    if self._call_now is None:
                        _carry_out(action, future)
                        return future
                    try:
                        ran, result = self._call_now(action)
                    except BaseException as exc:
                        future.set_exception(exc)
                        return future
                    if ran:
                        future.set_result(cast(T, result))
                        return future
            self._ops.append((action, future))
            self._wake()
        return future

    def wait(self, future: Future[T], deadline: float) -> T:
        """The result of ``future`` (sync), or `StoreStalledError` after ``deadline`` s."""
        try:
            return future.result(timeout=deadline)
        except FutureTimeout:
            raise self._stalled(deadline) from None

    async def await_(self, future: Future[T], deadline: float) -> T:
        """The result of ``future`` (async), or `StoreStalledError` after ``deadline`` s.

        Giving up the wait never cancels the operation itself, which still
        lands (in order) when the store answers. (One loop future and one
        timeout: ``wait_for`` over ``shield`` over ``wrap_future`` cost a
        quarter more per operation, twice per turn.)
        """
        if future.done():  # run on this thread (`call`): nothing to wait for
            return future.result()
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[T] = loop.create_future()

        def landed(done: Future[T]) -> None:
            with contextlib.suppress(RuntimeError):  # the loop was closed meanwhile
                loop.call_soon_threadsafe(_settle, waiter, done)

        future.add_done_callback(landed)
        try:
            async with asyncio.timeout(deadline):
                return await waiter
        except TimeoutError:
            raise self._stalled(deadline) from None

    def problem(self, run_id: str, deadline: float) -> StreamCheckpointError | None:
        """Why writes of ``run_id`` are not reaching the store now, or ``None``."""
        with self._mutex:
            failed = self._failed.get(run_id)
            busy = self._busy_since
        if failed is not None:
            return failed
        if busy is not None and self._clock() - busy > deadline:
            return self._stalled(deadline)
        return None

    def forget(self, run_id: str) -> None:
        """Drop what the writer remembers of a run whose turn has ended, however it ended.

        A write of the run still pending is committed as usual, but its outcome
        is no longer kept: nobody will ask for it.
        """
        with self._mutex:
            self._runs.discard(run_id)
            self._failed.pop(run_id, None)
            self._written.pop(run_id, None)

    def flush(self, timeout: float) -> bool:
        """Wait until every write handed over so far has been attempted; ``False`` on timeout."""
        until = time.monotonic() + timeout
        with self._mutex:
            if (
                self._puts  # left by `submit` for a later hand-over or a loop's timer
                and (self._inline or self._put_now is not None)
                and self._idle()
                and not self._commit_here()  # the store is busy
            ):
                self._wake()
            while self._puts or not self._idle():
                remaining = until - time.monotonic()
                if remaining <= 0 or self._thread is None or not self._thread.is_alive():
                    return not self._puts and self._idle()
                self._cond.wait(min(remaining, 0.05))
        return True

    @property
    def pending(self) -> int:
        """Runs and operations not yet handed to the store."""
        with self._mutex:
            return len(self._puts) + len(self._ops)

    # -- the thread -------------------------------------------------------------------

    def _stalled(self, deadline: float) -> StoreStalledError:
        return StoreStalledError(
            f"{type(self.store).__name__} did not answer within {deadline:g} s; the turn "
            "goes on without checkpoints until it does "
            "(RecoveringChatModel(checkpoint_deadline=...) sets the wait)"
        )

    def _idle(self) -> bool:
        """Whether the writer thread has no operation queued and no batch under way.

        Work may then run on the calling thread (which holds ``_mutex``) without
        overtaking anything the thread was given.
        """
        return not self._ops and self._busy_since is None

    def _here(self) -> bool:
        """Whether the store answers at once and work may run on the calling thread now."""
        return self._inline and self._idle()

    def _wake(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(
                target=self._loop, name="awaken-checkpoint-writer", daemon=True
            )
            self._thread.start()
            _LIVE.add(self)
        self._cond.notify_all()  # the writer, and any flush waiting for it

    def _loop(self) -> None:
        self._last = max(self._last, time.monotonic())  # a thread's start counts as a batch
        dense = False  # checkpoints kept arriving while the last batch gathered
        while True:
            with self._mutex:
                if dense and not self._ops:
                    # More are likely on their way: look again after one gathering time,
                    # on a timer, so that a stream handing one over does not wake this
                    # thread (a wake-up costs the stream a system call and this thread
                    # about as much CPU as a small batch).
                    self._cond.wait(self._gather)
                if self._put_now is not None:
                    # While async streams commit on their loops, look for a batch a
                    # loop's timer left (the loop kept busy) every `WATCH_EVERY`
                    # seconds, instead of being woken for every batch: a thread woken
                    # during a fast async stream waits for the GIL through hundreds of
                    # the loop's network reads (measured: 1,100 to 1,800 context
                    # switches of this thread in a 2,000-chunk ChatOpenAI stream).
                    self._watching = True
                    try:
                        while (
                            not self._puts
                            and not self._ops
                            and time.monotonic() - self._on_loop_at < WATCH_FOR
                        ):
                            self._cond.wait(max(WATCH_EVERY, self._gather + LOOP_GRACE))
                    finally:
                        self._watching = False
                if not self._puts and not self._ops:
                    dense = False
                    idle_since = time.monotonic()
                    self._sleeping = True
                    try:
                        while not self._puts and not self._ops:
                            remaining = _IDLE_EXIT - (time.monotonic() - idle_since)
                            if remaining <= 0:
                                self._thread = None
                                return
                            self._cond.wait(remaining)
                    finally:
                        self._sleeping = False
                if self._put_now is not None:
                    # streams commit on their own thread at most once per gathering
                    # time: leave them the batch until a gathering time has passed
                    # without one (an operation a turn waits for ends the wait), and
                    # an event loop's timer `LOOP_GRACE` more: a loop kept busy by
                    # synchronous work does not run it
                    while self._puts and not self._ops:
                        grace = LOOP_GRACE if self._timers else 0.0
                        remaining = self._last + self._gather + grace - time.monotonic()
                        if remaining <= 0:
                            break
                        dense = True
                        self._cond.wait(remaining)
                    if not self._puts and not self._ops:
                        continue
                elif (
                    not dense
                    and self._puts
                    and not self._ops
                    and self._gather > 0
                    and time.monotonic() - self._last < self._gather
                ):
                    # let the batch gather; an operation a turn waits for ends the wait,
                    # and a checkpoint arriving after a quiet spell is written at once
                    dense = True
                    until = time.monotonic() + self._gather
                    while not self._ops:
                        remaining = until - time.monotonic()
                        if remaining <= 0:
                            break
                        self._cond.wait(remaining)
                taken = list(self._puts.values())
                self._puts.clear()
                ops = list(self._ops)
                self._ops.clear()
                self._busy_since = self._clock()
                self._last = time.monotonic()
            outcomes: list[Callable[[], None]] = []
            try:
                if taken:
                    self._commit(taken)
                outcomes = [_attempt(action, future) for action, future in ops]
            finally:
                # done before the turns waiting hear of it: a turn that goes on at once
                # finds the writer idle, and a writer thread that has to wait for the
                # GIL (an event loop reading the network keeps taking it back) does not
                # hold the turn's next writes up meanwhile
                with self._mutex:
                    self._busy_since = None
                for settle in outcomes:
                    settle()

    def _left_over(self) -> None:
        """On an event loop's timer: commit what streams handed over since their last commit.

        A stream on an event loop commits on its own thread at most once per
        gathering time; what it hands over sooner waits for this timer rather
        than for the writer thread, which would have to win the GIL back from
        the loop at every network read the loop makes (measured: about 80
        context switches each time that thread wakes during a fast stream).
        """
        loop = _running_loop()
        with self._mutex:
            if loop is not None:
                self._timers.pop(loop, None)
            if not self._puts or not self._idle():
                return  # nothing left, or the writer thread takes it after its work
            now = time.monotonic()
            due = self._last + self._gather
            if now < due and loop is not None:  # a stream committed meanwhile: look later
                self._remind(loop, due, now)
                return
            if not self._commit_here():
                self._wake()

    def _remind(self, loop: asyncio.AbstractEventLoop, due: float, now: float) -> None:
        """Have ``loop`` call `_left_over` at ``due`` unless a timer of its own is still set."""
        if self._timers.get(loop, -math.inf) >= now:
            return
        self._timers[loop] = due
        loop.call_at(loop.time() + (due - now), self._left_over)

    def _commit_here(self) -> bool:
        """Commit every pending checkpoint on the calling thread, if the store can start now.

        The caller holds ``_mutex``, so the writer thread cannot take a batch
        meanwhile; the store answers at once or has `put_many_now`. Returns
        whether the batch was committed (or failed); if the store could not
        start without waiting, the checkpoints stay pending for the writer
        thread.
        """
        taken = list(self._puts.values())
        self._puts.clear()
        self._last = time.monotonic()
        return self._commit(taken, now=self._put_now is not None)

    def _commit(
        self, taken: list[StreamCheckpoint | DeferredCheckpoint], now: bool = False
    ) -> bool:
        errors: list[StreamCheckpointError | None] | None
        try:
            puts = self._ready(taken)
            if now:
                assert self._put_now is not None
                errors = self._put_now(puts)
                if errors is None:  # the store was busy: nothing was written
                    with self._mutex:
                        for put in puts:
                            self._puts.setdefault(put.run_id, put)
                    return False
            else:
                errors = self.store.put_many(puts)
        except StreamCheckpointError as exc:
            errors = [exc] * len(taken)
        except Exception as exc:  # a store must raise StreamCheckpointError; never die here
            wrapped = StreamCheckpointError(f"{type(self.store).__name__}.put failed", cause=exc)
            errors = [wrapped] * len(taken)
        with self._mutex:
            for checkpoint, error in zip(taken, errors, strict=True):
                if error is None:
                    self._failed.pop(checkpoint.run_id, None)
                elif checkpoint.run_id in self._runs:  # else its turn has ended
                    self._failed[checkpoint.run_id] = _without_frames(error)
        return True

    def _ready(self, taken: list[StreamCheckpoint | DeferredCheckpoint]) -> list[StreamCheckpoint]:
        """The checkpoints to hand the store: captures unbuilt if its class takes them.

        Only a `DeferredCheckpoint` itself goes unbuilt: a subclass may build
        differently (and its `build` may fail, which is reported as a failed put).
        """
        if not self._deferred:
            return [built(p) for p in taken]
        ready = [p if type(p) is DeferredCheckpoint else built(p) for p in taken]
        # a store whose class declares takes_deferred accepts captures in every put
        return cast("list[StreamCheckpoint]", ready)


def _without_frames(error: StreamCheckpointError) -> StreamCheckpointError:
    """``error`` with the tracebacks of its chain dropped, to be kept until its turn reads it.

    Only its message is read later; the frames would keep every local of the
    failed batch alive (the checkpoints of every run in it, each with its
    turn's whole text).
    """
    seen: set[int] = set()
    link: BaseException | None = error
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        link.__traceback__ = None
        link = link.__cause__ or link.__context__
    return error


def _carry_out(action: Callable[[], T], future: Future[T]) -> None:
    """Run ``action`` and put its outcome in ``future`` (unless the future was cancelled)."""
    _attempt(action, future)()


def _attempt(action: Callable[[], T], future: Future[T]) -> Callable[[], None]:
    """Run ``action`` (unless ``future`` was cancelled); return what puts its outcome there."""
    if not future.set_running_or_notify_cancel():
        return _nothing
    try:
        result = action()
    except BaseException as exc:
        error = exc
        return lambda: future.set_exception(error)
    return lambda: future.set_result(result)


def _nothing() -> None:
    pass


def _settle(waiter: asyncio.Future[T], done: Future[T]) -> None:
    """Pass the outcome of a writer operation to the loop future awaiting it."""
    if waiter.done():  # the wait was given up
        return
    try:
        result = done.result()  # done already: one look at the future, not three
    except FutureCancelled:
        waiter.cancel()
    except BaseException as error:
        waiter.set_exception(error)
    else:
        waiter.set_result(result)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running on this thread, or ``None``."""
    return asyncio._get_running_loop()


def answers_at_once(store: StreamCheckpointStore) -> bool:
    """Whether ``store``'s class declares that its operations take microseconds and never block.

    Only the exact class counts: a subclass may override any operation, so it
    must declare it again itself (``answers_at_once = True`` in its body).
    """
    return type(store).__dict__.get("answers_at_once") is True


def takes_deferred(store: StreamCheckpointStore) -> bool:
    """Whether ``store``'s class declares that its puts take a `DeferredCheckpoint` unbuilt.

    Only the exact class counts, as for `answers_at_once`.
    """
    return type(store).__dict__.get("takes_deferred") is True


def _declared(store: StreamCheckpointStore, name: str) -> Any:
    """``store``'s method ``name`` if the store's own class defines it, else ``None``.

    Only the exact class counts, as for `answers_at_once`: a subclass may
    override `put_many` or any operation (to make it slow, or to fail), and
    work done on the stream's thread must be what the class declares.
    """
    return getattr(store, name) if name in type(store).__dict__ else None


def writer_for(store: StreamCheckpointStore) -> CheckpointWriter:
    """The writer of ``store`` (one per store object and process)."""
    writer = store.__dict__.get(_ATTRIBUTE)
    if isinstance(writer, CheckpointWriter) and writer._pid == PROCESS[0]:
        return writer
    with _REGISTRY_LOCK:
        writer = store.__dict__.get(_ATTRIBUTE)
        if not isinstance(writer, CheckpointWriter) or writer._pid != PROCESS[0]:
            writer = CheckpointWriter(store)
            store.__dict__[_ATTRIBUTE] = writer
        return writer
