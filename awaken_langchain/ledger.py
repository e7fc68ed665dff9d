"""`ToolLedger`: a tool call's side effect happens once, even when the process dies around it.

A streamed turn that asked for a tool is committed to memory; the tool starts;
the process dies. A replacement resumes the thread and runs the tool again:
a second payment, a second e-mail. The ledger keeps one record per tool call,
keyed by the thread (or the ledger's ``scope`` outside a thread) and the
model's ``tool_call_id``, in a checkpoint store:

- ``started`` before the tool runs (the writer's fencing epoch, the time, the
  tool's name, its arguments and their digest);
- ``finished`` with the result as the framework received it (a ``ToolMessage``
  or a ``Command``), or ``failed`` with the error when the tool raised.

Run again under the same id (a replacement re-runs the step):

- ``finished``: the recorded result is returned; the tool is not called;
- ``failed``: the tool is called again (unless listed in ``replay_failures``);
- ``started`` and never finished: the outcome is unknown. ``on_unknown="report"``
  (the default) returns an error ``ToolMessage`` naming the call's idempotency
  key and does not call the tool; ``"rerun"`` calls it again (at least once,
  for idempotent tools); a `Reconcile` callable asks the external system;
- the same id with other arguments is refused (`ToolLedgerConflictError`).

A record is a `StreamCheckpoint` of its own key (``tool-ledger:<key>``) whose
``partial_text`` is the record's JSON: the store's encoding, fencing (each
attempt claims the key; a stale process cannot overwrite a newer record),
expiry (``keep_for``), size limit, signing and key handling apply unchanged, so
every store, present or future, keeps a ledger.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import inspect
import json
import logging
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias, TypeGuard, cast

from langchain_core.messages import ToolCall, ToolMessage, message_to_dict, messages_from_dict
from langchain_core.messages.base import BaseMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import (
    ensure_config,
    get_async_callback_manager_for_config,
    get_callback_manager_for_config,
)
from langchain_core.tools import BaseTool, InjectedToolArg
from langchain_core.tools.base import _is_injected_arg_type, get_all_basemodel_annotations
from pydantic import ConfigDict

from awaken_langchain._ledger_record import (
    LEDGER_MODEL,
    LEDGER_PREFIX,
    LedgerRecord,
    UnreadableRecordError,
    is_ledger_record,
    read_record,
)
from awaken_langchain.checkpoint import (
    StreamCheckpointStore,
    unchecked_checkpoint,
)
from awaken_langchain.errors import AwakenError, StreamCheckpointError, StreamCheckpointFencedError
from awaken_langchain.events import RecoveryEvent, Report, _graph_writer, warning
from awaken_langchain.writer import writer_for

if TYPE_CHECKING:
    from langgraph.types import Command

logger = logging.getLogger(__name__)

__all__ = [
    "InjectedIdempotencyKey",
    "LEDGER_MODEL",
    "LEDGER_PREFIX",
    "LedgerRecord",
    "Reconcile",
    "ToolLedger",
    "ToolLedgerConflictError",
    "ToolLedgerError",
    "UnreadableRecordError",
    "idempotency_key",
    "is_ledger_record",
    "read_record",
]

DEFAULT_TTL = 7 * 24 * 3600.0
"""Seconds a record is kept after its last write (a week), unless the store's ttl is shorter."""

DEFAULT_DEADLINE = 0.5
"""Seconds a ledger operation waits for the store before the call goes on without it."""

_HEAD_ALLOWANCE = 2048
"""Bytes reserved for a record's head when checking its size against the store's limit."""

_KEY_PARAMS_LIMIT = 1024
"""How many tools' idempotency key parameters a ledger remembers."""

_ERROR_LIMIT = 4000
"""Characters of a failed call's error that are recorded."""

ToolResult: TypeAlias = "ToolMessage | Command[Any]"


class ToolLedgerError(AwakenError):
    """The ledger refused a tool call (its record would not fit, the store is unavailable)."""


class ToolLedgerConflictError(ToolLedgerError):
    """A tool call id came back with other arguments: it is a different call.

    Attributes:
        key: The call's idempotency key.
    """

    def __init__(self, message: str, *, key: str) -> None:
        self.key = key
        super().__init__(message)


class InjectedIdempotencyKey(InjectedToolArg):
    """Annotation of a tool parameter that receives the call's idempotency key.

    The parameter is not shown to the model; the ledger fills it with a key
    that is the same every time the same call (thread, ``tool_call_id``) runs,
    so the tool can hand it to an API that de-duplicates by key::

        @tool
        def pay(amount: int, key: Annotated[str, InjectedIdempotencyKey]) -> str:
            return payments.create(amount=amount, idempotency_key=key)
    """


