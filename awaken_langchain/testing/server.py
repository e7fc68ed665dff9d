"""A loopback OpenAI- and Anthropic-compatible streaming server with fault injection.

:class:`LoopbackProvider` listens on ``127.0.0.1`` (a random free port by
default) in a background thread and answers:

- ``POST /v1/chat/completions``: OpenAI Chat Completions, streamed (SSE
  ``chat.completion.chunk`` events and ``data: [DONE]``) or not;
- ``POST /v1/messages``: Anthropic Messages, streamed (``message_start`` ...
  ``message_stop``) or not, with thinking blocks and citations;
- ``POST /v1/responses``: the OpenAI Responses API, streamed
  (``response.created`` ... ``response.completed``) or not, with reasoning
  items, annotations and function calls; with ``background: true`` (and
  ``store: true``) the response is kept after the client's connection drops:
  ``GET /v1/responses/{id}?stream=true&starting_after=N`` replays its events
  after sequence number ``N``, ``GET /v1/responses/{id}`` returns it and
  ``POST /v1/responses/{id}/cancel`` cancels it (see :class:`BackgroundResponse`).

Each request is answered by the next queued :class:`Scenario` (text, tool calls,
usage, chunking, pacing) and its optional :class:`Fault` (HTTP errors with retry
hints, dropped connections, SSE error events, missing terminal events, stalls,
malformed SSE). The server owns the TCP connection, so a drop is a real drop.
Every request is recorded for assertions, and request bodies are validated
like the real APIs do (see ``shape_rules``).

Point the official SDKs or the LangChain integrations at it::

    import openai
    from langchain_openai import ChatOpenAI
    from awaken_langchain.testing import Fault, LoopbackProvider, Scenario

    with LoopbackProvider() as server:
        server.enqueue(Scenario(text="Hello there", fault=Fault.drop_after_events(2)))
        model = ChatOpenAI(
            model="gpt-4o-mini", base_url=server.base_url_openai, api_key="x", max_retries=0
        )
        try:
            for chunk in model.stream("Hi"):
                print(chunk.text, end="")
        except openai.APIConnectionError:
            print(" <connection dropped>")
        assert len(server.requests_for("openai")) == 1

This prints ``Hell <connection dropped>``: the role chunk and one four-character
delta arrived before the drop.

In pytest, enable the ``loopback_provider`` fixture with
``pytest_plugins = ["awaken_langchain.testing.pytest_plugin"]`` in a
``conftest.py``. Run the server standalone (for demos) with
``python -m awaken_langchain.testing.server --port 8765 --text "..."``; add
``--fault drop --fault-every 3`` to break every third answer mid-stream
(continuation requests get the rest of the text, see
:func:`continuation_responder`), or ``--echo`` to repeat the user's message.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import itertools
import json
import logging
import re
import select
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType, TracebackType
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

from awaken_langchain.seam import is_word_start
from awaken_langchain.testing._scenarios import (
    Fault,
    FaultKind,
    Provider,
    Scenario,
    ScriptedCitation,
    ScriptedThinking,
    ScriptedToolCall,
    ScriptedWebSearch,
    TokenUsage,
    is_openai,
)
from awaken_langchain.testing._schema import (
    answer_format,
    example_value,
    json_object_for,
    mentioned_tool,
    offered_tools,
    tool_choice,
)
from awaken_langchain.testing._shapes import (
    DEFAULT_SHAPE_RULES,
    NO_ASSISTANT_PREFILL,
    ShapeRule,
    first_violation,
)
from awaken_langchain.testing._wire import (
    Frame,
    ResponseContext,
    anthropic_frames,
    anthropic_message,
    error_body,
    error_frame,
    estimate_usage,
    keepalive_frame,
    malformed_frame,
    openai_completion,
    openai_frames,
    responses_failed_frame,
    responses_frames,
    responses_object,
    stream_error_type,
)

__all__ = [
    "DEFAULT_SHAPE_RULES",
    "NO_ASSISTANT_PREFILL",
    "BackgroundResponse",
    "Fault",
    "FaultKind",
    "LoopbackProvider",
    "Provider",
    "RecordedRequest",
    "Responder",
    "Scenario",
    "ScriptedCitation",
    "ScriptedThinking",
    "ScriptedToolCall",
    "ScriptedWebSearch",
    "ShapeRule",
    "TokenUsage",
    "continuation_responder",
    "echo_responder",
    "periodic_fault",
    "schema_responder",
]

logger = logging.getLogger("awaken_langchain.testing.server")
_QUERY = re.compile(r"\?[^\s'\"]*")
"""A URL's query string inside a logged request line (dropped: it can hold an api-key)."""

DEFAULT_ANSWER = "This is the loopback provider answering."
"""The text of the default scenario, used when the queue is empty."""


@dataclass(frozen=True)
class RecordedRequest:
    """One request the server received, as it arrived.

    Attributes:
        number: Sequence number on this server, starting at 1; it also
            numbers the response ids (``chatcmpl-loopback-<n>``, ``msg_loopback_<n>``).
        method: HTTP method.
        path: Request path without the query string.
        query: The query string (``""`` when none).
        headers: Request headers, names lower-cased.
        raw_body: The body bytes.
        body: The body parsed as JSON, or ``None`` when it is not JSON.
        provider: The wire format the path belongs to, or ``None`` for an
            unknown path.
        scenario: The scenario that answered, or ``None`` when the request was
            rejected (unknown path, invalid JSON, shape rule).
        rejected_by: The name of the shape rule the request broke, if any.
        received_at: ``time.monotonic()`` when the request was read, so tests
            can measure the wait between a failure and its retry.
    """

    number: int
    method: str
    path: str
    query: str
    headers: Mapping[str, str]
    raw_body: bytes
    body: Any
    provider: Provider | None
    scenario: Scenario | None = None
    rejected_by: str | None = None
    received_at: float = 0.0

    @property
    def stream(self) -> bool:
        """Whether the request asked for a streamed response."""
        return isinstance(self.body, dict) and self.body.get("stream") is True

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The request's ``messages`` list (empty when absent).

        For a Responses API request, a Chat-Completions-like view of its
        ``instructions`` and ``input``: a ``system`` message for the
        instructions, ``message`` items as ``{"role", "content"}``,
        ``function_call`` items as assistant ``tool_calls`` and
        ``function_call_output`` items as ``tool`` messages (reasoning items
        are left out; read :attr:`input` for them).
        """
        if not isinstance(self.body, dict):
            return []
        if self.provider == "openai-responses":
            return _responses_messages(self.body)
        if isinstance(self.body.get("messages"), list):
            return list(self.body["messages"])
        return []

    @property
    def input(self) -> list[Any]:
        """A Responses API request's ``input`` items (a string input is one user message)."""
        value = self.body.get("input") if isinstance(self.body, dict) else None
        if isinstance(value, str):
            return [{"role": "user", "content": value}]
        return list(value) if isinstance(value, list) else []


