"""A store's password never leaves the library in clear.

A Redis URL may carry its password in the user part or in the query
(``?password=``), for TCP, TLS and unix socket connections. When the store
fails, the warning names where the store is; the Python warning, the log
record and the ``awaken_checkpoint_warning`` event (which callbacks, LangSmith
and OpenTelemetry receive) all show the URL with the password masked.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from warning_outlets import store_failure_outlets

from awaken_langchain.errors import StreamCheckpointError
from awaken_langchain.stores.redis import RedisStreamCheckpointStore
from tests.redis_server import RedisServer

pytestmark = pytest.mark.redis

SECRET = "hunter2-not-the-password"
"""The (wrong) password the URLs carry: it must appear in no outlet."""


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A real redis-server that requires a password other than `SECRET`."""
    server = RedisServer(tmp_path_factory.mktemp("redis"), password="the-right-one")
    server.start()
    try:
        yield server
    finally:
        server.stop()


URLS = {
    "query password": "redis://127.0.0.1:{port}/0?password={secret}",
    "user and password": "redis://default:{secret}@127.0.0.1:{port}/0",
    "tls query password": "rediss://127.0.0.1:{port}/0?ssl_cert_reqs=none&password={secret}",
    "unix socket query password": "unix://{socket}?db=0&password={secret}",
    "unix socket user part": "unix://:{secret}@{socket}",
}


@pytest.mark.parametrize("form", list(URLS))
def test_a_redis_password_is_masked_in_the_warning_the_log_and_the_event(
    form: str, guarded: RedisServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = URLS[form].format(port=guarded.port, secret=SECRET, socket=tmp_path / "redis.sock")
    store = RedisStreamCheckpointStore(url, retries=0, socket_timeout=0.5)
    outlets = store_failure_outlets(store, caplog)
    assert [SECRET in outlet for outlet in outlets] == [False] * 4
    assert all("***" in outlet for outlet in outlets)  # where the password was


@pytest.mark.parametrize("form", list(URLS))
def test_a_redis_store_error_names_where_the_store_is_without_its_password(
    form: str, guarded: RedisServer, tmp_path: Path
) -> None:
    url = URLS[form].format(port=guarded.port, secret=SECRET, socket=tmp_path / "redis.sock")
    with (
        RedisStreamCheckpointStore(url, retries=0, socket_timeout=0.5) as store,
        pytest.raises(StreamCheckpointError) as caught,
    ):
        store.get("run-1")
    assert SECRET not in str(caught.value)
    assert f"failed at {url.replace(SECRET, '***')} " in str(caught.value)
