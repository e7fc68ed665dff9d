"""A turn continues on a fallback model when the model in effect is spent.

The real ChatOpenAI and ChatAnthropic talk to the loopback provider through the
official SDKs (``max_retries=0``: only the wrapper retries). The primary model
streams part of an answer, then the provider answers 529 until the primary's
budget is spent; the fallback, answering like a model asked to continue,
finishes the turn. Tests assert what the caller saw, what the provider
received, and what ``response_metadata["awaken"]`` and the events report.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage

from awaken_langchain import (
    InMemoryStreamCheckpointStore,
    RecoveringChatModel,
    RetryPolicy,
    StreamInterruptedError,
)
from awaken_langchain.recovery import DEFAULT_CONTINUATION_PROMPT
from awaken_langchain.testing import (
    Fault,
    LoopbackProvider,
    RecordedRequest,
    Scenario,
    ScriptedThinking,
    ScriptedToolCall,
    continuation_responder,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

ANSWER = (
    "The lighthouse keeper climbed the stairs at dusk, trimmed the wick, and watched "
    "the beam sweep across the water until the fishing boats were home."
)
OPENAI = "gpt-4o-mini"
ANTHROPIC = "claude-loopback"
OPENAI_ID = f"openai-chat:{OPENAI}"
ANTHROPIC_ID = f"anthropic-chat:{ANTHROPIC}"
PROVIDER_OF = {OPENAI: "openai", ANTHROPIC: "anthropic"}


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(
        b if isinstance(b, str) else b.get("text", "")
        for b in content
        if isinstance(b, str) or b.get("type") == "text"
    )


class Sleeps:
    """Records the waits the policy asked for, advancing a fake clock instead of sleeping."""

    def __init__(self) -> None:
        self.waits: list[float] = []
        self.now = 0.0

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds

    async def asleep(self, seconds: float) -> None:
        self(seconds)

    def clock(self) -> float:
        return self.now


class Events(BaseCallbackHandler):
    """The recovery events a call reported."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, Any]] = []

    def on_custom_event(self, name: str, data: Any, **kwargs: Any) -> None:
        self.seen.append((name, data))

    def named(self, name: str) -> list[Any]:
        return [data for seen, data in self.seen if seen == name]


@pytest.fixture(scope="module")
def shared_server() -> Iterator[LoopbackProvider]:
    with LoopbackProvider() as provider:
        yield provider


@pytest.fixture
def server(shared_server: LoopbackProvider) -> LoopbackProvider:
    shared_server.reset()
    shared_server.default = Scenario(text=ANSWER)
    return shared_server


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


_MODELS: dict[tuple[str, int], BaseChatModel] = {}


def chat_model(name: str, server: LoopbackProvider) -> BaseChatModel:
    """The real integration for ``name``, talking to the loopback server (built once)."""
    key = (name, server.port)
    if key not in _MODELS:
        if PROVIDER_OF[name] == "openai":
            from langchain_openai import ChatOpenAI

            _MODELS[key] = ChatOpenAI(
                model=name, base_url=server.base_url_openai, api_key="x", max_retries=0
            )
        else:
            from langchain_anthropic import ChatAnthropic

            _MODELS[key] = ChatAnthropic(  # type: ignore[call-arg]
                model=name, base_url=server.base_url_anthropic, api_key="x", max_retries=0
            )
    return _MODELS[key]


def policy(sleeps: Sleeps, **settings: Any) -> RetryPolicy:
    settings.setdefault("overload_deadline", None)
    return RetryPolicy(sleep=sleeps, async_sleep=sleeps.asleep, clock=sleeps.clock, **settings)


def storm(primary: str, then: Callable[[RecordedRequest], Scenario]) -> Any:
    """Every request to ``primary`` is answered 529; the others by ``then``."""

    def respond(request: RecordedRequest) -> Scenario:
        if request.body.get("model") == primary:
            return Scenario(fault=Fault.overloaded())
        return then(request)

    return respond


def continuing(full: str = ANSWER, overlap_words: int = 0, **fields: Any) -> Any:
    return continuation_responder(Scenario(text=full, **fields), overlap_words=overlap_words)


def to(name: str) -> list[RecordedRequest]:
    """The requests a model received, in order."""
    return [r for r in SERVER[0].requests if r.body.get("model") == name]


