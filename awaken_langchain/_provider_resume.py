"""Lossless resume of an OpenAI Responses stream that the provider keeps running.

With ``RecoveringChatModel(provider_resume=True)`` and an inner ``ChatOpenAI`` on
the Responses API, a turn's response is created in background mode
(``background=True``, ``store=True``): the provider keeps generating when the
connection drops, numbers every stream event (``sequence_number``) and replays
the stream from any event (``responses.retrieve(id, stream=True,
starting_after=N)``). An interrupted turn then resumes the provider's stream
after the last event the caller received: nothing is generated again, and the
caller's stream goes on with no repeated and no missing event.

LangChain's chunks carry neither the sequence numbers nor (after the first) the
response id, so a turn in this mode drives the openai SDK itself and converts
each event with langchain-openai's own converter, keeping the converter's
position (content index, output index, sub-index) across the reconnection.
This relies on private parts of langchain-openai, pinned by the tests in
``tests/test_provider_resume.py``: ``BaseChatOpenAI._get_request_payload``,
``root_client``/``root_async_client``,
``langchain_openai.chat_models.base._convert_responses_chunk_to_generation_chunk``
and the same module's ``_handle_openai_bad_request``/``_handle_openai_api_error``
(so errors are raised as ``ChatOpenAI`` raises them).

A replacement process (after a crash) knows the response id and the sequence
number of the last event whose output the checkpoint holds whole: the last
event after which no tool call or other block was still arriving (text still
arriving counts as held: the record has it up to that event). It shows the
checkpoint's turn, then resumes the provider's stream after that number
(``starting_after``): a tool call or block that was cut off in the record is
read again whole from its first event, and nothing before it is read again.
"""

from __future__ import annotations

import collections
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langchain_core.outputs import ChatGenerationChunk

from awaken_langchain.errors import StreamEndedEarlyError

__all__ = [
    "ProviderStream",
    "ProviderStreamGoneError",
    "provider_resume_problem",
]

logger = logging.getLogger("awaken_langchain")

CANCEL_TIMEOUT = 2.0
"""Seconds a turn that ends early waits for the provider to answer the cancel of its
background response. The cancel is best effort: the response expires at the
provider anyway."""

_TERMINAL = ("response.completed", "response.incomplete")
_FAILED = ("response.failed", "error")


class ProviderStreamGoneError(StreamEndedEarlyError):
    """The provider no longer has the interrupted response's stream.

    The response is unknown (404), expired, failed or cancelled, so its stream
    cannot be resumed: the turn is continued from its prefix instead (a new
    request), like a dropped connection.
    """

    def __init__(self, response_id: str, reason: str) -> None:
        self.chunks_received = 0
        self.response_id = response_id
        self.reason = reason
        Exception.__init__(
            self,
            f"the provider cannot resume response {response_id!r} ({reason}); the turn "
            "is continued from its prefix instead",
        )


def provider_resume_problem(model: BaseChatModel) -> str | None:
    """Why ``model`` cannot resume a stream at the provider, or ``None`` when it can."""
    try:
        from langchain_openai import ChatOpenAI
    except ImportError:  # pragma: no cover - langchain-openai is the only provider with it
        return "provider_resume=True needs langchain-openai (pip install langchain-openai)"
    if not isinstance(model, ChatOpenAI):
        return (
            "provider_resume=True needs an inner ChatOpenAI on the Responses API "
            f"(ChatOpenAI(use_responses_api=True)), not {type(model).__name__}; "
            "leave provider_resume=False to continue interrupted turns by prompt"
        )
    if not model._use_responses_api(dict(model.model_kwargs)):
        return (
            "provider_resume=True needs ChatOpenAI(use_responses_api=True): the Chat "
            "Completions API cannot resume a stream; leave provider_resume=False to continue "
            "interrupted turns by prompt"
        )
    if model.include_response_headers:
        return (
            "provider_resume=True does not report response headers; "
            "set ChatOpenAI(include_response_headers=False)"
        )
    return None


@contextlib.contextmanager
def _as_chat_openai_raises() -> Iterator[None]:
    """Raise the openai SDK's errors as ``ChatOpenAI`` raises them.

    ``ChatOpenAI`` turns them into langchain-openai's own types (subclasses of
    the SDK's, such as ``OpenAIContextOverflowError``), which callers and
    middleware catch; a turn driving the SDK itself raises the same.
    """
    import openai
    from langchain_openai.chat_models.base import (
        _handle_openai_api_error,
        _handle_openai_bad_request,
    )

    try:
        yield
    except openai.BadRequestError as exc:
        _handle_openai_bad_request(exc)
        raise
    except openai.APIError as exc:
        _handle_openai_api_error(exc)
        raise


