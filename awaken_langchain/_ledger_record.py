"""The tool ledger's stored record: its format, and reading it back.

Kept apart from the ledger itself so that what only reads records (the
``checkpoints`` command) does not import LangChain.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal

from awaken_langchain.checkpoint import StreamCheckpoint
from awaken_langchain.errors import StreamCheckpointError

LEDGER_MODEL = "awaken-tool-ledger"
"""The ``model`` of every ledger record's checkpoint: no chat model resumes one."""

LEDGER_PREFIX = "tool-ledger:"
"""How the store key of every ledger record starts (then the call's idempotency key)."""

RECORD_FORMAT = "awaken-tool-ledger"
RECORD_VERSION = 1

State = Literal["started", "finished", "failed"]


class UnreadableRecordError(StreamCheckpointError):
    """A call's stored record cannot be read (corrupted, or written by a newer release).

    The call is treated as one whose outcome is unknown: it is reported, never
    run again on the strength of a record nobody can read.
    """


@dataclasses.dataclass(frozen=True)
class LedgerRecord:
    """One tool call as the ledger keeps it.

    Attributes:
        key: The call's idempotency key.
        scope: The thread id, or the ledger's scope outside a thread.
        tool_call_id: The model's id of the call.
        tool: The tool's name.
        args: The model's arguments (injected arguments left out).
        args_sha256: Digest of ``args``, compared when the call comes back.
        state: ``started``, ``finished`` or ``failed``.
        epoch: The fencing epoch of the attempt that wrote the record.
        started_at: When the attempt started (seconds since the epoch).
        ended_at: When it finished or failed.
        result: The result as JSON (``{"message": ...}`` or ``{"command": ...}``).
        result_kept: ``False`` for a finished call whose result could not be
            kept (too large for the store, not JSON): a re-run reports that it
            finished without running it again.
        error: Why the call failed (a failed call), or why its result was not kept.
    """

    key: str
    scope: str
    tool_call_id: str
    tool: str
    args: dict[str, Any]
    args_sha256: str
    state: State
    epoch: int
    started_at: float
    ended_at: float | None = None
    result: dict[str, Any] | None = None
    result_kept: bool = True
    error: str | None = None

    def encode(self) -> str:
        """The record as the JSON text stored in its checkpoint."""
        data = {"format": RECORD_FORMAT, "version": RECORD_VERSION, **dataclasses.asdict(self)}
        return json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=repr)

    @property
    def run_id(self) -> str:
        """The store key of the record."""
        return LEDGER_PREFIX + self.key


def is_ledger_record(checkpoint: StreamCheckpoint) -> bool:
    """Whether a stored checkpoint is a ledger record."""
    return checkpoint.model == LEDGER_MODEL and checkpoint.run_id.startswith(LEDGER_PREFIX)


def read_record(checkpoint: StreamCheckpoint) -> LedgerRecord:
    """The ledger record a checkpoint holds.

    Raises:
        UnreadableRecordError: If the checkpoint holds no ledger record this
            release can read.
    """
    try:
        data = json.loads(checkpoint.partial_text)
        if data.pop("format") != RECORD_FORMAT or data.pop("version") != RECORD_VERSION:
            raise ValueError("not a ledger record of this version")
        record = LedgerRecord(**data)
        if record.state not in ("started", "finished", "failed") or not isinstance(
            record.args, dict
        ):
            raise ValueError(f"state {record.state!r}")
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise UnreadableRecordError(
            "stored tool ledger record is corrupted or of an unknown version",
            run_id=checkpoint.run_id,
            cause=exc,
        ) from exc
    return record
