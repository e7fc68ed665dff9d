"""The cut matrix: every cut point of a real-client stream, recovered, equals the uncut answer.

Each scripted answer is streamed by the loopback provider in the OpenAI and the
Anthropic wire format, read by the real ``ChatOpenAI`` and ``ChatAnthropic``
(``max_retries=0``), and cut

- at every event boundary (``Fault.drop_after_events(n)`` for every ``n``),
- inside every event, at its first, middle and last byte
  (``Fault.drop_after_bytes``): three deterministic samples per event rather
  than every byte, which keeps the matrix fast,
- by a clean end of the body before the terminal event
  (``Fault.no_terminal_event(after_events=n)`` for every ``n``).

Every event-boundary cut runs in all four modes (``stream``, ``astream``,
``invoke``, ``ainvoke``); each byte and clean-end cut runs in one of them, in
turn, so every mode meets every kind of cut and the matrix stays fast.

The provider then continues exactly: a continuation request is answered with
the rest of the text after the prefix it carries, and the scripted tool calls.
For every cut, the final message (chunks merged with ``+``, and the ``invoke``
result) must equal the same answer read without a fault by the bare client;
the one exception is plan R2, where the cut-off tool call is reported in
``invalid_tool_calls`` and never executed. The plan each cut must take is
derived from the events that had arrived, never listed by hand.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from typing import Any, NamedTuple

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk
from langchain_core.messages.tool import ToolCallChunk
from langchain_core.runnables import Runnable
from pydantic import BaseModel

from awaken_langchain import RecoveringChatModel, RetryPolicy
from awaken_langchain.recovery import DEFAULT_CONTINUATION_PROMPT
from awaken_langchain.testing import (
    Fault,
    LoopbackProvider,
    RecordedRequest,
    Scenario,
    ScriptedCitation,
    ScriptedToolCall,
    ScriptedWebSearch,
    TokenUsage,
    continuation_responder,
    schema_responder,
)
from awaken_langchain.testing._scenarios import Provider
from awaken_langchain.testing._wire import (
    ENCRYPTED_REASONING,
    Frame,
    ResponseContext,
    anthropic_frames,
    estimate_usage,
    openai_frames,
    responses_frames,
    unseal,
)
from tests.conftest import LOOPBACK_MODELS, loopback_client

PROMPT = "Answer, please."
MODELS: dict[Provider, str] = {"openai": "gpt-4o-mini", "anthropic": "claude-loopback"}
assert MODELS == LOOPBACK_MODELS
USAGE = TokenUsage(input_tokens=12, output_tokens=34)

PROSE = (
    "Foxes are small omnivores. They hunt at dusk, cache food for later, "
    "and live in dens dug by other animals."
)
INDENTED_JSON = (
    '{\n  "city": "Paris",\n  "days": [\n    {\n      "t": 21\n    },\n'
    '    {\n      "t": 19\n    }\n  ]\n}'
)
MARKDOWN = (
    "Steps:\n\n- read the file\n- parse it\n  - skip blanks\n\n"
    "```python\ndef f(x):\n    return x + 1\n```\n\nDone."
)
WEATHER = ScriptedToolCall("get_weather", {"city": "Paris", "unit": "celsius"}, id="call_w1")
TIME = ScriptedToolCall("get_time", {"zone": "Europe/Paris"}, id="call_t2")
FOX_URL = "https://example.com/foxes"
DEN_URL = "https://example.com/dens"

STREAMS: dict[str, Scenario] = {
    "prose": Scenario(text=PROSE, chunk_size=9),
    # 4-character pieces: cuts land before, inside (1, 2, 3 or 5 spaces in) and after indentation
    "indented-json": Scenario(text=INDENTED_JSON, chunk_size=4),
    "markdown": Scenario(text=MARKDOWN, chunk_size=5),
    "text+tool": Scenario(text="Let me check the weather.", tool_calls=[WEATHER], chunk_size=8),
    "text+2-tools": Scenario(text="Checking both.", tool_calls=[WEATHER, TIME], chunk_size=10),
    "tools-only": Scenario(tool_calls=[WEATHER, TIME], chunk_size=10),
    # a server-side search, then text with two cited spans (one at the start)
    "web-search": Scenario(
        text=PROSE,
        web_searches=[ScriptedWebSearch("fox habits", [(FOX_URL, "Foxes"), (DEN_URL, "Dens")])],
        citations=[
            ScriptedCitation(0, 26, FOX_URL, "Foxes"),
            ScriptedCitation(70, 106, DEN_URL, "Dens"),
        ],
        chunk_size=9,
    ),
    # cited text and no tools: langchain-anthropic streams the text as strings and each
    # citation as a block; the cited spans follow each other to the end, so every block
    # boundary shows in the stream (a plain block after a cited one would not)
    "cited-no-tools": Scenario(
        text=PROSE,
        citations=[
            ScriptedCitation(27, 66, FOX_URL, "Foxes"),
            ScriptedCitation(66, 106, DEN_URL, "Dens"),
        ],
        chunk_size=9,
    ),
}
STREAMS = {name: dataclasses.replace(s, usage=USAGE, name=name) for name, s in STREAMS.items()}
ANTHROPIC_ONLY = {"web-search", "cited-no-tools"}
"""Streams of blocks only Anthropic sends (Chat Completions ignores searches and citations)."""
PROVIDERS: tuple[Provider, ...] = ("openai", "anthropic")
MODES = ("stream", "astream", "invoke", "ainvoke")


# -- the wire, as the loopback provider renders it --------------------------------------


RENDER = {
    "openai": openai_frames,
    "anthropic": anthropic_frames,
    "openai-responses": responses_frames,
}
"""Each wire format's streamed answer, as the loopback provider renders it."""


