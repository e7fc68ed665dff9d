"""Fencing holds between processes on every store that hosts share.

Four processes, forked from a fork server, two on the async API and two on
threads, race claims and read-extend-write cycles on the same 32 runs of one
store (see ``fencing_worker.py``). Every accepted write extends the text it
read, so the final text of each run is the history of what landed: no stale
write may land after a newer owner's, and no accepted write may be lost.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

import fencing_worker
import pytest
from fork_server import fork_server

from tests.store_kinds import SERVER_KINDS, StoreKind, open_store, server_address

pytestmark = pytest.mark.slow

SEGMENT = re.compile(r"<(\d+)\.(\d+)\.(\d+)\.(\d+)>")


@pytest.mark.parametrize("kind", SERVER_KINDS)
def test_stale_writes_never_land_when_four_processes_race_on_the_same_runs(
    kind: StoreKind, tmp_path: Path
) -> None:
    address, location = server_address(kind), str(tmp_path / "race")
    processes, runs, rounds = 4, 32, 2
    context = fork_server("fencing_worker")
    logs_at = [tmp_path / f"worker-{worker}.json" for worker in range(processes)]
    workers = [
        context.Process(
            target=fencing_worker.main,
            args=(
                [
                    kind,
                    address,
                    location,
                    str(worker),
                    str(processes),
                    str(runs),
                    str(rounds),
                    "async" if worker % 2 == 0 else "threads",
                ],
                logs_at[worker],
            ),
            daemon=True,
        )
        for worker in range(processes)
    ]
    for process in workers:
        process.start()
    try:
        for process in workers:
            process.join(120)
            assert process.exitcode == 0, f"a racing process ended with {process.exitcode}"
    finally:
        for process in workers:
            if process.exitcode is None:
                process.kill()
    logs = [json.loads(path.read_text()) for path in logs_at]

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
