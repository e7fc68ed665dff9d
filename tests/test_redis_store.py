"""Redis-specific behaviour of RedisStreamCheckpointStore, against a real redis-server.

The contract itself (fencing, TTL, deltas, bad input) is checked for every store
by tests/test_store_conformance.py; this file covers what only Redis has: key
layout, server-side expiry, a server that dies, authentication, and fencing
between several processes racing on the same runs.
"""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import os
import signal
import subprocess
import sys
import time
import uuid
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from awaken_langchain.checkpoint import StreamCheckpoint
from awaken_langchain.errors import StreamCheckpointError, StreamCheckpointFencedError
from awaken_langchain.stores._base import Head
from awaken_langchain.stores.redis import RedisStreamCheckpointStore
from tests.conftest import FakeClock
from tests.redis_server import RedisServer, free_port, redis_server_binary, unique_prefix

REPO_ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.redis


@pytest.fixture
def raw(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url)
    yield client
    client.close()


@pytest.fixture
def store(redis_server: RedisServer) -> Iterator[RedisStreamCheckpointStore]:
    with RedisStreamCheckpointStore(redis_server.url, prefix=unique_prefix()) as store:
        yield store


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A server this test may kill and restart."""
    server = RedisServer(tmp_path / "redis", appendonly=True)
    server.start()
    yield server
    server.stop()


def checkpoint(run_id: str = "run-1", text: str = "", epoch: int = 0) -> StreamCheckpoint:
    return StreamCheckpoint(run_id=run_id, partial_text=text, epoch=epoch, model="m")


# -- key layout ------------------------------------------------------------------


def test_every_key_lives_under_the_prefix(
    store: RedisStreamCheckpointStore, raw: redis.Redis
) -> None:
    store.put(checkpoint("run-1", "hello"))
    epoch = store.claim("run-2")
    store.put(checkpoint("run-2", "world", epoch=epoch))

    keys = sorted(raw.scan_iter(match=f"{store.prefix}*"))
    expected = [f"{store.prefix}:{{run-2}}:epoch"] + [
        f"{store.prefix}:{{{run}}}:{part}"
        for run in ("run-1", "run-2")
        for part in ("head", "text")
    ]
    assert keys == sorted(key.encode() for key in expected)


def test_stores_with_different_prefixes_do_not_see_each_other(
    redis_server: RedisServer,
) -> None:
    with (
        RedisStreamCheckpointStore(redis_server.url, prefix=unique_prefix()) as first,
        RedisStreamCheckpointStore(redis_server.url, prefix=unique_prefix()) as second,
    ):
        first.put(checkpoint("shared", "mine"))
        assert second.get("shared") is None
        assert second.list_run_ids() == []
        mine = first.claim("shared")
        theirs = second.claim("shared")
        first.put(checkpoint("shared", "mine, fenced", epoch=mine))  # their claim fenced nothing
        second.put(checkpoint("shared", "theirs", epoch=theirs))


def test_run_ids_with_pattern_and_brace_characters_are_listed_exactly(
    store: RedisStreamCheckpointStore,
) -> None:
    run_ids = ["a*b", "x}:head", "{tag}", "q?[z]\\", "ü-日本", "../../etc"]
    for run_id in run_ids:
        store.put(checkpoint(run_id, run_id))

    assert store.list_run_ids() == sorted(run_ids)
    for run_id in run_ids:
        found = store.get(run_id)
        assert found is not None
        assert found.partial_text == run_id


def test_prefix_is_escaped_when_listing(redis_server: RedisServer) -> None:
    base = unique_prefix()
    with (
        RedisStreamCheckpointStore(redis_server.url, prefix=f"{base}*") as star,
        RedisStreamCheckpointStore(redis_server.url, prefix=f"{base}x") as plain,
    ):
        plain.put(checkpoint("other"))
        star.put(checkpoint("mine"))
        assert star.list_run_ids() == ["mine"]


def test_prefix_with_braces_is_rejected(redis_server: RedisServer) -> None:
    with pytest.raises(ValueError, match="prefix"):
        RedisStreamCheckpointStore(redis_server.url, prefix="a{b}")


def test_a_connection_is_required() -> None:
    with pytest.raises(ValueError, match="url="):
        RedisStreamCheckpointStore()


def test_url_and_clients_together_are_rejected(redis_server: RedisServer) -> None:
    client = redis.Redis.from_url(redis_server.url)
    with pytest.raises(ValueError, match="not both"):
        RedisStreamCheckpointStore(redis_server.url, client=client)
    client.close()


# -- expiry ----------------------------------------------------------------------


def test_ttl_is_set_as_redis_expiry_and_the_epoch_counter_outlives_it_by_the_grace(
    redis_server: RedisServer, raw: redis.Redis
) -> None:
    with RedisStreamCheckpointStore(
        redis_server.url, prefix=unique_prefix(), ttl=30, epoch_grace=600
    ) as store:
        epoch = store.claim("run-1")
        head, text, counter = (f"{store.prefix}:{{run-1}}:{p}" for p in ("head", "text", "epoch"))
        assert 595_000 < raw.pttl(counter) <= 600_000  # claimed, no checkpoint yet
        store.put(checkpoint("run-1", "text", epoch=epoch))
        assert 0 < raw.pttl(head) <= 30_000
        assert 0 < raw.pttl(text) <= 30_000
        assert 625_000 < raw.pttl(counter) <= 630_000  # the checkpoint's ttl, then the grace
        store.delete("run-1", epoch=epoch)
        assert 595_000 < raw.pttl(counter) <= 600_000


def test_without_ttl_the_epoch_counter_lives_as_long_as_the_checkpoint(
    store: RedisStreamCheckpointStore, raw: redis.Redis
) -> None:
    counter = f"{store.prefix}:{{run-1}}:epoch"
    epoch = store.claim("run-1")
    store.put(checkpoint("run-1", "text", epoch=epoch))
    assert raw.pttl(counter) == -1
    store.delete("run-1", epoch=epoch)
    assert 0 < raw.pttl(counter) <= store.epoch_grace * 1000


def test_a_counter_ahead_of_the_clock_lives_until_the_clock_has_passed_it(
    redis_server: RedisServer, raw: redis.Redis
) -> None:
    clock = FakeClock()
    with RedisStreamCheckpointStore(
        redis_server.url, prefix=unique_prefix(), clock=clock, epoch_grace=10
    ) as store:
        counter = f"{store.prefix}:{{run-1}}:epoch"
        for _ in range(5000):  # many claims within one millisecond of the store's clock
            epoch = store.claim("run-1")
        assert epoch == clock.now * 1000 + 4999
        assert 14_900 < raw.pttl(counter) <= 14_999  # 4999 ms ahead, then the 10 s grace


def test_gc_gives_counters_of_an_older_release_an_expiry(
    store: RedisStreamCheckpointStore, raw: redis.Redis
) -> None:
    counter = f"{store.prefix}:{{run-1}}:epoch"
    raw.set(counter, 7)  # written by INCR, never expiring
    raw.set(f"{store.prefix}:{{run-2}}:epoch", 3)
    store.put(checkpoint("run-2", "a checkpoint of the run keeps its counter", epoch=3))
    raw.persist(f"{store.prefix}:{{run-2}}:epoch")
    store.gc()
    assert 0 < raw.pttl(counter) <= store.epoch_grace * 1000
    assert raw.pttl(f"{store.prefix}:{{run-2}}:epoch") == -1
    assert store.claim("run-1") > 7


def test_without_ttl_checkpoint_keys_do_not_expire(
    store: RedisStreamCheckpointStore, raw: redis.Redis
) -> None:
    store.put(checkpoint("run-1", "text"))
    assert raw.pttl(f"{store.prefix}:{{run-1}}:head") == -1
    assert raw.pttl(f"{store.prefix}:{{run-1}}:text") == -1


def test_redis_expiry_removes_the_checkpoint_and_keeps_the_epoch(
    redis_server: RedisServer, raw: redis.Redis
) -> None:
    with RedisStreamCheckpointStore(redis_server.url, prefix=unique_prefix(), ttl=0.05) as store:
        epoch = store.claim("run-1")
        store.put(checkpoint("run-1", "text", epoch=epoch))
        time.sleep(0.12)

        assert store.get("run-1") is None
        assert sorted(raw.scan_iter(match=f"{store.prefix}*")) == [
            f"{store.prefix}:{{run-1}}:epoch".encode()
        ]
        assert store.claim("run-1") > epoch
        with pytest.raises(StreamCheckpointFencedError):
            store.put(checkpoint("run-1", "late", epoch=epoch))


def test_store_clock_expires_a_checkpoint_before_redis_does(
    redis_server: RedisServer, raw: redis.Redis
) -> None:
    clock = FakeClock()
    with RedisStreamCheckpointStore(
        redis_server.url, prefix=unique_prefix(), ttl=60, clock=clock
    ) as store:
        store.put(checkpoint("old", "a"))
        clock.now += 50
        store.put(checkpoint("young", "b"))
        clock.now += 11

        assert store.get("old") is None
        assert store.list_run_ids() == ["young"]
        assert store.gc() == 1
        assert raw.exists(f"{store.prefix}:{{old}}:head") == 0
        assert store.get("young") is not None


def test_gc_keeps_a_checkpoint_rewritten_while_it_was_deciding(
    redis_server: RedisServer,
) -> None:
    clock = FakeClock()
    prefix = unique_prefix()
    with (
        RedisStreamCheckpointStore(redis_server.url, prefix=prefix, ttl=60, clock=clock) as gc,
        RedisStreamCheckpointStore(redis_server.url, prefix=prefix, ttl=60) as writer,
    ):
        gc.put(checkpoint("run-1", "old"))
        clock.now += 61

        def expired_but_rewritten_meanwhile(head: Head) -> bool:
            writer.put(checkpoint("run-1", "written by a live worker"))
            return gc.is_expired(head.updated_at)

        # the collector saw an expired head; a worker rewrote the run before the delete
        assert gc._backend_delete("run-1", None, expired_but_rewritten_meanwhile) is False
        found = writer.get("run-1")
        assert found is not None
        assert found.partial_text == "written by a live worker"


# -- delta writes ----------------------------------------------------------------


def net_input_bytes(raw: redis.Redis) -> int:
    return int(raw.info("stats")["total_net_input_bytes"])


def test_a_small_delta_on_a_large_partial_sends_only_the_delta(
    store: RedisStreamCheckpointStore, raw: redis.Redis
) -> None:
    text = "x" * 200_000
    store.put(checkpoint("run-1", text))

    before = net_input_bytes(raw)
    store.put(checkpoint("run-1", text + "sixteen chars..."))
    sent = net_input_bytes(raw) - before - len("*1\r\n$4\r\nINFO\r\n$5\r\nstats\r\n")

    assert sent < 2_000
    found = store.get("run-1")
    assert found is not None
    assert found.partial_text == text + "sixteen chars..."


def test_delta_after_another_writer_rewrote_the_run_rewrites_the_whole_text(
    redis_server: RedisServer,
) -> None:
    prefix = unique_prefix()
    with (
        RedisStreamCheckpointStore(redis_server.url, prefix=prefix) as first,
        RedisStreamCheckpointStore(redis_server.url, prefix=prefix) as second,
    ):
        first.put(checkpoint("run-1", "abc"))
        second.put(checkpoint("run-1", "xyz"))
        first.put(checkpoint("run-1", "abcd"))

        found = second.get("run-1")
        assert found is not None
        assert found.partial_text == "abcd"


# -- failures --------------------------------------------------------------------


def every_call_fails_with_checkpoint_error(store: RedisStreamCheckpointStore) -> None:
    calls: list[Any] = [
        lambda: store.get("run-1"),
        lambda: store.put(checkpoint("run-1", "more text", epoch=1)),
        lambda: store.delete("run-1"),
        lambda: store.claim("run-1"),
    ]
    for call in calls:
        with pytest.raises(StreamCheckpointError, match="run_id='run-1'") as caught:
            call()
        assert isinstance(caught.value.cause, redis.ConnectionError)
    for call in (store.list_run_ids, store.gc):
        with pytest.raises(StreamCheckpointError) as caught:
            call()
        assert isinstance(caught.value.cause, redis.ConnectionError)


async def every_async_call_fails_with_checkpoint_error(store: RedisStreamCheckpointStore) -> None:
    with pytest.raises(StreamCheckpointError, match="run_id='run-1'"):
        await store.aget("run-1")
    with pytest.raises(StreamCheckpointError, match="run_id='run-1'"):
        await store.aput(checkpoint("run-1", "more text", epoch=1))
    with pytest.raises(StreamCheckpointError, match="run_id='run-1'"):
        await store.adelete("run-1")
    with pytest.raises(StreamCheckpointError, match="run_id='run-1'"):
        await store.aclaim("run-1")


async def test_more_concurrent_async_writers_than_pool_connections_all_succeed(
    redis_server: RedisServer,
) -> None:
    from awaken_langchain.stores import redis as redis_module

    writers = redis_module.ASYNC_MAX_CONNECTIONS + 50
    store = RedisStreamCheckpointStore(redis_server.url, prefix=unique_prefix())

    async def write(n: int) -> None:
        run_id = f"run-{n}"
        epoch = await store.aclaim(run_id)
        await store.aput(checkpoint(run_id, f"text of run {n}", epoch=epoch))

    await asyncio.gather(*(write(n) for n in range(writers)))
    assert len(store.list_run_ids()) == writers
    found = await store.aget("run-7")
    assert found is not None
    assert found.partial_text == "text of run 7"
    await store.aclose()
    store.close()


async def test_server_killed_mid_run_raises_checkpoint_error_and_recovers_after_restart(
    own_server: RedisServer,
) -> None:
    store = RedisStreamCheckpointStore(own_server.url, prefix="p", ttl=3600, retries=1)
    epoch = store.claim("run-1")
    store.put(checkpoint("run-1", "before the crash", epoch=epoch))
    await store.aput(checkpoint("run-1", "before the crash, async", epoch=epoch))

    own_server.kill()
    started = time.monotonic()
    every_call_fails_with_checkpoint_error(store)
    await every_async_call_fails_with_checkpoint_error(store)
    assert time.monotonic() - started < 5

    own_server.start()
    found = store.get("run-1")  # the append-only file kept the checkpoint
    assert found is not None
    assert found.partial_text == "before the crash, async"
    store.put(checkpoint("run-1", "before the crash, async, after", epoch=epoch))
    await store.aput(checkpoint("run-1", "before the crash, async, after, again", epoch=epoch))
    again = store.claim("run-1")
    assert again > epoch
    assert await store.aclaim("run-1") > again
    found = await store.aget("run-1")
    assert found is not None
    assert found.partial_text == "before the crash, async, after, again"
    await store.aclose()


async def test_a_server_that_stops_answering_raises_checkpoint_error_after_the_timeout(
    own_server: RedisServer,
) -> None:
    store = RedisStreamCheckpointStore(own_server.url, prefix="p", socket_timeout=0.2, retries=0)
    store.put(checkpoint("run-1", "before the stall"))
    assert await store.aget("run-1") is not None
    assert own_server.process is not None
    own_server.process.send_signal(signal.SIGSTOP)
    try:
        with pytest.raises(StreamCheckpointError, match="run_id='run-1'") as caught:
            store.get("run-1")
        assert isinstance(caught.value.cause, redis.TimeoutError)
        with pytest.raises(StreamCheckpointError, match="run_id='run-1'") as caught:
            await store.aput(checkpoint("run-1", "before the stall, and more"))
        assert isinstance(caught.value.cause, redis.TimeoutError)
    finally:
        own_server.process.send_signal(signal.SIGCONT)
    # the server first works through what was sent while it was stopped; on a busy
    # machine that can outlast the store's 0.2 s timeout, which is not under test here
    with redis.Redis.from_url(own_server.url, socket_timeout=30) as client:
        assert client.ping()
    store.put(checkpoint("run-1", "after the stall"))
    found = await store.aget("run-1")
    assert found is not None
    assert found.partial_text == "after the stall"
    await store.aclose()


def test_wrong_password_raises_checkpoint_error(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis", password="s3cret")
    server.start()
    try:
        with RedisStreamCheckpointStore(
            server.url_without_password, password="wrong", prefix="p"
        ) as store:
            with pytest.raises(StreamCheckpointError) as caught:
                store.claim("run-1")
            assert isinstance(caught.value.cause, redis.AuthenticationError)
            assert "s3cret" not in str(caught.value)
        with (
            RedisStreamCheckpointStore(server.url_without_password, prefix="p") as store,
            pytest.raises(StreamCheckpointError, match="run_id='run-1'"),
        ):
            store.get("run-1")
        with RedisStreamCheckpointStore(
            server.url_without_password, password="s3cret", prefix="p"
        ) as store:
            assert store.claim("run-1") >= 1
    finally:
        server.stop()


def test_password_in_url_is_not_shown_in_errors(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis", password="s3cret")
    server.start()
    server.kill()
    with (
        RedisStreamCheckpointStore(server.url, prefix="p", retries=0) as store,
        pytest.raises(StreamCheckpointError) as caught,
    ):
        store.get("run-1")
    assert "s3cret" not in str(caught.value)
    assert ":***@127.0.0.1" in str(caught.value)


def test_foreign_data_under_the_keys_raises_checkpoint_error(
    store: RedisStreamCheckpointStore, raw: redis.Redis
) -> None:
    raw.rpush(f"{store.prefix}:{{run-1}}:epoch", "not a counter")
    raw.set(f"{store.prefix}:{{run-1}}:head", "not a hash")

    with pytest.raises(StreamCheckpointError, match="run_id='run-1'") as caught:
        store.claim("run-1")
    assert isinstance(caught.value.cause, redis.ResponseError)
    with pytest.raises(StreamCheckpointError, match="run_id='run-1'"):
        store.get("run-1")
    with pytest.raises(StreamCheckpointError, match="run_id='run-1'"):
        store.put(checkpoint("run-1", "x"))


# -- clients ---------------------------------------------------------------------


def test_clients_that_decode_responses_are_rejected(redis_server: RedisServer) -> None:
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    with pytest.raises(ValueError, match="decode_responses"):
        RedisStreamCheckpointStore(client=client)
    with pytest.raises(ValueError, match="decode_responses"):
        RedisStreamCheckpointStore(redis_server.url, decode_responses=True)
    client.close()


def test_borrowed_clients_are_used_and_left_open(redis_server: RedisServer) -> None:
    client = redis.Redis.from_url(redis_server.url)
    store = RedisStreamCheckpointStore(client=client, prefix=unique_prefix())
    store.put(checkpoint("run-1", "ü\ud800 text"))
    found = store.get("run-1")
    assert found is not None
    assert found.partial_text == "ü\ud800 text"
    assert store.list_run_ids() == ["run-1"]
    store.close()
    assert client.ping() is True
    client.close()


async def test_async_methods_with_only_a_sync_client_run_in_a_thread(
    redis_server: RedisServer,
) -> None:
    client = redis.Redis.from_url(redis_server.url)
    store = RedisStreamCheckpointStore(client=client, prefix=unique_prefix())
    epoch = await store.aclaim("run-1")
    await store.aput(checkpoint("run-1", "text", epoch=epoch))
    found = await store.aget("run-1")
    assert found is not None
    assert found.partial_text == "text"
    await store.adelete("run-1", epoch=epoch)
    assert await store.aget("run-1") is None
    client.close()


async def test_borrowed_async_client_serves_the_async_methods(redis_server: RedisServer) -> None:
    client = redis.asyncio.Redis.from_url(redis_server.url)
    store = RedisStreamCheckpointStore(async_client=client, prefix=unique_prefix())
    epoch = await store.aclaim("run-1")
    await store.aput(checkpoint("run-1", "text", epoch=epoch))
    await store.aput(checkpoint("run-1", "text and more", epoch=epoch))
    found = await store.aget("run-1")
    assert found is not None
    assert found.partial_text == "text and more"
    with pytest.raises(StreamCheckpointError, match="async"):
        store.get("run-1")
    await client.aclose()


def test_one_store_serves_several_event_loops(redis_server: RedisServer) -> None:
    store = RedisStreamCheckpointStore.from_url(redis_server.url, prefix=unique_prefix())

    async def write(text: str) -> StreamCheckpoint | None:
        await store.aput(checkpoint("run-1", text))
        found = await store.aget("run-1")
        await store.aclose()
        return found

    first = asyncio.run(write("one"))
    second = asyncio.run(write("one two"))
    assert first is not None
    assert first.partial_text == "one"
    assert second is not None
    assert second.partial_text == "one two"


async def test_async_with_closes_the_event_loops_connections(
    redis_server: RedisServer, raw: redis.Redis
) -> None:
    name = unique_prefix()

    def connections() -> int:
        return sum(client["name"] == name for client in raw.client_list())

    async with RedisStreamCheckpointStore.from_url(
        redis_server.url, prefix=name, client_name=name
    ) as store:
        await store.aput(checkpoint("run-1", "text"))
        assert connections() == 1
    for _ in range(500):  # the server notices a closed socket on its next loop turn
        if connections() == 0:
            break
        await asyncio.sleep(0.01)
    assert connections() == 0


def _connections_named(raw: redis.Redis, name: str) -> int:
    """How many connections the server has open for clients named ``name``."""
    for _ in range(500):  # the server notices a closed socket on its next loop turn
        count = sum(client["name"] == name for client in raw.client_list())
        if count <= 1:
            return count
        time.sleep(0.01)
    return count


def test_event_loops_that_end_leave_no_connections_and_no_loops_behind(
    redis_server: RedisServer, raw: redis.Redis
) -> None:
    name = unique_prefix()
    store = RedisStreamCheckpointStore.from_url(redis_server.url, prefix=name, client_name=name)
    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def one_turn(n: int) -> None:  # never calls aclose: asyncio.run ends the loop
        loops.append(weakref.ref(asyncio.get_running_loop()))
        epoch = await store.aclaim(f"run-{n}")
        await store.aput(checkpoint(f"run-{n}", f"turn {n}", epoch=epoch))
        await store.aput(checkpoint(f"run-{n}", f"turn {n} and more", epoch=epoch))
        assert _connections_named(raw, name) == 1

    for n in range(60):
        asyncio.run(one_turn(n))
    gc.collect()
    assert _connections_named(raw, name) == 0
    assert len(store._loop_clients) == 0
    assert [ref for ref in loops if ref() is not None] == []
    assert store.get("run-59") is not None
    store.close()


def test_turns_of_a_wrapped_model_on_many_event_loops_leave_no_connections(
    redis_server: RedisServer, raw: redis.Redis
) -> None:
    from awaken_langchain.model import RecoveringChatModel
    from awaken_langchain.testing.scripted import ScriptedChatModel, finish, text

    name = unique_prefix()
    store = RedisStreamCheckpointStore.from_url(redis_server.url, prefix=name, client_name=name)
    turns = 60
    inner = ScriptedChatModel(
        scripts=[[*text(f"Answer number {n}, in a few tokens."), finish()] for n in range(turns)]
    )
    model = RecoveringChatModel(model=inner, store=store)
    connections = []
    for n in range(turns):
        answer = asyncio.run(model.ainvoke(f"question {n}"))
        assert answer.content == f"Answer number {n}, in a few tokens."
        connections.append(_connections_named(raw, name))
    gc.collect()
    # the checkpoint writer's pooled connection, whatever the number of loops
    assert _connections_named(raw, name) <= 1
    assert max(connections) <= 1
    assert len(store._loop_clients) == 0
    store.close()


def test_clients_of_loops_closed_without_shutdown_are_dropped(redis_server: RedisServer) -> None:
    store = RedisStreamCheckpointStore.from_url(redis_server.url, prefix=unique_prefix())
    for n in range(5):
        loop = asyncio.new_event_loop()  # closed without shutdown_asyncgens()
        loop.run_until_complete(store.aput(checkpoint("run-1", f"loop {n}")))
        loop.close()
    assert len(store._loop_clients) == 1  # only the last loop's, until the next loop comes
    asyncio.run(store.aput(checkpoint("run-1", "loop 5")))
    assert len(store._loop_clients) == 0
    store.close()


def test_importing_the_package_does_not_need_redis_and_the_store_names_the_extra() -> None:
    code = (
        "import sys\n"
        "sys.modules['redis'] = None\n"
        "import awaken_langchain, awaken_langchain.stores\n"
        "try:\n"
        "    import awaken_langchain.stores.redis\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        cwd=REPO_ROOT,
        timeout=60,
        check=True,
    )
    assert "pip install 'awaken-langchain[redis]'" in result.stdout


def test_tls_connection_verifies_the_server_with_the_given_ca(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis", tls=True)
    server.start()
    try:
        plain_url = f"redis://127.0.0.1:{server.port}/0"
        with RedisStreamCheckpointStore(plain_url, ssl_ca_certs=server.ca_file) as store:
            epoch = store.claim("run-1")
            store.put(checkpoint("run-1", "over TLS", epoch=epoch))
            found = store.get("run-1")
            assert found is not None
            assert found.partial_text == "over TLS"

            async def read_async() -> StreamCheckpoint | None:
                try:
                    return await store.aget("run-1")
                finally:
                    await store.aclose()

            assert asyncio.run(read_async()) == found
        with (
            RedisStreamCheckpointStore(server.url, retries=0) as unverified,
            pytest.raises(StreamCheckpointError, match="run_id='run-1'") as caught,
        ):
            unverified.get("run-1")
        assert "certificate" in str(caught.value).lower()
    finally:
        server.stop()


def test_connection_settings_with_a_borrowed_client_are_rejected(
    redis_server: RedisServer,
) -> None:
    client = redis.Redis.from_url(redis_server.url)
    with pytest.raises(ValueError, match="apply only"):
        RedisStreamCheckpointStore(client=client, password="secret")
    with pytest.raises(ValueError, match="apply only"):
        RedisStreamCheckpointStore(client=client, ssl=True)
    client.close()


def test_missing_redis_server_skips_unless_required(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no redis-server to be found
    monkeypatch.delenv("AWAKEN_REQUIRE_REDIS", raising=False)
    with pytest.raises(pytest.skip.Exception, match="redis-server is not installed"):
        redis_server_binary()
    monkeypatch.setenv("AWAKEN_REQUIRE_REDIS", "1")
    with pytest.raises(pytest.fail.Exception, match="AWAKEN_REQUIRE_REDIS=1"):
        redis_server_binary()


def test_put_benchmark_measures_redis_and_a_small_delta_sends_few_bytes(
    redis_server: RedisServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = REPO_ROOT / "benchmarks" / "checkpoint_put.py"
    spec = importlib.util.spec_from_file_location("checkpoint_put", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)

    stop = module._Redis.start(redis_server.url)
    assert stop is not None
    ((large, small),) = module.main(size=50_000, small=500, puts=5, stores=("redis",))
    stop()

    assert (large.partial_chars, small.partial_chars) == (50_000, 500)
    # what reached the server per put does not grow with the partial
    assert large.append_bytes is not None
    assert small.append_bytes is not None
    assert large.append_bytes < 2_000
    assert large.append_bytes - small.append_bytes < 100
    assert "redis" in capsys.readouterr().out


CRASHING_HOST = """
import sys, uuid
from awaken_langchain.model import RecoveringChatModel
from awaken_langchain.stores.redis import RedisStreamCheckpointStore
from awaken_langchain.testing.scripted import ScriptedChatModel, Stall, text

