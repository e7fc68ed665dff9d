"""What every checkpoint store shares: record layout, fencing, limits, delta writes.

A checkpoint is persisted as two parts:

- a small **head**: every field of the record except ``partial_text``, plus the
  encoded length of the text, a ``write_id`` naming the write that produced the
  stored state, and backend layout details (``extra``);
- the **text**: ``partial_text`` encoded as UTF-8 (lone surrogates kept), stored
  so that it can be extended in place (diskcache segments, frames of an
  append-only log file, a Redis ``APPEND``).

A streamed turn grows its text by a few characters per put. The store remembers,
per run, the text and ``write_id`` it last wrote or read. When a new put's text
extends that text, only the new part is sent to the backend, together with the
remembered ``write_id``; the backend appends only if the stored head still
carries that ``write_id`` (nobody else wrote in between), and otherwise the
store falls back to rewriting the whole record. A put therefore costs the size
of its delta, not the size of the turn, and a stale memory can never splice
text onto someone else's record.

Backends implement a handful of primitives (see :class:`DeltaCheckpointStore`);
each primitive runs atomically in the backend (a diskcache transaction, a file
lock, a Lua script) and applies the fencing rule from :func:`check_epoch` inside
that atomic step.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from abc import abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from awaken_langchain.checkpoint import (
    DEFAULT_MAX_CHECKPOINT_BYTES,
    StreamCheckpoint,
    StreamCheckpointStore,
    check_run_id,
    checkpoint_from_dict,
    decode_json,
    encode_json,
)
from awaken_langchain.errors import StreamCheckpointError, StreamCheckpointFencedError

HEAD_FORMAT = "awaken-checkpoint-head"
"""Marker stored in every head record, so foreign data is recognised as such."""

HEAD_LAYOUT = 1
"""Version of the head/text storage layout written by this release."""

TEXT_ENCODING = "utf-8"
TEXT_ERRORS = "surrogatepass"

MEMO_LIMIT = 256
"""How many runs' last written text a store instance remembers for delta writes.

