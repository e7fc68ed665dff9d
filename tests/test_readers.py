"""Readers: follow a run by offset from any process, and stop it from anywhere.

The producer is `RecoveringChatModel` around the real ``ChatOpenAI`` talking to
the loopback provider; the stores are real (in-process, file, DiskCache, a
real ``redis-server``, a real PostgreSQL).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
import signal
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from multiprocessing.context import ForkServerContext
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessageChunk

from awaken_langchain import (
    DiskCacheStreamCheckpointStore,
    FileStreamCheckpointStore,
    InMemoryStreamCheckpointStore,
    RecoveringChatModel,
    RetryPolicy,
    RunEvent,
    RunOffsetError,
    StreamCheckpointStore,
    UnknownRunError,
    _runlog,
    afollow,
    arequest_stop,
    follow,
    request_stop,
)
from awaken_langchain.testing import (
    Fault,
    LoopbackProvider,
    Scenario,
    ScriptedToolCall,
    continuation_responder,
)
from tests import readers_child
from tests.conftest import loopback_client
from tests.fork_server import fork_server
from tests.postgres_server import shared_postgres_server, table_for
from tests.redis_server import RedisServer, unique_prefix

ANSWER = " ".join(
    f"Sentence {n} of the story tells how the fox crossed river number {n}." for n in range(12)
)
STORES = ["memory", "file", "diskcache", "redis", "postgres"]


@pytest.fixture
def server(shared_server: LoopbackProvider) -> LoopbackProvider:
    shared_server.reset()
    shared_server.default = continuation_responder(Scenario(text=ANSWER, chunk_size=6))
    return shared_server


@pytest.fixture(params=STORES)
def store_spec(request: pytest.FixtureRequest, tmp_path: Path) -> list[str]:
    kind = request.param
    if kind == "redis":
        redis_server: RedisServer = request.getfixturevalue("redis_server")
        return ["redis", redis_server.url, unique_prefix()]
    if kind == "postgres":
        return ["postgres", shared_postgres_server().dsn, table_for(tmp_path / "store")]
    return [kind, str(tmp_path / "store")]


def open_store(spec: list[str], *, reader: bool = False) -> StreamCheckpointStore:
    kind = spec[0]
    if kind == "memory":
        return InMemoryStreamCheckpointStore()
    if kind == "file":
        return FileStreamCheckpointStore(spec[1], read_only=reader)
    if kind == "diskcache":
        return DiskCacheStreamCheckpointStore(spec[1])
    if kind == "postgres":
        from awaken_langchain.stores.postgres import PostgresStreamCheckpointStore

        return PostgresStreamCheckpointStore(spec[1], table=spec[2], max_connections=8)
    from awaken_langchain.stores.redis import RedisStreamCheckpointStore

    return RedisStreamCheckpointStore(spec[1], prefix=spec[2])


@pytest.fixture
def store(store_spec: list[str]) -> Iterator[StreamCheckpointStore]:
    with open_store(store_spec) as opened:
        yield opened


def wrapped(server: LoopbackProvider, store: StreamCheckpointStore) -> RecoveringChatModel:
    return RecoveringChatModel(
        model=loopback_client("openai", server),
        store=store,
        retry_policy=RetryPolicy(sleep=lambda seconds: None),
    )


def merged(chunks: list[AIMessageChunk]) -> AIMessageChunk:
    message = chunks[0]
    for chunk in chunks[1:]:
        message = message + chunk
    return message


def wait_for_run(store: StreamCheckpointStore, run_id: str, after: int = 0) -> Iterator[RunEvent]:
    # a producer in a new interpreter: its imports alone took 7-9 s on a loaded machine
    deadline = time.monotonic() + 30
    while True:
        try:
            return follow(store, run_id, after=after)
        except (UnknownRunError, RunOffsetError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.002)


class Reader(threading.Thread):
    """A follower in a thread of the test process."""

    def __init__(self, store: StreamCheckpointStore, run_id: str, after: int = 0) -> None:
        super().__init__(daemon=True)
        self.store, self.run_id, self.after = store, run_id, after
        self.events: list[RunEvent] = []
        self.arrived: list[float] = []

    def run(self) -> None:
        for event in wait_for_run(self.store, self.run_id, self.after):
            self.events.append(event)
            self.arrived.append(time.monotonic())

    @property
    def text(self) -> str:
        return "".join(event.text for event in self.events)


# -- one process ------------------------------------------------------------------------


def test_a_follower_sees_one_answer_across_a_cut_with_its_final_message(
    server: LoopbackProvider, store: StreamCheckpointStore
) -> None:
    server.enqueue(
        Scenario(text=ANSWER, chunk_size=6, delay=0.002, fault=Fault.drop_after_events(30))
    )
    run_id = uuid.uuid4()
    reader = Reader(store, str(run_id))
    reader.start()
    chunks = list(wrapped(server, store).stream("Tell me", config={"run_id": run_id}))
    reader.join(10)
    message = merged(chunks)

    assert message.text == ANSWER
    assert reader.text == ANSWER  # the seam is removed for readers too: no repeated text
    assert [e.offset for e in reader.events] == list(range(1, len(reader.events) + 1))
    assert reader.events[0].type == "started"
    final = reader.events[-1]
    assert final.type == "completed"
    assert final.message() is not None
    assert final.message().text == ANSWER
    recovery = [e.data["event"] for e in reader.events if e.type == "recovery"]
    assert recovery == ["awaken_continuation"]
    assert len(server.requests) == 2


def test_reconnecting_with_the_last_offset_gives_no_gap_and_no_duplicate(
    server: LoopbackProvider, store: StreamCheckpointStore
) -> None:
    server.enqueue(Scenario(text=ANSWER, chunk_size=6, fault=Fault.drop_after_events(20)))
    run_id = str(uuid.uuid4())
    list(wrapped(server, store).stream("Tell me", config={"run_id": uuid.UUID(run_id)}))
    whole = list(follow(store, run_id))

    for after in range(len(whole)):
        again = list(follow(store, run_id, after=after))
        assert again == whole[after:]


def test_tool_calls_reach_readers_only_whole_and_marked_executable(
    server: LoopbackProvider, store: StreamCheckpointStore
) -> None:
    call = ScriptedToolCall(name="lookup", arguments={"city": "Paris", "days": 3})
    server.enqueue(Scenario(text="Let me look.", tool_calls=[call], chunk_size=3))
    run_id = str(uuid.uuid4())
    list(wrapped(server, store).stream("Weather?", config={"run_id": uuid.UUID(run_id)}))

    calls = [e.data for e in follow(store, run_id) if e.type == "tool_call"]
    assert [(c["name"], c["args"], c["executable"]) for c in calls] == [
        ("lookup", {"city": "Paris", "days": 3}, True)
    ]


def test_unknown_run_and_offset_past_the_end_are_clear_errors(
    server: LoopbackProvider, store: StreamCheckpointStore
) -> None:
    with pytest.raises(UnknownRunError, match="no run 'nobody'"):
        follow(store, "nobody")
    with pytest.raises(UnknownRunError):
        request_stop(store, "nobody")
    run_id = str(uuid.uuid4())
    list(wrapped(server, store).stream("Hi", config={"run_id": uuid.UUID(run_id)}))
    length = len(list(follow(store, run_id)))
    with pytest.raises(RunOffsetError, match=f"has {length} events"):
        follow(store, run_id, after=length + 1)
    with pytest.raises(ValueError, match="after must be an offset"):
        follow(store, run_id, after=-1)
    assert list(follow(store, run_id, after=length)) == []  # the end: nothing after it


def test_stop_ends_the_turn_within_the_bound_with_the_partial_as_a_stopped_turn(
    server: LoopbackProvider, store: StreamCheckpointStore
) -> None:
    server.enqueue(Scenario(text=ANSWER * 4, chunk_size=4, delay=0.01))  # about 9 s uncut
    run_id = uuid.uuid4()
    reader = Reader(store, str(run_id))
    reader.start()
    chunks: list[AIMessageChunk] = []
    asked = 0.0
    for chunk in wrapped(server, store).stream("Tell me", config={"run_id": run_id}):
        chunks.append(chunk)
        if len(chunks) == 20:
            asked = time.monotonic()
            request_stop(store, str(run_id))
    ended = time.monotonic()
    reader.join(10)
    message = merged(chunks)

    assert ended - asked <= 1.0
    assert message.response_metadata["awaken"]["stopped"] is True
    assert 0 < len(message.text) < len(ANSWER)
    assert reader.events[-1].type == "stopped"
    assert reader.text == message.text
    assert reader.events[-1].message().text == message.text  # type: ignore[union-attr]
    assert store.get(str(run_id)) is None  # committed like a finished turn: nothing to resume


def test_a_tool_call_cut_by_a_stop_never_runs(
    server: LoopbackProvider, store: StreamCheckpointStore
) -> None:
    call = ScriptedToolCall(name="refund", arguments={"order": "A-1", "note": "x" * 200})
    server.enqueue(Scenario(text="On it.", tool_calls=[call], chunk_size=2, delay=0.01))
    run_id = uuid.uuid4()
    chunks: list[AIMessageChunk] = []
    for chunk in wrapped(server, store).stream("Refund", config={"run_id": run_id}):
        chunks.append(chunk)
        if "".join(c.text for c in chunks) == "On it." and chunks[-1].text:  # args stream now
            threading.Timer(0.3, request_stop, (store, str(run_id))).start()
    message = merged(chunks)

    assert message.tool_calls == []
    assert [c["name"] for c in message.invalid_tool_calls] == ["refund"]
    assert message.response_metadata["awaken"]["stopped"] is True
    final = list(follow(store, str(run_id)))[-1]
    assert final.type == "stopped"
    assert final.message().tool_calls == []  # type: ignore[union-attr]


def test_stopping_a_finished_run_does_nothing(
    server: LoopbackProvider, store: StreamCheckpointStore
) -> None:
    run_id = str(uuid.uuid4())
    list(wrapped(server, store).stream("Hi", config={"run_id": uuid.UUID(run_id)}))
    request_stop(store, run_id)
    assert list(follow(store, run_id))[-1].type == "completed"


def test_async_follow_and_stop(server: LoopbackProvider, store: StreamCheckpointStore) -> None:
    server.enqueue(Scenario(text=ANSWER * 4, chunk_size=4, delay=0.01))
    run_id = uuid.uuid4()

    async def main() -> tuple[list[AIMessageChunk], list[RunEvent]]:
        async def read() -> list[RunEvent]:
            while True:
                try:
                    return [event async for event in afollow(store, str(run_id))]
                except UnknownRunError:
                    await asyncio.sleep(0.005)

        reading = asyncio.create_task(read())
        chunks = []
        async for chunk in wrapped(server, store).astream("Tell me", config={"run_id": run_id}):
            chunks.append(chunk)
            if len(chunks) == 20:
                await arequest_stop(store, str(run_id))
        return chunks, await asyncio.wait_for(reading, 10)

    chunks, events = asyncio.run(main())
    message = merged(chunks)
    assert message.response_metadata["awaken"]["stopped"] is True
    assert events[-1].type == "stopped"
    assert "".join(e.text for e in events) == message.text


@pytest.mark.parametrize("kind", ["memory", "file", "redis"])
def test_async_followers_waiting_for_events_hold_no_worker_thread(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    spec = (
        ["redis", request.getfixturevalue("redis_server").url, unique_prefix()]
        if kind == "redis"
        else [kind, str(tmp_path / "store")]
    )
    with open_store(spec) as store:
        log = _runlog.run_log(store)
        run_id = str(uuid.uuid4())
        log.append(run_id, [_runlog.encode_event("started", {"pid": 1})])

        async def main() -> tuple[float, list[list[str]]]:
            async def read() -> list[str]:
                return [event.type async for event in afollow(store, run_id)]

            readers = [asyncio.create_task(read()) for _ in range(64)]
            await asyncio.sleep(0.3)  # every reader waits for the run's next event
            started = time.monotonic()
            await asyncio.to_thread(lambda: None)  # the loop's worker threads are free
            waited = time.monotonic() - started
            await asyncio.to_thread(log.append, run_id, [_runlog.encode_event("completed", {})])
            return waited, await asyncio.wait_for(asyncio.gather(*readers), 30)

        waited, seen = asyncio.run(main())

    assert seen == [["started", "completed"]] * 64
    assert waited < 0.5


def test_an_async_in_process_turn_ends_with_its_final_event_while_the_loops_workers_are_busy(
    server: LoopbackProvider,
) -> None:
    """The in-process log is written on the loop: a turn's end waits for no worker thread."""
    store = InMemoryStreamCheckpointStore()
    run_id = uuid.uuid4()

    async def main() -> tuple[list[AIMessageChunk], list[RunEvent]]:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(max_workers=1))
        stream = wrapped(server, store).astream("Tell me", config={"run_id": run_id})
        chunks = [await anext(stream)]  # connected: the SDK needs no worker from here on
        released = threading.Event()
        busy = loop.run_in_executor(None, released.wait)  # the only worker is taken
        try:
            chunks += await asyncio.wait_for(_collected(stream), 10)
            events = list(follow(store, str(run_id)))
        finally:
            released.set()
            await busy
        return chunks, events

    chunks, events = asyncio.run(main())
    assert merged(chunks).text == ANSWER
    assert events[-1].type == "completed"
    assert "".join(e.text for e in events) == ANSWER


