"""The tool ledger benchmark runs (at a tiny size; its figures are not asserted)."""

from __future__ import annotations

import pytest

from benchmarks import tool_ledger


def test_tool_ledger_benchmark_runs_at_tiny_size(capsys: pytest.CaptureFixture[str]) -> None:
    rows = tool_ledger.main(calls=3, redis=False)

    assert [r.store for r in rows] == ["memory", "file", "diskcache"]
    assert all(r.bare_us > 0 and r.first_us > 0 and r.replay_us > 0 for r in rows)
    assert "first run / bare" in capsys.readouterr().out
