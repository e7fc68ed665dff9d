"""Scripted responses and faults for the loopback provider server.

A :class:`Scenario` says what one request is answered with (text, tool calls,
usage, how finely it is streamed, how fast) and, optionally, which
:class:`Fault` breaks the answer. Everything here is plain, immutable data: the
wire format for each provider is rendered from it in ``_wire``.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from email.utils import format_datetime
from typing import Any, Literal

Provider = Literal["openai", "anthropic", "openai-responses"]
"""The wire format of a request: OpenAI Chat Completions, Anthropic Messages or
the OpenAI Responses API."""

PROVIDERS: tuple[Provider, ...] = ("openai", "anthropic", "openai-responses")


def is_openai(provider: Provider | None) -> bool:
    """Whether ``provider`` is one of OpenAI's wire formats (same error bodies and ids)."""
    return provider in ("openai", "openai-responses")


@dataclass(frozen=True)
class TokenUsage:
    """Token counts a scripted response reports.

    Attributes:
        input_tokens: Prompt tokens (OpenAI ``prompt_tokens``).
        output_tokens: Generated tokens (OpenAI ``completion_tokens``).
    """

    input_tokens: int
    output_tokens: int

    def __post_init__(self) -> None:
        if self.input_tokens < 0 or self.output_tokens < 0:
            raise ValueError(
                f"TokenUsage counts must be >= 0, got input_tokens={self.input_tokens}, "
                f"output_tokens={self.output_tokens}"
            )


@dataclass(frozen=True)
class ScriptedToolCall:
    """One tool call in a scripted response.

    Attributes:
        name: The tool name.
        arguments: The arguments. A mapping is encoded as compact JSON and split
            into fragments of the scenario's ``chunk_size``; a string is sent as
            is (it may be deliberately invalid JSON) and split the same way; a
            sequence of strings gives the exact fragments to stream.
        id: The call id. ``None`` lets the server number it
            (``call_<request>_<n>`` for OpenAI, ``toolu_<request>_<n>`` for
            Anthropic).
    """

    name: str
    arguments: Mapping[str, Any] | str | Sequence[str] = field(default_factory=dict)
    id: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.arguments, Mapping):
            try:
                self.arguments_json  # noqa: B018 - encode once to fail early
            except (TypeError, ValueError) as exc:
                raise ValueError(
                    f"tool call {self.name!r}: arguments must be JSON-serialisable ({exc}); "
                    "pass a JSON string to script arbitrary argument text"
                ) from exc
        elif not isinstance(self.arguments, str):
            object.__setattr__(self, "arguments", tuple(self.arguments))

    @property
    def arguments_json(self) -> str:
        """The complete argument text, as the client reassembles it."""
        if isinstance(self.arguments, str):
            return self.arguments
        if isinstance(self.arguments, Mapping):
            return json.dumps(dict(self.arguments), separators=(",", ":"))
        return "".join(self.arguments)


@dataclass(frozen=True)
class ScriptedThinking:
    """One reasoning block in a scripted response, sent before the text.

    Anthropic renders it as a ``thinking`` block (``thinking_delta`` events and a
    ``signature_delta`` at its end) or, when ``redacted``, a
    ``redacted_thinking`` block whose ``data`` is opaque. The Responses API
    renders it as a ``reasoning`` item whose summary is ``text``, with
    ``encrypted_content`` when the request's ``include`` asks for it. Chat
    Completions has no such block and ignores it. Signatures, redacted data and
    encrypted content are sealed with a key only the loopback server knows, so
    the server can tell a block sent back unmodified from one that was edited.

    Attributes:
        text: The thinking text (a reasoning summary on the Responses API).
            A string is split into pieces of the scenario's ``chunk_size``; a
            sequence of strings gives the exact pieces.
        redacted: Send an Anthropic ``redacted_thinking`` block (and a
            reasoning item without summary on the Responses API).
    """

    text: str | Sequence[str] = ""
    redacted: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.text, str):
            object.__setattr__(self, "text", tuple(self.text))

    @property
    def full_text(self) -> str:
        """The complete thinking text."""
        return self.text if isinstance(self.text, str) else "".join(self.text)

    def pieces(self, size: int) -> list[str]:
        """The thinking deltas to stream, in order."""
        if isinstance(self.text, str):
            return split(self.text, size)
        return [piece for piece in self.text if piece]