async def _collected(stream: AsyncIterator[AIMessageChunk]) -> list[AIMessageChunk]:
    return [chunk async for chunk in stream]


def test_a_run_nobody_follows_is_published_only_at_the_checkpoint_cadence(
    server: LoopbackProvider, store: StreamCheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = _runlog.run_log(store)
    appends: list[int] = []
    original = log.append

    def counting(run_id: str, events: Any) -> int:
        appends.append(len(events))
        return original(run_id, events)

    monkeypatch.setattr(log, "append", counting)
    server.enqueue(Scenario(text=ANSWER, chunk_size=2, delay=0.002))  # about 0.8 s
    run_id = uuid.uuid4()
    started = time.monotonic()
    list(wrapped(server, store).stream("Tell me", config={"run_id": run_id}))
    quiet = len(appends)
    seconds = time.monotonic() - started
    assert quiet <= seconds / _runlog.QUIET_EVERY + 3

    appends.clear()
    server.enqueue(Scenario(text=ANSWER, chunk_size=2, delay=0.002))
    run_id = uuid.uuid4()
    reader = Reader(store, str(run_id))
    reader.start()
    list(wrapped(server, store).stream("Tell me", config={"run_id": run_id}))
    reader.join(10)
    assert reader.text == ANSWER
    assert len(appends) > 2 * quiet  # followed: published in small steps


# -- several processes --------------------------------------------------------------------


@functools.cache
def _fork_server() -> ForkServerContext:
    return fork_server("tests.readers_child")


class Child:
    """A process of ``tests.readers_child``, forked from a server that imported it once."""

    def __init__(self, args: list[str]) -> None:
        self.process = _fork_server().Process(target=readers_child.main, args=(args,), daemon=True)
        self.process.start()

    def wait(self, timeout: float | None = None) -> int | None:
        """Its exit code once it has ended, or None if it still runs after ``timeout``."""
        self.process.join(timeout)
        return self.process.exitcode

    def kill(self) -> None:
        """SIGKILL, as a crash would end it (nothing if it has ended)."""
        if self.process.exitcode is None:
            self.process.kill()


def child(*args: str) -> Child:
    return Child(list(args))


@pytest.fixture
def shared_spec(store_spec: list[str]) -> list[str]:
    if store_spec[0] == "memory":
        pytest.skip("an in-process store is not shared between processes")
    if store_spec[0] not in ("redis", "postgres"):  # the producer creates the store
        open_store(store_spec).close()
    return store_spec


def test_followers_in_other_processes_each_read_the_committed_answer(
    server: LoopbackProvider, shared_spec: list[str], tmp_path: Path
) -> None:
    long_answer = ANSWER * 3
    server.default = continuation_responder(Scenario(text=long_answer, chunk_size=5, delay=0.003))
    server.enqueue(
        Scenario(text=long_answer, chunk_size=5, delay=0.003, fault=Fault.drop_after_events(90))
    )
    run_id = str(uuid.uuid4())
    spec = json.dumps(shared_spec)
    produced = tmp_path / "produced.json"
    producer = child("produce", spec, server.base_url_openai, run_id, str(produced))
    followers = [
        (child("follow", spec, run_id, str(seed), str(tmp_path / f"f{seed}.json")), seed)
        for seed in range(4)
    ]
    assert producer.wait(60) == 0
    for process, _ in followers:
        assert process.wait(60) == 0

    answer = json.loads(produced.read_text())["text"]
    assert answer == long_answer
    assert len(server.requests) == 2  # the cut was continued
    for _, seed in followers:
        seen = json.loads((tmp_path / f"f{seed}.json").read_text())
        assert seen["final"] == "completed"
        assert seen["text"] == answer, f"follower {seed}"
        first = seen["first"]
        assert seen["offsets"] == list(range(first + 1, first + 1 + len(seen["offsets"])))


def test_a_stop_from_another_process_ends_the_producers_turn(
    server: LoopbackProvider, shared_spec: list[str], tmp_path: Path
) -> None:
    server.enqueue(Scenario(text=ANSWER * 8, chunk_size=4, delay=0.01))  # about 20 s uncut
    run_id = str(uuid.uuid4())
    produced = tmp_path / "produced.json"
    producer = child(
        "produce", json.dumps(shared_spec), server.base_url_openai, run_id, str(produced)
    )
    try:
        with open_store(shared_spec, reader=True) as store:
            events = wait_for_run(store, run_id)
            seen: list[RunEvent] = []
            asked = 0.0
            for event in events:
                seen.append(event)
                if event.type == "text" and not asked and len(seen) > 15:
                    asked = time.monotonic()
                    request_stop(store, run_id)
            stopped_after = time.monotonic() - asked
        assert producer.wait(30) == 0
    finally:
        producer.kill()
        producer.wait()
    result = json.loads(produced.read_text())
    assert seen[-1].type == "stopped"
    assert stopped_after <= 1.0
    assert result["stopped"] is True
    assert "".join(e.text for e in seen) == result["text"]
    assert len(result["text"]) < len(ANSWER * 8)


def test_finished_runs_logs_end(
    server: LoopbackProvider,
    store: StreamCheckpointStore,
    store_spec: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_runlog, "KEEP_FOR", 1.0)
    monkeypatch.setattr(_runlog, "SWEEP_EVERY", 0.0)
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    list(wrapped(server, store).stream("Hi", config={"run_id": uuid.UUID(first)}))
    if store_spec[0] == "redis":
        log = _runlog.run_log(store)
        assert 0 < log._redis.pttl(log._key(first, b"events")) <= 1000  # type: ignore[attr-defined]
        return
    time.sleep(1.2)
    list(wrapped(server, store).stream("Hi", config={"run_id": uuid.UUID(second)}))
    with pytest.raises(UnknownRunError):
        follow(store, first)
    assert list(follow(store, second))[-1].type == "completed"


def test_followers_in_one_process_share_one_listening_postgres_connection(
    server: LoopbackProvider, tmp_path: Path
) -> None:
    import psycopg

    dsn = shared_postgres_server().dsn
    listening = (
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
        "AND query LIKE 'LISTEN %%' AND backend_start >= %s"
    )
    server.enqueue(Scenario(text=ANSWER, chunk_size=4, delay=0.01))  # about 2 s
    run_id = str(uuid.uuid4())
    with (
        psycopg.connect(dsn, autocommit=True) as admin,
        open_store(["postgres", dsn, table_for(tmp_path / "store")]) as store,
    ):
        began = admin.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]
        for _ in range(20):  # a follower retrying until the run starts
            with pytest.raises(UnknownRunError):
                follow(store, run_id)
        after_retries = {row[0] for row in admin.execute(listening, (began,))}
        readers = [Reader(store, run_id) for _ in range(10)]
        for reader in readers:
            reader.start()
        during: set[int] = set()
        chunks: list[AIMessageChunk] = []
        for chunk in wrapped(server, store).stream("Hi", config={"run_id": run_id}):
            chunks.append(chunk)
            if len(chunks) == 120:  # about 1.2 s in: every reader follows
                assert all(reader.events for reader in readers)
                during = {row[0] for row in admin.execute(listening, (began,))}
        for reader in readers:
            reader.join(10)
    assert len(after_retries) == 1  # kept while the follower retries, not one per try
    assert during == after_retries  # ten followers, the same one connection
    assert [reader.text for reader in readers] == [merged(chunks).text] * 10


