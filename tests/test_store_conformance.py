"""The rules every checkpoint store honours, run against every store.

Backends come from ``STORE_BACKENDS`` in ``conftest.py``.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from awaken_langchain import (
    StreamCheckpoint,
    StreamCheckpointError,
    StreamCheckpointFencedError,
    StreamCheckpointStore,
)
from awaken_langchain.checkpoint import CompletedToolCall, InFlightToolCall
from awaken_langchain.stores._base import SIGNING_KEY_ENV, DeltaCheckpointStore, Head
from tests.conftest import FakeClock, StoreFactory


def make_checkpoint(
    run_id: str = "run-1", text: str = "Hello", **update: object
) -> StreamCheckpoint:
    return StreamCheckpoint(
        run_id=run_id,
        thread_id="thread-1",
        model="gpt-test",
        message_id="msg-1",
        partial_text=text,
        **update,  # type: ignore[arg-type]
    )


def durable(factory: StoreFactory) -> None:
    if not factory.backend.durable:
        pytest.skip(f"{factory.backend.name} store keeps nothing beyond one instance")


# -- basic operations -----------------------------------------------------------------


def test_get_missing_is_none(store: StreamCheckpointStore) -> None:
    assert store.get("never-written") is None


def test_put_then_get_round_trips_every_field(store: StreamCheckpointStore) -> None:
    checkpoint = StreamCheckpoint(
        run_id="run-1",
        thread_id="thread-1",
        model="claude-test",
        message_id="msg-1",
        partial_text="The answer is",
        completed_tool_calls=(
            CompletedToolCall(id="call-1", name="search", args={"q": "x", "n": [1, 2]}, index=0),
        ),
        in_flight_tool_call=InFlightToolCall(
            id="call-2", name="fetch", index=1, partial_args='{"u'
        ),
        retry_count=2,
    )
    store.put(checkpoint)
    got = store.get("run-1")
    assert got is not None
    assert got.model_dump(exclude={"updated_at"}) == checkpoint.model_dump(exclude={"updated_at"})


def test_put_stamps_updated_at_with_the_store_clock(
    store_factory: StoreFactory, clock: FakeClock
) -> None:
    store = store_factory(clock=clock)
    store.put(make_checkpoint(updated_at=5.0))
    got = store.get("run-1")
    assert got is not None
    assert got.updated_at == clock.now


def test_put_overwrites_the_previous_checkpoint(store: StreamCheckpointStore) -> None:
    store.put(make_checkpoint(text="first version of a long text", retry_count=0))
    store.put(make_checkpoint(text="second", retry_count=1))
    got = store.get("run-1")
    assert got is not None
    assert (got.partial_text, got.retry_count) == ("second", 1)


def test_runs_are_independent(store: StreamCheckpointStore) -> None:
    store.put(make_checkpoint("run-a", "alpha"))
    store.put(make_checkpoint("run-b", "beta"))
    store.delete("run-a")
    assert store.get("run-a") is None
    got = store.get("run-b")
    assert got is not None
    assert got.partial_text == "beta"


def test_delete_removes_the_checkpoint(store: StreamCheckpointStore) -> None:
    store.put(make_checkpoint())
    store.delete("run-1")
    assert store.get("run-1") is None
    assert store.list_run_ids() == []


def test_delete_missing_is_not_an_error(store: StreamCheckpointStore) -> None:
    store.delete("never-written")
    store.delete("never-written")


def test_delete_is_idempotent(store: StreamCheckpointStore) -> None:
    store.put(make_checkpoint())
    store.delete("run-1")
    store.delete("run-1")
    assert store.get("run-1") is None


def test_put_after_delete_starts_a_new_checkpoint(store: StreamCheckpointStore) -> None:
    store.put(make_checkpoint(text="old text"))
    store.delete("run-1")
    store.put(make_checkpoint(text="old text and more"))
    got = store.get("run-1")
    assert got is not None
    assert got.partial_text == "old text and more"


# -- delta writes --------------------------------------------------------------------


def test_delta_puts_read_back_exactly(store: StreamCheckpointStore) -> None:
    text = ""
    for step in range(300):
        text += f"token {step} é 中 😀 "
        store.put(make_checkpoint(text=text, retry_count=step % 3))
        if step % 37 == 0:
            got = store.get("run-1")
            assert got is not None
            assert got.partial_text == text
    got = store.get("run-1")
    assert got is not None
    assert (got.partial_text, got.retry_count) == (text, 299 % 3)


def written_bytes() -> int:
    """Bytes this process has passed to write() so far (Linux)."""
    try:
        with open("/proc/self/io") as handle:
            return next(int(line.split()[1]) for line in handle if line.startswith("wchar:"))
    except OSError:
        pytest.skip("/proc/self/io is not available")


@pytest.mark.parametrize("signed", [False, True], ids=["unsigned", "signed"])
def test_delta_put_writes_about_its_delta_not_the_whole_text(
    store_factory: StoreFactory, signed: bool
) -> None:
    if not store_factory.backend.uses_directory:
        pytest.skip("the store writes no local files to count")
    store = store_factory(**({"signing_key": "k" * 32} if signed else {}))
    text = "x" * 400_000
    store.put(make_checkpoint(text=text))
    before = written_bytes()
    for _ in range(10):
        text += "y" * 16
        store.put(make_checkpoint(text=text))
    per_put = (written_bytes() - before) / 10
    assert per_put < 50_000  # a rewrite writes at least the 400 KB of text
    got = store.get("run-1")
    assert got is not None
    assert got.partial_text == text


def test_non_extending_put_after_delta_puts_replaces_the_text(
    store: StreamCheckpointStore,
) -> None:
    text = "abc"
    for _ in range(20):
        text += "def"
        store.put(make_checkpoint(text=text))
    store.put(make_checkpoint(text="abX"))
    store.put(make_checkpoint(text="abXY"))
    got = store.get("run-1")
    assert got is not None
    assert got.partial_text == "abXY"


def test_put_with_unchanged_text_updates_the_other_fields(store: StreamCheckpointStore) -> None:
    store.put(make_checkpoint(text="same"))
    store.put(make_checkpoint(text="same", retry_count=4))
    got = store.get("run-1")
    assert got is not None
    assert (got.partial_text, got.retry_count) == ("same", 4)


def test_delta_put_never_splices_onto_another_writers_text(store_factory: StoreFactory) -> None:
    durable(store_factory)
    first, second = store_factory(), store_factory()
    first.put(make_checkpoint(text="abc"))
    second.put(make_checkpoint(text="xyz"))
    first.put(make_checkpoint(text="abcdef"))
    got = second.get("run-1")
    assert got is not None
    assert got.partial_text == "abcdef"


def test_resumed_writer_extends_the_stored_checkpoint(store_factory: StoreFactory) -> None:
    durable(store_factory)
    crashed = store_factory()
    crashed.put(make_checkpoint(text="partial answer"))
    replacement = store_factory()
    epoch = replacement.claim("run-1")
    resumed = replacement.get("run-1")
    assert resumed is not None
    replacement.put(
        resumed.model_copy(update={"partial_text": "partial answer, done", "epoch": epoch})
    )
    got = store_factory().get("run-1")
    assert got is not None
    assert (got.partial_text, got.epoch) == ("partial answer, done", epoch)


def test_threads_writing_different_runs_lose_nothing(store: StreamCheckpointStore) -> None:
    def write(worker: int) -> str:
        text = ""
        for step in range(25):
            text += f"<{worker}.{step}>"
            store.put(make_checkpoint(f"run-{worker}", text))
        return text

    with ThreadPoolExecutor(max_workers=4) as pool:
        expected = list(pool.map(write, range(4)))
    for worker, text in enumerate(expected):
        got = store.get(f"run-{worker}")
        assert got is not None
        assert got.partial_text == text


def test_racing_unfenced_writers_never_mix_their_texts(store_factory: StoreFactory) -> None:
    stores = [store_factory() for _ in range(2)] if store_factory.backend.durable else []
    shared = store_factory()

    def write(worker: int) -> None:
        store = stores[worker % 2] if stores else shared
        text = f"T{worker}|"
        for _ in range(30):
            text += f"<{worker}>"
            store.put(make_checkpoint(text=text))

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(write, range(4)))
    got = shared.get("run-1")
    assert got is not None
    worker = int(got.partial_text[1])
    body = got.partial_text[len(f"T{worker}|") :]
    assert body == f"<{worker}>" * (len(body) // len(f"<{worker}>"))
    assert body


# -- fencing ---------------------------------------------------------------------------


def test_claim_returns_strictly_increasing_epochs(store: StreamCheckpointStore) -> None:
    epochs = [store.claim("run-1") for _ in range(5)]
    assert epochs == sorted(set(epochs))
    assert epochs[0] >= 1


def test_claims_of_different_runs_are_independent(store: StreamCheckpointStore) -> None:
    first_a = store.claim("run-a")
    second_a = store.claim("run-a")
    only_b = store.claim("run-b")
    store.put(make_checkpoint("run-a", "a", epoch=second_a))  # b's claim fenced nobody in a
    store.put(make_checkpoint("run-b", "b", epoch=only_b))
    with pytest.raises(StreamCheckpointFencedError):
        store.put(make_checkpoint("run-a", "a, stale", epoch=first_a))


def test_put_with_the_current_epoch_is_accepted(store: StreamCheckpointStore) -> None:
    epoch = store.claim("run-1")
    store.put(make_checkpoint(epoch=epoch))
    got = store.get("run-1")
    assert got is not None
    assert got.epoch == epoch


def test_put_with_a_stale_epoch_is_fenced_and_changes_nothing(
    store: StreamCheckpointStore,
) -> None:
    old = store.claim("run-1")
    store.put(make_checkpoint(text="old owner", epoch=old))
    new = store.claim("run-1")
    store.put(make_checkpoint(text="new owner", epoch=new))
    with pytest.raises(StreamCheckpointFencedError) as caught:
        store.put(make_checkpoint(text="new owner plus stale text", epoch=old))
    assert (caught.value.epoch, caught.value.current_epoch, caught.value.run_id) == (
        old,
        new,
        "run-1",
    )
    got = store.get("run-1")
    assert got is not None
    assert (got.partial_text, got.epoch) == ("new owner", new)


def test_stale_writer_is_fenced_even_before_the_new_owner_writes(
    store: StreamCheckpointStore,
) -> None:
    old = store.claim("run-1")
    store.put(make_checkpoint(text="abc", epoch=old))
    store.claim("run-1")
    with pytest.raises(StreamCheckpointFencedError):
        store.put(make_checkpoint(text="abcdef", epoch=old))
    got = store.get("run-1")
    assert got is not None
    assert got.partial_text == "abc"


def test_put_many_reports_a_fenced_checkpoint_in_order_and_writes_the_others(
    store: StreamCheckpointStore,
) -> None:
    old = store.claim("run-2")
    store.put(make_checkpoint("run-2", "kept", epoch=old))
    store.claim("run-2")

    errors = store.put_many(
        [
            make_checkpoint("run-1", "one"),
            make_checkpoint("run-2", "kept, then stale", epoch=old),
            make_checkpoint("run-3", "three"),
        ]
    )

    assert errors[0] is None
    assert errors[2] is None
    assert isinstance(errors[1], StreamCheckpointFencedError)
    assert errors[1].run_id == "run-2"
    texts = [(c.partial_text if c else None) for c in map(store.get, ["run-1", "run-2", "run-3"])]
    assert texts == ["one", "kept", "three"]


def test_put_many_appends_never_splice_onto_another_writers_record(
    store_factory: StoreFactory,
) -> None:
    durable(store_factory)
    one, two, reader = store_factory(), store_factory(), store_factory()
    try:
        texts = {"run-1": "", "run-2": ""}
        for step in range(12):
            writer = one if step % 3 else two  # another instance writes now and then
            for run_id in texts:
                texts[run_id] += f"<{run_id}:{step}:\u00e9>"
            checkpoints = [make_checkpoint(run_id, text) for run_id, text in texts.items()]
            assert writer.put_many(checkpoints) == [None, None]
            got = [reader.get(run_id) for run_id in texts]  # the writers never read
            assert [c.partial_text if c else None for c in got] == list(texts.values())
    finally:
        for each in (one, two, reader):
            each.close()


def test_delete_with_a_stale_epoch_is_fenced(store: StreamCheckpointStore) -> None:
    old = store.claim("run-1")
    new = store.claim("run-1")
    store.put(make_checkpoint(epoch=new))
    with pytest.raises(StreamCheckpointFencedError):
        store.delete("run-1", epoch=old)
    assert store.get("run-1") is not None
    store.delete("run-1", epoch=new)
    assert store.get("run-1") is None


def test_delete_without_epoch_is_unconditional(store: StreamCheckpointStore) -> None:
    store.claim("run-1")
    epoch = store.claim("run-1")
    store.put(make_checkpoint(epoch=epoch))
    store.delete("run-1")
    assert store.get("run-1") is None


def test_put_with_an_unclaimed_epoch_is_refused(store: StreamCheckpointStore) -> None:
    with pytest.raises(StreamCheckpointError, match="claim") as caught:
        store.put(make_checkpoint(epoch=3))
    assert not isinstance(caught.value, StreamCheckpointFencedError)
    assert store.get("run-1") is None
    epoch = store.claim("run-1")
    with pytest.raises(StreamCheckpointError, match="claim") as caught:
        store.put(make_checkpoint(epoch=epoch + 1))
    assert not isinstance(caught.value, StreamCheckpointFencedError)


def test_epoch_zero_without_any_claim_is_allowed(store: StreamCheckpointStore) -> None:
    store.put(make_checkpoint(text="unfenced", epoch=0))
    store.put(make_checkpoint(text="unfenced, again", epoch=0))
    store.delete("run-1", epoch=0)
    assert store.get("run-1") is None


def test_epoch_zero_after_a_claim_is_fenced(store: StreamCheckpointStore) -> None:
    store.claim("run-1")
    with pytest.raises(StreamCheckpointFencedError):
        store.put(make_checkpoint(epoch=0))


def test_claims_stay_increasing_after_delete(store: StreamCheckpointStore) -> None:
    first = store.claim("run-1")
    store.put(make_checkpoint(epoch=first))
    store.delete("run-1")
    assert store.claim("run-1") > first


def test_claims_stay_increasing_after_ttl_expiry_and_gc(
    store_factory: StoreFactory, clock: FakeClock
) -> None:
    store = store_factory(ttl=10, clock=clock)
    first = store.claim("run-1")
    store.put(make_checkpoint(epoch=first))
    clock.advance(11)
    assert store.gc() == 1
    assert store.claim("run-1") > first


def test_epochs_are_monotonic_across_store_instances(store_factory: StoreFactory) -> None:
    durable(store_factory)
    first = store_factory().claim("run-1")
    second = store_factory().claim("run-1")
    assert second > first
    with pytest.raises(StreamCheckpointFencedError):
        store_factory().put(make_checkpoint(epoch=first))


@pytest.mark.slow
def test_epochs_are_monotonic_across_processes(store_factory: StoreFactory) -> None:
    durable(store_factory)
    store = store_factory()
    mine = store.claim("run-1")
    theirs = int(store_factory.run_child("print(store.claim('run-1'))").strip())
    assert theirs > mine
    with pytest.raises(StreamCheckpointFencedError):
        store.put(make_checkpoint(epoch=mine))
    assert store.claim("run-1") > theirs


@pytest.mark.slow
def test_replacement_process_resumes_the_turn_and_fences_the_old_writer(
    store_factory: StoreFactory,
) -> None:
    durable(store_factory)
    store = store_factory()
    old = store.claim("run-1")
    store.put(make_checkpoint(text="The answer", epoch=old))
    store.put(make_checkpoint(text="The answer is", epoch=old))
    store_factory.run_child(
        "epoch = store.claim('run-1')\n"
        "resumed = store.get('run-1')\n"
        "assert resumed is not None and resumed.partial_text == 'The answer is'\n"
        "store.put(resumed.model_copy(update={'partial_text': 'The answer is 42', "
        "'epoch': epoch}))\n"
    )
    with pytest.raises(StreamCheckpointFencedError):
        store.put(make_checkpoint(text="The answer is 7", epoch=old))
    got = store.get("run-1")
    assert got is not None
    assert got.partial_text == "The answer is 42"
    assert got.epoch > old


# -- the epoch records' horizon ---------------------------------------------------------

GRACE = 60.0


def one_turn(store: StreamCheckpointStore, run_id: str, *, finish: bool = True) -> int:
    """Claim, write three checkpoints and (unless abandoned) delete: one turn."""
    epoch = store.claim(run_id)
    text = ""
    for step in range(3):
        text += f"token {step} "
        store.put(make_checkpoint(run_id, text, epoch=epoch))
    if finish:
        store.delete(run_id, epoch=epoch)
    return epoch


def test_a_stale_writer_is_fenced_once_the_new_owner_has_ended_the_run(
    store: StreamCheckpointStore,
) -> None:
    stale = store.claim("run-1")  # a writer that stalls, holding its epoch
    store.put(make_checkpoint(text="stale owner", epoch=stale))
    newer = one_turn(store, "run-1")  # another process takes over and finishes the turn
    with pytest.raises(StreamCheckpointFencedError):
        store.put(make_checkpoint(text="stale owner wakes up", epoch=stale))
    with pytest.raises(StreamCheckpointFencedError):
        store.delete("run-1", epoch=stale)
    assert store.get("run-1") is None
    assert store.claim("run-1") > newer


def test_store_returns_to_its_baseline_after_turns_and_gc(
    store_factory: StoreFactory, clock: FakeClock
) -> None:
    store = store_factory(ttl=1, clock=clock, epoch_grace=GRACE)
    baseline = store_factory.records(store)
    for n in range(200):
        one_turn(store, f"turn-{n}", finish=n % 10 != 9)  # one in ten is abandoned
    assert store.list_run_ids() == sorted(f"turn-{n}" for n in range(9, 200, 10))
    assert store_factory.records(store) > baseline
    store_factory.let_time_pass(store, clock, 1 + GRACE + 1)
    store.gc()
    assert store.list_run_ids() == []
    assert store_factory.records(store) <= baseline + 1  # at most the store's epoch floor
    assert store.gc() == 0


def test_the_epoch_record_of_a_claim_without_a_checkpoint_is_kept_for_the_grace_period(
    store_factory: StoreFactory, clock: FakeClock
) -> None:
    store = store_factory(ttl=1, clock=clock, epoch_grace=GRACE)
    epoch = store.claim("run-1")  # its owner may still be on its way to the first write
    store_factory.let_time_pass(store, clock, GRACE - 1)
    store.gc()
    with pytest.raises(StreamCheckpointFencedError):  # the claim still fences unfenced writers
        store.put(make_checkpoint(text="an unfenced writer", epoch=0))
    assert store_factory.records(store) >= 1
    assert store.claim("run-1") > epoch


def test_a_live_checkpoint_keeps_its_epoch_record_however_long_the_turn(
    store_factory: StoreFactory, clock: FakeClock
) -> None:
    store = store_factory(clock=clock, epoch_grace=GRACE)
    epoch = store.claim("run-1")
    store.put(make_checkpoint(text="a turn that streams", epoch=epoch))
    store_factory.let_time_pass(store, clock, 10 * GRACE)
    store.gc()
    store.put(make_checkpoint(text="a turn that streams for long", epoch=epoch))
    got = store.get("run-1")
    assert got is not None
    assert (got.partial_text, got.epoch) == ("a turn that streams for long", epoch)


def test_stale_writer_is_refused_after_the_epoch_record_was_collected(
    store_factory: StoreFactory, clock: FakeClock
) -> None:
    store = store_factory(ttl=1, clock=clock, epoch_grace=GRACE)
    stale = store.claim("run-1")  # a writer that stalls, holding its epoch
    store.put(make_checkpoint(text="stale owner", epoch=stale))
    newer = one_turn(store, "run-1")  # another process takes over and finishes the turn
    store_factory.let_time_pass(store, clock, GRACE + 2)
    store.gc()
    assert store_factory.records(store) <= 1  # the run's epoch record is gone
    with pytest.raises(StreamCheckpointError) as caught:  # no record: its run has ended
        store.put(make_checkpoint(text="stale owner wakes up", epoch=stale))
    # fenced below the store's epoch floor; Redis, whose floor is the clock: never claimed
    assert "the run has ended" in str(caught.value) or "claim" in str(caught.value)
    assert store.get("run-1") is None
    latest = store.claim("run-1")  # a claim after the horizon still exceeds every epoch
    assert latest > newer > stale
    with pytest.raises(StreamCheckpointFencedError):
        store.put(make_checkpoint(text="stale owner wakes up", epoch=stale))
    with pytest.raises(StreamCheckpointFencedError):
        store.put(make_checkpoint(text="the finished owner", epoch=newer))
    store.put(make_checkpoint(text="latest owner", epoch=latest))
    got = store.get("run-1")
    assert got is not None
    assert (got.partial_text, got.epoch) == ("latest owner", latest)


def test_claims_increase_across_many_collections_of_the_epoch_record(
    store_factory: StoreFactory, clock: FakeClock
) -> None:
    store = store_factory(ttl=1, clock=clock, epoch_grace=GRACE)
    handed_out = []
    for _ in range(6):
        for _ in range(3):
            handed_out.append(store.claim("run-1"))
        store.put(make_checkpoint(epoch=handed_out[-1]))
        store.delete("run-1", epoch=handed_out[-1])
        store_factory.let_time_pass(store, clock, GRACE + 2)
        store.gc()
    assert handed_out == sorted(set(handed_out))
    assert store.claim("run-1") > handed_out[-1]
    for old in handed_out:
        with pytest.raises(StreamCheckpointFencedError):
            store.put(make_checkpoint(epoch=old))


def test_operator_delete_lets_gc_remove_the_epoch_record_later(
    store_factory: StoreFactory, clock: FakeClock
) -> None:
    store = store_factory(clock=clock, epoch_grace=GRACE)
    baseline = store_factory.records(store)
    one_turn(store, "run-1", finish=False)
    store.delete("run-1")  # what `awaken-langchain checkpoints rm` does
    store_factory.let_time_pass(store, clock, GRACE + 1)
    store.gc()  # what `awaken-langchain checkpoints gc` does
    assert store_factory.records(store) <= baseline + 1


def test_epoch_grace_must_be_positive(store_factory: StoreFactory) -> None:
    with pytest.raises(ValueError, match="epoch_grace"):
        store_factory(epoch_grace=0)


# -- TTL, listing, gc ------------------------------------------------------------------


def test_expired_checkpoint_is_not_returned(store_factory: StoreFactory, clock: FakeClock) -> None:
    store = store_factory(ttl=60, clock=clock)
    store.put(make_checkpoint())
    clock.advance(60)
    assert store.get("run-1") is not None
    clock.advance(1)
    assert store.get("run-1") is None
    assert store.list_run_ids() == []
    assert store.list_checkpoints() == []


def test_put_refreshes_the_ttl(store_factory: StoreFactory, clock: FakeClock) -> None:
    store = store_factory(ttl=60, clock=clock)
    store.put(make_checkpoint(text="a"))
    clock.advance(50)
    store.put(make_checkpoint(text="ab"))
    clock.advance(50)
    got = store.get("run-1")
    assert got is not None
    assert got.partial_text == "ab"


def test_gc_removes_expired_checkpoints_only(store_factory: StoreFactory, clock: FakeClock) -> None:
    store = store_factory(ttl=60, clock=clock)
    store.put(make_checkpoint("old-1"))
    store.put(make_checkpoint("old-2"))
    clock.advance(30)
    store.put(make_checkpoint("fresh"))
    clock.advance(31)
    assert store.gc() == 2
    assert store.gc() == 0
    assert store.list_run_ids() == ["fresh"]
    if store_factory.backend.durable:  # removed, not just hidden: no TTL, still gone
        assert store_factory(clock=clock).list_run_ids() == ["fresh"]


def test_gc_without_ttl_removes_nothing(store: StreamCheckpointStore) -> None:
    store.put(make_checkpoint())
    assert store.gc() == 0
    assert store.get("run-1") is not None


def test_list_run_ids_and_list_checkpoints(store: StreamCheckpointStore) -> None:
    for run_id in ("b", "a", "c"):
        store.put(make_checkpoint(run_id, f"text of {run_id}"))
    store.delete("c")
    assert store.list_run_ids() == ["a", "b"]
    assert sorted((c.run_id, c.partial_text) for c in store.list_checkpoints()) == [
        ("a", "text of a"),
        ("b", "text of b"),
    ]


# -- bad data and bad input ------------------------------------------------------------


@pytest.mark.parametrize("part", ["head", "text"])
def test_corrupted_record_raises_store_error(store_factory: StoreFactory, part: str) -> None:
    store = store_factory()
    store.put(make_checkpoint(text="some text worth keeping"))
    store_factory.corrupt(store, "run-1", part)
    reader = store_factory() if store_factory.backend.durable else store
    with pytest.raises(StreamCheckpointError) as caught:
        reader.get("run-1")
    assert caught.value.run_id == "run-1"
    assert "corrupt" in str(caught.value)


def test_corrupted_record_can_be_deleted_and_rewritten(store_factory: StoreFactory) -> None:
    store = store_factory()
    store.put(make_checkpoint(text="some text"))
    store_factory.corrupt(store, "run-1", "head")
    store.delete("run-1")
    store.put(make_checkpoint(text="fresh"))
    got = store.get("run-1")
    assert got is not None
    assert got.partial_text == "fresh"


def test_oversized_checkpoint_is_refused_naming_the_setting(store_factory: StoreFactory) -> None:
    store = store_factory(max_checkpoint_bytes=4096)
    store.put(make_checkpoint(text="small"))
    with pytest.raises(StreamCheckpointError, match="max_checkpoint_bytes=4096"):
        store.put(make_checkpoint(text="small" + "x" * 5000))
    got = store.get("run-1")
    assert got is not None
    assert got.partial_text == "small"


def test_oversized_fresh_checkpoint_is_refused(store_factory: StoreFactory) -> None:
    store = store_factory(max_checkpoint_bytes=1024)
    with pytest.raises(StreamCheckpointError, match="max_checkpoint_bytes"):
        store.put(make_checkpoint(text="é" * 1024))
    assert store.get("run-1") is None


@pytest.mark.parametrize(
    "text",
    [
        "emoji 😀👩‍👩‍👧 flags 🇫🇷",
        "CJK 中文字符 日本語 한국어",
        "combining e\u0301 a\u0308 \u0915\u094d\u0937",
        "lone surrogates \ud800 and \udfff and \udc00\ud83d",
        "nul \x00 and controls \x1b[0m \u2028",
    ],
    ids=["emoji", "cjk", "combining", "lone-surrogates", "controls"],
)
def test_unicode_round_trips_exactly(store: StreamCheckpointStore, text: str) -> None:
    run_id = f"run {text[:12]}"
    if "\x00" in run_id:
        run_id = "run-nul-text"
    checkpoint = make_checkpoint(
        run_id,
        text,
        completed_tool_calls=(CompletedToolCall(id="c", name="t", args={"text": text}),),
        in_flight_tool_call=InFlightToolCall(partial_args='{"text": "' + text),
    )
    store.put(checkpoint)
    store.put(checkpoint.model_copy(update={"partial_text": text + text}))
    got = store.get(run_id)
    assert got is not None
    assert got.partial_text == text + text
    assert got.completed_tool_calls == checkpoint.completed_tool_calls
    assert got.in_flight_tool_call == checkpoint.in_flight_tool_call
    assert run_id in store.list_run_ids()


HOSTILE_RUN_IDS = [
    "a/b/c",
    "../../escape",
    "..",
    "/etc/passwd",
    "..\\..\\windows",
    "x" * 1024,
    "é" * 1024,
]


@pytest.mark.parametrize("run_id", HOSTILE_RUN_IDS, ids=lambda r: r[:20])
def test_hostile_run_ids_stay_inside_the_store(
    store_factory: StoreFactory, tmp_path: Path, run_id: str
) -> None:
    store = store_factory()
    before = {p for p in tmp_path.rglob("*") if not p.is_relative_to(store_factory.location)}
    epoch = store.claim(run_id)
    store.put(make_checkpoint(run_id, "text", epoch=epoch))
    store.put(make_checkpoint(run_id, "text and more", epoch=epoch))
    got = store.get(run_id)
    assert got is not None
    assert got.partial_text == "text and more"
    assert store.list_run_ids() == [run_id]
    after = {p for p in tmp_path.rglob("*") if not p.is_relative_to(store_factory.location)}
    assert after == before
    if store_factory.backend.uses_directory:
        for path in store_factory.location.rglob("*"):
            assert len(path.name) < 255
            assert path.resolve().is_relative_to(store_factory.location.resolve())
    store.delete(run_id, epoch=epoch)
    assert store.get(run_id) is None


@pytest.mark.parametrize(
    ("run_id", "message"),
    [
        ("a\x00b", "NUL"),
        ("x" * 1025, "limit is 1024"),
        ("", "empty"),
        (42, "must be a str"),
    ],
    ids=["nul", "too-long", "empty", "not-a-str"],
)
def test_unusable_run_ids_are_refused_clearly(
    store: StreamCheckpointStore, run_id: object, message: str
) -> None:
    for call in (store.get, store.claim, store.delete):
        with pytest.raises(StreamCheckpointError, match=message):
            call(run_id)  # type: ignore[operator]
    with pytest.raises(StreamCheckpointError, match=message):
        make_checkpoint(run_id)  # type: ignore[arg-type]
    assert store.list_run_ids() == []


def test_put_of_something_else_is_refused_clearly(store: StreamCheckpointStore) -> None:
    with pytest.raises(StreamCheckpointError, match="expects a StreamCheckpoint, got dict"):
        store.put({"run_id": "run-1", "partial_text": "x"})  # type: ignore[arg-type]


# -- signed records ----------------------------------------------------------------------

KEY = "a signing key of 32 characters!"
OTHER_KEY = "another key, also long enough..."


def reopen(factory: StoreFactory, store: StreamCheckpointStore, **settings: object) -> Any:
    """A store with other settings over the same records (copied for the memory store)."""
    if factory.backend.durable:
        return factory(**settings)
    other = factory(**settings)
    assert isinstance(store, DeltaCheckpointStore)
    assert isinstance(other, DeltaCheckpointStore)
    for run_id in store.list_run_ids():
        loaded = store._backend_load(run_id)
        assert loaded is not None
        other._backend_replace(*loaded, 0)
    return other


def write_raw(store: StreamCheckpointStore, head: Head, text: bytes) -> None:
    """Write a record's bytes as someone with write access to the backend could."""
    assert isinstance(store, DeltaCheckpointStore)
    store._backend_replace(head, text, 0)


