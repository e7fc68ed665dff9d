"""A follower closed while another thread waits on it leaves the store's connections sound.

The HTTP route closes a follower when the client goes away, while a worker
thread may still be waiting on the follower's live tail.
"""

from __future__ import annotations

import threading
import time
import uuid

from awaken_langchain._runlog import encode_event, run_log
from awaken_langchain.stores.redis import RedisStreamCheckpointStore
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