# The turn on the frozen store warns that its store stopped answering: that is the point.
@pytest.mark.filterwarnings("ignore::awaken_langchain.errors.StreamCheckpointWarning")
def test_a_frozen_store_does_not_delay_the_final_event_of_another_stores_runs(
    server: LoopbackProvider, redis_server: RedisServer, tmp_path: Path
) -> None:
    from awaken_langchain.stores.redis import RedisStreamCheckpointStore

    frozen = RedisServer(tmp_path / "frozen")
    frozen.start()
    assert frozen.process is not None
    sick = RedisStreamCheckpointStore(frozen.url, prefix=unique_prefix())
    healthy = RedisStreamCheckpointStore(redis_server.url, prefix=unique_prefix())
    server.enqueue(Scenario(text=ANSWER, chunk_size=4, delay=0.01))  # about 2 s
    sick_run = str(uuid.uuid4())
    sick_turn = threading.Thread(
        target=lambda: list(wrapped(server, sick).stream("Hi", config={"run_id": sick_run})),
        daemon=True,
    )
    try:
        sick_turn.start()
        first = next(iter(wait_for_run(sick, sick_run)))  # its publisher is at work
        assert first.type == "started"
        frozen.process.send_signal(signal.SIGSTOP)
        time.sleep(2 * _runlog.CHECK_EVERY)  # its next store call waits out the socket timeout

        run_id = str(uuid.uuid4())
        reader = Reader(healthy, run_id)
        reader.start()
        started = time.monotonic()
        chunks = list(wrapped(server, healthy).stream("Hi", config={"run_id": run_id}))
        returned = time.monotonic()
        reader.join(10)
    finally:
        frozen.process.send_signal(signal.SIGCONT)
        sick_turn.join(30)
        sick.close()
        healthy.close()
        frozen.stop()
    # one shared publisher waited out the frozen server's 5 s socket timeout on every call
    assert [e.type for e in reader.events[-1:]] == ["completed"]
    assert reader.text == merged(chunks).text == ANSWER
    assert returned - started < 2.5
    assert reader.arrived[-1] - returned < 1.0, "the final event came after the turn returned"


