"""A checkpoint store on PostgreSQL, for workers that already share a database.

Four tables, named after the store's ``table`` prefix (default ``awaken_checkpoints``)::

    <table>             run_id bytea PK, head bytea (the JSON head, see stores/_base.py),
                        write_id text (the write that produced it)
    <table>_segments    run_id bytea, seq int, data bytea: the text as UTF-8, in segments
    <table>_epochs      run_id bytea PK, counter bigint, keep_until float: the fencing
                        counter and until when it must be kept
    <table>_floor       one row: the epoch floor (see stores/_base.py, "Epoch records")

plus ``<table>_schema``, the version of this layout: the first store to use a
database creates the tables, and a later release upgrades them in place, one
migration after the other, under an advisory lock.

Every write is one transaction that reads the run's epoch counter (``FOR
SHARE``; a claim updates the row and so waits for the write to commit, and the
write for the claim) and only then touches the head and text, so a stale writer
is refused even when it races the new owner from another host. A put that
extends the text sends only the new bytes: it appends a segment, and merges the
last few segments the way :func:`~awaken_langchain.stores._base.plan_append`
plans (a run keeps O(log n) segments, each byte is rewritten O(log n) times), and
only if the stored ``write_id`` is still the one the writer remembers.

Run ids are stored as bytes (lone surrogates kept) and always sent as query
parameters, never as SQL text. Every statement runs under the store's
``statement_timeout`` and every connection is waited for at most ``timeout``
seconds, so a hung database costs an operation at most that long.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

try:
    import psycopg
    import psycopg_pool
    from psycopg import sql
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "PostgresStreamCheckpointStore needs the psycopg and psycopg-pool packages; "
        "install them with: pip install 'awaken-langchain[postgres]'"
    ) from exc

from awaken_langchain._secrets import redact
from awaken_langchain.checkpoint import (
    DEFAULT_MAX_CHECKPOINT_BYTES,
)
from awaken_langchain.errors import StreamCheckpointError
from awaken_langchain.stores._base import (
    DEFAULT_EPOCH_GRACE,
    Head,
    LastWrite,
    SegmentedCheckpointStore,
    check_epoch,
    connection_failure,
    decode_head,
    next_epoch,
    plan_append,
    run_id_bytes,
    segment_sizes,
)

__all__ = ["SCHEMA_VERSION", "PostgresStreamCheckpointStore"]

SCHEMA_VERSION = 2
"""The table layout this release writes; older layouts are upgraded in place.

Version 2 adds the readers' event logs (``<table>_events``, ``<table>_runlogs``)."""

_TABLE_NAME = re.compile(r"[a-z_][a-z0-9_]{0,40}")

_ERRORS: tuple[type[BaseException], ...] = (psycopg.Error, psycopg_pool.PoolTimeout, OSError)
"""What a database call raises when the server, network or data fails."""


def _migrations(names: dict[str, sql.Identifier]) -> list[list[sql.Composed]]:
    """The statements that bring the layout from version ``i`` to ``i + 1``, per ``i``."""
    return [
        [
            sql.SQL(
                "CREATE TABLE {heads} (run_id bytea PRIMARY KEY, head bytea NOT NULL, "
                "write_id text NOT NULL)"
            ).format(**names),
            sql.SQL(
                "CREATE TABLE {segments} (run_id bytea NOT NULL, seq integer NOT NULL, "
                "data bytea NOT NULL, PRIMARY KEY (run_id, seq))"
            ).format(**names),
            sql.SQL(
                "CREATE TABLE {epochs} (run_id bytea PRIMARY KEY, counter bigint NOT NULL, "
                "keep_until double precision NOT NULL)"
            ).format(**names),
            sql.SQL(
                "CREATE TABLE {floor} (id integer PRIMARY KEY CHECK (id = 1), "
                "floor bigint NOT NULL)"
            ).format(**names),
            sql.SQL("INSERT INTO {floor} VALUES (1, 0)").format(**names),
        ],
        [
            sql.SQL(
                "CREATE TABLE {runlogs} (run_id bytea PRIMARY KEY, length bigint NOT NULL, "
                "stop boolean NOT NULL, watched_at double precision NOT NULL, "
                "ended_at double precision)"
            ).format(**names),
            sql.SQL(
                "CREATE TABLE {events} (run_id bytea NOT NULL, seq bigint NOT NULL, "
                "event bytea NOT NULL, PRIMARY KEY (run_id, seq))"
            ).format(**names),
        ],
    ]