class Reconcile(Protocol):
    """Asks the external system what became of a call whose outcome is unknown.

    Called with the tool call (the model's arguments) and its idempotency key.
    Returns the call's result (a ``ToolMessage``, a ``Command``, or text for a
    ``ToolMessage``) when the effect happened, or ``None`` when it did not: the
    tool is then run. May be a coroutine function for async tools.
    """

    def __call__(
        self, tool_call: ToolCall, idempotency_key: str
    ) -> (
        ToolMessage | Command[Any] | str | Awaitable[ToolMessage | Command[Any] | str | None] | None
    ):
        """Return the call's result, or ``None`` if its effect did not happen."""
        ...


OnUnknown: TypeAlias = "Literal['report', 'rerun'] | Reconcile"


def idempotency_key(scope: str, tool_call_id: str) -> str:
    """The stable idempotency key of the call ``tool_call_id`` in ``scope``.

    A digest: any id (path separators, control characters, megabytes) gives a
    short key of letters and digits, the same in every process.
    """
    data = b"\x00".join(
        part.encode("utf-8", "surrogatepass") for part in ("awaken-tool-call", scope, tool_call_id)
    )
    return "awaken-" + hashlib.sha256(data).hexdigest()[:40]


def _args_digest(args: Mapping[str, Any]) -> str:
    encoded = json.dumps(args, sort_keys=True, ensure_ascii=False, default=repr)
    return hashlib.sha256(encoded.encode("utf-8", "surrogatepass")).hexdigest()


# -- results as JSON ---------------------------------------------------------------------


class _NotKept(Exception):
    """A result the ledger cannot keep as JSON."""


def _json_value(value: Any) -> Any:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise _NotKept(f"{type(value).__name__} is not JSON ({exc})") from exc
    return value


def _message_json(message: BaseMessage) -> dict[str, Any]:
    return cast(dict[str, Any], _json_value(message_to_dict(message)))


def encode_result(result: object) -> dict[str, Any]:
    """A tool's result as JSON, exactly enough to give it back.

    Raises:
        _NotKept: If the result holds something that is not JSON (an artifact
            object, a ``Send``), or is neither a ``ToolMessage`` nor a ``Command``.
    """
    if isinstance(result, ToolMessage):
        return {"message": _message_json(result)}
    if _is_command(result):
        update: Any = result.update
        if isinstance(update, Mapping):
            update = {
                name: (
                    {"messages": [_message_json(m) for m in value]}
                    if isinstance(value, list)
                    and value
                    and all(isinstance(m, BaseMessage) for m in value)
                    else {"value": _json_value(value)}
                )
                for name, value in update.items()
            }
        elif update is not None:
            raise _NotKept(f"a Command whose update is a {type(update).__name__}")
        goto = result.goto
        if not (
            isinstance(goto, str)
            or (isinstance(goto, list | tuple) and all(isinstance(g, str) for g in goto))
        ):
            raise _NotKept("a Command that goes to a Send")
        return {
            "command": {
                "graph": result.graph,
                "update": update,
                "resume": _json_value(result.resume),
                "goto": goto if isinstance(goto, str) else list(goto),
            }
        }
    raise _NotKept(f"a {type(result).__name__} (a tool call returns a ToolMessage or a Command)")


def _is_command(value: object) -> TypeGuard[Command[Any]]:
    """Whether ``value`` is a LangGraph ``Command`` (without importing LangGraph)."""
    types = sys.modules.get("langgraph.types")
    return types is not None and isinstance(value, types.Command)


def decode_result(data: Mapping[str, Any]) -> ToolMessage | Command[Any]:
    """Give back a result kept by :func:`encode_result`."""
    from langgraph.types import Command

    if "message" in data:
        return cast(ToolMessage, messages_from_dict([data["message"]])[0])
    command = data["command"]
    update = command["update"]
    if isinstance(update, Mapping):
        update = {
            name: messages_from_dict(value["messages"]) if "messages" in value else value["value"]
            for name, value in update.items()
        }
    return Command(
        graph=command["graph"], update=update, resume=command["resume"], goto=command["goto"]
    )


# -- events ------------------------------------------------------------------------------


def _emit(report: Report, config: RunnableConfig | None) -> None:
    """Report ``report``: log, graph stream, and a custom event to the call's callbacks."""
    report.log()
    _to_graph(report)
    try:
        manager = get_callback_manager_for_config(ensure_config(config))
        run_id = manager.parent_run_id or uuid.uuid4()  # outside a run: an event of its own
        manager.on_custom_event(report.event.value, report.data, run_id=run_id)
    except Exception:  # a broken handler must not break the call
        logger.exception("callback failed while reporting %s", report.event.value)


async def _aemit(report: Report, config: RunnableConfig | None) -> None:
    """Async twin of `_emit`."""
    report.log()
    _to_graph(report)
    try:
        manager = get_async_callback_manager_for_config(ensure_config(config))
        run_id = manager.parent_run_id or uuid.uuid4()
        await manager.on_custom_event(report.event.value, report.data, run_id=run_id)
    except Exception:  # a broken handler must not break the call
        logger.exception("callback failed while reporting %s", report.event.value)


