"""Structured failure classification, with exceptions built the way the SDKs build them."""

from __future__ import annotations

import asyncio
import concurrent.futures
import email.utils
import functools
import http.client
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import anthropic
import h11
import httpcore
import httpcore2
import httpx
import httpx2
import langchain_core.exceptions
import openai
import pytest
import requests
import urllib3
import urllib3.exceptions
from anthropic._error_classes import make_status_error as anthropic_status_error
from langchain_anthropic.chat_models import (
    AnthropicContextOverflowError,
    AnthropicOverloadedError,
    AnthropicRateLimitError,
)
from langchain_core.exceptions import ModelError, ModelRefusalError
from langchain_openai.chat_models.base import (
    OpenAIAuthenticationError,
    OpenAIContextOverflowError,
    OpenAIRateLimitError,
)
from openai._streaming import ServerSentEvent

from awaken_langchain import ErrorInfo, ErrorKind, classify_error
from awaken_langchain.errors import (
    StreamEndedEarlyError,
    StreamInterruptedError,
    StreamStalledError,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
NOW = 1_800_000_000.0


def _request() -> httpx2.Request:
    return httpx2.Request("POST", "https://provider.test/v1/chat")


def _response(status: int, headers: dict[str, str] | None = None) -> httpx2.Response:
    return httpx2.Response(status, headers=headers or {}, request=_request())


@functools.cache
def _openai_client() -> openai.OpenAI:
    return openai.OpenAI(api_key="test", base_url="https://provider.test/v1")


def openai_status_error(
    status: int, body: object = None, headers: dict[str, str] | None = None
) -> openai.APIStatusError:
    """Build the error exactly as the OpenAI client does for a failed response."""
    return _openai_client()._make_status_error(
        f"Error code: {status}", body=body, response=_response(status, headers)
    )


def anthropic_error(
    status: int, body: object = None, headers: dict[str, str] | None = None
) -> anthropic.APIStatusError:
    """Build the error exactly as the Anthropic client does (also for SSE error events)."""
    return anthropic_status_error(
        f"Error code: {status}", body=body, response=_response(status, headers)
    )


def capture(fail: Callable[[], object]) -> BaseException:
    """Run ``fail`` and return what it raised, traceback and chain included."""
    with pytest.raises(BaseException) as caught:
        fail()
    return caught.value


# --- HTTP status -------------------------------------------------------------

STATUS_KINDS = [
    (400, ErrorKind.INVALID_REQUEST, False),
    (401, ErrorKind.AUTHENTICATION, False),
    (402, ErrorKind.QUOTA_EXHAUSTED, False),
    (403, ErrorKind.PERMISSION, False),
    (404, ErrorKind.NOT_FOUND, False),
    (408, ErrorKind.TIMEOUT, True),
    (409, ErrorKind.SERVER, True),
    (413, ErrorKind.CONTEXT_OVERFLOW, False),
    (422, ErrorKind.INVALID_REQUEST, False),
    (429, ErrorKind.RATE_LIMITED, True),
    (500, ErrorKind.SERVER, True),
    (502, ErrorKind.SERVER, True),
    (503, ErrorKind.OVERLOADED, True),
    (504, ErrorKind.TIMEOUT, True),
    (529, ErrorKind.OVERLOADED, True),
]


@pytest.mark.parametrize(("status", "kind", "retryable"), STATUS_KINDS)
@pytest.mark.parametrize(
    "build", [openai_status_error, anthropic_error], ids=["openai", "anthropic"]
)
def test_http_status_decides_kind_and_retryability(
    build: Any, status: int, kind: ErrorKind, retryable: bool
) -> None:
    info = classify_error(build(status))
    assert (info.kind, info.retryable, info.status_code) == (kind, retryable, status)


def test_anthropic_overloaded_error_event_inside_200_stream_is_retryable_overload() -> None:
    body = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    exc = anthropic_error(200, body)
    assert type(exc) is anthropic.APIStatusError
    info = classify_error(exc)
    assert info == ErrorInfo(
        kind=ErrorKind.OVERLOADED,
        retryable=True,
        status_code=200,
        provider_type="overloaded_error",
    )


def test_anthropic_api_error_event_inside_200_stream_is_a_server_error() -> None:
    exc = anthropic_error(200, {"type": "error", "error": {"type": "api_error", "message": "x"}})
    assert classify_error(exc).kind is ErrorKind.SERVER
    assert classify_error(exc).retryable


def test_openai_server_error_event_without_status_is_retryable() -> None:
    exc = openai.APIError(
        "The server had an error", _request(), body={"type": "server_error", "message": "x"}
    )
    info = classify_error(exc)
    assert (info.kind, info.retryable, info.status_code) == (ErrorKind.SERVER, True, None)
    assert info.provider_type == "server_error"


def test_stream_error_event_of_unknown_type_is_not_retried() -> None:
    exc = openai.APIError("weird", _request(), body={"type": "mystery_error", "message": "x"})
    info = classify_error(exc)
    assert (info.kind, info.retryable) == (ErrorKind.UNKNOWN, False)


def test_invalid_request_event_inside_200_stream_is_permanent() -> None:
    body = {"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}
    info = classify_error(anthropic_error(200, body))
    assert (info.kind, info.retryable) == (ErrorKind.INVALID_REQUEST, False)


# --- provider codes ------------------------------------------------------------


def test_openai_insufficient_quota_is_not_retried_although_it_is_a_429() -> None:
    body = {"error": {"type": "insufficient_quota", "code": "insufficient_quota", "message": "x"}}
    raw = openai_status_error(429, body)
    wrapped = OpenAIRateLimitError(message=raw.message, response=raw.response, body=raw.body)
    for exc in (raw, wrapped):
        info = classify_error(exc)
        assert (info.kind, info.retryable) == (ErrorKind.QUOTA_EXHAUSTED, False)


def test_anthropic_spend_limit_429_is_not_retried() -> None:
    body = {
        "type": "error",
        "error": {
            "type": "rate_limit_error",
            "message": "x",
            "details": {"error_code": "enforced_spend_limit_reached"},
        },
    }
    info = classify_error(anthropic_error(429, body))
    assert (info.kind, info.retryable) == (ErrorKind.QUOTA_EXHAUSTED, False)
    assert info.provider_code == "enforced_spend_limit_reached"


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        ("context_length_exceeded", ErrorKind.CONTEXT_OVERFLOW),
        ("content_policy_violation", ErrorKind.CONTENT_FILTER),
        ("content_filter", ErrorKind.CONTENT_FILTER),
    ],
)
def test_openai_400_code_names_the_permanent_failure(code: str, kind: ErrorKind) -> None:
    body = {"error": {"type": "invalid_request_error", "code": code, "message": "x"}}
    info = classify_error(openai_status_error(400, body))
    assert (info.kind, info.retryable, info.provider_code) == (kind, False, code)


