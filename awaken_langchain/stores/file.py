"""A plain-files store for one owning process: append-only logs, temp file + rename."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import struct
import sys
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from awaken_langchain.checkpoint import DEFAULT_MAX_CHECKPOINT_BYTES, decode_json, encode_json
from awaken_langchain.errors import StreamCheckpointError
from awaken_langchain.stores._base import (
    DEFAULT_EPOCH_GRACE,
    MEMO_LIMIT,
    DeltaCheckpointStore,
    Head,
    LastWrite,
    check_epoch,
    corrupted,
    decode_head,
    make_private_directory,
    new_write_id,
    next_epoch,
    open_no_follow,
    run_id_bytes,
    unreadable_id,
    unreadable_locator,
)

if sys.platform != "win32":
    import fcntl
else:  # pragma: no cover - exercised on Windows only
    fcntl = None

logger = logging.getLogger(__name__)

_LOG_SUFFIX = ".log"
_EPOCH_SUFFIX = ".epoch"
_TMP_PREFIX = ".tmp-"
_LOCK_NAME = ".lock"
_FLOOR_NAME = ".epoch-floor"

_FRAME = struct.Struct(">4sIII")
"""Frame header: magic, head length, text delta length, CRC-32 of header lengths + payload."""
_MAGIC = b"AWK1"

COMPACT_SLACK = 64 * 1024
"""A log is rewritten once it exceeds twice its live content plus this many bytes."""


def encode_frame(head: bytes, delta: bytes) -> bytes:
    """Encode one log frame: a head and the text bytes it appends."""
    lengths = struct.pack(">II", len(head), len(delta))
    crc = zlib.crc32(delta, zlib.crc32(head, zlib.crc32(lengths)))
    return _FRAME.pack(_MAGIC, len(head), len(delta), crc) + head + delta


@dataclass(frozen=True)
class _Cursor:
    """Where this instance last saw a run's log: for appending without reading it."""

    write_id: str
    inode: int
    last_frame: int
    end: int


class _Log:
    """A parsed run log: the last intact head, the text, and where frames lie."""

    def __init__(self, data: bytes, *, run_id: str) -> None:
        view = memoryview(data)
        parts: list[memoryview] = []
        head: bytes | None = None
        position = last = 0
        while position + _FRAME.size <= len(view):
            magic, head_len, delta_len, crc = _FRAME.unpack_from(view, position)
            start = position + _FRAME.size
            end = start + head_len + delta_len
            if magic != _MAGIC or end > len(view):
                break
            lengths = struct.pack(">II", head_len, delta_len)
            if zlib.crc32(view[start:end], zlib.crc32(lengths)) != crc:
                break
            head = bytes(view[start : start + head_len])
            parts.append(view[start + head_len : end])
            last, position = position, end
        if head is None:
            raise corrupted(run_id, "the log has no intact frame")
        if position != len(view):
            logger.warning(
                "checkpoint log of run %r ends with %d bytes of an interrupted or damaged "
                "write; reading the last intact checkpoint",
                run_id[:80],
                len(view) - position,
            )
        self.raw_head = head
        self.text = b"".join(parts)
        self.last_frame = last
        self.end = position


