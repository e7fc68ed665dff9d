"""Rules specific to the diskcache store: several processes, never unpickling."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import diskcache
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from awaken_langchain import DiskCacheStreamCheckpointStore, StreamCheckpoint, StreamCheckpointError
from awaken_langchain.errors import StreamCheckpointFencedError
from awaken_langchain.stores._base import run_id_bytes
from tests.conftest import REPO_ROOT

WRITER = """
import sys
from awaken_langchain import DiskCacheStreamCheckpointStore, StreamCheckpoint
directory, worker = sys.argv[1], int(sys.argv[2])
store = DiskCacheStreamCheckpointStore(directory)
for run in range(50):
    run_id = f"worker-{worker}/run-{run}"
    text = ""
    for step in range(4):
        text += f"<{worker}:{run}:{step}>"
        store.put(StreamCheckpoint(run_id=run_id, partial_text=text, retry_count=worker))
"""

CLAIMER = """
import sys
from awaken_langchain import DiskCacheStreamCheckpointStore, StreamCheckpoint
from awaken_langchain.errors import StreamCheckpointFencedError
directory, worker = sys.argv[1], int(sys.argv[2])
store = DiskCacheStreamCheckpointStore(directory)
for _ in range(25):
    epoch = store.claim("shared")
    try:
        store.put(StreamCheckpoint(run_id="shared", partial_text=f"{worker}:{epoch}", epoch=epoch))
        print(f"{epoch} put")
    except StreamCheckpointFencedError:
        print(f"{epoch} fenced")