def _to_graph(report: Report) -> None:
    writer = _graph_writer()
    if writer is not None:
        try:
            writer({"event": report.event.value, "data": report.data})
        except Exception:  # a broken stream consumer must not break the call
            logger.exception("graph stream writer failed while reporting %s", report.event)


# -- the ledger ----------------------------------------------------------------------------


@dataclasses.dataclass
class _Call:
    """One tool call going through the ledger."""

    tool_call: ToolCall
    tool: str
    scope: str
    key: str
    model_args: dict[str, Any]
    digest: str
    run_id: str
    key_params: tuple[str, ...]
    config: RunnableConfig | None = None

    def with_key(self) -> ToolCall:
        """The tool call, its idempotency key in the tool's key parameters."""
        if not self.key_params:
            return self.tool_call
        args = {**self.tool_call["args"], **dict.fromkeys(self.key_params, self.key)}
        return {**self.tool_call, "args": args}


_Decision = Literal["run", "replay", "report", "reconcile", "busy"]


class ToolLedger:
    """Keeps a record of every tool call in a checkpoint store, so that a call runs once.

    Use it with ``create_agent`` through
    `awaken_langchain.middleware.ToolLedgerMiddleware`, or wrap tools for a
    ``ToolNode`` or plain code with `wrap`.

    Args:
        store: Where records are kept (any `StreamCheckpointStore`).
        on_unknown: What to do with a call that started and never finished
            (the process died during the tool): ``"report"`` (default; an
            error ``ToolMessage`` naming the idempotency key, the tool is not
            called), ``"rerun"`` (call it again: at least once, for idempotent
            tools), or a `Reconcile` callable. A mapping gives a policy per tool
            name (tools it does not name get ``"report"``).
        ttl: Seconds a record is kept after its last write (the store's own
            ``ttl``, when shorter, applies too).
        replay_failures: Names of tools whose failed calls are not run again:
            the recorded error is returned instead.
        scope: The scope of calls made outside a thread (no ``thread_id`` in the
            config). Calls are keyed by (thread or scope, ``tool_call_id``).
        deadline: Seconds any store operation may take; past it the call goes
            on as ``on_store_failure`` says.
        on_store_failure: ``"run"`` (default): when the store fails or hangs,
            run the tool without a record and report an
            ``awaken_tool_ledger_warning`` event; ``"refuse"``: raise
            `ToolLedgerError` without running it.
    """

    def __init__(
        self,
        store: StreamCheckpointStore,
        *,
        on_unknown: OnUnknown | Mapping[str, OnUnknown] = "report",
        ttl: float = DEFAULT_TTL,
        replay_failures: Collection[str] = (),
        scope: str = "default",
        deadline: float = DEFAULT_DEADLINE,
        on_store_failure: Literal["run", "refuse"] = "run",
    ) -> None:
        if ttl <= 0:
            raise ValueError(f"ttl must be a positive number of seconds, got {ttl!r}")
        if deadline <= 0:
            raise ValueError(f"deadline must be a positive number of seconds, got {deadline!r}")
        if on_store_failure not in ("run", "refuse"):
            raise ValueError(
                f"on_store_failure must be 'run' or 'refuse', got {on_store_failure!r}"
            )
        policies = on_unknown.values() if isinstance(on_unknown, Mapping) else (on_unknown,)
        for policy in policies:
            if policy not in ("report", "rerun") and not callable(policy):
                raise ValueError(
                    f"on_unknown must be 'report', 'rerun' or a reconcile callable, got {policy!r}"
                )
        self.store = store
        self.on_unknown = on_unknown
        self.ttl = float(ttl)
        self.replay_failures = frozenset(replay_failures)
        self.scope = scope
        self.deadline = deadline
        self.on_store_failure = on_store_failure
        self._key_params: dict[int, tuple[BaseTool, tuple[str, ...]]] = {}
        self._lock = threading.Lock()

    # -- public helpers ----------------------------------------------------------------

    def policy(self, tool: str) -> OnUnknown:
        """The ``on_unknown`` policy of the tool named ``tool``."""
        if isinstance(self.on_unknown, Mapping):
            return self.on_unknown.get(tool, "report")
        return self.on_unknown

    def key_for(self, tool_call_id: str, config: RunnableConfig | None = None) -> str:
        """The idempotency key a call with ``tool_call_id`` gets under ``config``."""
        return idempotency_key(self._scope(config), tool_call_id)

    def record(
        self, tool_call_id: str, config: RunnableConfig | None = None
    ) -> LedgerRecord | None:
        """The record of a call, or ``None`` (for operators and tests)."""
        checkpoint = self.store.get(LEDGER_PREFIX + self.key_for(tool_call_id, config))
        return None if checkpoint is None else read_record(checkpoint)

    def wrap(self, tool: BaseTool) -> BaseTool:
        """A tool that behaves like ``tool`` and runs each tool call through this ledger.

        The wrapped tool has the same name, description, schema,
        ``return_direct`` and ``response_format``. Invoked with a ``ToolCall``
        (``ToolNode``, ``tool.invoke(tool_call)``) it goes through the ledger;
        invoked with plain arguments (no call id) it simply runs ``tool``.

        Raises:
            ToolLedgerError: If ``tool`` streams (see `refuse_streaming`).
        """
        if isinstance(tool, LedgerTool):
            raise ValueError(f"tool {tool.name!r} is already wrapped by a ToolLedger")
        refuse_streaming(tool)
        return LedgerTool(
            **_call_fields(tool),
            tags=tool.tags,
            metadata=tool.metadata,
            extras=tool.extras,
            inner=tool,
            ledger=self,
        )

    # -- one call: sync ----------------------------------------------------------------

    def run_call(
        self,
        tool_call: ToolCall,
        tool: BaseTool | None,
        execute: Callable[[ToolCall], ToolResult],
        config: RunnableConfig | None = None,
    ) -> ToolResult:
        """Run one tool call through the ledger (what the two forms share).

        Args:
            tool_call: The model's call (its ``args`` without injected values).
            tool: The tool, to find its idempotency key parameters.
            execute: Runs the call (given with the key filled in) and returns
                what the framework receives.
            config: The call's config (its ``thread_id`` is the call's scope).
        """
        call = self._prepare(tool_call, tool, config)
        if call is None:
            return execute(tool_call)
        try:
            epoch, existing = self._wait(lambda: self._begin(call), call.run_id)
        except UnreadableRecordError as exc:
            return self._emitted(call, self._unreadable(call, exc))
        except StreamCheckpointError as exc:
            return self._without_ledger(call, exc, execute)
        decision = self._decide(call, existing)
        if decision == "replay":
            assert existing is not None
            return self._emitted(call, self._replay(call, existing))
        if decision == "report":
            assert existing is not None
            return self._emitted(call, self._report(call, existing))
        if decision == "reconcile":
            assert existing is not None
            found = self._reconcile_sync(call)
            if found is not None:
                self._finish(call, epoch, existing.started_at, found)
                return found
        started = self._started(call, epoch)
        try:
            self._wait(lambda: self._put(started), started.run_id)
        except StreamCheckpointFencedError:
            return self._emitted(call, self._busy(call))
        except StreamCheckpointError as exc:
            return self._without_ledger(call, exc, execute)
        result = self._execute(call, started, execute)
        self._finish(call, epoch, started.started_at, result)
        return result

    def _execute(
        self, call: _Call, started: LedgerRecord, execute: Callable[[ToolCall], ToolResult]
    ) -> ToolResult:
        try:
            return execute(call.with_key())
        except Exception as exc:  # GraphInterrupt too: the call is run again on resume
            self._fail(started, exc)
            raise

    def _finish(self, call: _Call, epoch: int, started_at: float, result: ToolResult) -> None:
        record = self._ended(call, epoch, started_at, result)
        try:
            self._wait(lambda: self._put(record), record.run_id)
        except StreamCheckpointError as exc:
            _emit(self._warning(call, f"the call's result was not recorded: {exc}"), call.config)

    def _fail(self, started: LedgerRecord, exc: BaseException) -> None:
        record = self._failed(started, exc)
        try:
            self._wait(lambda: self._put(record), record.run_id)
        except StreamCheckpointError as failure:
            logger.warning("the failure of tool call %s was not recorded: %s", started.key, failure)

    def _reconcile_sync(self, call: _Call) -> ToolResult | None:
        reconcile = cast(Reconcile, self.policy(call.tool))
        found = reconcile(call.tool_call, call.key)
        if inspect.isawaitable(found):
            if asyncio.iscoroutine(found):
                found.close()
            raise TypeError(
                f"the reconcile callable of tool {call.tool!r} is async; call the tool "
                "through ainvoke (an async agent) or give a sync reconcile callable"
            )
        return self._reconciled(call, found)

    def _without_ledger(
        self,
        call: _Call,
        exc: StreamCheckpointError,
        execute: Callable[[ToolCall], ToolResult],
    ) -> ToolResult:
        if self.on_store_failure == "refuse":
            raise ToolLedgerError(
                f"tool {call.tool!r} was not run: the ledger's store failed ({exc}); "
                "ToolLedger(on_store_failure='run') runs tools without a record instead"
            ) from exc
        _emit(
            self._warning(
                call, f"the ledger's store failed; running the tool without a record: {exc}"
            ),
            call.config,
        )
        return execute(call.with_key())

    # -- one call: async ----------------------------------------------------------------

    async def arun_call(
        self,
        tool_call: ToolCall,
        tool: BaseTool | None,
        execute: Callable[[ToolCall], Awaitable[ToolResult]],
        config: RunnableConfig | None = None,
    ) -> ToolResult:
        """Async twin of `run_call`."""
        call = self._prepare(tool_call, tool, config)
        if call is None:
            return await execute(tool_call)
        try:
            epoch, existing = await self._await(lambda: self._begin(call), call.run_id)
        except UnreadableRecordError as exc:
            return await self._aemitted(call, self._unreadable(call, exc))
        except StreamCheckpointError as exc:
            return await self._awithout_ledger(call, exc, execute)
        decision = self._decide(call, existing)
        if decision == "replay":
            assert existing is not None
            return await self._aemitted(call, self._replay(call, existing))
        if decision == "report":
            assert existing is not None
            return await self._aemitted(call, self._report(call, existing))
        if decision == "reconcile":
            assert existing is not None
            reconcile = cast(Reconcile, self.policy(call.tool))
            found = reconcile(call.tool_call, call.key)
            if inspect.isawaitable(found):
                found = await found
            kept = self._reconciled(call, found)
            if kept is not None:
                await self._afinish(call, epoch, existing.started_at, kept)
                return kept
        started = self._started(call, epoch)
        try:
            await self._await(lambda: self._put(started), started.run_id)
        except StreamCheckpointFencedError:
            return await self._aemitted(call, self._busy(call))
        except StreamCheckpointError as exc:
            return await self._awithout_ledger(call, exc, execute)
        try:
            result = await execute(call.with_key())
        except Exception as exc:
            record = self._failed(started, exc)
            try:
                await self._await(lambda: self._put(record), record.run_id)
            except StreamCheckpointError as failure:
                logger.warning(
                    "the failure of tool call %s was not recorded: %s", call.key, failure
                )
            raise
        await self._afinish(call, epoch, started.started_at, result)
        return result

    async def _afinish(
        self, call: _Call, epoch: int, started_at: float, result: ToolResult
    ) -> None:
        record = self._ended(call, epoch, started_at, result)
        try:
            await self._await(lambda: self._put(record), record.run_id)
        except StreamCheckpointError as exc:
            await _aemit(
                self._warning(call, f"the call's result was not recorded: {exc}"), call.config
            )

    async def _awithout_ledger(
        self,
        call: _Call,
        exc: StreamCheckpointError,
        execute: Callable[[ToolCall], Awaitable[ToolResult]],
    ) -> ToolResult:
        if self.on_store_failure == "refuse":
            raise ToolLedgerError(
                f"tool {call.tool!r} was not run: the ledger's store failed ({exc}); "
                "ToolLedger(on_store_failure='run') runs tools without a record instead"
            ) from exc
        await _aemit(
            self._warning(
                call, f"the ledger's store failed; running the tool without a record: {exc}"
            ),
            call.config,
        )
        return await execute(call.with_key())

    # -- pure parts ----------------------------------------------------------------------

    def _scope(self, config: RunnableConfig | None) -> str:
        configurable = (config or {}).get("configurable") or {}
        thread = configurable.get("thread_id")
        return str(thread) if thread is not None else self.scope

    def _prepare(
        self, tool_call: ToolCall, tool: BaseTool | None, config: RunnableConfig | None
    ) -> _Call | None:
        """The call as the ledger sees it, or ``None`` for a call it cannot key (no id)."""
        call_id = tool_call.get("id")
        if not call_id:
            return None
        scope = self._scope(config)
        key = idempotency_key(scope, call_id)
        key_params = self._key_params_of(tool) if tool is not None else ()
        visible = _model_fields(tool)
        args = tool_call.get("args") or {}
        model_args = {
            name: value
            for name, value in args.items()
            if name not in key_params and (visible is None or name in visible)
        }
        run_id = LEDGER_PREFIX + key
        return _Call(
            tool_call,
            tool_call["name"],
            scope,
            key,
            model_args,
            _args_digest(model_args),
            run_id,
            key_params,
            config,
        )

    def _key_params_of(self, tool: BaseTool) -> tuple[str, ...]:
        with self._lock:
            known = self._key_params.get(id(tool))
            if known is not None and known[0] is tool:
                return known[1]
        inner = tool.inner if isinstance(tool, LedgerTool) else tool
        try:
            annotations = get_all_basemodel_annotations(inner.get_input_schema())
        except Exception:  # a schema given as a dict declares no annotations
            annotations = {}
        params = tuple(
            name
            for name, annotation in annotations.items()
            if _is_injected_arg_type(annotation, injected_type=InjectedIdempotencyKey)
        )
        with self._lock:
            if len(self._key_params) >= _KEY_PARAMS_LIMIT:  # tools built per call
                self._key_params.clear()
            self._key_params[id(tool)] = (tool, params)
        return params

    def _decide(self, call: _Call, existing: LedgerRecord | None) -> _Decision:
        if existing is None:
            return "run"
        if existing.args_sha256 != call.digest or existing.tool != call.tool:
            raise ToolLedgerConflictError(
                f"tool call {call.tool_call.get('id')!r} (idempotency key {call.key}) was "
                f"recorded for tool {existing.tool!r} with other arguments: a call id names "
                "one call, and a different call under the same id is refused rather than "
                f"run or answered from the record. Recorded arguments: {existing.args!r}; "
                f"now: {call.model_args!r}. Remove the record (awaken-langchain checkpoints "
                f"rm {existing.run_id}) if the id was reused on purpose",
                key=call.key,
            )
        if existing.state == "finished":
            return "replay"
        if existing.state == "failed":
            return "replay" if call.tool in self.replay_failures else "run"
        policy = self.policy(call.tool)
        if policy == "rerun":
            return "run"
        if policy == "report":
            return "report"
        return "reconcile"

    def _started(self, call: _Call, epoch: int) -> LedgerRecord:
        return LedgerRecord(
            key=call.key,
            scope=call.scope,
            tool_call_id=str(call.tool_call.get("id")),
            tool=call.tool,
            args=call.model_args,
            args_sha256=call.digest,
            state="started",
            epoch=epoch,
            started_at=self.store.clock(),
        )

    def _ended(
        self, call: _Call, epoch: int, started_at: float, result: ToolResult
    ) -> LedgerRecord:
        started = dataclasses.replace(self._started(call, epoch), started_at=started_at)
        now = self.store.clock()
        if isinstance(result, ToolMessage) and result.status == "error":
            return dataclasses.replace(
                started, state="failed", ended_at=now, error=_short(str(result.content))
            )
        try:
            kept = encode_result(result)
        except _NotKept as exc:
            return dataclasses.replace(
                started,
                state="finished",
                ended_at=now,
                result_kept=False,
                error=f"its result was not kept: {exc}",
            )
        record = dataclasses.replace(started, state="finished", ended_at=now, result=kept)
        size = self._size(record)
        if size > self.store.max_checkpoint_bytes:
            return dataclasses.replace(
                started,
                state="finished",
                ended_at=now,
                result_kept=False,
                error=(
                    f"its result was not kept: the record would be {size} bytes, more than "
                    f"the store's max_checkpoint_bytes={self.store.max_checkpoint_bytes}"
                ),
            )
        return record

    def _failed(self, started: LedgerRecord, exc: BaseException) -> LedgerRecord:
        return dataclasses.replace(
            started,
            state="failed",
            ended_at=self.store.clock(),
            error=_short(f"{type(exc).__name__}: {exc}"),
        )

    def _reconciled(self, call: _Call, found: object) -> ToolResult | None:
        if found is None:
            return None
        if isinstance(found, str):
            return ToolMessage(
                content=found, tool_call_id=str(call.tool_call.get("id")), name=call.tool
            )
        if isinstance(found, ToolMessage) or _is_command(found):
            return found
        raise TypeError(
            f"the reconcile callable of tool {call.tool!r} returned a {type(found).__name__}; "
            "it returns a ToolMessage, a Command, text, or None when the effect did not happen"
        )

    @staticmethod
    def _size(record: LedgerRecord) -> int:
        return len(record.encode().encode("utf-8", "surrogatepass")) + _HEAD_ALLOWANCE

    def _replay(self, call: _Call, existing: LedgerRecord) -> tuple[Report, ToolResult]:
        """The recorded result, and the event that reports its replay."""
        result = self._recorded(call, existing)
        report = Report(
            RecoveryEvent.TOOL_LEDGER_REPLAY,
            {
                "key": call.key,
                "tool": call.tool,
                "tool_call_id": call.tool_call.get("id"),
                "state": existing.state,
            },
            f"tool call {call.tool_call.get('id')!r} of {call.tool!r} already {existing.state}: "
            "its result was replayed from the ledger, the tool was not called",
        )
        return report, result

    def _recorded(self, call: _Call, existing: LedgerRecord) -> ToolResult:
        call_id = str(call.tool_call.get("id"))
        if existing.state == "failed":
            return ToolMessage(
                content=f"Error: {existing.error}",
                tool_call_id=call_id,
                name=call.tool,
                status="error",
            )
        if not existing.result_kept or existing.result is None:
            return ToolMessage(
                content=(
                    f"This call already finished (idempotency key {call.key}), but "
                    f"{existing.error}; "
                    "it was not run again."
                ),
                tool_call_id=call_id,
                name=call.tool,
                status="error",
            )
        return decode_result(existing.result)

    def _report(self, call: _Call, existing: LedgerRecord) -> tuple[Report, ToolResult]:
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(existing.started_at))
        text = (
            f"The outcome of this call is unknown: a previous attempt of tool {call.tool!r} "
            f"started at {started} and did not finish (the process running it stopped), so it "
            f"was not run again. Idempotency key: {call.key}. Check whether its effect happened "
            "before calling the tool again."
        )
        message = ToolMessage(
            content=text, tool_call_id=str(call.tool_call.get("id")), name=call.tool, status="error"
        )
        return self._warning(call, text), message

    def _unreadable(self, call: _Call, exc: UnreadableRecordError) -> tuple[Report, ToolResult]:
        text = (
            f"The outcome of this call is unknown: its record in the tool ledger cannot be "
            f"read ({exc}), so tool {call.tool!r} was not run again. Idempotency key: "
            f"{call.key}. Check whether its effect happened, then remove the record "
            f"(awaken-langchain checkpoints rm {call.run_id}) to let the call run."
        )
        message = ToolMessage(
            content=text, tool_call_id=str(call.tool_call.get("id")), name=call.tool, status="error"
        )
        return self._warning(call, text), message

    def _busy(self, call: _Call) -> tuple[Report, ToolResult]:
        text = (
            f"Tool {call.tool!r} was not run: another process took over this call while it "
            f"was starting (idempotency key: {call.key}); its outcome is recorded there."
        )
        message = ToolMessage(
            content=text, tool_call_id=str(call.tool_call.get("id")), name=call.tool, status="error"
        )
        return self._warning(call, text), message

    @staticmethod
    def _emitted(call: _Call, reported: tuple[Report, ToolResult]) -> ToolResult:
        _emit(reported[0], call.config)
        return reported[1]

    @staticmethod
    async def _aemitted(call: _Call, reported: tuple[Report, ToolResult]) -> ToolResult:
        await _aemit(reported[0], call.config)
        return reported[1]

    @staticmethod
    def _warning(call: _Call, message: str) -> Report:
        report = warning(RecoveryEvent.TOOL_LEDGER_WARNING, call.key, message)
        report.data.update({"tool": call.tool, "tool_call_id": call.tool_call.get("id")})
        return report

    # -- store operations, bounded by the deadline -----------------------------------------

    def _begin(self, call: _Call) -> tuple[int, LedgerRecord | None]:
        """Read the call's record; claim it and read it again if this attempt may write it.

        A call answered from its record (replayed, reported) claims nothing, so
        a process still running the call is not fenced out of recording its
        result. One that will write claims first and then reads: a claim made
        by anyone after ours fences our writes, and a record written before it
        is seen. Returns epoch 0 when nothing was claimed.
        """
        existing = self._read(call.run_id)
        if existing is not None and self._decide(call, existing) in ("replay", "report"):
            return 0, existing
        epoch = self.store.claim(call.run_id)
        return epoch, self._read(call.run_id)

    def _read(self, run_id: str) -> LedgerRecord | None:
        checkpoint = self.store.get(run_id)
        return None if checkpoint is None else read_record(checkpoint)

    def _put(self, record: LedgerRecord) -> None:
        text = record.encode()
        size = len(text.encode("utf-8", "surrogatepass")) + _HEAD_ALLOWANCE
        if size > self.store.max_checkpoint_bytes:
            raise ToolLedgerError(
                f"tool {record.tool!r} was not run: its ledger record would be {size} bytes "
                f"(arguments of {len(json.dumps(record.args, default=repr))} bytes), more than "
                f"the store's max_checkpoint_bytes={self.store.max_checkpoint_bytes}. Raise "
                "max_checkpoint_bytes when creating the store"
            )
        checkpoint = unchecked_checkpoint(
            run_id=record.run_id,
            thread_id=record.scope,
            model=LEDGER_MODEL,
            partial_text=text,
            epoch=record.epoch,
            keep_for=self.ttl,
            complete=record.state != "started",
        )
        self.store.put(checkpoint)

    def _wait(self, action: Callable[[], Any], run_id: str) -> Any:
        """Run ``action`` on the store's writer (after writes of ``run_id`` only), bounded."""
        writer = writer_for(self.store)
        return writer.wait(writer.call(action, runs=(run_id,)), self.deadline)

    async def _await(self, action: Callable[[], Any], run_id: str) -> Any:
        """Async twin of `_wait`."""
        writer = writer_for(self.store)
        return await writer.await_(writer.call(action, runs=(run_id,)), self.deadline)


