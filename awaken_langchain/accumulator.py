"""One assistant turn, accumulated across attempts (pure, no I/O).

The accumulator turns the inner model's chunks into the chunks the caller sees:
text deltas (with repeated seam text removed after a continuation) and tool
calls released only whole, once their arguments parse as a complete JSON
object and their block has ended. It also keeps what a checkpoint needs.

Per-chunk work is constant amortized: text and argument fragments are appended
to lists and joined only when a checkpoint is written or a call completes.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from langchain_core.messages import AIMessage, AIMessageChunk
from langchain_core.messages.ai import UsageMetadata, add_usage
from langchain_core.messages.tool import invalid_tool_call, tool_call, tool_call_chunk
from langchain_core.outputs import ChatGenerationChunk
from langchain_core.utils._merge import merge_dicts, merge_lists
from langchain_core.utils.json import parse_partial_json
from pydantic import BaseModel

from awaken_langchain.checkpoint import (
    CompletedBlock,
    CompletedToolCall,
    DeferredCheckpoint,
    InFlightToolCall,
    NotExecutedToolCall,
    StreamCheckpoint,
    TextBlockStart,
)
from awaken_langchain.events import NotExecutedCall
from awaken_langchain.recovery import INVALID_ARGS_MARKER, SeamFilter

INTERRUPTED_TOOL_CALL_ERROR = (
    "This tool call was interrupted mid-stream: its arguments were cut off, so it "
    "was not executed. Re-issue the call if it is still needed."
)
MAX_ARGS_DEPTH = 200
"""How deeply a tool call's arguments may nest (objects and arrays) to be released.