def load_raw(store: StreamCheckpointStore, run_id: str) -> tuple[Head, bytes]:
    assert isinstance(store, DeltaCheckpointStore)
    loaded = store._backend_load(run_id)
    assert loaded is not None
    return loaded


def assert_refused(store: StreamCheckpointStore, run_id: str, why: str) -> None:
    with pytest.raises(StreamCheckpointError) as caught:
        store.get(run_id)
    message = str(caught.value)
    assert caught.value.run_id == run_id
    assert "signature did not verify" in message
    assert why in message
    assert "signing_key" in message
    assert SIGNING_KEY_ENV in message
    assert not isinstance(caught.value, StreamCheckpointFencedError)


def test_signed_records_round_trip_through_delta_writes(store_factory: StoreFactory) -> None:
    store = store_factory(signing_key=KEY)
    text = ""
    for step in range(60):
        text += f"token {step} é 中 😀 \ud800 "
        store.put(make_checkpoint(text=text, retry_count=step % 3))
    got = store.get("run-1")
    assert got is not None
    assert got.partial_text == text
    resumed = reopen(store_factory, store, signing_key=KEY)
    resumed_got = resumed.get("run-1")
    assert resumed_got is not None
    assert resumed_got.partial_text == text
    resumed.put(make_checkpoint(text=text + " and the end"))  # a delta after a verified read
    again = reopen(store_factory, resumed, signing_key=KEY).get("run-1")
    assert again is not None
    assert again.partial_text == text + " and the end"


