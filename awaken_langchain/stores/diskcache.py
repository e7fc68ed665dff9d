"""The embedded default store: a diskcache (SQLite) directory shared by processes."""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import diskcache

from awaken_langchain._process import PROCESS
from awaken_langchain.checkpoint import (
    DEFAULT_MAX_CHECKPOINT_BYTES,
    DeferredCheckpoint,
    StreamCheckpoint,
    decode_json,
    encode_json,
)
from awaken_langchain.errors import StreamCheckpointError
from awaken_langchain.stores._base import (
    DEFAULT_EPOCH_GRACE,
    Head,
    LastWrite,
    PutPlan,
    SegmentedCheckpointStore,
    check_epoch,
    corrupted,
    decode_head,
    encode_text,
    make_private_database,
    make_private_directory,
    next_epoch,
    plan_append,
    run_id_bytes,
    segment_sizes,
    unreadable_id,
    unreadable_locator,
)

T = TypeVar("T")

BRIEF_WAIT = 0.005
"""Seconds a write made on a turn's own thread (`put_many_now`, `call_now`) waits for
another process's transaction before it leaves the work to the writer thread.

Other processes' group commits hold the lock for about a millisecond each; a
write that gave up at once would often hand its work to a background thread,
which an event loop reading the network keeps from the GIL for far longer."""

_POLL_FIRST = 0.0005
"""Seconds between the first tries of a transaction that found the write lock taken."""
_POLL_SHARE = 8
"""A transaction that waited ``w`` seconds so far tries again ``w / _POLL_SHARE`` later."""
_POLL_MAX = 0.025
"""Longest pause between two tries, however long the lock has been held."""

_HEAD = b"h\x00"
_EPOCH = b"e\x00"
_SEGMENT = b"s\x00"
_FLOOR = b"f\x00epoch-floor"

_COLLECT_BATCH = 256
"""Epoch records examined per transaction by ``gc``."""

_MODE_RAW = diskcache.core.MODE_RAW

_KEYS_PER_SELECT = 400
"""Keys read per statement by a group commit (SQLite allows at least 999 parameters)."""

_SELECT_ROWS = (
    "SELECT key, mode, value FROM Cache WHERE raw = 1 AND key IN ({}) "
    "AND (expire_time IS NULL OR expire_time > ?)"
)
_UPSERT_ROWS = (
    "INSERT INTO Cache(key, raw, store_time, expire_time, access_time, access_count, tag, "
    "size, mode, filename, value) VALUES {} "
    "ON CONFLICT(key, raw) DO UPDATE SET store_time = excluded.store_time, "
    "expire_time = NULL, access_time = excluded.access_time, access_count = 0, tag = NULL, "
    "size = 0, mode = 1, filename = NULL, value = excluded.value"
)
"""Rows exactly as ``Cache.set`` stores small bytes values (inline, not in a file)."""
_UPSERT_VALUES = "(?, 1, ?, NULL, ?, 0, NULL, 0, 1, NULL, ?)"
_ROWS_PER_UPSERT = 200
"""Rows written per statement: one statement is one release of the GIL (and one
wait to take it back from a busy event loop), where ``executemany`` is one per row."""
_UPSERT_ROW = _UPSERT_ROWS.format(_UPSERT_VALUES)
_GUARDED_UPSERT = (
    "INSERT INTO Cache(key, raw, store_time, expire_time, access_time, access_count, tag, "
    "size, mode, filename, value) "
    "SELECT new.column1, 1, ?{now}, NULL, ?{now}, 0, NULL, 0, 1, NULL, new.column2 "
    "FROM (VALUES {values}) AS new "
    "WHERE COALESCE((SELECT Cache.mode IS 1 AND Cache.value IS new.column4 FROM Cache "
    "WHERE Cache.key = new.column3 AND Cache.raw = 1 "
    "AND (Cache.expire_time IS NULL OR Cache.expire_time > ?{now})), new.column4 IS NULL) "
    "AND COALESCE((SELECT Cache.mode IS 1 AND Cache.value IS new.column6 FROM Cache "
    "WHERE Cache.key = new.column5 AND Cache.raw = 1 "
    "AND (Cache.expire_time IS NULL OR Cache.expire_time > ?{now})), new.column6 IS NULL) "
    "ON CONFLICT(key, raw) DO UPDATE SET store_time = excluded.store_time, "
    "expire_time = NULL, access_time = excluded.access_time, access_count = 0, tag = NULL, "
    "size = 0, mode = 1, filename = NULL, value = excluded.value"
)
"""Rows as `_UPSERT_ROWS` writes them, each only while its run's head and epoch record
rows hold what this store last saw (a live raw row with those bytes, or no live row):
one statement, so one transaction and one release of the GIL, for a whole group commit.
Each row of ``values`` is (key, value, head key, head, epoch record key, epoch record);
``now`` is the number of the last parameter, the time. It begins with ``INSERT`` (no
``WITH``): the sqlite3 module counts the rows written only for a statement that does."""

_GUARDED_RUNS = 4
"""Most runs a group commit writes in one guarded statement. Each row's guard reads its
run's head and epoch record rows, where the transaction reads them once per run; the
three statements it saves weigh less as the batch grows. Measured (one thread, puts
appending 40 characters): 84 vs 90 us of CPU per run for one run, the same for four,
29 vs 27 us for 43; a writer thread behind a busy stream also waits to take the GIL
back after each statement, which favours the guarded statement for a few runs."""


@functools.lru_cache(maxsize=64)
def _guarded_upsert(rows: int) -> str:
    """`_GUARDED_UPSERT` for ``rows`` rows, every parameter numbered (``?N``)."""
    values = ",".join(
        "(" + ", ".join(f"?{6 * row + column}" for column in range(1, 7)) + ")"
        for row in range(rows)
    )
    return _GUARDED_UPSERT.format(values=values, now=6 * rows + 1)


_DELETE_ROWS = "DELETE FROM Cache WHERE raw = 1 AND key IN ({})"


def _rows(execute: Callable[..., Any], keys: Sequence[bytes]) -> dict[bytes, tuple[int, Any]]:
    """Read the rows of ``keys`` in as few statements as SQLite's parameter limit allows."""
    found: dict[bytes, tuple[int, Any]] = {}
    now = time.time()
    for start in range(0, len(keys), _KEYS_PER_SELECT):
        chunk = keys[start : start + _KEYS_PER_SELECT]
        statement = _SELECT_ROWS.format(",".join("?" * len(chunk)))
        for key, mode, value in execute(statement, (*chunk, now)).fetchall():
            found[bytes(key)] = (mode, bytes(value) if type(value) is not int else value)
    return found


_CHANGED_ROWS = (
    "WITH expected(key, value) AS (VALUES {}) "
    "SELECT expected.key, Cache.mode, Cache.value FROM expected "
    "LEFT JOIN Cache ON Cache.key = expected.key AND Cache.raw = 1 "
    "AND (Cache.expire_time IS NULL OR Cache.expire_time > ?) "
    "WHERE Cache.value IS NOT expected.value OR (Cache.rowid IS NOT NULL AND Cache.mode IS NOT 1)"
)
_PAIRS_PER_SELECT = 400
"""Expected rows compared per statement (two parameters each, within SQLite's 999)."""


