"""Which tool calls are released: arguments a checkpoint holds exactly, nothing else.

A released call is one an agent may run, and a replacement process replays it
from the checkpoint: the two must be the same call. So a call is released only
when its arguments are a standard JSON object (no ``NaN`` or ``Infinity``,
which JSON does not have) nested at most ``MAX_ARGS_DEPTH`` levels; any other
call goes to ``invalid_tool_calls``, in the live answer and in the replay alike.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk

from awaken_langchain import FileStreamCheckpointStore, RecoveringChatModel, RetryPolicy
from awaken_langchain.accumulator import MAX_ARGS_DEPTH
from awaken_langchain.testing import LoopbackProvider, Scenario, ScriptedToolCall
from awaken_langchain.testing.scripted import ScriptedChatModel, text, tool_call
from tests.conftest import Drive, loopback_client

pytestmark = pytest.mark.asyncio(loop_scope="module")

VALID = ScriptedToolCall("lookup", {"q": "fox"}, id="call_ok")
NON_STANDARD = '{"x": NaN, "y": [Infinity, -Infinity]}'


def nested(depth: int) -> str:
    """A JSON object whose objects and arrays nest ``depth`` levels."""
    return '{"a":' + "[" * (depth - 1) + "]" * (depth - 1) + "}"


def merged(chunks: list[AIMessageChunk]) -> AIMessage:
    total = chunks[0]
    for chunk in chunks[1:]:
        total = total + chunk
    return AIMessage(**total.model_dump(exclude={"type", "tool_call_chunks", "chunk_position"}))


def calls_of(message: AIMessage) -> tuple[list[Any], list[Any]]:
    return (
        [(c["id"], c["args"]) for c in message.tool_calls],
        [c["id"] for c in message.invalid_tool_calls],
    )


@pytest.fixture
def server(shared_server: LoopbackProvider) -> LoopbackProvider:
    shared_server.reset()
    return shared_server


@pytest.mark.parametrize("with_valid_call", [False, True], ids=["alone", "with-valid-call"])
async def test_arguments_nested_too_deep_to_parse_are_reported_invalid_like_the_bare_model(
    server: LoopbackProvider, drive: Drive, with_valid_call: bool
) -> None:
    calls = [ScriptedToolCall("deep", nested(3000), id="call_deep")]
    calls += [VALID] if with_valid_call else []
    bare = loopback_client("openai", server)
    server.enqueue(Scenario(tool_calls=calls, chunk_size=500))
    expected = await drive.invoke(bare, "q")

    server.enqueue(Scenario(tool_calls=calls, chunk_size=500))
    chunks = await drive.stream(RecoveringChatModel(model=bare), "q")

    answer = merged(chunks)
    assert calls_of(answer) == calls_of(expected)
    valid = [("call_ok", {"q": "fox"})] if with_valid_call else []
    assert calls_of(answer) == (valid, ["call_deep"])
    not_executed = answer.response_metadata["awaken"]["not_executed"]
    assert [c["id"] for c in not_executed] == ["call_deep"]
    assert len(server.requests) == 2  # nothing asked again


async def test_arguments_with_nan_or_infinity_are_never_released(
    server: LoopbackProvider, drive: Drive
) -> None:
    server.enqueue(
        Scenario(tool_calls=[ScriptedToolCall("calc", NON_STANDARD, id="call_nan"), VALID])
    )
    chunks = await drive.stream(RecoveringChatModel(model=loopback_client("openai", server)), "q")

    released = [json.loads(p["args"]) for c in chunks[:-1] for p in c.tool_call_chunks]
    assert released == [{"q": "fox"}]
    answer = merged(chunks)
    assert calls_of(answer) == ([("call_ok", {"q": "fox"})], ["call_nan"])
    assert str(answer.invalid_tool_calls[0]["args"]).endswith(NON_STANDARD)
    (reason,) = answer.response_metadata["awaken"]["not_executed"]
    assert "NaN" in reason["error"]


@pytest.mark.parametrize(
    "arguments",
    [NON_STANDARD, nested(MAX_ARGS_DEPTH + 1), nested(MAX_ARGS_DEPTH)],
    ids=["nan-infinity", "one-level-too-deep", "deepest-released"],
)
async def test_a_call_replayed_from_a_checkpoint_is_the_call_that_was_released(
    tmp_path: Path, drive: Drive, arguments: str
) -> None:
    store = FileStreamCheckpointStore(tmp_path / "checkpoints")
    config = {"run_id": uuid.uuid4()}
    policy = RetryPolicy(sleep=lambda _s: None)
    first = ScriptedChatModel(
        scripts=[
            [
                *text("Checking. "),
                *tool_call("calc", arguments, id="c1"),
                *tool_call("lookup", '{"q": "fox"}', id="c2", index=1),
                *tool_call("lookup", '{"q": "do', id="c3", index=2),
                ValueError("the process dies here"),
            ]
        ]
    )
    live: list[AIMessageChunk] = []

    async def consume() -> None:
        model = RecoveringChatModel(model=first, store=store, retry_policy=policy)
        async for chunk in drive.iterate(model, "q", config):
            live.append(chunk)

    with pytest.raises(ValueError, match="the process dies here"):
        await consume()
    released = [(p["id"], json.loads(p["args"])) for c in live for p in c.tool_call_chunks]

    second = ScriptedChatModel(scripts=[])  # finishes from the checkpoint, asks nothing
    replacement = RecoveringChatModel(model=second, store=store, retry_policy=policy)
    replayed = await drive.invoke(replacement, "q", config)

    assert second.calls == []
    assert [(c["id"], c["args"]) for c in replayed.tool_calls] == released
    expected = ["c1", "c2"] if arguments == nested(MAX_ARGS_DEPTH) else ["c2"]
    assert [call_id for call_id, _ in released] == expected
    if "c1" not in expected:  # not released: not executed, in the replay too
        assert "c1" in [c["id"] for c in replayed.invalid_tool_calls]
