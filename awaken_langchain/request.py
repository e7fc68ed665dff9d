"""What identifies a model request: its fingerprint, its kind, its checkpoint key (pure).

A checkpoint belongs to one request. Its key says where it is stored; its
fingerprint says which request made it, so that a checkpoint is resumed or
replayed only for that request. Inside a LangGraph task, every model call gets
its own key, derived from the task, the request's fingerprint and how many
identical requests the task made before; a re-run of the node after a crash
makes the same calls in the same order, so each call finds its own checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import threading
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

__all__ = [
    "CallCounter",
    "call_key",
    "model_settings",
    "one_document_request",
    "request_fingerprint",
]

_OUTPUT_SHAPING_FIELDS = (
    "model_name",
    "model",
    "temperature",
    "top_p",
    "top_k",
    "max_tokens",
    "max_completion_tokens",
    "max_tokens_to_sample",
    "n",
    "seed",
    "stop",
    "stop_sequences",
    "presence_penalty",
    "frequency_penalty",
    "reasoning_effort",
    "reasoning",
    "thinking",
    "response_format",
    "model_kwargs",
    "extra_body",
    "use_responses_api",
    "output_version",
)
"""Inner model settings that change what the model writes (read when present)."""


def model_settings(model: object) -> dict[str, Any]:
    """The inner model's settings that shape its output (those it has)."""
    names = _settings_on(type(model))
    extra = getattr(model, "__pydantic_extra__", None)
    if extra:  # set on the model, not declared by its class
        names = (*names, *(n for n in _OUTPUT_SHAPING_FIELDS if n in extra and n not in names))
    return {name: value for name in names if (value := getattr(model, name, None)) is not None}


_SETTINGS_ON: weakref.WeakKeyDictionary[type, tuple[str, ...]] = weakref.WeakKeyDictionary()


def _settings_on(cls: type) -> tuple[str, ...]:
    """Which settings a class of model can have.

    A pydantic model answers a name it lacks by raising inside ``__getattr__``,
    which costs more than the rest of a turn's set-up: only the names it
    declares as fields or class attributes are read.
    """
    names = _SETTINGS_ON.get(cls)
    if names is None:
        fields = getattr(cls, "model_fields", None)
        names = (
            tuple(n for n in _OUTPUT_SHAPING_FIELDS if n in fields or hasattr(cls, n))
            if isinstance(fields, Mapping)
            else _OUTPUT_SHAPING_FIELDS
        )
        _SETTINGS_ON[cls] = names
    return names


def _plain(value: Any, depth: int = 0) -> Any:
    """A JSON-able, process-independent rendering of ``value`` for hashing."""
    if depth > 32:
        return "..."
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v, depth + 1) for k, v in sorted(value.items(), key=str)}
    if isinstance(value, list | tuple):
        return [_plain(v, depth + 1) for v in value]
    if isinstance(value, set | frozenset):
        return sorted(repr(_plain(v, depth + 1)) for v in value)
    schema = getattr(value, "model_json_schema", None)
    if isinstance(value, type) and callable(schema):
        return {"schema": _plain(schema(), depth + 1)}
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        try:
            return _plain(dump(), depth + 1)
        except Exception:
            return type(value).__qualname__
    if isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"
    return type(value).__qualname__


def _message_fields(message: BaseMessage) -> dict[str, Any]:
    """The parts of a message that shape the answer (never ids or metadata)."""
    fields: dict[str, Any] = {"type": message.type, "content": message.content}
    if message.name:
        fields["name"] = message.name
    if isinstance(message, AIMessage):
        fields["tool_calls"] = [
            {"name": c["name"], "args": c["args"], "id": c.get("id")} for c in message.tool_calls
        ]
        fields["invalid_tool_calls"] = [
            {"name": c.get("name"), "args": c.get("args"), "id": c.get("id")}
            for c in message.invalid_tool_calls
        ]
    if isinstance(message, ToolMessage):
        fields["tool_call_id"] = message.tool_call_id
    return fields


