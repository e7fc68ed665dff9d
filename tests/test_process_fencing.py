"""Fencing holds between processes on every store that hosts share.

Four processes, two on the async API and two on threads, race claims and
read-extend-write cycles on the same 32 runs of one store (see
``fencing_worker.py``). Every accepted write extends the text it read, so the
final text of each run is the history of what landed: no stale write may land
after a newer owner's, and no accepted write may be lost.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from tests.store_kinds import SERVER_KINDS, StoreKind, open_store, server_address

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "fencing_worker.py"
SEGMENT = re.compile(r"<(\d+)\.(\d+)\.(\d+)\.(\d+)>")


@pytest.mark.parametrize("kind", SERVER_KINDS)
def test_stale_writes_never_land_when_four_processes_race_on_the_same_runs(
    kind: StoreKind, tmp_path: Path
) -> None:
    address, location = server_address(kind), str(tmp_path / "race")
    processes, runs, rounds = 4, 32, 2
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                kind,
                address,
                location,
                str(worker),
                str(processes),
                str(runs),
                str(rounds),
                "async" if worker % 2 == 0 else "threads",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(WORKER.parent)])},
            cwd=REPO_ROOT,
        )
        for worker in range(processes)
    ]
    logs = []
    for process in workers:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
        logs.append(json.loads(out))

    claims: dict[str, list[int]] = defaultdict(list)
    accepted: dict[str, set[str]] = defaultdict(set)
    for log in logs:
        for run_id, epoch in log["claims"]:
            claims[run_id].append(epoch)
        for run_id, seg in log["accepted"]:
            accepted[run_id].add(seg)
    assert sum(log["fenced"] for log in logs) > 0, "no takeover happened; the test proves nothing"

    store = open_store(kind, location, address)
    try:
        for i in range(runs):
            run_id = f"run-{i}"
            # claims are atomic: every claim got its own epoch
            assert len(set(claims[run_id])) == processes * rounds
            final = store.get(run_id)
            assert final is not None
            # the last owner's writes are the last to land
            assert final.epoch == max(claims[run_id])
            segments = SEGMENT.findall(final.partial_text)
            assert "".join(f"<{'.'.join(s)}>" for s in segments) == final.partial_text
            # every accepted write extended the text, and nothing else did
            assert {f"<{'.'.join(s)}>" for s in segments} == accepted[run_id]
            assert len(segments) == len(accepted[run_id])
            # a write from an older epoch never landed after a newer one
            epochs = [int(s[0]) for s in segments]
            assert epochs == sorted(epochs)
    finally:
        store.close()
