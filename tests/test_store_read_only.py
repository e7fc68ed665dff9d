"""Stores opened with ``read_only=True`` read everything and change nothing on disk."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from awaken_langchain import (
    DiskCacheStreamCheckpointStore,
    FileStreamCheckpointStore,
    StreamCheckpointError,
)
from awaken_langchain.checkpoint import StreamCheckpoint

STORES = {"diskcache": DiskCacheStreamCheckpointStore, "file": FileStreamCheckpointStore}


def _listing(directory: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_mode, p.stat().st_size) for p in sorted(directory.iterdir())}


@pytest.mark.parametrize("kind", sorted(STORES))
def test_read_only_reads_what_a_live_writer_wrote(kind: str, tmp_path: Path) -> None:
    long_text = "y" * 100_000  # past diskcache's 32 KiB: a value kept in its own file
    with STORES[kind](tmp_path) as writer:
        writer.put(StreamCheckpoint(run_id="run-long", partial_text=long_text))
        writer.put(StreamCheckpoint(run_id="run-short", partial_text="short"))
        with STORES[kind](tmp_path, read_only=True) as reader:
            assert reader.list_run_ids() == ["run-long", "run-short"]
            found = reader.get("run-long")
            assert found is not None
            assert found.partial_text == long_text
            writer.put(StreamCheckpoint(run_id="run-short", partial_text="short, then more"))
            again = reader.get("run-short")
            assert again is not None
            assert again.partial_text == "short, then more"


@pytest.mark.parametrize("kind", sorted(STORES))
def test_a_read_only_store_refuses_every_write(kind: str, tmp_path: Path) -> None:
    with STORES[kind](tmp_path) as writer:
        writer.put(StreamCheckpoint(run_id="run-a", partial_text="kept"))
    os.chmod(tmp_path, 0o755)
    before = _listing(tmp_path)
    with STORES[kind](tmp_path, read_only=True, ttl=0.001) as reader:
        writes = {
            "claim": lambda: reader.claim("run-a"),
            "put": lambda: reader.put(StreamCheckpoint(run_id="run-a", partial_text="x")),
            "delete": lambda: reader.delete("run-a"),
            "gc": reader.gc,
        }
        for action, write in writes.items():
            with pytest.raises(StreamCheckpointError, match=f"read_only=True and cannot {action}"):
                write()
    assert _listing(tmp_path) == before
    with STORES[kind](tmp_path) as writer:
        kept = writer.get("run-a")
    assert kept is not None
    assert kept.partial_text == "kept"


@pytest.mark.parametrize("kind", sorted(STORES))
def test_read_only_open_of_no_store_names_the_path_and_creates_nothing(
    kind: str, tmp_path: Path
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(StreamCheckpointError, match=f"no checkpoint store at {empty} \\(no "):
        STORES[kind](empty, read_only=True)
    assert list(empty.iterdir()) == []
    with pytest.raises(StreamCheckpointError, match="no such directory"):
        STORES[kind](tmp_path / "missing", read_only=True)
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize("kind", sorted(STORES))
async def test_a_read_only_store_reads_from_async_code(kind: str, tmp_path: Path) -> None:
    with STORES[kind](tmp_path) as writer:
        writer.put(StreamCheckpoint(run_id="run-a", partial_text="async"))
    with STORES[kind](tmp_path, read_only=True) as reader:
        found = await reader.aget("run-a")
    assert found is not None
    assert found.partial_text == "async"


def test_a_reader_that_opens_a_store_its_writer_is_still_creating_reads_it_empty(
    tmp_path: Path,
) -> None:
    # the moment between a writer creating the database file and creating its table
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    sqlite3.connect(directory / "cache.db").close()
    reader = DiskCacheStreamCheckpointStore(directory, read_only=True)
    try:
        assert reader.list_checkpoints() == []
        assert reader.get("run-1") is None
        with DiskCacheStreamCheckpointStore(directory) as writer:
            writer.put(StreamCheckpoint(run_id="run-1", thread_id="t", partial_text="Hello"))
        got = reader.get("run-1")
        assert got is not None
        assert got.partial_text == "Hello"
        assert [c.run_id for c in reader.list_checkpoints()] == ["run-1"]
    finally:
        reader.close()