@dataclass(frozen=True)
class ScriptedCitation:
    """A web citation of a span of the scripted answer text.

    Anthropic renders the cited span as its own text block carrying a
    ``web_search_result_location`` citation (a ``citations_delta`` event when
    streamed); the Responses API adds a ``url_citation`` annotation to the
    ``output_text`` part (``response.output_text.annotation.added`` when
    streamed). Chat Completions ignores it.

    Attributes:
        start: First character of the cited span in the scenario's full text.
        end: End of the span (exclusive).
        url: The cited page.
        title: The page title.
    """

    start: int
    end: int
    url: str
    title: str = ""

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end:
            raise ValueError(
                f"ScriptedCitation needs 0 <= start < end, got start={self.start}, end={self.end}"
            )


@dataclass(frozen=True)
class ScriptedWebSearch:
    """A web search the provider runs itself (a server tool), before the text.

    Anthropic renders a ``server_tool_use`` block (``web_search``, its
    ``query`` streamed as ``input_json_delta``) and a ``web_search_tool_result``
    block listing the results; the Responses API a ``web_search_call`` item
    (``response.web_search_call.in_progress``/``searching``/``completed``
    events). Chat Completions ignores it.

    Attributes:
        query: The search query.
        results: ``(url, title)`` of each result.
    """

    query: str
    results: Sequence[tuple[str, str]] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "results", tuple(tuple(r) for r in self.results))


class FaultKind(enum.Enum):
    """What goes wrong with a response. Build faults with the :class:`Fault` constructors."""

    HTTP_ERROR = "http_error"
    """Answer with an HTTP error status and a provider-style error JSON body."""
    DROP_BEFORE_HEADERS = "drop_before_headers"
    """Read the request, then close the connection without sending anything."""
    DROP_AFTER_BYTES = "drop_after_bytes"
    """Send the headers and the first ``count`` body bytes, then close the connection."""
    DROP_AFTER_EVENTS = "drop_after_events"
    """Send the headers and the first ``count`` SSE events, then close the connection."""
    ERROR_EVENT = "error_event"
    """Send ``count`` events, then an SSE ``error`` event, then end the body."""
    NO_TERMINAL_EVENT = "no_terminal_event"
    """End the body cleanly but without the terminal events."""
    STALL = "stall"
    """Send ``count`` events, wait ``seconds``, then send the rest."""
    MALFORMED_SSE = "malformed_sse"
    """Send ``count`` events, then an event whose data is not valid JSON, then end the body."""
    RESPONSE_FAILED = "response_failed"
    """Responses API: send ``count`` events, then ``response.failed``, then end the body."""


