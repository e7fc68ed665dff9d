"""StreamRecoveryMiddleware: LangChain v1 agents whose every model call is recovered.

The agents run the real ``ChatOpenAI`` and ``ChatAnthropic`` against the loopback
provider (``max_retries=0``: only the middleware retries). The scripted agent
asks for the weather in Paris (one tool call), then answers in text. Tests
assert what a user cares about: the thread holds the uncut messages with one
message per turn, the tool ran once, and how many requests the provider got.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import (
    HumanInTheLoopMiddleware,
    ModelCallLimitMiddleware,
    ModelFallbackMiddleware,
    SummarizationMiddleware,
    ToolCallLimitMiddleware,
)
from langchain_anthropic.middleware import AnthropicPromptCachingMiddleware
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage
from langchain_core.tools import BaseTool, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command
from pydantic import BaseModel

from awaken_langchain import (
    InMemoryStreamCheckpointStore,
    RecoveringChatModel,
    RetryPolicy,
    StreamInterruptedError,
)
from awaken_langchain.middleware import StreamRecoveryMiddleware
from awaken_langchain.testing import (
    Fault,
    LoopbackProvider,
    RecordedRequest,
    Scenario,
    ScriptedToolCall,
    continuation_responder,
)
from tests.conftest import answered_a_tool, loopback_client

ASYNC = pytest.mark.asyncio(loop_scope="module")
"""One event loop for the module: the SDKs' async clients are shared between tests."""

PROVIDERS = ["openai", "anthropic"]
MODES = ["invoke", "stream", "ainvoke", "astream"]
ANSWER = "It is sunny in Paris today, with a light breeze and about twenty-two degrees."
WEATHER_ARGS = {"city": "Paris"}
TOOL_TURN = Scenario(
    tool_calls=[ScriptedToolCall("weather", WEATHER_ARGS, id="call_weather")], chunk_size=2
)
TEXT_TURN = Scenario(text=ANSWER)


async def _no_wait(_seconds: float) -> None:
    return None


NO_WAIT = RetryPolicy(sleep=lambda _s: None, async_sleep=_no_wait)
QUICK_TO_GIVE_UP = RetryPolicy(
    max_attempts=2, overload_deadline=None, sleep=lambda _s: None, async_sleep=_no_wait
)
"""Spent after two overloaded answers (the default keeps retrying overload for minutes)."""


def agent_responder(request: RecordedRequest) -> Scenario:
    """A model that calls the weather tool, then answers (continuing a cut answer)."""
    if answered_a_tool(request):
        return continuation_responder(TEXT_TURN)(request)
    return TOOL_TURN


@pytest.fixture
def server(shared_server: LoopbackProvider) -> LoopbackProvider:
    shared_server.reset()
    shared_server.default = agent_responder
    return shared_server


def bare(provider: str, server: LoopbackProvider) -> BaseChatModel:
    """The real client for ``provider`` on ``server`` (kept with the server)."""
    return loopback_client(provider, server)


class Weather:
    """The agent's tool; it counts its executions."""

    def __init__(self) -> None:
        self.calls: list[str] = []

        @tool
        def weather(city: str) -> str:
            """Current weather in a city."""
            self.calls.append(city)
            return "sunny, 22 degrees"

        self.tools: list[BaseTool] = [weather]


async def run_agent(
    agent: Any, mode: str, prompt: str = "Weather in Paris?", config: Any = None
) -> tuple[list[Any], str]:
    """Run the agent; return the thread and the text streamed in ``messages`` mode."""
    state = {"messages": [HumanMessage(prompt)]}
    streamed: list[str] = []
    if mode == "invoke":
        return agent.invoke(state, config)["messages"], ""
    if mode == "ainvoke":
        return (await agent.ainvoke(state, config))["messages"], ""
    final: dict[str, Any] = {}
    if mode == "stream":
        parts = agent.stream(state, config, stream_mode=["messages", "values"])
        for kind, data in parts:
            if kind == "values":
                final = data
            elif isinstance(data[0], AIMessageChunk):
                streamed.append(data[0].text)
    else:
        async for kind, data in agent.astream(state, config, stream_mode=["messages", "values"]):
            if kind == "values":
                final = data
            elif isinstance(data[0], AIMessageChunk):
                streamed.append(data[0].text)
    return final["messages"], "".join(streamed)


def assert_uncut_thread(thread: list[Any]) -> None:
    """Human, one tool-call turn, the tool's answer, one whole text turn."""
    assert [type(m).__name__ for m in thread] == [
        "HumanMessage",
        "AIMessage",
        "ToolMessage",
        "AIMessage",
    ]
    call_turn, answer_turn = thread[1], thread[3]
    assert [(c["name"], c["args"]) for c in call_turn.tool_calls] == [("weather", WEATHER_ARGS)]
    assert call_turn.invalid_tool_calls == []
    assert answer_turn.text == ANSWER
    assert answer_turn.tool_calls == []
    assert call_turn.id
    assert answer_turn.id
    assert call_turn.id != answer_turn.id


