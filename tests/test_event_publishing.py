"""What a turn's tap publishes for the chunks it yielded."""

from __future__ import annotations

import json

from langchain_core.messages import AIMessageChunk

from awaken_langchain import InMemoryStreamCheckpointStore
from awaken_langchain._runlog import Tap, open_tap, run_log


def _published(chunks: list[AIMessageChunk], skip: int = 0) -> list[dict[str, object]]:
    log = run_log(InMemoryStreamCheckpointStore())
    tap = Tap(log, "run")
    tap.skip_replayed(skip)
    tap.pending.extend(chunks)
    tap.flush()
    return [json.loads(raw) for raw in log.read("run", 0) or []]


def test_plain_text_chunks_are_published_as_one_text_event_and_tool_calls_after_them() -> None:
    call = {"name": "lookup", "args": '{"q": "x"}', "id": "c1", "index": 0}
    events = _published(
        [
            AIMessageChunk(content="Hel"),
            AIMessageChunk(content=""),
            AIMessageChunk(content="lo"),
            AIMessageChunk(content="", tool_call_chunks=[call]),  # type: ignore[list-item]
            AIMessageChunk(content=" again"),
        ]
    )
    assert events == [
        {"type": "text", "data": {"text": "Hello"}},
        {
            "type": "tool_call",
            "data": {"id": "c1", "name": "lookup", "args": {"q": "x"}, "executable": True},
        },
        {"type": "text", "data": {"text": " again"}},
    ]


def test_text_followers_saw_from_the_process_before_is_not_published_again() -> None:
    events = _published([AIMessageChunk(content="Hello"), AIMessageChunk(content=" world")], 3)
    assert events == [{"type": "text", "data": {"text": "lo world"}}]


def test_an_in_process_runs_checkpoint_publishes_what_the_turn_yielded_before_it_goes_on() -> None:
    """On the in-process store, the quiet round of a run nobody follows is made on the
    turn's own thread: a reader attaching after a checkpoint finds everything the turn
    yielded up to it, with no background thread woken for it."""
    store = InMemoryStreamCheckpointStore()
    tap = open_tap(store, "run")
    assert tap is not None
    for round_ in range(3):
        tap.pending.extend(AIMessageChunk(content=f"{round_}.{n} ") for n in range(8))
        tap.next_wake = 0.0  # the quarter second since the last round has passed
        tap.due()
        published = [json.loads(raw) for raw in tap.log.read("run", 0) or []]
        text = "".join(str(e["data"]["text"]) for e in published if e["type"] == "text")
        assert text == "".join(f"{r}.{n} " for r in range(round_ + 1) for n in range(8))
    tap.end("completed", {})