Responder = Callable[[RecordedRequest], Scenario]
"""Builds the answer to a request when no queued scenario is left."""

BACKGROUND_TTL = 600.0
"""Seconds a background response stays retrievable after its creation (by the server's clock)."""


@dataclass
class BackgroundResponse:
    """A Responses API response created with ``background: true``, kept by the server.

    The loopback provider renders a response's events when it is created and
    generates them at the scenario's pace (``Scenario.delay`` per event, from
    ``started``) whether or not a client reads them: a retrieval sends the
    events generated so far at once and the others as they are generated. It
    counts as running (``in_progress``) until the server has sent its terminal
    event; a cancel
    before that makes it ``cancelled``, and a streamed retrieval of a cancelled
    response sends no more events and ends without a terminal one.

    Attributes:
        id: The response id.
        number: The number of the request that created it.
        frames: Every event of the response, as rendered.
        scenario: The scenario that answers it.
        created_at: The server clock's reading at creation (for expiry).
        started: ``time.monotonic()`` at creation (for the generation pace).
        status: ``in_progress``, ``completed``, ``incomplete`` or ``cancelled``.
        retrievals: Streamed retrievals so far.
    """

    id: str
    number: int
    frames: list[Frame]
    scenario: Scenario
    ctx: ResponseContext
    created_at: float
    started: float = 0.0
    status: str = "in_progress"
    retrievals: int = 0


def echo_responder(prefix: str = "You said: ", *, chunk_size: int = 4) -> Responder:
    """A responder that answers with the text of the last user message.

    Args:
        prefix: Text put before the echoed message.
        chunk_size: Characters per streamed delta.

    Returns:
        A responder usable as ``LoopbackProvider(default=...)``.
    """

    def respond(request: RecordedRequest) -> Scenario:
        return Scenario(text=prefix + _last_user_text(request.messages), chunk_size=chunk_size)

    return respond


def schema_responder(prefix: str = "You said: ", *, chunk_size: int = 4) -> Responder:
    """A responder that answers tool and structured-output requests from their own schemas.

    Deterministic, for test suites that need a valid answer to any request
    (for example the ``langchain_tests`` integration suites):

    - a request that forces a tool (a named ``tool_choice``, ``"required"``,
      Anthropic ``{"type": "any"}``), or offers tools and is not answering a
      tool result, calls one: the forced one, else the first whose name the
      last user message mentions, else the first; its arguments fill every
      property of the tool's JSON schema with plausible values of the right
      types (see ``example_value``: strings ``"example <name>"``, integers 3
      inside their bounds...);
    - a request for structured output (Chat Completions ``response_format``,
      Responses ``text.format``, Anthropic ``output_config.format``) is
      answered with a JSON document valid against the schema; JSON mode
      without a schema gets an object with the keys the prompt quotes;
    - anything else is echoed like :func:`echo_responder`.

    Args:
        prefix: Text put before an echoed message.
        chunk_size: Characters per streamed delta or argument fragment.

    Returns:
        A responder usable as ``LoopbackProvider(default=...)``.
    """
    echo = echo_responder(prefix, chunk_size=chunk_size)

    def respond(request: RecordedRequest) -> Scenario:
        body, provider = request.body, request.provider
        if provider is None or not isinstance(body, dict):
            return echo(request)
        tools = offered_tools(provider, body)
        mode, name = tool_choice(provider, body)
        tool = None
        if mode == "named":
            tool = next((t for t in tools if t.name == name), None)
        elif tools and (mode == "any" or (mode == "auto" and not _answers_tool(request))):
            tool = mentioned_tool(tools, _last_user_text(request.messages))
        if tool is not None:
            call = ScriptedToolCall(tool.name, example_value(tool.parameters))
            return Scenario(tool_calls=[call], chunk_size=chunk_size)
        fmt = answer_format(provider, body)
        if fmt is not None:
            if fmt["type"] == "json_schema":
                document = example_value(fmt["schema"])
            else:
                document = json_object_for(_last_user_text(request.messages))
            return Scenario(text=json.dumps(document), chunk_size=chunk_size)
        return echo(request)

    return respond


def _answers_tool(request: RecordedRequest) -> bool:
    """Whether the request's last message hands tool results back to the model."""
    messages = request.messages
    if not messages:
        return False
    content = messages[-1].get("content")
    blocks = content if isinstance(content, list) else []
    return messages[-1].get("role") == "tool" or any(
        isinstance(b, Mapping) and b.get("type") == "tool_result" for b in blocks
    )


def continuation_responder(answer: Scenario, *, overlap_words: int = 0) -> Responder:
    """A responder that behaves like a model asked to continue an interrupted answer.

    Every request is answered with ``answer``, except a continuation: when the
    last assistant message in the request is a non-empty beginning of
    ``answer``'s text (a saved prefix, sent without trailing whitespace), only
    the rest of the text is sent, starting with the whitespace the prefix lost.
    Set ``overlap_words`` to restart instead at the start of the prefix's last
    that many words (a cut-off word counts as one; in CJK text a word is a
    character), as real models often do at the seam. Combine it with
    :func:`periodic_fault` for an offline demo in which interrupted streams
    are continued and still add up to ``answer``.

    Args:
        answer: The complete answer: its text is what continuations continue;
            its other fields (tool calls, chunking, pacing...) are kept.
        overlap_words: Words of the prefix to repeat at the start of a
            continuation (all of them when the prefix has fewer).

    Returns:
        A responder usable as ``LoopbackProvider(default=...)``.
    """
    if overlap_words < 0:
        raise ValueError(f"continuation_responder needs overlap_words >= 0, got {overlap_words}")
    full = answer.full_text

    def respond(request: RecordedRequest) -> Scenario:
        prefix = _last_assistant_text(request.messages)
        if prefix and full.startswith(prefix) and len(prefix) < len(full):
            return dataclasses.replace(answer, text=full[_restart(prefix, overlap_words) :])
        return answer

    return respond


