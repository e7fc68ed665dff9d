"""The stream checkpoint record and the store contract.

A stream checkpoint holds only the unfinished assistant turn: what has arrived so
far, so that a replacement process can finish the turn. It is not a conversation
store; the framework's memory (a LangGraph checkpointer, a chat message history)
remains the authority for messages.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import operator
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Literal, NamedTuple, Protocol, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
)

from awaken_langchain.errors import StreamCheckpointError

_T = TypeVar("_T")

SCHEMA_VERSION: Literal[3] = 3
"""Version of the checkpoint JSON layout written by this release (version 1 records,
which have no ``fingerprint`` or ``keep_for``, and version 2 records, which have no
content blocks, are still read)."""

DEFAULT_MAX_CHECKPOINT_BYTES = 16 * 1024 * 1024
"""Default refusal threshold for one encoded checkpoint (16 MiB)."""

MAX_RUN_ID_LENGTH = 1024
"""Longest run id a store accepts, in characters."""


class Clock(Protocol):
    """A source of wall-clock time in seconds since the epoch (``time.time``)."""

    def __call__(self) -> float:  # pragma: no cover - protocol
        """Return the current time in seconds."""
        ...


class CompletedToolCall(BaseModel):
    """A tool call whose arguments arrived whole and parsed as a JSON object."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    """The provider's tool call id."""
    name: str
    """The tool's name."""
    args: dict[str, Any]
    """The parsed arguments."""
    index: int = Field(default=0, ge=0)
    """The tool call's index within the turn (after any continuation shift)."""


class InFlightToolCall(BaseModel):
    """The one tool call whose arguments were still arriving."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str | None = None
    """The provider's tool call id, if it had arrived."""
    name: str | None = None
    """The tool's name, if it had arrived."""
    index: int = Field(default=0, ge=0)
    """The tool call's index within the turn (after any continuation shift)."""
    partial_args: str = ""
    """The raw argument text received so far; usually not valid JSON."""


class NotExecutedToolCall(BaseModel):
    """A tool call of the turn that will not be executed, and why."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str | None = None
    """The provider's tool call id, if it had arrived."""
    name: str | None = None
    """The tool's name, if it had arrived."""
    index: int = Field(default=0, ge=0)
    """The tool call's index within the turn (after any continuation shift)."""
    args: str = ""
    """The raw argument text as it arrived (not a complete JSON object)."""
    error: str = ""
    """Why the call is not executed, worded for the model."""


class CompletedBlock(BaseModel):
    """A whole content block of the turn other than text (thinking, reasoning, a tool use...)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    block: dict[str, Any]
    """The block as the provider issued it (JSON: type, signature, encrypted content...)."""
    text_offset: int = Field(default=0, ge=0)
    """How many characters of ``partial_text`` came before the block."""


class TextBlockStart(BaseModel):
    """Where a text block of the turn begins, and what it carries besides its text."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    text_offset: int = Field(default=0, ge=0)
    """How many characters of ``partial_text`` came before the block."""
    fields: dict[str, Any] = Field(default_factory=dict)
    """The block's keys other than ``type`` and ``text`` (JSON): Anthropic
    ``citations``, Responses ``annotations`` and item ``id``..."""


class ModelSpan(BaseModel):
    """Where the text written by one model of a turn begins (a turn that moved to a fallback)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str
    """The model's identifier (as in ``StreamCheckpoint.model``)."""
    start: int = Field(default=0, ge=0)
    """How many characters of ``partial_text`` came before the model took over."""