FAULTS = {
    # the tool-call turn fails before any output: the request is sent again
    "before_output": (Scenario(fault=Fault.overloaded()), None),
    # the answer is cut mid text: it is continued from the saved prefix
    "mid_text": (None, Scenario(text=ANSWER, fault=Fault.drop_after_events(6))),
    # the tool call is cut inside its arguments: nothing was released, it is asked again
    "mid_tool_arguments": (
        Scenario(
            tool_calls=[ScriptedToolCall("weather", WEATHER_ARGS)],
            chunk_size=2,
            fault=Fault.drop_after_events(5),
        ),
        None,
    ),
}


@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("provider", PROVIDERS)
@ASYNC
async def test_agent_thread_holds_the_uncut_turns_and_the_tool_runs_once(
    server: LoopbackProvider, provider: str, mode: str, fault: str
) -> None:
    first, second = FAULTS[fault]
    server.enqueue(first or TOOL_TURN)
    if second is not None:
        server.enqueue(second)
    weather = Weather()
    agent = create_agent(
        bare(provider, server),
        weather.tools,
        middleware=[StreamRecoveryMiddleware(retry_policy=NO_WAIT)],
    )

    thread, streamed = await run_agent(agent, mode)

    assert_uncut_thread(thread)
    assert weather.calls == ["Paris"]
    assert len(server.requests) == 3  # two turns plus one recovery request
    if mode in ("stream", "astream"):
        assert streamed == ANSWER  # every token once, the seam not repeated
    recovered = thread[3] if fault == "mid_text" else thread[1]
    awaken = recovered.response_metadata["awaken"]
    assert (awaken["retries"], awaken["continuations"]) == (
        (0, 1) if fault == "mid_text" else (1, 0)
    )


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@ASYNC
async def test_without_a_fault_the_agent_thread_equals_the_bare_agent_thread(
    server: LoopbackProvider, provider: str
) -> None:
    bare_thread, _ = await run_agent(
        create_agent(bare(provider, server), Weather().tools), "invoke"
    )
    protected = create_agent(
        bare(provider, server), Weather().tools, middleware=[StreamRecoveryMiddleware()]
    )
    thread, _ = await run_agent(protected, "invoke")
    assert [type(m) for m in thread] == [type(m) for m in bare_thread]
    for ours, theirs in zip(thread, bare_thread, strict=True):
        assert ours.content == theirs.content
        assert getattr(ours, "tool_calls", None) == getattr(theirs, "tool_calls", None)
    assert len(server.requests) == 4
    bodies = [r.body for r in server.requests]
    for key in ("tools", "tool_choice", "model"):  # the same request both ways
        assert [b.get(key) for b in bodies[:2]] == [b.get(key) for b in bodies[2:]]


def test_a_model_given_as_a_string_is_protected(
    server: LoopbackProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "x")
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url_openai)
    server.enqueue(TOOL_TURN, Scenario(text=ANSWER, fault=Fault.drop_after_events(6)))
    weather = Weather()
    agent = create_agent(
        "openai:gpt-4o-mini",
        weather.tools,
        middleware=[StreamRecoveryMiddleware(retry_policy=NO_WAIT)],
    )
    thread = agent.invoke({"messages": [HumanMessage("Weather in Paris?")]})["messages"]
    assert_uncut_thread(thread)
    assert weather.calls == ["Paris"]


def test_a_recovered_agent_call_is_logged_with_structured_fields(
    server: LoopbackProvider, caplog: pytest.LogCaptureFixture
) -> None:
    server.enqueue(TOOL_TURN, Scenario(text=ANSWER, fault=Fault.drop_after_events(6)))
    agent = create_agent(
        bare("openai", server),
        Weather().tools,
        middleware=[StreamRecoveryMiddleware(retry_policy=NO_WAIT)],
    )
    with caplog.at_level(logging.INFO, logger="awaken_langchain"):
        agent.invoke({"messages": [HumanMessage("Weather in Paris?")]})
    [record] = [r for r in caplog.records if hasattr(r, "awaken_event")]
    assert record.awaken_event == "awaken_continuation"
    fields = (record.awaken_plan, record.awaken_attempt, record.awaken_cause)
    assert fields == ("R1", 1, "connection")
    assert record.awaken_chars_so_far > 0
    assert record.awaken_run_id