def _restart(prefix: str, overlap_words: int) -> int:
    """Where a continuation that repeats the prefix's last ``overlap_words`` words starts."""
    if overlap_words == 0:
        return len(prefix)
    starts = [i for i in range(len(prefix)) if is_word_start(prefix, i)]
    return starts[-overlap_words] if overlap_words <= len(starts) else 0


def periodic_fault(base: Scenario | Responder, fault: Fault, *, every: int) -> Responder:
    """A responder that answers like ``base`` but injects ``fault`` into every Nth answer.

    Handy as a long-running demo default: ``LoopbackProvider(default=periodic_fault(
    echo_responder(), Fault.drop_after_events(3), every=3))`` breaks every third
    request mid-stream.

    Args:
        base: The scenario or responder giving the normal answer.
        fault: The fault to inject.
        every: Inject into requests number ``every``, ``2 * every``... (counted
            over the requests this responder answers).

    Returns:
        The responder.
    """
    if every < 1:
        raise ValueError(f"periodic_fault needs every >= 1, got {every}")
    counter = itertools.count(1)
    lock = threading.Lock()

    def respond(request: RecordedRequest) -> Scenario:
        with lock:
            number = next(counter)
        scenario = base if isinstance(base, Scenario) else base(request)
        if number % every == 0:
            scenario = dataclasses.replace(scenario, fault=fault)
        return scenario

    return respond


