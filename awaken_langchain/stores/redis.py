"""A checkpoint store on Redis, for workers spread over several hosts.

Each run is kept under three keys that share one hash tag (so they live in one
slot and one Lua script can touch them all)::

    {prefix}:{<run_id>}:head    hash: the record without its text, write generation,
                                epoch, updated_at and text length
    {prefix}:{<run_id>}:text    string: the partial text, UTF-8, appended to in place
    {prefix}:{<run_id>}:epoch   integer: the fencing counter; never expires

Every write is one server-side Lua script that checks the fencing epoch and then
writes the head and text together, so a stale writer on another host is refused
even when it races the new owner. A put whose text extends the text this store
wrote last sends only the new characters (``APPEND``); the script verifies the
stored text is exactly what the writer believes it is and otherwise asks for a
full write. Checkpoint keys get the store's ``ttl`` as a Redis expiry.

Values are JSON text encoded by this library; nothing is ever pickled.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import secrets
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

try:
    import redis
    import redis.asyncio
    import redis.asyncio.retry
    import redis.backoff
    import redis.exceptions
    import redis.retry
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "RedisStreamCheckpointStore needs the redis package; "
        "install it with: pip install 'awaken-langchain[redis]'"
    ) from exc

from awaken_langchain.checkpoint import (
    DEFAULT_MAX_CHECKPOINT_BYTES,
    StreamCheckpoint,
    StreamCheckpointStore,
    check_run_id,
    checkpoint_from_dict,
    decode_json,
    encode_json,
)
from awaken_langchain.errors import StreamCheckpointError, StreamCheckpointFencedError

__all__ = ["RedisStreamCheckpointStore"]

_REDIS_ERRORS: tuple[type[BaseException], ...] = (
    redis.exceptions.RedisError,
    redis.exceptions.RedisClusterException,
    OSError,
    TimeoutError,
)
"""Exceptions a Redis call can raise; each becomes a ``StreamCheckpointError``."""

_MEMO_LIMIT = 4096
"""How many runs' last written text a store remembers for delta writes."""

_SCAN_BATCH = 500
"""``COUNT`` hint for ``SCAN`` and the batch size of follow-up reads."""

# KEYS: head, text, epoch
# ARGV: epoch, mode ("full" | "append"), record JSON, text or delta, generation,
#       expected text length (append only), updated_at, expiry in ms ("" for none)
# Returns {status, current epoch or text length}.
_PUT_SCRIPT = """
local current = tonumber(redis.call('GET', KEYS[3]) or '0')
local epoch = tonumber(ARGV[1])
if epoch < current then return {'fenced', current} end
if epoch > current then return {'unclaimed', current} end
local size
if ARGV[2] == 'append' then
  if redis.call('HGET', KEYS[1], 'gen') ~= ARGV[5]
      or redis.call('STRLEN', KEYS[2]) ~= tonumber(ARGV[6]) then
    return {'resend', current}
  end
  size = redis.call('APPEND', KEYS[2], ARGV[4])
else
  redis.call('SET', KEYS[2], ARGV[4])
  size = string.len(ARGV[4])
end
redis.call('HSET', KEYS[1], 'record', ARGV[3], 'gen', ARGV[5], 'epoch', ARGV[1],
  'updated_at', ARGV[7], 'text_bytes', size)
if ARGV[8] ~= '' then
  redis.call('PEXPIRE', KEYS[1], ARGV[8])
  redis.call('PEXPIRE', KEYS[2], ARGV[8])
else
  redis.call('PERSIST', KEYS[1])
  redis.call('PERSIST', KEYS[2])
end
return {'ok', size}
"""

# KEYS: head, text
# Returns false when there is no checkpoint, else {record JSON, text, text length}.
_GET_SCRIPT = """
local head = redis.call('HMGET', KEYS[1], 'record', 'text_bytes')
if not head[1] then return false end
return {head[1], redis.call('GET', KEYS[2]) or '', head[2] or '0'}
"""

# KEYS: head, text, epoch
# ARGV: epoch ("" for an unconditional delete)
_DELETE_SCRIPT = """
if ARGV[1] ~= '' then
  local current = tonumber(redis.call('GET', KEYS[3]) or '0')
  local epoch = tonumber(ARGV[1])
  if epoch < current then return {'fenced', current} end
  if epoch > current then return {'unclaimed', current} end
end
return {'ok', redis.call('DEL', KEYS[1], KEYS[2])}
"""

