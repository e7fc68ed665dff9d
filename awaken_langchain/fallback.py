"""Fallback models: what a turn sends to the next model when one is spent (pure).

`RecoveringChatModel(model=..., fallbacks=[...])` carries a turn on to the next
model when the model in effect has spent its retry budget. This module holds
the decisions that do not depend on I/O:

- which objects are accepted as fallbacks (chat models, or ``"provider:model"``
  strings resolved once with ``init_chat_model``);
- the call arguments a fallback gets: the primary's, or, for a chat model of
  another class, only the portable ones: the same tools and tool choice bound
  the fallback's own way (``bind_tools`` of the fallback, since OpenAI and
  Anthropic spell tools differently), and ``stream_usage`` when the fallback
  takes it. ``stop`` is a parameter of every chat model and always passes.
  Every other argument (``cache_control``, ``logprobs``, ``stream_options``,
  ``temperature``...) is the primary's provider's: another SDK refuses a name
  it does not know, and a value valid for one provider can be refused by
  another (OpenAI takes ``temperature`` up to 2, Anthropic up to 1);
- the shape of the fallback's chunks: text written into a turn whose content
  so far has the other shape (a string, or a list of blocks) is moved into the
  turn's shape, so the answer keeps the shape it began with.

The prefix a fallback continues from is the turn's text only (see
`awaken_langchain.engine.TurnEngine.next_request`): thinking blocks with
signatures, reasoning items and server-tool blocks are valid only for the model
that issued them, so they stay in the caller's message and are not sent on.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessageChunk
from langchain_core.outputs import ChatGenerationChunk

logger = logging.getLogger(__name__)

__all__ = [
    "FallbackModel",
    "call_kwargs_for",
    "reshaped_chunk",
    "resolve_fallbacks",
    "takes_stream_usage",
]

_TOOL_KWARGS = ("tools", "tool_choice", "parallel_tool_calls")
"""Call arguments that a fallback of another class gets bound its own way."""
_TOOL_CALL_BLOCKS = ("tool_use", "input_json_delta", "tool_call_chunk")
"""Content blocks of a tool call that a chunk also carries in ``tool_call_chunks``."""


@dataclass(frozen=True, slots=True)
class FallbackModel:
    """A model a turn can move to, with what it is called with."""

    model: BaseChatModel
    model_id: str
    """The identifier checkpoints record (``"<llm type>:<model name>"``)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """The call's arguments, as this model takes them."""


def resolve_fallbacks(values: object) -> tuple[BaseChatModel, ...]:
    """Check the ``fallbacks`` setting and resolve model strings.

    Args:
        values: A sequence of chat models or ``"provider:model"`` strings
            (resolved with ``langchain.chat_models.init_chat_model``).

    Raises:
        ValueError: If ``values`` is not a sequence, or an item is neither a
            chat model nor a string.
    """
    if values is None:
        return ()
    if isinstance(values, str | BaseChatModel) or not isinstance(values, Sequence):
        raise ValueError(
            "fallbacks takes a list of chat models or 'provider:model' strings, "
            f"not {type(values).__name__}"
        )
    resolved: list[BaseChatModel] = []
    for i, value in enumerate(values):
        if isinstance(value, str):
            from langchain.chat_models import init_chat_model

            value = init_chat_model(value)
        if not isinstance(value, BaseChatModel):
            raise ValueError(
                f"fallbacks[{i}] is {type(value).__name__}, not a chat model: pass chat "
                "models (ChatOpenAI(...), ChatAnthropic(...)) or 'provider:model' strings"
            )
        resolved.append(value)
    return tuple(resolved)


def _tool_choice(choice: Any) -> tuple[Any, bool | None]:
    """A tool choice in the words every ``bind_tools`` takes, and a parallel-calls flag."""
    parallel: bool | None = None
    if isinstance(choice, Mapping):
        if choice.get("disable_parallel_tool_use"):
            parallel = False
        kind = choice.get("type")
        function = choice.get("function")
        if isinstance(function, Mapping) and function.get("name"):
            return str(function["name"]), parallel
        if kind == "tool" and choice.get("name"):
            return str(choice["name"]), parallel
        if kind in ("any", "required"):
            return "any", parallel
        return kind, parallel
    if choice == "required" or choice is True:
        return "any", parallel
    return choice, parallel


