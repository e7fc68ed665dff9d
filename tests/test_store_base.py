"""Pure rules shared by every store: fencing, head decoding, segment planning."""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
from typing import Any

import pytest

from awaken_langchain import StreamCheckpointError, StreamCheckpointFencedError
from awaken_langchain.checkpoint import (
    CompletedToolCall,
    InFlightToolCall,
    ModelSpan,
    StreamCheckpoint,
    TextBlockStart,
    encode_fields,
    encode_fields_again,
    encode_json,
    unchecked_checkpoint,
)
from awaken_langchain.stores._base import (
    EncodedFields,
    Head,
    PerLoop,
    check_epoch,
    decode_head,
    new_write_id,
    plan_append,
)


def test_current_epoch_passes_the_fence() -> None:
    check_epoch("run-1", 3, 3, action="put")
    check_epoch("run-1", 0, 0, action="put")


def test_older_epoch_is_fenced_with_both_epochs() -> None:
    with pytest.raises(StreamCheckpointFencedError) as caught:
        check_epoch("run-1", 2, 3, action="put")
    assert (caught.value.epoch, caught.value.current_epoch) == (2, 3)
    assert "another process has claimed this run" in str(caught.value)


def test_unclaimed_epoch_tells_the_caller_to_claim_first() -> None:
    with pytest.raises(StreamCheckpointError, match=r"claim\(run_id\)") as caught:
        check_epoch("run-1", 4, 3, action="delete")
    assert not isinstance(caught.value, StreamCheckpointFencedError)
    assert "delete carries epoch 4" in str(caught.value)


def test_head_round_trips() -> None:
    head = Head("run-1", {"run_id": "run-1", "epoch": 2}, 10, "abc", {"segments": [10]})
    assert decode_head(head.encode(), run_id="run-1") == head


def _dumped(checkpoint: StreamCheckpoint, updated_at: float) -> bytes:
    fields = checkpoint.model_dump(mode="json", exclude={"partial_text"})
    fields["updated_at"] = updated_at
    return encode_json(fields)


_ODD = 'quote " backslash \\ newline \n nul \x00 line sep \u2028 lone \ud800 accent é'


@pytest.mark.parametrize(
    "checkpoint",
    [
        StreamCheckpoint(run_id="run-1"),
        StreamCheckpoint(
            run_id="run \u2028 é \ud800",
            thread_id=_ODD,
            model=_ODD,
            fingerprint=_ODD,
            message_id=_ODD,
            partial_text="not in the fields",
            content_blocks=True,
            complete=True,
            keep_for=3600.5,
            retry_count=7,
            epoch=2**40,
        ),
        StreamCheckpoint(
            run_id="run-1",
            completed_tool_calls=(CompletedToolCall(id="a", name="t", args={"x": [1, 2.5]}),),
        ),
        StreamCheckpoint(run_id="run-1", in_flight_tool_call=InFlightToolCall(partial_args='{"')),
        StreamCheckpoint(run_id="run-1", model_spans=(ModelSpan(model="m", start=2),)),
        StreamCheckpoint(run_id="run-1", text_blocks=(TextBlockStart(fields={"id": "x"}),)),
        StreamCheckpoint.model_construct(run_id="run-1", keep_for=60, completed_tool_calls=[]),
    ],
    ids=["defaults", "odd-strings", "tool-call", "in-flight", "spans", "text-blocks", "unchecked"],
)
@pytest.mark.parametrize("updated_at", [0.0, 1_796_083_268.7806175, 100, 1e-7])
@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")  # the unchecked record
def test_hand_encoded_fields_are_the_bytes_pydantic_writes(
    checkpoint: StreamCheckpoint, updated_at: float
) -> None:
    encoded = encode_fields(checkpoint, updated_at)
    assert encoded == _dumped(checkpoint, updated_at)
    assert dict(EncodedFields(encoded)) == json.loads(encoded)


def test_fields_are_encoded_again_from_the_previous_code_only_when_every_field_is_the_same() -> (
    None
):
    first = unchecked_checkpoint(run_id="run-1", model="m", partial_text="a")
    data, code = encode_fields_again(first, 1.5, None)
    assert code is not None
    assert data == encode_fields(first, 1.5)
    longer = unchecked_checkpoint(**{**first.__dict__, "partial_text": "ab"})
    assert encode_fields_again(longer, 2.5, code) == (encode_fields(longer, 2.5), code)
    retried = unchecked_checkpoint(**{**first.__dict__, "retry_count": 1})
    again, new_code = encode_fields_again(retried, 2.5, code)
    assert again == encode_fields(retried, 2.5)
    assert b'"retry_count":1' in again
    assert new_code is not code


def test_a_record_holding_a_list_that_could_be_filled_in_place_is_never_encoded_again() -> None:
    calls: list[CompletedToolCall] = []
    checkpoint = StreamCheckpoint.model_construct(run_id="run-1", completed_tool_calls=calls)
    data, code = encode_fields_again(checkpoint, 1.5, None)
    assert code is None
    assert data == encode_fields(checkpoint, 1.5)