_STREAM_METHODS = ("stream", "astream", "transform", "atransform")


def streaming_reason(tool: BaseTool) -> str | None:
    """Why ``tool`` streams, or ``None`` when it does not.

    LangChain tools do not stream their result: ``invoke`` returns it whole and
    ``stream`` yields that one result (``ToolNode`` and ``create_agent`` only
    call ``invoke``). A tool streams when it breaks that: its function is a
    generator (``invoke`` then returns the generator's ``repr`` and its body
    never runs), or its class overrides ``stream``/``astream``/``transform``/
    ``atransform`` to yield several chunks. Progress sent on the side (callbacks,
    LangGraph's stream writer) does not count: the result is still whole.
    """
    kind = type(tool)
    functions = [
        ("function", getattr(tool, "func", None)),
        ("coroutine", getattr(tool, "coroutine", None)),
        ("_run", getattr(kind, "_run", None)),
        ("_arun", getattr(kind, "_arun", None)),
    ]
    for what, function in functions:
        if inspect.isgeneratorfunction(function) or inspect.isasyncgenfunction(function):
            return (
                f"its {what} is a generator: invoke would return the generator object, not "
                "its chunks, and the generator's body (the effect) would never run"
            )
    for name in _STREAM_METHODS:
        if getattr(kind, name) is not getattr(BaseTool, name):
            return (
                f"{kind.__name__} overrides {name}, so its chunks would not be what the "
                "ledger records and replays (one whole result)"
            )
    return None


