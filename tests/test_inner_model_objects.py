"""The wrapped model keeps every run-time object of the inner model.

A setting given to the wrapper for the inner model (``temperature=0.2``,
``output_version="v1"``) rebuilds the inner model with it. The rebuilt model
shares the inner model's run-time objects: its rate limiter, its HTTP clients
(a proxy, a private CA, mTLS), its callbacks, tags, metadata and cache. The
real ChatOpenAI and ChatAnthropic talk to the loopback provider.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from langchain_core.caches import InMemoryCache
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models import BaseChatModel
from langchain_core.rate_limiters import BaseRateLimiter

from awaken_langchain import RecoveringChatModel
from awaken_langchain.testing import LoopbackProvider, Scenario

pytestmark = pytest.mark.asyncio(loop_scope="module")

ANSWER = "Sixty lamps were lit along the harbour wall."
PROVIDERS = ["openai", "anthropic"]
SETTINGS = [{"temperature": 0.2}, {"output_version": "v1"}]
SETTING_IDS = ["temperature", "output_version"]


@pytest.fixture
def server(shared_server: LoopbackProvider) -> LoopbackProvider:
    shared_server.reset()
    shared_server.default = Scenario(text=ANSWER)
    return shared_server


def bare(provider: str, server: LoopbackProvider, **objects: Any) -> BaseChatModel:
    """A real chat model of ``provider`` talking to ``server``, with ``objects``."""
    if provider == "openai":
        from langchain_openai import ChatOpenAI

        return ChatOpenAI(
            model="gpt-4o-mini",
            base_url=server.base_url_openai,
            api_key="x",
            max_retries=0,
            **objects,
        )
    from langchain_anthropic import ChatAnthropic

    return ChatAnthropic(
        model="claude-loopback",
        base_url=server.base_url_anthropic,
        api_key="x",
        max_retries=0,
        **objects,
    )


class CountingLimiter(BaseRateLimiter):
    """A rate limiter that lets every request through and counts them."""

    def __init__(self) -> None:
        self.acquired = 0

    def acquire(self, *, blocking: bool = True) -> bool:
        self.acquired += 1
        return True

    async def aacquire(self, *, blocking: bool = True) -> bool:
        self.acquired += 1
        return True


class Runs(BaseCallbackHandler):
    """The chat model runs a handler saw start: their tags and metadata."""

    def __init__(self) -> None:
        self.started: list[tuple[list[str], dict[str, Any]]] = []

    def on_chat_model_start(self, serialized: Any, messages: Any, **kwargs: Any) -> None:
        self.started.append((list(kwargs.get("tags") or []), dict(kwargs.get("metadata") or {})))


def text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content if isinstance(b, dict))


@pytest.mark.parametrize("setting", SETTINGS, ids=SETTING_IDS)
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_setting_given_to_the_wrapper_keeps_the_inner_models_rate_limiter(
    provider: str, setting: dict[str, Any], server: LoopbackProvider
) -> None:
    limiter = CountingLimiter()
    model = RecoveringChatModel(model=bare(provider, server, rate_limiter=limiter), **setting)

    first = model.invoke("How many lamps?")
    second = await model.ainvoke("How many lamps?")

    assert text_of(first.content) == text_of(second.content) == ANSWER
    assert limiter.acquired == 2  # each request waited for the inner model's limiter
    assert len(server.requests) == 2
    for name, value in setting.items():
        if name == "temperature":
            assert all(r.body["temperature"] == value for r in server.requests)
        else:
            assert getattr(model.model, name) == value


@pytest.mark.parametrize("setting", SETTINGS, ids=SETTING_IDS)
async def test_a_setting_given_to_the_wrapper_keeps_the_inner_models_http_clients(
    setting: dict[str, Any], server: LoopbackProvider
) -> None:
    sent: list[str] = []

    def record(request: httpx.Request) -> None:
        sent.append(f"sync {request.url.path}")

    async def arecord(request: httpx.Request) -> None:
        sent.append(f"async {request.url.path}")

    with httpx.Client(event_hooks={"request": [record]}) as client:
        async with httpx.AsyncClient(event_hooks={"request": [arecord]}) as aclient:
            inner = bare("openai", server, http_client=client, http_async_client=aclient)
            model = RecoveringChatModel(model=inner, **setting)
            answer = model.invoke("How many lamps?")
            streamed = [text_of(c.content) async for c in model.astream("How many lamps?")]

    assert text_of(answer.content) == "".join(streamed) == ANSWER
    # the caller's clients carried both requests to the provider
    assert sent == ["sync /v1/chat/completions", "async /v1/chat/completions"]
    assert len(server.requests) == 2


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_setting_given_to_the_wrapper_keeps_the_inner_models_callbacks_tags_and_metadata(
    provider: str, server: LoopbackProvider
) -> None:
    runs = Runs()
    inner = bare(provider, server, callbacks=[runs], tags=["harbour"], metadata={"team": "night"})
    model = RecoveringChatModel(model=inner, temperature=0.2)

    model.invoke("How many lamps?")
    await model.ainvoke("How many lamps?")

    assert len(runs.started) == 2  # one run per call, reported to the inner model's handler
    for tags, metadata in runs.started:
        assert "harbour" in tags
        assert metadata["team"] == "night"


@pytest.mark.parametrize("setting", [{}, {"temperature": 0.2}], ids=["none", "temperature"])
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_setting_given_to_the_wrapper_keeps_the_inner_models_cache(
    provider: str, setting: dict[str, Any], server: LoopbackProvider
) -> None:
    cache = InMemoryCache()
    model = RecoveringChatModel(model=bare(provider, server, cache=cache), **setting)

    first = model.invoke("How many lamps?")
    again = model.invoke("How many lamps?")
    async_again = await model.ainvoke("How many lamps?")

    assert text_of(first.content) == text_of(again.content) == text_of(async_again.content)
    assert len(server.requests) == 1  # answered from the inner model's cache after the first
