"""A stream's checkpoints reach the store unbuilt, and the store keeps the same records.

The checkpoint writer hands a store whose class takes them (`takes_deferred`)
the stream's captures as they are: the text as the string and the pieces
appended since, never joined for an append. What the store holds must be,
byte for byte, what it holds when given the built checkpoints.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessageChunk
from langchain_core.outputs import ChatGenerationChunk

from awaken_langchain import InMemoryStreamCheckpointStore, StreamCheckpoint
from awaken_langchain.accumulator import TurnAccumulator
from awaken_langchain.checkpoint import DeferredCheckpoint, GrowingText, built
from awaken_langchain.stores._base import DeltaCheckpointStore
from awaken_langchain.writer import CheckpointWriter
from tests.conftest import STORE_BACKENDS, FakeClock, StoreBackend

LOCAL_BACKENDS = [b for b in STORE_BACKENDS if b.name in ("memory", "diskcache", "file")]
KEY = "a signing key of 32 characters!"

PIECES = st.text(
    st.characters(blacklist_categories=["Cs"]) | st.sampled_from(["\ud800", "é", "字", "🙂"]),
    min_size=1,
    max_size=12,
)
"""Chunks of text, lone surrogates and characters of every UTF-8 length among them."""

STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("chunk"), PIECES),
        st.tuples(st.just("checkpoint"), st.just("")),
        st.tuples(st.just("read"), st.just("")),  # the turn reads its text (joins it)
        st.tuples(st.just("big"), st.integers(1, 3)),  # a long stretch of text
    ),
    max_size=40,
)


def _fields(epoch: int) -> dict[str, Any]:
    return {"run_id": "turn", "model": "m", "fingerprint": "f", "epoch": epoch}


def _record(store: DeltaCheckpointStore, run_id: str) -> tuple[dict[str, Any], bytes]:
    """The stored head (without the write's random id) and text, as the backend holds them."""
    loaded = store._backend_load(run_id)
    assert loaded is not None
    head, text = loaded
    return (
        {
            "fields": dict(head.fields),
            "text_bytes": head.text_bytes,
            "extra": dict(head.extra),
            "text_sha256": head.text_sha256,
        },
        text,
    )


def _fresh(backend: StoreBackend, **kwargs: Any) -> tuple[DeltaCheckpointStore, Path]:
    location = Path(tempfile.mkdtemp(prefix="awaken-deferred-")) / "store"
    store = backend.make(location, **kwargs)
    assert isinstance(store, DeltaCheckpointStore)
    return store, location


def _chunk(text: str) -> ChatGenerationChunk:
    return ChatGenerationChunk(message=AIMessageChunk(content=text))


@pytest.mark.parametrize("signed", [False, True], ids=["unsigned", "signed"])
@pytest.mark.parametrize("backend", LOCAL_BACKENDS, ids=lambda b: b.name)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=STEPS)
def test_a_store_given_captures_holds_the_bytes_it_holds_given_built_checkpoints(
    backend: StoreBackend, signed: bool, steps: list[tuple[str, Any]]
) -> None:
    clock = FakeClock()
    key = KEY if signed else None
    (unbuilt, first), (whole, second) = (
        _fresh(backend, clock=clock, signing_key=key),
        _fresh(backend, clock=clock, signing_key=key),
    )
    try:
        assert type(unbuilt).takes_deferred
        epochs = (unbuilt.claim("turn"), whole.claim("turn"))
        assert epochs[0] == epochs[1]
        acc = TurnAccumulator("message")
        acc.begin_attempt(continuing=False)
        for kind, value in [*steps, ("checkpoint", "")]:
            if kind == "chunk":
                acc.feed(_chunk(value))
            elif kind == "big":
                acc.feed(_chunk("word " * 2_000 * value))  # segments large enough to be files
            elif kind == "read":
                assert isinstance(acc.text, str)
            else:
                capture = acc.capture(**_fields(epochs[0]))
                assert unbuilt.put_many([capture]) == [None]
                whole.put(built(capture))
                assert _record(unbuilt, "turn") == _record(whole, "turn")
                got = unbuilt.get("turn")
                assert got is not None
                assert got.partial_text == acc.text
                assert got == whole.get("turn")
                clock.advance(1.0)
    finally:
        unbuilt.close()
        whole.close()
        shutil.rmtree(first.parent, ignore_errors=True)
        shutil.rmtree(second.parent, ignore_errors=True)


class _Counted(list[str]):
    """A turn's list of text pieces that counts the pieces read from it."""

    read = 0

    def __getitem__(self, index: Any) -> Any:
        found = super().__getitem__(index)
        self.read += len(found) if isinstance(index, slice) else 1
        return found


@pytest.mark.parametrize("backend", LOCAL_BACKENDS, ids=lambda b: b.name)
def test_a_checkpoint_far_into_a_turn_reads_only_the_pieces_appended_since_the_last(
    backend: StoreBackend,
) -> None:
    store, location = _fresh(backend)
    try:
        epoch = store.claim("turn")
        parts = _Counted(["word "] * 10_000)
        store.put(DeferredCheckpoint(_fields(epoch), "", parts, len(parts)))
        parts.read = 0
        for count in range(10_001, 10_021):
            parts.append("word ")
            store.put(DeferredCheckpoint(_fields(epoch), "", parts, count))
        # one piece per put (DiskCache also rewrites its small tail segments, which
        # takes a few pieces more), never the 10 000 before
        assert parts.read == 20 if backend.name != "diskcache" else parts.read <= 100
        got = store.get("turn")
        assert got is not None
        assert got.partial_text == "word " * 10_020
    finally:
        store.close()
        shutil.rmtree(location.parent, ignore_errors=True)


def test_the_writer_hands_captures_unbuilt_only_to_a_class_that_takes_them() -> None:
    class Subclass(InMemoryStreamCheckpointStore):
        """Does not declare ``takes_deferred`` itself: it may read ``partial_text``."""

    for store, unbuilt in ((InMemoryStreamCheckpointStore(), True), (Subclass(), False)):
        given: list[object] = []
        put_many = store.put_many

        def recorded(checkpoints: Any, put_many: Any = put_many, given: Any = given) -> Any:
            given.extend(checkpoints)
            return put_many(checkpoints)

        store.put_many = recorded  # type: ignore[method-assign]
        capture = DeferredCheckpoint({"run_id": "turn"}, "the answer", [", so", " far"], 1)
        CheckpointWriter(store)._commit([capture])
        assert [type(c) for c in given] == [DeferredCheckpoint if unbuilt else StreamCheckpoint]
        got = store.get("turn")
        assert got is not None
        assert got.partial_text == "the answer, so"


@given(
    base=st.text(max_size=5),
    pieces=st.lists(st.text(max_size=4), max_size=8),
    cuts=st.tuples(st.integers(0, 8), st.integers(0, 8)),
    tail=st.integers(0, 40),
)
def test_growing_text_is_the_text_it_stands_for(
    base: str, pieces: list[str], cuts: tuple[int, int], tail: int
) -> None:
    early, late = sorted(min(c, len(pieces)) for c in cuts)
    before, after = GrowingText(base, pieces, early), GrowingText(base, pieces, late)
    whole = base + "".join(pieces[:late])
    assert after.whole() == whole
    assert after.after(before) == "".join(pieces[early:late])
    assert after.last(tail) == whole[max(0, len(whole) - tail) :]
    joined = GrowingText(whole)  # the same text, read back from a store
    assert after.after(joined) == ""
    assert joined.after(before) == "".join(pieces[early:late])
    other = GrowingText(whole + "x")
    assert after.after(other) is None
