"""Readers of a running answer: how late a follower sees a delta, and how fast a reader rejoins.

Measured side by side in one run, on the in-process, file, DiskCache, Redis and
PostgreSQL stores (Redis and PostgreSQL on private servers started as the test
suite does; each skipped with a note when it is not installed).

Delta latency. ``runs`` turns stream at once in this process, each a thread
calling ``RecoveringChatModel.stream`` around an inner model that streams its
own answer (``chunk_chars`` characters per chunk, ``rate`` chunks per second,
after a first-token wait of ``ttft``) and stamps every chunk with
``time.monotonic_ns()`` as it hands it over: the moment the producer got the
delta. ``followers`` readers per run call ``follow(store, run_id)`` from the
start and stamp every event as they receive it. The in-process store's
followers are threads of this process (they must be); the other stores'
followers are threads in ``processes`` child processes (0 puts them in this
process too), so the events cross processes as they do in a deployment; the
clock (``CLOCK_MONOTONIC``) is the same in every process. The log merges
consecutive text, so an event carries one or more deltas: a delta counts as
visible when the text received reaches its end. Latency is taken over the
deltas the producer got after the follower attached. The p99 "from 0.5 s" leaves
out the answer's first half second, while the producer has not yet noticed
that the run is followed and appends at the checkpoint cadence (0.25 s).
Goal: p99 <= 50 ms. Each follower is also checked: its offsets run 1, 2, 3...,
its text is the answer (every delta once, in order), its last event ``completed``.

Reconnect. A turn streams an answer of 1 KB, 100 KB or 1 MB (64-character
chunks, unpaced, nobody following) and then waits, still running. A reader in
this process then calls ``follow(store, run_id, after=N)`` and takes the first
event, ``repeats`` times: ``after=0`` (a new tab, the whole answer replayed
first) and ``after=last - 1`` (a reload that missed the last event); and the
same over HTTP: ``GET /runs/{id}/events?after=N`` on ``reader_app(store)``
served by uvicorn in this process, timed from the request to the first event
(the ``id:`` line) on the socket, after one untimed request that warms the
server up. Goal: <= 100 ms at any length (the worst
repeat is judged).

Not measured here: the cost of a turn nobody follows, which is in
``benchmarks.sdk_instructions`` (instructions per chunk, bare and wrapped).

Run: ``python -m benchmarks.readers [--quick] [--runs 10] [--followers 10]
[--processes 2]``.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script from a clone
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from pydantic import PrivateAttr

from awaken_langchain import RecoveringChatModel, StreamCheckpointStore, UnknownRunError, follow
from benchmarks._common import (
    LARGE,
    REPO_ROOT,
    answer_for,
    child_env,
    machine_line,
    make_store,
    median,
    percentile,
    redis_server,
    store_names,
    table,
)

DELTA_GOAL_MS = 50.0
"""Goal: a follower sees a delta at most this long after the producer got it (p99)."""
RECONNECT_GOAL_MS = 100.0
"""Goal: a reader that rejoins gets its first event within this long."""
STEADY_AFTER_S = 0.5
"""Seconds into an answer after which the producer has noticed its followers."""
SIZES = (1_000, 100_000, 1_000_000)
"""Answer lengths so far (characters) at which readers reconnect."""


POSTGRES_DSN = "AWAKEN_BENCH_POSTGRES_DSN"
"""Environment variable with the DSN of the benchmark's PostgreSQL (its child processes read it)."""


@contextlib.contextmanager
def postgres_server() -> Iterator[str | None]:
    """A private PostgreSQL (the test suite's), or ``None`` when it or psycopg is missing."""
    from importlib.util import find_spec

    if find_spec("psycopg_pool") is None or not (
        glob.glob("/usr/lib/postgresql/*/bin/initdb") or shutil.which("initdb")
    ):
        yield None
        return
    from tests.postgres_server import PostgresServer

    server = PostgresServer(Path(tempfile.mkdtemp(prefix="bench-postgres-")))
    server.start()
    os.environ[POSTGRES_DSN] = server.dsn
    try:
        yield server.dsn
    finally:
        del os.environ[POSTGRES_DSN]
        server.remove()


def open_store(name: str, directory: Path, redis_url: str | None) -> StreamCheckpointStore:
    """`make_store`, and the PostgreSQL store (tables named after ``directory``)."""
    if name != "postgres":
        return make_store(name, directory, redis_url)
    from awaken_langchain.stores.postgres import PostgresStreamCheckpointStore

    table = "bench_" + hashlib.sha256(str(directory).encode()).hexdigest()[:16]
    return PostgresStreamCheckpointStore(
        os.environ[POSTGRES_DSN], table=table, max_checkpoint_bytes=LARGE, max_connections=20
    )


