"""The checkpoint store contract, run against every store of the project.

Each store runs the shipped kit (:class:`StoreConformanceTests`) through a small
subclass below; the tests after them poke at a backend's private records
(corrupting them, counting them, rewriting their bytes, reading their files) and
take their backends from ``STORE_BACKENDS`` in ``conftest.py``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from awaken_langchain import (
    StreamCheckpointError,
    StreamCheckpointFencedError,
    StreamCheckpointStore,
)
from awaken_langchain.stores._base import SIGNING_KEY_ENV, DeltaCheckpointStore, Head
from awaken_langchain.testing.conformance import StoreConformanceTests
from awaken_langchain.testing.conformance.stores import GRACE, make_checkpoint, one_turn
from tests.conftest import POSTGRES, STORE_BACKENDS, FakeClock, StoreBackend, StoreFactory
from tests.redis_cluster import cluster_let_time_pass, cluster_store_on
from tests.redis_server import valkey_let_time_pass, valkey_store_on

BACKENDS = {backend.name: backend for backend in STORE_BACKENDS}


def kit_only_corrupt(store: Any, location: Path, run_id: str, part: str) -> None:
    raise AssertionError("the kit never corrupts records: this backend runs only the kit")


def kit_only_records(store: Any, location: Path) -> int:
    raise AssertionError("the kit never counts records: this backend runs only the kit")


class ProjectStoreKit(StoreConformanceTests):
    """The shipped kit on one of the project's backends from ``STORE_BACKENDS``."""

    backend: StoreBackend

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.shares_data = cls.backend.durable

    @pytest.fixture
    def make_store(self, tmp_path: Path) -> Iterator[StoreFactory]:
        factory = StoreFactory(self.backend, tmp_path / "checkpoints")
        self._factory = factory
        yield factory
        factory.close()

    @pytest.fixture
    def store_in_child(self, make_store: StoreFactory) -> str | None:
        if self.backend.child_source is None:
            return None
        names = (
            "{**{n: getattr(m, n) for m in [__import__('awaken_langchain')] for n in m.__all__}, "
            f"'location': __import__('pathlib').Path({str(make_store.location)!r})}}"
        )
        return f"eval({self.backend.child_source!r}, {names})"

    def let_time_pass(self, store: StreamCheckpointStore, seconds: float) -> None:
        self.backend.let_time_pass(store, self._factory.location, seconds)

    def reopen(self, stores: Any, store: StreamCheckpointStore, **settings: Any) -> Any:
        return reopen(self._factory, store, **settings)


class TestMemoryStoreConformance(ProjectStoreKit):
    backend = BACKENDS["memory"]


class TestFileStoreConformance(ProjectStoreKit):
    backend = BACKENDS["file"]


class TestDiskCacheStoreConformance(ProjectStoreKit):
    backend = BACKENDS["diskcache"]


class TestRedisStoreConformance(ProjectStoreKit):
    backend = BACKENDS["redis"]


class TestPostgresStoreConformance(ProjectStoreKit):
    backend = POSTGRES


class TestRedisClusterStoreConformance(ProjectStoreKit):
    """The Redis store on a real three-node cluster: every script touches one slot."""

    backend = StoreBackend(
        name="redis-cluster",
        make=cluster_store_on,
        corrupt=kit_only_corrupt,
        durable=True,
        child_source="__import__('tests.redis_cluster', fromlist=['x']).cluster_store_on(location)",
        uses_directory=False,
        records=kit_only_records,
        let_time_pass=cluster_let_time_pass,
    )


class TestRedisStoreWithValkeyClientConformance(ProjectStoreKit):
    """The Redis store through the ``valkey`` client (a fork of redis-py), not redis-py's."""

    backend = StoreBackend(
        name="redis-valkey-client",
        make=valkey_store_on,
        corrupt=kit_only_corrupt,
        durable=True,
        child_source="__import__('tests.redis_server', fromlist=['x']).valkey_store_on(location)",
        uses_directory=False,
        records=kit_only_records,
        let_time_pass=valkey_let_time_pass,
    )


# -- what only the project's own backends can show ----------------------------------------


@pytest.fixture(params=[*STORE_BACKENDS, POSTGRES], ids=lambda backend: backend.name)
def store_backend(request: pytest.FixtureRequest) -> StoreBackend:
    """Each store backend in turn, PostgreSQL included."""
    backend: StoreBackend = request.param
    return backend


def durable(factory: StoreFactory) -> None:
    if not factory.backend.durable:
        pytest.skip(f"{factory.backend.name} store keeps nothing beyond one instance")


# -- delta writes --------------------------------------------------------------------


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


# -- the epoch records' horizon ---------------------------------------------------------


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