class StreamCheckpoint(BaseModel):
    """One in-flight assistant turn, as far as it had arrived.

    The record is immutable; build an updated one with ``model_copy(update=...)``.
    It never holds secrets: no API keys, headers or client settings.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: Literal[1, 2, 3] = SCHEMA_VERSION
    """Layout version of this record; readers refuse versions they do not know."""
    run_id: str
    """The key of the turn: the caller's run id, or one derived from the thread and task.

    Checked by :func:`check_run_id` (a bad run id raises ``StreamCheckpointError``
    with the same message here as in every store method)."""
    thread_id: str | None = None
    """The conversation thread the turn belongs to, when known."""
    model: str = ""
    """Identifier of the model in effect: the one the turn was requested from, or the
    fallback it had moved to. A wrapper resumes the record only when this model is
    its model or one of its fallbacks, and goes on with this model."""
    fingerprint: str | None = None
    """A digest of the request that started the turn (messages, tools, settings that
    shape the output). A checkpoint is resumed only by the same request; ``None``
    (a version-1 record) matches any request."""
    message_id: str | None = None
    """The stable id of the assistant message this turn produces."""
    partial_text: str = ""
    """The whole turn's text so far, across every attempt (never a continuation prompt)."""
    completed_tool_calls: tuple[CompletedToolCall, ...] = ()
    """Tool calls that arrived whole, in the order they completed."""
    in_flight_tool_call: InFlightToolCall | None = None
    """The tool call still arriving when the checkpoint was written, if any."""
    invalid_tool_calls: tuple[NotExecutedToolCall, ...] = ()
    """Tool calls of the turn that will not be executed (cut off or malformed)."""
    content_blocks: bool = False
    """Whether the model streams content as a list of blocks (the answer's content is
    a list, not a string)."""
    completed_blocks: tuple[CompletedBlock, ...] = ()
    """Whole content blocks other than text, in order, each with its place in the
    text; a cut-off block is never recorded (it could not be sent back)."""
    text_blocks: tuple[TextBlockStart, ...] = ()
    """Where each text block begins in ``partial_text``, with its citations or
    annotations, for models that stream content blocks (empty in older records:
    their text is resumed as one block per stretch between other blocks)."""
    model_spans: tuple[ModelSpan, ...] = ()
    """For a turn that moved to a fallback model: each model in effect, in order,
    with where its text begins. Empty when one model wrote the whole turn."""
    complete: bool = False
    """Whether the turn has finished (a terminal signal arrived, or it was finished
    with its whole tool calls). A complete checkpoint holds the whole answer and is
    kept only until memory has committed it; a process that finds one returns the
    answer without a provider request. ``False`` means the turn is still in flight."""
    keep_for: float | None = Field(default=None, gt=0)
    """For a complete checkpoint kept until memory commits the turn: seconds after
    ``updated_at`` when it expires whatever the store's ``ttl`` (``gc`` removes it,
    ``get`` no longer returns it), so a turn memory never commits is not kept forever."""
    retry_count: int = Field(default=0, ge=0)
    """Retries and continuations already spent on this turn."""
    epoch: int = Field(default=0, ge=0)
    """The fencing epoch of the writer, as returned by ``StreamCheckpointStore.claim``."""
    updated_at: float = Field(default=0.0, ge=0.0)
    """When the store last wrote the record, in seconds since the epoch (set by the store)."""
    provider_response_id: str | None = None
    """The provider's id of the background response that holds the whole turn
    (``provider_resume=True``): a replacement process resumes its stream instead of
    continuing by prompt. ``None`` without provider resume, or once the turn was
    continued by prompt."""
    provider_sequence_number: int | None = Field(default=None, ge=0)
    """The ``sequence_number`` of the last provider event the record holds the whole
    output of: the last one after which no tool call or other block was still arriving
    (text still arriving is held up to it). A replacement process resumes the
    provider's stream after it. ``None`` when none arrived yet."""

    @field_validator("run_id", mode="before")
    @classmethod
    def _run_id_is_addressable(cls, value: object) -> str:
        return check_run_id(value)

    @model_serializer(mode="wrap")
    def _without_empty_spans(self, handler: SerializerFunctionWrapHandler) -> Any:
        """Leave ``model_spans`` out of a one-model record, which then reads as before."""
        data = handler(self)
        if not self.model_spans and isinstance(data, dict):
            data.pop("model_spans", None)
        return data