A checkpoint must hold a released call exactly, and the serializer that writes
it stops some 250 levels down; real tool schemas nest a few levels."""
MALFORMED_TOOL_CALL_ERROR = (
    "This tool call's arguments were not a complete JSON object (standard JSON: no "
    f"NaN or Infinity, nested at most {MAX_ARGS_DEPTH} levels), so it was not "
    "executed. Re-issue the call with valid JSON arguments if it is still needed."
)


def _ends_turn(metadata: Mapping[str, Any]) -> bool:
    """Whether response metadata marks the end of the answer (``finish_reason`` and kin)."""
    # spelled out, not ``any()`` over the keys: a generator per chunk costs more than the test
    return bool(
        metadata.get("finish_reason") or metadata.get("stop_reason") or metadata.get("done_reason")
    )


_SKIPPED_KWARGS = ("tool_calls", "function_call")

# An ``AIMessageChunk`` keeps its fields in its ``__dict__`` and does not validate
# assignment, so a field can be set the way pydantic's ``__setattr__`` sets it
# (the value, and the name among the fields set) without its two Python frames,
# on every text chunk passed on whole.
_DIRECT_ASSIGNMENT = (
    AIMessageChunk.__setattr__ is BaseModel.__setattr__
    and not AIMessageChunk.model_config.get("validate_assignment")
)


@dataclass(slots=True)
class _OpenCall:
    index: int
    id: str | None = None
    name: str | None = None
    parts: list[str] = field(default_factory=list)
    size: int = 0

    def args(self) -> str:
        return "".join(self.parts)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        pieces = []
        for block in content:
            if isinstance(block, str):
                pieces.append(block)
            elif isinstance(block, dict) and block.get("type") == "text":
                pieces.append(str(block.get("text", "")))
        return "".join(pieces)
    return ""


def _carries_call(content: Any, call_id: str | None) -> bool:
    """Whether ``content`` holds the block of the tool call ``call_id``."""
    if not call_id or not isinstance(content, list):
        return False
    return any(isinstance(b, dict) and call_id in (b.get("id"), b.get("call_id")) for b in content)


def _is_text(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") == "text"


def _with_text(content: list[Any], text: str) -> list[Any]:
    """``content`` after a chunk whose content is the string ``text``, as chunk addition merges it.

    langchain-anthropic streams text as strings when the request has no tools,
    documents or thinking, yet a citation still arrives as a block: the string
    joins a string before it, or follows the block.
    """
    if content and isinstance(content[-1], str):
        return [*content[:-1], content[-1] + text]
    return [*content, text] if text else content


def _folded(content: list[Any]) -> list[Any]:
    """Content whose text came as strings, as whole text blocks.

    A string is the text of the block begun before it (the citation block
    whose text streamed as strings), or a text block of its own.
    """
    out: list[Any] = []
    for item in content:
        if not isinstance(item, str):
            out.append(item)
        elif out and _is_text(out[-1]):
            out[-1] = {**out[-1], "text": str(out[-1].get("text") or "") + item}
        elif item:
            out.append({"type": "text", "text": item})
    return out


def _unindexed(block: Any) -> Any:
    """A released block as a whole message holds it: without its streaming index."""
    if isinstance(block, dict) and "index" in block:
        return {k: v for k, v in block.items() if k != "index"}
    return block


def _whole(block: Any, *, responses: bool) -> Any:
    """A streamed block as the provider's non-streamed answer holds it.

    Without streaming indexes (its own and its parts'); an Anthropic tool use
    block with its input parsed from the JSON that streamed; a Responses text
    part with its (possibly empty) annotations and a whole function call item
    with its ``completed`` status.

    Args:
        block: The merged streamed block.
        responses: Whether the answer came from OpenAI's Responses API.
    """
    if isinstance(block, str):
        return {"type": "text", "text": block}
    if not isinstance(block, dict):
        return block
    block = {k: _unindexed_parts(v) for k, v in block.items() if k != "index"}
    kind = block.get("type")
    if "partial_json" in block and not block.get("input"):
        args = strict_args(str(block.get("partial_json") or ""))
        if args is not None:
            block = {k: v for k, v in block.items() if k != "partial_json"}
            block["input"] = args
    if responses and kind == "text":
        block.setdefault("annotations", [])
    whole = strict_args(str(block.get("arguments") or "")) is not None
    if kind == "function_call" and "status" not in block and whole:
        block["status"] = "completed"
    return block


def _unindexed_parts_of(value: Any) -> Any:
    """A pass-through field (Responses ``reasoning``) without its parts' streaming indexes."""
    if isinstance(value, dict):
        return {k: _unindexed_parts(v) for k, v in value.items()}
    return value


def _unindexed_parts(value: Any) -> Any:
    if isinstance(value, list):
        return [_unindexed(v) for v in value]
    return value


def dumps_args(args: dict[str, Any]) -> str:
    """Tool arguments as the JSON text a tool-call chunk carries."""
    return json.dumps(args, ensure_ascii=False)


def repairable(raw: str) -> bool:
    """Whether LangChain's lenient merge would turn ``raw`` into valid arguments."""
    if not raw:
        return True
    try:
        return isinstance(parse_partial_json(raw), dict)
    except Exception:
        return False


def streamed_invalid_args(raw: str) -> str:
    """The arguments a streamed chunk carries for a call that will not run."""
    return INVALID_ARGS_MARKER + raw if repairable(raw) else raw


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not a JSON value")


_STRICT_JSON = json.JSONDecoder(parse_constant=_not_json)
"""Python's JSON decoder without its extensions: ``NaN``, ``Infinity`` and
``-Infinity`` are not JSON (RFC 8259), and a checkpoint (standard JSON) could
not hold them, so a call whose arguments hold them is not complete."""


def _nests_within(value: Any, limit: int) -> bool:
    """Whether ``value``'s objects and arrays nest at most ``limit`` levels (no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return False
        children = item.values() if isinstance(item, dict) else item
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return True


def strict_args(raw: str) -> dict[str, Any] | None:
    """Parse tool arguments strictly; ``None`` unless they are a whole, standard JSON object.

    Standard JSON only (`_STRICT_JSON`), nested at most `MAX_ARGS_DEPTH`
    levels: arguments a checkpoint could not hold exactly are never released,
    so a call replayed from a checkpoint is the call that was released.
    Arguments too deep for the parser itself (``RecursionError``) go to
    ``invalid_tool_calls`` too, as the bare model reports them.
    """
    if not raw.strip():
        return {}
    try:
        value = _STRICT_JSON.decode(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict) or not _nests_within(value, MAX_ARGS_DEPTH):
        return None
    return value


_CALL_ITEM_IDS = "__openai_function_call_ids__"
_SHAPE_KEYS = ("model_provider", "output_version")
_TEXT_KEYS = frozenset(("type", "text", "index"))


def _shifted(annotations: Any, by: int) -> Any:
    """Responses annotations of a continuation's text, placed in the text block it extends."""
    if not by or not isinstance(annotations, list):
        return annotations
    out = []
    for note in annotations:
        if isinstance(note, dict):
            note = dict(note)
            for key in ("start_index", "end_index"):
                if isinstance(note.get(key), int):
                    note[key] += by
        out.append(note)
    return out


def _block_is_whole(block: Mapping[str, Any]) -> bool:
    """Whether a non-text block can be sent back as it is, before its end arrives.

    A thinking block is whole once its signature arrived; a redacted thinking
    block arrives whole. Any other block is whole once a later block begins or
    the turn ends.
    """
    kind = block.get("type")
    if kind == "thinking":
        return bool(block.get("signature"))
    return kind == "redacted_thinking"


def _unsigned(block: Mapping[str, Any]) -> bool:
    """Whether a block cannot be sent back because its signature never came."""
    return block.get("type") == "thinking" and not block.get("signature")


_WRITTEN_FIELDS = ("text", "thinking", "reasoning", "partial_json", "arguments", "args")
"""The fields of a block that hold what the model wrote (text, thinking, tool arguments)."""


def _written(block: Any) -> int:
    """Characters of output a discarded block or piece held: what the model wrote.

    Its framing (type, ids, indexes, a signature) is not output the model
    writes again, so it is not counted as regenerated.
    """
    if isinstance(block, str):
        return len(block)
    if not isinstance(block, Mapping):
        return 0
    count = sum(len(v) for k in _WRITTEN_FIELDS if isinstance(v := block.get(k), str))
    summary = block.get("summary")  # a Responses reasoning item's summary parts
    if isinstance(summary, list):
        count += sum(_written(part) for part in summary)
    return count


class TurnAccumulator:
    """Everything that has arrived of one assistant turn, across attempts.

    Text that could still be discarded is held back, never yielded: whitespace
    before any visible text (a restart would discard it), and, with
    ``hold_text``, all text until the turn ends (an answer that must be one JSON
    document is never shown in pieces that a restart would contradict).

    Args:
        message_id: The stable id every yielded chunk carries.
        checkpoint: A checkpoint to resume from: its text and complete tool calls
            count as already delivered; its in-flight call is dropped.
        hold_text: Hold all text back until the turn ends.
        standard_blocks: Translate the inner model's blocks to LangChain's standard
            blocks, as a model with ``output_version="v1"`` shows them.
    """

    def __init__(
        self,
        message_id: str,
        checkpoint: StreamCheckpoint | None = None,
        *,
        hold_text: bool = False,
        standard_blocks: bool = False,
    ) -> None:
        self.message_id = message_id
        self.hold_text = hold_text
        self.standard_blocks = standard_blocks
        self._held: list[Any] = []
        """Output received but not yet released (see the class docstring): text
        pieces, or, once the inner model streams content blocks, text pieces and
        whole blocks."""
        self.blocks = False
        """Whether the inner model streams content as a list of blocks."""
        self._content: list[Any] = []
        """The released content blocks, merged as chunk addition merges them."""
        self._pending: dict[Any, dict[str, Any]] = {}
        """Non-text blocks still arriving, by their index in the turn."""
        self._block_map: dict[Any, Any] = {}
        """This attempt's block indexes -> the turn's."""
        self._used: set[Any] = set()
        self._next_block = 0
        self._shift = False
        """Whether this attempt's block indexes are moved past those already used."""
        self._continued: Any = None
        """The turn's index of the text block a continuation's first text extends."""
        self._continued_from = 0
        """How much text that block held when the continuation began."""
        self._extended: Any = None
        """The turn's index of the text block this attempt's first text block extends."""
        self._text_index: Any = None
        self._as_string = False
        """Whether the latest text came as a string chunk (it is passed on as one)."""
        self._notes: list[tuple[Any, Any]] = []
        """A continuation's annotations (by the turn's block index) waiting for the seam."""
        self.completed_blocks: list[CompletedBlock] = []
        self._resumed_text_blocks: list[TextBlockStart] = []
        """The text blocks of a resumed checkpoint (``replay`` rebuilds them)."""
        self._item_ids: dict[str, Any] = {}
        """ChatOpenAI's function call item ids (``v0``), by call id, until the call is whole."""
        self._reasoning: dict[str, Any] | None = None
        """A ``v0`` reasoning item (``additional_kwargs["reasoning"]``) still arriving."""
        self._held_kwargs: list[dict[str, Any]] = []
        """Whole ``v0`` reasoning items held back with text that is held back."""
        self._visible = False
        """Whether non-whitespace text has been released."""
        self._text = ""
        self._text_parts: list[str] = []
        self.completed: list[CompletedToolCall] = []
        self.invalid: list[NotExecutedToolCall] = []
        self._open: dict[int, _OpenCall] = {}
        self._index_map: dict[Any, int] = {}
        self._next_index = 0
        self.usage: UsageMetadata | None = None
        self.response_metadata: dict[str, Any] = {}
        self._merged_last: dict[str, Any] | None = None
        """The metadata `take_text` merged last, if nothing was merged since."""
        self.additional_kwargs: dict[str, Any] = {}
        self.terminal = False
        self.chunks_in_attempt = 0
        self.discarded_chars = 0
        self._seam: SeamFilter | None = None
        self._removed_at_seams = 0
        if checkpoint is not None:
            self._text = checkpoint.partial_text
            self._visible = bool(self._text.strip())
            self.completed = list(checkpoint.completed_tool_calls)
            self.invalid = list(checkpoint.invalid_tool_calls)
            self.terminal = checkpoint.complete
            self.completed_blocks = list(checkpoint.completed_blocks)
            self._resumed_text_blocks = list(checkpoint.text_blocks)
            self.blocks = bool(self.completed_blocks) or checkpoint.content_blocks
            used = [c.index for c in self.completed] + [c.index for c in self.invalid]
            cut = checkpoint.in_flight_tool_call
            if cut is not None:
                used.append(cut.index)
                if self.completed:  # plan R2: the cut-off call is reported, not run
                    self.invalid.append(
                        NotExecutedToolCall(
                            id=cut.id,
                            name=cut.name,
                            index=cut.index,
                            args=cut.partial_args,
                            error=INTERRUPTED_TOOL_CALL_ERROR,
                        )
                    )
                else:
                    self.discarded_chars += len(cut.partial_args)
            self._next_index = max(used, default=-1) + 1

    # -- reading ----------------------------------------------------------------

    @property
    def text(self) -> str:
        """The whole turn's released text so far."""
        if self._text_parts:
            self._text = self._text + "".join(self._text_parts)
            self._text_parts = []
        return self._text

    @property
    def nothing_shown(self) -> bool:
        """Whether output arrived in this turn and none of it has been released."""
        released = self.text or self._content or self.completed or self.additional_kwargs
        return bool(self._held or self._held_kwargs) and not released

    @property
    def in_flight(self) -> _OpenCall | None:
        """The tool call whose arguments are still arriving, if any."""
        if not self._open:
            return None
        return self._open[max(self._open)]

    @property
    def seam_pending(self) -> bool:
        """Whether continuation text is being held back for de-duplication."""
        return self._seam is not None and self._seam.pending

    @property
    def seam_removed_chars(self) -> int:
        """Characters removed as repetition at continuation seams."""
        return self._removed_at_seams + (self._seam.removed_chars if self._seam else 0)

    def snapshot(self, **fields: Any) -> StreamCheckpoint:
        """Build a checkpoint of the turn so far; ``fields`` fill the rest.

        Pass ``complete=True`` once the turn has finished: the checkpoint then
        holds the whole answer.
        """
        return self.capture(**fields).build()

    def capture(self, **fields: Any) -> DeferredCheckpoint:
        """`snapshot`, built only when `DeferredCheckpoint.build` is called.

        The text is captured by reference: its joined part and the pieces
        released since, which are only ever appended to or replaced, never
        changed in place. So the capture costs the same however long the turn
        is, and a checkpoint a writer replaces with a newer one before writing
        it is never built.
        """
        call = self.in_flight
        fields["in_flight_tool_call"] = (
            InFlightToolCall(id=call.id, name=call.name, index=call.index, partial_args=call.args())
            if call is not None
            else None
        )
        fields["completed_tool_calls"] = tuple(self.completed)
        fields["invalid_tool_calls"] = tuple(self.invalid)
        fields["completed_blocks"] = tuple(self.completed_blocks)
        fields["text_blocks"] = self._text_block_starts() if self.blocks else ()
        fields["content_blocks"] = self.blocks
        fields["message_id"] = self.message_id
        parts = self._text_parts
        return DeferredCheckpoint(fields, self._text, parts, len(parts))

    # -- attempts -------------------------------------------------------------------

    def begin_attempt(self, *, continuing: bool, exact: bool = False) -> None:
        """Start a new request; a continuation de-duplicates its seam.

        ``exact``: the attempt goes on exactly where the text stopped (the
        provider's own stream, resumed after its last delivered event), so
        nothing at the seam is a repeat.
        """
        open_ids = set()
        for call in self._open.values():
            self.discarded_chars += call.size
            open_ids.add(call.id)
        for block in self._pending.values():
            if block.get("id") not in open_ids:  # a cut-off call's arguments count once
                self.discarded_chars += _written(block)
        if self._reasoning is not None:
            self.discarded_chars += _written(self._reasoning)
            self._reasoning = None
        if not continuing:
            self._held_kwargs = []
        if not continuing and self._held:  # a restart: what was held back is discarded
            self.discarded_chars += sum(_written(p) for p in self._held)
            self._held = []
        if not continuing and not self._content and not self.text and not self.completed_blocks:
            # nothing was released: the answer takes the shape of the attempt that writes it
            # (a block discarded with a cut-off attempt leaves no trace)
            self.blocks = False
        # a text block cut before its first text (only its citations came) is sent again
        begun = {b.get("index") for b in self._content if isinstance(b, dict)}
        self._held = [
            p
            for p in self._held
            if not (_is_text(p) and not p.get("text") and p.get("index") not in begun)
        ]
        self._pending = {}
        self._block_map = {}
        kept = [b.get("index") for b in (*self._content, *self._held) if isinstance(b, dict)]
        self._used = {i for i in kept if i is not None}  # a discarded block's index is free
        self._next_block = max((i + 1 for i in self._used if isinstance(i, int)), default=0)
        dicts = [b for b in self._content if isinstance(b, dict)]
        if (
            self._content
            and isinstance(self._content[-1], str)
            and not (dicts and _is_text(dicts[-1]))
        ):
            self._next_block += 1  # text that came as strings, in a block of its own
        self._shift = bool(self._content)
        last = self._content[-1] if self._content else None
        self._continued = (
            last.get("index") if continuing and isinstance(last, dict) and _is_text(last) else None
        )
        self._continued_from = (
            len(str(last.get("text") or "")) if self._continued is not None and last else 0
        )
        self._extended = None
        self._notes = []
        self._open = {}
        self._index_map = {}
        # a call cut off and discarded was never shown: its index is free again
        calls = [c.index for c in self.completed] + [c.index for c in self.invalid]
        self._next_index = max(calls, default=-1) + 1
        self.terminal = False
        self.chunks_in_attempt = 0
        if self._seam is not None:
            self._removed_at_seams += self._seam.removed_chars
        self._seam = SeamFilter(self.text) if continuing and self.text and not exact else None

    def feed(self, generation: ChatGenerationChunk) -> list[AIMessageChunk]:
        """Take one chunk of the inner model and return the chunks to yield.

        A chunk of plain text (the common case) is passed on as the same
        message object, given the turn's id and stripped of its per-chunk
        metadata; callers may then pass on ``generation`` itself.
        """
        if self.take_text(generation):
            return [cast(AIMessageChunk, generation.message)]
        self.chunks_in_attempt += 1
        message = generation.message
        out: list[AIMessageChunk] = []
        content = message.content
        calls = getattr(message, "tool_call_chunks", None) or []
        if (content or calls) and self._reasoning is not None:
            self._complete_reasoning(out)  # a later output item began
        if isinstance(content, list):
            if self.standard_blocks:  # as LangChain's stream() shows them
                content = cast(list[Any], message.content_blocks)
            if not self.blocks:
                self._start_blocks()
            self._feed_blocks(content, out)
        else:
            if content and self._pending:  # text after a block that was still arriving
                self._close_blocks(out)
            self._feed_text(content, out, as_string=True)
        if calls:
            self._release_seam(out)
            for piece in calls:
                self._feed_call(piece, out)
        kwargs = {k: v for k, v in message.additional_kwargs.items() if k not in _SKIPPED_KWARGS}
        reasoning = kwargs.pop("reasoning", None) if self.blocks else None
        item_ids = kwargs.pop(_CALL_ITEM_IDS, None) if self.blocks else None
        if item_ids:  # released with their calls, never for a call that was cut off
            self._item_ids.update(item_ids)
        if reasoning is not None:
            self._feed_reasoning(reasoning, out)
        if kwargs:
            self._emit_kwargs(kwargs, out)
        usage = getattr(message, "usage_metadata", None)
        if usage:
            self.usage = add_usage(self.usage, usage)
        self._merge_metadata(generation.generation_info)
        self._merge_metadata(message.response_metadata)
        if getattr(message, "chunk_position", None) == "last" or self._has_terminal():
            self.terminal = True
        if self.terminal:
            self._release_seam(out)
            if self._reasoning is not None:
                self._complete_reasoning(out)
            self._close_blocks(out)
            if not self.hold_text:  # one document is released when its stream has ended
                self._release_held(out)
            for index in sorted(self._open):
                self._close_call(self._open.pop(index), out, interrupted=False)
        return out

    def end_of_text(self) -> list[AIMessageChunk]:
        """Release text held back at the seam (the stream ended or broke)."""
        out: list[AIMessageChunk] = []
        self._release_seam(out)
        return out

    def end_of_turn(self) -> list[AIMessageChunk]:
        """Release everything held back: the turn is over and nothing more is discarded."""
        out = self.end_of_text()
        self._release_held(out)
        return out

    def not_executed(self) -> list[NotExecutedCall]:
        """The turn's tool calls that will not run, with the reason."""
        return [
            {
                "id": call.id,
                "name": call.name,
                "error": call.error,
                "interrupted": call.error == INTERRUPTED_TOOL_CALL_ERROR,
            }
            for call in self.invalid
        ]

    def cut_off_in_flight(self) -> NotExecutedToolCall | None:
        """Turn the in-flight call into an interrupted invalid call (plan R2)."""
        call = self.in_flight
        if call is None:
            return None
        del self._open[call.index]
        invalid = NotExecutedToolCall(
            id=call.id,
            name=call.name,
            index=call.index,
            args=call.args(),
            error=INTERRUPTED_TOOL_CALL_ERROR,
        )
        self.invalid.append(invalid)
        return invalid

    # -- output -----------------------------------------------------------------------

    def final_chunk(self, awaken: Mapping[str, Any]) -> AIMessageChunk:
        """The last chunk: usage over all attempts, metadata, invalid calls."""
        metadata = {**self.response_metadata, "awaken": awaken}
        return AIMessageChunk(
            content=self._empty(),
            id=self.message_id,
            usage_metadata=self.usage,
            response_metadata=metadata,
            tool_call_chunks=[
                tool_call_chunk(
                    name=call.name,
                    args=streamed_invalid_args(call.args),
                    id=call.id,
                    index=call.index,
                )
                for call in self.invalid
            ],
            chunk_position="last",
        )

    def message(self, awaken: Mapping[str, Any] | None = None) -> AIMessage:
        """The turn as a complete message (invalid calls carry their error)."""
        metadata = dict(self.response_metadata)
        if awaken is not None:
            metadata["awaken"] = awaken
        return AIMessage(
            content=self._whole_content() if self.blocks else self.text,
            additional_kwargs={
                k: _unindexed_parts_of(v) for k, v in self.additional_kwargs.items()
            },
            id=self.message_id,
            tool_calls=[tool_call(name=c.name, args=c.args, id=c.id) for c in self.completed],
            invalid_tool_calls=[
                invalid_tool_call(name=c.name, args=c.args, id=c.id, error=c.error)
                for c in self.invalid
            ],
            usage_metadata=self.usage,
            response_metadata=metadata,
        )

    def _whole_content(self) -> str | list[Any]:
        content = self._content
        responses = (  # a turn cut under plan R2 never saw the terminal response object
            self.response_metadata.get("object") == "response"
            or _CALL_ITEM_IDS in self.additional_kwargs
            or any(isinstance(b, dict) and b.get("type") == "function_call" for b in content)
        )
        content = [_whole(b, responses=responses) for b in _folded(self._content)]
        if (  # Anthropic's non-streamed answer of one plain text block is a string
            self.response_metadata.get("model_provider") == "anthropic"
            and len(content) == 1
            and isinstance(content[0], dict)
            and content[0].get("type") == "text"
            and not content[0].get("citations")
        ):
            return str(content[0].get("text", ""))
        return content

    # -- internals --------------------------------------------------------------------

    def take_text(self, generation: ChatGenerationChunk) -> bool:
        """Take a chunk that carries nothing but text, to be passed on as it is.

        Returns whether the chunk was taken; `feed` takes any other. Building a
        new chunk per token costs as much as the inner model's own chunk; a
        text-only chunk needs no rewriting beyond its message's id and metadata,
        which `feed` would drop from the yielded chunk anyway (the metadata is
        merged into the turn's, as `feed` does). Its message is changed in
        place, so callers pass on ``generation`` itself.

        The fields are read from the models' ``__dict__``: reading an attribute
        of a pydantic model goes through its ``__getattr__`` hook, which the
        interpreter cannot specialize, and this runs for every chunk. The
        metadata of a chunk equal to the last one merged here (each chunk of
        the OpenAI and Anthropic integrations names its provider) is known to
        be merged already and not to end the turn.
        """
        if (
            self.terminal
            or not self._visible
            or self.hold_text
            or self._held
            or self._pending
            or (self._seam is not None and self._seam.active)
        ):
            return False
        try:
            outer = generation.__dict__
            message = outer["message"]
            if type(message) is not AIMessageChunk or outer["generation_info"]:
                return False
            fields = message.__dict__
            if (
                fields["tool_call_chunks"]
                or fields["additional_kwargs"]
                or fields["usage_metadata"]
                or fields["chunk_position"] is not None
                or fields["name"] is not None
            ):
                return False
            content = fields["content"]
            metadata = fields["response_metadata"]
        except KeyError:  # not pydantic's layout: the general path
            return False
        if type(content) is not str or not content:
            return False
        if metadata and metadata != self._merged_last:
            if _ends_turn(metadata):
                return False
            self._merge_metadata(metadata)
            self._merged_last = dict(metadata)  # as merged, whatever becomes of the chunk's
        self.chunks_in_attempt += 1
        self._text_parts.append(content)
        if self.blocks:
            self._content = _with_text(self._content, content)
        if _DIRECT_ASSIGNMENT:  # as pydantic's `__setattr__` would, without its frames
            fields["id"] = self.message_id
            fields_set = message.__pydantic_fields_set__
            fields_set.add("id")
            if metadata:
                fields["response_metadata"] = {}
                fields_set.add("response_metadata")
        else:
            message.id = self.message_id
            if metadata:
                message.response_metadata = {}
        return True

    def _emit_text(self, text: str, out: list[AIMessageChunk]) -> None:
        """Release ``text``, or hold it back while it could still be discarded."""
        piece: Any = text
        if self.blocks and not self._as_string:
            piece = {"type": "text", "text": text}
            if self._text_index is not None:
                piece["index"] = self._text_index
        self._held.append(piece)
        if not self.hold_text and (self._visible or text.strip()):
            self._release_held(out)

    def _feed_reasoning(self, piece: dict[str, Any], out: list[AIMessageChunk]) -> None:
        """Take a piece of a ``v0`` reasoning item: released only whole, like a block."""
        pending = self._reasoning
        if pending is not None and piece.get("id") and piece.get("id") != pending.get("id"):
            self._complete_reasoning(out)  # another item began
            pending = None
        self._reasoning = piece if pending is None else merge_dicts(pending, piece)
        if "encrypted_content" in piece:  # the item's done event
            self._complete_reasoning(out)

    def _complete_reasoning(self, out: list[AIMessageChunk]) -> None:
        item, self._reasoning = self._reasoning, None
        if item is not None:
            self._held_kwargs.append({"reasoning": item})
            if not self.hold_text and self._visible:
                self._release_held(out)

    def _emit_kwargs(self, kwargs: dict[str, Any], out: list[AIMessageChunk]) -> None:
        self.additional_kwargs = merge_dicts(self.additional_kwargs, kwargs)
        out.append(
            AIMessageChunk(
                content=self._empty(),
                additional_kwargs=kwargs,
                id=self.message_id,
                response_metadata=self._shape(),
            )
        )

    def _release_held(self, out: list[AIMessageChunk]) -> None:
        for kwargs in self._held_kwargs:
            self._emit_kwargs(kwargs, out)
        self._held_kwargs = []
        if not self._held:
            return
        pieces, self._held = self._held, []
        if not self.blocks:
            text = "".join(pieces)
            self._visible = self._visible or bool(text.strip())
            self._text_parts.append(text)
            out.append(AIMessageChunk(content=text, id=self.message_id))
            return
        run: list[Any] = []
        for piece in [*pieces, None]:  # text that came as strings goes on as strings
            if run and (piece is None or isinstance(piece, str) != isinstance(run[0], str)):
                self._release_run(run, out)
                run = []
            if piece is not None:
                run.append(piece)

    def _release_run(self, pieces: list[Any], out: list[AIMessageChunk]) -> None:
        """Release held pieces in blocks mode: strings as one string, others as blocks."""
        if isinstance(pieces[0], str):
            text = "".join(pieces)
            self._visible = self._visible or bool(text.strip())
            self._text_parts.append(text)
            self._content = _with_text(self._content, text)
            out.append(AIMessageChunk(content=text, id=self.message_id))
            return
        for piece in pieces:
            if _is_text(piece):
                text = str(piece.get("text", ""))
                self._visible = self._visible or bool(text.strip())
                self._text_parts.append(text)
            else:
                self.completed_blocks.append(
                    CompletedBlock(block=_unindexed(piece), text_offset=len(self.text))
                )
        pieces = merge_lists([], pieces) or []  # pieces of one block become one
        self._content = merge_lists(self._content, pieces) or []
        out.append(
            AIMessageChunk(content=pieces, id=self.message_id, response_metadata=self._shape())
        )

    def _start_blocks(self) -> None:
        """The inner model streams content blocks (from the start, or after text)."""
        self.blocks = True
        if self.text:  # chunk addition keeps text that came as a string as a string
            self._content = [self.text]

    def _shape(self) -> dict[str, Any]:
        """The metadata a chunk of blocks needs to be read (``content_blocks``, v1 output).

        LangChain translates a chunk's blocks by its ``model_provider`` and
        ``output_version``; the inner model's chunks carry them, and so do ours.
        """
        metadata = self.response_metadata
        shape = {k: metadata[k] for k in _SHAPE_KEYS if k in metadata}
        if self.standard_blocks:
            shape["output_version"] = "v1"
        return shape

    def _empty(self) -> str | list[Any]:
        return [] if self.blocks else ""

    def _feed_text(self, content: Any, out: list[AIMessageChunk], *, as_string: bool) -> None:
        text = _text_of(content)
        if text:
            self._as_string = as_string
        if text and self._seam is not None:
            text = self._seam.feed(text)
        if text:
            self._emit_text(text, out)
        self._place_notes(out)

    def _place_notes(self, out: list[AIMessageChunk]) -> None:
        """Place a continuation's annotations in the text block it extends.

        Their offsets count from the continuation's first character; the text
        the seam removed as a repeat is known once the seam has decided. A
        cited span the continuation repeats is cited once.
        """
        if not self._notes or self.seam_pending:
            return
        repeated = self._seam.removed_chars if self._seam is not None else 0
        notes, self._notes = self._notes, []
        for index, found in notes:
            known = self._annotations_of(index)
            new = [a for a in _shifted(found, self._continued_from - repeated) if a not in known]
            if new:
                self._held.append({"type": "text", "text": "", "index": index, "annotations": new})
        if not self.hold_text and self._visible:
            self._release_held(out)

    def _feed_blocks(self, content: list[Any], out: list[AIMessageChunk]) -> None:
        """Take a chunk's content blocks: text streams, other blocks are released whole."""
        for block in content:
            if isinstance(block, str):
                self._feed_text(block, out, as_string=False)
                continue
            if not isinstance(block, dict):
                continue
            raw = block.get("index")
            if raw is not None and raw not in self._block_map:
                self._close_blocks(out)  # blocks arrive one after another
                if block.get("citations"):  # a block that opens citing begins, never extends
                    self._continued = None
            index = self._map_block(raw, text=_is_text(block))
            piece = dict(block)
            if raw is not None:
                piece["index"] = index
            if _is_text(piece):
                self._text_index = index
                extends = index is not None and index == self._extended
                if extends and "id" in piece and self._has_id(index):
                    piece.pop("id")  # the text continues the original item: its id stays
                if extends and piece.get("annotations"):  # placed once the seam is known
                    self._notes.append((index, piece.pop("annotations")))
                if set(piece) - _TEXT_KEYS:  # citations, annotations, an id
                    self._held.append({**piece, "text": ""} if "text" in piece else piece)
                    begun = any(
                        isinstance(b, dict) and b.get("index") == index for b in self._content
                    )
                    if begun and not self.hold_text and self._visible:  # a new block waits for text
                        self._release_held(out)
                self._feed_text(str(block.get("text") or ""), out, as_string=False)
                continue
            self._release_seam(out)
            if raw is None:
                self._complete_block(piece, out)
                continue
            pending = self._pending.get(index)
            merged = piece if pending is None else (merge_lists([pending], [piece]) or [piece])[0]
            self._pending[index] = merged
            if _block_is_whole(merged):
                self._complete_block(self._pending.pop(index), out)

    def _annotations_of(self, index: Any) -> list[Any]:
        """The annotations the turn's text block ``index`` already carries."""
        blocks = (*self._content, *self._held)
        return [
            note
            for b in blocks
            if isinstance(b, dict) and b.get("index") == index
            for note in b.get("annotations") or []
        ]

    def _has_id(self, index: Any) -> bool:
        """Whether the turn's block ``index`` already carries its item id."""
        blocks = (*self._content, *self._held)
        return any(isinstance(b, dict) and b.get("index") == index and b.get("id") for b in blocks)

    def _map_block(self, raw: Any, *, text: bool) -> Any:
        """The turn's index for a block index of this attempt."""
        if raw is None:
            return None
        if raw in self._block_map:
            return self._block_map[raw]
        if text and self._continued is not None:
            index = self._extended = self._continued
        elif not self._shift:
            index = raw
        elif isinstance(raw, int):
            index = self._next_block
        else:
            index, n = raw, 1
            while index in self._used:
                index, n = f"{raw}_{n}", n + 1
        self._continued = None
        self._block_map[raw] = index
        self._used.add(index)
        if isinstance(index, int):
            self._next_block = max(self._next_block, index + 1)
        return index

    def _close_blocks(self, out: list[AIMessageChunk]) -> None:
        """Release the blocks still arriving: the turn ended or a later block began."""
        for index in list(self._pending):
            self._complete_block(self._pending.pop(index), out)

    def _complete_block(self, block: dict[str, Any], out: list[AIMessageChunk]) -> None:
        """Release a whole non-text block, or hold it with text that is held back."""
        self._held.append(block)
        if not self.hold_text and self._visible:
            self._release_held(out)

    @property
    def settled(self) -> bool:
        """Whether all output received is released.

        Nothing is held back, and no tool call or other block is still arriving
        (text may be: what came of it is released).
        """
        return not (
            self._open
            or self._pending
            or self._reasoning is not None
            or self._held
            or self._held_kwargs
            or self.seam_pending
        )

    @property
    def block_in_flight(self) -> bool:
        """Whether a content block that cannot be sent back yet was cut off."""
        return bool(self._pending) or self._reasoning is not None

    def content_prefix(self) -> list[Any]:
        """The released content blocks, as a continuation's assistant message sends them."""
        return [_unindexed(b) for b in self._content]

    def _text_block_starts(self) -> tuple[TextBlockStart, ...]:
        """Where each released text block begins in the text, with its other keys."""
        starts: list[TextBlockStart] = []
        at = 0
        for block in self._content:
            if isinstance(block, str):
                text, fields = block, {}
            elif _is_text(block):
                text = str(block.get("text") or "")
                fields = {k: v for k, v in block.items() if k not in _TEXT_KEYS}
            else:
                continue
            starts.append(TextBlockStart(text_offset=at, fields=fields))
            at += len(text)
        return tuple(starts)

    def replay(self) -> list[AIMessageChunk]:
        """Chunks that deliver a resumed checkpoint's text and blocks, in their order."""
        text = self._text
        if not self.blocks:
            return [AIMessageChunk(content=text, id=self.message_id)] if text else []
        # blocks first where a block and a text block begin at one place in the text
        marks = sorted(
            [(b.text_offset, 0, i, b) for i, b in enumerate(self.completed_blocks)]
            + [(t.text_offset, 1, i, t) for i, t in enumerate(self._resumed_text_blocks)]
        )
        content: list[Any] = []
        text_block: dict[str, Any] | None = None
        at = 0

        def add_text(end: int) -> None:
            nonlocal at, text_block
            if end <= at:
                return
            if text_block is None:
                text_block = {"type": "text", "text": ""}
                content.append(text_block)
            text_block["text"] += text[at:end]
            at = end

        for offset, _, _, mark in marks:
            add_text(min(offset, len(text)))
            if isinstance(mark, CompletedBlock):
                content.append(dict(mark.block))
                text_block = None
            else:
                text_block = {"type": "text", **mark.fields, "text": ""}
                content.append(text_block)
        add_text(len(text))
        content = [{**block, "index": i} for i, block in enumerate(content)]
        self._content = list(content)
        self._used = set(range(len(content)))
        self._next_block = len(content)
        if not content:
            return []
        return [
            AIMessageChunk(content=content, id=self.message_id, response_metadata=self._shape())
        ]

    def _release_seam(self, out: list[AIMessageChunk]) -> None:
        if self._seam is not None and self._seam.pending:
            text = self._seam.flush()
            if text:
                self._emit_text(text, out)
        self._place_notes(out)

    def _feed_call(self, piece: Any, out: list[AIMessageChunk]) -> None:
        raw_index = piece.get("index")
        if raw_index is None or raw_index not in self._index_map:
            for index in sorted(self._open):
                self._close_call(self._open.pop(index), out, interrupted=False)
            index = self._call_index(raw_index)
            self._next_index = index + 1
            if raw_index is not None:
                self._index_map[raw_index] = index
            self._open[index] = _OpenCall(index=index)
        call = self._open.get(self._index_map.get(raw_index, self._next_index - 1))
        if call is None:  # a late fragment of a call that already closed
            return
        if piece.get("id"):
            call.id = piece["id"]
        if piece.get("name") and not call.name:
            call.name = piece["name"]
        args = piece.get("args")
        if args:
            call.parts.append(args)
            call.size += len(args)
        if raw_index is None:
            self._close_call(self._open.pop(call.index), out, interrupted=False)

    def _call_index(self, raw: Any) -> int:
        """The turn's index for a new call.

        The stream's own (its content block's, when blocks are mapped), unless the
        turn already used that index or a later one.
        """
        index = self._block_map.get(raw, raw) if self.blocks else raw
        if isinstance(index, int) and index >= self._next_index:
            return index
        return self._next_index

    def _close_call(self, call: _OpenCall, out: list[AIMessageChunk], *, interrupted: bool) -> None:
        raw = call.args()
        args = strict_args(raw)
        if args is None or not call.name:
            error = INTERRUPTED_TOOL_CALL_ERROR if interrupted else MALFORMED_TOOL_CALL_ERROR
            self.invalid.append(
                NotExecutedToolCall(
                    id=call.id, name=call.name, index=call.index, args=raw, error=error
                )
            )
            return
        self.completed.append(
            CompletedToolCall(id=call.id or "", name=call.name, args=args, index=call.index)
        )
        piece = tool_call_chunk(name=call.name, args=raw or "{}", id=call.id, index=call.index)
        if call.id in self._item_ids:
            self._emit_kwargs({_CALL_ITEM_IDS: {call.id: self._item_ids.pop(call.id)}}, out)
        if self.blocks and not self.hold_text:
            self._visible = True  # a whole call is usable: what came before it is kept
            self._release_held(out)
            for i in range(len(out) - 1, -1, -1):  # the call's own block travels with it
                chunk = out[i]
                if not chunk.tool_call_chunks and _carries_call(chunk.content, call.id):
                    out[i] = AIMessageChunk(
                        content=chunk.content,
                        id=self.message_id,
                        response_metadata=chunk.response_metadata,
                        tool_call_chunks=[piece],
                    )
                    return
        out.append(
            AIMessageChunk(
                content=self._empty(),
                id=self.message_id,
                response_metadata=self._shape() if self.blocks else {},
                tool_call_chunks=[piece],
            )
        )

    def _merge_metadata(self, metadata: dict[str, Any] | None) -> None:
        if not metadata:
            return
        self._merged_last = None  # `take_text` merges a chunk's metadata again after this
        merged = self.response_metadata
        for key, value in metadata.items():  # as chunk addition merges them
            if key != "awaken" and (value is not None or key not in merged):
                merged[key] = value

    def _has_terminal(self) -> bool:
        return _ends_turn(self.response_metadata)


def _pick_phase() -> None:
    _SHARED_PHASE[0] = random.random()


_SHARED_PHASE = [0.0]
"""Where this process's shared write moments fall within a ``every_seconds`` period,
as a fraction of it: drawn at random once per process (again in a forked child), so
that processes sharing one store do not all commit at the same moments."""
_pick_phase()
os.register_at_fork(after_in_child=_pick_phase)


def shared_phase(clock: Callable[[], float]) -> float | None:
    """The phase of this process's shared write moments for turns timed by ``clock``.

    Turns timed by `time.monotonic` (the default clock) share write moments;
    a turn given a clock of its own keeps its own time rule (``None``).
    """
    return _SHARED_PHASE[0] if clock is time.monotonic else None


class CheckpointCadence:
    """When an in-flight turn is due to be written to the store.

    A write is due after ``every_chunks`` chunks, or, while output is unsaved,
    once ``every_seconds`` have passed since the last write, whichever comes first.

    With a ``phase``, the time rule counts in shared moments instead: a write is
    due at the first chunk after the next moment ``(k + phase) * every_seconds``
    of the clock that follows the last write. That moment is never more than
    ``every_seconds`` after the last write, so no output waits longer than with
    the plain rule; a turn may be written a little more often (one write more
    per ``every_seconds`` at most, when the chunk rule fired just before a
    moment). Turns that share a clock and a phase then fall due together: a
    store's writer commits the turns of a process, each at its own pace, in one
    batch per moment instead of one small batch per turn, and a commit's fixed
    cost (a SQLite transaction, a round trip) is paid once for all of them.
    The engine passes `shared_phase` of its clock.

    Args:
        every_chunks: Most chunks of output left unsaved.
        every_seconds: Most seconds of output left unsaved.
        clock: Monotonic time source in seconds.
        phase: Where the shared moments fall, as a fraction of ``every_seconds``
            in ``[0, 1)``; ``None``: the time rule counts from each turn's last write.
    """

    def __init__(
        self,
        *,
        every_chunks: int,
        every_seconds: float,
        clock: Callable[[], float],
        phase: float | None = None,
    ) -> None:
        if phase is not None and not 0.0 <= phase < 1.0:
            raise ValueError(f"phase must be in [0, 1), got {phase!r}")
        self.every_chunks = every_chunks
        self.every_seconds = every_seconds
        self.phase = phase
        self._clock = clock
        self._unsaved = 0
        self._due = self._next_due(clock())

    def _next_due(self, now: float) -> float:
        """When the time rule makes a write due, for a write made at ``now``."""
        every, phase = self.every_seconds, self.phase
        if phase is None:
            return now + every
        return (math.floor(now / every - phase) + 1 + phase) * every

    @property
    def dirty(self) -> bool:
        """Whether output arrived since the last write."""
        return self._unsaved > 0

    def observe(self) -> bool:
        """Count one chunk of output; return whether a write is due now."""
        self._unsaved += 1
        return self._unsaved >= self.every_chunks or self._clock() >= self._due

    def written(self) -> None:
        """Record that the turn so far is being written."""
        self._unsaved = 0
        self._due = self._next_due(self._clock())

    def write_ended(self) -> None:
        """Record that the write ended: the time rule counts from now.

        With a phase, the next write falls due at the first moment after now.

        Counting from when the write began would make every chunk after a
        write longer than ``every_seconds`` due at once, so a slow store (or
        many turns sharing one) would be written on every chunk, and slowed
        down further by it.
        """
        self._due = self._next_due(self._clock())