The remembered text is the caller's own ``partial_text`` string (no copy); an
entry is dropped when its run is deleted or when more runs are written."""


def encode_text(text: str) -> bytes:
    """Encode checkpoint text as UTF-8, keeping lone surrogates."""
    return text.encode(TEXT_ENCODING, TEXT_ERRORS)


def decode_text(data: bytes, *, run_id: str) -> str:
    """Decode text written by :func:`encode_text`.

    Raises:
        StreamCheckpointError: If the bytes are not text this library wrote.
    """
    try:
        return data.decode(TEXT_ENCODING, TEXT_ERRORS)
    except UnicodeDecodeError as exc:
        raise StreamCheckpointError(
            "stored checkpoint text is corrupted (not UTF-8)", run_id=run_id, cause=exc
        ) from exc


def run_id_bytes(run_id: str) -> bytes:
    """Encode a run id as bytes for keys and hashing (lone surrogates kept)."""
    return run_id.encode(TEXT_ENCODING, TEXT_ERRORS)


UNREADABLE_PREFIX = "unreadable-entry:"
"""How the id of a stored entry that names no readable run id starts (see :func:`unreadable_id`)."""


def unreadable_id(locator: bytes) -> str:
    """Name a stored entry whose run id cannot be read, so that it can be listed and removed.

    ``list_run_ids`` reports the entry under this id; ``get`` of the id raises
    the reason and ``delete`` of it removes the entry. A backend acts on the
    locator only when no run of that literal id exists and the entry it locates
    is still unreadable, so a real checkpoint is never removed through it.

    Args:
        locator: Where the backend finds the entry (its raw key, its file name).
    """
    return UNREADABLE_PREFIX + locator.hex()


def unreadable_locator(run_id: str) -> bytes | None:
    """Return the locator an :func:`unreadable_id` carries, or ``None`` for any other id."""
    if not run_id.startswith(UNREADABLE_PREFIX):
        return None
    try:
        return bytes.fromhex(run_id[len(UNREADABLE_PREFIX) :])
    except ValueError:
        return None


def corrupted(run_id: str, what: str) -> StreamCheckpointError:
    """Build the error for a stored record that cannot be read back."""
    return StreamCheckpointError(f"stored checkpoint is corrupted ({what})", run_id=run_id)


def check_epoch(run_id: str, epoch: int, current: int, *, action: str) -> None:
    """Apply the fencing rule to a write carrying ``epoch``.

    ``current`` is the run's epoch counter: the last value ``claim`` returned,
    or 0 when the run was never claimed. A write must carry exactly that epoch;
    epoch 0 on a run that was never claimed is the unfenced mode.

    Raises:
        StreamCheckpointFencedError: If ``epoch`` is older than ``current``.
        StreamCheckpointError: If ``epoch`` is newer than ``current`` (it was
            never handed out by ``claim``).
    """
    if epoch < current:
        raise StreamCheckpointFencedError(run_id, epoch=epoch, current_epoch=current)
    if epoch > current:
        raise StreamCheckpointError(
            f"{action} carries epoch {epoch}, but the run's current epoch is {current}; "
            "epochs come from claim(run_id): claim the run first and write with the "
            "epoch it returns (or use epoch 0 on a run that is never claimed)",
            run_id=run_id,
        )


@dataclass(frozen=True)
class Head:
    """The stored head of a checkpoint: everything but the text.

    Attributes:
        run_id: The run the record belongs to.
        fields: The checkpoint's JSON fields except ``partial_text``.
        text_bytes: Length of the encoded text, in bytes.
        write_id: Random token naming the write that produced this state.
        extra: Backend layout details (diskcache's segment sizes, ...).
    """

    run_id: str
    fields: Mapping[str, Any]
    text_bytes: int
    write_id: str
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def updated_at(self) -> float:
        """When the store wrote the record (seconds since the epoch)."""
        value = self.fields.get("updated_at", 0.0)
        return float(value) if isinstance(value, int | float) else 0.0

    def encode(self) -> bytes:
        """Encode the head as JSON bytes (computed once per head)."""
        return self._encoded

    @functools.cached_property
    def _encoded(self) -> bytes:
        return encode_json(
            {
                "format": HEAD_FORMAT,
                "layout": HEAD_LAYOUT,
                "checkpoint": dict(self.fields),
                "text_bytes": self.text_bytes,
                "write_id": self.write_id,
                "extra": dict(self.extra),
            }
        )

    def with_extra(self, **extra: Any) -> Head:
        """Return a copy with backend layout details set."""
        return Head(self.run_id, self.fields, self.text_bytes, self.write_id, extra)


def decode_head(data: bytes | str, *, run_id: str) -> Head:
    """Decode and validate a head written by :meth:`Head.encode`.

    The checkpoint fields themselves are validated later, when the record is
    rebuilt; this checks the envelope and that the head belongs to ``run_id``.

    Raises:
        StreamCheckpointError: If the data is not a head for ``run_id``.
    """
    obj = decode_json(data, run_id=run_id)
    if not isinstance(obj, dict) or obj.get("format") != HEAD_FORMAT:
        raise StreamCheckpointError(
            "stored checkpoint is corrupted (not a checkpoint head)", run_id=run_id
        )
    layout = obj.get("layout")
    if layout != HEAD_LAYOUT:
        raise StreamCheckpointError(
            f"stored checkpoint has storage layout {layout!r}; this release reads layout "
            f"{HEAD_LAYOUT}; upgrade awaken-langchain or delete the checkpoint",
            run_id=run_id,
        )
    fields = obj.get("checkpoint")
    text_bytes = obj.get("text_bytes")
    write_id = obj.get("write_id")
    extra = obj.get("extra")
    if (
        not isinstance(fields, dict)
        or type(text_bytes) is not int
        or text_bytes < 0
        or not isinstance(write_id, str)
        or not isinstance(extra, dict)
    ):
        raise StreamCheckpointError(
            "stored checkpoint is corrupted (malformed head)", run_id=run_id
        )
    if fields.get("run_id") != run_id:
        raise StreamCheckpointError(
            "stored checkpoint is corrupted (it belongs to another run id)", run_id=run_id
        )
    return Head(run_id, fields, text_bytes, write_id, extra)


def new_write_id() -> str:
    """Return a fresh random token naming one write."""
    return os.urandom(8).hex()


def plan_append(sizes: Sequence[int], delta: int) -> tuple[int, list[int]]:
    """Plan appending ``delta`` bytes to text stored as segments of ``sizes``.

    A new segment is added, then the last two segments are merged while the
    second-to-last is at most twice the last. Segment sizes thus shrink
    geometrically towards the end: a run keeps O(log n) segments, and each byte
    is rewritten O(log n) times over the whole turn, so a put costs about its
    delta however long the text has grown.

    Returns:
        ``(first, new_sizes)``: segments before index ``first`` are untouched;
        segment ``first`` is written with the old segments ``first..`` plus the
        delta; segments beyond ``len(new_sizes)`` no longer exist.
    """
    new = list(sizes)
    if delta == 0:
        return len(new), new
    new.append(delta)
    first = len(new) - 1
    while len(new) >= 2 and new[-2] <= 2 * new[-1]:
        last = new.pop()
        new[-1] += last
        first = len(new) - 1
    return first, new


@dataclass
class LastWrite:
    """What a store instance last wrote (or read) for one run.

    Attributes:
        write_id: The ``write_id`` of the stored head at that time.
        text: The full text stored at that time.
        text_bytes: Its encoded length.
        extra: The stored head's backend layout details at that time.
    """

    write_id: str
    text: str
    text_bytes: int
    extra: Mapping[str, Any]


@dataclass
class PutPlan:
    """One put, prepared by :meth:`DeltaCheckpointStore._prepare_put`.

    Attributes:
        run_id: The run written.
        epoch: The writer's epoch.
        text: The checkpoint's full text.
        fields: Every other field, with ``updated_at`` stamped by the store.
        write_id: The token naming this write.
        last: What this store instance last wrote or read for the run, if anything.
    """

    run_id: str
    epoch: int
    text: str
    fields: dict[str, Any]
    write_id: str
    last: LastWrite | None


class DeltaCheckpointStore(StreamCheckpointStore):
    """A store that persists a head plus appendable text (see module docstring).

    Subclasses implement the ``_backend_*`` primitives. Each one must be atomic
    with respect to other writers of the same backend, and must call
    :func:`check_epoch` with the run's persisted epoch counter before changing
    anything. Any exception a primitive raises that is not already a
    :class:`StreamCheckpointError` is wrapped into one naming the run id.

    A natively async backend overrides ``aput``/``aget`` with the same few
    steps as :meth:`put`/:meth:`get`, built from :meth:`_prepare_put`,
    :meth:`_append_step`, :meth:`_rewrite_step`, :meth:`_finish_put` and
    :meth:`_rebuild`, awaiting its own primitives in between.

    A backend that can open a store for reading only sets ``read_only``; the
    store then refuses ``claim``, ``put``, ``delete`` and ``gc``.
    """

    read_only: bool = False
    """Whether the store was opened for reading only."""

    def __init__(
        self,
        *,
        ttl: float | None = None,
        max_checkpoint_bytes: int = DEFAULT_MAX_CHECKPOINT_BYTES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(ttl=ttl, max_checkpoint_bytes=max_checkpoint_bytes, clock=clock)
        self._memo: OrderedDict[str, LastWrite] = OrderedDict()
        self._memo_lock = threading.Lock()

    # -- backend primitives --------------------------------------------------

    @abstractmethod
    def _backend_claim(self, run_id: str) -> int:
        """Atomically increment and persist the run's epoch counter; return it."""

    @abstractmethod
    def _backend_replace(self, head: Head, text: bytes, epoch: int) -> Head:
        """Atomically fence, then replace the run's head and whole text.

        Returns:
            The head as stored (with any ``extra`` layout details the backend added).
        """

    @abstractmethod
    def _backend_append(
        self, head: Head, delta: bytes, epoch: int, expect: LastWrite
    ) -> Head | None:
        """Atomically fence, then append ``delta`` to the stored text.

        The append happens only if the stored head carries ``expect.write_id``
        (and so the stored text is ``expect.text``); otherwise nothing changes
        and ``None`` is returned so that the caller rewrites. A backend may also
        return ``None`` when it prefers a rewrite (to compact its storage).

        Returns:
            The head as stored, or ``None`` if nothing was written.
        """

    @abstractmethod
    def _backend_load(self, run_id: str) -> tuple[Head, bytes] | None:
        """Return a consistent snapshot of the run's head and text, or ``None``.

        Use :func:`decode_head` on the stored head. The text returned must be
        exactly ``head.text_bytes`` long.
        """

    @abstractmethod
    def _backend_delete(
        self, run_id: str, epoch: int | None, condition: Callable[[Head], bool] | None
    ) -> bool:
        """Atomically fence (when ``epoch`` is given), then delete the run's record.

        The epoch counter is kept. When ``condition`` is given, the record is
        deleted only if its decoded head satisfies it.

        Returns:
            Whether a record was deleted.
        """

    @abstractmethod
    def _backend_heads(self) -> Iterable[tuple[str, bytes]]:
        """Yield ``(run_id, raw head)`` for every stored record."""

    def _backend_cleanup(self) -> None:
        """Remove leftovers of interrupted writes (called by :meth:`gc`)."""
        return None

    # -- the steps of put and get, shared with natively async backends ----------

    def _prepare_put(self, checkpoint: StreamCheckpoint) -> PutPlan:
        """Validate a checkpoint to put and stamp it with the store's clock."""
        if not isinstance(checkpoint, StreamCheckpoint):
            raise StreamCheckpointError(
                f"put expects a StreamCheckpoint, got {type(checkpoint).__name__}"
            )
        self._check_writable("put")
        run_id = check_run_id(checkpoint.run_id)
        fields = checkpoint.model_dump(mode="json", exclude={"partial_text"})
        fields["updated_at"] = max(0.0, self.clock())
        with self._memo_lock:
            last = self._memo.get(run_id)
        return PutPlan(
            run_id, checkpoint.epoch, checkpoint.partial_text, fields, new_write_id(), last
        )

    def _append_step(self, plan: PutPlan) -> tuple[Head, bytes] | None:
        """Return the head and text delta to append, or ``None`` if a rewrite is needed.

        Raises:
            StreamCheckpointError: If the record would exceed ``max_checkpoint_bytes``.
        """
        last = plan.last
        if last is None or not plan.text.startswith(last.text):
            return None
        delta = encode_text(plan.text[len(last.text) :])
        head = Head(plan.run_id, plan.fields, last.text_bytes + len(delta), plan.write_id)
        self._check_size(head)
        return head, delta

    def _rewrite_step(self, plan: PutPlan) -> tuple[Head, bytes]:
        """Return the head and whole text to write.

        Raises:
            StreamCheckpointError: If the record would exceed ``max_checkpoint_bytes``.
        """
        data = encode_text(plan.text)
        head = Head(plan.run_id, plan.fields, len(data), plan.write_id)
        self._check_size(head)
        return head, data

    def _finish_put(self, plan: PutPlan, stored: Head) -> None:
        """Remember what a put wrote, for the next delta write."""
        self._remember(
            plan.run_id, LastWrite(stored.write_id, plan.text, stored.text_bytes, stored.extra)
        )

    def _rebuild(self, run_id: str, loaded: tuple[Head, bytes] | None) -> StreamCheckpoint | None:
        """Turn a loaded head and text into the checkpoint ``get`` returns.

        Raises:
            StreamCheckpointError: If the record is corrupted.
        """
        if loaded is None:
            return None
        head, data = loaded
        if self._expired_head(head):
            return None
        if len(data) != head.text_bytes:
            raise StreamCheckpointError(
                f"stored checkpoint is corrupted (text is {len(data)} bytes, "
                f"the head says {head.text_bytes})",
                run_id=run_id,
            )
        text = decode_text(data, run_id=run_id)
        checkpoint = checkpoint_from_dict({**head.fields, "partial_text": text}, run_id=run_id)
        self._remember(run_id, LastWrite(head.write_id, text, head.text_bytes, head.extra))
        return checkpoint

    # -- the contract ---------------------------------------------------------

    def claim(self, run_id: str) -> int:
        """Take ownership of a run and return its new, strictly larger epoch."""
        check_run_id(run_id)
        self._check_writable("claim")
        with self._backend_errors("claim", run_id):
            return self._backend_claim(run_id)

    def put(self, checkpoint: StreamCheckpoint) -> None:
        """Store the checkpoint, writing only the new text when it extends the last.

        Raises:
            StreamCheckpointFencedError: If ``checkpoint.epoch`` is older than the
                run's current epoch.
            StreamCheckpointError: If the epoch was never claimed, the encoded
                record exceeds ``max_checkpoint_bytes``, or the backend fails.
        """
        plan = self._prepare_put(checkpoint)
        with self._backend_errors("put", plan.run_id):
            stored = None
            append = self._append_step(plan)
            if append is not None and plan.last is not None:
                stored = self._backend_append(*append, plan.epoch, plan.last)
            if stored is None:
                stored = self._backend_replace(*self._rewrite_step(plan), plan.epoch)
        self._finish_put(plan, stored)

    def get(self, run_id: str) -> StreamCheckpoint | None:
        """Return the run's checkpoint, or ``None`` if there is none or it expired.

        Raises:
            StreamCheckpointError: If the stored record is corrupted or the
                backend fails.
        """
        check_run_id(run_id)
        with self._backend_errors("get", run_id):
            loaded = self._backend_load(run_id)
        return self._rebuild(run_id, loaded)

    def delete(self, run_id: str, *, epoch: int | None = None) -> None:
        """Delete the run's checkpoint; a missing checkpoint is not an error.

        The run's epoch counter is kept, so later claims stay strictly larger.

        Raises:
            StreamCheckpointFencedError: If ``epoch`` is older than the run's
                current epoch.
            StreamCheckpointError: If ``epoch`` was never claimed, or the
                backend fails.
        """
        check_run_id(run_id)
        self._check_writable("delete")
        with self._memo_lock:
            self._memo.pop(run_id, None)
        with self._backend_errors("delete", run_id):
            self._backend_delete(run_id, epoch, None)

    def list_run_ids(self) -> list[str]:
        """Return the run ids that have an unexpired checkpoint.

        A record whose head cannot be decoded is listed (its age is unknown), so
        that an operator can find it and delete it.
        """
        with self._backend_errors("list", None):
            heads = list(self._backend_heads())
        found = []
        for run_id, raw in heads:
            try:
                head = decode_head(raw, run_id=run_id)
            except StreamCheckpointError:
                found.append(run_id)
                continue
            if not self._expired_head(head):
                found.append(run_id)
        return sorted(found)

    def gc(self) -> int:
        """Remove expired checkpoints and leftovers of interrupted writes.

        Returns:
            How many expired checkpoints were removed.
        """
        self._check_writable("gc")
        removed = 0
        with self._backend_errors("gc", None):
            candidates = list(self._backend_heads())
        for run_id, raw in candidates:
            try:
                head = decode_head(raw, run_id=run_id)
            except StreamCheckpointError:
                continue
            if not self._expired_head(head):
                continue
            with self._backend_errors("gc", run_id):
                if self._backend_delete(run_id, None, self._expired_head):
                    removed += 1
            with self._memo_lock:
                self._memo.pop(run_id, None)
        with self._backend_errors("gc", None):
            self._backend_cleanup()
        return removed

    # -- helpers for backends ---------------------------------------------------

    def _check_writable(self, action: str) -> None:
        if self.read_only:
            raise StreamCheckpointError(
                f"{type(self).__name__} was opened with read_only=True and cannot {action}; "
                "open it without read_only to change checkpoints"
            )

    def _expired_head(self, head: Head) -> bool:
        keep_for = head.fields.get("keep_for")
        return self.is_expired(
            head.updated_at, keep_for if isinstance(keep_for, int | float) else None
        )

    def _check_size(self, head: Head) -> None:
        size = len(head.encode()) + head.text_bytes
        if size > self.max_checkpoint_bytes:
            raise StreamCheckpointError(
                f"checkpoint is {size} bytes encoded, more than the store's "
                f"max_checkpoint_bytes={self.max_checkpoint_bytes}; nothing was written. "
                "Raise max_checkpoint_bytes when creating the store to keep turns this long",
                run_id=head.run_id,
            )

    def _remember(self, run_id: str, memo: LastWrite) -> None:
        with self._memo_lock:
            self._memo[run_id] = memo
            self._memo.move_to_end(run_id)
            while len(self._memo) > MEMO_LIMIT:
                self._memo.popitem(last=False)

    @contextlib.contextmanager
    def _backend_errors(self, action: str, run_id: str | None) -> Iterator[None]:
        """Turn any backend exception into a :class:`StreamCheckpointError`."""
        try:
            yield
        except StreamCheckpointError:
            raise
        except Exception as exc:
            raise StreamCheckpointError(
                f"{type(self).__name__}.{action} failed", run_id=run_id, cause=exc
            ) from exc


__all__ = [
    "DeltaCheckpointStore",
    "Head",
    "LastWrite",
    "PutPlan",
    "check_epoch",
    "corrupted",
    "decode_head",
    "decode_text",
    "encode_text",
    "new_write_id",
    "plan_append",
    "run_id_bytes",
    "unreadable_id",
    "unreadable_locator",
]
