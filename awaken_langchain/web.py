"""HTTP routes for readers: Server-Sent Events of a run, and its stop (``awaken-langchain[web]``).

``GET /runs/{run_id}/events`` streams the run's events as Server-Sent Events,
each with ``id:`` set to its offset, ``event:`` to its type and ``data:`` to its
JSON payload. A browser's ``EventSource`` sends the last id it saw as
``Last-Event-ID`` when it reconnects, and gets every later event once; a client
may pass ``?after=<offset>`` instead. After ``keepalive`` seconds without an
event (15 by default) the stream sends a ``: keep-alive`` comment, which keeps
proxies from closing a quiet connection. ``POST /runs/{run_id}/stop`` asks the
run to stop.

Errors are answers, never crashes: an unknown run is a 404, a malformed
``Last-Event-ID``/``after`` or an offset past the end of the run a 400.

The routes check nobody's rights: mount them behind your own authorisation
(a middleware or a dependency that checks the user owns the run).

Example:
    ```python
    from starlette.applications import Starlette
    from starlette.routing import Mount

    from awaken_langchain import DiskCacheStreamCheckpointStore
    from awaken_langchain.web import reader_routes

    store = DiskCacheStreamCheckpointStore("/var/lib/app/checkpoints")
    app = Starlette(routes=[Mount("/api", routes=reader_routes(store))])
    ```
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

try:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route
except ImportError as exc:  # pragma: no cover - the extra is installed for the tests
    raise ImportError(
        "awaken_langchain.web needs the starlette package; "
        "install it with: pip install 'awaken-langchain[web]'"
    ) from exc

from awaken_langchain.checkpoint import StreamCheckpointStore, check_run_id
from awaken_langchain.errors import StreamCheckpointError
from awaken_langchain.readers import (
    WAIT_STEP,
    RunEvent,
    RunOffsetError,
    UnknownRunError,
    _Follower,
    request_stop,
)

__all__ = ["reader_app", "reader_routes", "sse_event"]

RETRY_MS = 1000
"""The reconnection delay the stream asks of ``EventSource`` (milliseconds)."""

KEEPALIVE = 15.0
"""Seconds without an event after which the stream sends a ``: keep-alive`` comment.

Proxies and load balancers close a connection that stays silent for long (often
after 30 to 60 s); a comment keeps it open and is ignored by ``EventSource``.
"""

KEEPALIVE_COMMENT = b": keep-alive\n\n"


def sse_event(event: RunEvent) -> bytes:
    """One run event as a Server-Sent Event (``id``, ``event``, ``data``)."""
    data = json.dumps(event.data, ensure_ascii=False, separators=(",", ":"))
    return f"id: {event.offset}\nevent: {event.type}\ndata: {data}\n\n".encode()


def _offset(request: Request) -> int | None:
    raw = request.headers.get("last-event-id")
    if raw is None:
        raw = request.query_params.get("after", "0")
    raw = raw.strip()
    if not raw.isascii() or not raw.isdigit() or len(raw) > 18:
        return None
    return int(raw)


def _run_id(request: Request) -> str | None:
    try:
        return check_run_id(request.path_params["run_id"])
    except StreamCheckpointError:
        return None


def _problem(status: int, detail: str) -> JSONResponse:
    return JSONResponse({"error": detail}, status_code=status)


async def _stream(
    follower: _Follower, replayed: list[RunEvent], keepalive: float
) -> AsyncIterator[bytes]:
    loop = asyncio.get_running_loop()
    try:
        yield f"retry: {RETRY_MS}\n\n".encode()
        for event in replayed:
            yield sse_event(event)
        sent = loop.time()
        while not follower.done:
            # waits hold no thread: a dropped stream costs the server no worker
            events = await follower.anext(min(keepalive, WAIT_STEP))
            for event in events:
                yield sse_event(event)
            if events:
                sent = loop.time()
            elif loop.time() - sent >= keepalive:
                yield KEEPALIVE_COMMENT
                sent = loop.time()
    finally:
        follower.close()


def reader_routes(store: StreamCheckpointStore, *, keepalive: float = KEEPALIVE) -> list[Route]:
    """The routes ``GET /runs/{run_id}/events`` and ``POST /runs/{run_id}/stop`` of ``store``.

    Args:
        store: The store the producing models write to.
        keepalive: Seconds without an event after which an event stream sends
            a ``: keep-alive`` comment (15 s by default).
    """
    if not keepalive > 0:
        raise ValueError(f"keepalive must be a number of seconds > 0, got {keepalive!r}")

    async def events(request: Request) -> Response:
        run_id = _run_id(request)
        if run_id is None:
            return _problem(400, "not a run id")
        after = _offset(request)
        if after is None:
            return _problem(400, "Last-Event-ID and after must be an offset: digits only")
        try:
            follower = _Follower(store, run_id, after)
            replayed = await asyncio.to_thread(follower.open)
        except UnknownRunError as exc:
            return _problem(404, str(exc))
        except RunOffsetError as exc:
            return _problem(400, str(exc))
        except StreamCheckpointError:
            return _problem(503, "the store did not answer; try again")
        return StreamingResponse(
            _stream(follower, replayed, keepalive),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    async def stop(request: Request) -> Response:
        run_id = _run_id(request)
        if run_id is None:
            return _problem(400, "not a run id")
        try:
            await asyncio.to_thread(request_stop, store, run_id)
        except UnknownRunError as exc:
            return _problem(404, str(exc))
        except StreamCheckpointError:
            return _problem(503, "the store did not answer; try again")
        return JSONResponse({"run_id": run_id, "stop": "requested"}, status_code=202)

    return [
        Route("/runs/{run_id}/events", events, methods=["GET"]),
        Route("/runs/{run_id}/stop", stop, methods=["POST"]),
    ]


def reader_app(store: StreamCheckpointStore, *, keepalive: float = KEEPALIVE) -> Starlette:
    """A Starlette app serving `reader_routes` (mount it, or run it on its own)."""
    return Starlette(routes=reader_routes(store, keepalive=keepalive))