class LoopbackProvider:
    """A loopback OpenAI/Anthropic server answering from scripted scenarios.

    Use it as a context manager (or call :meth:`start`/:meth:`stop`). It is
    thread-safe: scenarios can be queued and requests read while clients run,
    sync or async.

    Args:
        scenarios: Scenarios to queue, answered in order.
        default: What answers a request when no queued scenario fits: a
            :class:`Scenario`, or a :data:`Responder` called with the request.
        shape_rules: Request validation rules; a request that breaks one is
            answered 400 with a provider-style error. Pass ``()`` to disable.
        host: Interface to listen on.
        port: Port to listen on; ``0`` picks a free one.
        clock: The clock background responses expire by (seconds); tests pass
            one they move forward.
        background_ttl: Seconds a background response stays retrievable; after
            that a retrieval answers 404, as for an unknown id.
    """

    def __init__(
        self,
        scenarios: Iterable[Scenario] = (),
        *,
        default: Scenario | Responder = Scenario(text=DEFAULT_ANSWER),  # noqa: B008
        shape_rules: Sequence[ShapeRule] = DEFAULT_SHAPE_RULES,
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Callable[[], float] = time.monotonic,
        background_ttl: float = BACKGROUND_TTL,
    ) -> None:
        self._lock = threading.RLock()
        self.clock = clock
        self.background_ttl = background_ttl
        self._background: dict[str, BackgroundResponse] = {}
        self._queue: list[Scenario] = list(scenarios)
        self._requests: list[RecordedRequest] = []
        self._received = 0
        self._default: Scenario | Responder = default
        self.shape_rules: tuple[ShapeRule, ...] = tuple(shape_rules)
        self._host = host
        self._requested_port = port
        self._stopping = threading.Event()
        self._server: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._connections: dict[socket.socket, threading.Thread] = {}
        self._errors: list[Exception] = []
        self._hangups: dict[int, float] = {}

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> Self:
        """Bind the port and start serving in a background thread.

        Returns:
            The server itself.

        Raises:
            RuntimeError: The server is already running.
        """
        if self._server is not None:
            raise RuntimeError("LoopbackProvider is already running; call stop() first")
        self._stopping.clear()
        server = _bind(self._host, self._requested_port, self)
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.02},
            name=f"loopback-provider:{server.server_address[1]}",
            daemon=True,
        )
        self._thread.start()
        logger.debug("loopback provider listening on %s", self.url)
        return self

    def stop(self) -> None:
        """Stop serving, end stalls, close open connections and wait for handlers.

        Idempotent: stopping a stopped server does nothing.
        """
        server, thread = self._server, self._thread
        if server is None:
            return
        self._stopping.set()
        server.shutdown()
        server.server_close()
        with self._lock:
            connections = dict(self._connections)
        for connection in connections:
            _shutdown_quietly(connection)
        for handler_thread in connections.values():
            if handler_thread is not threading.current_thread():
                handler_thread.join(timeout=5)
        if thread is not None:
            thread.join(timeout=5)
        self._server = None
        self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        """Whether the server is serving."""
        return self._server is not None

    # -- addresses --------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The bound port.

        Raises:
            RuntimeError: The server is not running.
        """
        if self._server is None:
            raise RuntimeError("LoopbackProvider is not running; use it as a context manager")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """The server root, for example ``http://127.0.0.1:50123``."""
        return f"http://{self._host}:{self.port}"

    @property
    def base_url_openai(self) -> str:
        """Base URL for the OpenAI SDK / ``ChatOpenAI(base_url=...)`` (ends in ``/v1``)."""
        return f"{self.url}/v1"

    @property
    def base_url_anthropic(self) -> str:
        """Base URL for the Anthropic SDK / ``ChatAnthropic(base_url=...)``."""
        return self.url

    # -- scripting --------------------------------------------------------------------

    def enqueue(self, *scenarios: Scenario) -> None:
        """Append scenarios to the queue; each answers one request, in order."""
        with self._lock:
            self._queue.extend(scenarios)

    def script(self, scenarios: Iterable[Scenario]) -> None:
        """Replace the queue with ``scenarios``."""
        with self._lock:
            self._queue = list(scenarios)

    @property
    def pending(self) -> tuple[Scenario, ...]:
        """The queued scenarios no request has consumed yet."""
        with self._lock:
            return tuple(self._queue)

    @property
    def default(self) -> Scenario | Responder:
        """What answers a request when no queued scenario fits."""
        with self._lock:
            return self._default

    @default.setter
    def default(self, value: Scenario | Responder) -> None:
        with self._lock:
            self._default = value

    # -- recording --------------------------------------------------------------------

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request received so far, oldest first (a copy)."""
        with self._lock:
            return list(self._requests)

    def requests_for(self, provider: Provider) -> list[RecordedRequest]:
        """The requests received in ``provider``'s wire format, oldest first.

        For ``openai-responses`` these are the creations (``POST /v1/responses``),
        each one a generation; retrievals and cancels are listed by
        :meth:`retrievals` and :meth:`cancellations`.
        """
        return [r for r in self.requests if r.provider == provider]

    def retrievals(self) -> list[RecordedRequest]:
        """``GET /v1/responses/{id}`` requests (streamed or not), oldest first."""
        return [
            r for r in self.requests if r.method == "GET" and _background_route(r.path) is not None
        ]

    def cancellations(self) -> list[RecordedRequest]:
        """``POST /v1/responses/{id}/cancel`` requests, oldest first."""
        return [
            r
            for r in self.requests
            if r.method == "POST" and r.path.rstrip("/").endswith("/cancel")
        ]

    def background_response(self, response_id: str) -> BackgroundResponse | None:
        """The background response with ``response_id``, if the server still keeps it."""
        with self._lock:
            return self._background.get(response_id)

    @property
    def errors(self) -> list[Exception]:
        """Exceptions the server itself raised while answering (a copy).

        Client disconnects are normal and not listed. Anything here is a bug in
        the server or in a responder's scenario; the ``loopback_provider``
        pytest fixture fails the test when this is not empty.
        """
        with self._lock:
            return list(self._errors)

    @property
    def hangups(self) -> dict[int, float]:
        """Streams the client closed while the server was pausing (a stall, a delay).

        Maps the request number to the ``time.monotonic()`` at which the server
        noticed the closed connection (it checks every 50 ms during a pause). A
        client that abandons a stalled stream should appear here at once.
        """
        with self._lock:
            return dict(self._hangups)

    def reset(self) -> None:
        """Forget recorded requests and queued scenarios (request numbers keep counting)."""
        with self._lock:
            self._requests.clear()
            self._queue.clear()

    # -- request handling (called from handler threads) -------------------------------

    def _admit(self, request: RecordedRequest) -> tuple[RecordedRequest, str | None]:
        """Number, validate and record a request, and pick the scenario that answers it.

        Returns:
            The recorded request and, when a shape rule rejected it, the error message.
        """
        rejection = None
        answerable = request.provider is not None and isinstance(request.body, dict)
        if answerable and request.provider is not None:
            rejection = first_violation(self.shape_rules, request.provider, request.body)
        with self._lock:
            self._received += 1
            request = dataclasses.replace(request, number=self._received)
            if rejection is not None:
                request = dataclasses.replace(request, rejected_by=rejection[0].name)
            elif answerable and request.provider is not None:
                scenario = self._take(request.provider)
                if scenario is None:
                    scenario = self._answer_by_default(request)
                request = dataclasses.replace(request, scenario=scenario)
            self._requests.append(request)
        return request, rejection[1] if rejection is not None else None

    def _record_error(self, error: Exception) -> None:
        with self._lock:
            self._errors.append(error)

    def _answer_by_default(self, request: RecordedRequest) -> Scenario:
        default = self._default
        if isinstance(default, Scenario):
            return default
        try:
            scenario = default(request)
        except Exception as exc:
            logger.exception("the loopback provider's default responder failed")
            message = f"loopback provider: the default responder raised {exc!r}"
            return Scenario(name="responder-error", fault=Fault.http_error(500, message=message))
        if not isinstance(scenario, Scenario):
            message = (
                f"loopback provider: the default responder returned {scenario!r}; "
                "it must return a Scenario"
            )
            return Scenario(name="responder-error", fault=Fault.http_error(500, message=message))
        return scenario

    def _keep(self, response: BackgroundResponse) -> None:
        with self._lock:
            self._background[response.id] = response

    def _find(self, response_id: str) -> BackgroundResponse | None:
        """A kept background response, or ``None`` when unknown or expired."""
        with self._lock:
            response = self._background.get(response_id)
            if response is None:
                return None
            if self.clock() - response.created_at > self.background_ttl:
                del self._background[response_id]
                return None
            return response

    def _take(self, provider: Provider) -> Scenario | None:
        for i, scenario in enumerate(self._queue):
            if scenario.provider in (None, provider):
                return self._queue.pop(i)
        return None

    def _register(self, connection: socket.socket) -> None:
        with self._lock:
            self._connections[connection] = threading.current_thread()

    def _unregister(self, connection: socket.socket) -> None:
        with self._lock:
            self._connections.pop(connection, None)

    def _hung_up(self, number: int) -> None:
        with self._lock:
            self._hangups[number] = time.monotonic()

    def _wait(self, seconds: float) -> bool:
        """Sleep ``seconds``; return False if the server began stopping meanwhile."""
        return not self._stopping.wait(seconds) if seconds > 0 else not self._stopping.is_set()


# -- HTTP plumbing --------------------------------------------------------------------


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # many streams connect at once in concurrency runs

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        provider: LoopbackProvider,
    ) -> None:
        self.provider = provider
        super().__init__(address, handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Log a failed connection instead of printing a traceback to stderr."""
        error = sys.exc_info()[1]
        if isinstance(error, ConnectionError | TimeoutError):
            # Clients reset pooled connections and abandon streams: that is normal here.
            logger.debug("connection from %s ended: %r", client_address, error)
        else:
            logger.error("error answering %s", client_address, exc_info=error)
            if isinstance(error, Exception):
                self.provider._record_error(error)


