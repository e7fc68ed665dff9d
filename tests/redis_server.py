"""A real ``redis-server`` for the tests: started on a free loopback port, stopped after.

The suite never talks to a Redis it did not start. When the ``redis-server``
binary is missing the Redis tests are skipped with the reason, unless
``AWAKEN_REQUIRE_REDIS=1`` is set (CI), in which case they fail.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from awaken_langchain.checkpoint import StreamCheckpointStore
    from awaken_langchain.stores.redis import RedisStreamCheckpointStore

REQUIRE_ENV = "AWAKEN_REQUIRE_REDIS"


def redis_server_binary() -> str:
    """Return the path of ``redis-server``, or skip/fail the calling test.

    Raises:
        pytest.fail.Exception: When the binary is missing and Redis is required.
        pytest.skip.Exception: When the binary is missing otherwise.
    """
    path = shutil.which("redis-server")
    if path is not None:
        return path
    message = (
        "redis-server is not installed; install it (apt-get install redis-server) "
        "to run the Redis store tests"
    )
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{message} ({REQUIRE_ENV}=1 makes them mandatory)", pytrace=False)
    pytest.skip(message)


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def make_certificates(directory: Path) -> None:
    """Write ``ca.crt`` and a ``server.crt``/``server.key`` for 127.0.0.1 signed by it.

    Skips the calling test when the ``openssl`` command is missing.
    """
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed; it makes the certificates of the TLS test")
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    (directory / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    ca = ["req", "-x509", *key, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2"]
    csr = ["req", *key, "-keyout", "server.key", "-out", "server.csr"]
    sign = ["x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key"]
    for command in (
        [*ca, "-subj", "/CN=awaken test CA"],
        [*csr, "-subj", "/CN=127.0.0.1"],
        [*sign, "-CAcreateserial", "-out", "server.crt", "-days", "2", "-extfile", "san.cnf"],
    ):
        subprocess.run(["openssl", *command], cwd=directory, check=True, capture_output=True)


class RedisServer:
    """One ``redis-server`` process in its own directory, on a loopback port.

    Args:
        directory: Working directory for the server (its log and any AOF files).
        password: When given, the server requires it (``requirepass``).
        appendonly: Persist every write to an append-only file fsynced on each
            command, so data survives ``kill()`` and ``start()``.
        tls: Serve TLS only, with a certificate for 127.0.0.1 signed by a CA made
            for this server (``ca_file``).
    """

    def __init__(
        self,
        directory: Path,
        *,
        password: str | None = None,
        appendonly: bool = False,
        tls: bool = False,
    ) -> None:
        self.binary = redis_server_binary()
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self.password = password
        self.appendonly = appendonly
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.tls = tls
        if tls:
            make_certificates(directory)

    @property
    def ca_file(self) -> str:
        """The CA certificate that signed the server's TLS certificate."""
        return str(self.directory / "ca.crt")

    @property
    def url(self) -> str:
        """The ``redis://`` URL of the server, with the password when there is one."""
        auth = f":{self.password}@" if self.password else ""
        return f"{self.scheme}://{auth}127.0.0.1:{self.port}/0"

    @property
    def url_without_password(self) -> str:
        """The server's URL without credentials."""
        return f"{self.scheme}://127.0.0.1:{self.port}/0"

    @property
    def scheme(self) -> str:
        """``rediss`` for a TLS server, else ``redis``."""
        return "rediss" if self.tls else "redis"

    def start(self, timeout: float = 10.0) -> None:
        """Start the server (again, on the same port) and wait until it answers."""
        args = [
            self.binary,
            *(
                [
                    "--port",
                    "0",
                    "--tls-port",
                    str(self.port),
                    "--tls-cert-file",
                    "server.crt",
                    "--tls-key-file",
                    "server.key",
                    "--tls-ca-cert-file",
                    "ca.crt",
                    "--tls-auth-clients",
                    "no",
                ]
                if self.tls
                else ["--port", str(self.port)]
            ),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.directory),
            "--save",
            "",
            "--logfile",
            "redis.log",
            "--daemonize",
            "no",
        ]
        if self.appendonly:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            args += ["--appendonly", "no"]
        if self.password:
            args += ["--requirepass", self.password]
        self.process = subprocess.Popen(
            args, cwd=self.directory, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                log = self.directory / "redis.log"
                tail = log.read_text()[-2000:] if log.exists() else ""
                raise RuntimeError(f"redis-server exited at start: {tail}")
            if self._answers_ping():
                return
            time.sleep(0.01)
        self.stop()
        raise RuntimeError(f"redis-server did not answer on port {self.port} within {timeout} s")

    def _answers_ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as raw:
                sock = (
                    ssl.create_default_context(cafile=self.ca_file).wrap_socket(
                        raw, server_hostname="127.0.0.1"
                    )
                    if self.tls
                    else raw
                )
                sock.sendall(b"PING\r\n")
                reply = sock.recv(64)
        except OSError:
            return False
        # With requirepass an unauthenticated PING gets -NOAUTH: the server is up.
        return reply.startswith((b"+PONG", b"-NOAUTH"))

    def kill(self) -> None:
        """Kill the server with SIGKILL, as a crash would, and reap it."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)
        self.process = None

    def freeze(self) -> None:
        """Stop the server's process (SIGSTOP): connections stay open, nothing answers."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        """Let a frozen server go on (SIGCONT)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        """Stop the server gracefully (SIGTERM), killing it if it does not exit; frozen or not."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.thaw()
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.process = None


URL_ENV = "AWAKEN_TEST_REDIS_URL"
"""Where the shared test server listens; child processes of a test inherit it."""

_shared: RedisServer | None = None


def shared_redis_server() -> RedisServer:
    """Return this process's shared test server, starting it on first use.

    It is stopped when the process exits; tests keep apart by key prefix. Each
    pytest-xdist worker is a process of its own, so each starts its own server
    on its own free port: no two workers share a server, and a test that counts
    a server's clients or keys sees only its own worker's.
    """
    global _shared
    if _shared is None:
        directory = Path(tempfile.mkdtemp(prefix="awaken-redis-"))
        server = RedisServer(directory)
        server.start()
        atexit.register(shutil.rmtree, directory, ignore_errors=True)
        atexit.register(server.stop)
        os.environ[URL_ENV] = server.url
        _shared = server
    return _shared


@pytest.fixture(scope="session")
def redis_server() -> RedisServer:
    """The shared ``redis-server`` of this test process."""
    return shared_redis_server()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A ``redis-server`` of this test alone, which it may freeze."""
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def unique_prefix() -> str:
    """Return a key prefix no other test uses."""
    return f"test-{uuid.uuid4().hex[:12]}"


def prefix_for(location: Path) -> str:
    """Return the key prefix that stands for a per-test store location."""
    return "test-" + hashlib.sha256(str(location).encode()).hexdigest()[:16]


def store_on(location: Path, **kwargs: Any) -> RedisStreamCheckpointStore:
    """Build a Redis store whose data is shared by every store on ``location``.

    Works in child processes too: the server's URL comes from the environment
    the test process set when it started the server.
    """
    from awaken_langchain.stores.redis import RedisStreamCheckpointStore

    url = os.environ.get(URL_ENV) or shared_redis_server().url
    return RedisStreamCheckpointStore(url, prefix=prefix_for(location), **kwargs)


def corrupt_redis(store: StreamCheckpointStore, location: Path, run_id: str, part: str) -> None:
    """Overwrite a run's stored head or text with garbage, behind the store's back."""
    import redis

    from awaken_langchain.stores.redis import RedisStreamCheckpointStore

    assert isinstance(store, RedisStreamCheckpointStore)
    assert store.url is not None
    head, text, _ = store._keys(run_id)
    with redis.Redis.from_url(store.url) as raw:
        if part == "head":
            raw.hset(head, "head", b"\x00garbage")
        else:
            raw.set(text, b"\xff\xfe\xfd")


def redis_records(store: StreamCheckpointStore, location: Path) -> int:
    """How many keys a store on ``location`` holds in Redis."""
    import redis

    from awaken_langchain.stores.redis import RedisStreamCheckpointStore

    assert isinstance(store, RedisStreamCheckpointStore)
    assert store.url is not None
    with redis.Redis.from_url(store.url) as raw:
        return sum(1 for _ in raw.scan_iter(match=f"{prefix_for(location)}:*"))


def redis_let_time_pass(store: StreamCheckpointStore, location: Path, seconds: float) -> None:
    """Do what Redis's own expiry does once ``seconds`` have passed on its clock.

    The test moves the store's clock; Redis's clock cannot be moved, so every key
    of the store whose remaining time to live is at most ``seconds`` is deleted,
    as Redis would have by then.
    """
    import redis

    from awaken_langchain.stores.redis import RedisStreamCheckpointStore

    assert isinstance(store, RedisStreamCheckpointStore)
    assert store.url is not None
    with redis.Redis.from_url(store.url) as raw:
        for key in list(raw.scan_iter(match=f"{prefix_for(location)}:*")):
            if 0 <= raw.pttl(key) <= seconds * 1000:
                raw.delete(key)


def valkey_store_on(location: Path, **kwargs: Any) -> RedisStreamCheckpointStore:
    """A Redis store on the shared server through a ``valkey`` client, closed with the store."""
    valkey = pytest.importorskip("valkey")

    from awaken_langchain.stores.redis import RedisStreamCheckpointStore

    client = valkey.Valkey.from_url(os.environ.get(URL_ENV) or shared_redis_server().url)

    class ValkeyClientStore(RedisStreamCheckpointStore):
        def close(self) -> None:
            super().close()
            client.close()

    return ValkeyClientStore(client=client, prefix=prefix_for(location), **kwargs)


def valkey_let_time_pass(store: StreamCheckpointStore, location: Path, seconds: float) -> None:
    """`redis_let_time_pass` for a store that borrowed its client (it has no URL)."""
    import redis

    with redis.Redis.from_url(os.environ.get(URL_ENV) or shared_redis_server().url) as raw:
        for key in list(raw.scan_iter(match=f"{prefix_for(location)}:*")):
            if 0 <= raw.pttl(key) <= seconds * 1000:
                raw.delete(key)
