"""A process's followers of a run share one reader of the run's log.

Redis: one subscription, and the events as published (against a private
``redis-server``: its command counts are this test's alone). Local stores: one
thread reads the run's file for them all (its opens counted by an audit hook).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from awaken_langchain import FileStreamCheckpointStore, follow
from awaken_langchain._runlog import DEFAULT_POLL_INTERVAL, encode_event, run_log
from awaken_langchain.stores.redis import RedisStreamCheckpointStore
from tests.conftest import REPO_ROOT
from tests.redis_server import RedisServer, unique_prefix

FOLLOWERS = 20
APPENDS = 20


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RedisStreamCheckpointStore]:
    server = RedisServer(tmp_path)
    server.start()
    try:
        with RedisStreamCheckpointStore(server.url, prefix=unique_prefix()) as store:
            yield store
    finally:
        server.stop()


def read_in_threads(followers: Iterable[Iterator[Any]]) -> tuple[list[threading.Thread], list[str]]:
    """Read each follower's events to the end on a thread of its own; started threads, texts."""
    texts: list[str] = []
    lock = threading.Lock()

    def read(events: Iterator[Any]) -> None:
        text = "".join(event.text for event in events)
        with lock:
            texts.append(text)

    threads = [threading.Thread(target=read, args=(events,)) for events in followers]
    for thread in threads:
        thread.start()
    return threads, texts


def lrange_calls(store: RedisStreamCheckpointStore) -> int:
    stats = store._client().client.info("commandstats")
    return int(stats.get("cmdstat_lrange", {}).get("calls", 0))


def test_a_processs_followers_of_a_redis_run_share_one_subscription_and_no_read_per_append(
    store: RedisStreamCheckpointStore,
) -> None:
    log = run_log(store)
    run_id = str(uuid.uuid4())
    log.append(run_id, [encode_event("started", {"pid": 1})])
    threads, texts = read_in_threads(follow(store, run_id) for _ in range(FOLLOWERS))
    channel = log._key(run_id, b"events")  # type: ignore[attr-defined]
    subscribers = store._client().client.pubsub_numsub(channel)[0][1]
    before = lrange_calls(store)
    for n in range(APPENDS):
        log.append(run_id, [encode_event("text", {"text": f"{n},"})])
        time.sleep(0.005)
    log.append(run_id, [encode_event("completed", {})])
    for thread in threads:
        thread.join(10)

    assert texts == ["".join(f"{n}," for n in range(APPENDS))] * FOLLOWERS
    assert subscribers == 1  # one connection for the process's followers, not one each
    assert lrange_calls(store) - before < FOLLOWERS  # not a read per follower per append


def test_a_bare_length_published_by_an_older_producer_still_wakes_followers(
    store: RedisStreamCheckpointStore,
) -> None:
    log = run_log(store)
    run_id = str(uuid.uuid4())
    log.append(run_id, [encode_event("started", {"pid": 1})])
    events = follow(store, run_id)
    assert next(events).type == "started"
    redis = store._client().client
    key = log._key(run_id, b"events")  # type: ignore[attr-defined]
    for event in (encode_event("text", {"text": "Hi"}), encode_event("completed", {})):
        redis.publish(key, redis.rpush(key, event))  # what an older version publishes

    started = time.monotonic()
    assert [(event.offset, event.type, event.text) for event in events] == [
        (2, "text", "Hi"),
        (3, "completed", ""),
    ]
    assert time.monotonic() - started < 0.5  # woken, not a wait step's timeout


def follow_and_count_file_reads(directory: str) -> None:
    """In a child process (the audit hook stays there): print opens of the run's file and polls.

    20 followers of a file-store run read 20 appends; every open of the run's
    file for reading meanwhile is counted.
    """
    opened: list[str] = []
    counting = threading.Event()

    def count(event: str, args: tuple[object, ...]) -> None:
        if (
            event == "open"
            and counting.is_set()
            and str(args[0]).endswith(".log")
            and isinstance(args[2], int)
            and not args[2] & (os.O_WRONLY | os.O_RDWR)
        ):
            opened.append(str(args[0]))

    sys.addaudithook(count)
    store = FileStreamCheckpointStore(directory)
    log = run_log(store)
    run_id = str(uuid.uuid4())
    log.append(run_id, [encode_event("started", {"pid": 1})])
    threads, texts = read_in_threads(follow(store, run_id) for _ in range(FOLLOWERS))
    counting.set()
    started = time.monotonic()
    for n in range(APPENDS):
        log.append(run_id, [encode_event("text", {"text": f"{n},"})])
        time.sleep(0.01)
    log.append(run_id, [encode_event("completed", {})])
    for thread in threads:
        thread.join(10)
    counting.clear()
    polls = (time.monotonic() - started) / DEFAULT_POLL_INTERVAL
    expected = "".join(f"{n}," for n in range(APPENDS))
    print(json.dumps({"complete": texts.count(expected), "opens": len(opened), "polls": polls}))


def test_a_processs_followers_of_a_local_run_share_one_reader_of_its_file(
    tmp_path: Path,
) -> None:
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from tests.test_reader_channels import follow_and_count_file_reads; "
            "follow_and_count_file_reads(sys.argv[1])",
            str(tmp_path),
        ],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    found = json.loads(child.stdout.strip().splitlines()[-1])

    assert found["complete"] == FOLLOWERS
    # one read of the file per poll for all followers, not one per follower
    assert found["opens"] < found["polls"] + FOLLOWERS