_TEMPLATE: dict[str, Any] = {
    name: field.default for name, field in StreamCheckpoint.model_fields.items()
}
"""Every field in declaration order, at its default (``run_id`` must always be given)."""
_set_attribute = object.__setattr__


def unchecked_checkpoint(**fields: Any) -> StreamCheckpoint:
    """A checkpoint from fields the caller vouches for, not validated.

    What ``StreamCheckpoint.model_construct(**fields)`` returns, at a fifth of
    its cost: a turn builds one for every checkpoint it writes. The fields must
    be of the declared types; ``run_id`` is required.
    """
    return checkpoint_with_text(fields, None)


def checkpoint_with_text(fields: Mapping[str, Any], partial_text: str | None) -> StreamCheckpoint:
    """`unchecked_checkpoint` of ``fields`` and, unless ``None``, ``partial_text``.

    Takes the fields as they are held (no keyword arguments to pack): a
    checkpoint writer builds one from a turn's captured fields per write.
    """
    values = {**_TEMPLATE, **fields}
    given = set(fields)
    if partial_text is not None:
        values["partial_text"] = partial_text
        given.add("partial_text")
    checkpoint = object.__new__(StreamCheckpoint)
    _set_attribute(checkpoint, "__dict__", values)
    _set_attribute(checkpoint, "__pydantic_fields_set__", given)
    _set_attribute(checkpoint, "__pydantic_extra__", None)
    _set_attribute(checkpoint, "__pydantic_private__", None)
    return checkpoint


