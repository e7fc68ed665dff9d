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

Signed records
--------------

With a signing key (``signing_key=``, or ``AWAKEN_CHECKPOINT_SIGNING_KEY``),
every head also carries ``text_sha256``, the SHA-256 of the whole encoded text,
and ``signature``, an HMAC-SHA256 under the key of the run id, the checkpoint
fields, the text length and ``text_sha256`` (:func:`signed_content`). The head
thus vouches for the text, and the signature for the head and its run: a record
changed in any byte, or moved under another run id, no longer verifies, and
``get`` refuses it. A delta write stays cheap: the store keeps the SHA-256 state
of the text it last wrote or read (with the remembered text), so an append
hashes only its delta before signing the new head. Only ``get`` reads and hashes
the whole text, to check it.

Epoch records and their horizon
-------------------------------

``claim`` keeps a per-run **epoch record**: the run's counter, and the time
until which the record must be kept. A record ends when its run ends, so a
store holds no bookkeeping of finished turns:

- The record ends with the delete that ends the run: its owner's ``delete``
  with its epoch (the turn finished), a ``delete`` of the complete checkpoint
  the current owner wrote last (memory committed the turn), or ``gc`` removing
  the current owner's expired checkpoint (nothing was written for ``ttl``).
- A record whose run has not visibly ended (a claim not yet followed by a
  write, a checkpoint deleted without an epoch, a checkpoint that expired
  after someone claimed the run again) is kept until ``keep_until``: a claim
  sets it to ``now + epoch_grace``, a delete to ``now + epoch_grace``, ``gc``
  removing an expired checkpoint to ``epoch_grace`` after its last write. ``gc``
  removes such a record once the run has no checkpoint and ``keep_until`` has
  passed.
- In the same atomic step as removing a record, the store raises its
  **epoch floor** to at least the record's counter; the floor never decreases.
  A claim returns ``max(counter, floor) + 1`` (:func:`next_epoch`).

Why claims stay strictly increasing forever: every epoch ever handed out for a
run is at most its record's counter while the record exists, and at most the
floor once it was removed. ``max(counter, floor) + 1`` exceeds them all, with
no clock involved.

Why a stale writer is still fenced after its run's record was removed: a
write must carry exactly the run's current counter. With no record the
counter is 0, and a writer holding a claimed epoch at most the floor held a
record that has ended (:func:`check_epoch`): it is fenced. Once someone claims
again, the new epoch exceeds the stale one. Only epoch 0 (a writer that never
claims) passes on a run without a record, exactly as on a run nobody ever
claimed: mixing such writers with claiming ones on one run is fenced only
while the run's record lives.

