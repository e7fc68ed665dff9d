"""A plain-files store for one owning process: temp file, fsync, rename."""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from awaken_langchain.checkpoint import DEFAULT_MAX_CHECKPOINT_BYTES, decode_json, encode_json
from awaken_langchain.errors import StreamCheckpointError
from awaken_langchain.stores._base import (
    DeltaCheckpointStore,
    Head,
    LastWrite,
    check_epoch,
    corrupted,
    decode_head,
    new_write_id,
    run_id_bytes,
)

if sys.platform != "win32":
    import fcntl
else:  # pragma: no cover - exercised on Windows only
    fcntl = None

_HEAD_SUFFIX = ".head"
_EPOCH_SUFFIX = ".epoch"
_TEXT_SUFFIX = ".text"
_TMP_PREFIX = ".tmp-"
_LOCK_NAME = ".lock"


class FileStreamCheckpointStore(DeltaCheckpointStore):
    """Checkpoints as files in a directory owned by one process.

    Each run has a head file (JSON), an append-only text file and an epoch
    file, all named by the SHA-256 of the run id, so no run id (``/``, ``..``,
    very long ids) can name a path outside the directory. Heads and epochs are
    replaced atomically (temp file, fsync, rename, fsync of the directory); a
    put that extends the text appends to the text file and fsyncs it before the
    head that covers the new bytes is renamed into place, so a crash leaves the
    previous checkpoint readable. Files are 0600, the directory 0700.

    The store is meant for one owning process. Every operation also takes an
    advisory lock on ``<directory>/.lock``, so a second process (an operator
    listing or deleting checkpoints) does not corrupt anything.

    Args:
        directory: The directory to keep checkpoints in; dedicate it to them.
        ttl: Seconds after its last write when a checkpoint expires, or ``None``.
        max_checkpoint_bytes: Largest encoded checkpoint the store accepts.
        clock: Wall-clock time source, injectable for tests.
        fsync: Whether to fsync files and the directory (turn off only for
            throwaway data).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        ttl: float | None = None,
        max_checkpoint_bytes: int = DEFAULT_MAX_CHECKPOINT_BYTES,
        clock: Callable[[], float] = time.time,
        fsync: bool = True,
    ) -> None:
        super().__init__(ttl=ttl, max_checkpoint_bytes=max_checkpoint_bytes, clock=clock)
        self.directory = Path(directory)
        self._fsync = fsync
        self._thread_lock = threading.RLock()
        with self._backend_errors("open", None):
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(self.directory, 0o700)
            self._lock_fd: int | None = os.open(
                self.directory / _LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600
            )

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

    def _text_path(self, run_id: str, generation: str) -> Path:
        return self.directory / f"{self._stem(run_id)}.{generation}{_TEXT_SUFFIX}"

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._thread_lock:
            if self._lock_fd is None:
                raise RuntimeError("the store is closed")
            if fcntl is not None:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
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
            fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def _write_new(self, path: Path, data: bytes) -> None:
        """Create ``path`` (which must not exist) with ``data``, fsynced, mode 0600."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            self._sync(fd)
        finally:
            os.close(fd)

    def _replace_file(self, path: Path, data: bytes) -> None:
        """Atomically replace ``path`` with ``data`` (temp file, fsync, rename)."""
        tmp = self.directory / f"{_TMP_PREFIX}{new_write_id()}"
        try:
            self._write_new(tmp, data)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self._sync_directory()

    @staticmethod
    def _read(path: Path) -> bytes | None:
        try:
            with open(path, "rb") as handle:
                return handle.read()
        except FileNotFoundError:
            return None

    def _epoch(self, run_id: str) -> int:
        raw = self._read(self._path(run_id, _EPOCH_SUFFIX))
        if raw is None:
            return 0
        obj = decode_json(raw, run_id=run_id)
        if not isinstance(obj, dict) or obj.get("run_id") != run_id:
            raise corrupted(run_id, "epoch file does not belong to this run id")
        epoch = obj.get("epoch")
        if type(epoch) is not int or epoch < 0:
            raise corrupted(run_id, "epoch file holds no epoch")
        return epoch

    def _head(self, run_id: str) -> Head | None:
        raw = self._read(self._path(run_id, _HEAD_SUFFIX))
        return None if raw is None else decode_head(raw, run_id=run_id)

    @staticmethod
    def _generation(head: Head) -> str:
        generation = head.extra.get("text_file")
        if not isinstance(generation, str) or not generation.isalnum():
            raise corrupted(head.run_id, "head names no valid text file")
        return generation

    # -- primitives -------------------------------------------------------------

    def _backend_claim(self, run_id: str) -> int:
        with self._locked():
            epoch = self._epoch(run_id) + 1
            self._replace_file(
                self._path(run_id, _EPOCH_SUFFIX), encode_json({"run_id": run_id, "epoch": epoch})
            )
        return epoch

    def _backend_replace(self, head: Head, text: bytes, epoch: int) -> Head:
        run_id = head.run_id
        generation = new_write_id()
        stored = head.with_extra(text_file=generation)
        with self._locked():
            check_epoch(run_id, epoch, self._epoch(run_id), action="put")
            try:
                old = self._head(run_id)
                old_generation = None if old is None else self._generation(old)
            except StreamCheckpointError:
                old_generation = None  # unreadable head: gc removes its text file
            self._write_new(self._text_path(run_id, generation), text)
            self._replace_file(self._path(run_id, _HEAD_SUFFIX), stored.encode())
            if old_generation is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._text_path(run_id, old_generation))
        return stored

    def _backend_append(
        self, head: Head, delta: bytes, epoch: int, expect: LastWrite
    ) -> Head | None:
        run_id = head.run_id
        with self._locked():
            check_epoch(run_id, epoch, self._epoch(run_id), action="put")
            try:
                current = self._head(run_id)
                if current is None or current.write_id != expect.write_id:
                    return None
                generation = self._generation(current)
            except StreamCheckpointError:
                return None  # unreadable: the caller rewrites the whole record
            stored = head.with_extra(text_file=generation)
            if delta:
                fd = os.open(self._text_path(run_id, generation), os.O_WRONLY)
                try:
                    end = current.text_bytes + len(delta)
                    written = current.text_bytes
                    view = memoryview(delta)
                    while view:
                        count = os.pwrite(fd, view, written)
                        written += count
                        view = view[count:]
                    if os.fstat(fd).st_size > end:
                        os.ftruncate(fd, end)  # bytes of an append that crashed before its head
                    self._sync(fd)
                finally:
                    os.close(fd)
            self._replace_file(self._path(run_id, _HEAD_SUFFIX), stored.encode())
        return stored

    def _backend_load(self, run_id: str) -> tuple[Head, bytes] | None:
        with self._locked():
            head = self._head(run_id)
            if head is None:
                return None
            path = self._text_path(run_id, self._generation(head))
            with open(path, "rb") as handle:
                text = handle.read(head.text_bytes)
        return head, text

    def _backend_delete(
        self, run_id: str, epoch: int | None, condition: Callable[[Head], bool] | None
    ) -> bool:
        with self._locked():
            if epoch is not None:
                check_epoch(run_id, epoch, self._epoch(run_id), action="delete")
            head_path = self._path(run_id, _HEAD_SUFFIX)
            if not head_path.exists():
                return False
            generation = None
            try:
                head = self._head(run_id)
                generation = None if head is None else self._generation(head)
            except StreamCheckpointError:
                head = None
            if condition is not None and (head is None or not condition(head)):
                return False
            os.unlink(head_path)
            self._sync_directory()
            if generation is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._text_path(run_id, generation))
        return True

    def _backend_heads(self) -> Iterable[tuple[str, bytes]]:
        found = []
        with self._locked():
            for entry in os.scandir(self.directory):
                if not entry.name.endswith(_HEAD_SUFFIX):
                    continue
                raw = self._read(Path(entry.path))
                if raw is None:
                    continue
                run_id = self._run_id_of(raw)
                if run_id is not None and self._stem(run_id) + _HEAD_SUFFIX == entry.name:
                    found.append((run_id, raw))
        return found

    @staticmethod
    def _run_id_of(raw: bytes) -> str | None:
        """Return the run id recorded in a head file, or ``None`` if unreadable."""
        try:
            obj = decode_json(raw)
        except Exception:
            return None
        fields = obj.get("checkpoint") if isinstance(obj, dict) else None
        run_id = fields.get("run_id") if isinstance(fields, dict) else None
        return run_id if isinstance(run_id, str) else None

    def _backend_cleanup(self) -> None:
        """Remove temp files and text files that no head refers to."""
        with self._locked():
            referenced: set[str] = set()
            unreadable: set[str] = set()
            texts: list[os.DirEntry[str]] = []
            for entry in os.scandir(self.directory):
                name = entry.name
                if name.startswith(_TMP_PREFIX):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
                elif name.endswith(_TEXT_SUFFIX):
                    texts.append(entry)
                elif name.endswith(_HEAD_SUFFIX):
                    raw = self._read(Path(entry.path))
                    obj = None
                    with contextlib.suppress(Exception):
                        obj = decode_json(raw or b"")
                    extra = obj.get("extra") if isinstance(obj, dict) else None
                    generation = extra.get("text_file") if isinstance(extra, dict) else None
                    stem = name[: -len(_HEAD_SUFFIX)]
                    if isinstance(generation, str):
                        referenced.add(f"{stem}.{generation}{_TEXT_SUFFIX}")
                    else:
                        unreadable.add(stem)  # keep its text for whoever repairs it
            for entry in texts:
                stem = entry.name.split(".", 1)[0]
                if entry.name not in referenced and stem not in unreadable:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)


__all__ = ["FileStreamCheckpointStore"]