@pytest.mark.parametrize("provider", PROVIDERS)
def test_with_a_store_and_graph_memory_the_cut_turn_is_checkpointed_and_finished(
    server: LoopbackProvider, provider: str
) -> None:
    server.enqueue(TOOL_TURN, Scenario(text=ANSWER, fault=Fault.drop_after_events(6)))
    weather = Weather()
    agent = create_agent(
        bare(provider, server),
        weather.tools,
        middleware=[
            StreamRecoveryMiddleware(
                retry_policy=NO_WAIT,
                store=InMemoryStreamCheckpointStore(),
                checkpoint_every_chunks=1,
            )
        ],
        checkpointer=InMemorySaver(),
    )
    config: Any = {"configurable": {"thread_id": "with-store"}}
    thread = agent.invoke({"messages": [HumanMessage("Weather in Paris?")]}, config)["messages"]
    assert_uncut_thread(thread)
    assert weather.calls == ["Paris"]
    awaken = thread[3].response_metadata["awaken"]
    assert awaken["checkpoint_key"].startswith("with-store:")
    assert awaken["checkpoint_writes"] > 0
    assert agent.get_state(config).values["messages"][3].text == ANSWER


def test_one_wrapper_is_built_per_model_and_reused(server: LoopbackProvider) -> None:
    middleware = StreamRecoveryMiddleware(retry_policy=NO_WAIT, stream_idle_timeout=5.0)
    model = bare("openai", server)
    wrapper = middleware.wrapper_for(model)
    assert middleware.wrapper_for(model) is wrapper
    assert wrapper.model is model
    assert wrapper.stream_idle_timeout == 5.0
    assert middleware.wrapper_for(wrapper) is wrapper  # never wrapped twice
    agent = create_agent(model, Weather().tools, middleware=[middleware])
    agent.invoke({"messages": [HumanMessage("Weather in Paris?")]})
    assert middleware.wrapper_for(model) is wrapper


def test_a_model_setting_given_to_the_middleware_is_refused() -> None:
    with pytest.raises(ValueError, match="temperature"):
        StreamRecoveryMiddleware(temperature=0.2)


@pytest.mark.parametrize("mode", ["invoke", "ainvoke"])
@ASYNC
async def test_a_spent_primary_falls_back_and_the_fallback_stream_is_recovered(
    server: LoopbackProvider, mode: str
) -> None:
    server.default = continuation_responder(TEXT_TURN)
    server.enqueue(
        Scenario(fault=Fault.overloaded(), provider="openai"),
        Scenario(fault=Fault.overloaded(), provider="openai"),
        Scenario(text=ANSWER, fault=Fault.drop_after_events(6), provider="anthropic"),
    )
    agent = create_agent(
        bare("openai", server),
        middleware=[
            ModelFallbackMiddleware(bare("anthropic", server)),
            StreamRecoveryMiddleware(retry_policy=QUICK_TO_GIVE_UP),
        ],
    )
    thread, _ = await run_agent(agent, mode, "Weather?")
    assert [type(m) for m in thread] == [HumanMessage, AIMessage]
    assert thread[1].text == ANSWER
    assert thread[1].response_metadata["awaken"]["continuations"] == 1
    assert [r.provider for r in server.requests] == ["openai", "openai", "anthropic", "anthropic"]


def test_prompt_caching_before_the_middleware_marks_the_first_and_the_continuation_request(
    server: LoopbackProvider,
) -> None:
    server.enqueue(TOOL_TURN, Scenario(text=ANSWER, fault=Fault.drop_after_events(6)))
    weather = Weather()
    agent = create_agent(
        bare("anthropic", server),
        weather.tools,
        system_prompt="You report the weather.",
        middleware=[
            AnthropicPromptCachingMiddleware(unsupported_model_behavior="raise"),
            StreamRecoveryMiddleware(retry_policy=NO_WAIT),
        ],
    )
    thread = agent.invoke({"messages": [HumanMessage("Weather in Paris?")]})["messages"]
    assert_uncut_thread(thread)
    requests = server.requests
    assert len(requests) == 3
    for request in requests:  # the cut answer and its continuation alike
        assert request.body["system"][-1]["cache_control"] == {"type": "ephemeral", "ttl": "5m"}
        assert request.body["tools"][-1]["cache_control"] == {"type": "ephemeral", "ttl": "5m"}
        assert request.body["cache_control"] == {"type": "ephemeral", "ttl": "5m"}


class Forecast(BaseModel):
    city: str
    sky: str


