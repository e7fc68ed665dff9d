"""A checkpoint store on Redis, for workers spread over several hosts.

Each run is kept under three keys sharing one hash tag, so that they live in one
cluster slot and one Lua script can touch them all::

    <prefix>:{<run_id>}:head    hash: "head" (the JSON head, see stores/_base.py)
                                and "write_id" (the write that produced it)
    <prefix>:{<run_id>}:text    string: the partial text as UTF-8, appended in place
    <prefix>:{<run_id>}:epoch   integer: the fencing counter (see "Epoch horizon")

Every write is one Lua script that compares the writer's epoch with the counter
and only then touches the head and text, so a stale writer on another host is
refused even when it races the new owner. A put that extends the text sends
only the new characters (``APPEND``), and only if the stored ``write_id`` and
text length are still the ones the writer remembers. Checkpoint keys carry the
store's ``ttl`` as their Redis expiry.

Epoch horizon
-------------

Redis expires keys on its own, so no step of the store sees a counter go and
could raise a floor the way the embedded stores do (stores/_base.py), and a
cluster has no key that every run's script may touch. The floor is the clock
instead, in milliseconds of the store's ``clock``:

- ``claim`` returns ``max(counter + 1, now_ms)``;
- every claim, put and delete sets the counter's expiry to
  ``max(checkpoint's remaining ttl, epoch - now_ms) + epoch_grace``: the counter
  lives while the checkpoint does (no expiry while the checkpoint has none),
  then ``epoch_grace`` longer, and always until the clock has passed its value
  by ``epoch_grace``.

So when a counter expires, the clock of the host that last touched it reads at
least ``counter + epoch_grace`` ms; a later claim from any host whose clock lags
that one by less than ``epoch_grace`` (one hour by default) returns a larger
epoch than any handed out before. A stale writer finds either no counter (its
epoch is refused as never claimed) or a larger one (it is fenced). The
assumption, to be kept by NTP: the clocks of the hosts sharing a store, and any
step a clock takes backwards, stay within ``epoch_grace`` of each other.

Values are JSON text encoded by this library; nothing is ever pickled.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import urlsplit

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

from awaken_langchain._secrets import redact
from awaken_langchain.checkpoint import (
    DEFAULT_MAX_CHECKPOINT_BYTES,
    DeferredCheckpoint,
    StreamCheckpoint,
    check_run_id,
)
from awaken_langchain.errors import StreamCheckpointError
from awaken_langchain.stores._base import (
    DEFAULT_EPOCH_GRACE,
    DeltaCheckpointStore,
    Head,
    LastWrite,
    PerLoop,
    PutPlan,
    check_epoch,
    connection_failure,
    decode_head,
    run_id_bytes,
)

__all__ = ["RedisStreamCheckpointStore"]

_REDIS_ERRORS: tuple[type[BaseException], ...] = (
    redis.exceptions.RedisError,
    redis.exceptions.RedisClusterException,
    OSError,
    TimeoutError,
)
"""What a Redis call raises when the server, network or data fails."""

try:  # a client of valkey (redis-py's fork, a drop-in) raises its own copies of them
    import valkey.exceptions
except ImportError:
    pass
else:
    _REDIS_ERRORS += (valkey.exceptions.ValkeyError, valkey.exceptions.ValkeyClusterException)

_SCAN_BATCH = 500

ASYNC_MAX_CONNECTIONS = 100
"""Connections the async client of one event loop opens at most; further calls wait."""
"""``COUNT`` hint for ``SCAN``, and how many heads are fetched per round trip."""

# keep_counter(head, counter, epoch, now_ms, grace_ms): set the counter's expiry
# (see "Epoch horizon"); a missing counter is left missing.
_KEEP_COUNTER = """
local function keep_counter(head, counter, epoch, now, grace)
  local left = redis.call('PTTL', head)
  if left == -1 then
    redis.call('PERSIST', counter)
    return
  end
  if left < 0 then left = 0 end
  if epoch - now > left then left = epoch - now end
  redis.call('PEXPIRE', counter, string.format('%.0f', left + grace))
