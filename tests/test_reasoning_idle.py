"""Reasoning models get the longer idle timeout: a silent reasoning phase is not a stall.

The real ``ChatOpenAI`` talks to the loopback provider, which stays silent
before the answer as a reasoning model does. The timeouts are scaled down (a
0.3 s idle timeout, 5 s for reasoning models, a 1 s silence) so no test waits
a minute; the retry policy's sleep is injected.
"""

from __future__ import annotations

from typing import Any

import pytest

from awaken_langchain import RecoveringChatModel, RetryPolicy
from awaken_langchain.testing import Fault, LoopbackProvider, Scenario
from tests.conftest import Drive, Sleeps, loopback_client

ASYNC = pytest.mark.asyncio(loop_scope="module")
"""Marks each async test: its loopback clients are kept for the module's loop."""

ANSWER = "After thinking it over: the answer is 42."
SILENCE = 1.0


@pytest.fixture
def server(shared_server: LoopbackProvider) -> LoopbackProvider:
    shared_server.reset()
    shared_server.default = Scenario(text=ANSWER)
    return shared_server


def wrapped(server: LoopbackProvider, **settings: Any) -> RecoveringChatModel:
    sleeps = Sleeps()
    return RecoveringChatModel(
        model=loopback_client("openai", server, **settings),
        retry_policy=RetryPolicy(sleep=sleeps, async_sleep=sleeps.asleep),
        stream_idle_timeout=0.3,
        reasoning_stream_idle_timeout=5.0,
    )


@pytest.mark.parametrize(
    "model", ["gpt-5", "gpt-5-mini", "gpt-5.1", "gpt-oss-120b", "deepseek-reasoner", "o3-mini"]
)
@ASYNC
async def test_a_reasoning_models_silent_phase_is_waited_for_not_cut(
    server: LoopbackProvider, drive: Drive, model: str
) -> None:
    server.enqueue(Scenario(text=ANSWER, fault=Fault.stall(SILENCE, after_events=1)))
    answer = await drive.invoke(wrapped(server, model=model), "What is the answer?")

    assert answer.content == ANSWER
    assert answer.response_metadata["awaken"]["interruptions"] == []
    assert len(server.requests) == 1  # the reasoning was paid for once


@pytest.mark.parametrize(
    ("model", "settings"),
    [("gpt-4o-mini", {}), ("gpt-5.1", {"reasoning_effort": "none"})],
    ids=["not-a-reasoning-model", "reasoning-turned-off"],
)
@ASYNC
async def test_a_model_that_does_not_reason_is_cut_after_the_plain_idle_timeout(
    server: LoopbackProvider, drive: Drive, model: str, settings: dict[str, Any]
) -> None:
    server.enqueue(Scenario(text=ANSWER, fault=Fault.stall(SILENCE, after_events=1)))
    answer = await drive.invoke(wrapped(server, model=model, **settings), "What is the answer?")

    assert answer.content == ANSWER
    assert [i["kind"] for i in answer.response_metadata["awaken"]["interruptions"]] == ["timeout"]
    assert len(server.requests) == 2


def test_the_models_profile_decides_before_its_name() -> None:
    from langchain_openai import ChatOpenAI

    def timeout(inner: ChatOpenAI) -> float | None:
        model = RecoveringChatModel(
            model=inner, stream_idle_timeout=60.0, reasoning_stream_idle_timeout=180.0
        )
        return model._idle_timeout(inner, {})

    assert timeout(ChatOpenAI(model="house-model", api_key="x")) == 60.0
    house = ChatOpenAI(model="house-model", api_key="x", profile={"reasoning_output": True})
    assert timeout(house) == 180.0
    plain = ChatOpenAI(model="o3-mini", api_key="x", profile={"reasoning_output": False})
    assert timeout(plain) == 60.0
