"""A follower closed while another thread waits on it leaves the store's connections sound.

The HTTP route closes a follower when the client goes away, while a worker
thread may still be waiting on the follower's live tail.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest

from awaken_langchain import _runlog
from awaken_langchain._runlog import encode_event, run_log
from awaken_langchain.stores.redis import RedisStreamCheckpointStore
from tests.postgres_server import postgres_store_on
from tests.redis_server import RedisServer, unique_prefix


def test_a_redis_tail_closed_during_a_wait_does_not_break_the_next_followers(
    redis_server: RedisServer,
) -> None:
    with RedisStreamCheckpointStore(redis_server.url, prefix=unique_prefix()) as store:
        log = run_log(store)
        run_id = str(uuid.uuid4())
        log.append(run_id, [encode_event("started", {"pid": 1})])
        errors: list[BaseException] = []

        def wait(tail: object) -> None:
            try:
                tail.wait(0.3)  # type: ignore[attr-defined]
            except BaseException as exc:  # what the waiting thread met
                errors.append(exc)

        for _ in range(3):
            tail = log.tail(run_id)
            waiter = threading.Thread(target=wait, args=(tail,))
            waiter.start()
            time.sleep(0.02)  # the waiter is blocked on the channel
            tail.close()  # the client went away: closed from another thread
            for _ in range(3):  # the next readers subscribe on the pool's connections
                log.tail(run_id).close()
            waiter.join(5)
            assert not waiter.is_alive()

        assert errors == []
        log.append(run_id, [encode_event("text", {"text": "hi"})])
        assert len(log.read(run_id, 0) or []) == 2


def test_a_postgres_tail_closed_during_a_wait_ends_the_wait_and_the_next_followers_are_woken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_runlog, "RENEW_EVERY", 60.0)  # a wait ends early only when woken
    with postgres_store_on(tmp_path) as store:
        log = run_log(store)
        run_id = str(uuid.uuid4())
        log.append(run_id, [encode_event("started", {"pid": 1})])
        errors: list[BaseException] = []

        def wait(tail: object) -> None:
            try:
                tail.wait(5.0)  # type: ignore[attr-defined]
            except BaseException as exc:  # what the waiting thread met
                errors.append(exc)

        tail = log.tail(run_id)
        tail.wait(0.0)  # marks the run as followed, as a follower's first wait does
        waiter = threading.Thread(target=wait, args=(tail,))
        waiter.start()
        time.sleep(0.05)  # the waiter is waiting for a notification
        closed = time.monotonic()
        tail.close()  # the client went away: closed from another thread
        waiter.join(5)
        assert not waiter.is_alive()
        assert time.monotonic() - closed < 2.5  # not at the end of its wait
        assert errors == []

        woken: list[float] = []
        nxt = log.tail(run_id)
        nxt.wait(0.0)
        listener = threading.Thread(target=lambda: (nxt.wait(5.0), woken.append(time.monotonic())))
        listener.start()
        time.sleep(0.05)
        appended = time.monotonic()
        log.append(run_id, [encode_event("text", {"text": "hi"})])
        listener.join(5)
        nxt.close()
        assert woken
        assert woken[0] - appended < 2.5  # woken by the append, not at the end of its wait
        assert len(log.read(run_id, 0) or []) == 2
