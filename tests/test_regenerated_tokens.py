"""``regenerated_output_tokens`` counts the output a recovery makes the model write again.

A continuation after a tool call cut mid-arguments keeps the text and writes
the call again: what it regenerates is the arguments that had arrived, the
same for every provider, and less than a restart (text and arguments) would.
"""

from __future__ import annotations

import pytest

from awaken_langchain import RecoveringChatModel, RetryPolicy
from awaken_langchain.recovery import estimate_tokens
from awaken_langchain.testing import Fault, LoopbackProvider, Scenario, ScriptedToolCall
from tests.conftest import Drive, Sleeps, loopback_client

pytestmark = pytest.mark.asyncio(loop_scope="module")

TEXT = "Let me look up the forecast for you. "
ARGS = {"city": "Paris", "units": "metric", "days": 3, "hourly": False}


@pytest.fixture
def server(shared_server: LoopbackProvider) -> LoopbackProvider:
    shared_server.reset()
    return shared_server


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_continuation_after_a_cut_tool_call_regenerates_only_the_arguments_received(
    server: LoopbackProvider, drive: Drive, provider: str
) -> None:
    scenario = Scenario(
        text=TEXT, tool_calls=[ScriptedToolCall("forecast", ARGS, id="call_1")], chunk_size=4
    )
    pieces = scenario.argument_pieces(scenario.tool_calls[0])
    sent = len(pieces) // 2
    # openai: role, text deltas, tool call head; anthropic: message_start, text block
    # start, text deltas, text block stop, tool block start; then argument deltas
    before = len(scenario.text_pieces()) + (2 if provider == "openai" else 4)
    cut = Scenario(
        text=TEXT,
        tool_calls=[ScriptedToolCall("forecast", ARGS, id="call_1")],
        chunk_size=4,
        fault=Fault.drop_after_events(before + sent),
    )
    server.enqueue(cut, Scenario(tool_calls=[ScriptedToolCall("forecast", ARGS, id="call_2")]))
    sleeps = Sleeps()
    model = RecoveringChatModel(
        model=loopback_client(provider, server),
        retry_policy=RetryPolicy(sleep=sleeps, async_sleep=sleeps.asleep),
    )
    answer = await drive.invoke(model, "What is the weather in Paris?")

    awaken = answer.response_metadata["awaken"]
    assert awaken["plans"] == ["R3"]  # text kept, the cut-off call asked again
    assert [c["id"] for c in answer.tool_calls] == ["call_2"]
    received = "".join(pieces[:sent])
    assert awaken["regenerated_output_tokens"] == estimate_tokens(len(received))
    assert awaken["regenerated_output_tokens"] < estimate_tokens(len(TEXT) + len(received))
