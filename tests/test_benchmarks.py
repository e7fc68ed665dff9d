"""Every benchmark runs once at a tiny size (its timings are not asserted, its checks are)."""

from __future__ import annotations

import gc
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks import (
    capacity,
    checkpoint_growth,
    concurrency,
    instructions,
    lock_wait,
    overhead,
    paced_instructions,
    readers,
    recovery_latency,
    sdk_instructions,
    sdk_overhead,
    seam_accuracy,
    server_stores,
    snapshot_instructions,
    wasted_work,
)
from benchmarks._common import child_env, run_child
from tests.conftest import REPO_ROOT


@pytest.fixture
def fresh_heap() -> Iterator[None]:
    """The test process's heap, as a benchmark process's: only its own objects collectable.

    The CPU benchmarks collect garbage before each case they time; in a test
    process that has already run thousands of tests each such collection walks
    all their leftovers, which the benchmark run on its own never meets.
    """
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@pytest.mark.usefixtures("fresh_heap")
def test_overhead_benchmark_compares_every_case_with_the_bare_model(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rows = overhead.main(chunks=200, rounds=1, turns=3, turn_chunks=4)

    assert [r.path for r in rows] == (["sync"] * 7 + ["async"] * 7) * 2
    assert {r.case for r in rows} == {case.name for case in overhead.CASES}
    assert all(r.cpu_s > 0 and r.wall_s > 0 for r in rows)
    assert [r.cpu_ratio for r in rows if r.case == "bare inner model"] == [1.0] * 4
    bare = [r for r in rows if r.case == "bare inner model"]
    assert [(r.ratio_without_gc, r.ratios_without_gc) for r in bare] == [(1.0, (1.0, 1.0))] * 4
    assert all(r.cpu_s_without_gc > 0 and r.ratio_without_gc > 0 for r in rows)
    out = capsys.readouterr().out
    assert "CPU ratio without GC" in out
    assert "Per-turn overhead: 3 turns of 4 chunks" in out


@pytest.mark.usefixtures("fresh_heap")
def test_sdk_overhead_benchmark_streams_every_case_through_the_real_integrations(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rows = sdk_overhead.main(chunks=30, rounds=1)

    cases = [name for name, _, _ in sdk_overhead.CASES]
    assert [(r.provider, r.path, r.case) for r in rows] == [
        (provider, path, case)
        for provider in ("openai", "anthropic")
        for path in ("sync", "async")
        for case in cases
    ]
    assert all(r.chunks >= 30 and r.cpu_s > 0 and r.median_cpu_s >= r.cpu_s for r in rows)
    assert [r.cpu_ratio for r in rows if r.case == cases[0]] == [1.0] * 4
    out = capsys.readouterr().out
    assert "context switches" in out
    assert "Goal: wrapper with DiskCache <= 1.05x the bare CPU (median): " in out


def test_write_growth_benchmark_counts_puts_and_bytes_per_store() -> None:
    rows = checkpoint_growth.main(tokens=(40, 400), stores=("memory", "file", "diskcache"))

    by_store = {(r.store, r.tokens): r for r in rows}
    for store in ("memory", "file", "diskcache"):
        small, large = by_store[store, 40], by_store[store, 400]
        # every 8 chunks of 4 characters at most: the writer coalesces what the
        # store has not taken yet into one put; a turn that ends within the
        # gathering time may drop its last one for its closing delete
        assert small.puts <= 5
        assert large.puts <= 50
        assert large.time_growth is not None
    assert by_store["memory", 40].puts >= 1  # written on the stream's thread at once
    assert by_store["file", 40].puts >= 1  # taken by the writer thread with the delete
    assert by_store["memory", 400].bytes_written is None
    for store in ("file", "diskcache"):
        written = by_store[store, 400].bytes_written
        assert written is not None
        assert written >= 1_600  # at least the text itself


def test_seam_accuracy_benchmark_deletes_no_text_and_removes_every_removable_repeat(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rows, long = seam_accuracy.main(quick=True)

    kinds = seam_accuracy.kinds_of(rows)
    total = seam_accuracy.totals(rows, kinds=kinds)
    assert total.cases > 3_000
    assert total.deleted_chars == 0
    assert total.repeats_left == 0  # what is kept by design is counted apart, by reason
    natural = seam_accuracy.totals(rows, "natural", kinds)
    assert natural.exact == natural.cases
    assert {r.repeat for r in rows} >= {
        "natural",
        "glued 1 word",
        "spaced 2 words",
        "spaced 12 words",
        "sentence spaced",
        "line from its first word",
        "line with its indentation",
        "paragraph 1500+",
    }
    assert {r.kind for r in rows} >= {
        "prose",
        "markdown",
        "python",
        "json",
        "numbers",
        "cjk",
        "doubled",
        "squares",
    }
    assert all(r.removed for r in long)
    out = capsys.readouterr().out
    assert "chars wrongly deleted" in out
    assert "The ambiguities, both ways" in out
    assert "class kept by design" in out  # each class, and what removing it deletes


def test_seam_accuracy_benchmark_runs_without_the_recorded_streams(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    texts = seam_accuracy.corpus(tmp_path / "absent")
    assert "realwire" not in {t.kind for t in texts}
    rows = seam_accuracy.measure(every=50, texts=texts)
    assert seam_accuracy.totals(rows, kinds=seam_accuracy.kinds_of(rows)).deleted_chars == 0


@pytest.mark.slow
def test_recovery_latency_benchmark_resumes_in_a_fresh_process() -> None:
    rows, resumed = recovery_latency.main(prefixes=(256, 1_024), repeats=1, processes=1)

    assert {(r.path, r.store, r.prefix) for r in rows} == {
        (path, store, prefix)
        for path in ("sync", "async")
        for store in ("none", "memory", "diskcache")
        for prefix in (256, 1_024)
    }
    assert all(0 < r.median_ms <= r.max_ms for r in rows)
    (child,) = resumed
    assert child["resumed"] is True
    assert child["complete"] is True
    assert child["requests"] == 1


@pytest.mark.slow
def test_wasted_work_benchmark_counts_what_each_strategy_made_the_provider_generate() -> None:
    rows = wasted_work.main(tokens=100, fractions=(0.5,), delay=0.0)

    by_strategy = {r.strategy: r for r in rows}
    assert by_strategy["provider resume"].generated_tokens == 100
    assert by_strategy["continuation"].generated_tokens == 100
    assert by_strategy["continuation"].resent_tokens == 50
    assert by_strategy["restart"].generated_tokens == 150
    assert by_strategy["no recovery"].generated_tokens == 50
    assert [by_strategy[s].complete for s in wasted_work.STRATEGIES] == [True, True, True, False]
    # provider resume: one creation and one retrieval, no second generation
    assert [by_strategy[s].requests for s in wasted_work.STRATEGIES] == [2, 2, 2, 1]


@pytest.mark.slow
def test_concurrency_benchmark_checks_every_turn_kept_its_own_text() -> None:
    rows = concurrency.main(streams=8, processes=2, chars=64, stores=("memory", "diskcache"))

    assert [(r.case, r.store) for r in rows] == [
        ("1 process x 8", "memory"),
        ("1 process x 8", "diskcache"),
        ("2 processes x 4", "diskcache"),
    ]
    for row in rows:
        assert row.ok == row.turns == 8
        assert row.left == 0
        assert row.puts > 0


@pytest.mark.slow
def test_paced_benchmark_measures_store_waits_and_checkpoint_lag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rows = concurrency.paced(streams=4, processes=2, chars=48, stores=("diskcache",))

    assert [(r.case, r.store) for r in rows] == [
        ("1 process x 4", "bare"),
        ("1 process x 4", "diskcache"),
        ("2 processes x 2", "bare"),
        ("2 processes x 2", "diskcache"),
    ]
    for row in rows:
        assert row.ok == row.turns == 4
        assert row.left == 0
        assert row.chunks == 4 * 12
    for row in rows[1::2]:
        assert row.wait_p50_ms >= 0
        assert row.wait_max_ms >= row.wait_p99_ms
        assert 0 < row.lagged_chunks <= row.chunks
        assert row.lag_p50_ms > 0
        assert row.set_floor_us is not None
        assert row.set_floor_us > 0
    out = capsys.readouterr().out
    assert "lag p99 ms" in out
    assert "Goal: chunk lateness p99 at most 20 ms over the bare stream's: " in out


@pytest.mark.slow
def test_paced_benchmark_without_full_collections_leaves_the_collector_as_it_found_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    before = gc.get_threshold()

    rows = concurrency.paced(streams=2, processes=2, chars=24, stores=("diskcache",), full_gc=False)

    assert gc.get_threshold() == before
    assert all(row.ok == row.turns == 2 and row.left == 0 for row in rows)
    assert "no full collections" in capsys.readouterr().out


@pytest.mark.slow
def test_lock_wait_benchmark_compares_polling_with_sqlites_sleeps_and_keeps_every_turn(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rows = lock_wait.main(processes=2, groups=10, runs=2, rounds=1)

    assert [r.case for r in rows] == ["polls", "SQLite sleeps"]
    for row in rows:
        assert row.intact
        assert row.groups == 2 * 10
        assert row.wait_max_ms >= row.wait_p99_ms >= row.wait_p50_ms >= 0
        assert row.cpu_us_per_group > 0
    assert "lock wait p99 ms" in capsys.readouterr().out


@pytest.mark.slow
def test_capacity_benchmark_compares_the_wrapper_with_the_bare_model(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rows = capacity.main(chars=24, start=2, limit=4, same_rounds=1)

    assert [r.kind for r in rows] == ["bare", "diskcache"]
    for row in rows:
        assert row.trials >= 1
        assert row.cpu_us_per_chunk > 0
        assert row.same_count_us is not None
        assert row.same_count_us > 0
    out = capsys.readouterr().out
    assert "wrapped / bare" in out
    assert "median of 1 trials" in out


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_instruction_benchmark_counts_what_the_wrapper_adds_to_each_chunk() -> None:
    cases = (instructions.CASES[0], instructions.CASES[2])
    rows = instructions.measure(chunks=500, short=100, seeds=1, paths=("async",), cases=cases)

    assert [(r.path, r.case) for r in rows] == [("async", c) for c in cases]
    bare, wrapped = rows
    assert bare.ratio == 1.0
    assert bare.mean > 10_000  # a chunk costs tens of thousands of instructions
    assert bare.mean_without_gc > 10_000
    assert wrapped.ratio > 1.0  # the wrapper does work of its own on every chunk
    assert wrapped.ratio_without_gc > 1.0
    assert bare.ratio_without_gc == 1.0


_VIRTUAL_TURNS = """
import time
real = time.monotonic
import benchmarks._virtual_clock as v
v.install()
import asyncio, json, tempfile, uuid
from pathlib import Path
from awaken_langchain import DiskCacheStreamCheckpointStore, RecoveringChatModel
from benchmarks._common import PacedModel

async def main(directory):
    inner = PacedModel(chars=120, rate=30.0)  # 30 chunks in 1 s
    store = DiskCacheStreamCheckpointStore(directory)
    model = RecoveringChatModel(model=inner, store=store)

    async def turn(i):
        chunks = [c async for c in model.astream(f"q{i}", config={"run_id": uuid.uuid4()})]
        return chunks[-1].response_metadata["awaken"]["checkpoint_writes"]

    try:
        return await asyncio.gather(*(turn(i) for i in range(4)))
    finally:
        store.close()

started, virtual = real(), v.now()
with tempfile.TemporaryDirectory() as tmp:
    writes = v.VirtualClockLoop().run_until_complete(main(Path(tmp)))
print(json.dumps({"writes": writes, "real": real() - started, "virtual": v.now() - virtual}))
"""


def test_sdk_instruction_goals_are_judged_on_the_worst_ratio_of_every_path() -> None:
    def row(provider: str, path: str, case: str, ratio: float) -> sdk_instructions.Row:
        return sdk_instructions.Row(provider, path, "unpaced", case, 0.0, 0.0, 0.0, ratio=ratio)

    lines = sdk_instructions.goal_lines(
        [
            row("openai", "sync", "bare", 1.0),
            row("openai", "sync", "none", 1.004),
            row("anthropic", "async", "none", 1.005),
            row("openai", "sync", "memory", 1.019),
            row("anthropic", "async", "memory", 1.021),
            row("openai", "sync", "file", 1.5),  # reported beside the goals, not judged
        ]
    )
    assert lines == [
        "Goal: wrapper, no store <= 1.005x the bare integration: met "
        "(anthropic async unpaced 1.005x, openai sync unpaced 1.004x).",
        "Goal: wrapper, in-memory store <= 1.02x the bare integration: NOT met "
        "(anthropic async unpaced 1.021x, openai sync unpaced 1.019x).",
    ]
    at_24 = sdk_instructions.goal_lines([row("openai", "sync", "memory", 1.01)], every_chunks=24)
    assert at_24 == [
        "Goal: wrapper, in-memory store <= 1.02x the bare integration "
        "[at checkpoint_every_chunks=24]: met (openai sync unpaced 1.010x)."
    ]


def test_paced_turns_on_the_virtual_clock_keep_their_schedule_and_checkpoint_as_at_full_speed() -> (
    None
):
    result, _ = run_child(_VIRTUAL_TURNS, what="paced turns on the virtual clock", timeout=120)
    # 30 chunks at 30 chunks/s, the last due 29/30 s in: that long on the turn's own
    # clock, in less real time
    assert result["virtual"] >= 29 / 30
    assert result["real"] < result["virtual"]
    # a write every 8 chunks or 0.25 s (the shared moments may add one): as when paced for real
    assert all(4 <= writes <= 6 for writes in result["writes"]), result["writes"]


def test_callgrind_costs_are_summed_per_object_without_counting_calls_twice(
    tmp_path: Path,
) -> None:
    out = tmp_path / "callgrind.out"
    out.write_text(
        "events: Ir\n"
        "ob=(1) /lib/libpython.so\nfl=(1) a.c\nfn=(1) main\n"
        "10 100\n"
        "cob=(2) /lib/libsqlite3.so\ncfi=(2) b.c\ncfn=(2) step\ncalls=1 20\n"
        "11 500\n"
        "+1 7\n"
        "ob=(2)\nfl=(2)\nfn=(2)\n"
        "20 500\n"
        "totals: 607\n"
    )
    total, by_object = paced_instructions._self_costs_by_object(out)

    assert total == 607
    assert by_object == {"/lib/libpython.so": 107, "/lib/libsqlite3.so": 500}


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_paced_instruction_count_of_diskcache_tells_what_sqlite_executed() -> None:
    case = paced_instructions.CASES.index("wrapper, diskcache")
    total, sqlite, chunks, writes = paced_instructions._count(case, 2, 40, 30.0, collector=True)

    assert chunks == 2 * 10
    assert writes >= 2  # every turn writes, if only its closing write
    assert 0 < sqlite < total


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.postgres
def test_server_store_benchmark_measures_every_store_beside_the_insert_floor() -> None:
    rows = server_stores.main(puts=3, turns=1, concurrent=2)

    assert [r.kind for r in rows] == list(server_stores.KINDS)
    for row in rows:
        assert row.put_us > 0
        assert row.concurrent_p99_us >= row.concurrent_median_us > 0
        assert row.bytes_per_turn > 0  # the servers saw the turn
    postgres, floor = rows[0], rows[1]
    assert postgres.bytes_per_turn > floor.bytes_per_turn / 2  # the same text, as WAL


def test_all_benchmarks_run_from_one_command() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--help"],
        cwd=REPO_ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert "--quick" in out.stdout


def test_quick_run_runs_every_benchmark_the_full_run_runs() -> None:
    from benchmarks.__main__ import _full_steps, _quick_steps

    quick = [name for name, _ in _quick_steps()]
    # the real-SDK instruction counts are left out: sdk_overhead streams the same cases
    assert quick == [name for name, _ in _full_steps() if name != "sdk_instructions"]


def test_quick_instruction_checks_stream_every_case_uncounted(
    capsys: pytest.CaptureFixture[str],
) -> None:
    instructions.check(chunks=20)
    paced_instructions.check(streams=2, chars=20)
    snapshot_instructions.check()
    out = capsys.readouterr().out
    assert "every case streamed its 20 chunks" in out
    assert "every case's 2 turns delivered their text" in out
    assert "each store held the turn's text" in out
    assert gc.isenabled()


def test_readers_benchmark_checks_every_follower_read_every_delta_once_in_order(
    capsys: pytest.CaptureFixture[str],
) -> None:
    results = readers.main(
        runs=2, followers=2, processes=0, chars=40, rate=200.0, sizes=(1_000,), repeats=1
    )

    stores = [row.store for row in results.deltas]
    assert stores[:3] == ["memory", "file", "diskcache"]
    servers = [name for name in ("redis", "postgres") if name in stores]
    assert stores == ["memory", "file", "diskcache", *servers]
    assert all(not row.problems for row in results.deltas)
    assert all(row.complete == row.followers == 4 for row in results.deltas)
    assert all(row.deltas > 0 for row in results.deltas)  # latencies of the deltas after attach
    assert {(r.store, r.via, r.after) for r in results.reconnects} == {
        (store, via, after)
        for store in stores
        for via in ("follow()", "HTTP GET")
        for after in ("0", "last - 1")
    }
    out = capsys.readouterr().out
    table_rows = out.split("## Readers: reconnect")[0].splitlines()
    for store in stores:
        assert any(line.startswith(store) for line in table_rows)
    assert "redis" in stores or "redis: skipped" in out
    assert "postgres" in stores or "postgres: skipped" in out
    assert "Goal: delta visible to a follower, p99 <= 50 ms: " in out
    assert "Goal: reconnect, first event <= 100 ms at any length, HTTP GET: " in out


def test_readers_benchmark_flags_a_follower_that_missed_or_repeated_a_delta() -> None:
    answer = "abcdefgh"
    stamps = [(4, 10), (8, 20)]

    def result(*texts: str) -> dict[str, object]:
        events = [(30, 1, "started", "")]
        events += [(40 + n, n + 2, "text", t) for n, t in enumerate(texts)]
        events.append((60, len(events) + 1, "completed", ""))
        return {"attached": 0, "events": events}

    latencies, _, problem = readers.check_follower(result("abcd", "efgh"), answer, stamps, 0)
    assert problem is None
    assert latencies == [30 / 1e6, 21 / 1e6]
    assert readers.check_follower(result("abcd", "abcd", "efgh"), answer, stamps, 0)[2]
    assert readers.check_follower(result("abcd"), answer, stamps, 0)[2]
    assert readers.check_follower(result("efgh", "abcd"), answer, stamps, 0)[2]