def test_record_signed_with_another_key_is_refused(store_factory: StoreFactory) -> None:
    store = store_factory(signing_key=KEY)
    store.put(make_checkpoint(text="signed by the first key"))
    assert_refused(reopen(store_factory, store, signing_key=OTHER_KEY), "run-1", "wrong key")


def test_unsigned_record_is_refused_by_a_store_with_a_key(store_factory: StoreFactory) -> None:
    store = store_factory()
    store.put(make_checkpoint(text="written without a key"))
    assert_refused(reopen(store_factory, store, signing_key=KEY), "run-1", "no signature")


def test_record_with_changed_text_is_refused(store_factory: StoreFactory) -> None:
    store = store_factory(signing_key=KEY)
    store.put(make_checkpoint(text="Transfer 10 dollars"))
    head, text = load_raw(store, "run-1")
    write_raw(store, head, text.replace(b"10", b"99"))  # same length, other words
    assert_refused(reopen(store_factory, store, signing_key=KEY), "run-1", "text was changed")


INJECTED_CALL = {"id": "evil", "name": "transfer", "args": {"to": "attacker"}, "index": 0}


@pytest.mark.parametrize(
    "change",
    [
        {"completed_tool_calls": [INJECTED_CALL]},
        {"complete": True},
        {"model": "another-model"},
        {"updated_at": 9e9},
        {"retry_count": 0, "thread_id": "another-thread"},
    ],
    ids=["injected-tool-call", "complete", "model", "updated-at", "thread"],
)
def test_record_with_a_changed_head_is_refused(
    store_factory: StoreFactory, change: dict[str, object]
) -> None:
    store = store_factory(signing_key=KEY)
    store.put(make_checkpoint(text="Looking it up", retry_count=1))
    head, text = load_raw(store, "run-1")
    write_raw(
        store,
        Head(
            head.run_id,
            {**head.fields, **change},
            head.text_bytes,
            head.write_id,
            head.extra,
            head.text_sha256,
            head.signature,
        ),
        text,
    )
    assert_refused(reopen(store_factory, store, signing_key=KEY), "run-1", "head or run id")


