"""Rules specific to the file store: crash leftovers, torn logs, file naming."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from awaken_langchain import (
    DiskCacheStreamCheckpointStore,
    FileStreamCheckpointStore,
    StreamCheckpoint,
    StreamCheckpointError,
)
from awaken_langchain.stores.file import COMPACT_SLACK


def log_of(directory: Path) -> Path:
    (log,) = directory.glob("*.log")
    return log


def test_torn_append_leaves_the_previous_checkpoint_readable(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with FileStreamCheckpointStore(tmp_path) as store:
        store.put(StreamCheckpoint(run_id="run-1", partial_text="abc"))
        store.put(StreamCheckpoint(run_id="run-1", partial_text="abcdef"))
    log = log_of(tmp_path)
    intact = log.read_bytes()
    # A crash in the middle of appending the next frame.
    log.write_bytes(intact + b"AWK1\x00\x00\x01\x00half a frame")
    (tmp_path / ".tmp-0123456789abcdef").write_bytes(b"half a new log")

    with FileStreamCheckpointStore(tmp_path) as replacement:
        with caplog.at_level(logging.WARNING, logger="awaken_langchain"):
            resumed = replacement.get("run-1")
        assert resumed is not None
        assert resumed.partial_text == "abcdef"
        assert "interrupted or damaged write" in caplog.text
        replacement.put(resumed.model_copy(update={"partial_text": "abcdefghi"}))
        got = replacement.get("run-1")
        assert got is not None
        assert got.partial_text == "abcdefghi"
        replacement.gc()
        assert not (tmp_path / ".tmp-0123456789abcdef").exists()


def test_damaged_last_frame_rolls_back_to_the_last_intact_checkpoint(tmp_path: Path) -> None:
    with FileStreamCheckpointStore(tmp_path) as store:
        store.put(StreamCheckpoint(run_id="run-1", partial_text="one", retry_count=1))
        store.put(StreamCheckpoint(run_id="run-1", partial_text="one two", retry_count=2))
    log = log_of(tmp_path)
    data = bytearray(log.read_bytes())
    data[-2] ^= 0xFF
    log.write_bytes(bytes(data))
    with FileStreamCheckpointStore(tmp_path) as store:
        got = store.get("run-1")
        assert got is not None
        assert (got.partial_text, got.retry_count) == ("one", 1)


def test_log_without_any_intact_frame_is_corrupted(tmp_path: Path) -> None:
    with FileStreamCheckpointStore(tmp_path) as store:
        store.put(StreamCheckpoint(run_id="run-1", partial_text="text"))
        log_of(tmp_path).write_bytes(b"")
        with pytest.raises(StreamCheckpointError, match="no intact frame"):
            store.get("run-1")


def test_appends_write_one_small_frame(tmp_path: Path) -> None:
    with FileStreamCheckpointStore(tmp_path) as store:
        text = "x" * 100_000
        store.put(StreamCheckpoint(run_id="run-1", partial_text=text))
        log = log_of(tmp_path)
        size = log.stat().st_size
        store.put(StreamCheckpoint(run_id="run-1", partial_text=text + "y" * 16))
        assert log_of(tmp_path) == log
        assert 16 < log.stat().st_size - size < 1_000


def test_log_is_compacted_when_it_outgrows_its_content(tmp_path: Path) -> None:
    with FileStreamCheckpointStore(tmp_path, fsync=False) as store:  # layout only: fast
        text = ""
        for _ in range(2_000):
            text += "y" * 16
            store.put(StreamCheckpoint(run_id="run-1", partial_text=text))
        size = log_of(tmp_path).stat().st_size
        assert size <= 2 * (len(text) + 1_000) + COMPACT_SLACK
        got = store.get("run-1")
        assert got is not None
        assert got.partial_text == text


def test_file_names_never_contain_the_run_id(tmp_path: Path) -> None:
    with FileStreamCheckpointStore(tmp_path) as store:
        epoch = store.claim("secret-customer-name")
        store.put(StreamCheckpoint(run_id="secret-customer-name", partial_text="x", epoch=epoch))
    names = [path.name for path in tmp_path.iterdir()]
    assert len(names) == 3  # lock, epoch, log
    assert not any("secret" in name for name in names)


def test_rewrite_replaces_the_log(tmp_path: Path) -> None:
    with FileStreamCheckpointStore(tmp_path) as store:
        store.put(StreamCheckpoint(run_id="run-1", partial_text="first text"))
        store.put(StreamCheckpoint(run_id="run-1", partial_text="other text"))
        log = log_of(tmp_path).read_bytes()
        assert b"other text" in log
        assert b"first text" not in log


def test_backend_failure_is_a_store_error_naming_run_and_cause(tmp_path: Path) -> None:
    directory = tmp_path / "checkpoints"
    with FileStreamCheckpointStore(directory) as store:
        store.put(StreamCheckpoint(run_id="run-1", partial_text="text"))
        for path in directory.iterdir():
            path.unlink()
        directory.rmdir()
        with pytest.raises(StreamCheckpointError, match="FileNotFoundError") as caught:
            store.put(StreamCheckpoint(run_id="run-1", partial_text="other"))
        assert caught.value.run_id == "run-1"
        assert isinstance(caught.value.cause, FileNotFoundError)


def test_gc_of_an_expired_checkpoint_ends_its_epoch_file_and_a_delete_without_epoch_keeps_it(
    tmp_path: Path,
) -> None:
    now = [1000.0]
    clock = lambda: now[0]  # noqa: E731
    with FileStreamCheckpointStore(tmp_path, ttl=10, clock=clock, epoch_grace=100) as store:
        for run_id in ("deleted", "expired"):
            epoch = store.claim(run_id)
            store.put(StreamCheckpoint(run_id=run_id, partial_text="a", epoch=epoch))
            store.put(StreamCheckpoint(run_id=run_id, partial_text="ab", epoch=epoch))
        store.delete("deleted")
        now[0] += 11
        assert store.gc() == 1
        suffixes = sorted(path.suffix or path.name for path in tmp_path.iterdir())
        assert suffixes == [".epoch", ".epoch-floor", ".lock"]  # "deleted" may be written on
        now[0] += 100
        store.gc()
        assert sorted(path.name for path in tmp_path.iterdir()) == [".epoch-floor", ".lock"]
        assert store.claim("deleted") == 2  # above the floor the collected files left


def test_forked_child_takes_its_own_lock(tmp_path: Path) -> None:
    import os

    with FileStreamCheckpointStore(tmp_path) as store:
        store.put(StreamCheckpoint(run_id="run-1", partial_text="parent"))
        pid = os.fork()
        if pid == 0:  # child: write through the inherited store, then exit
            code = 1
            try:
                store.put(StreamCheckpoint(run_id="run-2", partial_text="child"))
                code = 0 if store._lock_pid == os.getpid() else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        got = store.get("run-2")
        assert got is not None
        assert got.partial_text == "child"


# -- symbolic links are never followed ----------------------------------------------------


def test_lock_file_link_is_refused_and_its_target_never_created(tmp_path: Path) -> None:
    directory = tmp_path / "checkpoints"
    directory.mkdir(mode=0o700)
    target = tmp_path / "elsewhere" / "created-by-the-store"
    target.parent.mkdir()
    (directory / ".lock").symlink_to(target)
    with pytest.raises(StreamCheckpointError, match="symbolic link") as caught:
        FileStreamCheckpointStore(directory)
    assert str(directory / ".lock") in str(caught.value)
    assert not target.exists()


@pytest.mark.parametrize("store_class", [FileStreamCheckpointStore, DiskCacheStreamCheckpointStore])
def test_store_directory_that_is_a_link_is_refused_and_its_target_left_alone(
    tmp_path: Path, store_class: type[FileStreamCheckpointStore | DiskCacheStreamCheckpointStore]
) -> None:
    target = tmp_path / "shared"
    target.mkdir(mode=0o755)
    target.chmod(0o755)
    link = tmp_path / "checkpoints"
    link.symlink_to(target, target_is_directory=True)
    with pytest.raises(StreamCheckpointError, match="symbolic link") as caught:
        store_class(link)
    assert str(link) in str(caught.value)
    assert "resolve()" in str(caught.value)
    assert target.stat().st_mode & 0o777 == 0o755
    assert list(target.iterdir()) == []


def test_log_file_link_planted_in_the_store_is_never_followed(tmp_path: Path) -> None:
    directory = tmp_path / "checkpoints"
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    with FileStreamCheckpointStore(directory) as store:
        store.put(StreamCheckpoint(run_id="run-1", partial_text="abc"))
        log = log_of(directory)
        log.unlink()
        log.symlink_to(victim)
        with pytest.raises(StreamCheckpointError, match="symbolic link"):
            store.get("run-1")
        store.put(StreamCheckpoint(run_id="run-1", partial_text="abcdef"))  # replaces the link
        assert not log.is_symlink()
        got = store.get("run-1")
        assert got is not None
        assert got.partial_text == "abcdef"
    assert victim.read_bytes() == b"precious"