def call_kwargs_for(
    primary: BaseChatModel, fallback: BaseChatModel, kwargs: Mapping[str, Any]
) -> dict[str, Any]:
    """The call arguments ``fallback`` gets for a call made with ``kwargs`` on ``primary``.

    A fallback of the primary's class takes them as they are. Another class
    gets only the portable ones: the same tools, tool choice and parallel-calls
    setting bound with its own ``bind_tools`` (tools bound on the wrapper are in
    the primary's format), and ``stream_usage`` when its class takes it. The
    others belong to the primary's provider and are left out (and logged at
    debug level).
    """
    if type(fallback) is type(primary):
        return dict(kwargs)
    moved: dict[str, Any] = {}
    if "stream_usage" in kwargs and takes_stream_usage(type(fallback)):
        moved["stream_usage"] = kwargs["stream_usage"]
    left_out = sorted(k for k in kwargs if k not in _TOOL_KWARGS and k not in moved)
    if left_out:
        logger.debug(
            "%s does not get the call argument(s) %s of %s: they are its provider's own",
            type(fallback).__name__,
            left_out,
            type(primary).__name__,
        )
    tools = kwargs.get("tools")
    if not tools:
        return moved
    choice, parallel = _tool_choice(kwargs.get("tool_choice"))
    options: dict[str, Any] = {}
    if choice is not None:
        options["tool_choice"] = choice
    parallel_calls = kwargs.get("parallel_tool_calls", parallel)
    if parallel_calls is not None:
        options["parallel_tool_calls"] = parallel_calls
    bound = fallback.bind_tools(tools, **options)
    return {**moved, **dict(getattr(bound, "kwargs", {}))}


@functools.cache
def takes_stream_usage(cls: type[BaseChatModel]) -> bool:
    """Whether ``cls._stream`` takes ``stream_usage`` (ChatOpenAI, ChatAnthropic do)."""
    for klass in cls.__mro__:  # a subclass may pass ``*args, **kwargs`` on to its base
        method = klass.__dict__.get("_stream")
        if method is None:
            continue
        try:
            if "stream_usage" in inspect.signature(method).parameters:
                return True
        except (TypeError, ValueError):
            return False
    return False


def reshaped_chunk(generation: ChatGenerationChunk, *, blocks: bool) -> ChatGenerationChunk:
    """``generation`` with its text in the shape of the turn it continues.

    A fallback continuing a turn may write content the other way: a string where
    the turn so far is a list of content blocks (OpenAI Chat Completions after
    Anthropic), or plain text blocks where it is a string (Anthropic after
    OpenAI). The text is moved into the turn's shape, so the answer keeps the
    shape it began with. In a string, a tool call is carried by the chunk's
    ``tool_call_chunks`` alone, as a model that answers in strings carries it:
    its ``tool_use`` blocks are left out. A chunk with any other block
    (thinking, citations, a server tool's call...) is returned as it is.

    Args:
        generation: A chunk of the fallback.
        blocks: Whether the turn's content is a list of blocks.
    """
    message = generation.message
    content = message.content
    if blocks:
        if not isinstance(content, str):
            return generation
        shaped: str | list[Any] = [{"type": "text", "text": content, "index": 0}] if content else []
    else:
        if not isinstance(content, list):
            return generation
        texts: list[str] = []
        calls = {c.get("index") for c in getattr(message, "tool_call_chunks", None) or []}
        for block in content:
            if isinstance(block, str):
                texts.append(block)
            elif (
                isinstance(block, dict)
                and block.get("type") in _TOOL_CALL_BLOCKS
                and block.get("index") in calls
            ):
                continue  # the call is in the chunk's tool_call_chunks
            elif (
                isinstance(block, dict)
                and block.get("type") == "text"
                and set(block) <= {"type", "text", "index"}
            ):
                texts.append(str(block.get("text") or ""))
            else:
                return generation
        shaped = "".join(texts)
    chunk = cast(AIMessageChunk, message.model_copy(update={"content": shaped}))
    return ChatGenerationChunk(message=chunk, generation_info=generation.generation_info)