class GrowingText:
    """A turn's text as a store sees it: a string and the pieces appended to it since.

    The text is joined only when it is read whole (`whole`). A store that wrote
    an earlier state of the same turn asks what was appended since (`after`),
    which costs the appended pieces, not the whole text: two states of one turn
    share their string and their list of pieces, a list that is only ever
    appended to (its first ``count`` pieces never change).

    Args:
        base: The text before the pieces.
        parts: The pieces appended since (only the first ``count`` belong to this text).
        count: How many of ``parts`` belong to this text.
    """

    __slots__ = ("_base", "_count", "_joined", "_parts")

    def __init__(self, base: str, parts: Sequence[str] = (), count: int = 0) -> None:
        self._base = base
        self._parts = parts
        self._count = count
        self._joined: str | None = None if count else base

    def whole(self) -> str:
        """The whole text (joined once, then kept)."""
        joined = self._joined
        if joined is None:
            joined = self._joined = self._base + "".join(self._parts[: self._count])
        return joined

    def after(self, earlier: GrowingText) -> str | None:
        """What this text appends to ``earlier``, or ``None`` if it does not begin with it.

        Two states of one turn are told apart by identity (the same string, the
        same list of pieces, no fewer of them), at the cost of the appended
        pieces; any other pair is compared character by character.
        """
        start = earlier._count
        if (
            self._base is earlier._base
            and start <= self._count
            and (start == 0 or self._parts is earlier._parts)
        ):
            return "".join(self._parts[start : self._count])
        text, before = self.whole(), earlier.whole()
        return text[len(before) :] if text.startswith(before) else None

    def last(self, chars: int) -> str:
        """The last ``chars`` characters of the text (at most the whole text)."""
        if chars <= 0:
            return ""
        joined = self._joined
        if joined is not None:
            return joined[len(joined) - chars :] if chars < len(joined) else joined
        # the last pieces, joined a slice at a time: each slice is as many pieces as
        # the average so far says are missing (at least as many again as held), so
        # a few joins cover the tail, not one step of the interpreter per piece
        parts, end = self._parts, self._count
        start = max(0, end - 1)
        tail = "".join(parts[start:end])
        while len(tail) < chars and start > 0:
            held = end - start
            missing = chars - len(tail)
            more = max(held, -(-missing * held // len(tail)) if tail else held)
            earlier = max(0, start - more)
            tail = "".join(parts[earlier:start]) + tail
            start = earlier
        taken = len(tail)
        if taken >= chars:
            return tail[taken - chars :]
        base = self._base
        return base[max(0, len(base) - (chars - taken)) :] + tail


class DeferredCheckpoint:
    """A checkpoint captured on the stream's path, built when it is written.

    A store whose class takes such captures as they are
    (``StreamCheckpointStore.takes_deferred``) writes what was appended since
    its last write without joining the whole text; any other gets `build`.

    Attributes:
        run_id: The run the checkpoint is for.
        fields: Every field but ``partial_text`` (as `checkpoint_with_text` takes them).
        text: The text, as the string and pieces it was captured from.
    """

    __slots__ = ("fields", "run_id", "text")

    def __init__(self, fields: dict[str, Any], text: str, parts: list[str], count: int) -> None:
        self.run_id: str = fields["run_id"]
        self.fields = fields
        self.text = GrowingText(text, parts, count)

    def build(self) -> StreamCheckpoint:
        """The checkpoint as it was when captured (any thread may call this)."""
        return checkpoint_with_text(self.fields, self.text.whole())


def built(checkpoint: StreamCheckpoint | DeferredCheckpoint) -> StreamCheckpoint:
    """``checkpoint`` itself, or the checkpoint a capture stands for."""
    return checkpoint.build() if isinstance(checkpoint, DeferredCheckpoint) else checkpoint


def model_identifier(llm_type: str, model_name: object = None) -> str:
    """The ``model`` a checkpoint records: ``"<llm type>:<model name>"``.

    A checkpoint made for another model is not resumed, so writers (the wrapper,
    the callback handler) must name the same model the same way.

    Args:
        llm_type: The chat model's ``_llm_type`` (e.g. ``"openai-chat"``).
        model_name: The model name LangChain reports as ``ls_model_name``, if any.
    """
    return f"{llm_type}:{model_name}" if model_name else llm_type


def check_run_id(run_id: object) -> str:
    """Validate a run id and return it.

    Any non-empty string of at most ``MAX_RUN_ID_LENGTH`` characters without NUL
    is accepted; stores never use it as a path, so ``/`` and ``..`` are harmless.

    Raises:
        StreamCheckpointError: If the run id is not usable as a key.
    """
    if not isinstance(run_id, str):
        raise StreamCheckpointError(f"run id must be a str, got {type(run_id).__name__}")
    if not run_id:
        raise StreamCheckpointError("run id must not be empty")
    if len(run_id) > MAX_RUN_ID_LENGTH:
        raise StreamCheckpointError(
            f"run id is {len(run_id)} characters long; the limit is {MAX_RUN_ID_LENGTH}",
            run_id=run_id,
        )
    if "\x00" in run_id:
        raise StreamCheckpointError("run id must not contain NUL characters", run_id=run_id)
    return run_id


def encode_json(value: Any) -> bytes:
    """Encode a JSON value as UTF-8 bytes that round-trip any Python ``str``.

    Lone surrogates (which are not valid UTF-8) are kept with the
    ``surrogatepass`` error handler so that text survives storage unchanged.
    """
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode(
        "utf-8", "surrogatepass"
    )


def decode_json(data: bytes | str, *, run_id: str | None = None) -> Any:
    """Decode bytes written by :func:`encode_json`.

    Raises:
        StreamCheckpointError: If the data is not valid JSON.
    """
    try:
        text = data.decode("utf-8", "surrogatepass") if isinstance(data, bytes) else data
        return json.loads(text)
    except (UnicodeDecodeError, ValueError) as exc:
        raise StreamCheckpointError(
            "stored checkpoint is corrupted (not JSON)", run_id=run_id, cause=exc
        ) from exc


def checkpoint_from_dict(data: Any, *, run_id: str | None = None) -> StreamCheckpoint:
    """Validate a decoded JSON object as a checkpoint.

    Raises:
        StreamCheckpointError: If the object is not a valid checkpoint of a known
            schema version.
    """
    if isinstance(data, dict):
        version = data.get("schema_version")
        if isinstance(version, int) and version > SCHEMA_VERSION:
            raise StreamCheckpointError(
                f"stored checkpoint has schema_version {version}, newer than this "
                f"release understands ({SCHEMA_VERSION}); upgrade awaken-langchain",
                run_id=run_id,
            )
    try:
        return StreamCheckpoint.model_validate(data)
    except ValidationError as exc:
        raise StreamCheckpointError(
            "stored checkpoint is corrupted (invalid fields)", run_id=run_id, cause=exc
        ) from exc


encode_json_string: Callable[[str], str] = json.encoder.encode_basestring
"""The JSON literal of a ``str``, as ``json.dumps(..., ensure_ascii=False)`` writes it."""

_EMPTY: tuple[object, ...] = ((), [])
_NO_RECORDS: tuple[()] = ()
"""The empty tuple: a list of records that is this object cannot change in place."""
_RECORD_FIELDS = ("completed_tool_calls", "invalid_tool_calls", "completed_blocks", "text_blocks")


def _json_number(value: object) -> str | None:
    """``value`` as ``json.dumps`` writes it when it is a plain finite int or float, else None."""
    if type(value) is int:
        return int.__repr__(value)
    if type(value) is float and math.isfinite(value):
        return float.__repr__(value)
    return None


@functools.lru_cache(maxsize=1024)
def _fields_head(
    version: int,
    run_id: str,
    thread_id: str | None,
    model: str,
    fingerprint: str | None,
    message_id: str | None,
) -> str:
    """The fields a turn writes the same in every checkpoint, encoded once per turn."""
    return (
        f'{{"schema_version":{version},"run_id":{encode_json_string(run_id)},'
        f'"thread_id":{_optional_string(thread_id)},"model":{encode_json_string(model)},'
        f'"fingerprint":{_optional_string(fingerprint)},"message_id":{_optional_string(message_id)},'
        '"completed_tool_calls":[],"in_flight_tool_call":null,"invalid_tool_calls":[],'
    )


def encode_fields(checkpoint: StreamCheckpoint, updated_at: float) -> bytes:
    """Encode every field but ``partial_text``, with ``updated_at`` set, as JSON bytes.

    The same bytes as ``encode_json`` of ``checkpoint.model_dump(mode="json",
    exclude={"partial_text"})`` with ``updated_at`` replaced, written by hand: a
    checkpoint is encoded on every put, and pydantic's dump plus ``json.dumps``
    cost several times the store write itself. A record with tool calls, content
    blocks or model spans, or a field of an unexpected type (a record built with
    ``model_construct``), goes through pydantic as before.
    """
    return encode_fields_again(checkpoint, updated_at, None)[0]


class FieldsCode(NamedTuple):
    """A checkpoint's fields as encoded, kept to encode the next put of its run again.

    Attributes:
        values: Every field but ``partial_text`` and ``updated_at``, the objects
            themselves, in `_CODED_FIELDS` order (all immutable).
        before: The encoding up to ``updated_at``'s value.
        after: The encoding after it.
    """

    values: tuple[object, ...]
    before: bytes
    after: bytes


_CODED_FIELDS = tuple(
    name for name in StreamCheckpoint.model_fields if name not in ("partial_text", "updated_at")
)
_coded_values = operator.itemgetter(*_CODED_FIELDS)


def encode_fields_again(
    checkpoint: StreamCheckpoint, updated_at: float, previous: FieldsCode | None
) -> tuple[bytes, FieldsCode | None]:
    """`encode_fields`, reusing ``previous`` when no field but the text changed.

    A turn's checkpoints differ from one put to the next in their text alone,
    as long as no retry, tool call or block happens: their other fields are
    the very same objects. When each of them is the object ``previous`` was
    encoded from (all immutable: strings, numbers, ``None``, the empty
    tuple), only the stamp is written anew.

    Returns:
        The encoded fields, and the code to pass for the run's next put
        (``None`` when the record is encoded by pydantic, or holds a value
        that could change in place).
    """
    data = checkpoint.__dict__
    stamp = _json_number(updated_at)
    if previous is not None and stamp is not None:
        try:
            values = _coded_values(data)
        except KeyError:  # a record without every field (built by hand)
            values = ()
        if len(values) == len(previous.values) and all(map(operator.is_, values, previous.values)):
            return b"".join((previous.before, stamp.encode(), previous.after)), previous
    version, run_id, model = data.get("schema_version"), data.get("run_id"), data.get("model")
    thread_id, fingerprint = data.get("thread_id"), data.get("fingerprint")
    message_id, keep_for = data.get("message_id"), data.get("keep_for")
    content_blocks, complete = data.get("content_blocks"), data.get("complete")
    retry, epoch = data.get("retry_count"), data.get("epoch")
    response_id, sequence = data.get("provider_response_id"), data.get("provider_sequence_number")
    if (
        type(version) is not int
        or type(run_id) is not str
        or type(model) is not str
        or not (thread_id is None or type(thread_id) is str)
        or not (fingerprint is None or type(fingerprint) is str)
        or not (message_id is None or type(message_id) is str)
        or data.get("in_flight_tool_call") is not None
        or data.get("model_spans") not in _EMPTY
        or type(content_blocks) is not bool
        or type(complete) is not bool
        or not (keep_for is None or (type(keep_for) is float and math.isfinite(keep_for)))
        or type(retry) is not int
        or type(epoch) is not int
        or not (response_id is None or type(response_id) is str)
        or not (sequence is None or type(sequence) is int)
        or stamp is None
    ):
        return _encode_fields_slow(checkpoint, updated_at), None
    for name in _RECORD_FIELDS:
        if data.get(name) not in _EMPTY:
            return _encode_fields_slow(checkpoint, updated_at), None
    before = (
        _fields_head(version, run_id, thread_id, model, fingerprint, message_id)
        + f'"content_blocks":{"true" if content_blocks else "false"},'
        '"completed_blocks":[],"text_blocks":[],'
        f'"complete":{"true" if complete else "false"},'
        f'"keep_for":{"null" if keep_for is None else float.__repr__(keep_for)},'
        f'"retry_count":{int.__repr__(retry)},"epoch":{int.__repr__(epoch)},"updated_at":'
    ).encode("utf-8", "surrogatepass")
    after = (
        f',"provider_response_id":{_optional_string(response_id)},'
        f'"provider_sequence_number":{"null" if sequence is None else int.__repr__(sequence)}}}'
    ).encode("utf-8", "surrogatepass")
    encoded = b"".join((before, stamp.encode(), after))
    if data.get("model_spans") is not _NO_RECORDS or any(
        data.get(name) is not _NO_RECORDS for name in _RECORD_FIELDS
    ):
        return encoded, None  # an empty list: it could be filled in place
    try:
        return encoded, FieldsCode(_coded_values(data), before, after)
    except KeyError:  # a record without every field (built by hand)
        return encoded, None


def _optional_string(value: str | None) -> str:
    return "null" if value is None else encode_json_string(value)


def _encode_fields_slow(checkpoint: StreamCheckpoint, updated_at: float) -> bytes:
    fields = checkpoint.model_dump(mode="json", exclude={"partial_text"})
    fields["updated_at"] = updated_at
    return encode_json(fields)


def encode_checkpoint(checkpoint: StreamCheckpoint) -> bytes:
    """Encode a checkpoint as JSON bytes."""
    return encode_json(checkpoint.model_dump(mode="json"))


def decode_checkpoint(data: bytes | str, *, run_id: str | None = None) -> StreamCheckpoint:
    """Decode a checkpoint written by :func:`encode_checkpoint`.

    Raises:
        StreamCheckpointError: If the data is corrupted or of an unknown version.
    """
    return checkpoint_from_dict(decode_json(data, run_id=run_id), run_id=run_id)


class StreamCheckpointStore(ABC):
    """Where in-flight turns are kept so that another process can finish them.

    The contract every store honours (and the conformance suite checks):

    - ``get(run_id)`` returns the latest checkpoint, or ``None`` when there is none
      or it is older than the store's ``ttl``.
    - ``put(checkpoint)`` replaces the run's checkpoint. The store stamps
      ``updated_at`` with its clock. A put whose text extends the text already
      stored writes only the new part.
    - ``delete(run_id)`` is idempotent; deleting a missing run is not an error.
    - ``claim(run_id)`` returns a new fencing epoch, strictly larger than any
      epoch returned before for that run (also across store instances and
      processes sharing the backend, after the checkpoint was deleted, and
      after the run's epoch record was removed: records must end, see
      ``stores/_base.py``).
      A ``put`` or ``delete(run_id, epoch=...)`` carrying an epoch older than the
      run's current one raises ``StreamCheckpointFencedError``.
    - Every storage failure raises ``StreamCheckpointError`` naming the run id
      and the cause; raw backend exceptions never escape.

    The async twins default to running the sync method in a worker thread;
    natively async backends override them.

    Args:
        ttl: Seconds after its last write when a checkpoint expires, or ``None``
            to keep checkpoints until they are deleted.
        max_checkpoint_bytes: Largest encoded checkpoint the store accepts.
        clock: Wall-clock time source, injectable for tests.
    """

    takes_deferred: ClassVar[bool] = False
    """Whether ``put``, ``put_many`` and ``put_many_now`` also take a `DeferredCheckpoint`.

    A checkpoint writer then hands a stream's captures over unbuilt, and the
    store writes what was appended since its last write of the run without
    joining the turn's whole text. Only the exact class counts (as for
    ``answers_at_once``): a subclass may override a put and read
    ``partial_text``, so it gets built checkpoints unless it declares this again."""

    def __init__(
        self,
        *,
        ttl: float | None = None,
        max_checkpoint_bytes: int = DEFAULT_MAX_CHECKPOINT_BYTES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if ttl is not None and ttl <= 0:
            raise ValueError(f"ttl must be a positive number of seconds or None, got {ttl!r}")
        if max_checkpoint_bytes <= 0:
            raise ValueError(f"max_checkpoint_bytes must be positive, got {max_checkpoint_bytes!r}")
        self.ttl = ttl
        self.max_checkpoint_bytes = max_checkpoint_bytes
        self.clock = clock

    # -- the contract -------------------------------------------------------

    @abstractmethod
    def get(self, run_id: str) -> StreamCheckpoint | None:
        """Return the run's checkpoint, or ``None`` if there is none or it expired."""

    @abstractmethod
    def put(self, checkpoint: StreamCheckpoint) -> None:
        """Store the checkpoint, replacing the run's previous one.

        Raises:
            StreamCheckpointFencedError: If ``checkpoint.epoch`` is older than the
                run's current epoch.
            StreamCheckpointError: On any other storage failure, or when the
                encoded checkpoint exceeds ``max_checkpoint_bytes``.
        """

    def put_many(
        self, checkpoints: Sequence[StreamCheckpoint]
    ) -> list[StreamCheckpointError | None]:
        """Store several runs' checkpoints at once (group commit), each as `put` would.

        One checkpoint's failure (fenced, too large) never stops the others. The
        default puts them one by one; backends that can commit many records in
        one transaction or round trip override it.

        Returns:
            For each checkpoint, in order, ``None`` or the error its put raised.
        """
        errors: list[StreamCheckpointError | None] = []
        for checkpoint in checkpoints:
            try:
                self.put(checkpoint)
            except StreamCheckpointError as exc:
                errors.append(exc)
            else:
                errors.append(None)
        return errors

    def put_many_now(
        self, checkpoints: Sequence[StreamCheckpoint]
    ) -> list[StreamCheckpointError | None] | None:
        """`put_many`, if it can start without waiting long for anyone; else ``None``.

        A backend whose writes are local and take a fraction of a millisecond
        once its write lock is held overrides this to attempt the group commit
        waiting a few milliseconds at most for that lock: ``None`` means
        another writer held it and nothing was written. The checkpoint writer then commits on the
        stream's own thread, which spares a thread that would compete with the
        stream for the GIL. The default never attempts (``None``).

        Returns:
            As `put_many`, or ``None`` if nothing was attempted.
        """
        return None

    def call_now(self, action: Callable[[], _T]) -> tuple[bool, _T | None]:
        """Run ``action`` (calls of this store's methods) if it need not wait long for anyone.

        The companion of `put_many_now` for a turn's opening and closing
        operations: a backend that overrides it runs ``action`` on the calling
        thread with every lock wait cut to a few milliseconds. ``(True, result)`` when it
        ran (its errors propagate); ``(False, None)`` when a write in it found
        a lock taken, in which case that write was not made, but writes of
        ``action`` before it were: ``action`` must be safe to run again. The
        default never runs it (``(False, None)``).
        """
        return False, None

    @abstractmethod
    def delete(self, run_id: str, *, epoch: int | None = None) -> None:
        """Delete the run's checkpoint; a missing checkpoint is not an error.

        Args:
            run_id: The run to delete.
            epoch: The deleting writer's epoch. When given and older than the
                run's current epoch, the delete is refused. ``None`` deletes
                unconditionally (operators).

        Raises:
            StreamCheckpointFencedError: If ``epoch`` is stale.
            StreamCheckpointError: On any other storage failure.
        """

    @abstractmethod
    def claim(self, run_id: str) -> int:
        """Take ownership of a run and return its new, strictly larger epoch."""

    @abstractmethod
    def list_run_ids(self) -> list[str]:
        """Return the run ids that have an unexpired checkpoint."""

    @abstractmethod
    def gc(self) -> int:
        """Remove expired checkpoints and return how many were removed."""

    # -- derived helpers ------------------------------------------------------

    def list_checkpoints(self) -> list[StreamCheckpoint]:
        """Return every unexpired checkpoint (for operators)."""
        found = []
        for run_id in self.list_run_ids():
            checkpoint = self.get(run_id)
            if checkpoint is not None:
                found.append(checkpoint)
        return found

    def is_expired(self, updated_at: float, keep_for: float | None = None) -> bool:
        """Tell whether a record written at ``updated_at`` is past the TTL.

        Args:
            updated_at: When the record was written (store clock).
            keep_for: The record's own horizon (``StreamCheckpoint.keep_for``),
                applied on top of the store's ``ttl``.
        """
        age = self.clock() - updated_at
        if keep_for is not None and age > keep_for:
            return True
        return self.ttl is not None and age > self.ttl

    def close(self) -> None:
        """Release resources held by the store (no-op by default)."""
        return None

    def __enter__(self) -> StreamCheckpointStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- async twins ----------------------------------------------------------

    async def aget(self, run_id: str) -> StreamCheckpoint | None:
        """Async twin of :meth:`get`."""
        return await asyncio.to_thread(self.get, run_id)

    async def aput(self, checkpoint: StreamCheckpoint) -> None:
        """Async twin of :meth:`put`."""
        await asyncio.to_thread(self.put, checkpoint)

    async def adelete(self, run_id: str, *, epoch: int | None = None) -> None:
        """Async twin of :meth:`delete`."""
        await asyncio.to_thread(self.delete, run_id, epoch=epoch)

    async def aclaim(self, run_id: str) -> int:
        """Async twin of :meth:`claim`."""
        return await asyncio.to_thread(self.claim, run_id)
