"""What `follow` returns: closing it detaches the follower, read or not.

A follower counts as attached while it waits on the store: in-process by a
count of followers, on Redis by its subscription to the run's channel (the
file stores mark a run followed for 2 s after a read, and are left out).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from awaken_langchain import InMemoryStreamCheckpointStore, StreamCheckpointStore, follow
from awaken_langchain._runlog import run_log
from tests.redis_server import RedisServer, unique_prefix


def event(kind: str, **data: str) -> bytes:
    return json.dumps({"type": kind, "data": data}).encode()


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest) -> Iterator[StreamCheckpointStore]:
    if request.param == "memory":
        yield InMemoryStreamCheckpointStore()
        return
    from awaken_langchain.stores.redis import RedisStreamCheckpointStore

    redis_server: RedisServer = request.getfixturevalue("redis_server")
    with RedisStreamCheckpointStore(redis_server.url, prefix=unique_prefix()) as opened:
        yield opened


def test_closing_a_follow_before_its_first_event_leaves_the_run_unfollowed(
    store: StreamCheckpointStore,
) -> None:
    log = run_log(store)
    log.append("run-1", [event("started"), event("text", text="Hello")])

    events = follow(store, "run-1")
    assert log.followed("run-1")  # the producer publishes at the followers' pace
    events.close()  # type: ignore[attr-defined]
    assert not log.followed("run-1")  # ... and at the checkpoints' pace again

    events = follow(store, "run-1")
    assert next(events).type == "started"
    events.close()  # type: ignore[attr-defined]
    assert not log.followed("run-1")