class StampedModel(BaseChatModel):
    """An inner model that streams each question's answer, paced, and stamps each chunk.

    For every question it records ``(end, ns)`` per chunk: where the chunk
    ends in the answer and ``time.monotonic_ns()`` when it was handed over.
    With ``hold`` set it streams the whole answer unpaced, then waits for the
    event before it finishes (a turn still running).
    """

    chars: int = 600
    chunk_chars: int = 4
    rate: float = 50.0
    ttft: float = 0.3

    _stamps: dict[str, list[tuple[int, int]]] = PrivateAttr(default_factory=dict)
    _hold: threading.Event | None = PrivateAttr(default=None)
    _held: threading.Event = PrivateAttr(default_factory=threading.Event)

    @property
    def _llm_type(self) -> str:
        return "stamped"

    def hold(self, gate: threading.Event) -> None:
        """Stream unpaced, then wait for ``gate`` before the finish chunk."""
        self._hold = gate

    @property
    def held(self) -> threading.Event:
        """Set once the whole answer was handed over and the turn waits."""
        return self._held

    def stamps(self, question: str) -> list[tuple[int, int]]:
        """The ``(end, monotonic_ns)`` of each chunk of ``question``'s answer."""
        return self._stamps.get(question, [])

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        raise NotImplementedError("StampedModel only streams")

    def _stream(
        self, messages: list[BaseMessage], *args: Any, **kwargs: Any
    ) -> Iterator[ChatGenerationChunk]:
        question = str(messages[-1].content)
        answer = answer_for(question, self.chars)
        stamps = self._stamps.setdefault(question, [])
        paced = self._hold is None
        if paced:
            time.sleep(self.ttft)
        start = time.perf_counter()
        step = 1.0 / self.rate
        for n, i in enumerate(range(0, len(answer), self.chunk_chars)):
            if paced:
                wait = start + n * step - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
            piece = answer[i : i + self.chunk_chars]
            stamps.append((i + len(piece), time.monotonic_ns()))
            yield ChatGenerationChunk(message=AIMessageChunk(content=piece))
        if self._hold is not None:
            self._held.set()
            self._hold.wait(600)
        yield ChatGenerationChunk(
            message=AIMessageChunk(content="", response_metadata={"finish_reason": "stop"})
        )


# -- followers ---------------------------------------------------------------------------


def follow_run(store: Any, run_id: str) -> dict[str, Any]:
    """Follow ``run_id`` from the start; every event with the moment it arrived."""
    while True:
        try:
            events = follow(store, run_id)
            break
        except UnknownRunError:  # the producer has not written its first event yet
            time.sleep(0.002)
    attached = time.monotonic_ns()
    got = [(time.monotonic_ns(), e.offset, e.type, e.text) for e in events]
    return {"run": run_id, "attached": attached, "events": got}


def follow_runs(store: Any, run_ids: list[str], per_run: int) -> tuple[list[Any], list[Any]]:
    """Start ``per_run`` follower threads per run; return the threads and their results."""
    results: list[Any] = []
    threads = []
    for run_id in run_ids:
        for _ in range(per_run):
            thread = threading.Thread(
                target=lambda r=run_id: results.append(follow_run(store, r)), daemon=True
            )
            thread.start()
            threads.append(thread)
    return threads, results


def follower_process() -> None:
    """A child process of followers: arguments as JSON in argv[1], results as JSON on stdout."""
    args = json.loads(sys.argv[1])
    store = open_store(args["store"], Path(args["directory"]), args["redis_url"])
    threads, results = follow_runs(store, args["runs"], args["per_run"])
    print("ready", flush=True)
    for thread in threads:
        thread.join(600)
    print(json.dumps(results))


_CHILD = "from benchmarks.readers import follower_process; follower_process()"


@dataclass
class DeltaRow:
    """Delta latency on one store."""

    store: str
    followers: int
    where: str
    deltas: int = 0
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    p99_steady_ms: float = float("nan")
    max_ms: float = float("nan")
    complete: int = 0
    """Followers whose events were the whole answer, each delta once and in order."""
    problems: list[str] = field(default_factory=list)

    @property
    def met(self) -> bool:
        return self.p99_ms <= DELTA_GOAL_MS and self.complete == self.followers