def test_followers_of_a_producer_killed_mid_answer_read_the_replacements_answer_once(
    server: LoopbackProvider, shared_spec: list[str], tmp_path: Path
) -> None:
    answer = ANSWER * 2
    # The first producer gets 53 events, then the provider stalls: the log (followed, live)
    # holds text its last checkpoint (every 8 chunks) does not; then it is killed.
    server.enqueue(
        Scenario(text=answer, chunk_size=5, delay=0.002, fault=Fault.stall(120, after_events=53))
    )
    server.default = continuation_responder(Scenario(text=answer, chunk_size=5, delay=0.002))
    run_id = str(uuid.uuid4())
    spec = json.dumps(shared_spec)
    url = server.base_url_openai
    producer = child("produce", spec, url, run_id, str(tmp_path / "killed.json"))
    with open_store(shared_spec, reader=True) as store:
        watching = Reader(store, run_id)  # attached before the kill
        watching.start()
        log = _runlog.run_log(store)
        published, deadline = 0, time.monotonic() + 60
        while time.monotonic() < deadline:  # until the stalled producer published it all
            time.sleep(0.3)
            now = _runlog.published_text(log, run_id)
            if now and now == published and store.get(run_id) is not None:
                break  # and its checkpoints are in the store
            published = now
        producer.kill()
        producer.wait()
        late = child("follow", spec, run_id, "2", str(tmp_path / "late.json"))
        replacement = child("produce", spec, url, run_id, str(tmp_path / "produced.json"))
        try:
            assert replacement.wait(60) == 0
            assert late.wait(60) == 0
        finally:
            for process in (replacement, late):
                process.kill()
                process.wait()
        watching.join(10)

    final = json.loads((tmp_path / "produced.json").read_text())["text"]
    assert final == answer
    assert 0 < published < len(answer)
    assert len(server.requests) == 2  # the replacement continued from the checkpoint
    assert watching.events[-1].type == "completed"
    assert watching.text == final  # the stretch past the checkpoint is not shown twice
    assert [e.offset for e in watching.events] == list(range(1, len(watching.events) + 1))
    late_seen = json.loads((tmp_path / "late.json").read_text())  # attached after the kill,
    assert (late_seen["final"], late_seen["text"]) == ("completed", final)  # reconnecting


