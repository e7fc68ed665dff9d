"""The pure core: plans, continuation requests, seam de-duplication, accumulation."""

from __future__ import annotations

import json

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from langchain_anthropic import ChatAnthropic
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, SystemMessage
from langchain_core.messages.tool import tool_call_chunk
from langchain_core.outputs import ChatGenerationChunk
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, ConfigDict

from awaken_langchain.accumulator import TurnAccumulator, strict_args
from awaken_langchain.recovery import Plan, SeamFilter, choose_plan, continuation_messages
from awaken_langchain.request import _OUTPUT_SHAPING_FIELDS, model_settings


@pytest.mark.parametrize(
    ("text", "completed", "in_flight", "plan"),
    [
        ("some text", 0, False, Plan.CONTINUE_TEXT),
        ("some text", 1, True, Plan.FINISH_WITH_TOOL_CALLS),
        ("", 2, False, Plan.FINISH_WITH_TOOL_CALLS),
        ("some text", 0, True, Plan.DROP_TOOL_AND_CONTINUE),
        ("", 0, True, Plan.RESTART),
        ("   ", 0, False, Plan.RESTART),
        ("", 0, False, Plan.RESTART),
    ],
)
def test_plan_is_chosen_from_what_arrived(
    text: str, completed: int, in_flight: bool, plan: Plan
) -> None:
    assert (
        choose_plan(text=text, completed_tool_calls=completed, in_flight_tool_call=in_flight)
        is plan
    )


def test_continuation_request_never_ends_with_an_assistant_message() -> None:
    original = [SystemMessage("be brief"), HumanMessage("hi")]
    request = continuation_messages(original, "Hello there \n ", "continue")
    assert request[:2] == original
    assert isinstance(request[2], AIMessage)
    assert request[2].content == "Hello there"
    assert isinstance(request[-1], HumanMessage)
    assert request[-1].content == "continue"


def feed_all(seam: SeamFilter, pieces: list[str]) -> str:
    return "".join(seam.feed(p) for p in pieces) + seam.flush()


@pytest.mark.parametrize(
    ("prefix", "pieces", "expected"),
    [
        ("The quick brown ", ["fox ", "jumps"], "fox jumps"),
        ("The quick brown ", [" fox"], "fox"),
        ("The quick brown", [" fox"], " fox"),
        ("The quick brown ", ["quick ", "brown ", "fox"], "fox"),
        ("The quick brown ", ["brown fox"], "fox"),  # "brownbrown" is not text
        ("The quick brown", ["brown fox"], " fox"),
        ("It was inter", ["was interrupted here"], "rupted here"),
        ("It was inter", ["interrupted here"], "rupted here"),
        ("Hello, wor", ["world"], "ld"),
        ("The quick br", [" br", "own fox"], " brown fox"),  # one word after a space may be real
        ("The quick brown", [" quick br", "own fox"], " fox"),
        ("The quick brown fox ", ["quick brown fox", " jumps"], "jumps"),
        ("The quick brown fox ", ["ck brown fox", " jumps"], "ck brown fox jumps"),
        ("The quick br", ["quick br", "own fox"], "own fox"),
        ("Say it again", [" again and again"], " again and again"),
        ("cat", ["at the door"], "at the door"),
        ("abc", [""], ""),
    ],
)
def test_seam_filter_removes_only_real_repetition(
    prefix: str, pieces: list[str], expected: str
) -> None:
    assert feed_all(SeamFilter(prefix), pieces) == expected


def test_seam_filter_releases_text_as_soon_as_it_cannot_be_a_repeat() -> None:
    seam = SeamFilter("The quick brown fox ")
    assert seam.feed("zebra") == "zebra"
    assert not seam.pending


def test_strict_args_accept_only_whole_json_objects() -> None:
    assert strict_args('{"a": 1}') == {"a": 1}
    assert strict_args("") == {}
    assert strict_args('{"a": 1, "b') is None
    assert strict_args("[1, 2]") is None


def gen(message: AIMessageChunk) -> ChatGenerationChunk:
    return ChatGenerationChunk(message=message)