def _changed_rows(
    execute: Callable[..., Any], expected: Sequence[tuple[bytes, bytes | None]]
) -> dict[bytes, tuple[int, Any] | None]:
    """The rows among ``expected`` that do not hold the bytes expected, read in bulk.

    ``expected`` pairs a key with the raw bytes its row should hold, or ``None``
    for a row that should not exist. Returns ``key -> (mode, value)`` for each
    row that differs, or ``key -> None`` for an expected row that is missing;
    a key left out holds what was expected.

    SQLite compares, so a group commit whose records nobody else touched reads
    back no rows. Each row read is a step, and each step releases the GIL: on a
    busy event loop, taking it back costs the writer up to a switch interval
    (5 ms) per row, where one step costs one.
    """
    found: dict[bytes, tuple[int, Any] | None] = {}
    now = time.time()
    for start in range(0, len(expected), _PAIRS_PER_SELECT):
        chunk = expected[start : start + _PAIRS_PER_SELECT]
        statement = _CHANGED_ROWS.format(",".join(["(?, ?)"] * len(chunk)))
        params: list[Any] = [p for pair in chunk for p in pair]
        params.append(now)
        for key, mode, value in execute(statement, params).fetchall():
            found[bytes(key)] = (
                None if mode is None else (mode, bytes(value) if type(value) is not int else value)
            )
    return found


_BUSY = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def _busy(cause: BaseException | None) -> bool:
    """Whether ``cause`` is SQLite's answer that another connection holds a lock."""
    code = getattr(cause, "sqlite_errorcode", None)
    return isinstance(cause, sqlite3.OperationalError) and code is not None and code & 0xFF in _BUSY


def _lock_taken(cause: BaseException | None) -> bool:
    """Whether ``cause`` says that another connection held a lock this one needed."""
    # a Timeout: BEGIN IMMEDIATE found the write lock taken for as long as it may wait
    return isinstance(cause, diskcache.Timeout) or _busy(cause)


_Layout = (
    tuple[bytes, int, list[int], tuple[int, ...], list[tuple[bytes, bytes]], list[bytes]] | None
)
"""A put as `DiskCacheStreamCheckpointStore._lean_layout` plans it (planned once per put:
it reads the text appended, and re-encodes a merged tail segment)."""


class _FloorUnknown(Exception):
    """The fencing rule needs the epoch floor, which only a transaction reads."""


def _floor_unknown() -> int:
    raise _FloorUnknown


class _Stored:
    """What this store last wrote for a run, so that the next put need not read it back.

    Attributes:
        head: The stored head, byte for byte. The next put writes without
            reading the record only if the row still holds exactly these bytes
            (its ``write_id`` is random: nobody else wrote in between).
        chars: Characters of the text in each segment (the head's ``extra``
            holds their sizes in bytes), so that a merged tail segment is
            encoded from the text instead of read back.
        epoch_row: The run's epoch record as last read, undecoded.
        epoch_record: That record decoded, reused while the row is unchanged.
        keys: The run's head key, epoch record key and text segment key prefix.
    """

    __slots__ = ("chars", "epoch_record", "epoch_row", "head", "keys")

    def __init__(
        self,
        head: bytes,
        chars: tuple[int, ...],
        epoch_row: Any,
        epoch_record: tuple[int, float] | None,
        keys: tuple[bytes, bytes, bytes],
    ) -> None:
        self.head = head
        self.chars = chars
        self.epoch_row = epoch_row
        self.epoch_record = epoch_record
        self.keys = keys


def _lean_write(plan: PutPlan, text_bytes: int, sizes: list[int], stored: _Stored) -> LastWrite:
    """What a put written without reading back leaves remembered of its run."""
    return LastWrite(
        plan.write_id,
        plan.text,
        text_bytes,
        {"segments": sizes},
        plan.text_hash,
        stored,
        plan.fields_code,
    )


def _run_keys(run_id: str) -> tuple[bytes, bytes, bytes]:
    """A run's head key, epoch record key and text segment key prefix."""
    encoded = run_id_bytes(run_id)
    return _HEAD + encoded, _EPOCH + encoded, _SEGMENT + encoded + b"\x00"


def _segment_key(prefix: bytes, index: int) -> bytes:
    """The key of a run's text segment ``index``, from the run's segment key prefix."""
    return prefix + b"%d" % index


def _segment_chars(text: str, sizes: Sequence[int]) -> tuple[int, ...] | None:
    """Characters in each segment of ``text`` stored as segments of ``sizes`` bytes."""
    if len(sizes) <= 1:
        return (len(text),) if sizes else ()
    data = encode_text(text)
    chars = []
    start = 0
    try:
        for size in sizes:
            chars.append(len(data[start : start + size].decode("utf-8", "surrogatepass")))
            start += size
    except UnicodeDecodeError:
        return None
    return tuple(chars)


class _RefusedPickle(ValueError):
    """diskcache was about to unpickle something found in the cache."""


class _PlainDisk(diskcache.Disk):  # type: ignore[misc]
    """A diskcache ``Disk`` that stores only bytes, str and int, and never unpickles.

    diskcache pickles any other key or value and unpickles what it reads back;
    a checkpoint directory must never execute code found in it, so both ways
    are refused here.
    """

    def put(self, key: Any) -> Any:
        if type(key) is not bytes:
            raise TypeError(f"checkpoint keys are bytes, got {type(key).__name__}")
        return super().put(key)

    def get(self, key: Any, raw: bool) -> Any:
        if not raw:
            raise _RefusedPickle("refusing to unpickle a key found in the checkpoint cache")
        return super().get(key, raw)

    def store(self, value: Any, read: bool, key: Any = diskcache.core.UNKNOWN) -> Any:
        if type(value) not in (bytes, str, int):
            raise TypeError(f"checkpoint values are bytes/str/int, got {type(value).__name__}")
        stored = super().store(value, read, key=key)
        filename = stored[2]
        if filename is not None:  # large values live in their own file: keep it private
            os.chmod(os.path.join(self._directory, filename), 0o600)
        return stored

    def fetch(self, mode: int, filename: Any, value: Any, read: bool) -> Any:
        if mode == diskcache.core.MODE_PICKLE:
            raise _RefusedPickle("refusing to unpickle a value found in the checkpoint cache")
        return super().fetch(mode, filename, value, read)


_KEY_ROWS = "SELECT key, raw FROM Cache ORDER BY rowid"
"""Every stored key as diskcache keeps it: the encoded key and whether it is raw (not pickled)."""


class _Waits(threading.local):
    """A thread's lock waits: unset attributes read as ``None`` from the class.

    Reading an attribute a thread never set from a plain ``threading.local``
    raises and discards an ``AttributeError`` (formatting its message), which
    the writer thread would pay on every transaction.
    """

    seconds: float | None = None
    """Seconds this thread's transactions may wait for a lock (``None``: the store's)."""
    polling: sqlite3.Connection | None = None
    """The connection whose busy timeout is left at 0 (WAL), if any."""


