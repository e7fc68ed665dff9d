"""An in-process checkpoint store for tests and single-process use."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable
from typing import ClassVar

from awaken_langchain.checkpoint import DEFAULT_MAX_CHECKPOINT_BYTES, StreamCheckpoint
from awaken_langchain.errors import StreamCheckpointError
from awaken_langchain.stores._base import (
    DEFAULT_EPOCH_GRACE,
    DeltaCheckpointStore,
    Head,
    LastWrite,
    check_epoch,
    decode_head,
    next_epoch,
)

COLLECT_EVERY = 60.0
"""Seconds of the store's clock between the collections its claims run.

Nothing outside the process can call ``gc`` on an in-process store, and few
applications do it from inside: every so often a claim removes what has
expired (checkpoints past their ttl, epoch records past their grace) itself."""


class InMemoryStreamCheckpointStore(DeltaCheckpointStore):
    """Keeps checkpoints in a dictionary of this process; thread-safe, deterministic.

    Records are held encoded (JSON head plus UTF-8 text), exactly as the durable
    stores write them, so tests exercise the same encoding, fencing and delta
    rules. Nothing survives the process. What expires (checkpoints past their
    ``ttl``, epoch records past their grace) is removed by ``gc`` or, at most
    once per `COLLECT_EVERY` seconds, by a claim.

    Args:
        ttl: Seconds after its last write when a checkpoint expires, or ``None``.
        max_checkpoint_bytes: Largest encoded checkpoint the store accepts.
        clock: Wall-clock time source, injectable for tests.
        epoch_grace: Seconds a run's epoch record outlives its last claim
            when nothing ends the run (a run that ends takes its record with it).
        signing_key: Key that signs every record this store writes and must
            verify every record it reads; ``None`` reads the
            ``AWAKEN_CHECKPOINT_SIGNING_KEY`` environment variable (unset: no
            signing). See "Trust model and signing" in docs/stores.md.
    """

    answers_at_once: ClassVar[bool] = True
    """Its operations only take a lock held for dictionary updates: a turn runs its
    claim, its last write or delete and (at most once per gathering time) its
    checkpoints on its own thread when the store's writer holds nothing they must
    follow (see `CheckpointWriter.call` and `CheckpointWriter.submit`). A subclass
    keeps the writer thread unless it sets this again in its own body."""

    takes_deferred: ClassVar[bool] = True
    """Its puts take a stream's captures unbuilt (see `StreamCheckpointStore.takes_deferred`)."""

    def __init__(
        self,
        *,
        ttl: float | None = None,
        max_checkpoint_bytes: int = DEFAULT_MAX_CHECKPOINT_BYTES,
        clock: Callable[[], float] = time.time,
        epoch_grace: float = DEFAULT_EPOCH_GRACE,
        signing_key: str | bytes | None = None,
    ) -> None:
        super().__init__(
            ttl=ttl,
            max_checkpoint_bytes=max_checkpoint_bytes,
            clock=clock,
            epoch_grace=epoch_grace,
            signing_key=signing_key,
        )
        self._lock = threading.Lock()
        self._heads: dict[str, bytes] = {}
        self._texts: dict[str, bytearray] = {}
        self._write_ids: dict[str, str] = {}
        self._epochs: dict[str, tuple[int, float]] = {}
        """Per run: the epoch counter and until when the record is kept."""
        self._epoch_floor = 0
        self._collect_at = clock() + COLLECT_EVERY
        """When a claim next runs ``gc`` (the store's clock)."""

    def claim(self, run_id: str) -> int:
        """Take ownership of a run and return its new, strictly larger epoch.

        At most once per `COLLECT_EVERY` seconds, the claim first removes what
        has expired, as ``gc`` does: a process that never calls ``gc`` still
        keeps no expired checkpoint or epoch record for long.
        """
        now = self.clock()
        if now >= self._collect_at:
            self._collect_at = now + COLLECT_EVERY
            self.gc()
        return super().claim(run_id)

    def _epoch(self, run_id: str) -> int:
        return self._epochs.get(run_id, (0, 0.0))[0]

    def _backend_claim(self, run_id: str) -> int:
        with self._lock:
            epoch = next_epoch(self._epoch(run_id), self._epoch_floor)
            self._epochs[run_id] = (epoch, self._keep_until())
            return epoch

    def _backend_collect_epochs(self) -> None:
        now = self.clock()
        with self._lock:
            for run_id, (epoch, keep_until) in list(self._epochs.items()):
                if run_id not in self._heads and now > keep_until:
                    self._epoch_floor = max(self._epoch_floor, epoch)
                    del self._epochs[run_id]

    def _backend_replace(self, head: Head, text: bytes, epoch: int) -> Head:
        with self._lock:
            check_epoch(
                head.run_id,
                epoch,
                self._epoch(head.run_id),
                action="put",
                floor=self._epoch_floor,
            )
            self._heads[head.run_id] = head.encode()
            self._texts[head.run_id] = bytearray(text)
            self._write_ids[head.run_id] = head.write_id
            return head

    def _backend_append(
        self, head: Head, delta: bytes, epoch: int, expect: LastWrite
    ) -> Head | None:
        run_id = head.run_id
        with self._lock:
            check_epoch(run_id, epoch, self._epoch(run_id), action="put", floor=self._epoch_floor)
            text = self._texts.get(run_id)
            if text is None or self._write_ids.get(run_id) != expect.write_id:
                return None
            text += delta
            self._heads[run_id] = head.encode()
            self._write_ids[run_id] = head.write_id
            return head

    def _backend_load(self, run_id: str) -> tuple[Head, bytes] | None:
        with self._lock:
            raw = self._heads.get(run_id)
            text = self._texts.get(run_id)
            if raw is None:
                return None
            return decode_head(raw, run_id=run_id), bytes(text or b"")

    def _backend_delete(
        self, run_id: str, epoch: int | None, condition: Callable[[Head], bool] | None
    ) -> bool:
        with self._lock:
            if epoch is not None:
                check_epoch(
                    run_id, epoch, self._epoch(run_id), action="delete", floor=self._epoch_floor
                )
            raw = self._heads.get(run_id)
            if raw is None:
                self._end_record(run_id, epoch, None, removed=False)
                return False
            head = None
            if condition is not None or epoch is None:
                with contextlib.suppress(StreamCheckpointError):  # unreadable: not ours to judge
                    head = decode_head(raw, run_id=run_id)
            if condition is not None and (head is None or not condition(head)):
                return False
            del self._heads[run_id]
            self._texts.pop(run_id, None)
            self._write_ids.pop(run_id, None)
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
        """After a delete: end the run's epoch record if the run is over.

        Otherwise a record whose checkpoint was ``removed`` is kept on for
        ``epoch_grace``.
        """
        record = self._epochs.get(run_id)
        if record is None:
            return
        if self._ends_record(record[0], epoch, deleted, expired=expired):
            self._epoch_floor = max(self._epoch_floor, record[0])
            del self._epochs[run_id]
        elif removed:
            keep = self._keep_until(deleted if expired else None)
            self._epochs[run_id] = (record[0], max(record[1], keep))

    def _backend_heads(self) -> Iterable[tuple[str, bytes]]:
        with self._lock:
            return list(self._heads.items())

    # -- async twins: nothing here blocks, so they run inline (no thread hop) ------

    async def aget(self, run_id: str) -> StreamCheckpoint | None:
        """Async twin of :meth:`get`, run inline: the store does no I/O."""
        return self.get(run_id)

    async def aput(self, checkpoint: StreamCheckpoint) -> None:
        """Async twin of :meth:`put`, run inline: the store does no I/O."""
        self.put(checkpoint)

    async def adelete(self, run_id: str, *, epoch: int | None = None) -> None:
        """Async twin of :meth:`delete`, run inline: the store does no I/O."""
        self.delete(run_id, epoch=epoch)

    async def aclaim(self, run_id: str) -> int:
        """Async twin of :meth:`claim`, run inline: the store does no I/O."""
        return self.claim(run_id)