def request_fingerprint(
    messages: Sequence[BaseMessage],
    *,
    stop: Sequence[str] | None,
    kwargs: Mapping[str, Any],
    model: str,
    settings: Mapping[str, Any],
) -> str:
    """A digest of everything in a request that shapes the answer.

    Args:
        messages: The request's messages (ids and metadata do not count).
        stop: Stop sequences.
        kwargs: Call arguments (bound tools, tool choice, response format...).
        model: The model identifier.
        settings: The inner model's settings; those that shape output count.

    Returns:
        A hex SHA-256 digest, stable across processes.
    """
    shaping = {k: settings[k] for k in _OUTPUT_SHAPING_FIELDS if settings.get(k) is not None}
    document = {
        "messages": [_message_fields(m) for m in messages],
        "stop": list(stop) if stop else None,
        "kwargs": _plain(dict(kwargs)),
        "model": model,
        "settings": _plain(shaping),
    }
    encoded = json.dumps(document, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(encoded.encode("utf-8", "surrogatepass")).hexdigest()


def _forces_tool(choice: Any) -> bool:
    if choice is None or choice is False:
        return False
    if isinstance(choice, str):
        return choice not in ("auto", "none")
    if isinstance(choice, Mapping):
        return choice.get("type") not in ("auto", "none", None) or "function" in choice
    return bool(choice)


def _asks_json(value: Any) -> bool:
    if value is None:
        return False
    if isinstance(value, Mapping):
        kind = value.get("type")
        if kind in ("json_schema", "json_object"):
            return True
        fmt = value.get("format")
        return isinstance(fmt, Mapping) and fmt.get("type") in ("json_schema", "json_object")
    return True  # a schema class given as response_format


_FORMAT_KEYS = ("response_format", "text", "output_config", "output_format")
"""Where a request asks for a JSON answer: Chat Completions ``response_format``, Responses
``text.format``, Anthropic ``output_config.format`` (and the older ``output_format``)."""


def one_document_request(kwargs: Mapping[str, Any], settings: Mapping[str, Any]) -> bool:
    """Whether the answer to a request must be one JSON document.

    True for structured output and JSON mode (``response_format``, a Responses
    ``text.format``, an Anthropic ``output_config.format``,
    ``ls_structured_output_format``), a forced tool choice and
    strict tools. Such an answer is never continued as text: two documents
    glued together are not one valid document.
    """
    model_kwargs = settings.get("model_kwargs")
    extra = model_kwargs if isinstance(model_kwargs, Mapping) else {}
    if kwargs.get("ls_structured_output_format") is not None:
        return True
    for source in (kwargs, extra, settings):
        if any(_asks_json(source.get(key)) for key in _FORMAT_KEYS):
            return True
    if _forces_tool(kwargs.get("tool_choice")) or _forces_tool(extra.get("tool_choice")):
        return True
    return bool(kwargs.get("strict"))


class CallCounter:
    """Numbers identical requests within one LangGraph task execution.

    The execution is identified by LangGraph's per-task scratchpad object, which
    every call inside the task shares and a re-run of the task replaces. Counts
    of the most recent ``limit`` executions are kept.

    Args:
        limit: How many task executions are remembered.
    """

    def __init__(self, limit: int = 4096) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        self._tasks: OrderedDict[int, tuple[object, dict[str, int]]] = OrderedDict()

    def next(self, task: object, fingerprint: str) -> int:
        """How many requests with ``fingerprint`` the task made before this one."""
        with self._lock:
            entry = self._tasks.get(id(task))
            if entry is None or entry[0] is not task:
                entry = (task, {})
                self._tasks[id(task)] = entry
            self._tasks.move_to_end(id(task))
            while len(self._tasks) > self._limit:
                self._tasks.popitem(last=False)
            counts = entry[1]
            number = counts.get(fingerprint, 0)
            counts[fingerprint] = number + 1
            return number


def call_key(base: str, fingerprint: str, occurrence: int) -> str:
    """The checkpoint key of one model call in a task: task, request, occurrence."""
    key = f"{base}:{fingerprint[:16]}"
    return key if occurrence == 0 else f"{key}#{occurrence}"