The Redis store cannot raise a floor when its keys expire (Redis expires them
on its own, and a cluster has no key every run's script may touch), so its floor
is the clock; see :mod:`awaken_langchain.stores.redis`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import hashlib
import hmac
import itertools
import json
import os
import threading
import time
from abc import abstractmethod
from collections import OrderedDict
from collections.abc import (
    AsyncGenerator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, cast

from awaken_langchain._secrets import redact
from awaken_langchain.checkpoint import (
    DEFAULT_MAX_CHECKPOINT_BYTES,
    DeferredCheckpoint,
    FieldsCode,
    GrowingText,
    StreamCheckpoint,
    StreamCheckpointStore,
    check_run_id,
    checkpoint_from_dict,
    checkpoint_with_text,
    decode_json,
    encode_fields_again,
    encode_json,
    encode_json_string,
)
from awaken_langchain.errors import StreamCheckpointError, StreamCheckpointFencedError

R = TypeVar("R")
"""A resource kept per event loop (see `PerLoop`)."""

HEAD_FORMAT = "awaken-checkpoint-head"
"""Marker stored in every head record, so foreign data is recognised as such."""

HEAD_LAYOUT = 1
"""Version of the head/text storage layout written by this release."""

TEXT_ENCODING = "utf-8"
TEXT_ERRORS = "surrogatepass"

SIGNING_KEY_ENV = "AWAKEN_CHECKPOINT_SIGNING_KEY"
"""Environment variable holding the signing key when ``signing_key`` is not given."""

MIN_SIGNING_KEY_BYTES = 16
"""Shortest signing key a store accepts, in bytes (UTF-8 for a ``str`` key)."""

SIGNATURE_DOMAIN = b"awaken-checkpoint-signature-v1\x00"
"""Prefix of every signed message, so the key signs nothing else by accident."""

DEFAULT_EPOCH_GRACE = 3600.0
"""Seconds a run's epoch record outlives its last claim, when nothing ends the run (one hour)."""

MEMO_LIMIT = 256
"""How many runs' last written text a store instance remembers for delta writes.

The remembered text is the caller's own text (its ``partial_text`` string, or
the string and list of pieces a `DeferredCheckpoint` was captured from; no
copy); an entry is dropped when its run is deleted or when more runs are written."""


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


NO_FOLLOW = getattr(os, "O_NOFOLLOW", 0)
"""``open`` flag that refuses a symbolic link as the last path component (0 on Windows)."""


def linked_path_error(path: str | os.PathLike[str]) -> StreamCheckpointError:
    """Build the error for a symbolic link where a store expects its own file or directory."""
    return StreamCheckpointError(
        f"{os.fspath(path)} is a symbolic link; checkpoint stores never follow links, "
        "which could redirect their writes and permission changes elsewhere. Remove the "
        "link, or give the store the real directory (Path(...).resolve())"
    )


def open_no_follow(path: str | os.PathLike[str], flags: int, mode: int = 0o600) -> int:
    """``os.open`` that refuses a symbolic link as the last component of ``path``.

    Raises:
        StreamCheckpointError: If ``path`` is a symbolic link.
        OSError: On any other failure to open it.
    """
    try:
        return os.open(path, flags | NO_FOLLOW, mode)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK) and os.path.islink(path):
            raise linked_path_error(path) from exc
        raise


def make_private_directory(path: str | os.PathLike[str]) -> None:
    """Create ``path`` (and its parents) if missing and make it private (0700).

    The last component is never followed when it is a symbolic link: the mode
    is set through a descriptor opened with ``O_NOFOLLOW``, so a link swapped
    in after the check cannot redirect the ``chmod`` either.

    Raises:
        StreamCheckpointError: If ``path`` is a symbolic link.
        OSError: If it cannot be created or is not a directory.
    """
    if os.path.islink(path):
        raise linked_path_error(path)
    os.makedirs(path, mode=0o700, exist_ok=True)
    if not hasattr(os, "fchmod"):  # pragma: no cover - Windows
        os.chmod(path, 0o700)
        return
    fd = open_no_follow(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")
"""The files SQLite keeps next to a database while it writes it."""


def make_private_database(path: str | os.PathLike[str]) -> None:
    """Create the SQLite file ``path`` private (0600) before SQLite opens it.

    SQLite gives its -wal and -shm files the database file's mode, so a
    database created private keeps its side files private whatever the umask.
    An existing database, and side files left by an earlier writer, are made
    private too. Never follows a symbolic link at ``path``.

    Raises:
        StreamCheckpointError: If ``path`` is a symbolic link.
        OSError: If the file cannot be created.
    """
    fd = open_no_follow(path, os.O_WRONLY | os.O_CREAT)
    try:
        if hasattr(os, "fchmod"):
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    for suffix in SQLITE_SIDE_FILES:
        side = os.fspath(path) + suffix
        if not os.path.islink(side):
            # another process's SQLite may remove it meanwhile (its last connection closing)
            with contextlib.suppress(FileNotFoundError):
                os.chmod(side, 0o600)


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


def connection_failure(
    message: str, exc: BaseException, *, run_id: str | None, spec: str | None
) -> StreamCheckpointError:
    """The error for a server or network failure: ``message``, then what went wrong.

    The cause's text is masked with :func:`~awaken_langchain._secrets.redact`
    (``spec`` is the store's connection string, whose secrets are masked wherever
    the driver quotes them); the cause is kept as ``.cause``. Raise it ``from
    None``, so that no traceback prints the driver's unmasked message.
    """
    why = redact(f"{type(exc).__name__}: {str(exc).strip()}", spec=spec)
    error = StreamCheckpointError(f"{message}: {why}", run_id=run_id)
    error.cause = exc
    return error


def next_epoch(current: int, floor: int) -> int:
    """The epoch a claim hands out: above the run's counter and the store's floor.

    Args:
        current: The run's counter (0 when it has no epoch record).
        floor: At least every epoch of a record the store has removed.
    """
    return max(current, floor) + 1


def check_epoch(
    run_id: str,
    epoch: int,
    current: int,
    *,
    action: str,
    floor: int | Callable[[], int] = 0,
) -> None:
    """Apply the fencing rule to a write carrying ``epoch``.

    ``current`` is the run's epoch counter: the last value ``claim`` returned,
    or 0 when the run was never claimed or its record has ended. A write must
    carry exactly that epoch; epoch 0 on a run without a record is the
    unfenced mode. ``floor`` is the store's epoch floor (or what reads it, only
    called when needed): a writer of a run without a record whose epoch is at
    most the floor held a record that has ended, so its run is over.

    Raises:
        StreamCheckpointFencedError: If ``epoch`` is older than ``current``, or
            the run has no record and ``epoch`` is at most ``floor``.
        StreamCheckpointError: If ``epoch`` is newer than ``current`` (it was
            never handed out by ``claim``).
    """
    if epoch < current:
        raise StreamCheckpointFencedError(run_id, epoch=epoch, current_epoch=current)
    if epoch > current:
        if current == 0:
            ended = floor() if callable(floor) else floor
            if epoch <= ended:  # its record ended with the run (or was collected)
                raise StreamCheckpointFencedError(
                    run_id, epoch=epoch, current_epoch=ended, ended=True
                )
        raise StreamCheckpointError(
            f"{action} carries epoch {epoch}, but the run's current epoch is {current}; "
            "epochs come from claim(run_id): claim the run first and write with the "
            "epoch it returns (or use epoch 0 on a run that is never claimed)",
            run_id=run_id,
        )


class EncodedFields(Mapping[str, Any]):
    """A checkpoint's fields (all but ``partial_text``), held as the JSON bytes a head stores.

    A put encodes its checkpoint once (:func:`encode_fields`) and the head embeds
    these bytes as they are; the mapping itself is decoded from them only when
    something reads it (a signature, a size check of a signed record).
    """

    __slots__ = ("_decoded", "data")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self._decoded: dict[str, Any] | None = None

    def _fields(self) -> dict[str, Any]:
        decoded = self._decoded
        if decoded is None:
            decoded = self._decoded = decode_json(self.data)
        return decoded

    def __getitem__(self, key: str) -> Any:
        return self._fields()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields())

    def __len__(self) -> int:
        return len(self._fields())


_HEAD_PREFIX = b'{"format":"%s","layout":%d,"checkpoint":' % (HEAD_FORMAT.encode(), HEAD_LAYOUT)


def _encode_extra(extra: Mapping[str, Any]) -> bytes:
    """``encode_json(dict(extra))``, written directly for the usual segment list."""
    if not extra:
        return b"{}"
    sizes = extra.get("segments") if len(extra) == 1 else None
    if type(sizes) is list and all(type(n) is int for n in sizes):
        return segments_extra(sizes)
    return encode_json(dict(extra))


def segments_extra(sizes: Sequence[int]) -> bytes:
    """The encoded ``extra`` of a head whose text is stored as segments of ``sizes`` bytes."""
    return b'{"segments":[%s]}' % ",".join(map(str, sizes)).encode()


def encode_unsigned_head(fields: bytes, text_bytes: int, write_id: str, extra: bytes) -> bytes:
    """An unsigned head's JSON bytes, from its fields and its ``extra`` encoded already.

    The bytes `Head.encode` writes for a head of `EncodedFields` without a
    signature; a store that knows a put's layout builds them without a `Head`.
    """
    return b"".join(
        (
            _HEAD_PREFIX,
            fields,
            b',"text_bytes":%d,"write_id":' % text_bytes,
            encode_json_string(write_id).encode(TEXT_ENCODING, TEXT_ERRORS),
            b',"extra":',
            extra,
            b"}",
        )
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
        text_sha256: Hex SHA-256 of the encoded text (signed records only).
        signature: Hex HMAC-SHA256 of :func:`signed_content` (signed records only).
    """

    run_id: str
    fields: Mapping[str, Any]
    text_bytes: int
    write_id: str
    extra: Mapping[str, Any] = field(default_factory=dict)
    text_sha256: str | None = None
    signature: str | None = None

    @property
    def updated_at(self) -> float:
        """When the store wrote the record (seconds since the epoch)."""
        value = self.fields.get("updated_at", 0.0)
        return float(value) if isinstance(value, int | float) else 0.0

    def encode(self) -> bytes:
        """Encode the head as JSON bytes (computed once per head).

        Kept in the instance's ``__dict__`` by hand: ``functools.cached_property``
        takes a lock shared by every head of every thread (Python 3.11).
        """
        encoded: bytes | None = self.__dict__.get("_encoded")
        if encoded is None:
            encoded = self.__dict__["_encoded"] = self._encode()
        return encoded

    def _encode(self) -> bytes:
        fields = self.fields
        if isinstance(fields, EncodedFields) and self.signature is None:
            # the same bytes as below, without decoding and re-encoding the fields
            return encode_unsigned_head(
                fields.data, self.text_bytes, self.write_id, _encode_extra(self.extra)
            )
        obj = {
            "format": HEAD_FORMAT,
            "layout": HEAD_LAYOUT,
            "checkpoint": dict(self.fields),
            "text_bytes": self.text_bytes,
            "write_id": self.write_id,
            "extra": dict(self.extra),
        }
        if self.signature is not None:
            obj["text_sha256"] = self.text_sha256
            obj["signature"] = self.signature
        return encode_json(obj)

    def with_extra(self, **extra: Any) -> Head:
        """Return a copy with backend layout details set."""
        return dataclasses.replace(self, extra=extra)


def unsigned_head(
    run_id: str, fields: Mapping[str, Any], text_bytes: int, write_id: str, extra: Mapping[str, Any]
) -> Head:
    """``Head(run_id, fields, text_bytes, write_id, extra)``, built directly.

    The frozen dataclass's ``__init__`` sets each of the seven fields through
    ``object.__setattr__``; a put that appends builds one head per put.
    """
    head = object.__new__(Head)
    _set_head_attribute(
        head,
        "__dict__",
        {
            "run_id": run_id,
            "fields": fields,
            "text_bytes": text_bytes,
            "write_id": write_id,
            "extra": extra,
            "text_sha256": None,
            "signature": None,
        },
    )
    return head


_set_head_attribute = object.__setattr__


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
    text_sha256 = obj.get("text_sha256")
    signature = obj.get("signature")
    if (
        not isinstance(fields, dict)
        or type(text_bytes) is not int
        or text_bytes < 0
        or not isinstance(write_id, str)
        or not isinstance(extra, dict)
        or not isinstance(text_sha256, str | None)
        or not isinstance(signature, str | None)
    ):
        raise StreamCheckpointError(
            "stored checkpoint is corrupted (malformed head)", run_id=run_id
        )
    if fields.get("run_id") != run_id:
        raise StreamCheckpointError(
            "stored checkpoint is corrupted (it belongs to another run id)", run_id=run_id
        )
    return Head(run_id, fields, text_bytes, write_id, extra, text_sha256, signature)


def signed_content(
    run_id: str, fields: Mapping[str, Any], text_bytes: int, text_sha256: str
) -> bytes:
    """The bytes a record's signature covers: its run id, fields and text digest.

    Canonical JSON (sorted keys), so that a head decoded from storage gives the
    same bytes as the head that was signed.
    """
    content = {
        "run_id": run_id,
        "checkpoint": dict(fields),
        "text_bytes": text_bytes,
        "text_sha256": text_sha256,
    }
    encoded = json.dumps(content, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    return SIGNATURE_DOMAIN + encoded.encode(TEXT_ENCODING, TEXT_ERRORS)


def resolve_signing_key(signing_key: str | bytes | None) -> bytes | None:
    """Return the store's signing key: the argument, else the environment variable.

    Raises:
        ValueError: If the key is shorter than ``MIN_SIGNING_KEY_BYTES``.
    """
    setting = "signing_key"
    if signing_key is None:
        signing_key = os.environ.get(SIGNING_KEY_ENV) or None
        setting = SIGNING_KEY_ENV
    if signing_key is None:
        return None
    key = signing_key.encode("utf-8") if isinstance(signing_key, str) else bytes(signing_key)
    if len(key) < MIN_SIGNING_KEY_BYTES:
        raise ValueError(
            f"{setting} is {len(key)} bytes long; a signing key needs at least "
            f"{MIN_SIGNING_KEY_BYTES} (make one with: python -c "
            "'import secrets; print(secrets.token_hex(32))')"
        )
    return key


_write_prefix = ""
_write_numbers = itertools.count()


def _draw_write_prefix() -> None:
    global _write_prefix
    _write_prefix = os.urandom(8).hex()


_draw_write_prefix()
os.register_at_fork(after_in_child=_draw_write_prefix)


def new_write_id() -> str:
    """Return a token naming one write, distinct from every other writer's.

    A random prefix drawn once per process (and again in a forked child), then
    a number counted up per write. Drawing random bytes for each write would
    make a system call that releases the GIL, and a writer thread that gives
    up the GIL waits for a busy event loop or caller to give it back.
    """
    return f"{_write_prefix}{next(_write_numbers):x}"


def segment_sizes(extra: Any) -> list[int] | None:
    """The segment sizes a head's ``extra`` lists, or ``None`` if it lists none readable."""
    sizes = extra.get("segments") if isinstance(extra, Mapping) else None
    if not isinstance(sizes, list) or not all(type(n) is int and n > 0 for n in sizes):
        return None
    return sizes


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
        text: The full text stored at that time (joined only if something read it whole).
        text_bytes: Its encoded length.
        extra: The stored head's backend layout details at that time.
        text_hash: SHA-256 state over the encoded text (signing stores only), so
            that the next append hashes only its delta.
        state: What the backend keeps of the stored record to write the next
            put without reading it back (``None``: nothing).
        fields_code: The fields as encoded then, to encode the next put's again
            (`encode_fields_again`; ``None`` after a read or a record pydantic
            encoded).
    """

    write_id: str
    text: GrowingText
    text_bytes: int
    extra: Mapping[str, Any]
    text_hash: Any = None
    state: Any = None
    fields_code: FieldsCode | None = None


@dataclass
class PutPlan:
    """One put, prepared by :meth:`DeltaCheckpointStore._prepare_put`.

    Attributes:
        run_id: The run written.
        epoch: The writer's epoch.
        text: The checkpoint's full text (joined only when a rewrite writes it whole).
        fields: Every other field, with ``updated_at`` stamped by the store.
        write_id: The token naming this write.
        last: What this store instance last wrote or read for the run, if anything.
        text_hash: SHA-256 state over the text the last step prepared (signing
            stores only).
        fields_code: The fields as encoded, for the run's next put.
    """

    run_id: str
    epoch: int
    text: GrowingText
    fields: Mapping[str, Any]
    write_id: str
    last: LastWrite | None
    text_hash: Any = None
    fields_code: FieldsCode | None = None


class DeltaCheckpointStore(StreamCheckpointStore):
    """A store that persists a head plus appendable text (see module docstring).

    Args:
        ttl: Seconds after its last write when a checkpoint expires, or ``None``.
        max_checkpoint_bytes: Largest encoded checkpoint the store accepts.
        clock: Wall-clock time source, injectable for tests.
        epoch_grace: Seconds a run's epoch record outlives its last claim, or
            a checkpoint whose removal did not end the run (see the module
            docstring: a run that ends takes its record with it, and claims
            stay strictly increasing after it is removed).
        signing_key: Key that signs every record written and must verify every
            record read (``None``: the ``AWAKEN_CHECKPOINT_SIGNING_KEY``
            environment variable, if set; otherwise records are not signed).

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
        epoch_grace: float = DEFAULT_EPOCH_GRACE,
        signing_key: str | bytes | None = None,
    ) -> None:
        super().__init__(ttl=ttl, max_checkpoint_bytes=max_checkpoint_bytes, clock=clock)
        self._signing_key = resolve_signing_key(signing_key)
        if not epoch_grace > 0:
            raise ValueError(
                f"epoch_grace must be a positive number of seconds, got {epoch_grace!r}"
            )
        self.epoch_grace = float(epoch_grace)
        self._memo: OrderedDict[str, LastWrite] = OrderedDict()
        self._memo_lock = threading.Lock()

    # -- backend primitives --------------------------------------------------

    @abstractmethod
    def _backend_claim(self, run_id: str) -> int:
        """Atomically hand out the run's next epoch and persist it; return it.

        The epoch is :func:`next_epoch` of the run's counter and the store's
        floor; the record is kept until at least :meth:`_keep_until`.
        """

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

        When ``condition`` is given (``gc``: the record expired), the record is
        deleted only if its decoded head satisfies it. In the same atomic
        step, the run's epoch record ends if :meth:`_ends_record` says the
        delete ends the run (raising the epoch floor to its counter), even
        when there was no checkpoint to delete; otherwise it is kept, until at
        least :meth:`_keep_until` when a checkpoint was deleted.

        Returns:
            Whether a record was deleted.
        """

    @abstractmethod
    def _backend_heads(self) -> Iterable[tuple[str, bytes]]:
        """Yield ``(run_id, raw head)`` for every stored record."""

    @abstractmethod
    def _backend_collect_epochs(self) -> None:
        """Remove the epoch records of runs without a checkpoint whose time has passed.

        Each removal raises the store's epoch floor to at least the removed
        counter in the same atomic step (see the module docstring).
        """

    def _backend_cleanup(self) -> None:
        """Remove leftovers of interrupted writes (called by :meth:`gc`)."""
        return None

    @staticmethod
    def _ends_record(
        counter: int, epoch: int | None, deleted: Head | None, *, expired: bool = False
    ) -> bool:
        """Whether removing a run's checkpoint ends the run's epoch record (the run is over).

        It does when the run's owner deletes it with its epoch (``epoch``, which
        passed the fencing check), and when the checkpoint removed was the last
        write of the run's current owner (nobody claimed since) and either
        complete (its turn finished) or ``expired`` (``gc``: nothing was written
        for ``ttl``). A record without a checkpoint ends at ``gc`` after
        ``epoch_grace``.

        Args:
            counter: The run's epoch counter (0: no record).
            epoch: The epoch the delete carries, or ``None``.
            deleted: The head of the checkpoint removed, when it was read.
            expired: ``gc`` removes the checkpoint as expired.
        """
        if counter <= 0:
            return False
        if epoch is not None:
            return epoch == counter
        if deleted is None or deleted.fields.get("epoch") != counter:
            return False
        return expired or deleted.fields.get("complete") is True

    def _keep_until(self, deleted: Head | None = None) -> float:
        """Until when an epoch record must be kept after a claim or a checkpoint's removal.

        Args:
            deleted: The head of a checkpoint ``gc`` removed as expired: the
                record is kept ``epoch_grace`` after that checkpoint's last
                write. ``None`` for a claim or a ``delete``: ``epoch_grace``
                from now.
        """
        touched = self.clock() if deleted is None else deleted.updated_at
        return touched + self.epoch_grace

    # -- the steps of put and get, shared with natively async backends ----------

    def _prepare_put(self, checkpoint: StreamCheckpoint | DeferredCheckpoint) -> PutPlan:
        """Validate a checkpoint to put and stamp it with the store's clock.

        A `DeferredCheckpoint`'s text stays unjoined: an append writes only
        what was appended since the run's last write.
        """
        if type(checkpoint) is DeferredCheckpoint:
            text = checkpoint.text
            checkpoint = checkpoint_with_text(checkpoint.fields, "")  # the fields alone
        elif isinstance(checkpoint, StreamCheckpoint):
            text = GrowingText(checkpoint.partial_text)
        else:
            raise StreamCheckpointError(
                f"put expects a StreamCheckpoint, got {type(checkpoint).__name__}"
            )
        self._check_writable("put")
        run_id = check_run_id(checkpoint.run_id)
        with self._memo_lock:
            last = self._memo.get(run_id)
        data, code = encode_fields_again(
            checkpoint, max(0.0, self.clock()), None if last is None else last.fields_code
        )
        return PutPlan(
            run_id,
            checkpoint.epoch,
            text,
            EncodedFields(data),
            new_write_id(),
            last,
            fields_code=code,
        )

    def _append_step(self, plan: PutPlan) -> tuple[Head, bytes] | None:
        """Return the head and text delta to append, or ``None`` if a rewrite is needed.

        Raises:
            StreamCheckpointError: If the record would exceed ``max_checkpoint_bytes``.
        """
        last = plan.last
        delta = self._append_delta(plan)
        if last is None or delta is None:
            return None
        data, text_hash, _ = delta
        head = unsigned_head(
            plan.run_id,
            plan.fields,
            last.text_bytes + len(data),
            plan.write_id,
            self._append_layout(last, len(data)),
        )
        if text_hash is not None:
            plan.text_hash = text_hash
            head = self._sign(head, text_hash)
        self._check_size(head)
        return head, data

    def _append_delta(self, plan: PutPlan) -> tuple[bytes, Any, int] | None:
        """What an append of ``plan`` adds: encoded text, SHA-256 state after it, characters.

        ``None`` when the put must rewrite the text: its run has no last write,
        the new text does not extend the text written last, or a signing store
        lacks that text's hash state. The state is ``None`` for a store that
        does not sign. Costs the appended text, not the whole
        (`GrowingText.after`).
        """
        last = plan.last
        if last is None or (self._signing_key is not None and last.text_hash is None):
            return None
        added = plan.text.after(last.text)
        if added is None:
            return None
        delta = encode_text(added)
        if self._signing_key is None:
            return delta, None, len(added)
        text_hash = last.text_hash.copy()
        text_hash.update(delta)
        return delta, text_hash, len(added)

    def _rewrite_step(self, plan: PutPlan) -> tuple[Head, bytes]:
        """Return the head and whole text to write.

        Raises:
            StreamCheckpointError: If the record would exceed ``max_checkpoint_bytes``.
        """
        data, text_hash = self._rewrite_text(plan)
        head = Head(
            plan.run_id, plan.fields, len(data), plan.write_id, self._rewrite_layout(len(data))
        )
        if text_hash is not None:
            plan.text_hash = text_hash
            head = self._sign(head, text_hash)
        self._check_size(head)
        return head, data

    def _rewrite_text(self, plan: PutPlan) -> tuple[bytes, Any]:
        """The encoded whole text a rewrite of ``plan`` writes, and its SHA-256 state.

        The state is ``None`` for a store that does not sign.
        """
        data = encode_text(plan.text.whole())
        return data, hashlib.sha256(data) if self._signing_key is not None else None

    def _append_layout(self, last: LastWrite, delta: int) -> Mapping[str, Any]:
        """The layout details (``extra``) a head will carry after appending ``delta`` bytes.

        Known before the head is encoded, so that it is encoded once, with them.
        A backend that decides its layout only inside its primitive returns
        ``{}`` and sets it there (:meth:`Head.with_extra`, a second encoding).
        """
        return {}

    def _rewrite_layout(self, text_bytes: int) -> Mapping[str, Any]:
        """The layout details (``extra``) a head will carry after a rewrite of ``text_bytes``."""
        return {}

    def _layout_head(
        self, plan: PutPlan, text_bytes: int, sizes: list[int], text_hash: Any
    ) -> bytes:
        """The encoded head of a put whose layout the backend planned itself.

        ``sizes`` become the head's ``extra`` segment list; ``text_hash`` is the
        SHA-256 state over the whole new text (signing stores only; also kept in
        ``plan.text_hash`` for the next delta). An unsigned head is spliced from
        the fields' encoded bytes; a signed one is built, signed and encoded.
        """
        fields = plan.fields
        if self._signing_key is None and isinstance(fields, EncodedFields):
            return encode_unsigned_head(
                fields.data, text_bytes, plan.write_id, segments_extra(sizes)
            )
        plan.text_hash = text_hash
        head = Head(plan.run_id, fields, text_bytes, plan.write_id, {"segments": sizes})
        if self._signing_key is not None:
            head = self._sign(head, text_hash)
        return head.encode()

    def _put_plan(self, plan: PutPlan) -> Head:
        """Write a prepared put through the primitives: append if it can, else rewrite."""
        stored = None
        append = self._append_step(plan)
        if append is not None and plan.last is not None:
            stored = self._backend_append(*append, plan.epoch, plan.last)
        if stored is None:
            stored = self._backend_replace(*self._rewrite_step(plan), plan.epoch)
        return stored

    def _finish_put(self, plan: PutPlan, stored: Head, state: Any = None) -> None:
        """Remember what a put wrote, for the next delta write (``state``: `LastWrite.state`)."""
        self._remember(
            plan.run_id,
            LastWrite(
                stored.write_id,
                plan.text,
                stored.text_bytes,
                stored.extra,
                plan.text_hash,
                state,
                plan.fields_code,
            ),
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
        text_hash = self._verify(head, data) if self._signing_key is not None else None
        text = decode_text(data, run_id=run_id)
        checkpoint = checkpoint_from_dict({**head.fields, "partial_text": text}, run_id=run_id)
        self._remember(
            run_id,
            LastWrite(head.write_id, GrowingText(text), head.text_bytes, head.extra, text_hash),
        )
        return checkpoint

    # -- signatures -------------------------------------------------------------

    def _signature(self, head: Head, text_sha256: str) -> str:
        assert self._signing_key is not None
        content = signed_content(head.run_id, head.fields, head.text_bytes, text_sha256)
        return hmac.new(self._signing_key, content, "sha256").hexdigest()

    def _sign(self, head: Head, text_hash: Any) -> Head:
        """Return ``head`` carrying the text's digest and the signature over both."""
        digest = text_hash.hexdigest()
        return dataclasses.replace(
            head, text_sha256=digest, signature=self._signature(head, digest)
        )

    def _verify(self, head: Head, data: bytes) -> Any:
        """Check a loaded record's signature and text; return the text's SHA-256 state.

        Raises:
            StreamCheckpointError: If the record is unsigned, signed with another
                key, or changed since it was signed (head, text or run id).
        """
        if head.signature is None or head.text_sha256 is None:
            raise self._refused(head.run_id, "the record carries no signature")
        expected = self._signature(head, head.text_sha256)
        if not hmac.compare_digest(expected, head.signature):
            raise self._refused(head.run_id, "wrong key, or the head or run id was changed")
        text_hash = hashlib.sha256(data)
        if not hmac.compare_digest(text_hash.hexdigest(), head.text_sha256):
            raise self._refused(head.run_id, "the text was changed")
        return text_hash

    @staticmethod
    def _refused(run_id: str, why: str) -> StreamCheckpointError:
        return StreamCheckpointError(
            f"stored checkpoint refused: its signature did not verify ({why}), so it was "
            "not written by a holder of this store's signing key or was altered since; it "
            "is not resumed. Every process sharing the store needs the same signing_key "
            f"(or {SIGNING_KEY_ENV}); delete the checkpoint if it is not yours",
            run_id=run_id,
        )

    # -- the contract ---------------------------------------------------------

    def claim(self, run_id: str) -> int:
        """Take ownership of a run and return its new, strictly larger epoch."""
        check_run_id(run_id)
        self._check_writable("claim")
        with self._backend_errors("claim", run_id):
            return self._backend_claim(run_id)

    def put(self, checkpoint: StreamCheckpoint | DeferredCheckpoint) -> None:
        """Store the checkpoint, writing only the new text when it extends the last.

        Raises:
            StreamCheckpointFencedError: If ``checkpoint.epoch`` is older than the
                run's current epoch.
            StreamCheckpointError: If the epoch was never claimed, the encoded
                record exceeds ``max_checkpoint_bytes``, or the backend fails.
        """
        plan = self._prepare_put(checkpoint)
        try:  # `_backend_errors`, without a generator and its context manager on every put
            stored = self._put_plan(plan)
        except StreamCheckpointError:
            raise
        except Exception as exc:
            error = self._backend_error("put", plan.run_id, exc)
            raise error from error.__cause__
        self._finish_put(plan, stored)

    def put_many(
        self, checkpoints: Sequence[StreamCheckpoint | DeferredCheckpoint]
    ) -> list[StreamCheckpointError | None]:
        """Store several runs' checkpoints, each as `put` would (captures too).

        Returns:
            For each checkpoint, in order, ``None`` or the error its put raised.
        """
        # the base loop calls `put`, which takes captures here: only the type is wider
        return super().put_many(cast(Sequence[StreamCheckpoint], checkpoints))

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

        A delete by the run's owner (with its epoch), or of the complete
        checkpoint its owner wrote last, ends the run's epoch record; any other
        keeps it for ``epoch_grace`` more seconds. Later claims stay strictly
        larger after it is gone, and a writer still holding an older epoch is
        fenced.

        Raises:
            StreamCheckpointFencedError: If ``epoch`` is older than the run's
                current epoch.
            StreamCheckpointError: If ``epoch`` was never claimed, or the
                backend fails.
        """
        check_run_id(run_id)
        self._check_writable("delete")
        with self._memo_lock:
            last = self._memo.pop(run_id, None)
        with self._backend_errors("delete", run_id):
            if last is None or not self._delete_written(run_id, epoch, last):
                self._backend_delete(run_id, epoch, None)

    def _delete_written(self, run_id: str, epoch: int | None, last: LastWrite) -> bool:
        """Delete a run this instance wrote last, from what it knows of the record.

        ``False`` (the default): delete by the general primitive instead. Runs
        inside the ``delete`` error context; fencing is the override's to check.
        """
        return False

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
        """Remove expired checkpoints, epoch records past their grace, and leftovers.

        Returns:
            How many expired checkpoints were removed.
        """
        self._check_writable("gc")
        removed = self._gc_checkpoints()  # a kept record's own horizon applies without a ttl
        with self._backend_errors("gc", None):
            self._backend_collect_epochs()
            self._backend_cleanup()
        from awaken_langchain._runlog import collect_run_logs  # readers' logs end too

        collect_run_logs(self)
        return removed

    def _gc_checkpoints(self) -> int:
        """Remove expired checkpoints; return how many."""
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
        self._check_encoded_size(head.run_id, len(head.encode()) + head.text_bytes)

    def _check_encoded_size(self, run_id: str, size: int) -> None:
        """Refuse a record of ``size`` bytes (head and text) over ``max_checkpoint_bytes``."""
        if size > self.max_checkpoint_bytes:
            raise StreamCheckpointError(
                f"checkpoint is {size} bytes encoded, more than the store's "
                f"max_checkpoint_bytes={self.max_checkpoint_bytes}; nothing was written. "
                "Raise max_checkpoint_bytes when creating the store to keep turns this long",
                run_id=run_id,
            )

    def _remember(self, run_id: str, memo: LastWrite) -> None:
        self._remember_all(((run_id, memo),))

    def _remember_all(self, memos: Iterable[tuple[str, LastWrite]]) -> None:
        """Remember what was written last for each ``(run id, write)``, in one step."""
        memo = self._memo
        with self._memo_lock:
            for run_id, written in memos:
                memo[run_id] = written
                memo.move_to_end(run_id)
            while len(memo) > MEMO_LIMIT:
                memo.popitem(last=False)

    @contextlib.contextmanager
    def _backend_errors(self, action: str, run_id: str | None) -> Iterator[None]:
        """Turn any backend exception into a :class:`StreamCheckpointError` (`_backend_error`)."""
        try:
            yield
        except StreamCheckpointError:
            raise
        except Exception as exc:
            error = self._backend_error(action, run_id, exc)
            raise error from error.__cause__  # ``exc``, or ``None`` for a masked message

    def _backend_error(
        self, action: str, run_id: str | None, exc: Exception
    ) -> StreamCheckpointError:
        """The error a backend exception raised by ``action`` becomes.

        It is raised from its ``__cause__``, set here to ``exc``. A store maps
        its own driver's exceptions by overriding this; one whose message is
        masked sets ``__cause__`` to ``None`` (``raise ... from None``), so
        that no traceback prints the driver's unmasked text.
        """
        error = StreamCheckpointError(
            f"{type(self).__name__}.{action} failed", run_id=run_id, cause=exc
        )
        error.__cause__ = exc
        return error


class PerLoop(Generic[R]):
    """One resource (a client, a pool) per running event loop, closed when that loop shuts down.

    A resource belongs to the loop it was made on. A guard, an async generator
    started on that loop, is finalised by ``loop.shutdown_asyncgens()``, which
    ``asyncio.run`` and ``asyncio.Runner`` call before closing the loop, and
    closes the resource there. Resources of loops closed without that shutdown
    are dropped the next time one is made. So neither connections nor event
    loops pile up however many loops use a store.
    """

    def __init__(self, close: Callable[[R], Awaitable[object]]) -> None:
        self._close = close
        self._made: dict[asyncio.AbstractEventLoop, tuple[R, AsyncGenerator[None, None]]] = {}
        self._making: dict[asyncio.AbstractEventLoop, asyncio.Future[None]] = {}
        """Per loop, while its resource is being made: done when that attempt ends."""

    def __len__(self) -> int:
        return len(self._made)

    async def get(self, make: Callable[[], Awaitable[R]]) -> R:
        """The running loop's resource, made by ``make`` the first time.

        Tasks that ask while it is being made wait for it: a loop never gets
        two. If making it fails, the waiting tasks each try once more.
        """
        loop = asyncio.get_running_loop()
        while True:
            found = self._made.get(loop)
            if found is not None:
                return found[0]
            making = self._making.get(loop)
            if making is None:
                break
            await asyncio.wait((making,))  # not cancelled with a waiter that is
        for dead in [other for other in self._made if other.is_closed()]:
            self._made.pop(dead, None)  # closed without shutdown_asyncgens
        for dead in [other for other in self._making if other.is_closed()]:
            self._making.pop(dead, None)
        making = self._making[loop] = loop.create_future()
        try:
            resource = await make()
            guard = self._guard(loop, resource)
            self._made[loop] = (resource, guard)
            await anext(guard)  # runs to its first yield: registers it with the loop
        finally:
            del self._making[loop]
            making.set_result(None)
        return resource

    async def aclose(self) -> None:
        """Forget and close the running loop's resource, if it has one."""
        found = self._made.get(asyncio.get_running_loop())
        if found is not None:
            await found[1].aclose()

    async def _guard(
        self, loop: asyncio.AbstractEventLoop, resource: R
    ) -> AsyncGenerator[None, None]:
        """Hold ``resource`` until the loop shuts its async generators down, then close it."""
        try:
            yield
        finally:
            found = self._made.get(loop)
            if found is not None and found[0] is resource:
                del self._made[loop]
            with contextlib.suppress(Exception):  # the loop is ending: nobody to tell
                await self._close(resource)


