"""Every fault, raised by the real SDKs and LangChain integrations, is classified correctly.

Each fault is served by the loopback provider over a real TCP connection and
consumed through twelve paths: the official ``openai`` SDK (Chat Completions and
Responses) and ``anthropic`` SDK, and ``ChatOpenAI`` (both APIs) and
``ChatAnthropic`` (``max_retries=0``), each sync and async.

One server and one event loop serve the whole module: the LangChain integrations
cache their HTTP clients per base URL, and an async client must stay on the loop
that created it.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any, Literal

import anthropic
import openai
import pytest
import pytest_asyncio
from langchain_anthropic import ChatAnthropic
from langchain_core.messages import AIMessageChunk
from langchain_openai import ChatOpenAI

from awaken_langchain import ErrorKind, RetryPolicy, classify_error
from awaken_langchain.errors import StreamEndedEarlyError
from awaken_langchain.testing import Fault, LoopbackProvider, Scenario

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

ANSWER = "The loopback provider streams this answer in small pieces."
TIMEOUT = 5.0
STALL_TIMEOUT = 0.3

Provider = Literal["openai", "openai-responses", "anthropic"]
Layer = Literal["sdk", "langchain"]


@dataclasses.dataclass(frozen=True)
class Path:
    """One way of consuming a streamed answer."""

    provider: Provider
    layer: Layer
    is_async: bool

    @property
    def id(self) -> str:
        return f"{self.provider}-{self.layer}-{'async' if self.is_async else 'sync'}"

    @property
    def yields_stream_errors(self) -> bool:
        """The bare openai SDK yields a Responses ``error``/``response.failed`` event, no raise."""
        return self.provider == "openai-responses" and self.layer == "sdk"


PATHS = [
    Path(provider, layer, is_async)
    for provider in ("openai", "openai-responses", "anthropic")
    for layer in ("sdk", "langchain")
    for is_async in (False, True)
]


# --- consuming a stream through each path ----------------------------------------------


@dataclasses.dataclass
class Clients:
    """The module's SDK clients, reused across tests like an application reuses them."""

    openai_sync: openai.OpenAI
    openai_async: openai.AsyncOpenAI
    anthropic_sync: anthropic.Anthropic
    anthropic_async: anthropic.AsyncAnthropic


@pytest.fixture(scope="module")
def module_server() -> Iterator[LoopbackProvider]:
    with LoopbackProvider() as server:
        yield server


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def clients(module_server: LoopbackProvider) -> AsyncIterator[Clients]:
    openai_url, anthropic_url = module_server.base_url_openai, module_server.base_url_anthropic
    made = Clients(
        openai_sync=openai.OpenAI(base_url=openai_url, api_key="test", max_retries=0),
        openai_async=openai.AsyncOpenAI(base_url=openai_url, api_key="test", max_retries=0),
        anthropic_sync=anthropic.Anthropic(base_url=anthropic_url, api_key="test", max_retries=0),
        anthropic_async=anthropic.AsyncAnthropic(
            base_url=anthropic_url, api_key="test", max_retries=0
        ),
    )
    yield made
    made.openai_sync.close()
    made.anthropic_sync.close()
    await made.openai_async.close()
    await made.anthropic_async.close()


@dataclasses.dataclass
class Loopback:
    """The loopback provider and the clients pointed at it."""

    server: LoopbackProvider
    clients: Clients


@pytest.fixture
def env(module_server: LoopbackProvider, clients: Clients) -> Iterator[Loopback]:
    """The module's provider, with no queued scenarios or recorded requests."""
    module_server.reset()
    yield Loopback(module_server, clients)
    module_server.reset()


async def consume(path: Path, env: Loopback, read_timeout: float = TIMEOUT) -> list[Any]:
    """Stream one answer to the end through ``path``; return the items received.

    Sync paths run inline: the server answers from its own threads.
    """
    if path.is_async:
        return await _aconsume(path, env, read_timeout)
    return _consume(path, env, read_timeout)


def _consume(path: Path, env: Loopback, read_timeout: float) -> list[Any]:
    if path.layer == "langchain":
        return list(_chat_model(path, env, read_timeout).stream("Say something."))
    clients = env.clients
    if path.provider == "openai-responses":
        events = clients.openai_sync.responses.create(
            stream=True, timeout=read_timeout, **_RESPONSES_REQUEST
        )
        return list(events)
    if path.provider == "openai":
        chunks = clients.openai_sync.chat.completions.create(
            stream=True, timeout=read_timeout, **_OPENAI_REQUEST
        )
        return list(chunks)
    events = clients.anthropic_sync.messages.create(
        stream=True, timeout=read_timeout, **_ANTHROPIC_REQUEST
    )
    return list(events)