"""


def run_workers(source: str, directory: Path, workers: int = 4) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", source, str(directory), str(worker)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for worker in range(workers)
    ]
    outputs = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        outputs.append(out)
    return outputs


@pytest.mark.slow
def test_concurrent_processes_lose_and_mix_up_nothing(tmp_path: Path) -> None:
    directory = tmp_path / "shared"
    DiskCacheStreamCheckpointStore(directory).close()
    run_workers(WRITER, directory)
    with DiskCacheStreamCheckpointStore(directory) as store:
        run_ids = store.list_run_ids()
        assert len(run_ids) == 200
        for worker in range(4):
            for run in range(50):
                got = store.get(f"worker-{worker}/run-{run}")
                assert got is not None
                assert got.partial_text == "".join(f"<{worker}:{run}:{s}>" for s in range(4))
                assert got.retry_count == worker


@pytest.mark.slow
def test_concurrent_claims_hand_out_each_epoch_once(tmp_path: Path) -> None:
    directory = tmp_path / "shared"
    DiskCacheStreamCheckpointStore(directory).close()
    outputs = run_workers(CLAIMER, directory)
    epochs = [int(line.split()[0]) for out in outputs for line in out.splitlines()]
    assert sorted(epochs) == list(range(1, 101))
    for out in outputs:  # each worker saw its own epochs strictly increase
        mine = [int(line.split()[0]) for line in out.splitlines()]
        assert mine == sorted(mine)
    with DiskCacheStreamCheckpointStore(directory) as store:
        got = store.get("shared")
        assert got is not None
        assert got.epoch == 100
        assert got.partial_text.endswith(":100")
        assert store.claim("shared") == 101


class _Boom:
    def __reduce__(self) -> tuple[object, ...]:
        return (open, (str(MARKER_HOLDER[0]), "w"))


MARKER_HOLDER: list[Path] = []


@pytest.mark.parametrize("part", ["head", "epoch", "segment"])
def test_pickled_values_are_never_unpickled(tmp_path: Path, part: str) -> None:
    directory = tmp_path / "cache"
    marker = tmp_path / "unpickled"
    MARKER_HOLDER[:] = [marker]
    with DiskCacheStreamCheckpointStore(directory) as store:
        store.put(StreamCheckpoint(run_id="run-1", partial_text="text"))
        keys = {
            "head": b"h\x00",
            "epoch": b"e\x00",
            "segment": b"s\x00",
        }
        key = keys[part] + run_id_bytes("run-1") + (b"\x000" if part == "segment" else b"")
        with diskcache.Cache(str(directory)) as raw:
            raw.set(key, _Boom())  # plain diskcache pickles it ...
            raw.get(key)  # ... and runs the payload when reading it back
        assert marker.exists()
        marker.unlink()
        read = store.claim if part == "epoch" else store.get
        with pytest.raises(StreamCheckpointError, match="never unpickled"):
            read("run-1")
        assert not marker.exists()


def test_store_never_hands_diskcache_an_object_to_pickle(tmp_path: Path) -> None:
    with DiskCacheStreamCheckpointStore(tmp_path / "cache") as store:
        store.claim("run-1")
        store.put(StreamCheckpoint(run_id="run-1", partial_text="x" * 100_000, epoch=1))
        store.put(StreamCheckpoint(run_id="run-1", partial_text="x" * 100_010, epoch=1))
    with diskcache.Cache(str(tmp_path / "cache")) as raw:
        modes = {row[0] for row in raw._sql("SELECT mode FROM Cache").fetchall()}
    assert diskcache.core.MODE_PICKLE not in modes


def test_unopenable_directory_is_a_store_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(StreamCheckpointError, match="open failed"):
        DiskCacheStreamCheckpointStore(blocker / "cache")


def test_damaged_database_is_a_store_error(tmp_path: Path) -> None:
    directory = tmp_path / "cache"
    DiskCacheStreamCheckpointStore(directory).close()
    for path in directory.glob("cache.db*"):
        path.write_bytes(b"this is not an SQLite database" * 100)
    with pytest.raises(StreamCheckpointError, match="DatabaseError"):
        DiskCacheStreamCheckpointStore(directory)


def test_gc_of_an_expired_checkpoint_ends_its_record_and_a_delete_without_epoch_keeps_it(
    tmp_path: Path,
) -> None:
    now = [1000.0]
    directory = tmp_path / "cache"
    with DiskCacheStreamCheckpointStore(
        directory, ttl=10, clock=lambda: now[0], epoch_grace=100
    ) as store:
        for run_id in ("deleted", "expired"):
            epoch = store.claim(run_id)
            text = ""
            for _ in range(40):
                text += "token "
                store.put(StreamCheckpoint(run_id=run_id, partial_text=text, epoch=epoch))
        store.delete("deleted")
        now[0] += 11
        assert store.gc() == 1
        with diskcache.Cache(str(directory)) as raw:  # kept for an owner that may write on
            assert sorted(raw.iterkeys()) == [b"e\x00deleted", b"f\x00epoch-floor"]
        now[0] += 100
        store.gc()
        assert store.claim("deleted") == 2  # above the floor the collected records left
    with diskcache.Cache(str(directory)) as raw:
        assert sorted(raw.iterkeys()) == [b"e\x00deleted", b"f\x00epoch-floor"]
        assert raw.get(b"f\x00epoch-floor") == 1


def test_epoch_counters_of_an_older_release_are_read_and_collected(tmp_path: Path) -> None:
    directory = tmp_path / "cache"
    DiskCacheStreamCheckpointStore(directory).close()
    with diskcache.Cache(str(directory)) as raw:
        raw.set(b"e\x00run-1", 7)  # a bare integer counter, as written before epoch_grace
    now = [1000.0]
    with DiskCacheStreamCheckpointStore(directory, clock=lambda: now[0]) as store:
        with pytest.raises(StreamCheckpointError):
            store.put(StreamCheckpoint(run_id="run-1", partial_text="x", epoch=6))
        store.gc()
        assert store.claim("run-1") == 8


def test_lock_held_too_long_names_the_timeout_setting(tmp_path: Path) -> None:
    directory = tmp_path / "cache"
    with (
        DiskCacheStreamCheckpointStore(directory, timeout=0.05) as store,
        diskcache.Cache(str(directory)) as other,
    ):
        other._sql("BEGIN IMMEDIATE")  # another process holding the write lock
        try:
            with pytest.raises(StreamCheckpointError, match=r"timeout=0.05 s") as caught:
                store.claim("run-1")
            assert caught.value.run_id == "run-1"
        finally:
            other._sql("ROLLBACK")
        assert store.claim("run-1") == 1


def test_a_store_on_a_database_out_of_wal_mode_still_waits_for_a_reader_to_commit(
    tmp_path: Path,
) -> None:
    """Outside WAL mode a commit needs every reader gone; it waits for them, within `timeout`."""
    directory = tmp_path / "cache"
    diskcache.Cache(str(directory), sqlite_journal_mode="delete").close()
    with DiskCacheStreamCheckpointStore(directory, timeout=10) as store:
        epoch = store.claim("run")
        reading = threading.Event()

        def reader() -> None:  # another connection in the middle of a read
            other = sqlite3.connect(directory / "cache.db", isolation_level=None)
            other.execute("BEGIN")
            other.execute("SELECT count(*) FROM Cache").fetchall()
            reading.set()
            time.sleep(0.3)
            other.execute("COMMIT")
            other.close()

        thread = threading.Thread(target=reader)
        thread.start()
        assert reading.wait(5)
        began = time.monotonic()
        store.put(StreamCheckpoint(run_id="run", partial_text="after the reader", epoch=epoch))
        waited = time.monotonic() - began
        thread.join()

        kept = store.get("run")
        assert kept is not None
        assert kept.partial_text == "after the reader"
        assert waited > 0.1  # it waited for the reader instead of failing at once
        assert store.put_many([StreamCheckpoint(run_id="run", partial_text="x", epoch=epoch)]) == [
            None
        ]


def test_put_many_writes_every_checkpoint_but_the_refused_ones(tmp_path: Path) -> None:
    with DiskCacheStreamCheckpointStore(tmp_path / "cache", max_checkpoint_bytes=4096) as store:
        store.claim("fenced")
        store.claim("fenced")  # a new owner: epoch 1 is stale
        errors = store.put_many(
            [
                StreamCheckpoint(run_id="first", partial_text="one"),
                StreamCheckpoint(run_id="fenced", partial_text="stale", epoch=1),
                StreamCheckpoint(run_id="large", partial_text="x" * 8192),
                StreamCheckpoint(run_id="last", partial_text="four"),
            ]
        )

        assert [type(e) for e in errors] == [
            type(None),
            StreamCheckpointFencedError,
            StreamCheckpointError,
            type(None),
        ]
        assert errors[2] is not None
        assert "max_checkpoint_bytes" in str(errors[2])
        assert [store.get(r) for r in ("fenced", "large")] == [None, None]
        first, last = store.get("first"), store.get("last")
        assert first is not None
        assert first.partial_text == "one"
        assert last is not None
        assert last.partial_text == "four"
        assert store.put_many([]) == []


def test_put_many_is_one_transaction_rolled_back_when_the_database_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with DiskCacheStreamCheckpointStore(tmp_path / "cache") as store:
        store.put(StreamCheckpoint(run_id="first", partial_text="before"))
        with DiskCacheStreamCheckpointStore(tmp_path / "cache") as other:
            # written by another instance: this one takes the general path for it,
            # after the batch's other rows were written
            other.put(StreamCheckpoint(run_id="broken", partial_text="theirs"))
        replace = store._backend_replace

        def failing(head: Any, text: bytes, epoch: int) -> Any:
            if head.run_id == "broken":
                raise sqlite3.OperationalError("database or disk is full")
            return replace(head, text, epoch)

        monkeypatch.setattr(store, "_backend_replace", failing)
        errors = store.put_many(
            [
                StreamCheckpoint(run_id="first", partial_text="before and after"),
                StreamCheckpoint(run_id="other", partial_text="new"),
                StreamCheckpoint(run_id="broken", partial_text="fails"),
            ]
        )

        assert len(errors) == 3
        assert all(isinstance(e, StreamCheckpointError) for e in errors)
        assert "disk is full" in str(errors[0])
        first = store.get("first")
        assert first is not None
        assert first.partial_text == "before"
        assert store.get("other") is None
        broken = store.get("broken")
        assert broken is not None
        assert broken.partial_text == "theirs"
        monkeypatch.undo()
        assert store.put_many([StreamCheckpoint(run_id="first", partial_text="before, again")]) == [
            None
        ]
        again = store.get("first")
        assert again is not None
        assert again.partial_text == "before, again"


def _text(store: DiskCacheStreamCheckpointStore, run_id: str) -> str | None:
    checkpoint = store.get(run_id)
    return None if checkpoint is None else checkpoint.partial_text


def test_appends_without_reading_back_keep_the_whole_text(tmp_path: Path) -> None:
    with DiskCacheStreamCheckpointStore(tmp_path / "cache") as store:
        epoch = store.claim("run")
        text = ""
        for step in range(200):
            text += f"é{step}\U0001f600 " if step % 3 else f"<{step}>"
            assert store.put_many(
                [StreamCheckpoint(run_id="run", partial_text=text, epoch=epoch)]
            ) == [None]
        with DiskCacheStreamCheckpointStore(tmp_path / "cache") as reader:
            assert _text(reader, "run") == text


def test_a_write_by_another_store_is_noticed_before_appending(tmp_path: Path) -> None:
    with (
        DiskCacheStreamCheckpointStore(tmp_path / "cache") as one,
        DiskCacheStreamCheckpointStore(tmp_path / "cache") as two,
    ):
        one.put(StreamCheckpoint(run_id="run", partial_text="abc"))
        two.put(StreamCheckpoint(run_id="run", partial_text="xyz, written by two"))
        one.put(StreamCheckpoint(run_id="run", partial_text="abcdef"))  # must not splice

        assert _text(two, "run") == "abcdef"
        two.put(StreamCheckpoint(run_id="run", partial_text="abcdefgh"))
        one.put(StreamCheckpoint(run_id="run", partial_text="abcdefghij"))
        assert _text(two, "run") == "abcdefghij"


def test_segments_large_enough_for_a_file_are_written_and_replaced(tmp_path: Path) -> None:
    with DiskCacheStreamCheckpointStore(tmp_path / "cache", max_checkpoint_bytes=1 << 22) as store:
        large = store._cache.disk.min_file_size
        text = "a" * 10
        store.put(StreamCheckpoint(run_id="run", partial_text=text))
        text += "b" * (large + 5)
        store.put(StreamCheckpoint(run_id="run", partial_text=text))
        for step in range(20):
            text += f"-{step}"
            store.put(StreamCheckpoint(run_id="run", partial_text=text))
        assert _text(store, "run") == text
        store.put(StreamCheckpoint(run_id="run", partial_text="short again"))
        assert _text(store, "run") == "short again"
        store.delete("run")
        assert store.get("run") is None
        assert store.list_run_ids() == []


_LONG_TURN = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 40_000)),
        st.tuples(st.just("replace"), st.integers(0, 70_000)),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=25, deadline=None)
@given(steps=_LONG_TURN)
def test_a_long_turn_reads_back_exactly_and_leaves_no_file_behind(
    tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[str, int]]
) -> None:
    """Texts past diskcache's inline limit (32 KB) keep their early segments in files;
    appending and replacing around them never loses, splices or orphans a byte."""
    directory = tmp_path_factory.mktemp("long")
    with (
        DiskCacheStreamCheckpointStore(directory, max_checkpoint_bytes=1 << 24) as store,
        DiskCacheStreamCheckpointStore(directory) as reader,
    ):
        epoch = store.claim("run")
        text = ""
        for number, (kind, size) in enumerate(steps):
            letter = "abcdefgh"[number % 8]
            text = text + letter * size if kind == "append" else "é" * (size // 2) + letter
            assert store.put_many(
                [StreamCheckpoint(run_id="run", partial_text=text, epoch=epoch)]
            ) == [None]
            assert _text(reader, "run") == text
        store.delete("run", epoch=epoch)
        assert store.get("run") is None
    assert sorted(path.name for path in directory.rglob("*.val")) == []


def test_a_group_commit_fences_a_run_claimed_since_its_last_write(tmp_path: Path) -> None:
    with (
        DiskCacheStreamCheckpointStore(tmp_path / "cache") as one,
        DiskCacheStreamCheckpointStore(tmp_path / "cache") as two,
    ):
        first = one.claim("run")
        assert one.put_many(
            [
                StreamCheckpoint(run_id="run", partial_text="a", epoch=first),
                StreamCheckpoint(run_id="other", partial_text="b"),
            ]
        ) == [None, None]
        second = two.claim("run")
        errors = one.put_many(
            [
                StreamCheckpoint(run_id="run", partial_text="ab", epoch=first),
                StreamCheckpoint(run_id="other", partial_text="bc"),
            ]
        )
        assert isinstance(errors[0], StreamCheckpointFencedError)
        assert errors[1] is None
        assert (_text(two, "run"), _text(two, "other")) == ("a", "bc")
        with pytest.raises(StreamCheckpointError, match="current epoch is 0"):
            one.delete("other", epoch=second)  # never claimed: refused, nothing deleted
        assert _text(two, "other") == "bc"
        two.put(StreamCheckpoint(run_id="run", partial_text="a!", epoch=second))
        with pytest.raises(StreamCheckpointFencedError):
            one.delete("run", epoch=first)
        assert _text(one, "run") == "a!"
        two.delete("run", epoch=second)
        assert two.get("run") is None
        assert two.claim("run") == second + 1


def test_a_group_commit_reads_back_only_rows_changed_since_its_last_write(
    tmp_path: Path,
) -> None:
    with (
        DiskCacheStreamCheckpointStore(tmp_path / "cache") as one,
        DiskCacheStreamCheckpointStore(tmp_path / "cache") as two,
    ):
        read: list[dict[bytes, Any]] = []
        changed_rows = one._cache.changed_rows

        def spy(expected: Any) -> dict[bytes, Any]:
            read.append(changed_rows(expected))
            return read[-1]

        one._cache.changed_rows = spy
        epoch = one.claim("run")
        assert one.put_many(
            [
                StreamCheckpoint(run_id="run", partial_text="ab", epoch=epoch),
                StreamCheckpoint(run_id="other", partial_text="x"),
            ]
        ) == [None, None]
        assert list(read[-1]) == [b"e\x00run"]  # a new run: its epoch record only
        reads = len(read)
        assert one.put_many(
            [
                StreamCheckpoint(run_id="run", partial_text="abc", epoch=epoch),
                StreamCheckpoint(run_id="other", partial_text="xy"),
            ]
        ) == [None, None]
        assert all(rows == {} for rows in read[reads:])  # nobody else wrote: nothing read back
        two.delete("other")
        assert one.put_many(
            [
                StreamCheckpoint(run_id="run", partial_text="abcd", epoch=epoch),
                StreamCheckpoint(run_id="other", partial_text="xyz"),
            ]
        ) == [None, None]
        assert read[-1] == {b"h\x00other": None}  # its head is gone: written whole again
        assert (_text(two, "run"), _text(two, "other")) == ("abcd", "xyz")


def test_a_side_file_another_process_removes_while_the_store_opens_is_no_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite removes its -wal/-shm files when a database's last connection closes, which
    another process may do between seeing such a file and making it private."""
    directory = tmp_path / "shared"
    DiskCacheStreamCheckpointStore(directory).close()
    database = directory / "cache.db"
    for suffix in ("-wal", "-shm"):
        Path(f"{database}{suffix}").write_bytes(b"")
    chmod = os.chmod

    def removed_first(path: Any, mode: int, **kwargs: Any) -> None:
        if str(path).endswith(("-wal", "-shm")):
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)  # the other process closed its connection just now
        chmod(path, mode, **kwargs)

    monkeypatch.setattr(os, "chmod", removed_first)
    with DiskCacheStreamCheckpointStore(directory) as store:
        store.put(StreamCheckpoint(run_id="r", partial_text="kept"))
        saved = store.get("r")

    assert saved is not None
    assert saved.partial_text == "kept"


