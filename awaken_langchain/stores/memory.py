"""An in-process checkpoint store for tests and single-process use."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from awaken_langchain.checkpoint import DEFAULT_MAX_CHECKPOINT_BYTES, StreamCheckpoint
from awaken_langchain.stores._base import (
    DeltaCheckpointStore,
    Head,
    LastWrite,
    check_epoch,
    decode_head,
)


class InMemoryStreamCheckpointStore(DeltaCheckpointStore):
    """Keeps checkpoints in a dictionary of this process; thread-safe, deterministic.

    Records are held encoded (JSON head plus UTF-8 text), exactly as the durable
    stores write them, so tests exercise the same encoding, fencing and delta
    rules. Nothing survives the process.

    Args:
        ttl: Seconds after its last write when a checkpoint expires, or ``None``.
        max_checkpoint_bytes: Largest encoded checkpoint the store accepts.
        clock: Wall-clock time source, injectable for tests.
    """

    def __init__(
        self,
        *,
        ttl: float | None = None,
        max_checkpoint_bytes: int = DEFAULT_MAX_CHECKPOINT_BYTES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(ttl=ttl, max_checkpoint_bytes=max_checkpoint_bytes, clock=clock)
        self._lock = threading.Lock()
        self._heads: dict[str, bytes] = {}
        self._texts: dict[str, bytearray] = {}
        self._write_ids: dict[str, str] = {}
        self._epochs: dict[str, int] = {}

    def _backend_claim(self, run_id: str) -> int:
        with self._lock:
            epoch = self._epochs.get(run_id, 0) + 1
            self._epochs[run_id] = epoch
            return epoch

    def _backend_replace(self, head: Head, text: bytes, epoch: int) -> Head:
        with self._lock:
            check_epoch(head.run_id, epoch, self._epochs.get(head.run_id, 0), action="put")
            self._heads[head.run_id] = head.encode()
            self._texts[head.run_id] = bytearray(text)
            self._write_ids[head.run_id] = head.write_id
            return head

    def _backend_append(
        self, head: Head, delta: bytes, epoch: int, expect: LastWrite
    ) -> Head | None:
        run_id = head.run_id
        with self._lock:
            check_epoch(run_id, epoch, self._epochs.get(run_id, 0), action="put")
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
                check_epoch(run_id, epoch, self._epochs.get(run_id, 0), action="delete")
            raw = self._heads.get(run_id)
            if raw is None:
                return False
            if condition is not None and not condition(decode_head(raw, run_id=run_id)):
                return False
            del self._heads[run_id]
            self._texts.pop(run_id, None)
            self._write_ids.pop(run_id, None)
            return True

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