async def _aconsume(path: Path, env: Loopback, read_timeout: float) -> list[Any]:
    if path.layer == "langchain":
        return [chunk async for chunk in _chat_model(path, env, read_timeout).astream("Say it.")]
    clients = env.clients
    if path.provider == "openai-responses":
        events = await clients.openai_async.responses.create(
            stream=True, timeout=read_timeout, **_RESPONSES_REQUEST
        )
        return [event async for event in events]
    if path.provider == "openai":
        chunks = await clients.openai_async.chat.completions.create(
            stream=True, timeout=read_timeout, **_OPENAI_REQUEST
        )
        return [chunk async for chunk in chunks]
    events = await clients.anthropic_async.messages.create(
        stream=True, timeout=read_timeout, **_ANTHROPIC_REQUEST
    )
    return [event async for event in events]


_OPENAI_REQUEST: dict[str, Any] = {
    "model": "gpt-4o-mini",
    "messages": [{"role": "user", "content": "Say something."}],
}
_RESPONSES_REQUEST: dict[str, Any] = {"model": "gpt-5-mini", "input": "Say something."}
_ANTHROPIC_REQUEST: dict[str, Any] = {
    "model": "claude-loopback-1",
    "max_tokens": 256,
    "messages": [{"role": "user", "content": "Say something."}],
}


def _chat_model(path: Path, env: Loopback, read_timeout: float) -> ChatOpenAI | ChatAnthropic:
    if path.provider != "anthropic":
        return ChatOpenAI(
            model="gpt-4o-mini",
            base_url=env.server.base_url_openai,
            api_key="test",
            max_retries=0,
            timeout=read_timeout,
            use_responses_api=path.provider == "openai-responses",
        )
    return ChatAnthropic(  # type: ignore[call-arg]
        model_name="claude-loopback-1",
        base_url=env.server.base_url_anthropic,
        api_key="test",
        max_retries=0,
        default_request_timeout=read_timeout,
    )


async def failure(path: Path, env: Loopback, read_timeout: float = TIMEOUT) -> BaseException:
    """Consume through ``path`` and return what it raised."""
    with pytest.raises(Exception) as caught:
        await consume(path, env, read_timeout)
    return caught.value


def has_terminal_signal(path: Path, items: list[Any]) -> bool:
    """Whether the stream said it was finished (finish_reason / stop_reason)."""
    for item in items:
        if isinstance(item, AIMessageChunk):
            metadata = item.response_metadata
            if metadata.get("finish_reason") or metadata.get("stop_reason"):
                return True
            if metadata.get("status") == "completed":  # Responses API
                return True
        elif path.provider == "openai-responses":
            if item.type == "response.completed":
                return True
        elif path.provider == "openai":
            if any(choice.finish_reason for choice in item.choices):
                return True
        elif item.type == "message_delta" and item.delta.stop_reason:
            return True
    return False


# --- the fault table -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    """A fault and how every path must classify it."""

    id: str
    fault: Callable[[], Fault]
    kind: ErrorKind
    retryable: bool
    overrides: Mapping[tuple[Provider, Layer | None], ErrorKind] = dataclasses.field(
        default_factory=dict
    )
    retry_after: tuple[float, float] | None = None
    read_timeout: float = TIMEOUT
    in_stream: bool = False
    """The failure is an event inside an HTTP 200 stream."""

    def expected_kind(self, path: Path) -> ErrorKind:
        return self.overrides.get(
            (path.provider, path.layer), self.overrides.get((path.provider, None), self.kind)
        )


def _in_30_seconds() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=30)