def refuse_streaming(tool: BaseTool) -> None:
    """Refuse a tool that streams: the ledger records and replays one whole result.

    Raises:
        ToolLedgerError: If ``tool`` streams (see `streaming_reason`).
    """
    reason = streaming_reason(tool)
    if reason is not None:
        raise ToolLedgerError(
            f"tool {tool.name!r} streams and cannot go through a ToolLedger: {reason}. "
            "Return the complete result from the tool (join the chunks) and report "
            "progress through callbacks or LangGraph's stream writer instead"
        )


def _short(text: str) -> str:
    return text if len(text) <= _ERROR_LIMIT else text[:_ERROR_LIMIT] + "..."


def _model_fields(tool: BaseTool | None) -> frozenset[str] | None:
    """The argument names the model sees for ``tool`` (``None``: unknown, keep all)."""
    if tool is None:
        return None
    inner = tool.inner if isinstance(tool, LedgerTool) else tool
    try:
        schema = inner.tool_call_schema
    except Exception:
        return None
    if isinstance(schema, dict):
        properties = schema.get("properties")
        return frozenset(properties) if isinstance(properties, dict) else None
    fields = getattr(schema, "model_fields", None)
    return frozenset(fields) if isinstance(fields, dict) else None


def _is_tool_call(value: object) -> bool:
    return isinstance(value, dict) and value.get("type") == "tool_call" and "args" in value


