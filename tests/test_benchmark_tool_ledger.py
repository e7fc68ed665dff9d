"""The tool ledger benchmark runs (at a tiny size; its figures are not asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import tool_ledger


def test_tool_ledger_benchmark_runs_at_tiny_size(capsys: pytest.CaptureFixture[str]) -> None:
    rows = tool_ledger.main(calls=3, redis=False)

    assert [r.store for r in rows] == ["memory", "file", "diskcache"]
    assert all(r.bare_us > 0 and r.first_us > 0 and r.replay_us > 0 for r in rows)
    assert "first run / bare" in capsys.readouterr().out


def test_the_counted_processes_run_every_case_on_a_store(tmp_path: Path) -> None:
    for case in ("bare", "first", "replay"):
        assert tool_ledger.run_case(case, "diskcache", tmp_path / case, None, 2) == 2


def test_instructions_per_call_take_out_start_up_and_the_first_runs_before_replays(
    tmp_path: Path,
) -> None:
    cost = {"bare": 100, "first": 300}  # per call; a process starts at 10 000

    def count(case: str, name: str, directory: Path, url: str | None, calls: int) -> int:
        if case == "replay":  # first runs of the same calls, then 50 per replay
            return 10_000 + calls * (cost["first"] + 50)
        return 10_000 + calls * cost[case]

    [row] = tool_ledger.count_instructions(["memory"], tmp_path, None, 10, 60, count)

    assert (row.bare, row.first, row.replay) == (100, 300, 50)
