"""Structured classification of provider, transport and stream failures.

`classify_error` decides whether a failure is worth retrying from the structure
of the exception only, never from its message text:

1. cancellation (any ``BaseException`` that is not an ``Exception``: task
   cancellation, ``KeyboardInterrupt``, ``GeneratorExit``, ``SystemExit``; and
   ``concurrent.futures.CancelledError``): never retryable;
2. this library's own stream errors (`StreamStalledError`,
   `StreamEndedEarlyError`, `StreamInterruptedError`);
3. a specific provider error ``type`` or ``code`` in the error body
   (``overloaded_error`` even inside an HTTP 200 stream, ``insufficient_quota``,
   ``context_length_exceeded``, ``content_policy_violation``, ...), or in the
   OpenAI Responses stream event an integration raised on (langchain-openai
   raises a bare ``ValueError`` for an ``error`` or ``response.failed`` event;
   the event object, still held by the raising frame, carries the ``code``);
4. langchain-core's `ModelError` classes and their ``is_retryable``;
5. the HTTP status code;
6. the generic provider error ``type`` (``server_error`` in an OpenAI stream,
   ``api_error``, ``rate_limit_error``, ...);
7. transport exception types of the ``httpx``/``httpx2``/``httpcore``/
   ``httpcore2``/``h11`` families (and ``requests``/``urllib3``/``http.client``
   for integrations built on them), matched by module family and class name so
   that none of them is imported, and the SDKs' ``APIConnectionError`` /
   ``APITimeoutError``;
8. a ``json.JSONDecodeError`` raised inside a provider SDK (an SSE event whose
   data is not JSON: a corrupted stream);
9. Python's ``TimeoutError`` and ``ConnectionError``.

A provider's ``x-should-retry: true|false`` response header, which the SDKs
obey, overrides the retryability of a recognised failure. Anything else is
`ErrorKind.UNKNOWN` and not retryable; `RetryPolicy` can widen that with its
``retry_on`` and ``classifier`` hooks (for providers whose SDKs raise other
exception types).

When an exception says nothing useful itself, its explicit cause
(``raise ... from err``) is classified instead; the implicit context is followed
only for exceptions raised by a provider SDK or transport library, so an
unrelated error raised while handling a network failure is not mistaken for one.

Retry hints are read from ``exc.response.headers``: ``retry-after-ms`` first,
then ``retry-after`` in seconds or as an HTTP date. Whether and how long to wait
is decided by `awaken_langchain.retry.RetryPolicy`, which caps the hint.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import email.utils
import enum
import json
import math
import time
from collections.abc import Mapping
from typing import Any

from langchain_core.exceptions import (
    ContextOverflowError,
    ModelAPIError,
    ModelAuthenticationError,
    ModelConnectionError,
    ModelError,
    ModelInvalidRequestError,
    ModelNotFoundError,
    ModelPermissionDeniedError,
    ModelRateLimitError,
    ModelRefusalError,
    ModelTimeoutError,
)

from awaken_langchain.errors import (
    StreamEndedEarlyError,
    StreamInterruptedError,
    StreamStalledError,
)

__all__ = ["ErrorInfo", "ErrorKind", "classify_error", "is_cancellation"]


class ErrorKind(enum.StrEnum):
    """What went wrong, independent of the provider that reported it."""

    RATE_LIMITED = "rate_limited"
    """The provider throttled the request (HTTP 429); retry after a pause."""
    OVERLOADED = "overloaded"
    """The provider is overloaded (HTTP 503/529, ``overloaded_error``); retry later."""
    TIMEOUT = "timeout"
    """A connect, read or idle timeout, or HTTP 408/504."""
    CONNECTION = "connection"
    """The connection failed or was dropped (connect error, reset, peer closed)."""
    SERVER = "server"
    """The provider failed (HTTP 5xx, ``api_error``/``server_error`` events)."""
    STREAM_INTERRUPTED = "stream_interrupted"
    """The stream ended without a terminal signal or carried undecodable data."""
    INVALID_REQUEST = "invalid_request"
    """The provider rejected the request itself (HTTP 400/422 and other 4xx)."""
    AUTHENTICATION = "authentication"
    """The credentials were rejected (HTTP 401)."""
    PERMISSION = "permission"
    """The credentials lack permission (HTTP 403)."""
    NOT_FOUND = "not_found"
    """The model or resource does not exist (HTTP 404)."""
    QUOTA_EXHAUSTED = "quota_exhausted"
    """Billing quota or spend limit reached (``insufficient_quota``, HTTP 402)."""
    CONTEXT_OVERFLOW = "context_overflow"
    """The input exceeds the model's context window or the request size (HTTP 413)."""
    CONTENT_FILTER = "content_filter"
    """The provider's content policy blocked the request or the model refused."""
    CANCELLED = "cancelled"
    """The caller cancelled the work; it must propagate, never be retried."""
    UNKNOWN = "unknown"
    """Nothing in the exception's structure identifies the failure."""