@dataclass(frozen=True)
class Fault:
    """A failure injected into one response.

    Use the class-method constructors rather than the raw fields; each one
    documents how the fault appears on the wire and what the official SDKs
    raise for it.

    Attributes:
        kind: What goes wrong.
        status: HTTP status for :attr:`FaultKind.HTTP_ERROR`.
        error_type: Provider error ``type`` for HTTP errors and SSE error
            events; ``None`` picks the provider's usual type for the status.
        message: Error message; ``None`` picks a provider-like default.
        code: OpenAI error ``code`` (for example ``context_length_exceeded``).
        count: Events or bytes sent before the fault (meaning depends on kind).
        seconds: Stall length for :attr:`FaultKind.STALL`.
        keepalive: Seconds between keep-alive events during a stall, if any.
        headers: Extra response headers (``retry-after``, ``x-should-retry``...).
        reset: Close a dropped connection with a TCP reset instead of a FIN.
    """

    kind: FaultKind
    status: int = 200
    error_type: str | None = None
    message: str | None = None
    code: str | None = None
    count: int | None = None
    seconds: float = 0.0
    keepalive: float | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    reset: bool = False

    def __post_init__(self) -> None:
        if self.count is not None and self.count < 0:
            raise ValueError(f"Fault count must be >= 0, got {self.count}")
        if self.seconds < 0:
            raise ValueError(f"Fault seconds must be >= 0, got {self.seconds}")
        if self.kind is FaultKind.HTTP_ERROR and not 400 <= self.status <= 599:
            raise ValueError(f"an HTTP error fault needs a 4xx/5xx status, got {self.status}")

    # -- HTTP errors -------------------------------------------------------------------

    @classmethod
    def http_error(
        cls,
        status: int,
        *,
        error_type: str | None = None,
        message: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Fault:
        """Answer with ``status`` and a provider-style error body.

        The body is ``{"error": {"type", "message", "param", "code"}}`` for OpenAI
        and ``{"type": "error", "error": {"type", "message"}, "request_id"}`` for
        Anthropic. ``error_type`` defaults to what the provider sends for the
        status (for example ``overloaded_error`` for an Anthropic 529).

        Args:
            status: Any 4xx or 5xx status (400, 401, 403, 404, 413, 429, 500,
                502, 503, 529...).
            error_type: Provider error type; ``None`` picks the usual one.
            message: Error message; ``None`` picks a default.
            code: OpenAI error ``code``.
            headers: Extra response headers.

        Returns:
            The fault.
        """
        return cls(
            FaultKind.HTTP_ERROR,
            status=status,
            error_type=error_type,
            message=message,
            code=code,
            headers=dict(headers or {}),
        )

    @classmethod
    def rate_limited(
        cls,
        *,
        retry_after: float | datetime | None = None,
        retry_after_ms: int | None = None,
        message: str | None = None,
    ) -> Fault:
        """Answer HTTP 429 with optional retry hints.

        Args:
            retry_after: ``retry-after`` header: seconds (a number) or an
                HTTP date (an aware :class:`~datetime.datetime`).
            retry_after_ms: ``retry-after-ms`` header, in milliseconds.
            message: Error message; ``None`` picks a default.

        Returns:
            The fault.
        """
        headers: dict[str, str] = {}
        if isinstance(retry_after, datetime):
            if retry_after.tzinfo is None:
                raise ValueError("retry_after as a datetime must be timezone-aware")
            headers["retry-after"] = format_datetime(retry_after, usegmt=True)
        elif retry_after is not None:
            headers["retry-after"] = _format_seconds(retry_after)
        if retry_after_ms is not None:
            headers["retry-after-ms"] = str(int(retry_after_ms))
        return cls.http_error(429, message=message, headers=headers)

    @classmethod
    def overloaded(cls, *, status: int = 529, headers: Mapping[str, str] | None = None) -> Fault:
        """Answer with the provider's overload error before the stream starts.

        Anthropic sends 529 ``overloaded_error``; for OpenAI requests the same
        status is answered with a ``server_error`` body.

        Args:
            status: 529 by default; 503 is also common.
            headers: Extra response headers.

        Returns:
            The fault.
        """
        return cls.http_error(status, headers=headers)

    @classmethod
    def server_error(cls, status: int = 500, *, headers: Mapping[str, str] | None = None) -> Fault:
        """Answer with a 5xx server error (500, 502, 503...).

        Args:
            status: The 5xx status.
            headers: Extra response headers.

        Returns:
            The fault.
        """
        if not 500 <= status <= 599:
            raise ValueError(f"server_error needs a 5xx status, got {status}")
        return cls.http_error(status, headers=headers)

    @classmethod
    def context_overflow(cls) -> Fault:
        """Answer 400 the way each provider reports a prompt longer than the context window.

        Returns:
            The fault.
        """
        return cls.http_error(400, code="context_length_exceeded", message=_CONTEXT_OVERFLOW)

    # -- connection faults -----------------------------------------------------------

    @classmethod
    def drop_before_headers(cls, *, reset: bool = False) -> Fault:
        """Close the connection after reading the request, before any response byte.

        httpx reports ``RemoteProtocolError("Server disconnected without sending
        a response.")``; the SDKs wrap it as ``APIConnectionError``.

        Args:
            reset: Close with a TCP reset instead of a FIN.

        Returns:
            The fault.
        """
        return cls(FaultKind.DROP_BEFORE_HEADERS, reset=reset)

    @classmethod
    def drop_after_bytes(cls, count: int, *, reset: bool = False) -> Fault:
        """Send the headers and ``count`` body bytes, then close the connection.

        Streams use chunked transfer encoding, so the client sees an incomplete
        body (``RemoteProtocolError``: peer closed connection without sending
        complete message body), never a clean end. A non-streamed body is cut
        after ``min(count, length - 1)`` bytes, so it is always incomplete.

        Args:
            count: Body bytes sent before the drop (SSE text, not chunk framing).
            reset: Close with a TCP reset instead of a FIN.

        Returns:
            The fault.
        """
        return cls(FaultKind.DROP_AFTER_BYTES, count=count, reset=reset)

    @classmethod
    def drop_after_events(cls, count: int, *, reset: bool = False) -> Fault:
        """Send the headers and the first ``count`` SSE events, then close the connection.

        Every SSE frame counts, including OpenAI's first role chunk and
        Anthropic's ``message_start``. A non-streamed response is cut halfway
        through its JSON body.

        Args:
            count: Events sent before the drop.
            reset: Close with a TCP reset instead of a FIN.

        Returns:
            The fault.
        """
        return cls(FaultKind.DROP_AFTER_EVENTS, count=count, reset=reset)

    # -- stream faults ---------------------------------------------------------------

    @classmethod
    def error_event(
        cls,
        *,
        after_events: int = 1,
        error_type: str | None = None,
        message: str | None = None,
    ) -> Fault:
        """Send an SSE error event inside the HTTP 200 stream, then end the body.

        Anthropic: ``event: error`` with ``{"type": "error", "error": {"type":
        "overloaded_error", ...}}`` (the SDK raises ``APIStatusError`` with
        ``status_code == 200``). OpenAI: ``data: {"error": {"type":
        "server_error", ...}}`` (the SDK raises ``APIError``). Responses API:
        ``event: error`` with ``{"type": "error", "code": "server_error", ...}``
        (the SDK yields it as a ``ResponseErrorEvent``; langchain-openai raises
        ``ValueError``). A non-streamed
        request, which cannot carry an SSE event, gets the HTTP status the
        provider uses for that error type instead (529 for
        ``overloaded_error``, 500 for ``server_error``).

        Args:
            after_events: Events sent before the error event.
            error_type: Provider error type; ``None`` gives ``overloaded_error``
                (Anthropic) or ``server_error`` (OpenAI).
            message: Error message; ``None`` picks a default.

        Returns:
            The fault.
        """
        return cls(
            FaultKind.ERROR_EVENT, count=after_events, error_type=error_type, message=message
        )

    @classmethod
    def no_terminal_event(cls, *, after_events: int | None = None) -> Fault:
        """End the body cleanly without the terminal signal.

        The stream lacks OpenAI's ``finish_reason`` chunk, usage chunk and
        ``data: [DONE]``, or Anthropic's ``message_delta`` (``stop_reason``) and
        ``message_stop``. The SDKs simply stop iterating: no error is raised. A
        non-streamed response carries ``finish_reason``/``stop_reason`` ``null``.

        Args:
            after_events: End after this many events; ``None`` sends every
                content event and omits only the terminal ones.

        Returns:
            The fault.
        """
        return cls(FaultKind.NO_TERMINAL_EVENT, count=after_events)

    @classmethod
    def stall(
        cls, seconds: float, *, after_events: int = 1, keepalive: float | None = None
    ) -> Fault:
        """Pause ``seconds`` after ``after_events`` events, then send the rest.

        The pause ends early when the server shuts down. A client read timeout
        shorter than the stall surfaces as ``ReadTimeout``/``APITimeoutError``.
        With ``keepalive``, the server keeps the connection busy during the
        pause (Anthropic ``ping`` events, SSE ``: keep-alive`` comments for
        OpenAI): the SDKs skip them, so no chunk arrives and no read timeout
        fires, which is the stall only an idle timeout on chunks can catch.
        A non-streamed response stalls before its headers (without keep-alives).

        Args:
            seconds: Length of the pause.
            after_events: Events sent before the pause.
            keepalive: Seconds between keep-alives during the pause; ``None``
                sends nothing.

        Returns:
            The fault.
        """
        if keepalive is not None and keepalive <= 0:
            raise ValueError(f"stall keepalive must be > 0 seconds, got {keepalive}")
        return cls(FaultKind.STALL, count=after_events, seconds=seconds, keepalive=keepalive)

    @classmethod
    def malformed_sse(cls, *, after_events: int = 1) -> Fault:
        """Send an event whose ``data`` is not valid JSON, then end the body.

        The SDKs raise ``json.JSONDecodeError`` while decoding it. A
        non-streamed request gets a truncated JSON body.

        Args:
            after_events: Events sent before the malformed one.

        Returns:
            The fault.
        """
        return cls(FaultKind.MALFORMED_SSE, count=after_events)

    @classmethod
    def response_failed(
        cls, *, after_events: int = 1, code: str = "server_error", message: str | None = None
    ) -> Fault:
        """Responses API: end the stream with ``response.failed`` carrying ``error.code``.

        The event is terminal (the response's ``status`` is ``failed``); the
        openai SDK yields it like any event and langchain-openai raises on it.
        On the other wires, and for a non-streamed request, it behaves like
        :meth:`error_event` with ``code`` as the error type.

        Args:
            after_events: Events sent before ``response.failed``.
            code: The ``error.code`` (``server_error``, ``rate_limit_exceeded``...).
            message: Error message; ``None`` picks a default.

        Returns:
            The fault.
        """
        return cls(
            FaultKind.RESPONSE_FAILED,
            count=after_events,
            error_type=code,
            code=code,
            message=message,
        )


@dataclass(frozen=True)
class Scenario:
    """The scripted answer to one request.

    Attributes:
        text: Assistant text. A string is split into pieces of ``chunk_size``
            characters; a sequence of strings gives the exact pieces.
        tool_calls: Tool calls, streamed after the text.
        thinking: Reasoning blocks, streamed before the text (Anthropic
            ``thinking``/``redacted_thinking``, Responses ``reasoning`` items).
        citations: Cited spans of the text, in order and not overlapping
            (Anthropic text-block ``citations``, Responses ``url_citation``
            annotations).
        web_searches: Server-side web searches, after the thinking and before
            the text (Anthropic ``server_tool_use`` + ``web_search_tool_result``,
            Responses ``web_search_call`` items).
        usage: Reported token usage; ``None`` estimates it (about four
            characters per token of the request messages and of the output).
        chunk_size: Characters per streamed text delta or argument fragment.
        delay: Seconds to wait between streamed events (interrupted on shutdown).
        stop_reason: Terminal reason; ``None`` picks ``stop``/``tool_calls``
            (OpenAI) or ``end_turn``/``tool_use`` (Anthropic). Use ``"length"``
            or ``"max_tokens"`` to script a truncated answer; the value is sent as
            is to both formats.
        fault: What goes wrong, if anything.
        provider: Answer only requests in this wire format; ``None`` answers
            either. A queued scenario for the other format stays queued.
        model: The model name reported; ``None`` echoes the request's ``model``.
        headers: Extra response headers (sent on success and on faults).
        name: A label, shown in :class:`RecordedRequest` and logs.
        text_breaks: Offsets in the text where Anthropic starts a new text block
            besides the citation boundaries (a continuation sends the rest of a
            cited span as a block of its own).
        resume_faults: Responses API background mode only: the faults of the
            streamed retrievals of this response (``GET /v1/responses/{id}?stream=true``),
            in order; the first retrieval gets the first fault, and retrievals past
            the end of the list get none. ``drop_after_events`` counts the events
            of the resumed stream; ``http_error`` answers the retrieval with an error.
        cancel_delay: Responses API background mode only: seconds the server
            holds its answer to a cancel of this response
            (``POST /v1/responses/{id}/cancel``) before answering, a provider
            slow to cancel (interrupted on shutdown). The response is cancelled
            when the request arrives.
    """

    text: str | Sequence[str] = ""
    tool_calls: Sequence[ScriptedToolCall] = ()
    thinking: Sequence[ScriptedThinking] = ()
    citations: Sequence[ScriptedCitation] = ()
    web_searches: Sequence[ScriptedWebSearch] = ()
    usage: TokenUsage | None = None
    chunk_size: int = 4
    delay: float = 0.0
    stop_reason: str | None = None
    fault: Fault | None = None
    provider: Provider | None = None
    model: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    name: str | None = None
    text_breaks: Sequence[int] = ()
    resume_faults: Sequence[Fault] = ()
    cancel_delay: float = 0.0

    def __post_init__(self) -> None:
        if self.chunk_size < 1:
            raise ValueError(f"Scenario chunk_size must be >= 1, got {self.chunk_size}")
        if self.delay < 0:
            raise ValueError(f"Scenario delay must be >= 0, got {self.delay}")
        if self.cancel_delay < 0:
            raise ValueError(f"Scenario cancel_delay must be >= 0, got {self.cancel_delay}")
        if self.provider is not None and self.provider not in PROVIDERS:
            raise ValueError(
                f"Scenario provider must be one of {PROVIDERS} or None, got {self.provider!r}"
            )
        # Freeze sequences so a scenario can be shared between threads safely.
        if not isinstance(self.text, str):
            object.__setattr__(self, "text", tuple(self.text))
        object.__setattr__(self, "tool_calls", tuple(self.tool_calls))
        object.__setattr__(self, "thinking", tuple(self.thinking))
        object.__setattr__(self, "citations", tuple(self.citations))
        object.__setattr__(self, "web_searches", tuple(self.web_searches))
        object.__setattr__(self, "text_breaks", tuple(sorted(set(self.text_breaks))))
        object.__setattr__(self, "resume_faults", tuple(self.resume_faults))
        end = 0
        for citation in self.citations:
            if citation.start < end or citation.end > len(self.full_text):
                raise ValueError(
                    f"Scenario citations must be in order, not overlap and lie within the "
                    f"text ({len(self.full_text)} characters); got {citation}"
                )
            end = citation.end

    @property
    def full_text(self) -> str:
        """The complete assistant text, as the client reassembles it."""
        return self.text if isinstance(self.text, str) else "".join(self.text)

    def text_pieces(self) -> list[str]:
        """The text deltas to stream, in order (empty when there is no text)."""
        if isinstance(self.text, str):
            return split(self.text, self.chunk_size)
        return [piece for piece in self.text if piece]

    def text_segments(self) -> list[tuple[str, ScriptedCitation | None]]:
        """The text cut at citation boundaries: each span with its citation, if any."""
        full, position = self.full_text, 0
        segments: list[tuple[str, ScriptedCitation | None]] = []

        def plain(end: int) -> None:
            nonlocal position
            for cut in [b for b in self.text_breaks if position < b < end] + [end]:
                if cut > position:
                    segments.append((full[position:cut], None))
                    position = cut

        for citation in self.citations:
            plain(citation.start)
            segments.append((full[citation.start : citation.end], citation))
            position = citation.end
        plain(len(full))
        return segments

    def continued_after(self, chars: int, *, cite_rest: bool = False) -> Scenario:
        """This answer as a model continuing it exactly after its first ``chars`` characters.

        The rest of the text, its citations moved with it (a span the cut went
        through keeps its citation in the part already sent, so its rest is plain
        text), the tool calls; the thinking and web searches came before the text
        and are not sent again. Useful to script an exact continuation.

        Args:
            chars: Characters of the text already delivered.
            cite_rest: The rest of a span the cut went through is cited too, as
                a model cites the part of a span it writes (a Responses
                annotation of the first part never came: it follows its span).

        Returns:
            The scenario of the continuation.
        """
        rest = [
            dataclasses.replace(c, start=max(c.start - chars, 0), end=c.end - chars)
            for c in self.citations
            if c.start >= chars or (cite_rest and c.end > chars)
        ]
        cut = [] if cite_rest else self.citations
        cut_spans = [c.end - chars for c in cut if c.start < chars < c.end]
        return dataclasses.replace(
            self,
            text=self.full_text[chars:],
            citations=rest,
            text_breaks=[b - chars for b in self.text_breaks if b > chars] + cut_spans,
            thinking=(),
            web_searches=(),
        )

    def argument_pieces(self, call: ScriptedToolCall) -> list[str]:
        """The argument fragments of ``call`` to stream, in order."""
        if isinstance(call.arguments, str | Mapping):
            return split(call.arguments_json, self.chunk_size)
        return [piece for piece in call.arguments if piece]


def split(text: str, size: int) -> list[str]:
    """Split ``text`` into consecutive pieces of at most ``size`` characters."""
    return [text[i : i + size] for i in range(0, len(text), size)]


def _format_seconds(seconds: float) -> str:
    if seconds < 0:
        raise ValueError(f"retry_after must be >= 0 seconds, got {seconds}")
    return str(int(seconds)) if float(seconds).is_integer() else repr(float(seconds))


_CONTEXT_OVERFLOW = "context_overflow"
"""Sentinel message: the wire layer renders each provider's own overflow wording."""