def test_accumulator_releases_a_tool_call_when_the_next_one_starts() -> None:
    acc = TurnAccumulator("id")
    pieces = [
        tool_call_chunk(name="f", args='{"x":', id="a", index=0),
        tool_call_chunk(name=None, args=" 1}", id=None, index=0),
        tool_call_chunk(name="g", args='{"y": 2', id="b", index=1),
    ]
    released = []
    for piece in pieces:
        released += acc.feed(gen(AIMessageChunk(content="", tool_call_chunks=[piece])))
    assert [json.loads(c.tool_call_chunks[0]["args"]) for c in released] == [{"x": 1}]
    assert acc.in_flight is not None
    assert acc.in_flight.args() == '{"y": 2'


def test_a_later_attempts_call_moves_past_kept_calls_and_takes_a_discarded_calls_index() -> None:
    acc = TurnAccumulator("id")
    for index, args in ((0, "{}"), (1, '{"cut')):
        piece = tool_call_chunk(name="f", args=args, id=f"c{index}", index=index)
        acc.feed(gen(AIMessageChunk(content="", tool_call_chunks=[piece])))
    acc.begin_attempt(continuing=False)
    piece = tool_call_chunk(name="g", args="{}", id="b", index=0)
    done = {"finish_reason": "tool_calls"}
    out = acc.feed(
        gen(AIMessageChunk(content="", tool_call_chunks=[piece], response_metadata=done))
    )
    # call 1 was cut off and never shown: its index is free, index 0 is not
    assert [c.tool_call_chunks[0]["index"] for c in out] == [1]
    assert [c.index for c in acc.completed] == [0, 1]


def test_checkpoint_snapshot_holds_the_whole_turn_text_across_attempts() -> None:
    acc = TurnAccumulator("id")
    acc.feed(gen(AIMessageChunk(content="first ")))
    acc.begin_attempt(continuing=True)
    acc.feed(gen(AIMessageChunk(content="second")))
    snapshot = acc.snapshot(run_id="r")
    assert snapshot.partial_text == "first second"
    assert snapshot.message_id == "id"


def test_accumulator_trims_the_seam_whitespace_after_a_whole_repeat() -> None:
    acc = TurnAccumulator("id")
    acc.feed(gen(AIMessageChunk(content="The quick brown fox ")))
    acc.begin_attempt(continuing=True)
    for piece in ["quick b", "rown", " fox", " jum", "ps."]:
        acc.feed(gen(AIMessageChunk(content=piece)))
    assert acc.text == "The quick brown fox jumps."


_TURN_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("text"), st.text(alphabet=" ab\n.é", max_size=6)),
        st.tuples(st.just("call"), st.sampled_from(['{"x": 1}', '{"y": '])),
        st.tuples(st.just("read"), st.none()),
        st.tuples(st.just("capture"), st.none()),
        st.tuples(st.just("attempt"), st.booleans()),
    ),
    max_size=40,
)


@given(_TURN_STEPS)
@settings(max_examples=300, deadline=None)
def test_a_checkpoint_built_after_the_turn_went_on_is_the_turn_as_it_was_when_captured(
    steps: list[tuple[str, object]],
) -> None:
    acc = TurnAccumulator("id")
    captured = []
    calls = 0
    for action, value in steps:
        if action == "text":
            acc.feed(gen(AIMessageChunk(content=str(value))))
        elif action == "call":
            piece = tool_call_chunk(name="f", args=str(value), id=f"c{calls}", index=calls)
            calls += 1
            acc.feed(gen(AIMessageChunk(content="", tool_call_chunks=[piece])))
        elif action == "read":
            assert isinstance(acc.text, str)
        elif action == "capture":
            captured.append((acc.capture(run_id="r"), acc.snapshot(run_id="r")))
        else:
            acc.begin_attempt(continuing=bool(value))
    for deferred, at_the_time in captured:
        built = deferred.build()
        assert built == at_the_time
        assert built.model_dump() == at_the_time.model_dump()


def _settings_read_one_by_one(model: object) -> dict[str, object]:
    return {
        name: value
        for name in _OUTPUT_SHAPING_FIELDS
        if (value := getattr(model, name, None)) is not None
    }


class _ExtraSettingsModel(BaseModel):
    model_config = ConfigDict(extra="allow")
    temperature: float | None = None


class _PlainModel:
    def __init__(self) -> None:
        self.seed = 7
        self.top_p = 0.5

    def __getattr__(self, name: str) -> object:
        if name == "thinking":
            return {"type": "enabled"}
        raise AttributeError(name)