def test_anthropic_request_too_large_type_is_context_overflow() -> None:
    body = {"type": "error", "error": {"type": "request_too_large", "message": "x"}}
    assert classify_error(anthropic_error(413, body)).kind is ErrorKind.CONTEXT_OVERFLOW


# --- langchain-core ModelError classes -------------------------------------------


def test_langchain_wrapped_provider_errors_keep_their_kind() -> None:
    raw_529 = anthropic_error(529, {"type": "error", "error": {"type": "overloaded_error"}})
    overloaded = AnthropicOverloadedError(
        message=raw_529.message, response=raw_529.response, body=raw_529.body
    )
    assert classify_error(overloaded).kind is ErrorKind.OVERLOADED

    raw_400 = anthropic_error(400, {"type": "error", "error": {"type": "invalid_request_error"}})
    overflow = AnthropicContextOverflowError(
        message="prompt is too long", response=raw_400.response, body=raw_400.body
    )
    assert (classify_error(overflow).kind, classify_error(overflow).retryable) == (
        ErrorKind.CONTEXT_OVERFLOW,
        False,
    )

    raw_401 = openai_status_error(401, {"error": {"type": "invalid_api_key"}})
    auth = OpenAIAuthenticationError(message="x", response=raw_401.response, body=raw_401.body)
    assert classify_error(auth).kind is ErrorKind.AUTHENTICATION

    context = OpenAIContextOverflowError(message="x", response=raw_400.response, body=None)
    assert classify_error(context).kind is ErrorKind.CONTEXT_OVERFLOW


def test_langchain_rate_limit_error_carries_the_retry_hint() -> None:
    raw = anthropic_error(
        429, {"type": "error", "error": {"type": "rate_limit_error"}}, {"retry-after": "7"}
    )
    wrapped = AnthropicRateLimitError(message="x", response=raw.response, body=raw.body)
    info = classify_error(wrapped)
    assert (info.kind, info.retryable, info.retry_after) == (ErrorKind.RATE_LIMITED, True, 7.0)