# KEYS: head, text
# ARGV: the updated_at the collector saw; a newer write keeps the checkpoint.
_GC_SCRIPT = """
if redis.call('HGET', KEYS[1], 'updated_at') == ARGV[1] then
  return redis.call('DEL', KEYS[1], KEYS[2])
end
return 0
"""


@dataclass(frozen=True)
class _Memo:
    """What this store last wrote for a run, so the next put can send only a delta."""

    generation: bytes
    text: str
    text_bytes: int


@dataclass(frozen=True)
class _PutPlan:
    """The arguments of one put script call, and the memo to keep if it succeeds."""

    mode: Literal["full", "append"]
    args: tuple[bytes, ...]
    memo: _Memo


@dataclass
class _AsyncClient:
    """An asyncio client bound to one event loop, with its registered scripts."""

    client: Any
    scripts: dict[str, Any]


def _text_bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def _as_bytes(value: Any) -> bytes:
    """Normalise a Redis reply to bytes (integers come back as ``int``)."""
    return value if isinstance(value, bytes) else str(value).encode()


def _redact(url: str) -> str:
    """Return ``url`` without its password, for error messages."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable url>"
    if parts.password is None:
        return url
    netloc = f"{parts.username or ''}:***@{parts.hostname or ''}"
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _glob_escape(text: str) -> str:
    """Escape ``text`` for a Redis ``MATCH`` pattern."""
    return "".join("\\" + char if char in "*?[]\\" else char for char in text)


class RedisStreamCheckpointStore(StreamCheckpointStore):
    """Keeps checkpoints in Redis so that workers on several hosts can share them.

    Fencing is checked inside Redis by a Lua script, so a writer whose epoch is
    stale is refused even when it races the new owner from another host.
    ``claim`` is an ``INCR`` on a per-run counter that never expires: epochs stay
    strictly increasing after a delete or expiry. For the counters to survive a
    Redis restart too, run Redis with persistence (``appendonly yes``).

    Give either a ``url`` (the store creates, owns and closes its clients) or
    ready clients (borrowed; the store never closes them). With only a sync
    ``client``, the async methods run it in a worker thread.

    Example:
        ```python
        with RedisStreamCheckpointStore.from_url("redis://cache:6379/0", ttl=3600) as store:
            model = RecoveringChatModel(model=inner, checkpoint_store=store)
        ```

    Args:
        url: A ``redis://``, ``rediss://`` (TLS) or ``unix://`` URL.
        client: A ``redis.Redis`` to use instead of a URL (borrowed).
        async_client: A ``redis.asyncio.Redis`` for the async methods (borrowed).
        prefix: Namespace of every key the store writes (``{prefix}:{<run_id>}:...``).
        ttl: Seconds after its last write when a checkpoint expires (also set as
            the keys' Redis expiry), or ``None`` to keep checkpoints until deleted.
        max_checkpoint_bytes: Largest checkpoint (record plus text, in bytes) the
            store accepts.
        clock: Wall-clock time source for ``updated_at`` and expiry checks.
        username: Redis ACL user name, when the URL does not carry it.
        password: Redis password, when the URL does not carry it.
        ssl: Use TLS (also implied by a ``rediss://`` URL).
        ssl_ca_certs: CA bundle that verifies the server's certificate.
        ssl_certfile: Client certificate for mutual TLS.
        ssl_keyfile: Private key of ``ssl_certfile``.
        ssl_cert_reqs: Server certificate verification: ``"required"`` (default),
            ``"optional"`` or ``"none"``.
        socket_timeout: Seconds to wait for a reply before the call fails.
        socket_connect_timeout: Seconds to wait for a connection.
        retries: How often redis-py retries a command after a connection error or
            timeout (with short jittered backoff) before the store reports failure.
        **connection_kwargs: Any other ``redis.Redis`` keyword argument, passed
            through to the clients the store creates from ``url``.

    Raises:
        ValueError: If the settings are inconsistent (no connection, both a URL
            and clients, a prefix containing braces).
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        client: Any = None,
        async_client: Any = None,
        prefix: str = "awaken",
        ttl: float | None = None,
        max_checkpoint_bytes: int = DEFAULT_MAX_CHECKPOINT_BYTES,
        clock: Callable[[], float] = time.time,
        username: str | None = None,
        password: str | None = None,
        ssl: bool = False,
        ssl_ca_certs: str | None = None,
        ssl_certfile: str | None = None,
        ssl_keyfile: str | None = None,
        ssl_cert_reqs: str = "required",
        socket_timeout: float | None = 5.0,
        socket_connect_timeout: float | None = 5.0,
        retries: int = 3,
        **connection_kwargs: Any,
    ) -> None:
        super().__init__(ttl=ttl, max_checkpoint_bytes=max_checkpoint_bytes, clock=clock)
        if url is None and client is None and async_client is None:
            raise ValueError(
                "RedisStreamCheckpointStore needs a connection: pass url='redis://host:6379/0' "
                "or client=redis.Redis(...)"
            )
        if url is not None and (client is not None or async_client is not None):
            raise ValueError(
                "pass either url=... (the store owns its clients) or client=/async_client= "
                "(borrowed clients), not both"
            )
        if not prefix or "{" in prefix or "}" in prefix:
            raise ValueError(
                f"prefix must be a non-empty string without braces, got {prefix!r}; "
                "braces are reserved for the per-run hash tag"
            )
        for given in (client, async_client):
            pool = getattr(given, "connection_pool", None)
            if getattr(pool, "connection_kwargs", {}).get("decode_responses"):
                raise ValueError(
                    "the Redis client decodes responses; the store reads raw bytes, so "
                    "create the client with decode_responses=False (the default)"
                )
        if connection_kwargs.get("decode_responses"):
            raise ValueError("decode_responses=True is not supported; the store reads raw bytes")
        if retries < 0:
            raise ValueError(f"retries must be zero or more, got {retries!r}")
        self.prefix = prefix
        self.url = url
        self._where = _redact(url) if url is not None else "the given Redis client"
        self._client_kwargs: dict[str, Any] = dict(connection_kwargs)
        self._client_kwargs.update(
            socket_timeout=socket_timeout, socket_connect_timeout=socket_connect_timeout
        )
        if username is not None:
            self._client_kwargs["username"] = username
        if password is not None:
            self._client_kwargs["password"] = password
        if ssl or ssl_ca_certs or ssl_certfile or ssl_keyfile:
            self._client_kwargs.update(
                ssl_ca_certs=ssl_ca_certs,
                ssl_certfile=ssl_certfile,
                ssl_keyfile=ssl_keyfile,
                ssl_cert_reqs=ssl_cert_reqs,
            )
            if url is not None and urlsplit(url).scheme == "redis":
                self._client_kwargs["ssl"] = True
        self._retries = retries
        self._owns_clients = url is not None
        self._client: Any = client
        if url is not None:
            self._client = redis.Redis.from_url(
                url,
                retry=redis.retry.Retry(self._backoff(), retries),
                **self._client_kwargs,
            )
        self._scripts: dict[str, Any] = {}
        if self._client is not None:
            self._scripts = self._register(self._client)
        self._borrowed_async = (
            _AsyncClient(async_client, self._register(async_client))
            if async_client is not None
            else None
        )
        self._async_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _AsyncClient] = (
            weakref.WeakKeyDictionary()
        )
        self._memos: OrderedDict[str, _Memo] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> RedisStreamCheckpointStore:
        """Create a store that owns clients connected to ``url``.

        Use it as a context manager (``with ... as store``) to close the clients.

        Args:
            url: A ``redis://``, ``rediss://`` or ``unix://`` URL.
            **kwargs: Any keyword argument of the constructor.
        """
        return cls(url, **kwargs)

    # -- keys and clients -----------------------------------------------------

    def _keys(self, run_id: str) -> tuple[bytes, bytes, bytes]:
        base = _text_bytes(f"{self.prefix}:{{{run_id}}}:")
        return base + b"head", base + b"text", base + b"epoch"

    def _run_id_of(self, head_key: bytes) -> str:
        start = len(_text_bytes(self.prefix)) + 2
        return head_key[start : -len(b"}:head")].decode("utf-8", "surrogatepass")

    @staticmethod
    def _backoff() -> Any:
        return redis.backoff.EqualJitterBackoff(cap=0.25, base=0.01)

    @staticmethod
    def _register(client: Any) -> dict[str, Any]:
        return {
            "put": client.register_script(_PUT_SCRIPT),
            "get": client.register_script(_GET_SCRIPT),
            "delete": client.register_script(_DELETE_SCRIPT),
            "gc": client.register_script(_GC_SCRIPT),
        }

    def _sync(self) -> tuple[Any, dict[str, Any]]:
        if self._client is None:
            raise StreamCheckpointError(
                "this RedisStreamCheckpointStore has only an async_client; use the async "
                "methods (aget, aput, ...) or also pass client=redis.Redis(...)"
            )
        return self._client, self._scripts

    def _async(self) -> _AsyncClient | None:
        """Return the asyncio client for the running loop, or ``None`` to use threads."""
        if self._borrowed_async is not None:
            return self._borrowed_async
        if self.url is None:
            return None
        loop = asyncio.get_running_loop()
        bound = self._async_clients.get(loop)
        if bound is None:
            client = redis.asyncio.Redis.from_url(
                self.url,
                retry=redis.asyncio.retry.Retry(self._backoff(), self._retries),
                **self._client_kwargs,
            )
            bound = _AsyncClient(client, self._register(client))
            self._async_clients[loop] = bound
        return bound

    @contextlib.contextmanager
    def _errors(self, action: str, run_id: str | None) -> Iterator[None]:
        """Turn any Redis or network failure into a ``StreamCheckpointError``."""
        try:
            yield
        except StreamCheckpointError:
            raise
        except _REDIS_ERRORS as exc:
            raise StreamCheckpointError(
                f"Redis {action} failed at {self._where} (check the server, and the "
                "url/password/ssl settings of RedisStreamCheckpointStore)",
                run_id=run_id,
                cause=exc,
            ) from exc

    # -- pure parts shared by the sync and async twins ------------------------

    def _expiry_ms(self) -> bytes:
        if self.ttl is None:
            return b""
        return str(max(1, math.ceil(self.ttl * 1000))).encode()

    def _memo(self, run_id: str) -> _Memo | None:
        with self._lock:
            return self._memos.get(run_id)

    def _remember(self, run_id: str, memo: _Memo | None) -> None:
        with self._lock:
            if memo is None:
                self._memos.pop(run_id, None)
                return
            self._memos[run_id] = memo
            self._memos.move_to_end(run_id)
            while len(self._memos) > _MEMO_LIMIT:
                self._memos.popitem(last=False)

    def _plan_put(self, checkpoint: StreamCheckpoint, *, full: bool) -> _PutPlan:
        """Encode a put: a delta append when the text extends what was last written."""
        if not isinstance(checkpoint, StreamCheckpoint):
            raise StreamCheckpointError(
                f"put() takes a StreamCheckpoint, got {type(checkpoint).__name__}"
            )
        run_id = checkpoint.run_id
        now = float(self.clock())
        stamped = checkpoint.model_copy(update={"updated_at": now})
        head = stamped.model_dump(mode="json")
        text = head.pop("partial_text")
        record = encode_json(head)
        memo = None if full else self._memo(run_id)
        if memo is not None and text.startswith(memo.text):
            mode: Literal["full", "append"] = "append"
            payload = _text_bytes(text[len(memo.text) :])
            generation = memo.generation
            expected = str(memo.text_bytes).encode()
            text_bytes = memo.text_bytes + len(payload)
        else:
            mode = "full"
            payload = _text_bytes(text)
            generation = secrets.token_hex(8).encode()
            expected = b""
            text_bytes = len(payload)
        size = len(record) + text_bytes
        if size > self.max_checkpoint_bytes:
            raise StreamCheckpointError(
                f"checkpoint is {size} bytes, more than max_checkpoint_bytes="
                f"{self.max_checkpoint_bytes}; raise max_checkpoint_bytes to store it",
                run_id=run_id,
            )
        args = (
            str(checkpoint.epoch).encode(),
            mode.encode(),
            record,
            payload,
            generation,
            expected,
            repr(now).encode(),
            self._expiry_ms(),
        )
        return _PutPlan(mode, args, _Memo(generation, text, text_bytes))

    def _check_fencing(self, run_id: str, epoch: int, reply: Any) -> bool:
        """Raise on a fencing refusal; return whether the script wrote."""
        status = _as_bytes(reply[0])
        if status == b"ok":
            return True
        current = int(reply[1])
        if status == b"fenced":
            self._remember(run_id, None)
            raise StreamCheckpointFencedError(run_id, epoch=epoch, current_epoch=current)
        if status == b"unclaimed":
            self._remember(run_id, None)
            raise StreamCheckpointError(
                f"epoch {epoch} was never returned by claim() for this run (its current "
                f"epoch is {current}); call claim(run_id) and write with the epoch it returns",
                run_id=run_id,
            )
        if status == b"resend":
            return False
        raise StreamCheckpointError(f"unexpected reply from Redis: {reply!r}", run_id=run_id)

    def _decode(self, run_id: str, reply: Any) -> StreamCheckpoint | None:
        if not reply:
            return None
        record, text, text_bytes = (_as_bytes(part) for part in reply)
        if len(text) != int(text_bytes):
            raise StreamCheckpointError(
                f"stored checkpoint is corrupted (text is {len(text)} bytes, its head "
                f"says {int(text_bytes)})",
                run_id=run_id,
            )
        data = decode_json(record, run_id=run_id)
        if not isinstance(data, dict):
            raise StreamCheckpointError(
                "stored checkpoint is corrupted (record is not a JSON object)", run_id=run_id
            )
        try:
            data["partial_text"] = text.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError as exc:
            raise StreamCheckpointError(
                "stored checkpoint is corrupted (text is not UTF-8)", run_id=run_id, cause=exc
            ) from exc
        checkpoint = checkpoint_from_dict(data, run_id=run_id)
        if checkpoint.run_id != run_id:
            raise StreamCheckpointError(
                f"stored checkpoint is corrupted (it belongs to run {checkpoint.run_id!r})",
                run_id=run_id,
            )
        if self.is_expired(checkpoint.updated_at):
            return None
        return checkpoint

    def _live_run_ids(self, head_keys: list[bytes], stamps: list[Any]) -> list[str]:
        return [
            self._run_id_of(key)
            for key, stamp in zip(head_keys, stamps, strict=True)
            if stamp is not None and not self.is_expired(float(_as_bytes(stamp)))
        ]

    def _expired(self, head_keys: list[bytes], stamps: list[Any]) -> list[tuple[bytes, bytes]]:
        return [
            (key, _as_bytes(stamp))
            for key, stamp in zip(head_keys, stamps, strict=True)
            if stamp is not None and self.is_expired(float(_as_bytes(stamp)))
        ]

    def _head_pattern(self) -> bytes:
        return _text_bytes(_glob_escape(self.prefix) + ":{*}:head")

    # -- the contract (sync) ---------------------------------------------------

    def get(self, run_id: str) -> StreamCheckpoint | None:
        """Return the run's checkpoint, or ``None`` if there is none or it expired."""
        check_run_id(run_id)
        _, scripts = self._sync()
        head, text, _ = self._keys(run_id)
        with self._errors("read", run_id):
            reply = scripts["get"](keys=[head, text])
        return self._decode(run_id, reply)

    def put(self, checkpoint: StreamCheckpoint) -> None:
        """Store the checkpoint, sending only the new text when it extends the last put.

        Raises:
            StreamCheckpointFencedError: If ``checkpoint.epoch`` is older than the
                run's current epoch.
            StreamCheckpointError: If the epoch was never claimed, the checkpoint
                is too large, or Redis fails.
        """
        _, scripts = self._sync()
        plan = self._plan_put(checkpoint, full=False)
        run_id = checkpoint.run_id
        keys = self._keys(run_id)
        with self._errors("write", run_id):
            try:
                reply = scripts["put"](keys=keys, args=plan.args)
                if not self._check_fencing(run_id, checkpoint.epoch, reply):
                    plan = self._plan_put(checkpoint, full=True)
                    reply = scripts["put"](keys=keys, args=plan.args)
                    self._check_fencing(run_id, checkpoint.epoch, reply)
            except _REDIS_ERRORS:
                self._remember(run_id, None)
                raise
        self._remember(run_id, plan.memo)

    def delete(self, run_id: str, *, epoch: int | None = None) -> None:
        """Delete the run's checkpoint; a missing checkpoint is not an error.

        Raises:
            StreamCheckpointFencedError: If ``epoch`` is older than the run's epoch.
            StreamCheckpointError: If ``epoch`` was never claimed, or Redis fails.
        """
        check_run_id(run_id)
        _, scripts = self._sync()
        head, text, counter = self._keys(run_id)
        self._remember(run_id, None)
        with self._errors("delete", run_id):
            reply = scripts["delete"](
                keys=[head, text, counter], args=[b"" if epoch is None else str(epoch).encode()]
            )
        self._check_fencing(run_id, -1 if epoch is None else epoch, reply)

    def claim(self, run_id: str) -> int:
        """Take ownership of a run and return its new epoch (an atomic ``INCR``)."""
        check_run_id(run_id)
        client, _ = self._sync()
        with self._errors("claim", run_id):
            return int(client.incr(self._keys(run_id)[2]))

    def list_run_ids(self) -> list[str]:
        """Return the run ids that have an unexpired checkpoint (``SCAN`` on the prefix)."""
        return sorted(
            run_id
            for keys, stamps in self._scan_heads()
            for run_id in self._live_run_ids(keys, stamps)
        )

    def gc(self) -> int:
        """Remove checkpoints older than ``ttl`` by the store's clock; return how many.

        Redis also expires them by itself; this catches records that the store's
        clock considers expired earlier (an injected clock, a skewed host).
        """
        if self.ttl is None:
            return 0
        _, scripts = self._sync()
        removed = 0
        for head_keys, stamps in self._scan_heads():
            for head, stamp in self._expired(head_keys, stamps):
                with self._errors("gc", self._run_id_of(head)):
                    if scripts["gc"](keys=[head, head[: -len(b"head")] + b"text"], args=[stamp]):
                        removed += 1
        return removed

    def _scan_heads(self) -> Iterator[tuple[list[bytes], list[Any]]]:
        """Yield batches of (head keys, their updated_at) under the prefix."""
        client, _ = self._sync()
        with self._errors("scan", None):
            batch: list[bytes] = []
            for key in client.scan_iter(match=self._head_pattern(), count=_SCAN_BATCH):
                batch.append(_as_bytes(key))
                if len(batch) >= _SCAN_BATCH:
                    yield batch, self._stamps(client, batch)
                    batch = []
            if batch:
                yield batch, self._stamps(client, batch)

    @staticmethod
    def _stamps(client: Any, keys: list[bytes]) -> list[Any]:
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.hget(key, "updated_at")
        return list(pipe.execute())

    def close(self) -> None:
        """Close the clients the store created from its URL (borrowed ones stay open)."""
        if self._owns_clients and self._client is not None:
            with self._errors("close", None):
                self._client.close()

    # -- async twins on redis.asyncio ------------------------------------------

    async def aget(self, run_id: str) -> StreamCheckpoint | None:
        """Async twin of :meth:`get`."""
        bound = self._async()
        if bound is None:
            return await super().aget(run_id)
        check_run_id(run_id)
        head, text, _ = self._keys(run_id)
        with self._errors("read", run_id):
            reply = await bound.scripts["get"](keys=[head, text])
        return self._decode(run_id, reply)

    async def aput(self, checkpoint: StreamCheckpoint) -> None:
        """Async twin of :meth:`put`."""
        bound = self._async()
        if bound is None:
            return await super().aput(checkpoint)
        plan = self._plan_put(checkpoint, full=False)
        run_id = checkpoint.run_id
        keys = self._keys(run_id)
        with self._errors("write", run_id):
            try:
                reply = await bound.scripts["put"](keys=keys, args=plan.args)
                if not self._check_fencing(run_id, checkpoint.epoch, reply):
                    plan = self._plan_put(checkpoint, full=True)
                    reply = await bound.scripts["put"](keys=keys, args=plan.args)
                    self._check_fencing(run_id, checkpoint.epoch, reply)
            except _REDIS_ERRORS:
                self._remember(run_id, None)
                raise
        self._remember(run_id, plan.memo)
        return None

    async def adelete(self, run_id: str, *, epoch: int | None = None) -> None:
        """Async twin of :meth:`delete`."""
        bound = self._async()
        if bound is None:
            return await super().adelete(run_id, epoch=epoch)
        check_run_id(run_id)
        head, text, counter = self._keys(run_id)
        self._remember(run_id, None)
        with self._errors("delete", run_id):
            reply = await bound.scripts["delete"](
                keys=[head, text, counter], args=[b"" if epoch is None else str(epoch).encode()]
            )
        self._check_fencing(run_id, -1 if epoch is None else epoch, reply)
        return None

    async def aclaim(self, run_id: str) -> int:
        """Async twin of :meth:`claim`."""
        bound = self._async()
        if bound is None:
            return await super().aclaim(run_id)
        check_run_id(run_id)
        with self._errors("claim", run_id):
            return int(await bound.client.incr(self._keys(run_id)[2]))

    async def aclose(self) -> None:
        """Close the clients the store created, including this event loop's async one."""
        if self._owns_clients:
            bound = self._async_clients.pop(asyncio.get_running_loop(), None)
            if bound is not None:
                with self._errors("close", None):
                    await bound.client.aclose()
        self.close()
