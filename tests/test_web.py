"""The reader routes (``awaken_langchain.web``) served by Starlette, called with httpx."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from awaken_langchain import InMemoryStreamCheckpointStore, RecoveringChatModel, RetryPolicy
from awaken_langchain._runlog import encode_event, run_log
from awaken_langchain.testing import Fault, LoopbackProvider, Scenario, continuation_responder
from awaken_langchain.web import reader_app
from tests.conftest import loopback_client

ANSWER = " ".join(
    f"Part {n} of an answer a browser reads over Server-Sent Events." for n in range(6)
)


@pytest.fixture
def server(shared_server: LoopbackProvider) -> LoopbackProvider:
    shared_server.reset()
    shared_server.default = continuation_responder(Scenario(text=ANSWER, chunk_size=6))
    return shared_server


@pytest.fixture
def store() -> InMemoryStreamCheckpointStore:
    return InMemoryStreamCheckpointStore()


def produce(
    server: LoopbackProvider, store: InMemoryStreamCheckpointStore, run_id: uuid.UUID
) -> Any:
    model = RecoveringChatModel(
        model=loopback_client("openai", server),
        store=store,
        retry_policy=RetryPolicy(sleep=lambda seconds: None),
    )
    return model.invoke("Tell me", config={"run_id": run_id})


def parse_sse(body: str) -> list[dict[str, Any]]:
    events = []
    for block in body.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            name, _, value = line.partition(": ")
            fields[name] = value
        if "id" in fields:
            events.append(
                {
                    "id": int(fields["id"]),
                    "event": fields["event"],
                    "data": json.loads(fields["data"]),
                }
            )
    return events


def get(store: InMemoryStreamCheckpointStore, path: str, **kwargs: Any) -> httpx.Response:
    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=reader_app(store))
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
            return await client.request(kwargs.pop("method", "GET"), path, **kwargs)

    return asyncio.run(call())


def test_events_are_served_with_their_offsets_as_ids_and_reconnect_by_last_event_id(
    server: LoopbackProvider, store: InMemoryStreamCheckpointStore
) -> None:
    server.enqueue(Scenario(text=ANSWER, chunk_size=6, fault=Fault.drop_after_events(12)))
    run_id = uuid.uuid4()
    message = produce(server, store, run_id)

    response = get(store, f"/runs/{run_id}/events")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.text.startswith("retry: ")
    events = parse_sse(response.text)
    assert [e["id"] for e in events] == list(range(1, len(events) + 1))
    assert "".join(e["data"]["text"] for e in events if e["event"] == "text") == message.text
    assert events[-1]["event"] == "completed"

    for last in (1, 5, len(events) - 1):
        again = parse_sse(
            get(store, f"/runs/{run_id}/events", headers={"Last-Event-ID": str(last)}).text
        )
        assert again == events[last:]
    assert parse_sse(get(store, f"/runs/{run_id}/events?after=3").text) == events[3:]


def test_a_follower_over_http_reads_a_run_as_it_is_written(
    server: LoopbackProvider, store: InMemoryStreamCheckpointStore
) -> None:
    server.enqueue(Scenario(text=ANSWER, chunk_size=6, delay=0.005))
    run_id = uuid.uuid4()
    producer = threading.Thread(target=produce, args=(server, store, run_id))
    producer.start()
    deadline = time.monotonic() + 10
    while (response := get(store, f"/runs/{run_id}/events")).status_code == 404:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    producer.join()
    events = parse_sse(response.text)
    assert "".join(e["data"]["text"] for e in events if e["event"] == "text") == ANSWER


def test_bad_requests_get_clear_answers_not_crashes(
    server: LoopbackProvider, store: InMemoryStreamCheckpointStore
) -> None:
    run_id = uuid.uuid4()
    produce(server, store, run_id)

    unknown = get(store, "/runs/nobody/events")
    assert unknown.status_code == 404
    assert "no run 'nobody'" in unknown.json()["error"]
    for bad in ("abc", "-1", "1.5", "", "9" * 40):
        answer = get(store, f"/runs/{run_id}/events", headers={"Last-Event-ID": bad})
        assert answer.status_code == 400, bad
    past = get(store, f"/runs/{run_id}/events", headers={"Last-Event-ID": "100000"})
    assert past.status_code == 400
    assert "cannot follow it after offset 100000" in past.json()["error"]
    assert get(store, "/runs/nobody/stop", method="POST").status_code == 404
    assert get(store, f"/runs/{run_id}/events", method="POST").status_code == 405


def test_post_stop_ends_a_running_turn_and_its_stream_says_stopped(
    server: LoopbackProvider, store: InMemoryStreamCheckpointStore
) -> None:
    server.enqueue(Scenario(text=ANSWER * 10, chunk_size=4, delay=0.01))  # about 8 s uncut
    run_id = uuid.uuid4()
    result: list[Any] = []
    producer = threading.Thread(target=lambda: result.append(produce(server, store, run_id)))
    producer.start()
    deadline = time.monotonic() + 10
    while get(store, f"/runs/{run_id}/stop", method="POST").status_code == 404:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    producer.join(5)
    assert not producer.is_alive()
    assert result[0].response_metadata["awaken"]["stopped"] is True
    events = parse_sse(get(store, f"/runs/{run_id}/events").text)
    assert events[-1]["event"] == "stopped"
    assert "".join(e["data"]["text"] for e in events if e["event"] == "text") == result[0].text


def test_a_silent_stream_sends_keep_alive_comments_that_readers_ignore(
    server: LoopbackProvider, store: InMemoryStreamCheckpointStore
) -> None:
    # the provider stalls 0.4 s mid-answer: the stream says nothing for that long
    server.enqueue(Scenario(text=ANSWER, chunk_size=6, fault=Fault.stall(0.4, after_events=5)))
    run_id = uuid.uuid4()
    producer = threading.Thread(target=produce, args=(server, store, run_id))
    producer.start()
    app = reader_app(store, keepalive=0.05)

    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
            for _ in range(2000):  # until the producer has written the run's first event
                response = await client.get(f"/runs/{run_id}/events")
                if response.status_code != 404:
                    return response
                await asyncio.sleep(0.005)
            raise AssertionError("the run never started")

    response = asyncio.run(call())
    producer.join()
    assert response.text.count(": keep-alive\n\n") >= 3
    events = parse_sse(response.text)
    assert [e["id"] for e in events] == list(range(1, len(events) + 1))
    assert "".join(e["data"]["text"] for e in events if e["event"] == "text") == ANSWER
    with pytest.raises(ValueError, match="keepalive"):
        reader_app(store, keepalive=0)


@contextlib.contextmanager
def served(app: Any) -> Iterator[int]:
    """``app`` served by uvicorn on a free loopback port, in a thread."""
    import uvicorn

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive()
        assert time.monotonic() < deadline
        time.sleep(0.01)
    try:
        yield int(listener.getsockname()[1])
    finally:
        server.should_exit = True
        thread.join(10)
        listener.close()


def open_stream(port: int, run_id: str) -> tuple[socket.socket, float]:
    """A client of ``GET /runs/{run_id}/events`` that got its first event, and how long it took."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    start = time.perf_counter()
    sock.sendall(f"GET /runs/{run_id}/events HTTP/1.1\r\nHost: app\r\n\r\n".encode())
    seen = b""
    while b"\nid: " not in seen:
        data = sock.recv(65536)
        assert data, seen
        seen += data
    return sock, time.perf_counter() - start


def first_event(port: int, run_id: str) -> float:
    """Seconds from a new client's request to its first event (it then hangs up)."""
    sock, seconds = open_stream(port, run_id)
    sock.close()
    return seconds


def test_a_reconnect_gets_its_first_event_at_once_while_many_streams_wait_or_just_dropped(
    store: InMemoryStreamCheckpointStore,
) -> None:
    # a run still answering: its readers wait for its next events
    run_id = str(uuid.uuid4())
    run_log(store).append(
        run_id, [encode_event("started", {"pid": 1}), encode_event("text", {"text": "Hi"})]
    )
    with served(reader_app(store)) as port:
        opened: list[socket.socket] = []
        clients = [
            threading.Thread(target=lambda: opened.append(open_stream(port, run_id)[0]))
            for _ in range(64)
        ]
        for client in clients:
            client.start()
        for client in clients:
            client.join(60)
        assert len(opened) == 64
        waited = [first_event(port, run_id)]  # 64 streams wait for the run's next event
        for sock in opened:  # tabs closed mid-answer: every client drops its stream
            sock.close()
        waited += [first_event(port, run_id) for _ in range(3)]

    # a waiting or dropped stream holds no worker thread: a reader rejoins at once
    assert max(waited) < 0.5
