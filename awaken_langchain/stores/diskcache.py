"""The embedded default store: a diskcache (SQLite) directory shared by processes."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import diskcache

from awaken_langchain.checkpoint import DEFAULT_MAX_CHECKPOINT_BYTES, StreamCheckpoint
from awaken_langchain.errors import StreamCheckpointError
from awaken_langchain.stores._base import (
    DeltaCheckpointStore,
    Head,
    LastWrite,
    check_epoch,
    corrupted,
    decode_head,
    plan_append,
    run_id_bytes,
)

_HEAD = b"h\x00"
_EPOCH = b"e\x00"
_SEGMENT = b"s\x00"


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


class DiskCacheStreamCheckpointStore(DeltaCheckpointStore):
    """Checkpoints in a diskcache directory, safe for several processes on one host.

    Every claim, put and delete runs in one SQLite transaction
    (``Cache.transact``), so the fencing check and the write are atomic across
    processes. Values are JSON bytes (heads), raw UTF-8 bytes (text segments)
    and integers (epoch counters); nothing is pickled, and a value diskcache
    would unpickle is refused on read. Eviction is disabled (``eviction_policy
    ="none"``): diskcache never drops a checkpoint or an epoch counter on its
    own; expiry is this store's ``ttl`` and :meth:`gc`.

    The directory is created private to the owner (0700).

    Args:
        directory: The cache directory; dedicate it to checkpoints.
        ttl: Seconds after its last write when a checkpoint expires, or ``None``.
        max_checkpoint_bytes: Largest encoded checkpoint the store accepts.
        clock: Wall-clock time source, injectable for tests.
        timeout: Seconds a write waits for another process's transaction before
            failing with :class:`StreamCheckpointError`.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        ttl: float | None = None,
        max_checkpoint_bytes: int = DEFAULT_MAX_CHECKPOINT_BYTES,
        clock: Callable[[], float] = time.time,
        timeout: float = 60.0,
    ) -> None:
        super().__init__(ttl=ttl, max_checkpoint_bytes=max_checkpoint_bytes, clock=clock)
        self.directory = Path(directory)
        self.timeout = timeout
        with self._backend_errors("open", None):
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(self.directory, 0o700)
            # SQLite gives its -wal and -shm files the database file's mode, so the
            # database is created private before SQLite first opens it.
            db = self.directory / diskcache.core.DBNAME
            os.close(os.open(db, os.O_WRONLY | os.O_CREAT, 0o600))
            os.chmod(db, 0o600)
            self._cache = diskcache.Cache(
                str(self.directory),
                timeout=timeout,
                disk=_PlainDisk,
                eviction_policy="none",
                statistics=False,
            )

    def close(self) -> None:
        """Close the cache's database connection."""
        self._cache.close()

    @contextlib.contextmanager
    def _backend_errors(self, action: str, run_id: str | None) -> Iterator[None]:
        with super()._backend_errors(action, run_id):
            try:
                yield
            except diskcache.Timeout as exc:
                raise StreamCheckpointError(
                    f"{action} waited more than timeout={self.timeout:g} s for another "
                    f"process's transaction on {self.directory}; raise "
                    "DiskCacheStreamCheckpointStore(timeout=...) or reduce the writers",
                    run_id=run_id,
                    cause=exc,
                ) from exc

    # -- keys -----------------------------------------------------------------

    @staticmethod
    def _head_key(run_id: str) -> bytes:
        return _HEAD + run_id_bytes(run_id)

    @staticmethod
    def _epoch_key(run_id: str) -> bytes:
        return _EPOCH + run_id_bytes(run_id)

    @staticmethod
    def _segment_key(run_id: str, index: int) -> bytes:
        return _SEGMENT + run_id_bytes(run_id) + b"\x00" + str(index).encode()

    # -- reads inside a transaction ---------------------------------------------

    def _value(self, key: bytes, run_id: str, default: Any = None) -> Any:
        try:
            return self._cache.get(key, default)
        except _RefusedPickle as exc:
            raise corrupted(run_id, "it holds a pickled value, which is never unpickled") from exc

    def _epoch(self, run_id: str) -> int:
        value = self._value(self._epoch_key(run_id), run_id, 0)
        if type(value) is not int or value < 0:
            raise corrupted(run_id, f"epoch counter holds {type(value).__name__}")
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
        sizes = head.extra.get("segments")
        if (
            not isinstance(sizes, list)
            or not all(type(n) is int and n > 0 for n in sizes)
            or sum(sizes) != head.text_bytes
        ):
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
        with self._cache.transact():
            epoch = self._epoch(run_id) + 1
            self._cache.set(self._epoch_key(run_id), epoch)
        return epoch

    def _backend_replace(self, head: Head, text: bytes, epoch: int) -> Head:
        run_id = head.run_id
        sizes = [len(text)] if text else []
        stored = head.with_extra(segments=sizes)
        with self._cache.transact():
            check_epoch(run_id, epoch, self._epoch(run_id), action="put")
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
            check_epoch(run_id, epoch, self._epoch(run_id), action="put")
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
            stored = head.with_extra(segments=new_sizes)
            self._cache.set(self._head_key(run_id), stored.encode())
        return stored

    def _backend_load(self, run_id: str) -> tuple[Head, bytes] | None:
        with self._cache.transact():
            head = self._head(run_id)
            if head is None:
                return None
            sizes = self._segments(head)
            text = b"".join(self._segment(run_id, i, n) for i, n in enumerate(sizes))
        return head, text

    def _backend_delete(
        self, run_id: str, epoch: int | None, condition: Callable[[Head], bool] | None
    ) -> bool:
        with self._cache.transact():
            if epoch is not None:
                check_epoch(run_id, epoch, self._epoch(run_id), action="delete")
            key = self._head_key(run_id)
            if key not in self._cache:
                return False
            if condition is not None:
                head = self._head(run_id)
                if head is None or not condition(head):
                    return False
            count = self._stored_segment_count(run_id)
            self._cache.delete(key)
            self._drop_segments(run_id, 0, count)
        return True

    def _backend_heads(self) -> Iterable[tuple[str, bytes]]:
        found = []
        for key in self._cache.iterkeys():
            if type(key) is bytes and key.startswith(_HEAD):
                run_id = key[len(_HEAD) :].decode("utf-8", "surrogatepass")
                try:
                    raw = self._cache.get(key)
                except _RefusedPickle:
                    raw = b""  # refused (pickled): listed as unreadable
                if raw is not None:
                    found.append((run_id, raw if type(raw) is bytes else b""))
        return found

    # -- group commit ---------------------------------------------------------------

    def put_many(
        self, checkpoints: Sequence[StreamCheckpoint]
    ) -> list[StreamCheckpointError | None]:
        """Store several runs' checkpoints in one SQLite transaction (group commit).

        Each checkpoint is put as `put` would, its fencing check inside the
        transaction. A checkpoint refused on its own (fenced, too large, an
        unreadable record) is reported and the others are written; such refusals
        happen before the refused checkpoint writes anything. A failure of the
        database itself (a lock wait past ``timeout``, a full disk) rolls the
        whole batch back and is reported for every checkpoint.

        Returns:
            For each checkpoint, in order, ``None`` or the error its put raised.
        """
        if not checkpoints:
            return []
        errors: list[StreamCheckpointError | None] = []
        try:
            with self._backend_errors("put", None), self._cache.transact():
                for checkpoint in checkpoints:
                    try:
                        # nested: joins the open transaction. The base put, not an
                        # override's: an override of put must not hear "written"
                        # before the batch commits (override put_many instead).
                        DeltaCheckpointStore.put(self, checkpoint)
                    except StreamCheckpointError as exc:
                        if isinstance(exc.cause, sqlite3.Error | OSError | diskcache.Timeout):
                            raise  # the database failed: roll the batch back
                        errors.append(exc)
                    else:
                        errors.append(None)
        except StreamCheckpointError as exc:
            return [exc] * len(checkpoints)
        return errors


__all__ = ["DiskCacheStreamCheckpointStore"]