def check_follower(
    result: dict[str, Any], answer: str, stamps: list[tuple[int, int]], steady_ns: int
) -> tuple[list[float], list[float], str | None]:
    """The follower's delta latencies (all, steady) in ms, and what was wrong, if anything."""
    events = result["events"]
    offsets = [offset for _, offset, _, _ in events]
    if offsets != list(range(1, len(events) + 1)):
        return [], [], f"offsets {offsets[:5]}... are not 1, 2, 3..."
    if not events or events[-1][2] != "completed":
        return [], [], "no completed event at the end"
    text = ""
    latencies: list[float] = []
    steady: list[float] = []
    j = 0
    for received, _, kind, piece in events:
        if kind != "text":
            continue
        text += piece
        while j < len(stamps) and stamps[j][0] <= len(text):
            if stamps[j][1] >= result["attached"]:
                late = (received - stamps[j][1]) / 1e6
                latencies.append(late)
                if stamps[j][1] >= steady_ns:
                    steady.append(late)
            j += 1
    if text != answer:
        return [], [], "its text is not the answer"
    return latencies, steady, None


def measure_deltas(
    name: str,
    directory: Path,
    redis_url: str | None,
    *,
    runs: int,
    followers: int,
    processes: int,
    chars: int,
    rate: float,
) -> DeltaRow:
    """``runs`` concurrent turns on store ``name``, ``followers`` readers each."""
    store = open_store(name, directory, redis_url)
    inner = StampedModel(chars=chars, rate=rate)
    model = RecoveringChatModel(model=inner, store=store)
    run_ids = [uuid.uuid4() for _ in range(runs)]
    questions = [f"run{i}" for i in range(runs)]
    ids = [str(r) for r in run_ids]
    local = name == "memory" or processes == 0
    children: list[subprocess.Popen[str]] = []
    results: list[Any] = []
    threads: list[threading.Thread] = []
    if local:
        threads, results = follow_runs(store, ids, followers)
        where = "threads, this process"
    else:
        where = f"threads in {processes} processes"
        for k in range(processes):
            mine = ids[k::processes]
            if not mine:
                continue
            args = {
                "store": name,
                "directory": str(directory),
                "redis_url": redis_url,
                "runs": mine,
                "per_run": followers,
            }
            child = subprocess.Popen(
                [sys.executable, "-c", _CHILD, json.dumps(args)],
                cwd=REPO_ROOT,
                env=child_env(),
                stdout=subprocess.PIPE,
                text=True,
            )
            children.append(child)
        for child in children:  # every follower is waiting for its run
            assert child.stdout is not None
            if child.stdout.readline().strip() != "ready":
                raise RuntimeError("a follower process did not start")
    answers: dict[str, str] = {}

    def produce(run_id: uuid.UUID, question: str) -> None:
        answers[question] = "".join(
            str(c.content) for c in model.stream(question, config={"run_id": run_id})
        )

    producers = [
        threading.Thread(target=produce, args=(r, q))
        for r, q in zip(run_ids, questions, strict=True)
    ]
    for producer in producers:
        producer.start()
    for producer in producers:
        producer.join(600)
    for thread in threads:
        thread.join(600)
    for child in children:
        out, _ = child.communicate(timeout=600)
        if child.returncode != 0:
            raise RuntimeError(f"a follower process failed ({child.returncode})")
        results.extend(json.loads(out.strip().splitlines()[-1]))
    with contextlib.suppress(Exception):
        store.close()
    row = DeltaRow(name, runs * followers, where)
    latencies: list[float] = []
    steady: list[float] = []
    by_run = dict(zip(ids, questions, strict=True))
    for result in results:
        question = by_run[result["run"]]
        answer = answer_for(question, chars)
        if answers.get(question) != answer:
            row.problems.append(f"the producer of {question} did not return its answer")
            continue
        stamps = inner.stamps(question)
        steady_ns = stamps[0][1] + int(STEADY_AFTER_S * 1e9)
        found, found_steady, problem = check_follower(result, answer, stamps, steady_ns)
        if problem is not None:
            row.problems.append(f"{question}: {problem}")
            continue
        row.complete += 1
        latencies.extend(found)
        steady.extend(found_steady)
    row.deltas = len(latencies)
    row.p50_ms = percentile(latencies, 0.5)
    row.p99_ms = percentile(latencies, 0.99)
    row.p99_steady_ms = percentile(steady, 0.99)
    row.max_ms = max(latencies, default=float("nan"))
    return row


# -- reconnect ---------------------------------------------------------------------------


@dataclass
class ReconnectRow:
    """Time to the first event of a reader that rejoins a running answer."""

    store: str
    size: int
    via: str
    after: str
    events: int
    median_ms: float
    max_ms: float

    @property
    def met(self) -> bool:
        return self.max_ms <= RECONNECT_GOAL_MS