RETRYABLE = [
    Case(
        "429-retry-after-seconds",
        lambda: Fault.rate_limited(retry_after=7),
        ErrorKind.RATE_LIMITED,
        True,
        retry_after=(7.0, 7.0),
    ),
    Case(
        "429-retry-after-http-date",
        lambda: Fault.rate_limited(retry_after=_in_30_seconds()),
        ErrorKind.RATE_LIMITED,
        True,
        retry_after=(27.0, 30.0),
    ),
    Case(
        "429-retry-after-ms",
        lambda: Fault.rate_limited(retry_after_ms=1500),
        ErrorKind.RATE_LIMITED,
        True,
        retry_after=(1.5, 1.5),
    ),
    Case("500", lambda: Fault.server_error(500), ErrorKind.SERVER, True),
    Case("502", lambda: Fault.server_error(502), ErrorKind.SERVER, True),
    Case("503", lambda: Fault.server_error(503), ErrorKind.OVERLOADED, True),
    Case("529", lambda: Fault.overloaded(), ErrorKind.OVERLOADED, True),
    Case("drop-before-headers", lambda: Fault.drop_before_headers(), ErrorKind.CONNECTION, True),
    Case(
        "drop-before-headers-reset",
        lambda: Fault.drop_before_headers(reset=True),
        ErrorKind.CONNECTION,
        True,
    ),
    Case("drop-after-bytes", lambda: Fault.drop_after_bytes(40), ErrorKind.CONNECTION, True),
    Case(
        "drop-after-bytes-reset",
        lambda: Fault.drop_after_bytes(40, reset=True),
        ErrorKind.CONNECTION,
        True,
    ),
    Case("drop-after-events", lambda: Fault.drop_after_events(4), ErrorKind.CONNECTION, True),
    Case(
        "drop-after-events-reset",
        lambda: Fault.drop_after_events(4, reset=True),
        ErrorKind.CONNECTION,
        True,
    ),
    Case(
        "sse-error-event-in-200-stream",
        lambda: Fault.error_event(after_events=3),
        ErrorKind.SERVER,  # OpenAI: APIError, type server_error, no status
        True,
        overrides={("anthropic", None): ErrorKind.OVERLOADED},  # status 200, overloaded_error
        in_stream=True,
    ),
    Case(
        "sse-api-error-event",
        lambda: Fault.error_event(after_events=3, error_type="api_error"),
        ErrorKind.SERVER,
        True,
        in_stream=True,
    ),
    Case(
        "response-failed-server-error",
        lambda: Fault.response_failed(after_events=3, code="server_error"),
        ErrorKind.SERVER,
        True,
        in_stream=True,
    ),
    Case(
        "response-failed-rate-limit",
        lambda: Fault.response_failed(after_events=3, code="rate_limit_exceeded"),
        ErrorKind.RATE_LIMITED,
        True,
        in_stream=True,
    ),
    Case(
        "malformed-sse",
        lambda: Fault.malformed_sse(after_events=3),
        ErrorKind.STREAM_INTERRUPTED,
        True,
    ),
    Case(
        "stall",
        lambda: Fault.stall(30, after_events=3),
        ErrorKind.TIMEOUT,
        True,
        read_timeout=STALL_TIMEOUT,
    ),
]

PERMANENT = [
    Case("400", lambda: Fault.http_error(400), ErrorKind.INVALID_REQUEST, False),
    Case("401", lambda: Fault.http_error(401), ErrorKind.AUTHENTICATION, False),
    Case("403", lambda: Fault.http_error(403), ErrorKind.PERMISSION, False),
    Case("404", lambda: Fault.http_error(404), ErrorKind.NOT_FOUND, False),
    Case("413", lambda: Fault.http_error(413), ErrorKind.CONTEXT_OVERFLOW, False),
    Case(
        "400-context-overflow",
        lambda: Fault.context_overflow(),
        ErrorKind.CONTEXT_OVERFLOW,
        False,
        # The bare Anthropic SDK says so only in the message text, which is not read;
        # ChatAnthropic turns it into ContextOverflowError.
        overrides={("anthropic", "sdk"): ErrorKind.INVALID_REQUEST},
    ),
    Case(
        "sse-invalid-request-event",
        lambda: Fault.error_event(after_events=3, error_type="invalid_request_error"),
        ErrorKind.INVALID_REQUEST,
        False,
        in_stream=True,
    ),
    Case(
        "response-failed-invalid-prompt",
        lambda: Fault.response_failed(after_events=3, code="invalid_prompt"),
        ErrorKind.CONTENT_FILTER,
        False,
        # Only the Responses API has this code; the other wires see an unknown error type.
        overrides={("openai", None): ErrorKind.UNKNOWN, ("anthropic", None): ErrorKind.UNKNOWN},
        in_stream=True,
    ),
]