_PORTS_USED: set[tuple[str, int]] = set()
_PORTS_LOCK = threading.Lock()


def _bind(host: str, port: int, provider: LoopbackProvider) -> _HTTPServer:
    """A listening server on ``port``, or on a port no earlier server here used (``0``).

    The kernel hands out ports of closed servers again. langchain-openai and
    langchain-anthropic keep one HTTP client per base URL for the whole process,
    so a model built for a new server on an old server's port would get the old
    client, whose pooled connections may belong to an event loop that is closed:
    its first request would fail before reaching the new server.
    """
    rejected: list[_HTTPServer] = []
    try:
        while True:
            server = _HTTPServer((host, port), _Handler, provider)
            address = (host, server.server_address[1])
            with _PORTS_LOCK:
                if port or address not in _PORTS_USED or len(rejected) >= 64:
                    _PORTS_USED.add(address)
                    return server
            rejected.append(server)  # held open, so the kernel offers another port
    finally:
        for server in rejected:
            server.server_close()


@dataclass(frozen=True)
class _Write:
    data: bytes


@dataclass(frozen=True)
class _Pause:
    seconds: float


@dataclass(frozen=True)
class _Drop:
    reset: bool


_Step = _Write | _Pause | _Drop


def plan_stream(
    frames: Sequence[Frame],
    fault: Fault | None,
    *,
    delay: float = 0.0,
    extra: Frame | None = None,
    keepalive: Frame | None = None,
) -> list[_Step]:
    """Turn rendered SSE frames and a fault into the exact steps sent on the wire.

    Args:
        frames: The complete response, as rendered.
        fault: The fault to apply, if any.
        delay: Seconds to pause between events.
        extra: The error or malformed frame for ``ERROR_EVENT``/``MALFORMED_SSE``.
        keepalive: The frame sent during a stall with ``Fault.keepalive`` set.

    Returns:
        Body writes, pauses and at most one final drop. A plan without a drop
        ends the body cleanly.
    """
    kind = fault.kind if fault is not None else None
    count = fault.count if fault is not None and fault.count is not None else 0
    tail: list[_Step] = []
    sent: list[Frame]
    if kind is FaultKind.DROP_AFTER_EVENTS:
        sent = list(frames[:count])
        tail = [_Drop(fault.reset if fault else False)]
    elif kind is FaultKind.DROP_AFTER_BYTES:
        sent, budget = [], count
        for frame in frames:
            if budget <= 0:
                break
            sent.append(Frame(frame.data[:budget], frame.terminal))
            budget -= len(frame.data)
        tail = [_Drop(fault.reset if fault else False)]
    elif kind in (*_ERROR_EVENT_KINDS, FaultKind.MALFORMED_SSE):
        assert extra is not None, "an error or malformed frame is required"
        sent = [*frames[:count], extra]
    elif kind is FaultKind.NO_TERMINAL_EVENT:
        if fault is not None and fault.count is None:
            sent = [frame for frame in frames if not frame.terminal]
        else:
            sent = list(frames[:count])
    else:
        sent = list(frames)
    stall = _stall_steps(fault, keepalive) if kind is FaultKind.STALL else []
    steps: list[_Step] = []
    for i, frame in enumerate(sent):
        if i and delay:
            steps.append(_Pause(delay))
        if i == count:
            steps.extend(stall)
        steps.append(_Write(frame.data))
    if count >= len(sent):
        steps.extend(stall)
    return steps + tail


