"""When an in-flight turn is written: the chunk rule, and the time rule alone or shared."""

from __future__ import annotations

import asyncio
import itertools
import math
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from pydantic import Field

from awaken_langchain import (
    InMemoryStreamCheckpointStore,
    RecoveringChatModel,
    StreamCheckpoint,
    StreamCheckpointError,
)
from awaken_langchain.accumulator import CheckpointCadence, shared_phase


class FakeClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def due_times(
    cadence: CheckpointCadence, clock: FakeClock, arrivals: Sequence[float]
) -> list[float]:
    """Feed chunks arriving at ``arrivals``; return when each write fell due."""
    due = []
    for at in arrivals:
        clock.now = at
        if cadence.observe():
            due.append(at)
            cadence.written()
    return due


def moment(at: float, every: float, phase: float) -> int:
    """The number of the last shared moment at or before ``at``."""
    return math.floor(at / every - phase)


arrival_gaps = st.lists(st.floats(min_value=0.0, max_value=0.6), min_size=1, max_size=60)


@settings(max_examples=300, deadline=None)
@given(
    start=st.floats(min_value=0.0, max_value=1e6),
    every=st.floats(min_value=0.01, max_value=2.0),
    phase=st.one_of(st.none(), st.floats(min_value=0.0, max_value=0.999)),
    gaps=arrival_gaps,
)
def test_output_never_waits_longer_than_every_seconds_after_the_last_write(
    start: float, every: float, phase: float | None, gaps: list[float]
) -> None:
    clock = FakeClock(start)
    cadence = CheckpointCadence(every_chunks=10**9, every_seconds=every, clock=clock, phase=phase)
    last_write = start
    at = start
    for gap in gaps:
        at += gap
        clock.now = at
        due = cadence.observe()
        if at - last_write >= every * (1 + 1e-9):
            assert due, "a chunk that arrives every_seconds after the last write is written"
        if due:
            cadence.written()
            last_write = at


@settings(max_examples=300, deadline=None)
@given(
    start=st.floats(min_value=0.0, max_value=1e6),
    every=st.floats(min_value=0.01, max_value=2.0),
    phase=st.floats(min_value=0.0, max_value=0.999),
    gaps=arrival_gaps,
)
@example(start=0.0, every=0.5, phase=5e-324, gaps=[0.0])  # a write at a moment, at time 0
def test_with_a_phase_the_time_rule_writes_at_most_once_between_two_moments(
    start: float, every: float, phase: float, gaps: list[float]
) -> None:
    clock = FakeClock(start)
    cadence = CheckpointCadence(every_chunks=10**9, every_seconds=every, clock=clock, phase=phase)
    arrivals = list(itertools.accumulate(gaps, initial=start))[1:]
    previous = start
    for at in due_times(cadence, clock, arrivals):
        # a moment lies in (previous write, this write], or this write is at one: its place
        # between two moments is 0, which floating point may round to just under 1
        # (at 0.0 with a phase of 5e-324, (0.0 - 5e-324) % 1.0 == 1.0)
        place = (at / every - phase) % 1.0
        assert moment(at, every, phase) > moment(previous, every, phase) or (
            min(place, 1.0 - place) <= 1e-6
        )
        previous = at


@settings(max_examples=100, deadline=None)
@given(
    offsets=st.lists(st.floats(min_value=0.0, max_value=1.0), min_size=2, max_size=16),
    rate=st.floats(min_value=2.0, max_value=30.0),
    phase=st.floats(min_value=0.0, max_value=0.999),
)
def test_turns_at_their_own_pace_fall_due_together_at_the_shared_moments(
    offsets: list[float], rate: float, phase: float
) -> None:
    """Paced turns started at any time: each time-rule write comes within one chunk of a moment."""
    every, gap = 0.25, 1.0 / rate
    for offset in offsets:
        clock = FakeClock(offset)
        cadence = CheckpointCadence(
            every_chunks=10**9, every_seconds=every, clock=clock, phase=phase
        )
        arrivals = [offset + (n + 1) * gap for n in range(int(3.0 * rate))]
        for at in due_times(cadence, clock, arrivals):
            since_moment = ((at / every - phase) % 1.0) * every
            assert since_moment < gap + 1e-9 or every - since_moment < 1e-9