def test_record_moved_to_another_run_is_refused(store_factory: StoreFactory) -> None:
    store = store_factory(signing_key=KEY)
    store.put(make_checkpoint("run-a", "the answer of run a"))
    head, text = load_raw(store, "run-a")
    moved_fields = {**head.fields, "run_id": "run-b"}
    write_raw(
        store,
        Head(
            "run-b",
            moved_fields,
            head.text_bytes,
            head.write_id,
            head.extra,
            head.text_sha256,
            head.signature,
        ),
        text,
    )
    reader = reopen(store_factory, store, signing_key=KEY)
    assert_refused(reader, "run-b", "head or run id")
    write_raw(
        store,
        Head(
            "run-c",
            head.fields,
            head.text_bytes,
            head.write_id,
            head.extra,
            head.text_sha256,
            head.signature,
        ),
        text,
    )  # not even relabelled
    with pytest.raises(StreamCheckpointError, match="another run id"):
        reopen(store_factory, store, signing_key=KEY).get("run-c")
    got = reader.get("run-a")
    assert got is not None
    assert got.partial_text == "the answer of run a"


def test_signing_key_comes_from_the_environment_when_not_given(
    store_factory: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SIGNING_KEY_ENV, KEY)
    store = store_factory()
    store.put(make_checkpoint(text="signed through the environment"))
    got = reopen(store_factory, store, signing_key=KEY).get("run-1")
    assert got is not None
    assert_refused(reopen(store_factory, store, signing_key=OTHER_KEY), "run-1", "wrong key")
    monkeypatch.delenv(SIGNING_KEY_ENV)
    unsigned = reopen(store_factory, store)  # a store without a key reads signed records
    got = unsigned.get("run-1")
    assert got is not None
    assert got.partial_text == "signed through the environment"