def _stall_steps(fault: Fault | None, keepalive: Frame | None) -> list[_Step]:
    """A stall's pause, split by keep-alive writes when the fault asks for them."""
    if fault is None:
        return []
    if fault.keepalive is None or keepalive is None:
        return [_Pause(fault.seconds)]
    steps: list[_Step] = []
    remaining = fault.seconds
    while remaining > fault.keepalive:
        steps += [_Pause(fault.keepalive), _Write(keepalive.data)]
        remaining -= fault.keepalive
    return [*steps, _Pause(remaining)]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HTTPServer
    _status_sent = False
    server_version = "loopback-provider"

    @property
    def provider(self) -> LoopbackProvider:
        return self.server.provider

    def setup(self) -> None:
        super().setup()
        # Events are small writes: send each at once, as streaming servers do.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.provider._register(self.connection)

    def finish(self) -> None:
        self.provider._unregister(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        # Query strings can carry credentials (Azure's ``api-key``): never log them.
        shown = [_QUERY.sub("", arg) if isinstance(arg, str) else arg for arg in args]
        logger.debug("%s " + format, self.address_string(), *shown)

    def do_POST(self) -> None:
        self._status_sent = False
        try:
            self._handle()
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            # The client went away (for example after a read timeout): nothing to answer.
            self.close_connection = True
        except Exception as error:
            # A bug in the server, a responder or a shape rule: make it loud.
            path = urlsplit(self.path).path  # without the query string, which can hold a key
            logger.error("error answering %s %s", self.command, path, exc_info=error)
            self.provider._record_error(error)
            if self._status_sent:
                self._drop(reset=False)
            else:
                message = f"the loopback provider failed: {error!r}"
                body = {"error": {"message": message, "type": "server_error"}}
                self._send_json(500, body)
                self.close_connection = True

    def send_response(self, code: int, message: str | None = None) -> None:
        self._status_sent = True
        super().send_response(code, message)

    do_GET = do_PUT = do_DELETE = do_PATCH = do_POST

    # -- one request ------------------------------------------------------------------

    def _handle(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body: Any = json.loads(raw) if raw else None
        except (json.JSONDecodeError, UnicodeDecodeError):
            body = None
        parts = urlsplit(self.path)
        route = _background_route(parts.path)
        if route is not None:
            self._background(route, parts.query)
            return
        provider = _provider_for(self.command, parts.path)
        request, rejection = self.provider._admit(
            RecordedRequest(
                number=0,
                method=self.command,
                path=parts.path,
                query=parts.query,
                headers={k.lower(): v for k, v in self.headers.items()},
                raw_body=raw,
                body=body,
                provider=provider,
                received_at=time.monotonic(),
            )
        )
        request_id = f"req_loopback_{request.number}"
        if provider is None:
            message = f"Unknown request URL: {self.command} {parts.path}."
            self._send_json(404, error_body("openai", 404, request_id=request_id, message=message))
            return
        if not isinstance(body, dict):
            message = "The request body is not a JSON object."
            self._send_json(400, error_body(provider, 400, request_id=request_id, message=message))
            return
        if rejection is not None:
            self._send_json(
                400, error_body(provider, 400, request_id=request_id, message=rejection), provider
            )
            return
        assert request.scenario is not None
        self._answer(request, provider, request.scenario, body)

    def _answer(
        self, request: RecordedRequest, provider: Provider, scenario: Scenario, body: Any
    ) -> None:
        ctx = ResponseContext(
            number=request.number,
            model=scenario.model or str(body.get("model") or "loopback"),
            usage=estimate_usage(body, scenario),
            include_usage=provider == "openai"
            and bool((body.get("stream_options") or {}).get("include_usage")),
            request=body,
        )
        fault = scenario.fault
        headers = {**_request_id_header(provider, ctx.request_id), **scenario.headers}
        if fault is not None:
            headers.update(fault.headers)
        kind = fault.kind if fault is not None else None
        logger.debug("request %d (%s) answered by %r", request.number, provider, scenario)

        if kind is FaultKind.DROP_BEFORE_HEADERS:
            self._drop(fault.reset if fault else False)
            return
        if fault is not None and kind is FaultKind.HTTP_ERROR:
            error = error_body(
                provider,
                fault.status,
                request_id=ctx.request_id,
                error_type=fault.error_type,
                message=fault.message,
                code=fault.code,
            )
            self._send_json(fault.status, error, provider, headers)
            return
        kept = None
        if provider == "openai-responses" and body.get("background") is True:
            if body.get("store") is False:
                message = "Background mode requires `store` to be true."
                error = error_body(provider, 400, request_id=ctx.request_id, message=message)
                self._send_json(400, error, provider, headers)
                return
            kept = BackgroundResponse(
                id=ctx.response_id,
                number=request.number,
                frames=responses_frames(scenario, ctx),
                scenario=scenario,
                ctx=ctx,
                created_at=self.provider.clock(),
                started=time.monotonic(),
            )
            self.provider._keep(kept)
        if request.stream:
            self._stream(provider, scenario, ctx, headers, kept)
        else:
            self._complete(provider, scenario, ctx, headers)

    def _background(self, route: tuple[str, str], query: str) -> None:
        """Answer a retrieval or a cancel of a background response."""
        request, _ = self.provider._admit(
            RecordedRequest(
                number=0,
                method=self.command,
                path=urlsplit(self.path).path,
                query=query,
                headers={k.lower(): v for k, v in self.headers.items()},
                raw_body=b"",
                body=None,
                provider=None,
                received_at=time.monotonic(),
            )
        )
        response_id, action = route
        request_id = f"req_loopback_{request.number}"
        kept = self.provider._find(response_id)
        if kept is None or (self.command, action) not in (("GET", ""), ("POST", "cancel")):
            message = f"Response with id '{response_id}' not found."
            body = error_body("openai-responses", 404, request_id=request_id, message=message)
            self._send_json(404, body, "openai-responses")
            return
        headers = _request_id_header("openai-responses", request_id)
        if action == "cancel":
            if kept.status == "in_progress":
                kept.status = "cancelled"
            if not self._pause(kept.scenario.cancel_delay, request.number):
                return  # the client gave up waiting, or the server stops
            self._send_json(200, self._state(kept), "openai-responses", headers)
            return
        params = parse_qs(query)
        if params.get("stream", ["false"])[0] != "true":
            self._send_json(200, self._state(kept), "openai-responses", headers)
            return
        after = int(params.get("starting_after", ["-1"])[0])
        faults = kept.scenario.resume_faults
        fault = faults[kept.retrievals] if kept.retrievals < len(faults) else None
        kept.retrievals += 1
        if fault is not None and fault.kind is FaultKind.HTTP_ERROR:
            error = error_body(
                "openai-responses",
                fault.status,
                request_id=request_id,
                error_type=fault.error_type,
                message=fault.message,
                code=fault.code,
            )
            self._send_json(fault.status, error, "openai-responses", headers)
            return
        frames = [] if kept.status == "cancelled" else kept.frames[after + 1 :]
        steps = _generated_pace(plan_stream(frames, fault), kept, after + 1)
        self._send_frames(steps, headers, kept.ctx.number, kept)

    @staticmethod
    def _state(kept: BackgroundResponse) -> dict[str, Any]:
        """The response object of a background response as it stands."""
        if kept.status in ("completed", "incomplete"):
            return responses_object(kept.scenario, kept.ctx)
        return responses_object(kept.scenario, kept.ctx, status=kept.status, output=[])

    def _stream(
        self,
        provider: Provider,
        scenario: Scenario,
        ctx: ResponseContext,
        headers: Mapping[str, str],
        kept: BackgroundResponse | None = None,
    ) -> None:
        fault = scenario.fault
        frames = kept.frames if kept is not None else _RENDER_STREAM[provider](scenario, ctx)
        extra = None
        if fault is not None and fault.kind in _ERROR_EVENT_KINDS:
            error_type = stream_error_type(provider, fault.error_type)
            message = fault.message or _STREAM_ERROR_MESSAGES.get(error_type, error_type)
            sequence_number = min(fault.count or 0, len(frames))
            if provider == "openai-responses" and fault.kind is FaultKind.RESPONSE_FAILED:
                extra = responses_failed_frame(
                    scenario, ctx, code=error_type, message=message, sequence_number=sequence_number
                )
            else:
                body = error_body(
                    provider, 200, request_id=ctx.request_id, error_type=error_type, message=message
                )
                extra = error_frame(provider, body, sequence_number=sequence_number)
        elif fault is not None and fault.kind is FaultKind.MALFORMED_SSE:
            extra = malformed_frame(provider)
        if kept is not None:  # generated on the provider's schedule, read or not
            steps = plan_stream(frames, fault, extra=extra, keepalive=keepalive_frame(provider))
            steps = _generated_pace(steps, kept, 0)
        else:
            steps = plan_stream(
                frames,
                fault,
                delay=scenario.delay,
                extra=extra,
                keepalive=keepalive_frame(provider),
            )
        self._send_frames(steps, headers, ctx.number, kept)

    def _send_frames(
        self,
        steps: Sequence[_Step],
        headers: Mapping[str, str],
        number: int,
        kept: BackgroundResponse | None = None,
    ) -> None:
        """Send a planned SSE body; a background response whose end is read is done."""
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        last = kept.frames[-1].data if kept is not None and kept.frames else None
        for step in steps:
            if isinstance(step, _Pause):
                if not self._pause(step.seconds, number):
                    self._drop(reset=False)
                    return
            elif isinstance(step, _Write):
                if step.data:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(step.data), step.data))
                if kept is not None and step.data == last and kept.status == "in_progress":
                    kept.status = "incomplete" if b"response.incomplete" in last else "completed"
            else:
                self._drop(step.reset)
                return
        self.wfile.write(b"0\r\n\r\n")

    def _pause(self, seconds: float, number: int) -> bool:
        """Pause a stream; False when the server stops or the client hangs up meanwhile."""
        deadline = time.monotonic() + seconds
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                readable, _, _ = select.select([self.connection], [], [], min(remaining, 0.05))
                hung_up = bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
            except (OSError, ValueError):
                hung_up = True  # reset, or closed under us
            if hung_up:
                self.provider._hung_up(number)
                return False
            if readable:  # the client sent more bytes: nothing to watch, just wait
                return self.provider._wait(remaining)
            if self.provider._stopping.is_set():
                return False
        return not self.provider._stopping.is_set()

    def _complete(
        self,
        provider: Provider,
        scenario: Scenario,
        ctx: ResponseContext,
        headers: Mapping[str, str],
    ) -> None:
        fault = scenario.fault
        kind = fault.kind if fault is not None else None
        terminal = kind is not FaultKind.NO_TERMINAL_EVENT
        try:
            if provider == "openai":
                payload = openai_completion(scenario, ctx, terminal=terminal)
            elif provider == "openai-responses":
                payload = responses_object(
                    scenario, ctx, status=None if terminal else "in_progress"
                )
            else:
                payload = anthropic_message(scenario, ctx, terminal=terminal)
        except ValueError as exc:
            body = error_body(provider, 500, request_id=ctx.request_id, message=str(exc))
            self._send_json(500, body, provider, headers)
            return
        if fault is not None and kind in _ERROR_EVENT_KINDS:
            # A non-streamed request cannot carry an SSE event: the same failure
            # arrives as the HTTP status the provider uses for that error type.
            error_type = stream_error_type(provider, fault.error_type)
            status = status_for_error_type(error_type)
            message = fault.message or _STREAM_ERROR_MESSAGES.get(error_type)
            payload = error_body(
                provider,
                status,
                request_id=ctx.request_id,
                error_type=error_type,
                message=message,
                code=fault.code,
            )
            self._send_json(status, payload, provider, headers)
            return
        data = json.dumps(payload, separators=(",", ":")).encode()
        if fault is not None and kind is FaultKind.STALL and not self.provider._wait(fault.seconds):
            self._drop(reset=False)
            return
        cut: int | None = None
        if fault is not None and kind is FaultKind.DROP_AFTER_BYTES:
            cut = min(fault.count or 0, len(data) - 1)
        elif kind is FaultKind.DROP_AFTER_EVENTS:
            cut = len(data) // 2
        elif kind is FaultKind.MALFORMED_SSE:
            data = data[: len(data) // 2]
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        if cut is None:
            self.wfile.write(data)
            return
        self.wfile.write(data[:cut])
        self._drop(fault.reset if fault is not None else False)

    # -- low-level writes -------------------------------------------------------------

    def _send_json(
        self,
        status: int,
        payload: Any,
        provider: Provider | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        data = json.dumps(payload, separators=(",", ":")).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        if provider is not None and headers is None:
            headers = _request_id_header(provider, _request_id_of(payload))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _drop(self, reset: bool) -> None:
        """Close the TCP connection now, with a FIN (or a RST when ``reset``)."""
        self.close_connection = True
        if reset:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            for stream in (self.rfile, self.wfile):
                with contextlib.suppress(OSError):
                    stream.close()
            self.connection.close()
            # The request loop still flushes and closes its streams: give it inert ones.
            self.rfile, self.wfile = io.BytesIO(), io.BytesIO()
        else:
            _shutdown_quietly(self.connection)


_RENDER_STREAM: dict[Provider, Callable[[Scenario, ResponseContext], list[Frame]]] = {
    "openai": openai_frames,
    "openai-responses": responses_frames,
    "anthropic": anthropic_frames,
}
_ERROR_EVENT_KINDS = (FaultKind.ERROR_EVENT, FaultKind.RESPONSE_FAILED)

_STREAM_ERROR_MESSAGES = {
    "overloaded_error": "Overloaded",
    "server_error": "The server had an error while processing your request. Sorry about that!",
    "api_error": "Internal server error",
    "rate_limit_exceeded": "Rate limit reached for requests.",
}


_ERROR_TYPE_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "requests": 429,
    "rate_limit_exceeded": 429,
    "overloaded_error": 529,
    "timeout_error": 504,
}


def status_for_error_type(error_type: str) -> int:
    """The HTTP status a provider answers with for ``error_type`` (500 when unknown)."""
    return _ERROR_TYPE_STATUS.get(error_type, 500)


def _provider_for(method: str, path: str) -> Provider | None:
    path = path.rstrip("/")
    if method != "POST":
        return None
    if path.endswith("/chat/completions"):
        return "openai"
    if path.endswith("/v1/messages"):
        return "anthropic"
    if path.endswith("/v1/responses"):
        return "openai-responses"
    return None


def _generated_pace(steps: list[_Step], kept: BackgroundResponse, first: int) -> list[_Step]:
    """Hold back each frame of a retrieval until the response has generated it."""
    delay = kept.scenario.delay
    if not delay:
        return steps
    paced: list[_Step] = []
    at, number = time.monotonic(), first
    for step in steps:
        if isinstance(step, _Write):
            ready = kept.started + number * delay
            if ready > at:
                paced.append(_Pause(ready - at))
                at = ready
            number += 1
        paced.append(step)
    return paced


_BACKGROUND_PATH = re.compile(r"/v1/responses/(?P<id>[^/]+)(?:/(?P<action>cancel))?/?$")


def _background_route(path: str) -> tuple[str, str] | None:
    """``(response id, "" or "cancel")`` for a retrieval or cancel path, else ``None``."""
    match = _BACKGROUND_PATH.search(path)
    if match is None:
        return None
    return match["id"], match["action"] or ""


def _request_id_header(provider: Provider, request_id: str) -> dict[str, str]:
    return {"x-request-id" if is_openai(provider) else "request-id": request_id}


def _request_id_of(payload: Any) -> str:
    if isinstance(payload, dict) and isinstance(payload.get("request_id"), str):
        return str(payload["request_id"])
    return "req_loopback"


def _shutdown_quietly(connection: socket.socket) -> None:
    with contextlib.suppress(OSError):
        connection.shutdown(socket.SHUT_RDWR)


def _last_text(messages: Sequence[Mapping[str, Any]], role: str, joiner: str) -> str:
    """The text of the last message with ``role`` (string or text-block content)."""
    for message in reversed(messages):
        if message.get("role") != role:
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            texts = [
                str(block.get("text", ""))
                for block in content
                if isinstance(block, Mapping) and block.get("type") in _TEXT_PARTS
            ]
            return joiner.join(texts)
        return ""
    return ""


_TEXT_PARTS = ("text", "input_text", "output_text")
"""Content part types holding text (Chat Completions/Anthropic, Responses input and output)."""


def _responses_messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A Chat-Completions-like view of a Responses API request's instructions and input."""
    messages: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str):
        messages.append({"role": "system", "content": body["instructions"]})
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, Mapping):
            continue
        kind = item.get("type", "message")
        if kind == "message" and "role" in item:
            messages.append({"role": item["role"], "content": item.get("content")})
        elif kind == "function_call":
            function = {"name": item.get("name"), "arguments": item.get("arguments")}
            call = {"id": item.get("call_id"), "type": "function", "function": function}
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append(
                {"role": "tool", "tool_call_id": item.get("call_id"), "content": output}
            )
    return messages