@pytest.mark.parametrize(
    "extra", [{}, {"segments": []}, {"segments": [10, 4]}, {"segments": [1], "other": "x"}]
)
def test_head_of_encoded_fields_is_the_bytes_of_its_decoded_fields(extra: dict[str, Any]) -> None:
    encoded = encode_fields(StreamCheckpoint(run_id="run-1", model=_ODD), 12.5)
    head = Head("run-1", EncodedFields(encoded), 10, "abc", extra)
    assert head.encode() == Head("run-1", json.loads(encoded), 10, "abc", extra).encode()
    assert decode_head(head.encode(), run_id="run-1").fields == json.loads(encoded)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"not json", "not JSON"),
        (encode_json({"some": "other json"}), "not a checkpoint head"),
        (encode_json([1, 2]), "not a checkpoint head"),
        (
            encode_json({"format": "awaken-checkpoint-head", "layout": 99}),
            "storage layout 99",
        ),
        (
            encode_json(
                {
                    "format": "awaken-checkpoint-head",
                    "layout": 1,
                    "checkpoint": {"run_id": "run-1"},
                    "text_bytes": -1,
                    "write_id": "x",
                    "extra": {},
                }
            ),
            "malformed head",
        ),
        (
            Head("run-2", {"run_id": "run-2"}, 0, "x").encode(),
            "belongs to another run id",
        ),
    ],
    ids=["not-json", "foreign-json", "list", "future-layout", "negative-length", "other-run"],
)
def test_bad_heads_are_reported_as_corrupted(data: bytes, message: str) -> None:
    with pytest.raises(StreamCheckpointError, match=message) as caught:
        decode_head(data, run_id="run-1")
    assert caught.value.run_id == "run-1"


def test_empty_delta_adds_no_segment() -> None:
    assert plan_append([100, 10], 0) == (2, [100, 10])


def test_segments_stay_logarithmic_and_appends_stay_cheap() -> None:
    sizes: list[int] = []
    rewritten = 0
    appends = 12_500  # 16-byte deltas up to 200 KB
    for _ in range(appends):
        first, sizes = plan_append(sizes, 16)
        rewritten += sum(sizes[first:])
        assert len(sizes) <= 2 * math.log2(sum(sizes)) + 1
    assert sum(sizes) == 16 * appends
    # A full rewrite per put would average 100 KB; merging costs a few hundred bytes.
    assert rewritten / appends < 16 * 2 * math.log2(appends)


def test_appending_to_a_large_text_leaves_its_first_segment_alone() -> None:
    sizes = [200_000]
    for _ in range(1_000):
        first, sizes = plan_append(sizes, 16)
        assert first >= 1
    assert sizes[0] == 200_000


@pytest.mark.parametrize(
    "fields",
    [
        {"run_id": "run-1"},
        {"run_id": "r", "partial_text": "text", "retry_count": 3, "epoch": 9, "complete": True},
        {
            "run_id": "r",
            "completed_tool_calls": (CompletedToolCall(id="a", name="t", args={"x": 1}),),
            "in_flight_tool_call": InFlightToolCall(partial_args='{"'),
            "model_spans": (ModelSpan(model="m", start=2),),
            "text_blocks": (TextBlockStart(fields={"id": "x"}),),
            "provider_response_id": "resp_1",
            "provider_sequence_number": 4,
            "keep_for": 60.0,
        },
    ],
    ids=["run-id-only", "scalars", "records"],
)
def test_an_unchecked_checkpoint_is_the_one_model_construct_builds(fields: dict[str, Any]) -> None:
    fast = unchecked_checkpoint(**fields)
    slow = StreamCheckpoint.model_construct(**fields)
    assert fast == slow
    assert fast.model_fields_set == slow.model_fields_set
    assert list(fast.__dict__) == list(slow.__dict__)
    assert fast.model_dump_json() == slow.model_dump_json()
    assert encode_fields(fast, 1.5) == encode_fields(slow, 1.5)
    assert repr(fast) == repr(slow)


def test_write_ids_never_repeat_within_a_process_nor_across_processes_and_forks() -> None:
    here = [new_write_id() for _ in range(10_000)]
    assert len(set(here)) == len(here)

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its ids, then leave without running any cleanup
        os.close(read)
        os.write(write, " ".join(new_write_id() for _ in range(100)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        forked = pipe.read().split()
    os.waitpid(pid, 0)
    other = subprocess.run(
        [
            sys.executable,
            "-c",
            "from awaken_langchain.stores._base import new_write_id\n"
            "print(' '.join(new_write_id() for _ in range(100)))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    after = [new_write_id() for _ in range(100)]

    assert len(forked) == len(other) == 100
    assert len({*here, *forked, *other, *after}) == len(here) + 300


# -- one resource per event loop ------------------------------------------------------------


def test_concurrent_first_calls_on_one_loop_share_one_resource_closed_with_the_loop() -> None:
    made: list[object] = []
    closed: list[object] = []

    async def make() -> object:
        await asyncio.sleep(0.01)  # making it takes a while: others ask meanwhile
        made.append(object())
        return made[-1]

    async def close(resource: object) -> None:
        closed.append(resource)

    per_loop: PerLoop[object] = PerLoop(close)

    async def first_calls() -> set[int]:
        got = await asyncio.gather(*(per_loop.get(make) for _ in range(24)))
        return {id(resource) for resource in got}

    assert asyncio.run(first_calls()) == {id(made[0])}
    assert len(made) == 1
    assert closed == made
    assert len(per_loop) == 0


def test_a_failed_make_lets_the_waiting_calls_make_it_again() -> None:
    attempts: list[int] = []

    async def make() -> str:
        attempts.append(1)
        await asyncio.sleep(0.01)
        if len(attempts) == 1:
            raise OSError("refused")
        return "resource"

    async def nothing(resource: str) -> None:
        return None

    per_loop: PerLoop[str] = PerLoop(nothing)

    async def first_calls() -> list[object]:
        return await asyncio.gather(*(per_loop.get(make) for _ in range(3)), return_exceptions=True)

    got = asyncio.run(first_calls())
    assert [type(item).__name__ for item in got] == ["OSError", "str", "str"]
    assert len(attempts) == 2