@pytest.mark.parametrize("from_env", [False, True], ids=["argument", "environment"])
def test_short_signing_key_is_refused_naming_the_setting(
    store_factory: StoreFactory, monkeypatch: pytest.MonkeyPatch, from_env: bool
) -> None:
    if from_env:
        monkeypatch.setenv(SIGNING_KEY_ENV, "short")
    setting = SIGNING_KEY_ENV if from_env else "signing_key"
    with pytest.raises(ValueError, match=f"{setting} is 5 bytes long"):
        store_factory(**({} if from_env else {"signing_key": "short"}))


# -- async twins -----------------------------------------------------------------------


async def test_async_twins_follow_the_same_rules(store: StreamCheckpointStore) -> None:
    assert await store.aget("run-1") is None
    old = await store.aclaim("run-1")
    await store.aput(make_checkpoint(text="async", epoch=old))
    await store.aput(make_checkpoint(text="async text", epoch=old))
    got = await store.aget("run-1")
    assert got is not None
    assert got.partial_text == "async text"
    new = await store.aclaim("run-1")
    assert new > old
    with pytest.raises(StreamCheckpointFencedError):
        await store.aput(make_checkpoint(text="async text!", epoch=old))
    with pytest.raises(StreamCheckpointFencedError):
        await store.adelete("run-1", epoch=old)
    await store.adelete("run-1", epoch=new)
    await store.adelete("run-1")
    assert await store.aget("run-1") is None


def test_store_is_a_context_manager(store_factory: StoreFactory) -> None:
    with store_factory() as store:
        store.put(make_checkpoint())
    if store_factory.backend.durable:
        assert store_factory().get("run-1") is not None


def test_store_files_are_private_to_the_owner(store_factory: StoreFactory) -> None:
    if not store_factory.backend.uses_directory:
        pytest.skip("the store keeps no files")
    store = store_factory()
    store.put(make_checkpoint(text="private " * 10_000))
    store.put(make_checkpoint(text="private " * 10_001))
    assert store_factory.location.stat().st_mode & 0o777 == 0o700
    for path in store_factory.location.rglob("*"):
        if path.is_file():
            assert path.stat().st_mode & 0o077 == 0, path
    assert os.access(store_factory.location, os.W_OK)