_RETRYABLE_KINDS = frozenset(
    {
        ErrorKind.RATE_LIMITED,
        ErrorKind.OVERLOADED,
        ErrorKind.TIMEOUT,
        ErrorKind.CONNECTION,
        ErrorKind.SERVER,
        ErrorKind.STREAM_INTERRUPTED,
    }
)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ErrorInfo:
    """The structured facts about one failure, and whether a retry may succeed.

    Attributes:
        kind: What went wrong.
        retryable: Whether sending the same request again may succeed.
        status_code: The HTTP status the error arrived with, if any. A provider
            error event inside a stream keeps the stream's status, 200.
        retry_after: The provider's retry hint in seconds (``retry-after-ms`` or
            ``retry-after``), uncapped, or ``None`` when none was supplied.
        provider_type: The provider's error type, e.g. ``"overloaded_error"``.
        provider_code: The provider's error code, e.g. ``"insufficient_quota"``.
        request_id: The provider's request id (``x-request-id``/``request-id``).
    """

    kind: ErrorKind
    retryable: bool
    status_code: int | None = None
    retry_after: float | None = None
    provider_type: str | None = None
    provider_code: str | None = None
    request_id: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """Return the facts as a JSON-serializable dict (for metadata and logs)."""
        return {
            "kind": self.kind.value,
            "retryable": self.retryable,
            "status_code": self.status_code,
            "retry_after": self.retry_after,
            "provider_type": self.provider_type,
            "provider_code": self.provider_code,
            "request_id": self.request_id,
        }


def classify_error(exc: BaseException, *, now: float | None = None) -> ErrorInfo:
    """Classify a failure by its structure.

    Args:
        exc: The exception raised while calling or streaming from a model.
        now: The current wall-clock time (seconds since the epoch) used to turn
            an HTTP-date ``retry-after`` into seconds; defaults to ``time.time()``.

    Returns:
        The kind of failure, whether it is retryable, and the facts found on it.
        An exception with no recognisable structure is `ErrorKind.UNKNOWN` and
        not retryable.
    """
    when = time.time() if now is None else now
    first = _classify_one(exc, when)
    seen = {id(exc)}
    current = _next_in_chain(exc)
    while first.kind is ErrorKind.UNKNOWN and current is not None and id(current) not in seen:
        if len(seen) >= _MAX_CHAIN:
            break
        seen.add(id(current))
        info = _classify_one(current, when)
        if info.kind is not ErrorKind.UNKNOWN:
            return info
        current = _next_in_chain(current)
    return first


def is_cancellation(exc: BaseException) -> bool:
    """Whether ``exc`` cancels the work rather than reporting a failure.

    Any ``BaseException`` that is not an ``Exception`` (``asyncio.CancelledError``,
    ``KeyboardInterrupt``, ``GeneratorExit``, ``SystemExit``, trio's
    ``Cancelled``), and ``concurrent.futures.CancelledError``.
    """
    return not isinstance(exc, Exception) or isinstance(exc, concurrent.futures.CancelledError)


# --- one exception -----------------------------------------------------------

_MAX_CHAIN = 16