class FileStreamCheckpointStore(DeltaCheckpointStore):
    """Checkpoints as files in a directory owned by one process.

    Each run has a log file and, once claimed, an epoch file, both named by the
    SHA-256 of the run id, so no run id (``/``, ``..``, very long ids) can name
    a path outside the directory. An epoch file goes when its run ends (see
    :mod:`awaken_langchain.stores._base`), otherwise at :meth:`gc`
    ``epoch_grace`` seconds after the run's log is gone, raising the epoch
    floor kept in ``.epoch-floor``. The store never follows a symbolic link: a
    link in place of the directory, the lock or a run's file is refused.

    The log is a sequence of checksummed frames, each a head plus the text it
    appends: a put that extends the text appends one small frame and fsyncs it; any
    other put (and a log grown to twice its live content) writes a new log with one
    frame via temp file, fsync, rename and directory fsync. A crash can tear only
    the last frame; reading stops at the last intact frame, so the previous
    checkpoint stays readable. Files are 0600, the directory 0700.

    The store is meant for one owning process. Every operation also takes an
    advisory lock on ``<directory>/.lock``, so another process (an operator
    listing or deleting checkpoints) never corrupts anything. With
    ``read_only=True`` the store opens an existing directory for reading (a
    shared lock on the existing ``.lock``) and changes nothing on disk; writes
    are refused.

    Args:
        directory: The directory to keep checkpoints in; dedicate it to them.
        ttl: Seconds after its last write when a checkpoint expires, or ``None``.
        max_checkpoint_bytes: Largest encoded checkpoint the store accepts.
        clock: Wall-clock time source, injectable for tests.
        fsync: Whether to fsync files and the directory (turn off only for
            throwaway data).
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
        fsync: bool = True,
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
        self._fsync = fsync
        self._thread_lock = threading.RLock()
        self._lock_fd: int | None = None
        self._lock_pid = 0
        self._cursors: OrderedDict[str, _Cursor] = OrderedDict()
        self.read_only = read_only
        with self._backend_errors("open", None):
            if not read_only:
                make_private_directory(self.directory)
            self._open_lock()

    def _open_lock(self) -> None:
        # flock() excludes open file descriptions, so a forked child opens its own.
        path = self.directory / _LOCK_NAME
        if not self.read_only:
            self._lock_fd = open_no_follow(path, os.O_RDWR | os.O_CREAT)
        elif path.is_file() and not path.is_symlink():
            self._lock_fd = open_no_follow(path, os.O_RDONLY)
        else:
            raise StreamCheckpointError(
                f"there is no checkpoint store at {self.directory} "
                + (f"(no {_LOCK_NAME} in it)" if self.directory.is_dir() else "(no such directory)")
            )
        self._lock_pid = os.getpid()

    def close(self) -> None:
        """Release the lock file descriptor."""
        with self._thread_lock:
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    # -- files --------------------------------------------------------------------

    @staticmethod
    def _stem(run_id: str) -> str:
        return hashlib.sha256(run_id_bytes(run_id)).hexdigest()

    def _path(self, run_id: str, suffix: str) -> Path:
        return self.directory / (self._stem(run_id) + suffix)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._thread_lock:
            if self._lock_fd is None:
                raise RuntimeError("the store is closed")
            if self._lock_pid != os.getpid():
                os.close(self._lock_fd)
                self._cursors.clear()
                self._open_lock()
            assert self._lock_fd is not None
            if fcntl is not None:
                fcntl.flock(self._lock_fd, fcntl.LOCK_SH if self.read_only else fcntl.LOCK_EX)
            try:
                yield
            finally:
                if fcntl is not None:
                    fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _sync(self, fd: int) -> None:
        if self._fsync:
            os.fsync(fd)

    def _sync_directory(self) -> None:
        if self._fsync and sys.platform != "win32":
            fd = open_no_follow(self.directory, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    @staticmethod
    def _write_all(fd: int, data: bytes, offset: int | None = None) -> None:
        view = memoryview(data)
        while view:
            if offset is None:
                count = os.write(fd, view)
            else:
                count = os.pwrite(fd, view, offset)
                offset += count
            view = view[count:]

    def _replace_file(self, path: Path, data: bytes) -> int:
        """Atomically replace ``path`` with ``data``; return the new file's inode."""
        tmp = self.directory / f"{_TMP_PREFIX}{new_write_id()}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                self._write_all(fd, data)
                self._sync(fd)
                inode = os.fstat(fd).st_ino
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self._sync_directory()
        return inode

    @staticmethod
    def _read(path: Path) -> bytes | None:
        """Read a file of the store, or ``None`` if it is missing; links are refused."""
        found = FileStreamCheckpointStore._read_with_inode(path)
        return None if found is None else found[0]

    @staticmethod
    def _read_with_inode(path: Path) -> tuple[bytes, int] | None:
        try:
            fd = open_no_follow(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        with open(fd, "rb") as handle:
            return handle.read(), os.fstat(fd).st_ino

    @staticmethod
    def _decode_epoch_record(raw: bytes, run_id: str | None) -> tuple[str, int, float]:
        """Decode an epoch file: its run id, counter and until when it is kept."""
        obj = decode_json(raw, run_id=run_id)
        if not isinstance(obj, dict) or not isinstance(obj.get("run_id"), str):
            raise corrupted(run_id or "?", "epoch file names no run id")
        if run_id is not None and obj["run_id"] != run_id:
            raise corrupted(run_id, "epoch file does not belong to this run id")
        epoch = obj.get("epoch")
        keep_until = obj.get("keep_until", 0.0)  # absent: written before epoch_grace
        if type(epoch) is not int or epoch < 0 or not isinstance(keep_until, int | float):
            raise corrupted(obj["run_id"], "epoch file holds no epoch")
        return obj["run_id"], epoch, float(keep_until)

    def _epoch_record(self, run_id: str) -> tuple[int, float] | None:
        raw = self._read(self._path(run_id, _EPOCH_SUFFIX))
        if raw is None:
            return None
        _, epoch, keep_until = self._decode_epoch_record(raw, run_id)
        return epoch, keep_until

    def _epoch(self, run_id: str) -> int:
        record = self._epoch_record(run_id)
        return 0 if record is None else record[0]

    def _write_epoch_record(self, run_id: str, epoch: int, keep_until: float) -> None:
        record = {"run_id": run_id, "epoch": epoch, "keep_until": keep_until}
        self._replace_file(self._path(run_id, _EPOCH_SUFFIX), encode_json(record))

    def _epoch_floor(self) -> int:
        raw = self._read(self.directory / _FLOOR_NAME)
        if raw is None:
            return 0
        obj = decode_json(raw)
        floor = obj.get("epoch_floor") if isinstance(obj, dict) else None
        if type(floor) is not int or floor < 0:
            raise StreamCheckpointError(
                f"{self.directory / _FLOOR_NAME} is corrupted (it holds no epoch floor)"
            )
        return floor

    def _set_cursor(self, run_id: str, cursor: _Cursor | None) -> None:
        """Record (or forget) where a run's log ends; call with the lock held."""
        self._cursors.pop(run_id, None)
        if cursor is not None:
            self._cursors[run_id] = cursor
            while len(self._cursors) > MEMO_LIMIT:
                self._cursors.popitem(last=False)

    def _log(self, run_id: str) -> tuple[_Log, int] | None:
        """Read and parse the run's log; return it with the file's inode."""
        found = self._read_with_inode(self._path(run_id, _LOG_SUFFIX))
        if found is None:
            return None
        data, inode = found
        return _Log(data, run_id=run_id), inode

    # -- primitives -------------------------------------------------------------

    def _backend_claim(self, run_id: str) -> int:
        with self._locked():
            epoch = next_epoch(self._epoch(run_id), self._epoch_floor())
            self._write_epoch_record(run_id, epoch, self._keep_until())
        return epoch

    def _backend_collect_epochs(self) -> None:
        now = self.clock()
        with self._locked():
            floor = self._epoch_floor()
            collected = []
            for entry in os.scandir(self.directory):
                if not entry.name.endswith(_EPOCH_SUFFIX) or entry.is_symlink():
                    continue
                stem = entry.name[: -len(_EPOCH_SUFFIX)]
                raw = self._read(Path(entry.path))
                try:
                    run_id, epoch, keep_until = self._decode_epoch_record(raw or b"", None)
                except StreamCheckpointError:
                    continue  # unreadable: kept, and fences its run as corrupted
                if (
                    self._stem(run_id) != stem
                    or now <= keep_until
                    or (self.directory / (stem + _LOG_SUFFIX)).exists()
                ):
                    continue
                floor = max(floor, epoch)
                collected.append(entry.path)
            if not collected:
                return
            # The floor is durable before any record goes, so a crash in between
            # leaves records behind, never a claim that could repeat an epoch.
            self._replace_file(self.directory / _FLOOR_NAME, encode_json({"epoch_floor": floor}))
            for path in collected:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            self._sync_directory()

    def _backend_replace(self, head: Head, text: bytes, epoch: int) -> Head:
        run_id = head.run_id
        frame = encode_frame(head.encode(), text)
        with self._locked():
            check_epoch(run_id, epoch, self._epoch(run_id), action="put", floor=self._epoch_floor)
            self._set_cursor(run_id, None)
            inode = self._replace_file(self._path(run_id, _LOG_SUFFIX), frame)
            self._set_cursor(run_id, _Cursor(head.write_id, inode, 0, len(frame)))
        return head

    def _backend_append(
        self, head: Head, delta: bytes, epoch: int, expect: LastWrite
    ) -> Head | None:
        run_id = head.run_id
        frame = encode_frame(head.encode(), delta)
        with self._locked():
            check_epoch(run_id, epoch, self._epoch(run_id), action="put", floor=self._epoch_floor)
            cursor = self._cursors.get(run_id)
            if cursor is None or cursor.write_id != expect.write_id:
                return None
            if cursor.end + len(frame) > 2 * (head.text_bytes + len(head.encode())) + COMPACT_SLACK:
                return None  # compact: the caller rewrites the log as one frame
            try:
                fd = open_no_follow(self._path(run_id, _LOG_SUFFIX), os.O_RDWR)
            except (FileNotFoundError, StreamCheckpointError):
                return None  # gone, or a link planted in its place: the rewrite replaces it
            try:
                stat = os.fstat(fd)
                if stat.st_ino != cursor.inode or stat.st_size != cursor.end:
                    return None  # another writer replaced or extended the log
                if not self._frame_has_write_id(fd, cursor.last_frame, expect.write_id):
                    return None
                self._set_cursor(run_id, None)
                self._write_all(fd, frame, cursor.end)
                self._sync(fd)
            finally:
                os.close(fd)
            end = cursor.end + len(frame)
            self._set_cursor(run_id, _Cursor(head.write_id, cursor.inode, cursor.end, end))
        return head

    @staticmethod
    def _frame_has_write_id(fd: int, offset: int, write_id: str) -> bool:
        """Tell whether the frame at ``offset`` holds a head with ``write_id``."""
        header = os.pread(fd, _FRAME.size, offset)
        if len(header) != _FRAME.size:
            return False
        magic, head_len, _, _ = _FRAME.unpack(header)
        if magic != _MAGIC:
            return False
        raw = os.pread(fd, head_len, offset + _FRAME.size)
        try:
            obj = decode_json(raw)
        except StreamCheckpointError:
            return False
        return isinstance(obj, dict) and obj.get("write_id") == write_id

    def _backend_load(self, run_id: str) -> tuple[Head, bytes] | None:
        with self._locked():
            found = self._log(run_id)
            if found is None:
                unreadable = self._unreadable_log(run_id)
                if unreadable is not None:
                    raise corrupted(
                        run_id,
                        f"log file {unreadable.name} names no run id it can be read back for; "
                        "remove it with delete",
                    )
                return None
            log, inode = found
            head = decode_head(log.raw_head, run_id=run_id)
            self._set_cursor(run_id, _Cursor(head.write_id, inode, log.last_frame, log.end))
        return head, log.text

    def _backend_delete(
        self, run_id: str, epoch: int | None, condition: Callable[[Head], bool] | None
    ) -> bool:
        with self._locked():
            if epoch is not None:
                check_epoch(
                    run_id, epoch, self._epoch(run_id), action="delete", floor=self._epoch_floor
                )
            path = self._path(run_id, _LOG_SUFFIX)
            head = None
            if condition is not None or epoch is None:
                with contextlib.suppress(StreamCheckpointError):  # unreadable: not ours to judge
                    found = self._log(run_id)
                    head = None if found is None else decode_head(found[0].raw_head, run_id=run_id)
            if condition is not None and (head is None or not condition(head)):
                return False
            self._set_cursor(run_id, None)
            try:
                os.unlink(path)
            except FileNotFoundError:
                unreadable = self._unreadable_log(run_id)
                if unreadable is None:
                    if self._end_record(run_id, epoch, None, removed=False):
                        self._sync_directory()
                    return False
                os.unlink(unreadable)
                self._sync_directory()
                return True
            if not self._end_record(
                run_id, epoch, head, removed=True, expired=condition is not None
            ):
                self._sync_directory()
        return True

    def _end_record(
        self,
        run_id: str,
        epoch: int | None,
        deleted: Head | None,
        *,
        removed: bool,
        expired: bool = False,
    ) -> bool:
        """After a delete, with the lock held: end the run's epoch record if the run is over.

        Otherwise a record whose checkpoint was ``removed`` is kept on for
        ``epoch_grace``; an unreadable record stays. Returns whether the
        directory was synced after every unlink so far; if not, the caller
        syncs it after an unlink of its own.
        """
        record = None
        with contextlib.suppress(StreamCheckpointError):
            record = self._epoch_record(run_id)
        if record is None:
            return False
        if self._ends_record(record[0], epoch, deleted, expired=expired):
            if record[0] > self._epoch_floor():  # durable before the record goes, as in gc
                floor = encode_json({"epoch_floor": record[0]})
                self._replace_file(self.directory / _FLOOR_NAME, floor)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(run_id, _EPOCH_SUFFIX))
            self._sync_directory()
            return True
        if removed:  # its rename's directory fsync also covers the unlink
            keep_until = max(record[1], self._keep_until(deleted if expired else None))
            self._write_epoch_record(run_id, record[0], keep_until)
            return True
        return False

    def _backend_heads(self) -> Iterable[tuple[str, bytes]]:
        found = []
        with self._locked():
            for entry in os.scandir(self.directory):
                if not entry.name.endswith(_LOG_SUFFIX) or entry.is_symlink():
                    continue  # not a log of this store
                data = self._read(Path(entry.path))
                if data is None:
                    continue
                head = self._head_of_log(entry.name, data)
                # a log naming no run id is listed under its file name, so it can be removed
                found.append(head or (unreadable_id(entry.name.encode()), b""))
        return found

    def _head_of_log(self, name: str, data: bytes) -> tuple[str, bytes] | None:
        """Return a log's run id and raw head, if the head names the run the file is for."""
        try:
            raw = _Log(data, run_id=name).raw_head
            obj = decode_json(raw)
        except StreamCheckpointError:
            return None
        fields = obj.get("checkpoint") if isinstance(obj, dict) else None
        run_id = fields.get("run_id") if isinstance(fields, dict) else None
        if isinstance(run_id, str) and self._stem(run_id) + _LOG_SUFFIX == name:
            return run_id, raw
        return None

    def _unreadable_log(self, run_id: str) -> Path | None:
        """Return the log an unreadable entry's id names, if it is still unreadable."""
        locator = unreadable_locator(run_id)
        try:
            name = locator.decode("ascii") if locator else ""
        except UnicodeDecodeError:
            return None
        stem = name.removesuffix(_LOG_SUFFIX)
        if len(stem) != 64 or stem.strip("0123456789abcdef") or not name.endswith(_LOG_SUFFIX):
            return None
        data = self._read(self.directory / name)
        if data is None or self._head_of_log(name, data) is not None:
            return None
        return self.directory / name

    def _backend_cleanup(self) -> None:
        """Remove temp files left by writes that crashed before their rename."""
        with self._locked():
            for entry in os.scandir(self.directory):
                if entry.name.startswith(_TMP_PREFIX):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)


__all__ = ["FileStreamCheckpointStore", "encode_frame"]