def frames_for(
    scenario: Scenario, provider: Provider, request: RecordedRequest | None
) -> list[Frame]:
    """The frames the server sends for ``scenario``: for ``request``, or for a typical one."""
    responses = provider == "openai-responses"
    typical: dict[str, Any] = {"messages": [], "stream_options": {"include_usage": True}}
    if responses:  # the request ``include``s encrypted reasoning
        typical = {"input": [], "include": [ENCRYPTED_REASONING]}
    body: Any = request.body if request is not None else typical
    ctx = ResponseContext(
        number=request.number if request is not None else 1,
        model=MODELS["anthropic" if provider == "anthropic" else "openai"],
        usage=estimate_usage(body, scenario),
        include_usage=provider == "openai"
        and bool((body.get("stream_options") or {}).get("include_usage")),
        request=body if responses else None,
    )
    return RENDER[provider](scenario, ctx)


class Arrived(NamedTuple):
    """What the client had received of an answer after some events."""

    text: str
    calls: int
    """Tool calls begun."""
    terminal: bool


def arrived(frames: list[Frame], provider: Provider, events: int) -> Arrived:
    text, calls, terminal = "", 0, False
    for frame in frames[:events]:
        raw = frame.data.decode()
        data = raw.split("data: ", 1)[1].strip()
        if data == "[DONE]":
            continue
        body = json.loads(data)
        if provider == "openai-responses":
            kind, item = body["type"], body.get("item") or {}
            if kind == "response.output_text.delta":
                text += body["delta"]
            elif kind == "response.output_item.added" and item.get("type") == "function_call":
                calls += 1
            terminal = terminal or kind in ("response.completed", "response.incomplete")
        elif provider == "openai":
            for choice in body.get("choices") or []:
                delta = choice.get("delta") or {}
                text += delta.get("content") or ""
                calls += sum(1 for c in delta.get("tool_calls") or [] if c.get("id"))
                terminal = terminal or bool(choice.get("finish_reason"))
        elif body["type"] == "content_block_delta" and body["delta"]["type"] == "text_delta":
            text += body["delta"]["text"]
        elif body["type"] == "content_block_start" and body["content_block"]["type"] == "tool_use":
            calls += 1
        elif body["type"] == "message_delta":
            terminal = True
    return Arrived(text, calls, terminal)


def expected_plans(got: Arrived) -> list[str]:
    """The plan for what had arrived.

    A tool call is complete once the next call begins or the terminal event
    arrives (neither SDK integration reports the end of one call's arguments);
    the last call begun is the one cut off.
    """
    if got.terminal:
        return []  # the answer was complete: nothing to recover
    if got.calls >= 2:
        return ["R2"]
    if got.text.strip():
        return ["R3" if got.calls else "R1"]
    return ["R4"]


