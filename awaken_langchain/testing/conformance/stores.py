"""The checkpoint store contract as pytest tests a user runs on their own store.

Subclass :class:`StoreConformanceTests` in a test module and give it a
``make_store`` fixture: a callable that builds a store with the given settings
(``ttl``, ``clock``, ``max_checkpoint_bytes``, ``epoch_grace``, ``signing_key``).
Every store one ``make_store`` builds during a test must share its records (the
same directory, database or key prefix), and each test needs fresh records::

    from awaken_langchain.testing.conformance import StoreConformanceTests


    class TestMyStore(StoreConformanceTests):
        @pytest.fixture
        def make_store(self, tmp_path):
            return lambda **settings: MyStore(tmp_path / "db", **settings)

Class attributes and methods a subclass may override:

- ``shares_data = False`` for a store whose instances keep nothing beyond
  themselves (an in-process store): the tests that need two instances over one
  set of records are skipped, and :meth:`StoreConformanceTests.reopen` must be
  overridden for the signing tests.
- the ``store_in_child`` fixture: Python source of an expression that builds a
  store over the same records in a fresh interpreter; the fencing races across
  processes run only when it is given.
- :meth:`StoreConformanceTests.let_time_pass`: for a backend that expires
  records on its own clock (Redis), do what it would have done by then.

Every test closes the stores it built. The async tests run their own event
loop (``asyncio.run``), so no asyncio plugin is needed.
"""

# ruff: noqa: D102 (each test's name states the rule it checks)

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from awaken_langchain.checkpoint import (
    CompletedToolCall,
    InFlightToolCall,
    StreamCheckpoint,
    StreamCheckpointStore,
)
from awaken_langchain.errors import StreamCheckpointError, StreamCheckpointFencedError
from awaken_langchain.stores._base import SIGNING_KEY_ENV

__all__ = ["GRACE", "SettableClock", "StoreConformanceTests", "make_checkpoint", "one_turn"]

MakeStore = Callable[..., StreamCheckpointStore]


class SettableClock:
    """A wall clock the tests move by hand (the stores' ``clock=`` setting)."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` forward."""
        self.now += seconds


def make_checkpoint(
    run_id: str = "run-1", text: str = "Hello", **update: object
) -> StreamCheckpoint:
    """A checkpoint of ``run_id`` with ``text`` and any other fields given."""
    return StreamCheckpoint(
        run_id=run_id,
        thread_id="thread-1",
        model="gpt-test",
        message_id="msg-1",
        partial_text=text,
        **update,
    )


def _text_of(checkpoint: StreamCheckpoint | None) -> str | None:
    return None if checkpoint is None else checkpoint.partial_text


HOSTILE_RUN_IDS = [
    "a/b/c",
    "../../escape",
    "..",
    "/etc/passwd",
    "..\\..\\windows",
    "x" * 1024,
    "é" * 1024,
]
"""Run ids that must be stored as data: path parts, long ids, non-ASCII."""

HOSTILE_TEXTS = [
    "emoji 😀👩‍👩‍👧 flags 🇫🇷",
    "CJK 中文字符 日本語 한국어",
    "combining e\u0301 a\u0308 \u0915\u094d\u0937",
    "lone surrogates \ud800 and \udfff and \udc00\ud83d",
    "nul \x00 and controls \x1b[0m \u2028",
    "quotes ' \" ; DROP TABLE checkpoints; -- {} $1 %s \\",
]

KEY = "a signing key of 32 characters!"
OTHER_KEY = "another key, also long enough..."
GRACE = 60.0
"""The stores' ``epoch_grace`` in the tests that move their clock past it (seconds)."""


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


def _assert_refused(store: StreamCheckpointStore, run_id: str, why: str) -> None:
    with pytest.raises(StreamCheckpointError) as caught:
        store.get(run_id)
    message = str(caught.value)
    assert caught.value.run_id == run_id
    assert "signature did not verify" in message
    assert why in message
    assert "signing_key" in message
    assert SIGNING_KEY_ENV in message
    assert not isinstance(caught.value, StreamCheckpointFencedError)