end
"""

# KEYS: head, text, epoch counter; ARGV: now in ms, epoch_grace in ms.
# Returns the new epoch, max(counter + 1, now), as a decimal string.
_CLAIM = (
    _KEEP_COUNTER
    + """
local current = tonumber(redis.call('GET', KEYS[3]) or '0')
if not current then return redis.error_reply('epoch counter is not an integer') end
local now = tonumber(ARGV[1])
local epoch = math.max(current + 1, now)
redis.call('SET', KEYS[3], string.format('%.0f', epoch))
keep_counter(KEYS[1], KEYS[3], epoch, now, tonumber(ARGV[2]))
return string.format('%.0f', epoch)
"""
)

# KEYS: head, text, epoch counter
# ARGV: epoch, mode ("replace" | "append"), head JSON, text or delta, write_id,
#       expected write_id and text length (append only), expiry in ms ("" for none),
#       now in ms, epoch_grace in ms
# Returns {"ok" | "refused" (epoch differs from the counter) | "changed"
#          (append only: the stored text is not the one expected), counter}.
_PUT = (
    _KEEP_COUNTER
    + """
local current = tonumber(redis.call('GET', KEYS[3]) or '0')
if not current then return redis.error_reply('epoch counter is not an integer') end
if tonumber(ARGV[1]) ~= current then return {'refused', current} end
if ARGV[2] == 'append' then
  if redis.call('HGET', KEYS[1], 'write_id') ~= ARGV[6]
      or redis.call('STRLEN', KEYS[2]) ~= tonumber(ARGV[7]) then
    return {'changed', current}
  end
  redis.call('APPEND', KEYS[2], ARGV[4])
else
  redis.call('SET', KEYS[2], ARGV[4])
end
redis.call('HSET', KEYS[1], 'head', ARGV[3], 'write_id', ARGV[5])
if ARGV[8] ~= '' then
  redis.call('PEXPIRE', KEYS[1], ARGV[8])
  redis.call('PEXPIRE', KEYS[2], ARGV[8])
else
  redis.call('PERSIST', KEYS[1])
  redis.call('PERSIST', KEYS[2])
end
keep_counter(KEYS[1], KEYS[3], current, tonumber(ARGV[9]), tonumber(ARGV[10]))
return {'ok', current}
"""
)

# KEYS: head, text. Returns false, or {head JSON, text}: one consistent snapshot.
_LOAD = """
local head = redis.call('HGET', KEYS[1], 'head')
if not head then return false end
return {head, redis.call('GET', KEYS[2]) or ''}
"""

# KEYS: head, text, epoch counter
# ARGV: epoch ("" deletes unconditionally), write_id ("" for any), now in ms,
#       epoch_grace in ms
# Returns {"ok" | "refused", counter or number of keys deleted}.
_DELETE = (
    _KEEP_COUNTER
    + """
local current = tonumber(redis.call('GET', KEYS[3]) or '0')
if ARGV[1] ~= '' then
  if not current then return redis.error_reply('epoch counter is not an integer') end
  if tonumber(ARGV[1]) ~= current then return {'refused', current} end
end
if ARGV[2] ~= '' and redis.call('HGET', KEYS[1], 'write_id') ~= ARGV[2] then
  return {'ok', 0}
end
local deleted = redis.call('DEL', KEYS[1], KEYS[2])
if current then keep_counter(KEYS[1], KEYS[3], current, tonumber(ARGV[3]), tonumber(ARGV[4])) end
return {'ok', deleted}
"""
)

# KEYS: head, epoch counter; ARGV: now in ms, epoch_grace in ms.
# Gives a counter left without expiry by an older release an expiry, when its
# run has no checkpoint. Returns 1 if it did.
_ADOPT = (
    _KEEP_COUNTER
    + """
if redis.call('PTTL', KEYS[2]) ~= -1 or redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local current = tonumber(redis.call('GET', KEYS[2]))
if not current then return 0 end
keep_counter(KEYS[1], KEYS[2], current, tonumber(ARGV[1]), tonumber(ARGV[2]))
return 1
"""
)


@dataclass
class _Client:
    """A Redis client with the store's scripts registered on it."""

    client: Any
    put: Any
    load: Any
    delete: Any
    claim: Any
    adopt: Any

    @classmethod
    def wrap(cls, client: Any) -> _Client:
        register = client.register_script
        return cls(
            client,
            register(_PUT),
            register(_LOAD),
            register(_DELETE),
            register(_CLAIM),
            register(_ADOPT),
        )