@contextlib.contextmanager
def serve(store: Any) -> Iterator[int]:
    """``reader_app(store)`` served by uvicorn on a free loopback port, in a thread."""
    import uvicorn

    from awaken_langchain.web import reader_app

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    server = uvicorn.Server(
        uvicorn.Config(reader_app(store), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(30)


def http_first_event(port: int, run_id: str, after: int) -> float:
    """Seconds from sending ``GET /runs/{run_id}/events?after=`` to its first event's ``id:``."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        request = (
            f"GET /runs/{run_id}/events?after={after} HTTP/1.1\r\n"
            "Host: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n"
        ).encode()
        start = time.perf_counter()
        sock.sendall(request)
        seen = b""
        while b"\nid: " not in seen:
            data = sock.recv(65536)
            if not data:
                raise RuntimeError(f"the stream ended before its first event: {seen[:200]!r}")
            seen = seen[-16:] + data if b"\r\n\r\n" in seen else seen + data
            if seen.startswith(b"HTTP/1.1 ") and not seen.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"GET events answered {seen[:200]!r}")
        return time.perf_counter() - start


def measure_reconnects(
    name: str,
    directory: Path,
    redis_url: str | None,
    *,
    sizes: tuple[int, ...],
    repeats: int,
    http: bool,
) -> list[ReconnectRow]:
    """Readers that rejoin a running answer of each size, by ``follow`` and over HTTP."""
    store = open_store(name, directory, redis_url)
    rows = []
    warm = False
    with serve(store) if http else contextlib.nullcontext(0) as port:
        for size in sizes:
            gate = threading.Event()
            inner = StampedModel(chars=size, chunk_chars=64)
            inner.hold(gate)
            model = RecoveringChatModel(model=inner, store=store)
            run_id = uuid.uuid4()
            rid = str(run_id)
            producer = threading.Thread(
                target=lambda m=model, r=run_id: list(m.stream("long", config={"run_id": r}))
            )
            producer.start()
            try:
                if not inner.held.wait(600):
                    raise RuntimeError("the producer did not stream its answer")
                count = _wait_for_text(store, rid, size)
                for after, label in ((0, "0"), (count - 1, "last - 1")):
                    timings = []
                    for _ in range(repeats):
                        start = time.perf_counter()
                        events = follow(store, rid, after=after)
                        next(events)
                        timings.append(time.perf_counter() - start)
                        events.close()  # type: ignore[attr-defined]
                    rows.append(_reconnect_row(name, size, "follow()", label, count, timings))
                    if http:
                        if not warm:  # the server's first request imports what it needs
                            http_first_event(port, rid, after)
                            warm = True
                        timings = [http_first_event(port, rid, after) for _ in range(repeats)]
                        rows.append(_reconnect_row(name, size, "HTTP GET", label, count, timings))
            finally:
                gate.set()
                producer.join(600)
    with contextlib.suppress(Exception):
        store.close()
    return rows


def _reconnect_row(
    store: str, size: int, via: str, after: str, count: int, timings: list[float]
) -> ReconnectRow:
    ms = [t * 1000 for t in timings]
    return ReconnectRow(store, size, via, after, count, median(ms), max(ms))


def _wait_for_text(store: Any, run_id: str, size: int) -> int:
    """Wait until the run's log holds ``size`` characters of text; its event count."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(UnknownRunError):
            events = follow(store, run_id)
            text = 0
            count = 0
            for event in events:
                count = event.offset
                text += len(event.text)
                if text >= size:
                    events.close()  # type: ignore[attr-defined]
                    return count
        time.sleep(0.05)
    raise RuntimeError(f"the log of {run_id} never held {size} characters")


# -- the run -----------------------------------------------------------------------------


@dataclass
class Results:
    """What `main` measured."""

    deltas: list[DeltaRow]
    reconnects: list[ReconnectRow]
    skipped: list[str]


def goal_lines(deltas: list[DeltaRow], reconnects: list[ReconnectRow]) -> list[str]:
    """Each goal, and on which stores it is met (the worst case of each store is judged)."""
    stores = list(dict.fromkeys([r.store for r in deltas] + [r.store for r in reconnects]))

    def verdict(rows: list[Any]) -> str:
        met = [s for s in stores if any(r.store == s for r in rows)]
        missed = [s for s in met if not all(r.met for r in rows if r.store == s)]
        met = [s for s in met if s not in missed]
        parts = [f"met on {', '.join(met)}"] if met else []
        parts += [f"NOT met on {', '.join(missed)}"] if missed else []
        return "; ".join(parts) or "not measured"

    return [
        f"Goal: delta visible to a follower, p99 <= {DELTA_GOAL_MS:g} ms: {verdict(deltas)}.",
        *(
            f"Goal: reconnect, first event <= {RECONNECT_GOAL_MS:g} ms at any length, {via}: "
            f"{verdict([r for r in reconnects if r.via == via])}."
            for via in dict.fromkeys(r.via for r in reconnects)
        ),
    ]


def _size(chars: int) -> str:
    return f"{chars // 1_000_000} MB" if chars >= 1_000_000 else f"{chars // 1_000} KB"


def main(
    *,
    runs: int = 10,
    followers: int = 10,
    processes: int = 2,
    chars: int = 600,
    rate: float = 50.0,
    sizes: tuple[int, ...] = SIZES,
    repeats: int = 10,
    http: bool = True,
) -> Results:
    """Measure both goals on every store and print the tables."""
    skipped = []
    names = store_names()
    if "redis" not in names:
        skipped.append("redis: skipped, redis-server (or the redis package) is not installed")
    deltas: list[DeltaRow] = []
    reconnects: list[ReconnectRow] = []
    with redis_server() as redis_url, postgres_server() as dsn:
        if dsn is None:
            skipped.append("postgres: skipped, PostgreSQL (or psycopg) is not installed")
        else:
            names.append("postgres")
        for name in names:
            with tempfile.TemporaryDirectory(prefix="bench-readers-") as directory:
                deltas.append(
                    measure_deltas(
                        name,
                        Path(directory),
                        redis_url,
                        runs=runs,
                        followers=followers,
                        processes=processes,
                        chars=chars,
                        rate=rate,
                    )
                )
            with tempfile.TemporaryDirectory(prefix="bench-readers-") as directory:
                reconnects.extend(
                    measure_reconnects(
                        name, Path(directory), redis_url, sizes=sizes, repeats=repeats, http=http
                    )
                )
    print(
        f"## Readers: delta latency, {runs} concurrent runs x {followers} followers "
        f"({chars} characters in {chars // 4} chunks at {rate:g} chunks/s; {machine_line()})"
    )
    print()
    print(
        table(
            [
                "store",
                "followers (where)",
                "deltas",
                "p50 ms",
                "p99 ms",
                "p99 from 0.5 s",
                "max ms",
                "complete",
                f"p99 <= {DELTA_GOAL_MS:g} ms",
            ],
            [
                [
                    r.store,
                    f"{r.followers} ({r.where})",
                    r.deltas,
                    r.p50_ms,
                    r.p99_ms,
                    r.p99_steady_ms,
                    r.max_ms,
                    f"{r.complete}/{r.followers}",
                    "met" if r.met else "NOT met",
                ]
                for r in deltas
            ],
        )
    )
    for r in deltas:
        for problem in r.problems[:5]:
            print(f"  {r.store}: {problem}")
    print()
    print(f"## Readers: reconnect to a running answer, first event ({repeats} repeats)")
    print()
    print(
        table(
            [
                "store",
                "answer so far",
                "via",
                "after",
                "events in log",
                "median ms",
                "max ms",
                f"<= {RECONNECT_GOAL_MS:g} ms",
            ],
            [
                [
                    r.store,
                    _size(r.size),
                    r.via,
                    r.after,
                    r.events,
                    r.median_ms,
                    r.max_ms,
                    "met" if r.met else "NOT met",
                ]
                for r in reconnects
            ],
        )
    )
    for note in skipped:
        print(note)
    print()
    for line in goal_lines(deltas, reconnects):
        print(line)
    print(
        "A turn nobody follows: instructions per chunk in `python -m benchmarks.sdk_instructions`."
    )
    print()
    return Results(deltas, reconnects, skipped)


def quick() -> Results:
    """`main` at a small size (a smoke run: a few seconds, followers in this process)."""
    return main(
        runs=2, followers=2, processes=0, chars=80, rate=100.0, sizes=(1_000, 10_000), repeats=2
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--runs", type=int, default=10, help="concurrent runs")
    parser.add_argument("--followers", type=int, default=10, help="followers per run")
    parser.add_argument(
        "--processes", type=int, default=2, help="follower processes (0: threads in this one)"
    )
    parser.add_argument("--repeats", type=int, default=10, help="reconnects per case")
    options = parser.parse_args()
    if options.quick:
        quick()
    else:
        main(
            runs=options.runs,
            followers=options.followers,
            processes=options.processes,
            repeats=options.repeats,
        )