class StoreConformanceTests:
    """The rules every :class:`StreamCheckpointStore` keeps, as pytest tests.

    A subclass provides the ``make_store`` fixture (see the module docstring).
    """

    shares_data: bool = True
    """Stores built by one ``make_store`` share their records (``False``: in-process)."""

    # -- what a subclass provides ------------------------------------------------

    @pytest.fixture
    def make_store(self) -> MakeStore:
        """Build a store over this test's records with the given settings."""
        raise NotImplementedError(
            f"{type(self).__name__} must define a make_store fixture returning a callable "
            "that builds the store under test with keyword settings (ttl, clock, "
            "max_checkpoint_bytes, epoch_grace, signing_key)"
        )

    @pytest.fixture
    def store_in_child(self) -> str | None:
        """Python source of an expression building a store over this test's records.

        It is evaluated in a fresh interpreter that has this process's
        ``sys.path``; ``None`` skips the tests across processes.
        """
        return None

    def let_time_pass(self, store: StreamCheckpointStore, seconds: float) -> None:
        """Do what the backend's own expiry does after ``seconds`` (nothing by default)."""

    def reopen(self, stores: MakeStore, store: StreamCheckpointStore, **settings: Any) -> Any:
        """A store with other ``settings`` over the records of ``store``.

        By default another store from ``make_store``; a store that shares
        nothing must override this to copy the records over.
        """
        if not self.shares_data:
            pytest.skip(f"{type(self).__name__} shares no records and does not override reopen")
        return stores(**settings)

    # -- fixtures of the kit ----------------------------------------------------------

    @pytest.fixture
    def stores(self, make_store: MakeStore) -> Iterator[MakeStore]:
        """``make_store``, closing every store it built when the test ends."""
        made: list[StreamCheckpointStore] = []

        def build(**settings: Any) -> StreamCheckpointStore:
            store = make_store(**settings)
            made.append(store)
            return store

        yield build
        for store in made:
            store.close()

    @pytest.fixture
    def store(self, stores: MakeStore) -> StreamCheckpointStore:
        """A fresh store with default settings."""
        return stores()

    @pytest.fixture
    def clock(self) -> SettableClock:
        """A settable clock for the expiry tests."""
        return SettableClock()

    # -- helpers ------------------------------------------------------------------------

    def _shared(self) -> None:
        if not self.shares_data:
            pytest.skip(f"{type(self).__name__} keeps nothing beyond one instance")

    def _pass_time(
        self, store: StreamCheckpointStore, clock: SettableClock, seconds: float
    ) -> None:
        clock.advance(seconds)
        self.let_time_pass(store, seconds)

    def _run_child(self, store_in_child: str | None, body: str, timeout: float = 60) -> str:
        """Run ``body`` in a new interpreter with ``store`` bound; return its stdout."""
        if not self.shares_data or store_in_child is None:
            pytest.skip(f"{type(self).__name__} gives no store_in_child source")
        source = (
            "from awaken_langchain.checkpoint import StreamCheckpoint\n"
            f"store = {store_in_child}\n" + body
        )
        path = os.pathsep.join(entry or os.getcwd() for entry in sys.path)
        done = subprocess.run(
            [sys.executable, "-c", source],
            env={**os.environ, "PYTHONPATH": path},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert done.returncode == 0, f"the child process failed:\n{done.stderr}"
        return done.stdout

    # -- basic operations ---------------------------------------------------------------

    def test_get_missing_is_none(self, store: StreamCheckpointStore) -> None:
        assert store.get("never-written") is None

    def test_put_then_get_round_trips_every_field(self, store: StreamCheckpointStore) -> None:
        checkpoint = StreamCheckpoint(
            run_id="run-1",
            thread_id="thread-1",
            model="claude-test",
            message_id="msg-1",
            partial_text="The answer is",
            completed_tool_calls=(
                CompletedToolCall(
                    id="call-1", name="search", args={"q": "x", "n": [1, 2]}, index=0
                ),
            ),
            in_flight_tool_call=InFlightToolCall(
                id="call-2", name="fetch", index=1, partial_args='{"u'
            ),
            retry_count=2,
        )
        store.put(checkpoint)
        got = store.get("run-1")
        assert got is not None, "get returned None right after put"
        expected = checkpoint.model_dump(exclude={"updated_at"})
        read = got.model_dump(exclude={"updated_at"})
        lost = {
            key: (expected[key], read.get(key))
            for key in expected
            if expected[key] != read.get(key)
        }
        assert not lost, f"fields that did not round trip (written, read): {lost}"

    def test_put_stamps_updated_at_with_the_store_clock(
        self, stores: MakeStore, clock: SettableClock
    ) -> None:
        store = stores(clock=clock)
        store.put(make_checkpoint(updated_at=5.0))
        got = store.get("run-1")
        assert got is not None
        assert got.updated_at == clock.now

    def test_put_overwrites_the_previous_checkpoint(self, store: StreamCheckpointStore) -> None:
        store.put(make_checkpoint(text="first version of a long text", retry_count=0))
        store.put(make_checkpoint(text="second", retry_count=1))
        got = store.get("run-1")
        assert got is not None
        assert (got.partial_text, got.retry_count) == ("second", 1)

    def test_runs_are_independent(self, store: StreamCheckpointStore) -> None:
        store.put(make_checkpoint("run-a", "alpha"))
        store.put(make_checkpoint("run-b", "beta"))
        store.delete("run-a")
        assert store.get("run-a") is None
        assert _text_of(store.get("run-b")) == "beta"

    def test_delete_removes_the_checkpoint(self, store: StreamCheckpointStore) -> None:
        store.put(make_checkpoint())
        store.delete("run-1")
        assert store.get("run-1") is None
        assert store.list_run_ids() == []

    def test_delete_missing_is_not_an_error(self, store: StreamCheckpointStore) -> None:
        store.delete("never-written")
        store.delete("never-written")

    def test_delete_is_idempotent(self, store: StreamCheckpointStore) -> None:
        store.put(make_checkpoint())
        store.delete("run-1")
        store.delete("run-1")
        assert store.get("run-1") is None

    def test_put_after_delete_starts_a_new_checkpoint(self, store: StreamCheckpointStore) -> None:
        store.put(make_checkpoint(text="old text"))
        store.delete("run-1")
        store.put(make_checkpoint(text="old text and more"))
        assert _text_of(store.get("run-1")) == "old text and more"

    # -- appends ---------------------------------------------------------------------------

    def test_delta_puts_read_back_exactly(self, store: StreamCheckpointStore) -> None:
        text = ""
        for step in range(300):
            text += f"token {step} é 中 😀 "
            store.put(make_checkpoint(text=text, retry_count=step % 3))
            if step % 37 == 0:
                assert _text_of(store.get("run-1")) == text, f"text wrong after put {step}"
        got = store.get("run-1")
        assert got is not None
        assert (got.partial_text, got.retry_count) == (text, 299 % 3)

    def test_non_extending_put_after_delta_puts_replaces_the_text(
        self, store: StreamCheckpointStore
    ) -> None:
        text = "abc"
        for _ in range(20):
            text += "def"
            store.put(make_checkpoint(text=text))
        store.put(make_checkpoint(text="abX"))
        store.put(make_checkpoint(text="abXY"))
        assert _text_of(store.get("run-1")) == "abXY"

    def test_put_with_unchanged_text_updates_the_other_fields(
        self, store: StreamCheckpointStore
    ) -> None:
        store.put(make_checkpoint(text="same"))
        store.put(make_checkpoint(text="same", retry_count=4))
        got = store.get("run-1")
        assert got is not None
        assert (got.partial_text, got.retry_count) == ("same", 4)

    def test_text_extended_after_a_put_with_unchanged_text_reads_back_exactly(
        self, stores: MakeStore
    ) -> None:
        self._shared()
        store = stores()
        store.put(make_checkpoint(text="same"))
        store.put(make_checkpoint(text="same", retry_count=1))  # a tool call, no new text
        store.put(make_checkpoint(text="same, and more"))
        store.put(make_checkpoint(text="same, and more", retry_count=2))
        store.put(make_checkpoint(text="same, and more text"))
        assert _text_of(store.get("run-1")) == "same, and more text"
        assert _text_of(stores().get("run-1")) == "same, and more text"

    def test_delta_put_never_splices_onto_another_writers_text(self, stores: MakeStore) -> None:
        self._shared()
        first, second = stores(), stores()
        first.put(make_checkpoint(text="abc"))
        second.put(make_checkpoint(text="xyz"))
        first.put(make_checkpoint(text="abcdef"))
        assert _text_of(second.get("run-1")) == "abcdef"

    def test_resumed_writer_extends_the_stored_checkpoint(self, stores: MakeStore) -> None:
        self._shared()
        crashed = stores()
        crashed.put(make_checkpoint(text="partial answer"))
        replacement = stores()
        epoch = replacement.claim("run-1")
        resumed = replacement.get("run-1")
        assert resumed is not None
        replacement.put(
            resumed.model_copy(update={"partial_text": "partial answer, done", "epoch": epoch})
        )
        got = stores().get("run-1")
        assert got is not None
        assert (got.partial_text, got.epoch) == ("partial answer, done", epoch)

    def test_threads_writing_different_runs_lose_nothing(
        self, store: StreamCheckpointStore
    ) -> None:
        def write(worker: int) -> str:
            text = ""
            for step in range(25):
                text += f"<{worker}.{step}>"
                store.put(make_checkpoint(f"run-{worker}", text))
            return text

        with ThreadPoolExecutor(max_workers=4) as pool:
            expected = list(pool.map(write, range(4)))
        for worker, text in enumerate(expected):
            assert _text_of(store.get(f"run-{worker}")) == text

    def test_racing_unfenced_writers_never_mix_their_texts(self, stores: MakeStore) -> None:
        writers = [stores() for _ in range(2)] if self.shares_data else []
        shared = stores()

        def write(worker: int) -> None:
            store = writers[worker % 2] if writers else shared
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
        assert body == f"<{worker}>" * (len(body) // len(f"<{worker}>")), (
            f"two writers' texts were mixed: {got.partial_text!r}"
        )
        assert body

    def test_put_many_appends_never_splice_onto_another_writers_record(
        self, stores: MakeStore
    ) -> None:
        self._shared()
        one, two, reader = stores(), stores(), stores()
        texts = {"run-1": "", "run-2": ""}
        for step in range(12):
            writer = one if step % 3 else two  # another instance writes now and then
            for run_id in texts:
                texts[run_id] += f"<{run_id}:{step}:\u00e9>"
            checkpoints = [make_checkpoint(run_id, text) for run_id, text in texts.items()]
            assert writer.put_many(checkpoints) == [None, None]
            got = [reader.get(run_id) for run_id in texts]  # the writers never read
            assert [_text_of(c) for c in got] == list(texts.values())

    # -- fencing -----------------------------------------------------------------------

    def test_claim_returns_strictly_increasing_epochs(self, store: StreamCheckpointStore) -> None:
        epochs = [store.claim("run-1") for _ in range(5)]
        assert epochs == sorted(set(epochs)), f"claims were not strictly increasing: {epochs}"
        assert epochs[0] >= 1

    def test_claims_of_different_runs_are_independent(self, store: StreamCheckpointStore) -> None:
        first_a = store.claim("run-a")
        second_a = store.claim("run-a")
        only_b = store.claim("run-b")
        store.put(make_checkpoint("run-a", "a", epoch=second_a))  # b's claim fenced nobody in a
        store.put(make_checkpoint("run-b", "b", epoch=only_b))
        with pytest.raises(StreamCheckpointFencedError):
            store.put(make_checkpoint("run-a", "a, stale", epoch=first_a))

    def test_put_with_the_current_epoch_is_accepted(self, store: StreamCheckpointStore) -> None:
        epoch = store.claim("run-1")
        store.put(make_checkpoint(epoch=epoch))
        got = store.get("run-1")
        assert got is not None
        assert got.epoch == epoch

    def test_put_with_a_stale_epoch_is_fenced_and_changes_nothing(
        self, store: StreamCheckpointStore
    ) -> None:
        old = store.claim("run-1")
        store.put(make_checkpoint(text="old owner", epoch=old))
        new = store.claim("run-1")
        store.put(make_checkpoint(text="new owner", epoch=new))
        with pytest.raises(StreamCheckpointFencedError) as caught:  # refused, not merged
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
        self, store: StreamCheckpointStore
    ) -> None:
        old = store.claim("run-1")
        store.put(make_checkpoint(text="abc", epoch=old))
        store.claim("run-1")
        with pytest.raises(StreamCheckpointFencedError):
            store.put(make_checkpoint(text="abcdef", epoch=old))
        assert _text_of(store.get("run-1")) == "abc"

    def test_put_many_reports_a_fenced_checkpoint_in_order_and_writes_the_others(
        self, store: StreamCheckpointStore
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
        texts = [_text_of(store.get(run_id)) for run_id in ["run-1", "run-2", "run-3"]]
        assert texts == ["one", "kept", "three"]

    def test_delete_with_a_stale_epoch_is_fenced(self, store: StreamCheckpointStore) -> None:
        old = store.claim("run-1")
        new = store.claim("run-1")
        store.put(make_checkpoint(epoch=new))
        with pytest.raises(StreamCheckpointFencedError):
            store.delete("run-1", epoch=old)
        assert store.get("run-1") is not None
        store.delete("run-1", epoch=new)
        assert store.get("run-1") is None

    def test_delete_without_epoch_is_unconditional(self, store: StreamCheckpointStore) -> None:
        store.claim("run-1")
        epoch = store.claim("run-1")
        store.put(make_checkpoint(epoch=epoch))
        store.delete("run-1")
        assert store.get("run-1") is None

    def test_put_with_an_unclaimed_epoch_is_refused(self, store: StreamCheckpointStore) -> None:
        with pytest.raises(StreamCheckpointError, match="claim") as caught:
            store.put(make_checkpoint(epoch=3))
        assert not isinstance(caught.value, StreamCheckpointFencedError)
        assert store.get("run-1") is None
        epoch = store.claim("run-1")
        with pytest.raises(StreamCheckpointError, match="claim") as caught:
            store.put(make_checkpoint(epoch=epoch + 1))
        assert not isinstance(caught.value, StreamCheckpointFencedError)

    def test_epoch_zero_without_any_claim_is_allowed(self, store: StreamCheckpointStore) -> None:
        store.put(make_checkpoint(text="unfenced", epoch=0))
        store.put(make_checkpoint(text="unfenced, again", epoch=0))
        store.delete("run-1", epoch=0)
        assert store.get("run-1") is None

    def test_epoch_zero_after_a_claim_is_fenced(self, store: StreamCheckpointStore) -> None:
        store.claim("run-1")
        with pytest.raises(StreamCheckpointFencedError):
            store.put(make_checkpoint(epoch=0))

    def test_claims_stay_increasing_after_delete(self, store: StreamCheckpointStore) -> None:
        first = store.claim("run-1")
        store.put(make_checkpoint(epoch=first))
        store.delete("run-1")
        assert store.claim("run-1") > first

    def test_claims_stay_increasing_after_ttl_expiry_and_gc(
        self, stores: MakeStore, clock: SettableClock
    ) -> None:
        store = stores(ttl=10, clock=clock)
        first = store.claim("run-1")
        store.put(make_checkpoint(epoch=first))
        clock.advance(11)
        assert store.gc() == 1
        assert store.claim("run-1") > first

    def test_epochs_are_monotonic_across_store_instances(self, stores: MakeStore) -> None:
        self._shared()
        first = stores().claim("run-1")
        second = stores().claim("run-1")
        assert second > first
        with pytest.raises(StreamCheckpointFencedError):
            stores().put(make_checkpoint(epoch=first))

    def test_racing_claims_across_threads_fence_every_loser(self, stores: MakeStore) -> None:
        writers = [stores() for _ in range(4)] if self.shares_data else [stores()] * 4

        def claim_and_write(worker: int) -> tuple[int, bool]:
            store = writers[worker]
            epoch = store.claim("run-1")
            try:
                for step in range(10):
                    store.put(make_checkpoint(text=f"W{worker}:" + "x" * step, epoch=epoch))
            except StreamCheckpointFencedError:
                return epoch, False
            return epoch, True

        with ThreadPoolExecutor(max_workers=4) as pool:
            outcomes = list(pool.map(claim_and_write, range(4)))
        epochs = sorted(epoch for epoch, _ in outcomes)
        assert len(set(epochs)) == 4, f"two racing claims got the same epoch: {epochs}"
        got = stores().get("run-1") if self.shares_data else writers[0].get("run-1")
        assert got is not None
        assert got.epoch == epochs[-1], (
            f"the stored checkpoint carries epoch {got.epoch}, not the last claim {epochs[-1]}: "
            "a fenced writer overwrote a newer one"
        )
        winner = [worker for worker, (epoch, _) in enumerate(outcomes) if epoch == epochs[-1]]
        assert got.partial_text.startswith(f"W{winner[0]}:")

    def test_epochs_are_monotonic_across_processes(
        self, stores: MakeStore, store_in_child: str | None
    ) -> None:
        store = stores()
        mine = store.claim("run-1")
        theirs = int(self._run_child(store_in_child, "print(store.claim('run-1'))").strip())
        assert theirs > mine
        with pytest.raises(StreamCheckpointFencedError):
            store.put(make_checkpoint(epoch=mine))
        assert store.claim("run-1") > theirs

    def test_replacement_process_resumes_the_turn_and_fences_the_old_writer(
        self, stores: MakeStore, store_in_child: str | None
    ) -> None:
        store = stores()
        old = store.claim("run-1")
        store.put(make_checkpoint(text="The answer", epoch=old))
        store.put(make_checkpoint(text="The answer is", epoch=old))
        self._run_child(
            store_in_child,
            "epoch = store.claim('run-1')\n"
            "resumed = store.get('run-1')\n"
            "assert resumed is not None and resumed.partial_text == 'The answer is'\n"
            "store.put(resumed.model_copy(update={'partial_text': 'The answer is 42', "
            "'epoch': epoch}))\n",
        )
        with pytest.raises(StreamCheckpointFencedError):
            store.put(make_checkpoint(text="The answer is 7", epoch=old))
        got = store.get("run-1")
        assert got is not None
        assert got.partial_text == "The answer is 42"
        assert got.epoch > old

    # -- the epoch records' horizon ---------------------------------------------------

    def test_a_live_checkpoint_keeps_its_epoch_record_however_long_the_turn(
        self, stores: MakeStore, clock: SettableClock
    ) -> None:
        store = stores(clock=clock, epoch_grace=GRACE)
        epoch = store.claim("run-1")
        store.put(make_checkpoint(text="a turn that streams", epoch=epoch))
        self._pass_time(store, clock, 10 * GRACE)
        store.gc()
        store.put(make_checkpoint(text="a turn that streams for long", epoch=epoch))
        got = store.get("run-1")
        assert got is not None
        assert (got.partial_text, got.epoch) == ("a turn that streams for long", epoch)

    def test_the_epoch_record_of_a_claim_without_a_checkpoint_fences_for_the_grace_period(
        self, stores: MakeStore, clock: SettableClock
    ) -> None:
        store = stores(ttl=1, clock=clock, epoch_grace=GRACE)
        epoch = store.claim("run-1")  # its owner may still be on its way to the first write
        # Ten seconds short of the grace period: a server's own expiry goes on in real
        # time while the test runs, which takes more than a second on a loaded machine.
        self._pass_time(store, clock, GRACE - 10)
        store.gc()
        with pytest.raises(StreamCheckpointFencedError):
            store.put(make_checkpoint(text="an unfenced writer", epoch=0))
        assert store.claim("run-1") > epoch

    def test_a_stale_writer_is_fenced_once_the_new_owner_has_ended_the_run(
        self, store: StreamCheckpointStore
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

    def test_stale_writer_is_refused_after_the_grace_period(
        self, stores: MakeStore, clock: SettableClock
    ) -> None:
        store = stores(ttl=1, clock=clock, epoch_grace=GRACE)
        stale = store.claim("run-1")  # a writer that stalls, holding its epoch
        store.put(make_checkpoint(text="stale owner", epoch=stale))
        newer = one_turn(store, "run-1")  # another process takes over and finishes
        self._pass_time(store, clock, GRACE + 2)
        store.gc()
        with pytest.raises(StreamCheckpointError):
            store.put(make_checkpoint(text="stale owner wakes up", epoch=stale))
        assert store.get("run-1") is None
        latest = store.claim("run-1")  # a claim after the horizon still exceeds every epoch
        assert latest > newer > stale
        with pytest.raises(StreamCheckpointFencedError):
            store.put(make_checkpoint(text="stale owner wakes up", epoch=stale))
        store.put(make_checkpoint(text="latest owner", epoch=latest))
        got = store.get("run-1")
        assert got is not None
        assert (got.partial_text, got.epoch) == ("latest owner", latest)

    def test_claims_increase_across_many_collections_of_the_epoch_record(
        self, stores: MakeStore, clock: SettableClock
    ) -> None:
        store = stores(ttl=1, clock=clock, epoch_grace=GRACE)
        handed_out = []
        for _ in range(6):
            for _ in range(3):
                handed_out.append(store.claim("run-1"))
            store.put(make_checkpoint(epoch=handed_out[-1]))
            store.delete("run-1", epoch=handed_out[-1])
            self._pass_time(store, clock, GRACE + 2)
            store.gc()
        assert handed_out == sorted(set(handed_out))
        assert store.claim("run-1") > handed_out[-1]
        for old in handed_out:
            with pytest.raises(StreamCheckpointFencedError):
                store.put(make_checkpoint(epoch=old))

    def test_epoch_grace_must_be_positive(self, stores: MakeStore) -> None:
        with pytest.raises(ValueError, match="epoch_grace"):
            stores(epoch_grace=0)

    # -- expiry, listing, gc -------------------------------------------------------------

    def test_expired_checkpoint_is_not_returned(
        self, stores: MakeStore, clock: SettableClock
    ) -> None:
        store = stores(ttl=60, clock=clock)
        store.put(make_checkpoint())
        clock.advance(60)
        assert store.get("run-1") is not None
        clock.advance(1)
        assert store.get("run-1") is None
        assert store.list_run_ids() == []
        assert store.list_checkpoints() == []

    def test_put_refreshes_the_ttl(self, stores: MakeStore, clock: SettableClock) -> None:
        store = stores(ttl=60, clock=clock)
        store.put(make_checkpoint(text="a"))
        clock.advance(50)
        store.put(make_checkpoint(text="ab"))
        clock.advance(50)
        assert _text_of(store.get("run-1")) == "ab"

    def test_gc_removes_expired_checkpoints_only(
        self, stores: MakeStore, clock: SettableClock
    ) -> None:
        store = stores(ttl=60, clock=clock)
        store.put(make_checkpoint("old-1"))
        store.put(make_checkpoint("old-2"))
        clock.advance(30)
        store.put(make_checkpoint("fresh"))
        clock.advance(31)
        assert store.gc() == 2
        assert store.gc() == 0
        assert store.list_run_ids() == ["fresh"]
        if self.shares_data:  # removed, not just hidden: no TTL, still gone
            assert stores(clock=clock).list_run_ids() == ["fresh"]

    def test_gc_without_ttl_removes_nothing(self, store: StreamCheckpointStore) -> None:
        store.put(make_checkpoint())
        assert store.gc() == 0
        assert store.get("run-1") is not None

    def test_list_run_ids_and_list_checkpoints(self, store: StreamCheckpointStore) -> None:
        for run_id in ("b", "a", "c"):
            store.put(make_checkpoint(run_id, f"text of {run_id}"))
        store.delete("c")
        assert store.list_run_ids() == ["a", "b"]
        assert sorted((c.run_id, c.partial_text) for c in store.list_checkpoints()) == [
            ("a", "text of a"),
            ("b", "text of b"),
        ]

    # -- size limits and bad input ----------------------------------------------------------

    def test_oversized_checkpoint_is_refused_naming_the_setting(self, stores: MakeStore) -> None:
        store = stores(max_checkpoint_bytes=4096)
        store.put(make_checkpoint(text="small"))
        with pytest.raises(StreamCheckpointError, match="max_checkpoint_bytes=4096"):
            store.put(make_checkpoint(text="small" + "x" * 5000))
        assert _text_of(store.get("run-1")) == "small"

    def test_oversized_fresh_checkpoint_is_refused(self, stores: MakeStore) -> None:
        store = stores(max_checkpoint_bytes=1024)
        with pytest.raises(StreamCheckpointError, match="max_checkpoint_bytes"):
            store.put(make_checkpoint(text="é" * 1024))
        assert store.get("run-1") is None

    @pytest.mark.parametrize(
        "text",
        HOSTILE_TEXTS,
        ids=["emoji", "cjk", "combining", "lone-surrogates", "controls", "quotes"],
    )
    def test_unicode_round_trips_exactly(self, store: StreamCheckpointStore, text: str) -> None:
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

    @pytest.mark.parametrize("run_id", HOSTILE_RUN_IDS, ids=lambda r: r[:20])
    def test_hostile_run_ids_are_stored_as_data(
        self, store: StreamCheckpointStore, run_id: str
    ) -> None:
        epoch = store.claim(run_id)
        store.put(make_checkpoint(run_id, "text", epoch=epoch))
        store.put(make_checkpoint(run_id, "text and more", epoch=epoch))
        assert _text_of(store.get(run_id)) == "text and more"
        assert store.list_run_ids() == [run_id]
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
        self, store: StreamCheckpointStore, run_id: object, message: str
    ) -> None:
        for call in (store.get, store.claim, store.delete):
            with pytest.raises(StreamCheckpointError, match=message):
                call(run_id)  # type: ignore[arg-type]
        with pytest.raises(StreamCheckpointError, match=message):
            make_checkpoint(run_id)  # type: ignore[arg-type]
        assert store.list_run_ids() == []

    def test_put_of_something_else_is_refused_clearly(self, store: StreamCheckpointStore) -> None:
        with pytest.raises(StreamCheckpointError, match="expects a StreamCheckpoint, got dict"):
            store.put({"run_id": "run-1", "partial_text": "x"})  # type: ignore[arg-type]

    # -- signed records -------------------------------------------------------------------

    def test_signed_records_round_trip_through_delta_writes(self, stores: MakeStore) -> None:
        store = stores(signing_key=KEY)
        text = ""
        for step in range(60):
            text += f"token {step} é 中 😀 \ud800 "
            store.put(make_checkpoint(text=text, retry_count=step % 3))
        assert _text_of(store.get("run-1")) == text
        resumed = self.reopen(stores, store, signing_key=KEY)
        assert _text_of(resumed.get("run-1")) == text
        resumed.put(make_checkpoint(text=text + " and the end"))  # a delta after a verified read
        again = self.reopen(stores, resumed, signing_key=KEY).get("run-1")
        assert _text_of(again) == text + " and the end"

    def test_record_signed_with_another_key_is_refused(self, stores: MakeStore) -> None:
        store = stores(signing_key=KEY)
        store.put(make_checkpoint(text="signed by the first key"))
        _assert_refused(self.reopen(stores, store, signing_key=OTHER_KEY), "run-1", "wrong key")

    def test_unsigned_record_is_refused_by_a_store_with_a_key(self, stores: MakeStore) -> None:
        store = stores()
        store.put(make_checkpoint(text="written without a key"))
        _assert_refused(self.reopen(stores, store, signing_key=KEY), "run-1", "no signature")

    def test_signing_key_comes_from_the_environment_when_not_given(
        self, stores: MakeStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv(SIGNING_KEY_ENV, KEY)
        store = stores()
        store.put(make_checkpoint(text="signed through the environment"))
        assert self.reopen(stores, store, signing_key=KEY).get("run-1") is not None
        _assert_refused(self.reopen(stores, store, signing_key=OTHER_KEY), "run-1", "wrong key")
        monkeypatch.delenv(SIGNING_KEY_ENV)
        unsigned = self.reopen(stores, store)  # a store without a key reads signed records
        assert _text_of(unsigned.get("run-1")) == "signed through the environment"

    @pytest.mark.parametrize("from_env", [False, True], ids=["argument", "environment"])
    def test_short_signing_key_is_refused_naming_the_setting(
        self, stores: MakeStore, monkeypatch: pytest.MonkeyPatch, from_env: bool
    ) -> None:
        if from_env:
            monkeypatch.setenv(SIGNING_KEY_ENV, "short")
        setting = SIGNING_KEY_ENV if from_env else "signing_key"
        with pytest.raises(ValueError, match=f"{setting} is 5 bytes long"):
            stores(**({} if from_env else {"signing_key": "short"}))

    # -- async twins and lifetime --------------------------------------------------------------

    def test_async_twins_follow_the_same_rules(self, store: StreamCheckpointStore) -> None:
        asyncio.run(self._async_twins_follow_the_same_rules(store))

    async def _async_twins_follow_the_same_rules(self, store: StreamCheckpointStore) -> None:
        assert await store.aget("run-1") is None
        old = await store.aclaim("run-1")
        await store.aput(make_checkpoint(text="async", epoch=old))
        await store.aput(make_checkpoint(text="async text", epoch=old))
        assert _text_of(await store.aget("run-1")) == "async text"
        new = await store.aclaim("run-1")
        assert new > old
        with pytest.raises(StreamCheckpointFencedError):
            await store.aput(make_checkpoint(text="async text!", epoch=old))
        with pytest.raises(StreamCheckpointFencedError):
            await store.adelete("run-1", epoch=old)
        await store.adelete("run-1", epoch=new)
        await store.adelete("run-1")
        assert await store.aget("run-1") is None

    def test_async_twins_honour_expiry(self, stores: MakeStore, clock: SettableClock) -> None:
        asyncio.run(self._async_twins_honour_expiry(stores(ttl=60, clock=clock), clock))

    async def _async_twins_honour_expiry(
        self, store: StreamCheckpointStore, clock: SettableClock
    ) -> None:
        await store.aput(make_checkpoint("old", "old text"))
        clock.advance(30)
        await store.aput(make_checkpoint("fresh", "fresh text"))
        clock.advance(31)
        assert await store.aget("old") is None
        assert _text_of(await store.aget("fresh")) == "fresh text"

    def test_store_is_a_context_manager(self, stores: MakeStore) -> None:
        with stores() as store:
            store.put(make_checkpoint())
        if self.shares_data:
            assert stores().get("run-1") is not None
