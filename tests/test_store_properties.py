"""Properties of fencing across the epoch horizon and of signed records, on generated data.

Each store of ``STORE_BACKENDS`` that needs no server runs here (a fresh store
per example would make Redis slow; the conformance suite covers it).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from awaken_langchain import StreamCheckpoint, StreamCheckpointError, StreamCheckpointFencedError
from awaken_langchain.checkpoint import (
    CompletedToolCall,
    InFlightToolCall,
    ModelSpan,
    unchecked_checkpoint,
)
from awaken_langchain.stores._base import DeltaCheckpointStore, Head, decode_head
from tests.conftest import STORE_BACKENDS, FakeClock, StoreBackend

LOCAL_BACKENDS = [backend for backend in STORE_BACKENDS if backend.name != "redis"]
GRACE = 30.0
KEY = "a signing key of 32 characters!"

OPERATIONS = st.lists(
    st.one_of(
        st.tuples(st.just("claim"), st.sampled_from(["a", "b"])),
        st.tuples(st.just("put"), st.sampled_from(["a", "b"])),
        st.tuples(st.just("stale-put"), st.sampled_from(["a", "b"])),
        st.tuples(st.just("delete"), st.sampled_from(["a", "b"])),
        st.tuples(st.just("wait"), st.sampled_from([1.0, GRACE / 2, GRACE + 1, 5 * GRACE])),
        st.tuples(st.just("gc"), st.just("")),
    ),
    max_size=40,
)


def fresh(backend: StoreBackend, **settings_: Any) -> tuple[DeltaCheckpointStore, Path]:
    location = Path(tempfile.mkdtemp(prefix="awaken-prop-")) / "store"
    store = backend.make(location, **settings_)
    assert isinstance(store, DeltaCheckpointStore)
    return store, location


def put_refusal(store: DeltaCheckpointStore, run_id: str, epoch: int) -> Exception | None:
    """Put with ``epoch``; return the store's refusal, or ``None`` if it was written."""
    try:
        store.put(StreamCheckpoint(run_id=run_id, partial_text="x", epoch=epoch))
    except StreamCheckpointError as exc:
        return exc
    return None


@pytest.mark.parametrize("backend", LOCAL_BACKENDS, ids=lambda backend: backend.name)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations=OPERATIONS)
def test_claims_only_increase_and_only_the_latest_epoch_writes_whatever_the_history(
    backend: StoreBackend, operations: list[tuple[str, Any]]
) -> None:
    clock = FakeClock()
    store, location = fresh(backend, ttl=GRACE, clock=clock, epoch_grace=GRACE)
    baseline = backend.records(store, location)
    handed_out: dict[str, list[int]] = {"a": [], "b": []}
    latest: dict[str, int] = {}
    written: dict[str, int] = {}  # the epoch of each run's last accepted put
    try:
        for action, arg in operations:
            if action == "claim":
                epoch = store.claim(arg)
                assert all(epoch > earlier for earlier in handed_out[arg])
                handed_out[arg].append(epoch)
                latest[arg] = epoch
            elif action == "put" and arg in latest:
                refusal = put_refusal(store, arg, latest[arg])
                if refusal is None:
                    written[arg] = latest[arg]
                else:  # only once the run's record ended: the writer's run is over
                    assert isinstance(refusal, StreamCheckpointFencedError)
                    assert "the run has ended" in str(refusal)
            elif action == "stale-put":
                for epoch in handed_out[arg][:-1]:
                    with pytest.raises(StreamCheckpointError):
                        store.put(StreamCheckpoint(run_id=arg, partial_text="stale", epoch=epoch))
            elif action == "delete":
                store.delete(arg)
                written.pop(arg, None)
            elif action == "wait":
                clock.advance(arg)
            elif action == "gc":
                store.gc()
        for run_id in ("a", "b"):
            got = store.get(run_id)  # what is stored was written by an epoch still current
            assert got is None or got.epoch == written[run_id]
        clock.advance(GRACE + GRACE + 1)
        store.gc()
        assert backend.records(store, location) <= baseline + 1  # at most the epoch floor
    finally:
        store.close()
        shutil.rmtree(location.parent, ignore_errors=True)