def _glob_escape(text: str) -> str:
    """Escape ``text`` for a Redis ``MATCH`` pattern."""
    return "".join("\\" + char if char in "*?[]\\" else char for char in text)


def _decodes_responses(client: Any) -> bool:
    pool = getattr(client, "connection_pool", None)
    return bool(getattr(pool, "connection_kwargs", {}).get("decode_responses"))


class RedisStreamCheckpointStore(DeltaCheckpointStore):
    """Keeps checkpoints in Redis so that workers on several hosts can share them.

    Fencing is checked inside Redis by a Lua script, so a writer whose epoch is
    stale is refused even when it races the new owner from another host.
    ``claim`` returns ``max(counter + 1, now in ms)`` and the per-run counter
    expires ``epoch_grace`` after the run's checkpoint and after the clock has
    passed it, so epochs stay strictly increasing after a delete or expiry while
    nothing stays in Redis forever. For counters and checkpoints to survive a
    Redis restart too, run Redis with persistence (``appendonly yes``).

    Give either a ``url`` (the store creates, owns and closes its clients; the
    async methods get one ``redis.asyncio`` client per event loop) or ready
    clients (borrowed: the store never closes them). With only a sync
    ``client``, the async methods run it in a worker thread. An event loop's
    async client is closed when the loop shuts down (``asyncio.run`` does that
    on return), or earlier by ``async with`` / ``await store.aclose()``; a store
    used from many short-lived loops holds no connection of a loop that ended.

    Example:
        ```python
        store = RedisStreamCheckpointStore.from_url("redis://cache:6379/0", ttl=3600)
        ```

    Args:
        url: A ``redis://``, ``rediss://`` (TLS) or ``unix://`` URL.
        client: A ``redis.Redis`` to use instead of a URL (borrowed).
        async_client: A ``redis.asyncio.Redis`` for the async methods (borrowed).
        prefix: Namespace of every key the store writes: ``<prefix>:{<run_id>}:...``
            (the braces are literal, a Redis hash tag).
        ttl: Seconds after its last write when a checkpoint expires (also set as
            the keys' Redis expiry), or ``None`` to keep checkpoints until deleted.
        max_checkpoint_bytes: Largest encoded checkpoint the store accepts.
        clock: Wall-clock time source for ``updated_at`` and expiry checks.
        username: Redis ACL user name, when the URL does not carry it.
        password: Redis password, when the URL does not carry it.
        ssl: Use TLS (also implied by a ``rediss://`` URL or any ``ssl_*`` file).
        ssl_ca_certs: CA bundle that verifies the server's certificate.
        ssl_certfile: Client certificate for mutual TLS.
        ssl_keyfile: Private key of ``ssl_certfile``.
        ssl_cert_reqs: Server certificate check: ``"required"``, ``"optional"``
            or ``"none"``.
        socket_timeout: Seconds to wait for a reply before a call fails.
        socket_connect_timeout: Seconds to wait for a connection.
        retries: How often a command is retried after a connection error or a
            timeout (with a short jittered backoff) before the store reports it.
        epoch_grace: Seconds a run's epoch counter outlives its checkpoint, and
            the clock must pass the counter's value, before the counter expires
            (see "Epoch horizon" in the module docstring).
        signing_key: Key that signs every record this store writes and must
            verify every record it reads; ``None`` reads the
            ``AWAKEN_CHECKPOINT_SIGNING_KEY`` environment variable (unset: no
            signing). See "Trust model and signing" in docs/stores.md.
        **connection_kwargs: Any other ``redis.Redis.from_url`` keyword, passed
            to the clients the store creates.

    Raises:
        ValueError: If the settings are inconsistent: no connection, both a URL
            and clients, a client that decodes responses, or braces in ``prefix``.
    """

    takes_deferred: ClassVar[bool] = True
    """Its puts take a stream's captures unbuilt (see `StreamCheckpointStore.takes_deferred`)."""

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
        epoch_grace: float = DEFAULT_EPOCH_GRACE,
        signing_key: str | bytes | None = None,
        **connection_kwargs: Any,
    ) -> None:
        super().__init__(
            ttl=ttl,
            max_checkpoint_bytes=max_checkpoint_bytes,
            clock=clock,
            epoch_grace=epoch_grace,
            signing_key=signing_key,
        )
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
        if retries < 0:
            raise ValueError(f"retries must be zero or more, got {retries!r}")
        if connection_kwargs.get("decode_responses") or any(
            _decodes_responses(given) for given in (client, async_client)
        ):
            raise ValueError(
                "the store reads raw bytes: create the Redis client with "
                "decode_responses=False (the default)"
            )
        self.prefix = prefix
        self._grace_ms = str(math.ceil(self.epoch_grace * 1000)).encode()
        self._where = redact(url) if url is not None else "the given Redis client"
        self._prefix_bytes = run_id_bytes(prefix)
        options: dict[str, Any] = {
            **connection_kwargs,
            "socket_timeout": socket_timeout,
            "socket_connect_timeout": socket_connect_timeout,
        }
        if username is not None:
            options["username"] = username
        if password is not None:
            options["password"] = password
        tls = ssl or any((ssl_ca_certs, ssl_certfile, ssl_keyfile))
        if url is None and (tls or username or password or connection_kwargs):
            raise ValueError(
                "connection settings (username, password, ssl..., other keywords) apply only "
                "to clients the store creates from url=; set them on the client you pass"
            )
        if tls and url is not None:
            scheme = urlsplit(url).scheme
            if scheme not in ("redis", "rediss"):
                raise ValueError(f"TLS needs a redis:// or rediss:// URL, got {scheme}://")
            url = "rediss" + url[len(scheme) :]
            options.update(
                ssl_ca_certs=ssl_ca_certs,
                ssl_certfile=ssl_certfile,
                ssl_keyfile=ssl_keyfile,
                ssl_cert_reqs=ssl_cert_reqs,
            )
        self.url = url
        self._options = options
        self._retries = retries
        self._owns_clients = url is not None
        if url is not None:
            client = redis.Redis.from_url(
                url, retry=redis.retry.Retry(self._backoff(), retries), **options
            )
        self._sync = _Client.wrap(client) if client is not None else None
        self._borrowed_async = _Client.wrap(async_client) if async_client is not None else None
        self._loop_clients: PerLoop[_Client] = PerLoop(lambda bound: bound.client.aclose())

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> RedisStreamCheckpointStore:
        """Create a store that owns clients connected to ``url``.

        Use it as a context manager (``with ... as store``) to close them.

        Args:
            url: A ``redis://``, ``rediss://`` or ``unix://`` URL.
            **kwargs: Any keyword argument of the constructor.
        """
        return cls(url, **kwargs)

    # -- keys, clients, errors ----------------------------------------------------

    def _keys(self, run_id: str) -> tuple[bytes, bytes, bytes]:
        """Return the run's head, text and epoch counter keys."""
        base = self._prefix_bytes + b":{" + run_id_bytes(run_id) + b"}:"
        return base + b"head", base + b"text", base + b"epoch"

    def _run_id_of(self, head_key: bytes) -> str:
        return head_key[len(self._prefix_bytes) + 2 : -len(b"}:head")].decode(
            "utf-8", "surrogatepass"
        )

    @staticmethod
    def _backoff() -> Any:
        return redis.backoff.EqualJitterBackoff(cap=0.25, base=0.01)

    def _client(self) -> _Client:
        if self._sync is None:
            raise StreamCheckpointError(
                "this RedisStreamCheckpointStore was given only an async_client; use the "
                "async methods (aget, aput, ...) or also pass client=redis.Redis(...)"
            )
        return self._sync

    async def _async_client(self) -> _Client | None:
        """Return the asyncio client for the running loop, or ``None`` to use threads.

        A client the store creates belongs to one event loop and is closed when
        that loop shuts down (see `PerLoop`).
        """
        if self._borrowed_async is not None:
            return self._borrowed_async
        if self.url is None:
            return None
        return await self._loop_clients.get(self._new_async_client)

    async def _new_async_client(self) -> _Client:
        # A blocking pool: past its size, a call waits for a free connection
        # (up to the socket timeout) instead of failing with "Too many
        # connections", which the default pool does once more than 100
        # turns of one event loop write at the same moment.
        assert self.url is not None  # only a store with a URL makes its own clients
        timeout = self._options.get("socket_timeout")
        pool: Any = redis.asyncio.BlockingConnectionPool.from_url(
            self.url,
            max_connections=ASYNC_MAX_CONNECTIONS,
            timeout=timeout if timeout is not None else 5.0,
            retry=redis.asyncio.retry.Retry(self._backoff(), self._retries),
            **self._options,
        )
        client = redis.asyncio.Redis(connection_pool=pool)
        client.auto_close_connection_pool = True  # aclose() closes the pool it owns
        return _Client.wrap(client)

    def _expiry_ms(self) -> bytes:
        return b"" if self.ttl is None else str(max(1, math.ceil(self.ttl * 1000))).encode()

    def _backend_error(
        self, action: str, run_id: str | None, exc: Exception
    ) -> StreamCheckpointError:
        """Redis failures say where and what to check."""
        if not isinstance(exc, _REDIS_ERRORS):
            return super()._backend_error(action, run_id, exc)
        error = connection_failure(
            f"Redis {action} failed at {self._where} (check that the server is up, "
            "and the url, password and ssl settings of RedisStreamCheckpointStore)",
            exc,
            run_id=run_id,
            spec=self.url,
        )
        error.__cause__ = None  # raised "from None"
        return error

    # -- script calls, shared by the sync and async paths ---------------------------

    def _put_args(
        self, head: Head, payload: bytes, epoch: int, expect: LastWrite | None
    ) -> list[bytes]:
        return [
            str(epoch).encode(),
            b"replace" if expect is None else b"append",
            head.encode(),
            payload,
            head.write_id.encode(),
            b"" if expect is None else expect.write_id.encode(),
            b"" if expect is None else str(expect.text_bytes).encode(),
            self._expiry_ms(),
            *self._clock_args(),
        ]

    def _clock_args(self) -> list[bytes]:
        """The ``now`` and ``epoch_grace`` arguments of the scripts, in milliseconds."""
        return [str(math.floor(self.clock() * 1000)).encode(), self._grace_ms]

    @staticmethod
    def _put_result(head: Head, epoch: int, reply: Any) -> Head | None:
        """Return the head a write stored, or ``None`` if the text had changed."""
        status, current = bytes(reply[0]), int(reply[1])
        if status == b"refused":
            check_epoch(head.run_id, epoch, current, action="put")
        return head if status == b"ok" else None

    def _delete_args(self, epoch: int | None, write_id: str | None) -> list[bytes]:
        return [
            b"" if epoch is None else str(epoch).encode(),
            b"" if write_id is None else write_id.encode(),
            *self._clock_args(),
        ]

    @staticmethod
    def _delete_result(run_id: str, epoch: int | None, reply: Any) -> bool:
        status, value = bytes(reply[0]), int(reply[1])
        if status == b"refused" and epoch is not None:
            check_epoch(run_id, epoch, value, action="delete")
        return value > 0

    @staticmethod
    def _loaded(run_id: str, reply: Any) -> tuple[Head, bytes] | None:
        if not reply:
            return None
        return decode_head(bytes(reply[0]), run_id=run_id), bytes(reply[1])

    # -- backend primitives (sync) ---------------------------------------------------

    def _backend_claim(self, run_id: str) -> int:
        return int(self._client().claim(keys=self._keys(run_id), args=self._clock_args()))

    def _backend_collect_epochs(self) -> None:
        """Give counters left without expiry by an older release one; Redis does the rest."""
        bound = self._client()
        match = run_id_bytes(_glob_escape(self.prefix) + ":{*}:epoch")
        for key in bound.client.scan_iter(match=match, count=_SCAN_BATCH):
            head = bytes(key)[: -len(b"epoch")] + b"head"
            bound.adopt(keys=[head, bytes(key)], args=self._clock_args())

    def _backend_replace(self, head: Head, text: bytes, epoch: int) -> Head:
        reply = self._client().put(
            keys=self._keys(head.run_id), args=self._put_args(head, text, epoch, None)
        )
        stored = self._put_result(head, epoch, reply)
        assert stored is not None  # a replace is never conditional
        return stored

    def _backend_append(
        self, head: Head, delta: bytes, epoch: int, expect: LastWrite
    ) -> Head | None:
        reply = self._client().put(
            keys=self._keys(head.run_id), args=self._put_args(head, delta, epoch, expect)
        )
        return self._put_result(head, epoch, reply)

    def _backend_load(self, run_id: str) -> tuple[Head, bytes] | None:
        return self._loaded(run_id, self._client().load(keys=self._keys(run_id)[:2]))

    def _backend_delete(
        self, run_id: str, epoch: int | None, condition: Callable[[Head], bool] | None
    ) -> bool:
        client = self._client()
        write_id = None
        if condition is not None:
            # Decide on the head as it is now; the script deletes only if no
            # write has replaced it since (compare-and-delete on its write_id).
            loaded = self._backend_load(run_id)
            if loaded is None or not condition(loaded[0]):
                return False
            write_id = loaded[0].write_id
        reply = client.delete(keys=self._keys(run_id), args=self._delete_args(epoch, write_id))
        return self._delete_result(run_id, epoch, reply)

    def _backend_heads(self) -> Iterable[tuple[str, bytes]]:
        client = self._client().client
        match = run_id_bytes(_glob_escape(self.prefix) + ":{*}:head")
        batch: list[bytes] = []
        for key in client.scan_iter(match=match, count=_SCAN_BATCH):
            batch.append(bytes(key))
            if len(batch) >= _SCAN_BATCH:
                yield from self._heads_of(client, batch)
                batch = []
        if batch:
            yield from self._heads_of(client, batch)

    def _heads_of(self, client: Any, keys: list[bytes]) -> Iterator[tuple[str, bytes]]:
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.hget(key, "head")
        # One key of another type (WRONGTYPE) must not hide the others: it is listed
        # as unreadable, and get() of its run id says why.
        for key, raw in zip(keys, pipe.execute(raise_on_error=False), strict=True):
            if isinstance(raw, Exception):
                yield self._run_id_of(key), b""
            elif raw is not None:  # expired or deleted since the scan saw it
                yield self._run_id_of(key), bytes(raw)

    def close(self) -> None:
        """Close the sync client the store created from its URL (borrowed ones stay open)."""
        if self._owns_clients and self._sync is not None:
            with self._backend_errors("close", None):
                self._sync.client.close()

    # -- group commit -------------------------------------------------------------------

    def put_many(
        self, checkpoints: Sequence[StreamCheckpoint | DeferredCheckpoint]
    ) -> list[StreamCheckpointError | None]:
        """Store several runs' checkpoints in one pipelined round trip (group commit).

        Each checkpoint is written by the same script as `put`, which fences it
        on the server; the scripts of the batch go in one pipeline (not a
        transaction: each script is atomic on its own). An append the server
        refuses because someone else wrote the run since is rewritten in a
        second round trip. One checkpoint's refusal never stops the others; a
        connection failure is reported for every checkpoint not yet written.
        A cluster client writes them one by one.

        Returns:
            For each checkpoint, in order, ``None`` or the error its put raised.
        """
        if not checkpoints:
            return []
        try:
            bound = self._client()
        except StreamCheckpointError as exc:
            return [exc] * len(checkpoints)
        if not isinstance(bound.client, redis.Redis):
            return super().put_many(checkpoints)
        errors: list[StreamCheckpointError | None] = [None] * len(checkpoints)
        pending: list[tuple[int, PutPlan, Head, bytes, LastWrite | None]] = []
        for index, checkpoint in enumerate(checkpoints):
            try:
                plan = self._prepare_put(checkpoint)
                append = self._append_step(plan)
                if append is not None and plan.last is not None:
                    pending.append((index, plan, *append, plan.last))
                else:
                    pending.append((index, plan, *self._rewrite_step(plan), None))
            except StreamCheckpointError as exc:
                errors[index] = exc
        while pending:
            pipe = bound.client.pipeline(transaction=False)
            for _, plan, head, payload, expect in pending:
                args = self._put_args(head, payload, plan.epoch, expect)
                bound.put(keys=self._keys(plan.run_id), args=args, client=pipe)
            try:
                with self._backend_errors("put", None):
                    replies = pipe.execute(raise_on_error=False)
            except StreamCheckpointError as exc:
                for index, *_ in pending:
                    errors[index] = exc
                break
            retry: list[tuple[int, PutPlan, Head, bytes, LastWrite | None]] = []
            for (index, plan, head, _payload, expect), reply in zip(pending, replies, strict=True):
                try:
                    with self._backend_errors("put", plan.run_id):
                        if isinstance(reply, Exception):
                            raise reply
                        stored = self._put_result(head, plan.epoch, reply)
                    if stored is not None:
                        self._finish_put(plan, stored)
                    elif expect is not None:  # written by someone else since: rewrite
                        retry.append((index, plan, *self._rewrite_step(plan), None))
                except StreamCheckpointError as exc:
                    errors[index] = exc
            pending = retry
        return errors

    # -- async twins on redis.asyncio -------------------------------------------------
    #
    # They take the same steps as DeltaCheckpointStore.get/put/delete, awaiting
    # the same scripts on the event loop's client instead of blocking.

    async def aclaim(self, run_id: str) -> int:
        """Async twin of :meth:`claim`."""
        bound = await self._async_client()
        if bound is None:
            return await super().aclaim(run_id)
        check_run_id(run_id)
        with self._backend_errors("claim", run_id):
            return int(await bound.claim(keys=self._keys(run_id), args=self._clock_args()))

    async def aput(self, checkpoint: StreamCheckpoint) -> None:
        """Async twin of :meth:`put`: only the new text is sent when it extends the last."""
        bound = await self._async_client()
        if bound is None:
            return await super().aput(checkpoint)
        plan = self._prepare_put(checkpoint)
        keys = self._keys(plan.run_id)
        with self._backend_errors("put", plan.run_id):
            stored = None
            append = self._append_step(plan)
            if append is not None and plan.last is not None:
                head, delta = append
                args = self._put_args(head, delta, plan.epoch, plan.last)
                stored = self._put_result(head, plan.epoch, await bound.put(keys=keys, args=args))
            if stored is None:
                head, data = self._rewrite_step(plan)
                args = self._put_args(head, data, plan.epoch, None)
                stored = self._put_result(head, plan.epoch, await bound.put(keys=keys, args=args))
                assert stored is not None  # a replace is never conditional
        self._finish_put(plan, stored)
        return None

    async def aget(self, run_id: str) -> StreamCheckpoint | None:
        """Async twin of :meth:`get`."""
        bound = await self._async_client()
        if bound is None:
            return await super().aget(run_id)
        check_run_id(run_id)
        with self._backend_errors("get", run_id):
            loaded = self._loaded(run_id, await bound.load(keys=self._keys(run_id)[:2]))
        return self._rebuild(run_id, loaded)

    async def adelete(self, run_id: str, *, epoch: int | None = None) -> None:
        """Async twin of :meth:`delete`."""
        bound = await self._async_client()
        if bound is None:
            return await super().adelete(run_id, epoch=epoch)
        check_run_id(run_id)
        with self._memo_lock:
            self._memo.pop(run_id, None)
        with self._backend_errors("delete", run_id):
            reply = await bound.delete(keys=self._keys(run_id), args=self._delete_args(epoch, None))
            self._delete_result(run_id, epoch, reply)
        return None

    async def __aenter__(self) -> RedisStreamCheckpointStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the clients the store created, including this event loop's async one."""
        if self._owns_clients:
            await self._loop_clients.aclose()  # forgets and closes the loop's client
        self.close()