@pytest.mark.parametrize(
    "model",
    [
        ChatOpenAI(model="gpt-4o", api_key="k", temperature=0.2, seed=3, reasoning_effort="low"),
        ChatOpenAI(model="gpt-4o", api_key="k", use_responses_api=True, output_version="v1"),
        ChatAnthropic(
            model="claude-sonnet-4-5",
            api_key="k",
            max_tokens=2048,
            thinking={"type": "enabled", "budget_tokens": 1024},
        ),
        _ExtraSettingsModel(temperature=0.1, seed=5, stop=["x"], unrelated=1),
        _PlainModel(),
    ],
    ids=["chat-completions", "responses", "anthropic-thinking", "extra-allowed", "plain-object"],
)
def test_model_settings_are_every_output_shaping_setting_the_model_has(model: object) -> None:
    assert model_settings(model) == _settings_read_one_by_one(model)


_METADATA = st.dictionaries(
    st.sampled_from(["model_provider", "model_name", "system_fingerprint", "service_tier"]),
    st.one_of(st.none(), st.sampled_from(["openai", "anthropic", "gpt-x", 1])),
    max_size=3,
)


@given(st.lists(st.tuples(st.text(min_size=1, max_size=5), _METADATA), min_size=1, max_size=30))
@settings(max_examples=200, deadline=None)
def test_text_chunks_carry_the_turns_id_and_the_turns_metadata_is_every_chunks_merged_in_order(
    chunks: list[tuple[str, dict[str, object]]],
) -> None:
    acc = TurnAccumulator("turn-id")
    expected: dict[str, object] = {}
    released: list[AIMessageChunk] = []
    for text, metadata in chunks:
        released += acc.feed(gen(AIMessageChunk(content=text, response_metadata=dict(metadata))))
        for key, value in metadata.items():  # a later value wins; None never hides one
            if value is not None or key not in expected:
                expected[key] = value
    released += acc.end_of_turn()
    assert "".join(str(c.content) for c in released) == "".join(t for t, _ in chunks)
    for chunk in released:
        assert chunk.id == "turn-id"
        assert chunk.model_dump(exclude_unset=True)["id"] == "turn-id"  # recorded as set
        assert chunk.response_metadata == {}  # merged into the turn's instead
    assert acc.response_metadata == expected


@given(
    st.lists(
        st.tuples(st.text(min_size=1, max_size=5), _METADATA, st.booleans()),
        min_size=1,
        max_size=30,
    )
)
@example(
    [
        ("first ", {}, False),
        ("a", {"model_name": "gpt-x"}, False),
        ("b", {"model_name": "openai"}, True),
        ("c", {"model_name": "gpt-x"}, False),
    ]
)
@settings(max_examples=200, deadline=None)
def test_the_turns_metadata_is_every_chunks_merged_in_order_whichever_path_takes_a_chunk(
    chunks: list[tuple[str, dict[str, object], bool]],
) -> None:
    # a chunk with usage is not plain text: the general path merges its metadata, and a
    # later text chunk equal to one merged before it is merged again
    acc = TurnAccumulator("turn-id")
    expected: dict[str, object] = {}
    released: list[AIMessageChunk] = []
    usage = {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}
    for text, metadata, with_usage in chunks:
        message = AIMessageChunk(
            content=text,
            response_metadata=dict(metadata),
            usage_metadata=usage if with_usage else None,  # type: ignore[arg-type]
        )
        released += acc.feed(gen(message))
        for key, value in metadata.items():
            if value is not None or key not in expected:
                expected[key] = value
    released += acc.end_of_turn()
    assert "".join(str(c.content) for c in released) == "".join(t for t, _, _ in chunks)
    assert acc.response_metadata == expected


def test_a_text_chunk_ends_the_turn_though_its_metadata_is_an_earlier_chunks_dict_changed() -> None:
    acc = TurnAccumulator("turn-id")
    shared: dict[str, object] = {"model_provider": "openai"}

    def chunk(text: str) -> ChatGenerationChunk:
        message = AIMessageChunk(content=text)
        message.response_metadata = shared  # an integration that reuses one dict
        return gen(message)

    acc.feed(gen(AIMessageChunk(content="Hello ")))
    acc.feed(chunk("there"))
    shared["finish_reason"] = "stop"
    acc.feed(chunk("."))
    assert acc.terminal
    assert acc.response_metadata == {"model_provider": "openai", "finish_reason": "stop"}