_HTTPX_KINDS: Mapping[str, ErrorKind | None] = {
    "TimeoutException": ErrorKind.TIMEOUT,
    "ConnectTimeout": ErrorKind.TIMEOUT,
    "ReadTimeout": ErrorKind.TIMEOUT,
    "WriteTimeout": ErrorKind.TIMEOUT,
    "PoolTimeout": ErrorKind.TIMEOUT,
    "NetworkError": ErrorKind.CONNECTION,
    "ConnectError": ErrorKind.CONNECTION,
    "ReadError": ErrorKind.CONNECTION,
    "WriteError": ErrorKind.CONNECTION,
    "CloseError": ErrorKind.CONNECTION,
    "RemoteProtocolError": ErrorKind.CONNECTION,
    "DecodingError": ErrorKind.STREAM_INTERRUPTED,
}

_SDK_KINDS: Mapping[str, ErrorKind | None] = {
    "APITimeoutError": ErrorKind.TIMEOUT,
    "APIConnectionError": ErrorKind.CONNECTION,
    "ContentFilterFinishReasonError": ErrorKind.CONTENT_FILTER,
}

_CLASS_KINDS: Mapping[str, Mapping[str, ErrorKind | None]] = {
    "httpx": _HTTPX_KINDS,
    "httpx2": _HTTPX_KINDS,
    "httpcore": _HTTPX_KINDS,
    "httpcore2": _HTTPX_KINDS,
    "h11": {"RemoteProtocolError": ErrorKind.CONNECTION},
    "requests": {
        "SSLError": None,  # a certificate problem does not go away on retry
        "ConnectTimeout": ErrorKind.TIMEOUT,
        "ReadTimeout": ErrorKind.TIMEOUT,
        "Timeout": ErrorKind.TIMEOUT,
        "ConnectionError": ErrorKind.CONNECTION,
        "ChunkedEncodingError": ErrorKind.CONNECTION,  # body cut off mid-stream
        "ContentDecodingError": ErrorKind.STREAM_INTERRUPTED,
    },
    "urllib3": {
        "SSLError": None,
        "NewConnectionError": ErrorKind.CONNECTION,
        "ProtocolError": ErrorKind.CONNECTION,
        "ReadTimeoutError": ErrorKind.TIMEOUT,
        "ConnectTimeoutError": ErrorKind.TIMEOUT,
    },
    "http": {"IncompleteRead": ErrorKind.CONNECTION},
    "openai": _SDK_KINDS,
    "anthropic": _SDK_KINDS,
}
"""Exception classes matched by top-level module and class name, so none is imported.

The class hierarchy is walked; the first listed class decides. ``None`` marks a
class that is known not to be transient although a parent class would be.
"""

_PROVIDER_FAMILIES = frozenset(
    {"openai", "anthropic", "langchain_openai", "langchain_anthropic", "langchain_core"}
)
"""Provider SDKs and integrations (a JSON error raised inside them is a corrupted stream)."""

_WRAPPING_FAMILIES = _PROVIDER_FAMILIES | frozenset(_CLASS_KINDS)
"""Modules whose exceptions' implicit context is followed (they wrap transport errors)."""

_SPECIFIC_CODES: Mapping[str, ErrorKind] = {
    "context_length_exceeded": ErrorKind.CONTEXT_OVERFLOW,
    "content_filter": ErrorKind.CONTENT_FILTER,
    "content_policy_violation": ErrorKind.CONTENT_FILTER,
    "insufficient_quota": ErrorKind.QUOTA_EXHAUSTED,
    "billing_hard_limit_reached": ErrorKind.QUOTA_EXHAUSTED,
    "contract_spend_limit_reached": ErrorKind.QUOTA_EXHAUSTED,
    "enforced_spend_limit_reached": ErrorKind.QUOTA_EXHAUSTED,
    "linked_organization_spend_limit_reached": ErrorKind.QUOTA_EXHAUSTED,
    "invalid_prompt": ErrorKind.CONTENT_FILTER,  # Responses: flagged by the usage policy
    "bio_policy": ErrorKind.CONTENT_FILTER,
    "misalignment_policy_violation": ErrorKind.CONTENT_FILTER,
    "vector_store_timeout": ErrorKind.TIMEOUT,
}
"""Provider error codes that identify a failure more precisely than its status."""

