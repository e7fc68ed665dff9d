"""OpenAI Chat Completions structured output, streamed without the SDK's parsing stream.

Given a pydantic class as ``response_format``, langchain-openai streams through
the openai SDK's parsing stream and dumps each of its events with pydantic,
which warns on every answer ("Pydantic serializer warnings ... field_name=
'parsed'"): the events declare ``parsed`` loosely. The bare model's ``invoke``
does not stream, so it never warns, but the wrapper streams every call. So the
wrapper sends the class's JSON schema, written into the request exactly as the
SDK writes it, and parses the finished answer into the class itself, as the
SDK does (``model_validate_json`` of the text, unless the model refused).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.outputs import ChatGenerationChunk
from pydantic import BaseModel


def streamed_kwargs(
    model: BaseChatModel, kwargs: Mapping[str, Any]
) -> tuple[Mapping[str, Any], type[BaseModel] | None]:
    """The call's kwargs for a streamed request, and the class to parse its answer into.

    ``kwargs`` themselves and ``None`` unless ``model`` is a langchain-openai model
    on Chat Completions asked for a pydantic class as ``response_format``.
    """
    schema = kwargs.get("response_format")
    if not (isinstance(schema, type) and issubclass(schema, BaseModel)):
        return kwargs, None
    try:
        from langchain_openai.chat_models.base import BaseChatOpenAI
        from openai.lib._parsing._completions import type_to_response_format_param
    except ImportError:
        return kwargs, None
    if not isinstance(model, BaseChatOpenAI):
        return kwargs, None
    responses = getattr(model, "_use_responses_api", None)
    if not callable(responses) or responses({**model.model_kwargs, **kwargs}):
        return kwargs, None  # the Responses API parses its own way; an unknown version is left be
    return {**kwargs, "response_format": type_to_response_format_param(schema)}, schema


def parsed_into(
    chunks: Iterator[ChatGenerationChunk], schema: type[BaseModel]
) -> Iterator[ChatGenerationChunk]:
    """``chunks``, the answer parsed into ``schema`` in the chunk that carries ``parsed``."""
    answer = _Answer(schema)
    for chunk in chunks:
        yield answer.take(chunk)


async def aparsed_into(
    chunks: AsyncIterator[ChatGenerationChunk], schema: type[BaseModel]
) -> AsyncIterator[ChatGenerationChunk]:
    """`parsed_into` for an async stream."""
    answer = _Answer(schema)
    async for chunk in chunks:
        yield answer.take(chunk)


class _Answer:
    """One streamed answer: its text, whether it finished, the class to parse it into."""

    def __init__(self, schema: type[BaseModel]) -> None:
        self.schema = schema
        self.text: list[str] = []
        self.finished = False

    def take(self, chunk: ChatGenerationChunk) -> ChatGenerationChunk:
        message = chunk.message
        if isinstance(message.content, str):
            self.text.append(message.content)
        info = chunk.generation_info or {}
        if info.get("finish_reason") or message.response_metadata.get("finish_reason"):
            self.finished = True
        kwargs = message.additional_kwargs
        if "parsed" not in kwargs or kwargs["parsed"] is not None or kwargs.get("refusal"):
            return chunk
        text = "".join(self.text)
        # an answer that ended early is an interruption: it is asked again, not parsed
        if self.finished and text:  # raises as the SDK does when the answer does not fit
            kwargs["parsed"] = self.schema.model_validate_json(text)
        return chunk