SERVER: list[LoopbackProvider] = []


@pytest.fixture(autouse=True)
def _remember(server: LoopbackProvider) -> None:
    SERVER[:] = [server]


def last_assistant(request: RecordedRequest) -> Any:
    return [m for m in request.messages if m.get("role") == "assistant"][-1]["content"]


def user_turns(request: RecordedRequest) -> list[str]:
    return [_text_of(m["content"]) for m in request.messages if m.get("role") == "user"]


ENTRY_POINTS = ["invoke", "stream", "ainvoke", "astream"]


@pytest.fixture(params=ENTRY_POINTS)
def entry(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def call(
    model: Any, entry: str, prompt: Any = "Tell me about the lighthouse", **kwargs: Any
) -> tuple[AIMessage, list[AIMessageChunk]]:
    """The caller's final message and streamed chunks (empty for invoke)."""
    if entry == "invoke":
        return model.invoke(prompt, **kwargs), []
    if entry == "ainvoke":
        return await model.ainvoke(prompt, **kwargs), []
    if entry == "stream":
        chunks = list(model.stream(prompt, **kwargs))
    else:
        chunks = [chunk async for chunk in model.astream(prompt, **kwargs)]
    total = chunks[0]
    for chunk in chunks[1:]:
        total = total + chunk
    fields = total.model_dump(exclude={"type", "tool_call_chunks", "chunk_position"})
    return AIMessage(**fields), chunks


def streamed_text(chunks: list[AIMessageChunk]) -> str:
    return "".join(_text_of(c.content) for c in chunks)


DIRECTIONS = [(OPENAI, ANTHROPIC), (ANTHROPIC, OPENAI)]


@pytest.fixture(params=DIRECTIONS, ids=["openai-to-anthropic", "anthropic-to-openai"])
def pair(request: pytest.FixtureRequest) -> tuple[str, str]:
    return request.param  # type: ignore[no-any-return]


def cut_answer(primary: str, **fields: Any) -> Scenario:
    """The primary's first answer: part of ``ANSWER``, then the connection drops."""
    fields.setdefault("text", ANSWER)
    return Scenario(provider=PROVIDER_OF[primary], fault=Fault.drop_after_events(8), **fields)


# -- after output: the fallback continues from the prefix ---------------------------------


async def test_fallback_continues_the_turn_from_the_prefix_without_prefill(
    pair: tuple[str, str], entry: str, server: LoopbackProvider, sleeps: Sleeps
) -> None:
    primary, fallback = pair
    server.enqueue(cut_answer(primary))
    server.default = storm(primary, continuing())
    model = RecoveringChatModel(
        model=chat_model(primary, server),
        fallbacks=[chat_model(fallback, server)],
        retry_policy=policy(sleeps, max_continuations=2),
    )
    events = Events()
    message, chunks = await call(model, entry, config={"callbacks": [events]})

    assert _text_of(message.content) == ANSWER
    if chunks:
        assert streamed_text(chunks) == ANSWER
    # the primary: the cut answer, then two continuations answered 529
    assert len(to(primary)) == 3
    [request] = to(fallback)
    assert request.provider == PROVIDER_OF[fallback]
    prefix = _text_of(last_assistant(request))
    assert prefix and ANSWER.startswith(prefix) and prefix == prefix.rstrip()
    assert request.messages[-1]["role"] == "user"  # no assistant prefill
    assert user_turns(request) == ["Tell me about the lighthouse", DEFAULT_CONTINUATION_PROMPT]
    assert request.rejected_by is None

    awaken = message.response_metadata["awaken"]
    ids = {OPENAI: OPENAI_ID, ANTHROPIC: ANTHROPIC_ID}
    switch = awaken["models"][1]["start"]
    assert ANSWER[:switch].rstrip() == prefix
    assert awaken["models"] == [
        {"model": ids[primary], "start": 0, "end": switch},
        {"model": ids[fallback], "start": switch, "end": len(ANSWER)},
    ]
    assert awaken["plans"] == ["R1", "R1", "R1"]
    [event] = events.named("awaken_fallback")
    assert (event["from_model"], event["to_model"]) == (ids[primary], ids[fallback])
    assert event["plan"] == "R1" and event["cause"] == "overloaded"
    assert "max_continuations=2" in event["reason"]