class PostgresStreamCheckpointStore(SegmentedCheckpointStore):
    """Keeps checkpoints in PostgreSQL so that workers on several hosts can share them.

    Give either a ``dsn`` (the store creates, owns and closes a connection pool)
    or a ready ``psycopg_pool.ConnectionPool`` (borrowed: the store never
    closes it). The tables are created on first use (see the module docstring).
    The async methods run the sync methods in a worker thread, on the same
    pool, whichever event loop calls them.

    Example:
        ```python
        store = PostgresStreamCheckpointStore("postgresql://app@db/app", ttl=3600)
        ```

    Args:
        dsn: A libpq connection string: ``postgresql://user:password@host:5432/db``
            or ``host=... dbname=...``.
        pool: A ``psycopg_pool.ConnectionPool`` to use instead of a DSN (borrowed).
        table: Name of the store's main table; the others get it as prefix.
        schema: The PostgreSQL schema of the tables (``None``: the search path).
        ttl: Seconds after its last write when a checkpoint expires, or ``None``.
        max_checkpoint_bytes: Largest encoded checkpoint the store accepts.
        clock: Wall-clock time source for ``updated_at``, expiry and epoch records.
        timeout: Seconds any one operation may take: the statement timeout, the
            wait for a pooled connection and (at least 2 s) the connect timeout.
        max_connections: Connections the store's own pool opens at most.
        epoch_grace: Seconds a run's epoch record outlives its checkpoint and
            its last claim.
        signing_key: Key that signs every record this store writes and must
            verify every record it reads; ``None`` reads the
            ``AWAKEN_CHECKPOINT_SIGNING_KEY`` environment variable (unset: no
            signing). See "Trust model" in the README.

    Raises:
        ValueError: If there is no connection or both a DSN and a pool, or
            ``table``/``schema`` is not a plain lower-case identifier.
    """

    takes_deferred: ClassVar[bool] = True
    """Its puts take a stream's captures unbuilt (see `StreamCheckpointStore.takes_deferred`)."""

    def __init__(
        self,
        dsn: str | None = None,
        *,
        pool: Any = None,
        table: str = "awaken_checkpoints",
        schema: str | None = None,
        ttl: float | None = None,
        max_checkpoint_bytes: int = DEFAULT_MAX_CHECKPOINT_BYTES,
        clock: Callable[[], float] = time.time,
        timeout: float = 5.0,
        max_connections: int = 10,
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
        if (dsn is None) == (pool is None):
            raise ValueError(
                "PostgresStreamCheckpointStore needs exactly one connection: "
                "dsn='postgresql://user@host/db' or pool=psycopg_pool.ConnectionPool(...)"
            )
        for setting, name in (("table", table), ("schema", schema)):
            if name is not None and not _TABLE_NAME.fullmatch(name):
                raise ValueError(
                    f"{setting} must be a lower-case identifier of at most 41 characters "
                    f"(letters, digits, underscores), got {name!r}"
                )
        if not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self.read_only = read_only
        self.table = table
        self.timeout = float(timeout)
        self.dsn = dsn
        self._where = redact(dsn) if dsn is not None else "the given connection pool"
        self._owns_pool = pool is None
        timeout_ms = str(max(1, round(self.timeout * 1000)))
        self._session_timeouts = pool is not None
        self._timeout_ms = timeout_ms
        self._connect_kwargs: dict[str, Any] = {
            "connect_timeout": max(2, round(self.timeout)),
            "options": f"-c statement_timeout={timeout_ms} -c lock_timeout={timeout_ms}",
        }
        self._connect_error: BaseException | None = None
        """Why the store's own pool last failed to connect (it retries in the background)."""
        if pool is None:
            pool = psycopg_pool.ConnectionPool(
                dsn or "",
                connection_class=self._recording_connection_class(),
                min_size=1,
                max_size=max_connections,
                open=False,
                timeout=self.timeout,
                kwargs=self._connect_kwargs,
            )
        self._pool = pool
        self._opened = False
        self._ready = False
        self._ready_lock = threading.Lock()

        def identifier(suffix: str) -> sql.Identifier:
            full = table + suffix
            return sql.Identifier(schema, full) if schema else sql.Identifier(full)

        self._names = {
            "heads": identifier(""),
            "segments": identifier("_segments"),
            "epochs": identifier("_epochs"),
            "floor": identifier("_floor"),
            "version": identifier("_schema"),
            "runlogs": identifier("_runlogs"),
            "events": identifier("_events"),
        }
        self._sql = {key: sql.SQL(text).format(**self._names) for key, text in _STATEMENTS.items()}

    # -- connections, schema, errors ------------------------------------------------

    def _recording_connection_class(self) -> type[Any]:
        """A connection class that remembers, in this store, why a connection failed."""
        store = self

        class RecordingConnection(psycopg.Connection[Any]):
            @classmethod
            def connect(cls, *args: Any, **kwargs: Any) -> Any:
                try:
                    connection = super().connect(*args, **kwargs)
                except psycopg.Error as exc:
                    store._connect_error = exc
                    raise
                store._connect_error = None
                return connection

        return RecordingConnection

    @contextlib.contextmanager
    def _connection(self) -> Iterator[Any]:
        """A pooled connection in a transaction, the schema ready (commits on success)."""
        if not self._opened and self._owns_pool:
            with self._ready_lock:
                if not self._opened:
                    self._pool.open(wait=False)
                    self._opened = True
        with self._pool.connection(timeout=self.timeout) as conn:
            if self._session_timeouts:
                conn.execute(
                    "SELECT set_config('statement_timeout', %s, true), "
                    "set_config('lock_timeout', %s, true)",
                    (self._timeout_ms, self._timeout_ms),
                )
            if not self._ready:
                self._migrate(conn)
            yield conn

    def _migrate(self, conn: Any) -> None:
        """Create or upgrade the tables to :data:`SCHEMA_VERSION` (once per store)."""
        with self._ready_lock:
            if self._ready:
                return
            version_table = self._names["version"]
            if self.read_only:
                found = conn.execute(
                    "SELECT to_regclass(%s)", (version_table.as_string(conn),)
                ).fetchone()
                if found is None or found[0] is None:
                    raise StreamCheckpointError(
                        f"there are no checkpoint tables named {self.table!r} at {self._where}; "
                        "a store opened read-only creates nothing (check the DSN's database "
                        "and the table name)"
                    )
            lock_key = f"awaken-langchain:{self._names['heads'].as_string(conn)}"
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (lock_key,))
            conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} (id integer PRIMARY KEY CHECK (id = 1), "
                    "version integer NOT NULL)"
                ).format(version_table)
            )
            row = conn.execute(sql.SQL("SELECT version FROM {}").format(version_table)).fetchone()
            version = 0 if row is None else int(row[0])
            if version > SCHEMA_VERSION:
                raise StreamCheckpointError(
                    f"the checkpoint tables at {self._where} have layout version {version}, "
                    f"newer than this awaken-langchain knows ({SCHEMA_VERSION}); upgrade "
                    "awaken-langchain on this host"
                )
            if self.read_only and version < SCHEMA_VERSION:
                raise StreamCheckpointError(
                    f"the checkpoint tables at {self._where} have layout version {version}; "
                    "open the store once without read_only to upgrade them"
                )
            for statements in _migrations(self._names)[version:]:
                for statement in statements:
                    conn.execute(statement)
            if version < SCHEMA_VERSION:
                conn.execute(
                    sql.SQL(
                        "INSERT INTO {} VALUES (1, %s) "
                        "ON CONFLICT (id) DO UPDATE SET version = EXCLUDED.version"
                    ).format(version_table),
                    (SCHEMA_VERSION,),
                )
            conn.commit()
            self._ready = True

    def _backend_error(
        self, action: str, run_id: str | None, exc: Exception
    ) -> StreamCheckpointError:
        """Database failures say where, and never the password."""
        if not isinstance(exc, _ERRORS):
            return super()._backend_error(action, run_id, exc)
        message = (
            f"PostgreSQL {action} failed at {self._where} (check that the server is up "
            "and reachable, the DSN's database, user and password, and the user's "
            "privileges on the store's tables)"
        )
        if isinstance(exc, psycopg_pool.PoolTimeout) and self._connect_error is not None:
            last = redact(str(self._connect_error).strip(), spec=self.dsn)
            message += f"; the last connection attempt failed: {last}"
        error = connection_failure(message, exc, run_id=run_id, spec=self.dsn)
        error.__cause__ = None  # raised "from None"
        return error

    # -- primitives, as steps that one driver runs ------------------------------------------
    #
    # A step generator yields (statement name, parameters) and is sent back the rows
    # the statement returned and its row count; "rollback" undoes the transaction so
    # far. The driver (`_run`) runs all of one generator's statements in one transaction.

    def _run(self, steps: _Steps[_T]) -> _T:
        """Run ``steps`` on a pooled connection, in one transaction.

        A pooled connection the server closed meanwhile (it restarted, or a
        proxy dropped idle connections) fails at its first statement, before
        anything of the transaction ran: the pool then checks its idle
        connections and the steps run once more on a fresh one.
        """
        first = next(steps)
        used: list[Any] = []
        try:
            return self._run_from(steps, first, used)
        except psycopg.OperationalError:
            if not _stale(used):
                raise
        self._pool.check()
        return self._run_from(steps, first, [])

    def _run_from(self, steps: _Steps[_T], first: _Step, used: list[Any]) -> _T:
        with self._connection() as conn:
            used.append(conn)
            name, params = first
            try:
                while True:
                    if name == "rollback":
                        conn.rollback()
                        reply = _Reply([], 0)
                    else:
                        cursor = conn.execute(self._sql[name], params)
                        rows = cursor.fetchall() if cursor.description is not None else []
                        reply = _Reply(rows, cursor.rowcount)
                    used.append(None)  # a statement of the steps ran: never run them again
                    name, params = steps.send(reply)
            except StopIteration as done:
                result: _T = done.value
                return result

    def _claim_steps(self, run_id: str) -> _Steps[int]:
        key = run_id_bytes(run_id)
        floor = _first((yield ("floor_shared", ())))
        claimed = yield ("claim", (key, next_epoch(0, floor), self._keep_until(), floor))
        return _first(claimed)

    def _collect_steps(self) -> _Steps[None]:
        yield ("floor_update", ())
        removed = yield ("collect", (self.clock(),))
        if removed.rows:
            yield ("raise_floor", (max(int(row[0]) for row in removed.rows),))

    def _replace_steps(self, head: Head, text: bytes, epoch: int) -> _Steps[Head]:
        key = run_id_bytes(head.run_id)
        current = _first((yield ("epoch_share", (key,))))
        check_epoch(head.run_id, epoch, current, action="put")
        yield ("upsert_head", (key, head.encode(), head.write_id))
        yield ("drop_segments", (key,))
        if text:
            yield ("add_segment", (key, 0, text))
        return head

    def _append_steps(
        self, head: Head, delta: bytes, epoch: int, expect: LastWrite
    ) -> _Steps[Head | None]:
        sizes = segment_sizes(expect.extra)
        if sizes is None or segment_sizes(head.extra) is None:
            return None
        first, _ = plan_append(sizes, len(delta))
        key = run_id_bytes(head.run_id)
        current = _first((yield ("epoch_share", (key,))))
        check_epoch(head.run_id, epoch, current, action="put")
        updated = yield ("update_head", (head.encode(), head.write_id, key, expect.write_id))
        if updated.count != 1:  # someone else wrote since: the caller rewrites
            yield ("rollback", ())
            return None
        if not delta:  # the other fields changed, the text did not: no segment to write
            return head
        if first == len(sizes):
            yield ("add_segment", (key, first, delta))
        else:
            yield ("merge_segments", (key, first, delta, key, first))
            yield ("drop_segments_after", (key, first))
        return head

    def _load_steps(self, run_id: str) -> _Steps[tuple[Head, bytes] | None]:
        loaded = yield ("load", (run_id_bytes(run_id),))
        if not loaded.rows:
            return None
        raw, text = loaded.rows[0]
        return decode_head(bytes(raw), run_id=run_id), bytes(text)

    def _delete_steps(
        self, run_id: str, epoch: int | None, condition: Callable[[Head], bool] | None
    ) -> _Steps[bool]:
        key = run_id_bytes(run_id)
        current = _first((yield ("epoch_update", (key,))))
        if epoch is not None:
            check_epoch(run_id, epoch, current, action="delete")
        locked = yield ("lock_head", (key,))
        if not locked.rows:
            return False
        head = None if condition is None else decode_head(bytes(locked.rows[0][0]), run_id=run_id)
        if head is not None and condition is not None and not condition(head):
            return False
        yield ("delete_head", (key,))
        yield ("drop_segments", (key,))
        yield ("keep_epoch", (self._keep_until(head), key))
        return True

    def _backend_claim(self, run_id: str) -> int:
        return self._run(self._claim_steps(run_id))

    def _backend_collect_epochs(self) -> None:
        self._run(self._collect_steps())

    def _backend_replace(self, head: Head, text: bytes, epoch: int) -> Head:
        return self._run(self._replace_steps(head, text, epoch))

    def _backend_append(
        self, head: Head, delta: bytes, epoch: int, expect: LastWrite
    ) -> Head | None:
        return self._run(self._append_steps(head, delta, epoch, expect))

    def _backend_load(self, run_id: str) -> tuple[Head, bytes] | None:
        return self._run(self._load_steps(run_id))

    def _backend_delete(
        self, run_id: str, epoch: int | None, condition: Callable[[Head], bool] | None
    ) -> bool:
        return self._run(self._delete_steps(run_id, epoch, condition))

    def _backend_heads(self) -> Iterable[tuple[str, bytes]]:
        with self._connection() as conn:
            rows = conn.execute(self._sql["heads"]).fetchall()
        return [(bytes(key).decode("utf-8", "surrogatepass"), bytes(raw)) for key, raw in rows]

    # -- the async twins: the sync methods, in a worker thread ---------------------------
    #
    # The async twins are the base class's: each runs its sync method in the loop's
    # default executor, on the store's one pool. An asyncio pool per event loop was
    # tried and left: psycopg_pool (3.3) loses the cancellation ``asyncio.run`` sends
    # a pool task that is connecting when the loop ends (it logs "error connecting"
    # and reschedules the connect), so ``asyncio.run`` never returned.

    async def aclose(self) -> None:
        """Async twin of :meth:`close`."""
        await asyncio.to_thread(self.close)

    async def __aenter__(self) -> PostgresStreamCheckpointStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def close(self) -> None:
        """Close the connection pool the store created (a borrowed pool stays open).

        The connection its followers in this process share closes too.
        """
        from awaken_langchain._runlog import close_run_log

        close_run_log(self)
        if self._owns_pool and self._opened:
            with self._backend_errors("close", None):
                self._pool.close()