_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("claim"), st.integers(0, 1), st.sampled_from(["a", "b"])),
        st.tuples(st.just("delete"), st.integers(0, 1), st.sampled_from(["a", "b"])),
        st.tuples(
            st.just("put"),
            st.integers(0, 1),
            st.lists(
                st.tuples(st.sampled_from(["a", "b"]), st.text("xyz", max_size=40)),
                min_size=1,
                max_size=2,
                unique_by=lambda pair: pair[0],
            ),
            st.booleans(),
        ),
    ),
    max_size=30,
)


def _play(directory: Path, ops: list[Any], *, guarded: bool) -> list[Any]:
    """Two processes' stores on one directory play ``ops``; what each operation answered,
    then what a fresh reader finds."""
    stores = [DiskCacheStreamCheckpointStore(directory) for _ in range(2)]
    if not guarded:
        for store in stores:
            store._put_guarded = lambda plans, layouts: None  # type: ignore[method-assign]
    epochs: list[dict[str, int]] = [{}, {}]
    texts: list[dict[str, str]] = [{}, {}]
    seen: list[Any] = []
    try:
        for op in ops:
            who = op[1]
            store = stores[who]
            try:
                if op[0] == "claim":
                    epochs[who][op[2]] = store.claim(op[2])
                    seen.append("claimed")
                elif op[0] == "delete":
                    store.delete(op[2], epoch=epochs[who].get(op[2], 0))
                    seen.append("deleted")
                else:
                    batch = []
                    for run, piece in op[2]:
                        # append to what this store wrote last, or start again (shorter)
                        text = texts[who].get(run, "") + piece if op[3] else piece
                        texts[who][run] = text
                        epoch = epochs[who].get(run, 0)
                        batch.append(StreamCheckpoint(run_id=run, partial_text=text, epoch=epoch))
                    errors = store.put_many(batch)
                    seen.append([None if e is None else type(e).__name__ for e in errors])
            except StreamCheckpointError as exc:
                seen.append(type(exc).__name__)
        with DiskCacheStreamCheckpointStore(directory, read_only=True) as reader:
            seen.append([_text(reader, run) for run in ("a", "b")])  # type: ignore[arg-type]
    finally:
        for store in stores:
            store.close()
    return seen


@settings(max_examples=60, deadline=None)
@given(ops=_OPS)
def test_a_group_commit_in_one_guarded_statement_answers_as_a_transaction_would(
    ops: list[Any],
) -> None:
    """Puts written in one statement, guarded by the head and epoch rows this store last
    saw, refuse, fence and keep exactly what the read-back transaction does, whatever
    another process claimed, wrote or deleted in between."""
    with tempfile.TemporaryDirectory() as directory:
        guarded = _play(Path(directory) / "guarded", ops, guarded=True)
        transaction = _play(Path(directory) / "transaction", ops, guarded=False)
    assert guarded == transaction
