"""The put-cost benchmark runs (at a tiny size; its figures are not asserted)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT


def test_checkpoint_put_benchmark_runs_at_tiny_size(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = Path(REPO_ROOT, "benchmarks", "checkpoint_put.py")
    spec = importlib.util.spec_from_file_location("checkpoint_put", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)

    pairs = module.main(size=4_000, small=400, puts=5)

    assert [large.store for large, _ in pairs] == ["memory", "diskcache", "file"]
    for large, base in pairs:
        assert (large.partial_chars, base.partial_chars) == (4_000, 400)
        assert large.append_us > 0
        assert base.rewrite_us > 0
    table = capsys.readouterr().out
    assert "ratio (median)" in table
    assert "diskcache" in table