@pytest.mark.parametrize("backend", LOCAL_BACKENDS, ids=lambda backend: backend.name)
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    text=st.text(min_size=1, max_size=40),
    call_args=st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5)),
    part=st.sampled_from(["head", "text"]),
    position=st.floats(min_value=0, max_value=1, exclude_max=True),
    bit=st.integers(min_value=0, max_value=7),
)
def test_a_signed_record_changed_in_any_bit_is_refused_or_reads_back_unchanged(
    backend: StoreBackend,
    text: str,
    call_args: dict[str, Any],
    part: str,
    position: float,
    bit: int,
) -> None:
    store, location = fresh(backend, signing_key=KEY)
    try:
        from awaken_langchain.checkpoint import CompletedToolCall

        original = StreamCheckpoint(
            run_id="run-1",
            partial_text=text,
            completed_tool_calls=(CompletedToolCall(id="c", name="tool", args=call_args),),
        )
        store.put(original)
        loaded = store._backend_load("run-1")
        assert loaded is not None
        head, data = loaded
        raw = bytearray(head.encode() if part == "head" else data)
        raw[int(position * len(raw))] ^= 1 << bit
        if part == "head":
            try:
                changed: Head = decode_head(bytes(raw), run_id="run-1")
            except StreamCheckpointError:
                return  # not a head any more: a reader refuses it as corrupted
            store._backend_replace(changed, data, 0)
        else:
            store._backend_replace(head, bytes(raw), 0)
        reader = backend.make(location, signing_key=KEY) if backend.durable else store
        try:
            got = reader.get("run-1")
        except StreamCheckpointError:
            return
        assert got is not None
        assert got.model_dump(exclude={"updated_at"}) == original.model_dump(exclude={"updated_at"})
    finally:
        store.close()
        shutil.rmtree(location.parent, ignore_errors=True)


# What changes between two puts of one run: nothing but the text (the field objects
# themselves are passed again, as a turn's checkpoints pass them), or one field.
CHANGES = st.lists(
    st.one_of(
        st.tuples(st.just("text"), st.text(max_size=6)),
        st.tuples(st.just("retry_count"), st.integers(min_value=0, max_value=300)),
        st.tuples(st.just("keep_for"), st.none() | st.floats(min_value=1, max_value=1e6)),
        st.tuples(st.just("complete"), st.booleans()),
        st.tuples(st.just("model"), st.sampled_from(["m:a", "m:b", "m:ä"])),
        st.tuples(st.just("provider_sequence_number"), st.none() | st.integers(0, 99)),
        st.tuples(st.just("in_flight_tool_call"), st.none() | st.just('{"a": 1')),
        st.tuples(st.just("completed_tool_calls"), st.integers(min_value=0, max_value=2)),
        st.tuples(st.just("model_spans"), st.booleans()),
    ),
    min_size=1,
    max_size=25,
)


@pytest.mark.parametrize("backend", LOCAL_BACKENDS, ids=lambda backend: backend.name)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(changes=CHANGES, signed=st.booleans())
def test_every_put_of_a_run_reads_back_as_put_whichever_fields_change_between_puts(
    backend: StoreBackend, changes: list[tuple[str, Any]], signed: bool
) -> None:
    store, location = fresh(backend, signing_key=KEY if signed else None)
    epoch = store.claim("run-1")
    fields: dict[str, Any] = {"run_id": "run-1", "epoch": epoch, "model": "m:a"}
    text = ""
    try:
        for name, value in changes:
            fields = dict(fields)  # the same objects again, but for the field changed
            if name == "text":
                text += value
            elif name == "in_flight_tool_call":
                call = None if value is None else InFlightToolCall(index=0, partial_args=value)
                fields[name] = call
            elif name == "completed_tool_calls":
                calls = [CompletedToolCall(id=f"c{i}", name="t", args={}) for i in range(value)]
                fields[name] = tuple(calls)
            elif name == "model_spans":
                spans = (ModelSpan(model="m:a", start=0), ModelSpan(model="m:b", start=0))
                fields[name] = spans if value else ()
            else:
                fields[name] = value
            checkpoint = unchecked_checkpoint(partial_text=text, **fields)
            store.put(checkpoint)
            # read without `get`, which would make the store forget what it wrote
            loaded = store._backend_load("run-1")
            assert loaded is not None
            head, data = loaded
            stored = dict(head.fields)
            del stored["updated_at"]
            assert stored == checkpoint.model_dump(
                mode="json", exclude={"partial_text", "updated_at"}
            )
            assert data.decode("utf-8", "surrogatepass") == text
        got = store.get("run-1")
        assert got is not None
        assert got.model_dump(exclude={"updated_at"}) == checkpoint.model_dump(
            exclude={"updated_at"}
        )
    finally:
        store.close()
        shutil.rmtree(location.parent, ignore_errors=True)
