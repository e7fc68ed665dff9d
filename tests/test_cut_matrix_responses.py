"""The cut matrix for OpenAI's Responses API: every cut of a reasoning answer, recovered,
equals the uncut answer.

The loopback provider streams each answer (an encrypted reasoning item, then
text, function calls or both) as the Responses API does; the real
``ChatOpenAI(use_responses_api=True)`` reads it in each ``output_version`` and
the wrapper recovers. Each answer is cut

- at every event boundary: sync (``stream`` and ``invoke``) and async
  (``astream`` or ``ainvoke``, by turns),
- inside every event, at its middle byte, and by a clean end of the body
  before the terminal event: sync, ``stream`` or ``invoke`` by turns.

Each cut is read in one ``output_version`` (``responses/v1``, ``v1``, ``v0``),
by turns, so every version meets every kind of cut and the matrix stays fast.

The provider then continues exactly (``CutOnce``, shared with the Chat
Completions and Anthropic matrix). For every cut the final message's content,
standard content blocks, tool calls and additional kwargs equal the bare
client's uncut answer (the merged stream, or ``invoke``'s non-streamed answer),
but for plan R2, whose cut-off call is reported as not executed; the number
of requests follows from the plan; no function call reaches the caller before
its arguments are whole; and the provider accepts every continuation (it
rejects a reasoning item that was cut, modified or made up).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk

from awaken_langchain import RecoveringChatModel, RetryPolicy
from awaken_langchain.testing import LoopbackProvider, Scenario, ScriptedThinking
from awaken_langchain.testing._wire import ENCRYPTED_REASONING
from tests.conftest import loopback_client
from tests.test_cut_matrix import (
    PROMPT,
    PROSE,
    TIME,
    USAGE,
    WEATHER,
    Cut,
    CutOnce,
    _no_async_sleep,
    _no_sleep,
    arecover,
    arrived,
    asking,
    expected_plans,
    frame_cuts,
    frames_for,
    merged,
    recover,
    renumbered,
    server,
)

__all__ = ["server"]  # the module's loopback provider, shared with the other matrix

RESPONSES = "openai-responses"
CALL_ITEM_IDS = "__openai_function_call_ids__"
THOUGHT = ScriptedThinking("The user wants an answer. Foxes, then the weather.")
STREAMS: dict[str, Scenario] = {
    "reasoning+text": Scenario(text=PROSE, thinking=[THOUGHT], chunk_size=9),
    "reasoning+text+tool": Scenario(
        text="Let me check the weather.", thinking=[THOUGHT], tool_calls=[WEATHER], chunk_size=8
    ),
    "reasoning+text+2-tools": Scenario(
        text="Checking both.", thinking=[THOUGHT], tool_calls=[WEATHER, TIME], chunk_size=10
    ),
    "reasoning+2-tools": Scenario(thinking=[THOUGHT], tool_calls=[WEATHER, TIME], chunk_size=10),
}
STREAMS = {name: dataclasses.replace(s, usage=USAGE, name=name) for name, s in STREAMS.items()}
SURFACES = ("responses/v1", "v1", "v0")
"""``output_version``s: Responses items as blocks, LangChain's standard blocks, and
reasoning in ``additional_kwargs``."""


def inner(surface: str, server: LoopbackProvider) -> BaseChatModel:
    return loopback_client(
        "openai",
        server,
        use_responses_api=True,
        output_version=surface,
        include=[ENCRYPTED_REASONING],
    )


def wrapper(surface: str, server: LoopbackProvider) -> RecoveringChatModel:
    policy = RetryPolicy(sleep=_no_sleep, async_sleep=_no_async_sleep)
    return RecoveringChatModel(model=inner(surface, server), retry_policy=policy)


_UNCUT: dict[tuple[str, str, bool], AIMessage] = {}


def uncut(name: str, surface: str, server: LoopbackProvider, *, invoked: bool) -> AIMessage:
    """The bare client's answer without a fault: merged from its stream, or its ``invoke``."""
    key = (name, surface, invoked)
    if key not in _UNCUT:
        server.reset()
        server.default = STREAMS[name]
        model = asking(STREAMS[name], inner(surface, server))
        _UNCUT[key] = model.invoke(PROMPT) if invoked else merged(list(model.stream(PROMPT)))
    return _UNCUT[key]


def what_a_user_reads(message: AIMessage, surface: str) -> dict[str, Any]:
    found = {
        "content": message.content,
        "content_blocks": message.content_blocks,
        "tool_calls": message.tool_calls,
        "additional_kwargs": message.additional_kwargs,
    }
    if surface == "v0":  # standard blocks of v0 read the message id: see the README's limits
        del found["content_blocks"]
    return renumbered(found)