def test_model_refusal_is_a_permanent_content_filter() -> None:
    info = classify_error(ModelRefusalError())
    assert (info.kind, info.retryable) == (ErrorKind.CONTENT_FILTER, False)


def test_unknown_model_error_subclass_follows_is_retryable() -> None:
    class Flaky(ModelError):
        is_retryable = True

    class Broken(ModelError):
        pass

    assert classify_error(Flaky()).retryable
    assert classify_error(Flaky()).kind is ErrorKind.UNKNOWN
    assert not classify_error(Broken()).retryable


# --- retry hints -----------------------------------------------------------------


def _hint(headers: dict[str, str]) -> float | None:
    return classify_error(openai_status_error(429, None, headers), now=NOW).retry_after


def test_retry_after_seconds_is_read_from_the_response_headers() -> None:
    assert _hint({"retry-after": "3"}) == 3.0
    assert _hint({"Retry-After": "1.5"}) == 1.5


def test_retry_after_ms_is_preferred_over_retry_after() -> None:
    assert _hint({"retry-after-ms": "250", "retry-after": "30"}) == 0.25


def test_retry_after_http_date_is_measured_against_the_given_clock() -> None:
    date = email.utils.formatdate(NOW + 42, usegmt=True)
    assert _hint({"retry-after": date}) == 42.0


def test_retry_after_http_date_in_the_past_means_no_wait() -> None:
    assert _hint({"retry-after": email.utils.formatdate(NOW - 100, usegmt=True)}) == 0.0


@pytest.mark.parametrize("value", ["soon", "-5", "nan", "inf", ""])
def test_unusable_retry_after_is_ignored(value: str) -> None:
    assert _hint({"retry-after": value}) is None


def test_missing_retry_hint_is_none() -> None:
    assert _hint({}) is None


def test_request_id_is_taken_from_the_sdk_or_headers() -> None:
    assert classify_error(openai_status_error(500, None, {"x-request-id": "req_1"})).request_id == (
        "req_1"
    )
    assert classify_error(anthropic_error(500, None, {"request-id": "req_2"})).request_id == "req_2"


def test_x_should_retry_header_overrides_the_status_default() -> None:
    assert not classify_error(openai_status_error(500, None, {"x-should-retry": "false"})).retryable
    assert classify_error(openai_status_error(400, None, {"x-should-retry": "true"})).retryable


# --- transport errors --------------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (httpx2.RemoteProtocolError("peer closed connection"), ErrorKind.CONNECTION),
        (httpx2.ReadError("reset"), ErrorKind.CONNECTION),
        (httpx2.ConnectError("refused"), ErrorKind.CONNECTION),
        (httpx2.WriteError("broken"), ErrorKind.CONNECTION),
        (httpx2.ReadTimeout("slow"), ErrorKind.TIMEOUT),
        (httpx2.ConnectTimeout("slow"), ErrorKind.TIMEOUT),
        (httpx2.PoolTimeout("slow"), ErrorKind.TIMEOUT),
        (httpx2.DecodingError("bad gzip"), ErrorKind.STREAM_INTERRUPTED),
        (httpx.RemoteProtocolError("peer closed"), ErrorKind.CONNECTION),
        (httpx.ReadTimeout("slow"), ErrorKind.TIMEOUT),
        (httpcore.RemoteProtocolError("peer closed"), ErrorKind.CONNECTION),
        (httpcore.ReadError("reset"), ErrorKind.CONNECTION),
        (httpcore2.RemoteProtocolError("peer closed"), ErrorKind.CONNECTION),
        (httpcore2.ReadTimeout("slow"), ErrorKind.TIMEOUT),
        (h11.RemoteProtocolError("bad framing"), ErrorKind.CONNECTION),
    ],
    ids=lambda v: (
        f"{type(v).__module__.split('.')[0]}.{type(v).__name__}"
        if isinstance(v, BaseException)
        else str(v)
    ),
)
def test_transport_errors_are_matched_by_family_and_class(exc: Exception, kind: ErrorKind) -> None:
    info = classify_error(exc)
    assert (info.kind, info.retryable) == (kind, True)


def test_transport_errors_that_mean_a_local_mistake_are_not_retried() -> None:
    for exc in (httpx2.UnsupportedProtocol("ftp"), httpx2.LocalProtocolError("bad header")):
        assert not classify_error(exc).retryable