class _Cache(diskcache.Cache):  # type: ignore[misc]
    """diskcache's Cache, plus row-level access and transactions that poll for the lock.

    The row-level access is what unreadable entries need; `transact` waits for
    another process's transaction by trying again often, not by SQLite's sleeps.
    """

    _txn_id: int | None
    """The thread whose transaction is open (diskcache's own bookkeeping)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._waits = _Waits()

    @property
    def _con(self) -> sqlite3.Connection:
        """This thread's connection: diskcache's, without a system call per statement.

        diskcache opens one connection per thread and process, and checks the
        process id (``os.getpid``, a system call) at every statement; this reads
        the id kept up to date across ``fork`` instead, and leaves a new
        thread's or a forked child's first connection to diskcache.
        """
        local = self._local
        if getattr(local, "pid", None) == PROCESS[0]:
            con: sqlite3.Connection | None = getattr(local, "con", None)
            if con is not None:
                return con
        opened: sqlite3.Connection = diskcache.Cache._con.fget(self)
        return opened

    def wait_limit(self) -> float:
        """Seconds this thread's next transaction may wait for the write lock."""
        seconds: float | None = getattr(self._waits, "seconds", None)
        return float(self._timeout) if seconds is None else seconds

    @contextlib.contextmanager
    def waiting(self, seconds: float) -> Iterator[None]:
        """Let this thread's transactions wait at most ``seconds`` for a lock in the block."""
        before = self.wait_limit()
        self._waits.seconds = seconds
        try:
            yield
        finally:
            self._waits.seconds = before

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """Read outside a transaction, waiting for a lock as long as a transaction would.

        Outside a transaction SQLite's busy timeout is what waits (a reader of a
        WAL database meets a lock only while another connection recovers it
        after a crash); `_begin` may have left it at 0 or at a brief limit, so it
        is set here (one statement: these are listings and ``gc``, not puts).
        """
        if self._txn_id != threading.get_ident():  # inside a transaction it cannot wait
            self._con.execute(f"PRAGMA busy_timeout = {_milliseconds(self.wait_limit())}")
            self._waits.polling = None
        yield

    @contextlib.contextmanager
    def transact(self) -> Iterator[None]:
        """One transaction, begun by `_begin`; a nested block joins the open one.

        As diskcache's ``transact``, whose transactions its own methods join.
        """
        tid = threading.get_ident()
        if self._txn_id == tid:
            yield
            return
        self._begin()
        self._txn_id = tid
        try:
            yield
        except BaseException:
            self._txn_id = None
            self._sql("ROLLBACK")
            raise
        self._txn_id = None
        try:
            self._sql("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):  # not left open for the next transaction
                self._sql("ROLLBACK")
            raise

    def _begin(self) -> None:
        """``BEGIN IMMEDIATE``, trying again and again while another connection writes.

        SQLite's own busy handler sleeps 1, 2, 5, 10, 15, 20, 25, ... up to 100 ms
        between tries, so a writer that finds another process's group commit (about
        a millisecond) under way often sleeps tens of milliseconds past its end.
        This tries every `_POLL_FIRST` seconds at first, then after a
        `_POLL_SHARE`-th of the time waited so far (at most `_POLL_MAX`), until
        `wait_limit`: measured across 4 processes (``python -m
        benchmarks.lock_wait``), waits of 3.2-3.3 ms at p99 instead of 18.6-18.9 ms.

        SQLite's busy timeout must be 0 for a try to answer at once. In WAL mode
        it is left at 0: once a transaction holds the write lock none of its
        statements waits for another connection, and `reading` sets it back
        before a read outside a transaction. Setting it costs a statement, and
        each statement releases the GIL, which a writer thread behind a busy
        caller then waits up to a switch interval (5 ms) to take back.

        Raises:
            diskcache.Timeout: If the lock stayed taken for the whole limit.
        """
        connection: sqlite3.Connection = self._con
        execute = connection.execute
        limit = self.wait_limit()
        start = time.monotonic()
        kept = self._polling(connection)
        try:
            while True:
                try:
                    execute("BEGIN IMMEDIATE")
                    return
                except sqlite3.OperationalError as exc:
                    if not _busy(exc):
                        raise
                waited = time.monotonic() - start
                if waited >= limit:
                    raise diskcache.Timeout(f"the write lock stayed taken for {waited:.3f}s")
                time.sleep(min(max(_POLL_FIRST, waited / _POLL_SHARE), _POLL_MAX, limit - waited))
        finally:
            if not kept:  # not WAL: a commit may wait for readers, as long as the limit
                execute(f"PRAGMA busy_timeout = {_milliseconds(limit)}")

    def _polling(self, connection: sqlite3.Connection) -> bool:
        """Set ``connection``'s busy timeout to 0; return whether it may stay there (WAL)."""
        waits = self._waits
        if getattr(waits, "polling", None) is connection:
            return True
        connection.execute("PRAGMA busy_timeout = 0")
        (mode,) = connection.execute("PRAGMA journal_mode").fetchone()
        kept = str(mode).lower() == "wal"
        waits.polling = connection if kept else None
        return kept

    def key_rows(self) -> list[tuple[Any, int]]:
        """Return every stored key undecoded, so that one bad key cannot stop a listing."""
        return list(self._sql(_KEY_ROWS))

    def rows(self, keys: Sequence[bytes]) -> dict[bytes, tuple[int, Any]]:
        """Return ``key -> (mode, value)`` for the unexpired raw-keyed rows among ``keys``."""
        return _rows(self._sql, keys)

    def changed_rows(
        self, expected: Sequence[tuple[bytes, bytes | None]]
    ) -> dict[bytes, tuple[int, Any] | None]:
        """Return the rows among ``expected`` that differ (see `_changed_rows`)."""
        return _changed_rows(self._sql, expected)

    def remove_row(self, key: Any, raw: int) -> bool:
        """Remove the entry stored under an undecoded key; return whether there was one."""
        with self.transact():
            select = "SELECT filename FROM Cache WHERE key = ? AND raw = ?"
            files = [name for (name,) in self._sql(select, (key, raw)) if name]
            removed = self._sql("DELETE FROM Cache WHERE key = ? AND raw = ?", (key, raw)).rowcount
        for name in files:
            self._disk.remove(name)
        return bool(removed)


def _milliseconds(seconds: float) -> int:
    return max(0, round(seconds * 1000))


class _ReadOnlyCache:
    """The reads the store makes on a ``diskcache.Cache``, over an existing database.

    ``diskcache.Cache`` creates the directory and the database, and writes its
    settings, whenever it opens. This opens the existing database without the
    create flag and with ``PRAGMA query_only``: nothing in the directory is
    created, changed or re-permissioned (SQLite's -wal and -shm files exist only
    while the connection is open, as for any reader of a WAL database).
    """

    def __init__(self, directory: Path, *, timeout: float) -> None:
        db = directory / diskcache.core.DBNAME
        if not db.is_file():
            raise StreamCheckpointError(
                f"there is no checkpoint store at {directory} "
                + (f"(no {db.name} in it)" if directory.is_dir() else "(no such directory)")
            )
        self._disk = _PlainDisk(str(directory))
        uri = db.absolute().as_uri() + "?mode=rw"  # rw, not rwc: never creates the file
        self._connection = sqlite3.connect(
            uri, uri=True, timeout=timeout, isolation_level=None, check_same_thread=False
        )
        self._connection.execute("PRAGMA query_only = ON")
        self._lock = threading.RLock()  # one connection, shared by the async twins' threads
        self._created = False

    def _holds_table(self) -> bool:
        """Whether the database has its table yet (the lock held).

        A writer creates the database file, then its table: a reader that opens
        the file in between reads an empty store, not an error.
        """
        if not self._created:
            self._created = (
                self._connection.execute(
                    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'Cache'"
                ).fetchone()
                is not None
            )
        return self._created

    def close(self) -> None:
        with self._lock:
            self._connection.close()

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """Read outside a transaction: the connection keeps the store's busy timeout."""
        yield

    @contextlib.contextmanager
    def transact(self) -> Iterator[None]:
        """Read one consistent snapshot."""
        with self._lock:
            self._connection.execute("BEGIN")
            try:
                yield
            finally:
                self._connection.execute("COMMIT")

    def get(self, key: bytes, default: Any = None) -> Any:
        db_key, raw = self._disk.put(key)
        with self._lock:
            if not self._holds_table():
                return default
            row = self._connection.execute(
                "SELECT mode, filename, value FROM Cache WHERE key = ? AND raw = ? "
                "AND (expire_time IS NULL OR expire_time > ?)",
                (db_key, raw, time.time()),
            ).fetchone()
        if row is None:
            return default
        mode, filename, value = row
        try:
            return self._disk.fetch(mode, filename, value, False)
        except OSError:  # removed meanwhile, as diskcache.Cache.get treats it
            return default

    def __contains__(self, key: bytes) -> bool:
        return self.get(key) is not None

    def key_rows(self) -> list[tuple[Any, int]]:
        with self._lock:
            if not self._holds_table():
                return []
            return list(self._connection.execute(_KEY_ROWS))

    def rows(self, keys: Sequence[bytes]) -> dict[bytes, tuple[int, Any]]:
        with self._lock:
            if not self._holds_table():
                return {}
            return _rows(self._connection.execute, keys)


class DiskCacheStreamCheckpointStore(SegmentedCheckpointStore):
    """Checkpoints in a diskcache directory, safe for several processes on one host.

    Every claim, put and delete runs in one SQLite transaction
    (``Cache.transact``), so the fencing check and the write are atomic across
    processes. Values are JSON bytes (heads, epoch records), raw UTF-8 bytes
    (text segments) and one integer (the epoch floor); nothing is pickled, and
    a value diskcache would unpickle is refused on read. Eviction is disabled
    (``eviction_policy="none"``): diskcache never drops a checkpoint or an epoch
    record on its own; expiry is this store's ``ttl``, ``epoch_grace`` and
    :meth:`gc`.

    The directory is created private to the owner (0700). With ``read_only=True``
    the store opens an existing cache for reading and changes nothing on disk
    (no directory, file or permission change); writes are refused.

    Args:
        directory: The cache directory; dedicate it to checkpoints.
        ttl: Seconds after its last write when a checkpoint expires, or ``None``.
        max_checkpoint_bytes: Largest encoded checkpoint the store accepts.
        clock: Wall-clock time source, injectable for tests.
        timeout: Seconds a write waits for another process's transaction before
            failing with :class:`StreamCheckpointError`. It tries again every
            0.5 ms at first, less often the longer it waits (at most every
            25 ms), so it begins soon after the other transaction ends.
        epoch_grace: Seconds a run's epoch record outlives its last claim
            when nothing ends the run (a run that ends takes its record with it).
        signing_key: Key that signs every record this store writes and must
            verify every record it reads; ``None`` reads the
            ``AWAKEN_CHECKPOINT_SIGNING_KEY`` environment variable (unset: no
            signing). See "Trust model and signing" in docs/stores.md.
        read_only: Open an existing store for reading only.

    Raises:
        StreamCheckpointError: If the directory cannot be opened, or with
            ``read_only=True`` holds no checkpoint store.
    """

    takes_deferred: ClassVar[bool] = True
    """Its puts take a stream's captures unbuilt (see `StreamCheckpointStore.takes_deferred`)."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        ttl: float | None = None,
        max_checkpoint_bytes: int = DEFAULT_MAX_CHECKPOINT_BYTES,
        clock: Callable[[], float] = time.time,
        timeout: float = 60.0,
        epoch_grace: float = DEFAULT_EPOCH_GRACE,
        signing_key: str | bytes | None = None,
        read_only: bool = False,
    ) -> None:
        super().__init__(
            ttl=ttl,
            max_checkpoint_bytes=max_checkpoint_bytes,
            clock=clock,
            epoch_grace=epoch_grace,
            signing_key=signing_key,
        )
        self.directory = Path(directory)
        self.timeout = timeout
        self.read_only = read_only
        self._cache: Any
        with self._backend_errors("open", None):
            if read_only:
                self._cache = _ReadOnlyCache(self.directory, timeout=timeout)
                return
            make_private_directory(self.directory)
            make_private_database(self.directory / diskcache.core.DBNAME)
            self._cache = _Cache(
                str(self.directory),
                timeout=timeout,
                disk=_PlainDisk,
                eviction_policy="none",
                statistics=False,
            )

    def close(self) -> None:
        """Close the cache's database connection."""
        self._cache.close()

    def _backend_error(
        self, action: str, run_id: str | None, exc: Exception
    ) -> StreamCheckpointError:
        if not isinstance(exc, diskcache.Timeout):
            return super()._backend_error(action, run_id, exc)
        error = StreamCheckpointError(
            f"{action} waited more than timeout={self.timeout:g} s for another "
            f"process's transaction on {self.directory}; raise "
            "DiskCacheStreamCheckpointStore(timeout=...) or reduce the writers",
            run_id=run_id,
            cause=exc,
        )
        error.__cause__ = exc
        return error

    # -- keys -----------------------------------------------------------------

    @staticmethod
    def _head_key(run_id: str) -> bytes:
        return _run_keys(run_id)[0]

    @staticmethod
    def _epoch_key(run_id: str) -> bytes:
        return _run_keys(run_id)[1]

    @staticmethod
    def _segment_key(run_id: str, index: int) -> bytes:
        return _segment_key(_run_keys(run_id)[2], index)

    # -- reads inside a transaction ---------------------------------------------

    def _value(self, key: bytes, run_id: str, default: Any = None) -> Any:
        try:
            return self._cache.get(key, default)
        except _RefusedPickle as exc:
            raise corrupted(run_id, "it holds a pickled value, which is never unpickled") from exc

    def _epoch_record(self, run_id: str) -> tuple[int, float] | None:
        """Return the run's epoch counter and until when it is kept, or ``None``."""
        return self._parse_epoch_record(run_id, self._value(self._epoch_key(run_id), run_id))

    @staticmethod
    def _parse_epoch_record(run_id: str, value: Any) -> tuple[int, float] | None:
        if value is None:
            return None
        if type(value) is int and value >= 0:  # written by a release without epoch_grace
            return value, 0.0
        obj = decode_json(value, run_id=run_id) if type(value) is bytes else None
        epoch = obj.get("epoch") if isinstance(obj, dict) else None
        keep_until = obj.get("keep_until") if isinstance(obj, dict) else None
        if type(epoch) is not int or epoch < 0 or not isinstance(keep_until, int | float):
            raise corrupted(run_id, f"epoch record holds {type(value).__name__}, not a record")
        return epoch, float(keep_until)

    def _epoch(self, run_id: str) -> int:
        record = self._epoch_record(run_id)
        return 0 if record is None else record[0]

    def _set_epoch_record(self, run_id: str, epoch: int, keep_until: float) -> None:
        record = encode_json({"epoch": epoch, "keep_until": keep_until})
        self._cache.set(self._epoch_key(run_id), record)

    def _epoch_floor(self) -> int:
        value = self._value(_FLOOR, "epoch floor", 0)
        if type(value) is not int or value < 0:
            raise corrupted("epoch floor", f"the epoch floor holds {type(value).__name__}")
        return value

    def _head(self, run_id: str) -> Head | None:
        raw = self._value(self._head_key(run_id), run_id)
        if raw is None:
            return None
        if type(raw) is not bytes:
            raise corrupted(run_id, f"head holds {type(raw).__name__}, not JSON bytes")
        return decode_head(raw, run_id=run_id)

    @staticmethod
    def _segments(head: Head) -> list[int]:
        """Return the head's text segment sizes."""
        sizes = segment_sizes(head.extra)
        if sizes is None or sum(sizes) != head.text_bytes:
            raise corrupted(head.run_id, "head has no valid segment list")
        return sizes

    def _segment(self, run_id: str, index: int, size: int) -> bytes:
        value = self._value(self._segment_key(run_id, index), run_id)
        if type(value) is not bytes or len(value) != size:
            raise corrupted(run_id, f"text segment {index} is missing or has the wrong size")
        return value

    def _drop_segments(self, run_id: str, start: int, stop: int) -> None:
        for index in range(start, stop):
            self._cache.delete(self._segment_key(run_id, index))

    def _stored_segment_count(self, run_id: str) -> int:
        try:
            head = self._head(run_id)
            return 0 if head is None else len(self._segments(head))
        except StreamCheckpointError:
            return 0  # unreadable head: its segments stay until overwritten

    # -- primitives ---------------------------------------------------------------

    def _backend_claim(self, run_id: str) -> int:
        key = self._epoch_key(run_id)
        with self._cache.transact():
            rows = self._cache.rows([key, _FLOOR])  # both in one statement
            record, floor = rows.get(key), rows.get(_FLOOR)
            if (record is None or record[0] == _MODE_RAW) and (
                floor is None or (floor[0] == _MODE_RAW and type(floor[1]) is int and floor[1] >= 0)
            ):
                parsed = self._parse_epoch_record(run_id, None if record is None else record[1])
                current = 0 if parsed is None else parsed[0]
                epoch = next_epoch(current, 0 if floor is None else floor[1])
                value = encode_json({"epoch": epoch, "keep_until": self._keep_until()})
                now = time.time()
                self._cache._sql(_UPSERT_ROW, (key, now, now, value))
                return epoch
            epoch = next_epoch(self._epoch(run_id), self._epoch_floor())  # reports what is wrong
            self._set_epoch_record(run_id, epoch, self._keep_until())
        return epoch

    def _backend_collect_epochs(self) -> None:
        with self._cache.reading():
            keys = [  # raw rows only: a pickled key planted in the cache is never unpickled
                bytes(key)
                for key, raw in self._cache.key_rows()
                if raw and bytes(key).startswith(_EPOCH)
            ]
        for start in range(0, len(keys), _COLLECT_BATCH):
            now = self.clock()
            with self._cache.transact():
                floor = old_floor = self._epoch_floor()
                for key in keys[start : start + _COLLECT_BATCH]:
                    run_id = key[len(_EPOCH) :].decode("utf-8", "surrogatepass")
                    try:
                        record = self._epoch_record(run_id)
                    except StreamCheckpointError:
                        continue  # unreadable: kept, and fences its run as corrupted
                    if record is None or now <= record[1] or self._head_key(run_id) in self._cache:
                        continue
                    floor = max(floor, record[0])
                    self._cache.delete(key)
                if floor != old_floor:
                    self._cache.set(_FLOOR, floor)

    def _backend_replace(self, head: Head, text: bytes, epoch: int) -> Head:
        run_id = head.run_id
        sizes = [len(text)] if text else []
        stored = head if head.extra.get("segments") == sizes else head.with_extra(segments=sizes)
        with self._cache.transact():
            check_epoch(run_id, epoch, self._epoch(run_id), action="put", floor=self._epoch_floor)
            old_count = self._stored_segment_count(run_id)
            if text:
                self._cache.set(self._segment_key(run_id, 0), text)
            self._drop_segments(run_id, len(sizes), old_count)
            self._cache.set(self._head_key(run_id), stored.encode())
        return stored

    def _backend_append(
        self, head: Head, delta: bytes, epoch: int, expect: LastWrite
    ) -> Head | None:
        run_id = head.run_id
        with self._cache.transact():
            check_epoch(run_id, epoch, self._epoch(run_id), action="put", floor=self._epoch_floor)
            try:
                current = self._head(run_id)
                if current is None or current.write_id != expect.write_id:
                    return None
                sizes = self._segments(current)
            except StreamCheckpointError:
                return None  # unreadable: the caller rewrites the whole record
            first, new_sizes = plan_append(sizes, len(delta))
            if delta:
                merged = [self._segment(run_id, i, sizes[i]) for i in range(first, len(sizes))]
                merged.append(delta)
                self._cache.set(self._segment_key(run_id, first), b"".join(merged))
                self._drop_segments(run_id, len(new_sizes), len(sizes))
            stored = (
                head
                if head.extra.get("segments") == new_sizes
                else head.with_extra(segments=new_sizes)
            )
            self._cache.set(self._head_key(run_id), stored.encode())
        return stored

    def _backend_load(self, run_id: str) -> tuple[Head, bytes] | None:
        if not self._cache.rows([self._head_key(run_id)]):  # one statement for a new run
            self._raise_if_unreadable(run_id)
            return None
        with self._cache.transact():
            head = self._head(run_id)
            if head is None:
                self._raise_if_unreadable(run_id)
                return None
            sizes = self._segments(head)
            text = b"".join(self._segment(run_id, i, n) for i, n in enumerate(sizes))
        return head, text

    def _backend_delete(
        self, run_id: str, epoch: int | None, condition: Callable[[Head], bool] | None
    ) -> bool:
        with self._cache.transact():
            if epoch is not None:
                check_epoch(
                    run_id, epoch, self._epoch(run_id), action="delete", floor=self._epoch_floor
                )
            key = self._head_key(run_id)
            if key not in self._cache:
                located = self._unreadable_row(run_id)
                if located is None:
                    self._end_record(run_id, epoch, None, removed=False)
                    return False
                return bool(self._cache.remove_row(*located))
            head = None
            if condition is not None or epoch is None:
                with contextlib.suppress(StreamCheckpointError):  # unreadable: not ours to judge
                    head = self._head(run_id)
            if condition is not None and (head is None or not condition(head)):
                return False
            count = self._stored_segment_count(run_id)
            self._cache.delete(key)
            self._drop_segments(run_id, 0, count)
            self._end_record(run_id, epoch, head, removed=True, expired=condition is not None)
        return True

    def _end_record(
        self,
        run_id: str,
        epoch: int | None,
        deleted: Head | None,
        *,
        removed: bool,
        expired: bool = False,
    ) -> None:
        """After a delete, in its transaction: end the run's epoch record if the run is over.

        Otherwise a record whose checkpoint was ``removed`` is kept on for
        ``epoch_grace``. An unreadable record stays.
        """
        try:
            record = self._epoch_record(run_id)
        except StreamCheckpointError:
            return
        if record is None:
            return
        if self._ends_record(record[0], epoch, deleted, expired=expired):
            floor = self._epoch_floor()
            if record[0] > floor:
                self._cache.set(_FLOOR, record[0])
            self._cache.delete(self._epoch_key(run_id))
        elif removed:
            keep_until = max(record[1], self._keep_until(deleted if expired else None))
            self._set_epoch_record(run_id, record[0], keep_until)

    def _backend_heads(self) -> Iterable[tuple[str, bytes]]:
        with self._cache.reading():
            return self._heads()

    def _heads(self) -> list[tuple[str, bytes]]:
        found = []
        for key, raw in self._cache.key_rows():
            if not raw:  # a pickled key: never unpickled, listed so that it can be removed
                found.append((unreadable_id(b"\x00" + bytes(key)), b""))
                continue
            if type(key) is not bytes or not key.startswith(_HEAD):
                continue  # a text segment, an epoch counter, or a key this store never writes
            try:
                run_id = key[len(_HEAD) :].decode("utf-8", "surrogatepass")
            except UnicodeDecodeError:
                found.append((unreadable_id(b"\x01" + key), b""))
                continue
            try:
                value = self._cache.get(key)
            except _RefusedPickle:
                value = b""  # refused (pickled): listed as unreadable
            if value is not None:
                found.append((run_id, value if type(value) is bytes else b""))
        return found

    # -- entries whose run id cannot be read ----------------------------------------

    @staticmethod
    def _unreadable_key(run_id: str) -> tuple[bytes, int] | None:
        """Return the undecoded key and raw flag an unreadable entry's id names."""
        locator = unreadable_locator(run_id)
        if not locator or locator[0] not in (0, 1):
            return None
        key, raw = locator[1:], locator[0]
        if raw:  # a raw key is unreadable only if it is a head key that is not UTF-8
            try:
                key[len(_HEAD) :].decode("utf-8", "surrogatepass")
                return None
            except UnicodeDecodeError:
                if not key.startswith(_HEAD):
                    return None
        return key, raw

    def _unreadable_row(self, run_id: str) -> tuple[bytes, int] | None:
        """Return the stored entry an unreadable entry's id names, if it is still there."""
        located = self._unreadable_key(run_id)
        if located is None:
            return None
        key, raw = located
        with self._cache.reading():
            if raw:
                return located if key in self._cache else None
            rows = self._cache.key_rows()
        return located if any(bytes(k) == key for k, r in rows if not r) else None

    def _raise_if_unreadable(self, run_id: str) -> None:
        located = self._unreadable_row(run_id)
        if located is None:
            return
        if located[1]:
            raise corrupted(run_id, "its key names no UTF-8 run id; remove the entry with delete")
        raise corrupted(
            run_id, "its key is pickled, which is never unpickled; remove the entry with delete"
        )

    def _delete_written(self, run_id: str, epoch: int | None, last: LastWrite) -> bool:
        """Delete a run this store wrote last without reading its record back.

        ``False``: the record is not as written (or kept in files); use the general path.
        """
        state = last.state
        if not isinstance(state, _Stored) or epoch is None:
            return False  # a delete without epoch reads the head: it may end the record
        sizes = last.extra.get("segments")
        if not isinstance(sizes, list) or any(
            type(n) is not int or n >= self._cache.disk.min_file_size for n in sizes
        ):
            return False
        head_key, epoch_key = self._head_key(run_id), self._epoch_key(run_id)
        with self._cache.transact():
            rows = self._cache.rows([epoch_key, head_key])
            head, record = rows.get(head_key), rows.get(epoch_key)
            if head != (_MODE_RAW, state.head) or (record is not None and record[0] != _MODE_RAW):
                return False
            try:
                parsed = self._parse_epoch_record(run_id, None if record is None else record[1])
            except StreamCheckpointError:
                return False  # the general path reports or keeps an unreadable record
            counter = 0 if parsed is None else parsed[0]
            check_epoch(run_id, epoch, counter, action="delete", floor=self._epoch_floor)
            keys = [head_key, *(self._segment_key(run_id, i) for i in range(len(sizes)))]
            if counter > 0:  # the owner ends its run: its epoch record ends with it
                keys.append(epoch_key)
                if counter > self._epoch_floor():
                    self._cache.set(_FLOOR, counter)
            self._cache._sql(_DELETE_ROWS.format(",".join("?" * len(keys))), keys)
        return True

    # -- layout known before the head is encoded -------------------------------------

    def _finish_put(self, plan: PutPlan, stored: Head, state: Any = None) -> None:
        """Remember a put of the general path, with what the next put needs to skip it."""
        sizes = stored.extra.get("segments")
        chars = _segment_chars(plan.text.whole(), sizes) if isinstance(sizes, list) else None
        if chars is not None:
            state = _Stored(stored.encode(), chars, None, None, _run_keys(plan.run_id))
        super()._finish_put(plan, stored, state)

    # -- group commit ---------------------------------------------------------------

    def put(self, checkpoint: StreamCheckpoint | DeferredCheckpoint) -> None:
        """Store the checkpoint, writing only the new text when it extends the last.

        Raises:
            StreamCheckpointFencedError: If ``checkpoint.epoch`` is older than the
                run's current epoch.
            StreamCheckpointError: If the epoch was never claimed, the encoded
                record exceeds ``max_checkpoint_bytes``, or the database fails.
        """
        (error,) = self.put_many([checkpoint])
        if error is not None:
            raise error

    def put_many(
        self, checkpoints: Sequence[StreamCheckpoint | DeferredCheckpoint]
    ) -> list[StreamCheckpointError | None]:
        """Store several runs' checkpoints in one SQLite transaction (group commit).

        Each checkpoint is put as `put` would, its fencing check inside the
        transaction. A checkpoint refused on its own (fenced, too large, an
        unreadable record) is reported and the others are written; such refusals
        happen before the refused checkpoint writes anything. A failure of the
        database itself (a lock wait past ``timeout``, a full disk) rolls the
        whole batch back and is reported for every checkpoint.

        The common case costs a few statements for the whole batch: a run this
        store wrote last, or a new run, is written without reading its record
        back. One ``SELECT`` reads the epoch records and heads of those runs; a
        run whose head row still holds exactly the bytes written last (and so
        the text and segments written last), or still has no head, and whose
        epoch passes the fencing rule gets
        its new tail segment and head in one multi-row upsert, and its merged-away
        segments removed in one ``DELETE``. Every other checkpoint (a run not
        written by this store instance, written by someone else since, or whose
        write would replace or create a segment large enough for diskcache to
        keep in a file; the older segments of a long turn stay where they are)
        is put through the general path, which reads the record, in the same
        transaction.

        Returns:
            For each checkpoint, in order, ``None`` or the error its put raised.
        """
        errors = self._put_many(checkpoints, none_if_busy=False)
        assert errors is not None
        return errors

    def put_many_now(
        self, checkpoints: Sequence[StreamCheckpoint | DeferredCheckpoint]
    ) -> list[StreamCheckpointError | None] | None:
        """`put_many`, unless another connection holds the write lock: then ``None``.

        The transaction waits at most `BRIEF_WAIT` for another connection's
        transaction (`_Cache.waiting`, for this attempt). Once begun it
        cannot wait for a lock again: in WAL mode the writer holding the write
        lock needs no other lock to commit, and the checkpoint SQLite may run
        after the commit is passive. A ``None`` means nothing was written.
        """
        if self.read_only:
            return self.put_many(checkpoints)  # refused, as put_many refuses
        with self._cache.waiting(BRIEF_WAIT):
            return self._put_many(checkpoints, none_if_busy=True)

    def call_now(self, action: Callable[[], T]) -> tuple[bool, T | None]:
        """Run ``action``, waiting at most `BRIEF_WAIT` for a lock: ``(False, None)`` if taken.

        Each operation of the store is one transaction begun with the write
        lock (``BEGIN IMMEDIATE``; reads too, for one consistent snapshot), so
        one that finds the lock taken makes no change.
        """
        if self.read_only:
            return True, action()  # reads only: nothing waits for a lock
        with self._cache.waiting(BRIEF_WAIT):
            try:
                return True, action()
            except StreamCheckpointError as exc:
                if _lock_taken(exc.cause):
                    return False, None
                raise

    def _put_many(
        self, checkpoints: Sequence[StreamCheckpoint | DeferredCheckpoint], *, none_if_busy: bool
    ) -> list[StreamCheckpointError | None] | None:
        if not checkpoints:
            return []
        errors: list[StreamCheckpointError | None] = [None] * len(checkpoints)
        plans: list[tuple[int, PutPlan]] = []
        for index, checkpoint in enumerate(checkpoints):  # encoded before the lock is taken
            try:
                plans.append((index, self._prepare_put(checkpoint)))
            except StreamCheckpointError as exc:
                errors[index] = exc
        if not plans:
            return errors
        distinct = len({plan.run_id for _, plan in plans}) == len(plans)
        layouts: dict[int, _Layout] = {}  # planned by the guarded statement, kept for the rest
        if distinct and len(plans) <= _GUARDED_RUNS:
            try:
                left = self._put_guarded(plans, layouts)
            except StreamCheckpointError as exc:  # the database failed, as a transaction's would
                return [exc] * len(checkpoints)
            if left is not None:
                if not left:
                    return errors
                plans = left
        lean: list[tuple[int, PutPlan]] = []
        general: list[tuple[int, PutPlan]] = []
        for index, plan in plans:
            known = plan.last is None or isinstance(plan.last.state, _Stored)
            (lean if distinct and known else general).append((index, plan))
        written: list[tuple[PutPlan, Head]] = []
        leaned: list[tuple[str, LastWrite]] = []
        try:
            with self._backend_errors("put", None), self._cache.transact():
                if lean:
                    general.extend(self._put_lean(lean, errors, leaned, layouts))
                for index, plan in general:
                    try:
                        # nested: joins the open transaction
                        with self._backend_errors("put", plan.run_id):
                            written.append((plan, self._put_plan(plan)))
                    except StreamCheckpointError as exc:
                        if isinstance(exc.cause, sqlite3.Error | OSError | diskcache.Timeout):
                            raise  # the database failed: roll the batch back
                        errors[index] = exc
        except StreamCheckpointError as exc:
            if none_if_busy and _lock_taken(exc.cause):
                return None  # rolled back, or never begun: nothing was written
            return [exc] * len(checkpoints)
        # remembered once committed
        self._remember_all(leaned)
        for plan, stored in written:
            self._finish_put(plan, stored)
        return errors

    def _put_guarded(
        self, plans: list[tuple[int, PutPlan]], layouts: dict[int, _Layout]
    ) -> list[tuple[int, PutPlan]] | None:
        """Write a group commit of runs this store wrote last in one guarded statement.

        Each put appends to (or rewrites) the record this store remembers
        (``plan.last.state`` is its `_Stored`); the statement writes a run's
        rows only while its head and epoch record rows hold what this store
        last saw (`_GUARDED_UPSERT`), so it needs no transaction of its own
        statements: ``BEGIN IMMEDIATE``, the read-back and ``COMMIT`` are three
        statements, and releases of the GIL, fewer per commit. The fencing rule
        is applied to the remembered epoch record, which the guard proves current.

        Returns:
            ``None`` when a put does not qualify (a run not written last by this
            store, a rule that needs the epoch floor, a record to shrink, a row
            diskcache would keep in a file, more rows than one statement takes)
            or the write lock is taken: nothing was written, and the caller's
            transaction writes them all. Else the puts whose guard failed (a
            record someone else changed), for the caller's transaction; the rest
            were written and remembered.
        """
        largest = self._cache.disk.min_file_size
        params: list[Any] = []
        rows = 0
        leaned: list[tuple[int, PutPlan, bytes, LastWrite]] = []
        for index, plan in plans:
            last = plan.last
            if last is None or not isinstance(last.state, _Stored):
                return None
            state: _Stored = last.state
            record = state.epoch_record
            try:
                check_epoch(
                    plan.run_id,
                    plan.epoch,
                    0 if record is None else record[0],
                    action="put",
                    floor=_floor_unknown,
                )
                step = layouts[index] = self._lean_layout(plan, state, state.keys[2], largest)
            except (StreamCheckpointError, _FloorUnknown):
                return None  # the transaction decides, reading the rows
            if step is None or step[5]:
                return None
            head, text_bytes, sizes, chars, new_rows, _ = step
            head_key, epoch_key, _ = state.keys
            expected = (head_key, state.head, epoch_key, state.epoch_row)
            for key, value in (*new_rows, (head_key, head)):
                params += (key, value, *expected)
            rows += len(new_rows) + 1
            stored = _Stored(head, chars, state.epoch_row, record, state.keys)
            leaned.append((index, plan, head_key, _lean_write(plan, text_bytes, sizes, stored)))
        if rows > _ROWS_PER_UPSERT:
            return None
        cache = self._cache
        if cache._txn_id is not None:  # inside another operation's transaction
            return None
        params.append(time.time())
        statement = _guarded_upsert(rows)
        with self._backend_errors("put", None):
            connection: sqlite3.Connection = cache._con
            cache._polling(connection)  # a taken lock answers at once
            try:
                changed = connection.execute(statement, params).rowcount
            except sqlite3.OperationalError as exc:
                if _busy(exc):
                    return None
                raise
            if changed == rows:
                self._remember_all((plan.run_id, written) for _, plan, _, written in leaned)
                return []
            # a guard failed: the runs whose heads are not the ones written go on
            heads = [(key, written.state.head) for _, _, key, written in leaned]
            differ = cache.changed_rows(heads)
        self._remember_all(
            (plan.run_id, written) for _, plan, key, written in leaned if key not in differ
        )
        return [(index, plan) for index, plan, key, _ in leaned if key in differ]

    def _put_lean(
        self,
        plans: list[tuple[int, PutPlan]],
        errors: list[StreamCheckpointError | None],
        leaned: list[tuple[str, LastWrite]],
        layouts: dict[int, _Layout],
    ) -> list[tuple[int, PutPlan]]:
        """Write, inside the open transaction, the puts that need no read-back.

        Each is a run this store wrote last (``plan.last.state`` is its `_Stored`)
        or a run it never wrote; one statement checks that nobody changed their
        heads or epoch records since (`_changed_rows`). A put then writes its
        new tail segment and head, planned from what this store remembers: an
        append when the text extends the text written last, else a rewrite.
        Appends ``(run id, what was written)`` to ``leaned``, sets ``errors``
        for refused puts (fenced, too large), and returns the puts that need
        the general path: a record someone else changed, or a segment or head
        large enough for diskcache to keep in a file.
        """
        expected: list[tuple[bytes, bytes | None]] = []
        keyed: list[tuple[int, PutPlan, _Stored | None, tuple[bytes, bytes, bytes]]] = []
        for index, plan in plans:
            last = plan.last
            if last is None:  # a run this store has not written: lean only if it has no head
                keys = _run_keys(plan.run_id)
                expected += ((keys[0], None), (keys[1], None))
                keyed.append((index, plan, None, keys))
            else:
                stored: _Stored = last.state
                keys = stored.keys
                expected += ((keys[0], stored.head), (keys[1], stored.epoch_row))
                keyed.append((index, plan, stored, keys))
        changed = self._cache.changed_rows(expected)
        now = time.time()
        largest = self._cache.disk.min_file_size
        upserts: list[Any] = []  # the parameters of the upserted rows, flat
        deletes: list[bytes] = []
        fallback = []
        for index, plan, state, (head_key, epoch_key, prefix) in keyed:
            run_id = plan.run_id
            if head_key in changed:  # not as this store left it (or a new run's head exists)
                fallback.append((index, plan))
                continue
            if epoch_key in changed:
                epoch_row = changed[epoch_key]
                if epoch_row is not None and epoch_row[0] != _MODE_RAW:
                    fallback.append((index, plan))
                    continue
                epoch_value = None if epoch_row is None else epoch_row[1]
                record = None
            else:
                epoch_value = None if state is None else state.epoch_row
                record = None if state is None else state.epoch_record
            try:
                if record is None:
                    record = self._parse_epoch_record(run_id, epoch_value)
                check_epoch(
                    run_id,
                    plan.epoch,
                    0 if record is None else record[0],
                    action="put",
                    floor=self._epoch_floor,
                )
                step = (
                    layouts[index]
                    if index in layouts
                    else self._lean_layout(plan, state, prefix, largest)
                )
            except StreamCheckpointError as exc:
                errors[index] = exc
                continue
            if step is None:
                fallback.append((index, plan))
                continue
            head, text_bytes, sizes, chars, rows, stale = step
            for key, value in rows:
                upserts += (key, now, now, value)
            upserts += (head_key, now, now, head)
            deletes += stale
            now_stored = _Stored(head, chars, epoch_value, record, (head_key, epoch_key, prefix))
            leaned.append((run_id, _lean_write(plan, text_bytes, sizes, now_stored)))
        per_statement = _ROWS_PER_UPSERT * 4
        for start in range(0, len(upserts), per_statement):
            params = upserts[start : start + per_statement]
            placeholders = ",".join([_UPSERT_VALUES] * (len(params) // 4))
            self._cache._sql(_UPSERT_ROWS.format(placeholders), params)
        for start in range(0, len(deletes), _KEYS_PER_SELECT):
            gone = deletes[start : start + _KEYS_PER_SELECT]
            self._cache._sql(_DELETE_ROWS.format(",".join("?" * len(gone))), gone)
        return fallback

    def _lean_layout(
        self, plan: PutPlan, state: _Stored | None, prefix: bytes, largest: int
    ) -> _Layout:
        """Plan one put over the record this store last wrote (``state``), or a new record.

        Returns:
            The encoded head, the text's encoded length, its segment sizes and
            characters per segment, the segment rows to write and the segment
            keys to remove; ``None`` when the general path must write it (a
            segment or head diskcache would keep in a file).

        Raises:
            StreamCheckpointError: If the record would exceed ``max_checkpoint_bytes``.
        """
        last = plan.last
        sizes: list[int] = [] if last is None else last.extra["segments"]
        chars: tuple[int, ...] = () if state is None else state.chars
        rows: list[tuple[bytes, bytes]] = []
        append = self._append_delta(plan)
        if last is not None and append is not None:  # append the new text to the tail
            delta, text_hash, added = append
            text_bytes = last.text_bytes + len(delta)
            first, new_sizes = plan_append(sizes, len(delta))
            if delta:
                tail = sum(chars[first:]) + added  # the merged segments' characters and the new
                merged = encode_text(plan.text.last(tail))
                if len(merged) != new_sizes[first] or len(merged) >= largest:
                    # it holds every segment it replaces: none of them is a file when it
                    # is small enough to be a row, and the segments before stay as they are
                    return None
                chars = (*chars[:first], tail)
                rows.append((_segment_key(prefix, first), merged))
        else:  # rewrite the whole text as one segment
            if sizes and max(sizes) >= largest:
                return None  # a segment it replaces is a file: the general path removes it
            data, text_hash = self._rewrite_text(plan)
            if len(data) >= largest:
                return None
            text_bytes = len(data)
            new_sizes = [text_bytes] if data else []
            chars = (len(plan.text.whole()),) if data else ()
            if data:
                rows.append((_segment_key(prefix, 0), data))
        head = self._layout_head(plan, text_bytes, new_sizes, text_hash)
        self._check_encoded_size(plan.run_id, len(head) + text_bytes)
        if len(head) >= largest:
            return None
        stale = [_segment_key(prefix, i) for i in range(len(new_sizes), len(sizes))]
        return head, text_bytes, new_sizes, chars, rows, stale


__all__ = ["DiskCacheStreamCheckpointStore"]