def without_cut_call(found: dict[str, Any], call_id: str | None) -> dict[str, Any]:
    """The uncut answer without the call plan R2 reports as not executed."""

    def kept(item: Any) -> bool:
        return not (isinstance(item, dict) and call_id in (item.get("id"), item.get("call_id")))

    out = dict(found)
    for key in ("content", "content_blocks", "tool_calls"):
        if isinstance(out.get(key), list):
            out[key] = [item for item in out[key] if kept(item)]
    kwargs = dict(out["additional_kwargs"])
    item_ids = kwargs.pop(CALL_ITEM_IDS, {})  # v0: function call item ids, by call id
    item_ids = {k: v for k, v in item_ids.items() if k != call_id}
    out["additional_kwargs"] = {**kwargs, CALL_ITEM_IDS: item_ids} if item_ids else kwargs
    return out


def without_message_ids(found: dict[str, Any]) -> dict[str, Any]:
    """``found`` without the ids of its text items.

    langchain-openai passes a text item's id with the item's end: a cut after
    the whole text but before that end leaves a continuation with no text,
    whose answer has no text item to give an id.
    """

    def bare(item: Any) -> Any:
        if isinstance(item, dict) and item.get("type") == "text":
            return {k: v for k, v in item.items() if k != "id"}
        return item

    out = dict(found)
    for key in ("content", "content_blocks"):
        if isinstance(out.get(key), list):
            out[key] = [bare(item) for item in out[key]]
    return out


def cases(sync: bool) -> list[Any]:
    out = []
    for name, answer in STREAMS.items():
        for cut in frame_cuts(frames_for(answer, RESPONSES, None)):
            if not sync and cut.kind != "events":
                continue
            turn = cut.event + len(name)
            if sync:
                modes = (
                    ("stream", "invoke")
                    if cut.kind == "events"
                    else (("stream", "invoke")[turn % 2],)
                )
            else:
                modes = (("astream", "ainvoke")[turn % 2],)
            for mode in modes:
                surface = SURFACES[(turn + len(mode)) % len(SURFACES)]
                out.append(
                    pytest.param(name, surface, mode, cut, id=f"{name}-{surface}-{mode}-{cut.id}")
                )
    return out


def check(
    server: LoopbackProvider,
    name: str,
    surface: str,
    mode: str,
    cut: Cut,
    message: AIMessage,
    chunks: list[AIMessageChunk],
) -> None:
    answer = STREAMS[name]
    frames = frames_for(answer, RESPONSES, server.requests[0])
    assert len(frames) == len(frames_for(answer, RESPONSES, None))
    got = arrived(frames, RESPONSES, cut.event)
    plans = expected_plans(got)
    awaken = message.response_metadata["awaken"]
    assert awaken["plans"] == plans
    assert len(server.requests) == (2 if plans in (["R1"], ["R3"], ["R4"]) else 1)
    reference = uncut(name, surface, server, invoked=mode.endswith("invoke"))
    expected = what_a_user_reads(reference, surface)
    if plans == ["R2"]:
        cut_off = reference.tool_calls[got.calls - 1]["id"]
        expected = without_cut_call(expected, cut_off)
        assert [c["id"] for c in message.invalid_tool_calls] == [cut_off]
        assert [(c["id"], c["interrupted"]) for c in awaken["not_executed"]] == [(cut_off, True)]
    else:
        assert message.invalid_tool_calls == []
    found = what_a_user_reads(message, surface)
    if plans in (["R1"], ["R3"]) and got.text == answer.full_text:
        found, expected = without_message_ids(found), without_message_ids(expected)
    assert found == expected
    whole = {c["id"]: c["args"] for c in reference.tool_calls}
    for chunk in chunks:  # a call reaches the caller only whole: never cut-off arguments
        for call in chunk.tool_call_chunks:
            if call["id"] in [c["id"] for c in message.invalid_tool_calls]:
                continue
            assert json.loads(call["args"] or "{}") == whole[call["id"]]
    if chunks:
        assert len({c.id for c in chunks}) == 1
    assert not server.errors
    assert not [r.rejected_by for r in server.requests if r.rejected_by]


def cut_once(server: LoopbackProvider, name: str, surface: str, mode: str, cut: Cut) -> None:
    uncut(name, surface, server, invoked=mode.endswith("invoke"))  # first: it resets the server
    server.reset()
    server.default = CutOnce(STREAMS[name], RESPONSES, cut)


@pytest.mark.parametrize(("name", "surface", "mode", "cut"), cases(sync=True))
def test_recovered_responses_answer_equals_the_uncut_answer(
    server: LoopbackProvider, name: str, surface: str, mode: str, cut: Cut
) -> None:
    cut_once(server, name, surface, mode, cut)
    message, chunks = recover(asking(STREAMS[name], wrapper(surface, server)), mode)
    check(server, name, surface, mode, cut, message, chunks)


@pytest.mark.parametrize(("name", "surface", "mode", "cut"), cases(sync=False))
@pytest.mark.asyncio(loop_scope="module")  # the SDK's async client is shared
async def test_recovered_responses_answer_equals_the_uncut_answer_async(
    server: LoopbackProvider, name: str, surface: str, mode: str, cut: Cut
) -> None:
    cut_once(server, name, surface, mode, cut)
    message, chunks = await arecover(asking(STREAMS[name], wrapper(surface, server)), mode)
    check(server, name, surface, mode, cut, message, chunks)