_SPECIFIC_TYPES: Mapping[str, ErrorKind] = {
    "overloaded_error": ErrorKind.OVERLOADED,
    "insufficient_quota": ErrorKind.QUOTA_EXHAUSTED,
    "billing_error": ErrorKind.QUOTA_EXHAUSTED,
    "request_too_large": ErrorKind.CONTEXT_OVERFLOW,
}
"""Provider error types that identify a failure more precisely than its status."""

_GENERIC_TYPES: Mapping[str, ErrorKind] = {
    "rate_limit_error": ErrorKind.RATE_LIMITED,
    "rate_limit_exceeded": ErrorKind.RATE_LIMITED,
    "api_error": ErrorKind.SERVER,
    "server_error": ErrorKind.SERVER,
    "internal_server_error": ErrorKind.SERVER,
    "timeout_error": ErrorKind.TIMEOUT,
    "invalid_request_error": ErrorKind.INVALID_REQUEST,
    "authentication_error": ErrorKind.AUTHENTICATION,
    "permission_error": ErrorKind.PERMISSION,
    "not_found_error": ErrorKind.NOT_FOUND,
}
"""Provider error types (Anthropic ``error.type``, OpenAI ``error.type``/``code``)."""

_MODEL_ERROR_KINDS: tuple[tuple[type[ModelError], ErrorKind], ...] = (
    (ContextOverflowError, ErrorKind.CONTEXT_OVERFLOW),
    (ModelRefusalError, ErrorKind.CONTENT_FILTER),
    (ModelAuthenticationError, ErrorKind.AUTHENTICATION),
    (ModelPermissionDeniedError, ErrorKind.PERMISSION),
    (ModelNotFoundError, ErrorKind.NOT_FOUND),
    (ModelInvalidRequestError, ErrorKind.INVALID_REQUEST),
    (ModelRateLimitError, ErrorKind.RATE_LIMITED),
    (ModelTimeoutError, ErrorKind.TIMEOUT),
    (ModelConnectionError, ErrorKind.CONNECTION),
)
"""langchain-core error classes whose kind is fixed; `ModelAPIError` is read by status."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Facts:
    status_code: int | None
    provider_type: str | None
    provider_code: str | None
    retry_after: float | None
    request_id: str | None
    should_retry: bool | None


def _classify_one(exc: BaseException, now: float) -> ErrorInfo:
    if is_cancellation(exc) or not isinstance(exc, Exception):
        return ErrorInfo(kind=ErrorKind.CANCELLED, retryable=False)
    if isinstance(exc, StreamStalledError):
        return ErrorInfo(kind=ErrorKind.TIMEOUT, retryable=True)
    if isinstance(exc, StreamEndedEarlyError):
        return ErrorInfo(kind=ErrorKind.STREAM_INTERRUPTED, retryable=True)
    if isinstance(exc, StreamInterruptedError):
        # Recovery already ran out of budget below us; retrying again multiplies it.
        return ErrorInfo(kind=ErrorKind.STREAM_INTERRUPTED, retryable=False)

    facts = _facts(exc, now)
    kind, retryable = _kind_of(exc, facts)
    if facts.should_retry is not None and kind is not ErrorKind.UNKNOWN:
        retryable = facts.should_retry  # the provider said so explicitly (x-should-retry)
    return ErrorInfo(
        kind=kind,
        retryable=retryable,
        status_code=facts.status_code,
        retry_after=facts.retry_after,
        provider_type=facts.provider_type,
        provider_code=facts.provider_code,
        request_id=facts.request_id,
    )


def _kind_of(exc: Exception, facts: _Facts) -> tuple[ErrorKind, bool]:
    status = facts.status_code if facts.status_code != 200 else None

    specific = _SPECIFIC_CODES.get(facts.provider_code or "") or _SPECIFIC_TYPES.get(
        facts.provider_type or ""
    )
    if specific is not None:
        return specific, specific in _RETRYABLE_KINDS

    if isinstance(exc, ModelError):
        for error_class, kind in _MODEL_ERROR_KINDS:
            if isinstance(exc, error_class):
                return kind, bool(exc.is_retryable)

    if status is not None:
        by_status = _kind_for_status(status)
        if by_status is not None:
            return by_status, by_status in _RETRYABLE_KINDS

    generic = _GENERIC_TYPES.get(facts.provider_type or "") or _GENERIC_TYPES.get(
        facts.provider_code or ""
    )
    if generic is not None:
        return generic, generic in _RETRYABLE_KINDS

    if isinstance(exc, ModelAPIError):
        return ErrorKind.SERVER, bool(exc.is_retryable)
    if isinstance(exc, ModelError):
        return ErrorKind.UNKNOWN, bool(exc.is_retryable)

    by_name = _kind_by_class_name(exc)
    if by_name is not None:
        return by_name, by_name in _RETRYABLE_KINDS
    if isinstance(exc, json.JSONDecodeError) and _raised_inside_provider_sdk(exc):
        # The provider sent an event whose data is not JSON: a corrupted stream.
        return ErrorKind.STREAM_INTERRUPTED, True
    if isinstance(exc, TimeoutError):
        return ErrorKind.TIMEOUT, True
    if isinstance(exc, ConnectionError):
        return ErrorKind.CONNECTION, True
    return ErrorKind.UNKNOWN, False


_STATUS_KINDS: Mapping[int, ErrorKind] = {
    401: ErrorKind.AUTHENTICATION,
    402: ErrorKind.QUOTA_EXHAUSTED,
    403: ErrorKind.PERMISSION,
    404: ErrorKind.NOT_FOUND,
    408: ErrorKind.TIMEOUT,
    409: ErrorKind.SERVER,  # lock/conflict: the SDKs retry it
    413: ErrorKind.CONTEXT_OVERFLOW,
    429: ErrorKind.RATE_LIMITED,
    503: ErrorKind.OVERLOADED,
    504: ErrorKind.TIMEOUT,
    529: ErrorKind.OVERLOADED,
}
"""HTTP statuses with their own kind; other 4xx are invalid requests, other 5xx server errors."""


def _kind_for_status(status: int) -> ErrorKind | None:
    """Map an HTTP error status to a kind (``None`` for non-error statuses)."""
    if status < 400 or status > 599:
        return None
    special = _STATUS_KINDS.get(status)
    if special is not None:
        return special
    return ErrorKind.INVALID_REQUEST if status < 500 else ErrorKind.SERVER


def _kind_by_class_name(exc: BaseException) -> ErrorKind | None:
    """Match transport and SDK exception classes by module family and name."""
    for cls in type(exc).__mro__:
        names = _CLASS_KINDS.get(cls.__module__.partition(".")[0])
        if names is not None and cls.__name__ in names:
            return names[cls.__name__]
    return None


def _raised_inside_provider_sdk(exc: BaseException) -> bool:
    """Whether the exception's traceback passes through a provider SDK module."""
    tb = exc.__traceback__
    while tb is not None:
        module = tb.tb_frame.f_globals.get("__name__")
        if isinstance(module, str) and module.partition(".")[0] in _PROVIDER_FAMILIES:
            return True
        tb = tb.tb_next
    return False