def test_without_a_phase_the_time_rule_counts_from_the_turns_last_write() -> None:
    clock = FakeClock(100.37)
    cadence = CheckpointCadence(every_chunks=1000, every_seconds=1.0, clock=clock)
    assert due_times(cadence, clock, [100.9, 101.36, 101.37, 102.0, 102.38]) == [101.37, 102.38]


def test_the_chunk_rule_still_writes_between_moments() -> None:
    clock = FakeClock(0.0)
    cadence = CheckpointCadence(every_chunks=3, every_seconds=10.0, clock=clock, phase=0.5)
    assert due_times(cadence, clock, [0.1 * n for n in range(1, 10)]) == pytest.approx(
        [0.3, 0.6, 0.9]
    )


def test_a_phase_outside_the_period_is_refused() -> None:
    with pytest.raises(ValueError, match=r"phase must be in \[0, 1\)"):
        CheckpointCadence(every_chunks=8, every_seconds=0.25, clock=time.monotonic, phase=1.0)


def test_only_the_default_clock_shares_moments() -> None:
    phase = shared_phase(time.monotonic)
    assert phase is not None
    assert 0.0 <= phase < 1.0
    assert shared_phase(FakeClock(0.0)) is None


# -- the wrapper's turns, on the real clock -------------------------------------------


class Paced(BaseChatModel):
    """Streams ``chunks`` numbered chunks, one every ``gap`` seconds of real time."""

    chunks: int = 20
    gap: float = 0.01
    sent: dict[str, list[float]] = Field(default_factory=dict)
    """Per question, when each chunk was yielded (`time.monotonic`)."""

    @property
    def _llm_type(self) -> str:
        return "paced-test"

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        raise NotImplementedError

    async def _astream(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> AsyncIterator[ChatGenerationChunk]:
        sent = self.sent.setdefault(str(messages[-1].content), [])
        for n in range(self.chunks):
            await asyncio.sleep(self.gap)
            sent.append(time.monotonic())
            yield ChatGenerationChunk(message=AIMessageChunk(content=f"{n} "))
        yield ChatGenerationChunk(
            message=AIMessageChunk(content="", response_metadata={"finish_reason": "stop"})
        )


class RecordingStore(InMemoryStreamCheckpointStore):
    """Keeps every in-flight checkpoint it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[StreamCheckpoint] = []

    def put_many(
        self, checkpoints: Sequence[StreamCheckpoint]
    ) -> list[StreamCheckpointError | None]:
        self.written += [c for c in checkpoints if not c.complete]
        return super().put_many(checkpoints)

    def put(self, checkpoint: StreamCheckpoint) -> None:
        if not checkpoint.complete:
            self.written.append(checkpoint)
        super().put(checkpoint)


async def test_turns_of_one_process_fall_due_at_the_same_moments() -> None:
    """Turns started at different times: each time-rule write is due at a chunk just past a moment.

    Four turns stream a chunk every 10 ms and write every 0.2 s (the chunk rule
    is off). For every checkpoint, a shared moment lies between the chunk before
    its last one and its last one (5 ms of slack for the clock read after the
    chunk): with each turn's own time rule that holds for about one write in 13.
    """
    every = 0.2
    store = RecordingStore()
    inner = Paced(chunks=60, gap=0.01)
    model = RecoveringChatModel(
        model=inner, store=store, checkpoint_every_chunks=1000, checkpoint_every_seconds=every
    )
    questions: dict[str, str] = {}

    async def turn(n: int, delay: float) -> str:
        await asyncio.sleep(delay)
        run_id = uuid.uuid4()
        questions[str(run_id)] = f"turn {n}"
        parts = [
            str(c.content) async for c in model.astream(f"turn {n}", config={"run_id": run_id})
        ]
        return "".join(parts)

    delays = (0.0, 0.047, 0.093, 0.151)
    answers = await asyncio.gather(*(turn(n, d) for n, d in enumerate(delays)))
    assert answers == ["".join(f"{n} " for n in range(60))] * 4
    phase = shared_phase(time.monotonic)
    assert phase is not None
    checked = 0
    for checkpoint in store.written:
        sent = inner.sent[questions[checkpoint.run_id]]
        last = int(checkpoint.partial_text.split()[-1])
        if last == 0:
            continue
        assert moment(sent[last] + 0.005, every, phase) > moment(sent[last - 1], every, phase)
        checked += 1
    assert checked >= 8