def test_a_producer_fenced_out_by_a_replacement_stops_writing_the_runs_log(
    server: LoopbackProvider, shared_spec: list[str], tmp_path: Path
) -> None:
    if shared_spec[0] != "file":
        pytest.skip("the turn's fencing is the same on every store: one is enough")
    server.enqueue(Scenario(text=ANSWER, chunk_size=4, delay=0.01))  # about 2 s
    server.default = continuation_responder(Scenario(text=ANSWER, chunk_size=4, delay=0.01))
    run_id = str(uuid.uuid4())
    spec = json.dumps(shared_spec)
    first = child("produce", spec, server.base_url_openai, run_id, str(tmp_path / "old.json"))
    try:
        with open_store(shared_spec) as store:
            log = _runlog.run_log(store)
            deadline = time.monotonic() + 30
            while _runlog.published_text(log, run_id) < 100 and time.monotonic() < deadline:
                time.sleep(0.01)
            # this process resumes the run from its checkpoint while the first still streams
            config: Any = {"run_id": uuid.UUID(run_id)}
            new = merged(list(wrapped(server, store).stream("Tell me a long story", config=config)))
            assert first.wait(30) == 0
            events = list(_runlog.iter_events(log.read(run_id, 0) or []))
    finally:
        first.kill()
        first.wait()

    assert new.text == ANSWER
    assert len(server.requests) == 2
    finals = [event for event in events if event["type"] in _runlog.FINAL_TYPES]
    assert len(finals) == 1, [e["type"] for e in events]  # none from the fenced-out turn
    assert events[-1] is finals[0]
    assert finals[0]["data"]["message"]["data"]["content"] == new.text


def test_a_run_nobody_follows_notices_a_stop_at_its_next_checkpoint(
    server: LoopbackProvider, store: StreamCheckpointStore
) -> None:
    server.enqueue(Scenario(text=ANSWER * 4, chunk_size=4, delay=0.01))  # about 8 s uncut
    run_id = uuid.uuid4()
    chunks: list[AIMessageChunk] = []
    asked = 0.0
    for chunk in wrapped(server, store).stream("Tell me", config={"run_id": run_id}):
        chunks.append(chunk)
        if len(chunks) == 30:  # the log exists: the first checkpoint published it
            asked = time.monotonic()
            request_stop(store, str(run_id))
    stopped_after = time.monotonic() - asked
    message = merged(chunks)
    assert message.response_metadata["awaken"]["stopped"] is True
    # the quiet round rides on checkpoints (every 0.25 s at most), plus a chunk's gap
    assert stopped_after <= _runlog.QUIET_EVERY + 0.5
    assert len(message.text) < len(ANSWER * 4)
    assert list(follow(store, str(run_id)))[-1].type == "stopped"