_FAILED_EVENT_TYPES = frozenset({"error", "response.failed"})
"""OpenAI Responses stream events that end a response with an error."""


def _stream_event_error(exc: BaseException) -> Mapping[str, Any] | None:
    """The error of the Responses stream event a provider integration raised on, if any.

    langchain-openai raises ``ValueError`` for an ``error`` or ``response.failed``
    event without keeping the event; the innermost provider frame of the
    traceback still holds it. Returns ``{"code": ...}`` read from the event.
    """
    frame = None
    tb = exc.__traceback__
    while tb is not None:
        module = tb.tb_frame.f_globals.get("__name__")
        if isinstance(module, str) and module.partition(".")[0] in _PROVIDER_FAMILIES:
            frame = tb.tb_frame
        tb = tb.tb_next
    if frame is None:
        return None
    for value in frame.f_locals.values():
        if type(value).__module__.partition(".")[0] != "openai":
            continue
        event_type = getattr(value, "type", None)
        if event_type not in _FAILED_EVENT_TYPES:
            continue
        source = value if event_type == "error" else getattr(value.response, "error", None)
        code = getattr(source, "code", None)
        return {"code": code} if isinstance(code, str) and code else None
    return None


def _next_in_chain(exc: BaseException) -> BaseException | None:
    if exc.__cause__ is not None:
        return exc.__cause__
    if exc.__suppress_context__ or exc.__context__ is None:
        return None
    if type(exc).__module__.partition(".")[0] in _WRAPPING_FAMILIES:
        return exc.__context__
    return None


