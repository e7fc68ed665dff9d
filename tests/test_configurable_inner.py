"""A configurable inner model that names no default model: the call's config names it.

``init_chat_model(temperature=0)`` returns a model whose ``model`` (and provider)
each call supplies in ``configurable``. The wrapper is built without resolving
it and recovers each call on the model that call's config names. The real
ChatOpenAI talks to the loopback provider.
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain.chat_models import init_chat_model
from langchain_core.messages import AIMessage

from awaken_langchain import RecoveringChatModel, RetryPolicy
from awaken_langchain.testing import Fault, LoopbackProvider, Scenario, continuation_responder

pytestmark = pytest.mark.asyncio(loop_scope="module")

ANSWER = "The lamp room was reached by a hundred and twelve steps of cast iron."
CONFIG: Any = {"configurable": {"model": "gpt-4o-mini", "model_provider": "openai"}}


async def _no_wait(_seconds: float) -> None:
    return None


NO_WAIT = RetryPolicy(sleep=lambda _s: None, async_sleep=_no_wait)


@pytest.fixture
def server(shared_server: LoopbackProvider) -> LoopbackProvider:
    shared_server.reset()
    shared_server.default = continuation_responder(Scenario(text=ANSWER))
    return shared_server


def wrapper(server: LoopbackProvider) -> RecoveringChatModel:
    configurable = init_chat_model(
        temperature=0, base_url=server.base_url_openai, api_key="x", max_retries=0
    )
    return RecoveringChatModel(model=configurable, retry_policy=NO_WAIT)


async def answer(model: Any, entry: str, config: Any) -> AIMessage:
    if entry == "invoke":
        return model.invoke("How many steps?", config)  # type: ignore[no-any-return]
    if entry == "ainvoke":
        return await model.ainvoke("How many steps?", config)  # type: ignore[no-any-return]
    chunks = (
        list(model.stream("How many steps?", config))
        if entry == "stream"
        else [c async for c in model.astream("How many steps?", config)]
    )
    total = chunks[0]
    for chunk in chunks[1:]:
        total = total + chunk
    return AIMessage(content=total.content, response_metadata=total.response_metadata)


async def test_a_configurable_model_without_a_default_model_can_be_wrapped(
    server: LoopbackProvider,
) -> None:
    model = wrapper(server)
    assert model.model_name is None  # no model until a call names one
    assert server.requests == []


@pytest.mark.parametrize("entry", ["invoke", "stream", "ainvoke", "astream"])
async def test_each_call_is_recovered_on_the_model_its_config_names(
    entry: str, server: LoopbackProvider
) -> None:
    server.enqueue(Scenario(text=ANSWER, fault=Fault.drop_after_events(6)))
    model = wrapper(server)

    message = await answer(model, entry, CONFIG)

    assert message.content == ANSWER
    assert message.response_metadata["awaken"]["continuations"] == 1
    assert [r.body["model"] for r in server.requests] == ["gpt-4o-mini", "gpt-4o-mini"]
    assert all(r.body["temperature"] == 0 for r in server.requests)