class Cut(NamedTuple):
    """Where a stream is cut: the fault, and how many events arrive whole before it."""

    kind: str
    event: int
    """Events delivered whole (a cut inside an event delivers none of it)."""
    byte: str | None = None
    """For byte cuts: ``first``, ``middle`` or ``last`` byte of the cut event."""

    @property
    def id(self) -> str:
        return f"{self.kind}-{self.event}" + (f"-{self.byte}" if self.byte else "")

    def fault(self, frames: list[Frame]) -> Fault:
        if self.kind == "events":
            return Fault.drop_after_events(self.event)
        if self.kind == "eof":
            return Fault.no_terminal_event(after_events=self.event)
        start = sum(len(f.data) for f in frames[: self.event])
        size = len(frames[self.event].data)
        inside = {"first": 1, "middle": size // 2, "last": size - 1}[self.byte or "first"]
        return Fault.drop_after_bytes(start + inside)


def cuts(scenario: Scenario, provider: Provider) -> list[Cut]:
    frames = frames_for(scenario, provider, None)
    first_terminal = next(i for i, f in enumerate(frames) if f.terminal)
    out = [Cut("events", n) for n in range(len(frames) + 1)]
    out += [Cut("bytes", n, b) for n in range(len(frames)) for b in ("first", "middle", "last")]
    out += [Cut("eof", n) for n in range(first_terminal + 1)]
    return out


def modes(cut: Cut) -> tuple[str, ...]:
    """Every event boundary in every mode; byte and clean-EOF cuts each in one mode, in turn."""
    if cut.kind == "events":
        return MODES
    turn = cut.event * 3 + ("first", "middle", "last").index(cut.byte or "first")
    return (MODES[turn % len(MODES)],)


def cases(sync: bool) -> list[Any]:
    return [
        pytest.param(name, provider, mode, cut, id=f"{name}-{provider}-{mode}-{cut.id}")
        for name, scenario in STREAMS.items()
        for provider in PROVIDERS
        if provider == "anthropic" or name not in ANTHROPIC_ONLY
        for cut in cuts(scenario, provider)
        for mode in modes(cut)
        if (mode in ("stream", "invoke")) == sync
    ]


# -- the provider: cut once, then continue exactly ----------------------------------------


TEXT_PARTS = ("text", "output_text", "input_text")
"""Content parts that carry text (Responses input spells them by role)."""


def _last_text(messages: list[dict[str, Any]], role: str) -> str | None:
    for message in reversed(messages):
        content = message.get("content")
        if message.get("role") == role and content is not None:  # not a Responses call item
            if isinstance(content, str):
                return content
            return "".join(b.get("text", "") for b in content if b.get("type") in TEXT_PARTS)
    return None


class CutOnce:
    """Answers the first request with the scripted answer cut at ``cut``, then continues."""

    def __init__(self, answer: Scenario, provider: Provider, cut: Cut) -> None:
        self.answer = answer
        self.provider = provider
        self.cut = cut
        self.continues = continuation_responder(answer)
        self.first = True

    def __call__(self, request: RecordedRequest) -> Scenario:
        if self.first:
            self.first = False
            frames = frames_for(self.answer, self.provider, request)
            return dataclasses.replace(self.answer, fault=self.cut.fault(frames))
        messages = request.messages
        prefix = _last_text(messages, "assistant")
        asked_to_continue = _last_text(messages, "user") == DEFAULT_CONTINUATION_PROMPT
        if asked_to_continue and prefix == self.answer.full_text:
            # the whole text had arrived (a tool call was cut): the rest is the calls
            rest = {"text": "", "citations": (), "web_searches": (), "thinking": ()}
            return dataclasses.replace(self.answer, **rest)
        if asked_to_continue and prefix and self.answer.full_text.startswith(prefix):
            return self.answer.continued_after(len(prefix))
        return self.continues(request)


# -- clients, built once per module ---------------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[LoopbackProvider]:
    with LoopbackProvider() as provider:
        yield provider


_UNCUT: dict[tuple[str, Provider], AIMessage] = {}
_UNCUT_CALL_CHUNKS: dict[tuple[str, Provider], list[ToolCallChunk]] = {}
"""The uncut stream's tool call chunks, summed as a caller of the bare client sees them."""


def inner_model(provider: Provider, server: LoopbackProvider) -> BaseChatModel:
    # usage streamed on every request, so each call's stream has the events the cuts
    # were drawn from (``include_usage`` adds one)
    settings = {"stream_usage": True} if provider == "openai" else {}
    return loopback_client(provider, server, **settings)


def _no_sleep(seconds: float) -> None:
    pass


async def _no_async_sleep(seconds: float) -> None:
    pass


def wrapper(provider: Provider, server: LoopbackProvider) -> RecoveringChatModel:
    """The recovering model around the real client (kept with the server)."""
    policy = RetryPolicy(sleep=_no_sleep, async_sleep=_no_async_sleep)
    return RecoveringChatModel(model=inner_model(provider, server), retry_policy=policy)


WEB_SEARCH_TOOL = {"type": "web_search_20250305", "name": "web_search", "max_uses": 1}


def tool_for(call: ScriptedToolCall) -> dict[str, Any]:
    """The function tool a scripted call calls (string arguments, as scripted)."""
    arguments = json.loads(call.arguments_json)
    parameters = {"type": "object", "properties": {k: {"type": "string"} for k in arguments}}
    return {
        "type": "function",
        "function": {"name": call.name, "description": call.name, "parameters": parameters},
    }


def asking(answer: Scenario, model: BaseChatModel) -> Runnable[Any, Any]:
    """``model`` as a request for ``answer`` asks it: with the tools its answer calls.

    A search offers the search tool. (Without tools in the request
    langchain-anthropic streams text as strings, not content blocks.)
    """
    if answer.web_searches:
        return model.bind_tools([WEB_SEARCH_TOOL])
    calls = answer.tool_calls
    return model.bind_tools([tool_for(c) for c in calls]) if calls else model


def summed(chunks: list[AIMessageChunk]) -> AIMessageChunk:
    total = chunks[0]
    for chunk in chunks[1:]:
        total = total + chunk
    return total


def merged(chunks: list[AIMessageChunk]) -> AIMessage:
    total = summed(chunks)
    return AIMessage(**total.model_dump(exclude={"type", "tool_call_chunks", "chunk_position"}))


def uncut(name: str, provider: Provider, server: LoopbackProvider) -> AIMessage:
    """The answer read without a fault through the bare client."""
    key = (name, provider)
    if key not in _UNCUT:
        server.reset()
        server.default = STREAMS[name]
        chunks = list(asking(STREAMS[name], inner_model(provider, server)).stream(PROMPT))
        _UNCUT[key] = merged(chunks)
        _UNCUT_CALL_CHUNKS[key] = summed(chunks).tool_call_chunks
    return _UNCUT[key]


_INVOKED: dict[tuple[str, Provider], AIMessage] = {}


def invoked(name: str, provider: Provider, server: LoopbackProvider) -> AIMessage:
    """The answer the bare client's ``invoke`` returns without a fault (one JSON body)."""
    key = (name, provider)
    if key not in _INVOKED:
        server.reset()
        server.default = STREAMS[name]
        _INVOKED[key] = asking(STREAMS[name], inner_model(provider, server)).invoke(PROMPT)
    return _INVOKED[key]


def text_of(message: Any) -> str:
    content = message.content
    if isinstance(content, str):
        return content
    return "".join(
        b if isinstance(b, str) else b.get("text", "")
        for b in content
        if isinstance(b, str) or b.get("type") == "text"
    )


_NUMBERED = re.compile(r"(srvtoolu|toolu)_\d+_|(_loopback)_\d+")


def renumbered(value: Any) -> Any:
    """``value`` without the request numbers the loopback puts in ids and sealed content.

    A recovered turn takes more requests than the uncut one; a restart's search
    blocks and reasoning items, and a continued text item, carry a later
    request's number (reasoning seals its item id into ``encrypted_content``).
    """
    if isinstance(value, dict):
        return {
            k: renumbered(unseal(v) if k == "encrypted_content" and isinstance(v, str) else v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [renumbered(v) for v in value]
    if isinstance(value, str):
        return _NUMBERED.sub(lambda m: f"{m[1]}_N_" if m[1] else f"{m[2]}_N", value)
    return value


def blocks_of(content: str | list[Any]) -> list[dict[str, Any]]:
    """Content as blocks: a string is a text block, empty strings and stream indexes go."""
    items = [content] if isinstance(content, str) else content
    return [
        renumbered({"type": "text", "text": item} if isinstance(item, str) else item)
        for item in items
        if item != ""
    ]


def joined_after(blocks: list[dict[str, Any]], offset: int) -> list[dict[str, Any]]:
    """``blocks`` with the text block after ``offset`` characters of text joined to the one before.

    The one place a recovered turn's blocks differ from the uncut ones: a cut
    exactly at the end of a cited span. No chunk tells that the cited block had
    ended (langchain-anthropic passes no ``content_block_stop``), so the
    continuation's first text extends it, as it extends a block cut mid-span.
    """
    out: list[dict[str, Any]] = []
    seen, joined = 0, False
    for block in blocks:
        if block["type"] == "text" and out and seen == offset and out[-1]["type"] == "text":
            out[-1] = {**out[-1], "text": out[-1]["text"] + block["text"]}
            seen += len(block["text"])
            joined = True
            continue
        if joined and isinstance(block.get("index"), int):  # streamed blocks: one index fewer
            block = {**block, "index": block["index"] - 1}
        out.append(block)
        seen += len(block.get("text", "")) if block["type"] == "text" else 0
    return out


def calls_of(message: AIMessage) -> list[tuple[str, dict[str, Any], str | None]]:
    return [(c["name"], c["args"], c["id"]) for c in message.tool_calls]


def recover(model: Runnable[Any, Any], mode: str) -> tuple[AIMessage, list[AIMessageChunk]]:
    if mode == "invoke":
        return model.invoke(PROMPT), []
    chunks = list(model.stream(PROMPT))
    return merged(chunks), chunks


async def arecover(model: Runnable[Any, Any], mode: str) -> tuple[AIMessage, list[AIMessageChunk]]:
    if mode == "ainvoke":
        return await model.ainvoke(PROMPT), []
    chunks = [chunk async for chunk in model.astream(PROMPT)]
    return merged(chunks), chunks


def check(
    server: LoopbackProvider,
    name: str,
    provider: Provider,
    mode: str,
    cut: Cut,
    message: AIMessage,
    chunks: list[AIMessageChunk],
) -> None:
    """The recovered answer equals the uncut one, except the cut-off call of plan R2."""
    reference = uncut(name, provider, server)
    frames = frames_for(STREAMS[name], provider, server.requests[0])
    # the stream has as many events as the cuts were drawn from: every boundary is covered
    assert len(frames) == len(frames_for(STREAMS[name], provider, None))
    got = arrived(frames, provider, cut.event)
    plans = expected_plans(got)
    awaken = message.response_metadata["awaken"]
    assert awaken["plans"] == plans
    assert len(server.requests) == (2 if plans in (["R1"], ["R3"], ["R4"]) else 1)
    if plans in (["R1"], ["R3"]):
        assert _last_text(server.requests[1].messages, "user") == DEFAULT_CONTINUATION_PROMPT
    assert text_of(message) == text_of(reference)
    if plans == ["R2"]:
        cut_off = reference.tool_calls[got.calls - 1]
        assert calls_of(message) == calls_of(reference)[: got.calls - 1]
        assert [c["id"] for c in message.invalid_tool_calls] == [cut_off["id"]]
        assert cut_off["id"] not in [c["id"] for c in message.tool_calls]
        assert [(c["id"], c["interrupted"]) for c in awaken["not_executed"]] == [
            (cut_off["id"], True)
        ]
    else:
        assert calls_of(message) == calls_of(reference)
        assert message.invalid_tool_calls == []
    if provider == "anthropic" and plans != ["R2"]:  # every block, as the bare client shows it
        bare = invoked(name, provider, server) if mode.endswith("invoke") else reference
        expected = blocks_of(bare.content)
        citations = STREAMS[name].citations
        if plans == ["R1"] and len(got.text) in {c.end for c in citations} - {
            c.start for c in citations
        }:
            expected = joined_after(expected, len(got.text))
        assert blocks_of(message.content) == expected
    if chunks:
        assert "".join(text_of(c) for c in chunks) == text_of(message)
        if plans in ([], ["R4"]):  # the stream's own tool call indexes, as the bare client's
            assert summed(chunks).tool_call_chunks == _UNCUT_CALL_CHUNKS[(name, provider)]
        assert len({c.id for c in chunks}) == 1
        whole = blocks_of(reference.content)
        for chunk in chunks:  # a block other than text reaches the caller whole or not at all
            for block in blocks_of(chunk.content):
                assert block["type"] == "text" or block in whole
    assert not server.errors
    assert not [r.rejected_by for r in server.requests if r.rejected_by]


def cut_once(server: LoopbackProvider, name: str, provider: Provider, cut: Cut) -> None:
    uncut(name, provider, server)  # read first: they reset the server
    invoked(name, provider, server)
    server.reset()
    server.default = CutOnce(STREAMS[name], provider, cut)


# -- the matrix ------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "provider", "mode", "cut"), cases(sync=True))
def test_recovered_answer_equals_the_uncut_answer(
    server: LoopbackProvider, name: str, provider: Provider, mode: str, cut: Cut
) -> None:
    cut_once(server, name, provider, cut)
    message, chunks = recover(asking(STREAMS[name], wrapper(provider, server)), mode)
    check(server, name, provider, mode, cut, message, chunks)


@pytest.mark.parametrize(("name", "provider", "mode", "cut"), cases(sync=False))
@pytest.mark.asyncio(loop_scope="module")  # the SDKs' async clients are shared
async def test_recovered_answer_equals_the_uncut_answer_async(
    server: LoopbackProvider, name: str, provider: Provider, mode: str, cut: Cut
) -> None:
    cut_once(server, name, provider, cut)
    message, chunks = await arecover(asking(STREAMS[name], wrapper(provider, server)), mode)
    check(server, name, provider, mode, cut, message, chunks)


@pytest.mark.parametrize("name", ["text+tool", "text+2-tools", "web-search", "cited-no-tools"])
def test_uncut_anthropic_answer_keeps_its_content_blocks(
    server: LoopbackProvider, name: str
) -> None:
    reference = uncut(name, "anthropic", server)
    server.reset()
    server.default = STREAMS[name]
    message, _ = recover(asking(STREAMS[name], wrapper("anthropic", server)), "stream")
    assert renumbered(message.content) == renumbered(reference.content)


# -- structured output: one JSON document, restarted at every cut ----------------------
#
# Every ``with_structured_output`` method of the real clients, through the wrapper, is
# answered by ``schema_responder`` (a document valid against the request's own schema or
# a forced call with such arguments) and cut at every event boundary, at the middle
# byte of every event, and by a clean end before the terminal event.
# Each cut runs sync, in ``invoke`` and ``stream`` by turns, and each cut but the byte cuts
# async (``ainvoke``/``astream`` by turns): the parsed object the caller gets (the last
# one streamed) equals the uncut one.


class Forecast(BaseModel):
    """A forecast."""

    city: str
    summary: str


STRUCTURED_PROMPT = "The forecast for Paris as JSON with the keys 'city' and 'summary'."
STRUCTURED: dict[str, tuple[Provider, str]] = {
    "chat-json_schema": ("openai", "json_schema"),
    "chat-function_calling": ("openai", "function_calling"),
    "chat-json_mode": ("openai", "json_mode"),
    "responses-json_schema": ("openai-responses", "json_schema"),
    "responses-function_calling": ("openai-responses", "function_calling"),
    "responses-json_mode": ("openai-responses", "json_mode"),
    "anthropic-function_calling": ("anthropic", "function_calling"),
    "anthropic-json_schema": ("anthropic", "json_schema"),
}


def structured_inner(provider: Provider, server: LoopbackProvider) -> BaseChatModel:
    if provider == "openai-responses":
        return loopback_client("openai", server, use_responses_api=True)
    return inner_model(provider, server)


def request_frames(request: RecordedRequest) -> list[Frame]:
    """The frames the server sends ``schema_responder``'s answer to ``request`` in."""
    assert request.provider is not None
    scenario = schema_responder()(request)
    body: Any = request.body
    ctx = ResponseContext(
        number=request.number,
        model=str(body.get("model")),
        usage=estimate_usage(body, scenario),
        include_usage=request.provider == "openai"
        and bool((body.get("stream_options") or {}).get("include_usage")),
        request=body,
    )
    return RENDER[request.provider](scenario, ctx)


def frame_cuts(frames: list[Frame]) -> list[Cut]:
    """Every event boundary, the middle byte of every event, every clean end before the end.

    One byte per event: the first and last bytes of events are cut in the text and
    tool streams above, and a byte cut delivers the same events as a boundary cut.
    """
    first_terminal = next(i for i, f in enumerate(frames) if f.terminal)
    out = [Cut("events", n) for n in range(len(frames) + 1)]
    out += [Cut("bytes", n, "middle") for n in range(len(frames))]
    out += [Cut("eof", n) for n in range(first_terminal + 1)]
    return out


class CutSchemaAnswerOnce:
    """Answers like ``schema_responder``; the first request's answer is cut at ``cut``."""

    def __init__(self, cut: Cut) -> None:
        self.cut = cut
        self.answer = schema_responder()
        self.first = True

    def __call__(self, request: RecordedRequest) -> Scenario:
        scenario = self.answer(request)
        if self.first:
            self.first = False
            return dataclasses.replace(scenario, fault=self.cut.fault(request_frames(request)))
        return scenario


def structured_model(case: str, server: LoopbackProvider, *, bare: bool = False) -> Any:
    provider, method = STRUCTURED[case]
    inner = structured_inner(provider, server)
    model: BaseChatModel = inner
    if not bare:
        policy = RetryPolicy(sleep=_no_sleep, async_sleep=_no_async_sleep)
        model = RecoveringChatModel(model=inner, retry_policy=policy)
    return model.with_structured_output(Forecast, method=method)  # type: ignore[arg-type]


def uncut_structured(case: str, server: LoopbackProvider) -> tuple[Any, list[Cut]]:
    """The bare client's parsed answer and every cut of its stream."""
    server.reset()
    server.default = schema_responder()
    expected = list(structured_model(case, server, bare=True).stream(STRUCTURED_PROMPT))[-1]
    assert isinstance(expected, Forecast)
    return expected, frame_cuts(request_frames(server.requests[0]))


def structured_failures(
    server: LoopbackProvider, expected: Any, cut: Cut, mode: str, got: Any
) -> list[str]:
    """What differs from the uncut answer after ``cut`` (empty when nothing does)."""
    problems = []
    if got != expected:
        problems.append(f"{cut.id} {mode}: parsed {str(got)[:150]!r}")
    if server.errors or any(r.rejected_by for r in server.requests):
        problems.append(f"{cut.id} {mode}: the provider rejected a request")
    return problems


@pytest.mark.parametrize("case", list(STRUCTURED))
def test_a_structured_answer_cut_anywhere_parses_to_the_uncut_object(
    server: LoopbackProvider, case: str
) -> None:
    expected, all_cuts = uncut_structured(case, server)
    structured = structured_model(case, server)
    problems: list[str] = []
    for number, cut in enumerate(all_cuts):
        for mode in (("invoke", "stream")[number % 2],):
            server.reset()
            server.default = CutSchemaAnswerOnce(cut)
            try:
                if mode == "invoke":
                    got = structured.invoke(STRUCTURED_PROMPT)
                else:
                    got = list(structured.stream(STRUCTURED_PROMPT))[-1]
            except Exception as exc:  # every cut is reported, not only the first
                got = exc
            problems += structured_failures(server, expected, cut, mode, got)
    assert problems == [], "\n".join(problems)


@pytest.mark.parametrize("case", list(STRUCTURED))
@pytest.mark.asyncio(loop_scope="module")
async def test_a_structured_answer_cut_anywhere_parses_to_the_uncut_object_async(
    server: LoopbackProvider, case: str
) -> None:
    expected, all_cuts = uncut_structured(case, server)
    structured = structured_model(case, server)
    problems: list[str] = []
    # async samples: every event boundary and clean end; the byte cuts run sync only
    for number, cut in enumerate(c for c in all_cuts if c.kind != "bytes"):
        for mode in (("ainvoke", "astream")[number % 2],):
            server.reset()
            server.default = CutSchemaAnswerOnce(cut)
            try:
                if mode == "ainvoke":
                    got = await structured.ainvoke(STRUCTURED_PROMPT)
                else:
                    got = [part async for part in structured.astream(STRUCTURED_PROMPT)][-1]
            except Exception as exc:  # every cut is reported, not only the first
                got = exc
            problems += structured_failures(server, expected, cut, mode, got)
    assert problems == [], "\n".join(problems)