# --- facts -------------------------------------------------------------------


def _facts(exc: BaseException, now: float) -> _Facts:
    headers = _headers(exc)
    error = _error_object(getattr(exc, "body", None))
    if error is None and _status_code(exc) is None:
        error = _stream_event_error(exc)
    provider_type = _str_attr(exc, "type") or _str_item(error, "type")
    provider_code = (
        _str_attr(exc, "code")
        or _str_attr(exc, "error_code")
        or _str_item(error, "code")
        or _str_item(_mapping_item(error, "details"), "error_code")
    )
    request_id = _str_attr(exc, "request_id")
    if request_id is None and headers is not None:
        request_id = _header(headers, "x-request-id") or _header(headers, "request-id")
    should_retry = None
    if headers is not None:
        should_retry = {"true": True, "false": False}.get(_header(headers, "x-should-retry") or "")
    return _Facts(
        status_code=_status_code(exc),
        provider_type=provider_type,
        provider_code=provider_code,
        retry_after=_retry_after(headers, now) if headers is not None else None,
        request_id=request_id,
        should_retry=should_retry,
    )


def _status_code(exc: BaseException) -> int | None:
    for owner, name in ((exc, "status_code"), (exc, "status"), (_response(exc), "status_code")):
        value = getattr(owner, name, None) if owner is not None else None
        if isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599:
            return value
    return None


def _response(exc: BaseException) -> Any:
    try:
        return getattr(exc, "response", None)
    except Exception:  # httpx raises RuntimeError when an error has no response
        return None


def _headers(exc: BaseException) -> Any:
    headers = getattr(_response(exc), "headers", None)
    return headers if callable(getattr(headers, "get", None)) else None


def _header(headers: Any, name: str) -> str | None:
    value = headers.get(name)
    return value.strip() if isinstance(value, str) else None


def _retry_after(headers: Any, now: float) -> float | None:
    """Read ``retry-after-ms``, then ``retry-after`` (seconds or an HTTP date)."""
    millis = _non_negative(_header(headers, "retry-after-ms"))
    if millis is not None:
        return millis / 1000.0
    value = _header(headers, "retry-after")
    if not value:
        return None
    seconds = _non_negative(value)
    if seconds is not None:
        return seconds
    try:
        date = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if date.tzinfo is None:  # RFC 9110 dates are GMT; a date without a zone is not one
        return None
    return max(0.0, date.timestamp() - now)


def _non_negative(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) and number >= 0 else None


def _error_object(body: object) -> Mapping[str, Any] | None:
    """The error object of a provider body: ``body["error"]`` or the body itself."""
    if not isinstance(body, Mapping):
        return None
    inner = body.get("error")
    return inner if isinstance(inner, Mapping) else body


def _mapping_item(mapping: Mapping[str, Any] | None, key: str) -> Mapping[str, Any] | None:
    value = mapping.get(key) if mapping is not None else None
    return value if isinstance(value, Mapping) else None


def _str_item(mapping: Mapping[str, Any] | None, key: str) -> str | None:
    value = mapping.get(key) if mapping is not None else None
    return value if isinstance(value, str) and value else None


def _str_attr(exc: BaseException, name: str) -> str | None:
    value = getattr(exc, name, None)
    return value if isinstance(value, str) and value else None