def test_sdk_connection_and_timeout_errors_are_retryable() -> None:
    assert classify_error(openai.APIConnectionError(request=_request())).kind is (
        ErrorKind.CONNECTION
    )
    assert classify_error(anthropic.APITimeoutError(request=_request())).kind is ErrorKind.TIMEOUT


def test_explicit_cause_is_classified_when_the_wrapper_says_nothing() -> None:
    def fail() -> None:
        try:
            raise httpx2.RemoteProtocolError("peer closed connection")
        except httpx2.RemoteProtocolError as err:
            raise RuntimeError("stream failed") from err

    assert classify_error(capture(fail)).kind is ErrorKind.CONNECTION


def test_implicit_context_of_an_sdk_exception_is_followed() -> None:
    def fail() -> None:
        try:
            raise httpx2.ReadError("reset by peer")
        except httpx2.ReadError:
            raise anthropic.APIError("stream broke", _request(), body=None)  # noqa: B904

    assert classify_error(capture(fail)).kind is ErrorKind.CONNECTION


def test_unrelated_error_raised_while_handling_a_network_error_is_not_retried() -> None:
    def fail() -> None:
        try:
            raise httpx2.ReadError("reset by peer")
        except httpx2.ReadError:
            raise ValueError("bug in a callback")  # noqa: B904

    info = classify_error(capture(fail))
    assert (info.kind, info.retryable) == (ErrorKind.UNKNOWN, False)


def test_cyclic_exception_chain_terminates() -> None:
    a, b = RuntimeError("a"), RuntimeError("b")
    a.__cause__, b.__cause__ = b, a
    assert classify_error(a).kind is ErrorKind.UNKNOWN


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (TimeoutError(), ErrorKind.TIMEOUT),
        (ConnectionResetError(), ErrorKind.CONNECTION),
        (BrokenPipeError(), ErrorKind.CONNECTION),
        (ConnectionRefusedError(), ErrorKind.CONNECTION),
    ],
)
def test_python_timeout_and_connection_errors_are_retryable(
    exc: Exception, kind: ErrorKind
) -> None:
    assert (classify_error(exc).kind, classify_error(exc).retryable) == (kind, True)


def test_undecodable_sse_data_from_the_sdk_is_a_stream_interruption() -> None:
    exc = capture(lambda: ServerSentEvent(data='{"choices": [').json())
    assert isinstance(exc, json.JSONDecodeError)
    info = classify_error(exc)
    assert (info.kind, info.retryable) == (ErrorKind.STREAM_INTERRUPTED, True)


def test_json_error_from_application_code_is_not_retried() -> None:
    exc = capture(lambda: json.loads("{oops"))
    assert isinstance(exc, json.JSONDecodeError)
    assert not classify_error(exc).retryable


# --- this library, cancellation, unknowns ---------------------------------------------


def test_stall_and_early_end_are_retryable_interruptions() -> None:
    stall = classify_error(StreamStalledError(idle_timeout=30, chunks_received=4))
    assert (stall.kind, stall.retryable) == (ErrorKind.TIMEOUT, True)
    early = classify_error(StreamEndedEarlyError(chunks_received=4))
    assert (early.kind, early.retryable) == (ErrorKind.STREAM_INTERRUPTED, True)


def test_exhausted_recovery_is_not_retried_again() -> None:
    exc = StreamInterruptedError("gave up", partial=None, cause=httpx2.ReadError("x"), attempts=3)
    assert not classify_error(exc).retryable


@pytest.mark.parametrize(
    "exc",
    [
        asyncio.CancelledError(),
        KeyboardInterrupt(),
        GeneratorExit(),
        SystemExit(1),
        concurrent.futures.CancelledError(),
    ],
    ids=lambda e: type(e).__name__,
)
def test_cancellation_is_never_retryable(exc: BaseException) -> None:
    info = classify_error(exc)
    assert (info.kind, info.retryable) == (ErrorKind.CANCELLED, False)


@pytest.mark.parametrize(
    "message",
    ["rate limit 429 Too Many Requests", "overloaded_error", "503 Service Unavailable", "timeout"],
)
def test_message_text_alone_never_makes_an_error_retryable(message: str) -> None:
    info = classify_error(RuntimeError(message))
    assert (info.kind, info.retryable, info.status_code) == (ErrorKind.UNKNOWN, False, None)