@pytest.mark.parametrize("provider", PROVIDERS)
def test_structured_output_is_bound_as_for_the_bare_model(
    server: LoopbackProvider, provider: str
) -> None:
    forecast = {"city": "Paris", "sky": "sunny"}
    if provider == "openai":  # provider strategy: a JSON schema response format
        server.enqueue(Scenario(text=json.dumps(forecast)), Scenario(text=json.dumps(forecast)))
    else:  # tool strategy: a forced call of the Forecast tool
        call = Scenario(tool_calls=[ScriptedToolCall("Forecast", forecast)])
        server.enqueue(call, call)
    model = bare(provider, server)
    for middleware in ([], [StreamRecoveryMiddleware(retry_policy=NO_WAIT)]):
        agent = create_agent(model, response_format=Forecast, middleware=middleware)
        result = agent.invoke({"messages": [HumanMessage("Forecast for Paris?")]})
        assert result["structured_response"] == Forecast(**forecast)
    plain, protected = (r.body for r in server.requests)
    for key in ("tools", "tool_choice", "response_format"):
        assert plain.get(key) == protected.get(key)


# -- composing with LangChain's own middleware --------------------------------------------


def test_with_summarization_the_agent_completes(server: LoopbackProvider) -> None:
    server.enqueue(TOOL_TURN, Scenario(text=ANSWER, fault=Fault.drop_after_events(6)))
    weather = Weather()
    model = bare("openai", server)
    agent = create_agent(
        model,
        weather.tools,
        middleware=[
            SummarizationMiddleware(model, trigger=("tokens", 100_000)),
            StreamRecoveryMiddleware(retry_policy=NO_WAIT),
        ],
    )
    thread = agent.invoke({"messages": [HumanMessage("Weather in Paris?")]})["messages"]
    assert_uncut_thread(thread)
    assert weather.calls == ["Paris"]


def test_with_human_in_the_loop_the_approved_tool_runs_once(server: LoopbackProvider) -> None:
    server.enqueue(
        Scenario(fault=Fault.overloaded()),
        TOOL_TURN,
        Scenario(text=ANSWER, fault=Fault.drop_after_events(6)),
    )
    weather = Weather()
    agent = create_agent(
        bare("openai", server),
        weather.tools,
        middleware=[
            HumanInTheLoopMiddleware(interrupt_on={"weather": True}),
            StreamRecoveryMiddleware(retry_policy=NO_WAIT),
        ],
        checkpointer=InMemorySaver(),
    )
    config: Any = {"configurable": {"thread_id": "hitl"}}
    first = agent.invoke({"messages": [HumanMessage("Weather in Paris?")]}, config)
    assert "__interrupt__" in first
    assert weather.calls == []
    done = agent.invoke(Command(resume={"decisions": [{"type": "approve"}]}), config)
    assert_uncut_thread(done["messages"])
    assert weather.calls == ["Paris"]


def test_with_tool_call_limit_the_agent_completes(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(fault=Fault.overloaded()))
    weather = Weather()
    agent = create_agent(
        bare("openai", server),
        weather.tools,
        middleware=[
            ToolCallLimitMiddleware(tool_name="weather", run_limit=1),
            StreamRecoveryMiddleware(retry_policy=NO_WAIT),
        ],
    )
    thread = agent.invoke({"messages": [HumanMessage("Weather in Paris?")]})["messages"]
    assert_uncut_thread(thread)
    assert weather.calls == ["Paris"]


def test_with_model_call_limit_a_recovered_call_counts_once(server: LoopbackProvider) -> None:
    server.enqueue(Scenario(fault=Fault.overloaded()), TOOL_TURN)
    server.enqueue(Scenario(text=ANSWER, fault=Fault.drop_after_events(6)))
    weather = Weather()
    agent = create_agent(
        bare("openai", server),
        weather.tools,
        middleware=[
            ModelCallLimitMiddleware(run_limit=2, exit_behavior="error"),
            StreamRecoveryMiddleware(retry_policy=NO_WAIT),
        ],
    )
    thread = agent.invoke({"messages": [HumanMessage("Weather in Paris?")]})["messages"]
    assert_uncut_thread(thread)
    assert len(server.requests) == 4  # two model calls, four requests


def test_a_pre_wrapped_model_is_not_wrapped_again(server: LoopbackProvider) -> None:
    server.enqueue(*[Scenario(fault=Fault.overloaded())] * 2)
    wrapped = RecoveringChatModel(model=bare("openai", server), retry_policy=QUICK_TO_GIVE_UP)
    agent = create_agent(
        wrapped,
        Weather().tools,
        middleware=[StreamRecoveryMiddleware(retry_policy=QUICK_TO_GIVE_UP)],
    )
    with pytest.raises(StreamInterruptedError):
        agent.invoke({"messages": [HumanMessage("Weather in Paris?")]})
    assert len(server.requests) == 2  # one budget of two attempts, not two times two