# --- classification -------------------------------------------------------------------


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.id)
@pytest.mark.parametrize("case", RETRYABLE + PERMANENT, ids=lambda c: c.id)
async def test_fault_is_classified_by_structure(env: Loopback, case: Case, path: Path) -> None:
    env.server.enqueue(Scenario(text=ANSWER, fault=case.fault()))
    if case.in_stream and path.yields_stream_errors:
        events = await consume(path, env)
        assert events[-1].type in ("error", "response.failed")
        return
    info = classify_error(await failure(path, env, case.read_timeout))
    assert (info.kind, info.retryable) == (case.expected_kind(path), case.retryable)
    if case.retry_after is not None:
        low, high = case.retry_after
        assert info.retry_after is not None
        assert low <= info.retry_after <= high
    assert len(env.server.requests) == 1


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.id)
async def test_anthropic_overload_event_keeps_status_200(env: Loopback, path: Path) -> None:
    env.server.enqueue(Scenario(text=ANSWER, fault=Fault.error_event(after_events=3)))
    if path.yields_stream_errors:
        (event,) = [e for e in await consume(path, env) if e.type == "error"]
        assert event.code == "server_error"
        return
    info = classify_error(await failure(path, env))
    if path.provider == "anthropic":
        assert (info.status_code, info.provider_type) == (200, "overloaded_error")
    elif path.provider == "openai-responses":
        # langchain-openai raises ValueError; the code is read from the event it raised on.
        assert (info.status_code, info.provider_code) == (None, "server_error")
    else:
        assert (info.status_code, info.provider_type) == (None, "server_error")


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.id)
async def test_stream_without_terminal_event_is_a_retryable_interruption(
    env: Loopback, path: Path
) -> None:
    env.server.enqueue(
        Scenario(text=ANSWER),
        Scenario(text=ANSWER, fault=Fault.no_terminal_event()),
    )
    complete = await consume(path, env)
    cut = await consume(path, env)  # the SDKs raise nothing: the body just ends
    assert has_terminal_signal(path, complete)
    assert cut
    assert not has_terminal_signal(path, cut)
    info = classify_error(StreamEndedEarlyError(chunks_received=len(cut)))
    assert (info.kind, info.retryable) == (ErrorKind.STREAM_INTERRUPTED, True)


# --- driven through RetryPolicy ----------------------------------------------------------


async def drive(path: Path, env: Loopback, policy: RetryPolicy) -> list[Any]:
    """Consume ``path``, sending it again before output as ``policy.should_retry`` decides."""
    from awaken_langchain.retry import RetryPhase

    started, failures = policy.clock(), 0
    while True:
        try:
            if path.is_async:
                return await _aconsume(path, env, TIMEOUT)
            return _consume(path, env, TIMEOUT)
        except Exception as exc:
            failures += 1
            decision = policy.should_retry(
                exc,
                attempt=failures,
                elapsed=policy.clock() - started,
                phase=RetryPhase.BEFORE_OUTPUT,
            )
            if not decision.retry:
                raise
            if path.is_async:
                await policy.async_sleep(decision.delay)
            else:
                policy.sleep(decision.delay)


class Sleeps:
    """Records requested sleeps instead of sleeping."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.seconds.append(seconds)

    async def async_sleep(self, seconds: float) -> None:
        self.seconds.append(seconds)


def _policy(sleeps: Sleeps) -> RetryPolicy:
    return RetryPolicy(jitter=0.0, sleep=sleeps.sleep, async_sleep=sleeps.async_sleep)


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.id)
@pytest.mark.parametrize("case", PERMANENT, ids=lambda c: c.id)
async def test_permanent_error_sends_exactly_one_request(
    env: Loopback, case: Case, path: Path
) -> None:
    env.server.enqueue(Scenario(text=ANSWER, fault=case.fault()), Scenario(text=ANSWER))
    if case.in_stream and path.yields_stream_errors:
        # The bare SDK yields the error event: nothing raises, nothing is retried.
        events = await drive(path, env, _policy(Sleeps()))
        assert events[-1].type in ("error", "response.failed")
        assert len(env.server.requests) == 1
        return
    sleeps = Sleeps()
    with pytest.raises(Exception) as caught:
        await drive(path, env, _policy(sleeps))
    assert classify_error(caught.value).kind is case.expected_kind(path)
    assert len(env.server.requests) == 1
    assert sleeps.seconds == []


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.id)
async def test_retryable_errors_are_retried_until_the_answer_arrives(
    env: Loopback, path: Path
) -> None:
    env.server.enqueue(
        Scenario(text=ANSWER, fault=Fault.overloaded()),
        Scenario(text=ANSWER, fault=Fault.drop_before_headers()),
        Scenario(text=ANSWER),
    )
    sleeps = Sleeps()
    items = await drive(path, env, _policy(sleeps))
    assert has_terminal_signal(path, items)
    assert len(env.server.requests) == 3
    assert sleeps.seconds == [2.0, 1.0]  # overloaded base, then the normal second backoff


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.id)
async def test_provider_hint_of_an_hour_waits_the_sixty_second_cap(
    env: Loopback, path: Path
) -> None:
    env.server.enqueue(
        Scenario(text=ANSWER, fault=Fault.rate_limited(retry_after=3600)), Scenario(text=ANSWER)
    )
    sleeps = Sleeps()
    await drive(path, env, _policy(sleeps))
    assert sleeps.seconds == [60.0]
    assert len(env.server.requests) == 2
