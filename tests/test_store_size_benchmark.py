"""The store-size benchmark: every store returns to its baseline after turns and gc."""

from __future__ import annotations

import re

import pytest

from benchmarks import store_size


def leading_number(cell: str) -> int:
    found = re.match(r"\d+", cell)
    assert found is not None, cell
    return int(found.group())


def test_every_store_returns_to_its_baseline_after_turns_and_gc(
    capsys: pytest.CaptureFixture[str],
) -> None:
    store_size.main(turns=50)
    rows = {
        cells[0].split(" ")[0]: cells[1:]
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("| ") and not line.startswith("| store")
        for cells in [[cell.strip() for cell in line.strip("|").split("|")]]
    }
    assert set(rows) >= {"memory", "diskcache", "file"}
    counts = {name: [leading_number(cell) for cell in row] for name, row in rows.items()}
    for name, (empty, after_turns, after_gc) in counts.items():
        if name != "redis":  # a finished turn's records end with it: the abandoned remain
            assert empty < after_turns < 50, name
        assert after_gc <= empty + 1, name  # at most the store's epoch floor
    if "redis" in counts:
        assert "(0 never expire)" in rows["redis"][1]