@dataclass(frozen=True, slots=True)
class _Position:
    """Where the converter stands after an event (its arguments that carry state)."""

    sequence_number: int | None = None
    index: int = -1
    output_index: int = -1
    sub_index: int = -1
    has_reasoning: bool = False
    item_output_indices: tuple[tuple[str, int], ...] = ()


@dataclass(slots=True)
class ProviderStream:
    """One turn's background response: its id and how far the caller has read it.

    The reader (possibly a worker thread ahead of the caller) converts events
    and queues each chunk with the converter position after its event; the turn
    engine reports each chunk it takes (`fed`), so ``delivered`` is always the
    position of the last event whose output the caller holds. A resume starts
    from there.
    """

    response_id: str | None = None
    whole_turn: bool = True
    """The response holds the whole turn (no continuation came before it), so a
    replacement process can finish the turn from the response alone."""
    delivered: _Position = field(default_factory=_Position)
    settled: int | None = None
    """The number of the last event after which the turn held nothing half-arrived
    but text (no tool call or other block still arriving, nothing held back): a
    checkpoint written now holds the output of every event up to it, and a
    replacement process resumes the stream after it."""
    resumes: int = 0
    """Streams resumed at the provider in this turn."""
    terminal: bool = False
    """The response's terminal event was read."""
    _resuming: bool = False
    _adopted: bool = False
    """The response was adopted from a checkpoint and its stream not read yet: its first
    chunk carries the response id, as the ``response.created`` event read before did."""
    _pending: collections.deque[tuple[ChatGenerationChunk, _Position]] = field(
        default_factory=collections.deque
    )

    # -- state ---------------------------------------------------------------------------

    @property
    def resumable(self) -> bool:
        """Whether a response exists whose stream can be resumed."""
        return self.response_id is not None and not self.terminal

    @property
    def sequence_number(self) -> int | None:
        """The number of the last event whose output the caller holds."""
        return self.delivered.sequence_number

    def adopt(
        self, response_id: str, sequence_number: int | None, *, has_reasoning: bool = False
    ) -> None:
        """Resume a response a previous process created, after the checkpoint's last event.

        The stream goes on in a fresh converter position: the turn engine takes
        what follows as an exact continuation of the checkpoint's turn (the
        block numbers of the new events are its own).
        """
        self.response_id = response_id
        self.delivered = _Position(sequence_number=sequence_number, has_reasoning=has_reasoning)
        self.settled = sequence_number
        self._adopted = sequence_number is not None

    def forget(self, *, whole_turn: bool) -> None:
        """The response is gone (or never was): the next request creates a new one."""
        self.response_id = None
        self.whole_turn = whole_turn
        self.delivered = _Position()
        self.settled = None
        self._adopted = False
        self.terminal = False
        self._pending.clear()

    def fed(self, generation: ChatGenerationChunk) -> None:
        """The engine took ``generation``: the caller holds the output of its event."""
        while self._pending:
            chunk, position = self._pending.popleft()
            self.delivered = position
            if chunk is generation:
                break

    def settle(self) -> None:
        """The turn holds nothing half-arrived but text now (see `settled`)."""
        self.settled = self.delivered.sequence_number

    # -- reading -------------------------------------------------------------------------

    def _begin(self, *, resuming: bool) -> _Position:
        self._pending.clear()
        self._resuming = resuming
        if resuming:
            self.resumes += 1
        return self.delivered

    def _convert(
        self, event: Any, position: _Position, schema: Any, output_version: str | None
    ) -> tuple[_Position, ChatGenerationChunk | None]:
        from langchain_openai.chat_models.base import (
            _convert_responses_chunk_to_generation_chunk,
        )

        if self.response_id is None and event.type == "response.created":
            self.response_id = event.response.id
        if event.type in _FAILED and self._resuming:
            raise ProviderStreamGoneError(str(self.response_id), f"the response {event.type[9:]}")
        indices = dict(position.item_output_indices)
        index, output_index, sub_index, chunk = _convert_responses_chunk_to_generation_chunk(
            event,
            position.index,
            position.output_index,
            position.sub_index,
            schema=schema,
            metadata={},
            has_reasoning=position.has_reasoning,
            output_version=output_version,
            item_output_indices=indices,
        )
        has_reasoning = position.has_reasoning or (
            chunk is not None and "reasoning" in chunk.message.additional_kwargs
        )
        if event.type in _TERMINAL:
            self.terminal = True
        after = _Position(
            sequence_number=getattr(event, "sequence_number", position.sequence_number),
            index=index,
            output_index=output_index,
            sub_index=sub_index,
            has_reasoning=has_reasoning,
            item_output_indices=tuple(indices.items()),
        )
        if chunk is not None:
            if self._adopted:
                self._adopted = False
                chunk.message.response_metadata = {
                    "id": self.response_id,
                    **chunk.message.response_metadata,
                }
            self._pending.append((chunk, after))
        return after, chunk

    def _request(
        self,
        inner: BaseChatModel,
        messages: list[BaseMessage],
        stop: list[str] | None,
        kwargs: dict[str, Any],
    ) -> dict[str, Any]:
        payload: dict[str, Any] = getattr(inner, "_get_request_payload")(  # noqa: B009
            messages, stop=stop, **{**kwargs, "stream": True}
        )
        return {**payload, "stream": True, "background": True, "store": True}

    def _retrieval(self) -> dict[str, Any]:
        after = self.delivered.sequence_number
        return {"stream": True} if after is None else {"stream": True, "starting_after": after}

    def _gone(self, exc: Exception) -> ProviderStreamGoneError | None:
        import openai

        if isinstance(exc, openai.NotFoundError):
            return ProviderStreamGoneError(str(self.response_id), "not found or expired")
        return None

    def _ended(self) -> None:
        """A stream ended: a resumed one without its terminal event is gone (cancelled)."""
        if not self.terminal and self._resuming:
            raise ProviderStreamGoneError(
                str(self.response_id), "its stream ended without a terminal event (cancelled)"
            )

    def stream(
        self,
        inner: BaseChatModel,
        messages: list[BaseMessage],
        stop: list[str] | None,
        kwargs: dict[str, Any],
    ) -> Iterator[ChatGenerationChunk]:
        """Create the response, or resume its stream; yield the converted chunks."""
        client = getattr(inner, "root_client")  # noqa: B009
        schema, version = kwargs.get("response_format"), inner.output_version
        position = self._begin(resuming=self.response_id is not None)
        with _as_chat_openai_raises():
            if self.response_id is None:
                events = client.responses.create(**self._request(inner, messages, stop, kwargs))
            else:
                try:
                    events = client.responses.retrieve(self.response_id, **self._retrieval())
                except Exception as exc:
                    raise (self._gone(exc) or exc) from exc
            with events:
                for event in events:
                    position, chunk = self._convert(event, position, schema, version)
                    if chunk is not None:
                        yield chunk
        self._ended()

    async def astream(
        self,
        inner: BaseChatModel,
        messages: list[BaseMessage],
        stop: list[str] | None,
        kwargs: dict[str, Any],
    ) -> AsyncIterator[ChatGenerationChunk]:
        """Twin of `stream` on the async client."""
        client = getattr(inner, "root_async_client")  # noqa: B009
        schema, version = kwargs.get("response_format"), inner.output_version
        position = self._begin(resuming=self.response_id is not None)
        with _as_chat_openai_raises():
            if self.response_id is None:
                request = self._request(inner, messages, stop, kwargs)
                events = await client.responses.create(**request)
            else:
                try:
                    events = await client.responses.retrieve(self.response_id, **self._retrieval())
                except Exception as exc:
                    raise (self._gone(exc) or exc) from exc
            async with events:
                async for event in events:
                    position, chunk = self._convert(event, position, schema, version)
                    if chunk is not None:
                        yield chunk
        self._ended()

    # -- cancelling ----------------------------------------------------------------------

    def cancel(self, inner: BaseChatModel) -> str | None:
        """Cancel the running response (best effort); return its id when a cancel was sent.

        The caller waits at most `CANCEL_TIMEOUT` seconds for the provider's
        answer, with no retry: a turn that is over never waits on the SDK's
        own timeout (600 s by default) for a call whose outcome changes nothing.
        """
        response_id = self._cancelling()
        if response_id is None:
            return None
        with contextlib.suppress(Exception):
            client = getattr(inner, "root_client")  # noqa: B009
            client.with_options(max_retries=0).responses.cancel(response_id, timeout=CANCEL_TIMEOUT)
        return response_id

    async def acancel(self, inner: BaseChatModel) -> str | None:
        """Twin of `cancel` on the async client."""
        response_id = self._cancelling()
        if response_id is None:
            return None
        with contextlib.suppress(Exception):
            client = getattr(inner, "root_async_client")  # noqa: B009
            await client.with_options(max_retries=0).responses.cancel(
                response_id, timeout=CANCEL_TIMEOUT
            )
        return response_id

    def _cancelling(self) -> str | None:
        if not self.resumable:
            return None
        response_id = self.response_id
        self.forget(whole_turn=self.whole_turn)
        return response_id