def _call_fields(tool: BaseTool) -> dict[str, Any]:
    """What a tool standing in for ``tool`` takes from it to be called the same way."""
    return {
        "name": tool.name,
        "description": tool.description,
        "args_schema": tool.args_schema,
        "return_direct": tool.return_direct,
        "response_format": tool.response_format,
        "handle_tool_error": tool.handle_tool_error,
        "handle_validation_error": tool.handle_validation_error,
    }


class LedgerTool(BaseTool):
    """A tool run through a `ToolLedger` (made by `ToolLedger.wrap`)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    inner: BaseTool
    """The wrapped tool."""
    ledger: Any
    """The `ToolLedger` the calls go through."""

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        """Run ``input``; a ``ToolCall`` goes through the ledger."""
        if not _is_tool_call(input):
            return self.inner.invoke(input, config, **kwargs)
        ledger = cast(ToolLedger, self.ledger)
        return ledger.run_call(
            cast(ToolCall, input),
            self,
            lambda call: self.inner.invoke(call, config, **kwargs),
            config,
        )

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        """Async twin of `invoke`."""
        if not _is_tool_call(input):
            return await self.inner.ainvoke(input, config, **kwargs)
        ledger = cast(ToolLedger, self.ledger)

        async def execute(call: ToolCall) -> ToolResult:
            return cast(ToolResult, await self.inner.ainvoke(call, config, **kwargs))

        return await ledger.arun_call(cast(ToolCall, input), self, execute, config)

    def run(self, *args: Any, **kwargs: Any) -> Any:
        """Run the wrapped tool directly (no call id: nothing to record)."""
        return self.inner.run(*args, **kwargs)

    async def arun(self, *args: Any, **kwargs: Any) -> Any:
        """Async twin of `run`."""
        return await self.inner.arun(*args, **kwargs)

    def _run(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover - run is delegated
        raise NotImplementedError("LedgerTool runs its wrapped tool through invoke or run")


class KeyedTool(BaseTool):
    """A tool that receives its idempotency key parameters whatever runs it.

    ``ToolNode`` removes values of injected parameters from a tool call before
    it invokes the tool (a model must not forge them), so the ledger's
    middleware hands the node this tool, which adds the key as the node calls it.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    inner: BaseTool
    """The tool run."""
    injected: dict[str, str]
    """The key parameters and the key."""

    @classmethod
    def of(cls, tool: BaseTool, injected: dict[str, str]) -> KeyedTool:
        """``tool`` receiving ``injected`` in every call."""
        return cls(**_call_fields(tool), inner=tool, injected=injected)

    def _with_key(self, input: Any) -> Any:
        if _is_tool_call(input):
            return {**input, "args": {**input["args"], **self.injected}}
        if isinstance(input, dict):
            return {**input, **self.injected}
        return input

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        """Run the wrapped tool with the key added."""
        return self.inner.invoke(self._with_key(input), config, **kwargs)

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        """Async twin of `invoke`."""
        return await self.inner.ainvoke(self._with_key(input), config, **kwargs)

    def _run(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover - invoke is delegated
        raise NotImplementedError("KeyedTool runs its wrapped tool through invoke")