_T = TypeVar("_T")


@dataclass
class _Reply:
    """What one statement of a step returned: its rows and its row count."""

    rows: list[Any]
    count: int


_Step = tuple[str, tuple[Any, ...]]
"""One statement of a step: its name in ``_STATEMENTS`` and its parameters."""

_Steps = Generator[_Step, _Reply, _T]
"""A primitive's statements, each sent back its :class:`_Reply` (see ``_run``)."""


def _stale(used: list[Any]) -> bool:
    """Whether a failed run met a connection already closed, before any of its statements ran.

    ``used`` holds the connection it got, then one entry per statement that ran.
    """
    return len(used) == 1 and bool(getattr(used[0], "broken", False))


def _first(reply: _Reply) -> int:
    """The first column of the first row as an int; 0 when there is no row."""
    return int(reply.rows[0][0]) if reply.rows else 0


_STATEMENTS = {
    "floor_shared": "SELECT floor FROM {floor} WHERE id = 1 FOR SHARE",
    "floor_update": "SELECT floor FROM {floor} WHERE id = 1 FOR UPDATE",
    "raise_floor": "UPDATE {floor} SET floor = greatest(floor, %s) WHERE id = 1",
    "epoch_share": "SELECT counter FROM {epochs} WHERE run_id = %s FOR SHARE",
    "epoch_update": "SELECT counter FROM {epochs} WHERE run_id = %s FOR UPDATE",
    "claim": (
        "INSERT INTO {epochs} (run_id, counter, keep_until) VALUES (%s, %s, %s) "
        "ON CONFLICT (run_id) DO UPDATE SET counter = greatest({epochs}.counter, %s) + 1, "
        "keep_until = greatest({epochs}.keep_until, EXCLUDED.keep_until) RETURNING counter"
    ),
    "keep_epoch": ("UPDATE {epochs} SET keep_until = greatest(keep_until, %s) WHERE run_id = %s"),
    "collect": (
        "DELETE FROM {epochs} e WHERE e.keep_until < %s "
        "AND NOT EXISTS (SELECT 1 FROM {heads} h WHERE h.run_id = e.run_id) RETURNING e.counter"
    ),
    "upsert_head": (
        "INSERT INTO {heads} (run_id, head, write_id) VALUES (%s, %s, %s) "
        "ON CONFLICT (run_id) DO UPDATE SET head = EXCLUDED.head, write_id = EXCLUDED.write_id"
    ),
    "update_head": (
        "UPDATE {heads} SET head = %s, write_id = %s WHERE run_id = %s AND write_id = %s"
    ),
    "lock_head": "SELECT head FROM {heads} WHERE run_id = %s FOR UPDATE",
    "delete_head": "DELETE FROM {heads} WHERE run_id = %s",
    "drop_segments": "DELETE FROM {segments} WHERE run_id = %s",
    "drop_segments_after": "DELETE FROM {segments} WHERE run_id = %s AND seq > %s",
    "add_segment": "INSERT INTO {segments} (run_id, seq, data) VALUES (%s, %s, %s)",
    "merge_segments": (
        "INSERT INTO {segments} (run_id, seq, data) "
        "SELECT %s, %s, string_agg(data, ''::bytea ORDER BY seq) || %s FROM {segments} "
        "WHERE run_id = %s AND seq >= %s "
        "ON CONFLICT (run_id, seq) DO UPDATE SET data = EXCLUDED.data"
    ),
    "load": (
        "SELECT h.head, coalesce((SELECT string_agg(s.data, ''::bytea ORDER BY s.seq) "
        "FROM {segments} s WHERE s.run_id = h.run_id), ''::bytea) "
        "FROM {heads} h WHERE h.run_id = %s"
    ),
    "heads": "SELECT run_id, head FROM {heads}",
}
"""Every statement the store runs; table names are filled in as identifiers, values are
always parameters."""