def _last_user_text(messages: Sequence[Mapping[str, Any]]) -> str:
    return _last_text(messages, "user", " ")


def _last_assistant_text(messages: Sequence[Mapping[str, Any]]) -> str:
    return _last_text(messages, "assistant", "")


# -- command line ---------------------------------------------------------------------


_CLI_FAULTS: dict[str, Callable[[argparse.Namespace], Fault]] = {
    "drop": lambda a: Fault.drop_after_events(a.fault_after_events),
    "reset": lambda a: Fault.drop_after_events(a.fault_after_events, reset=True),
    "drop-before-headers": lambda a: Fault.drop_before_headers(),
    "error-event": lambda a: Fault.error_event(after_events=a.fault_after_events),
    "no-terminal": lambda a: Fault.no_terminal_event(after_events=a.fault_after_events),
    "stall": lambda a: Fault.stall(a.stall_seconds, after_events=a.fault_after_events),
    "malformed": lambda a: Fault.malformed_sse(after_events=a.fault_after_events),
    "rate-limit": lambda a: Fault.rate_limited(retry_after=1),
    "overloaded": lambda a: Fault.overloaded(),
    "server-error": lambda a: Fault.server_error(500),
}


def _cli_default(args: argparse.Namespace) -> Scenario | Responder:
    base: Scenario | Responder = continuation_responder(
        Scenario(text=args.text, chunk_size=args.chunk_size, delay=args.delay),
        overlap_words=args.overlap_words,
    )
    if args.echo:
        echo = echo_responder(chunk_size=args.chunk_size)

        def respond(request: RecordedRequest) -> Scenario:
            return dataclasses.replace(echo(request), delay=args.delay)

        base = respond
    if args.fault is None:
        return base
    return periodic_fault(base, _CLI_FAULTS[args.fault](args), every=args.fault_every)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the loopback provider until interrupted (SIGINT or SIGTERM).

    Prints one line with the base URLs once the port is bound, so a parent
    process can read where to connect.

    Args:
        argv: Command-line arguments (defaults to ``sys.argv[1:]``).

    Returns:
        The process exit status.
    """
    parser = argparse.ArgumentParser(
        prog="python -m awaken_langchain.testing.server",
        description="Loopback OpenAI- and Anthropic-compatible streaming server.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port; 0 picks a free one")
    parser.add_argument(
        "--text",
        default=DEFAULT_ANSWER,
        help="the answer to every request; a continuation request gets the rest of it",
    )
    parser.add_argument(
        "--overlap-words", type=int, default=0, help="words a continuation repeats at the seam"
    )
    parser.add_argument("--echo", action="store_true", help="answer with the last user message")
    parser.add_argument("--chunk-size", type=int, default=4, help="characters per delta")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds between events")
    parser.add_argument("--fault", choices=sorted(_CLI_FAULTS), help="fault to inject")
    parser.add_argument(
        "--fault-every", type=int, default=1, help="inject the fault on every Nth request"
    )
    parser.add_argument(
        "--fault-after-events", type=int, default=3, help="events sent before the fault"
    )
    parser.add_argument("--stall-seconds", type=float, default=5.0, help="length of a stall")
    args = parser.parse_args(argv)
    if args.fault_every < 1 or args.chunk_size < 1:
        parser.error("--fault-every and --chunk-size must be >= 1")
    if args.fault_after_events < 0 or args.overlap_words < 0:
        parser.error("--fault-after-events and --overlap-words must be >= 0")

    done = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    with LoopbackProvider(default=_cli_default(args), host=args.host, port=args.port) as server:
        print(
            f"loopback provider listening: openai={server.base_url_openai} "
            f"anthropic={server.base_url_anthropic}",
            flush=True,
        )
        while not done.wait(0.2):
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