def test_odd_attributes_do_not_break_classification() -> None:
    class Odd(Exception):
        status_code = "429"
        type = 7
        body: ClassVar[list[str]] = ["not", "a", "mapping"]

        @property
        def response(self) -> Any:
            raise RuntimeError("no response")

    assert classify_error(Odd()) == ErrorInfo(kind=ErrorKind.UNKNOWN, retryable=False)
    # httpx's own errors raise when asked for a missing request/response.
    assert classify_error(httpx2.HTTPError("x")).kind is ErrorKind.UNKNOWN


def test_httpx_status_error_is_classified_by_its_response() -> None:
    response = _response(503, {"retry-after": "2"})
    exc = httpx2.HTTPStatusError("503", request=response.request, response=response)
    info = classify_error(exc)
    assert (info.kind, info.retry_after, info.status_code) == (ErrorKind.OVERLOADED, 2.0, 503)


def test_requests_http_error_is_classified_by_its_response() -> None:
    response = requests.Response()
    response.status_code = 429
    response.headers["Retry-After"] = "12"
    info = classify_error(requests.HTTPError("429 Client Error", response=response))
    assert (info.kind, info.retryable, info.retry_after) == (ErrorKind.RATE_LIMITED, True, 12.0)


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (requests.ConnectionError("connection aborted"), ErrorKind.CONNECTION),
        (requests.exceptions.ChunkedEncodingError("body cut off"), ErrorKind.CONNECTION),
        (requests.ReadTimeout("slow"), ErrorKind.TIMEOUT),
        (requests.ConnectTimeout("slow"), ErrorKind.TIMEOUT),
        (urllib3.exceptions.ProtocolError("connection broken"), ErrorKind.CONNECTION),
        (
            urllib3.exceptions.ReadTimeoutError(urllib3.HTTPConnectionPool("p.test"), "/", "slow"),
            ErrorKind.TIMEOUT,
        ),
        (http.client.IncompleteRead(b"partial"), ErrorKind.CONNECTION),
        (http.client.RemoteDisconnected("closed"), ErrorKind.CONNECTION),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v),
)
def test_requests_and_urllib3_transport_errors_are_retryable(
    exc: Exception, kind: ErrorKind
) -> None:
    assert (classify_error(exc).kind, classify_error(exc).retryable) == (kind, True)


def test_certificate_errors_are_not_retried() -> None:
    for exc in (requests.exceptions.SSLError("bad cert"), urllib3.exceptions.SSLError("bad")):
        assert not classify_error(exc).retryable


def test_error_info_serializes_to_json() -> None:
    info = classify_error(openai_status_error(429, None, {"retry-after": "1"}))
    assert json.loads(json.dumps(info.as_dict()))["kind"] == "rate_limited"


def test_importing_the_package_imports_no_provider_sdk() -> None:
    # langchain-core's own BaseChatModel import chain (through langsmith) may load an
    # HTTP client; the package must add no SDK or client of its own on top of that.
    code = (
        "import sys\n"
        "from langchain_core.language_models import BaseChatModel\n"
        "from langchain_core.runnables import RunnableBinding\n"
        "before = {m.split('.')[0] for m in sys.modules}\n"
        "import awaken_langchain\n"
        "loaded = {m.split('.')[0] for m in sys.modules} - before\n"
        "bad = loaded & {'openai', 'anthropic', 'httpx', 'httpx2', 'httpcore', 'httpcore2',"
        " 'langchain_openai', 'langchain_anthropic', 'redis'}\n"
        "assert not bad, bad\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_every_http_error_status_has_a_kind_and_only_transient_ones_retry() -> None:
    transient = {408, 409, 429}
    for status in range(400, 600):
        info = classify_error(anthropic_error(status))
        assert info.kind is not ErrorKind.UNKNOWN, status
        assert info.retryable == (status >= 500 or status in transient), status


def _is_model_error_class(value: object) -> bool:
    return isinstance(value, type) and issubclass(value, ModelError)


@pytest.mark.parametrize(
    "error_class",
    [cls for cls in vars(langchain_core.exceptions).values() if _is_model_error_class(cls)],
    ids=lambda cls: cls.__name__,
)
def test_classification_agrees_with_langchain_is_retryable(error_class: type[ModelError]) -> None:
    exc = error_class()
    assert classify_error(exc).retryable == error_class.is_retryable