class SegmentedCheckpointStore(DeltaCheckpointStore):
    """A backend that keeps a run's text as segments, appended as :func:`plan_append` plans.

    The head's ``extra`` lists the segment sizes (``{"segments": [...]}``); both
    layouts are known before the head is encoded. A head whose list is unreadable
    gets none here: the primitive reads the stored head and decides.
    """

    def _append_layout(self, last: LastWrite, delta: int) -> Mapping[str, Any]:
        sizes = segment_sizes(last.extra)
        return {} if sizes is None else {"segments": plan_append(sizes, delta)[1]}

    def _rewrite_layout(self, text_bytes: int) -> Mapping[str, Any]:
        return {"segments": [text_bytes] if text_bytes else []}


__all__ = [
    "DeltaCheckpointStore",
    "EncodedFields",
    "Head",
    "DEFAULT_EPOCH_GRACE",
    "LastWrite",
    "PutPlan",
    "SIGNING_KEY_ENV",
    "PerLoop",
    "SegmentedCheckpointStore",
    "check_epoch",
    "connection_failure",
    "corrupted",
    "segment_sizes",
    "decode_head",
    "decode_text",
    "encode_text",
    "encode_unsigned_head",
    "linked_path_error",
    "make_private_database",
    "make_private_directory",
    "new_write_id",
    "next_epoch",
    "open_no_follow",
    "plan_append",
    "resolve_signing_key",
    "run_id_bytes",
    "segments_extra",
    "signed_content",
    "unreadable_id",
    "unreadable_locator",
]