url, prefix, run_id = sys.argv[1:4]
store = RedisStreamCheckpointStore(url, prefix=prefix)
inner = ScriptedChatModel(scripts=[[*text("The first host wrote this, "), Stall(60)]])
model = RecoveringChatModel(model=inner, store=store, checkpoint_every_chunks=1)
for chunk in model.stream("q", config={"run_id": uuid.UUID(run_id)}):
    print(chunk.content, end="", flush=True)
"""


def test_a_turn_cut_off_by_a_killed_host_is_finished_by_another(
    redis_server: RedisServer,
) -> None:
    from awaken_langchain.model import RecoveringChatModel
    from awaken_langchain.testing.scripted import ScriptedChatModel, finish, text

    prefix, run_id = unique_prefix(), uuid.uuid4()
    first_part = "The first host wrote this, "
    host = subprocess.Popen(
        [sys.executable, "-c", CRASHING_HOST, redis_server.url, prefix, str(run_id)],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        cwd=REPO_ROOT,
    )
    try:
        assert host.stdout is not None
        shown = b""
        while len(shown) < len(first_part.encode()):
            piece = host.stdout.read1(64)
            assert piece, "the first host exited before streaming its text"
            shown += piece
        assert shown.decode() == first_part
        with RedisStreamCheckpointStore(redis_server.url, prefix=prefix) as store:
            for _ in range(500):  # the checkpoint of the last chunk follows its yield
                saved = store.get(str(run_id))
                if saved is not None and saved.partial_text == first_part:
                    break
                time.sleep(0.01)
            host.kill()  # the host dies mid-stream, as in a crash

            inner = ScriptedChatModel(scripts=[[*text("and the second finished it."), finish()]])
            model = RecoveringChatModel(model=inner, store=store)
            chunks = list(model.stream("q", config={"run_id": run_id}))
            assert "".join(str(c.content) for c in chunks) == (
                first_part + "and the second finished it."
            )
            assert chunks[-1].response_metadata["awaken"]["resumed"] is True
            assert inner.calls[0].messages[1].content == first_part.rstrip()
            assert store.get(str(run_id)) is None
    finally:
        host.kill()
        host.wait(timeout=10)


def test_a_valkey_client_that_cannot_connect_fails_naming_where_to_look() -> None:
    valkey = pytest.importorskip("valkey")
    client = valkey.Valkey(host="127.0.0.1", port=free_port(), socket_connect_timeout=0.5)
    with (
        RedisStreamCheckpointStore(client=client) as store,
        pytest.raises(StreamCheckpointError, match="Redis get failed at the given Redis client"),
    ):
        store.get("run-1")
    client.close()
