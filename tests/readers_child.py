"""Processes of the readers tests: a producer of a run, and followers of it.

``python -m tests.readers_child produce <store> <base_url> <run_id> <out>`` streams
one answer from the loopback provider through ``RecoveringChatModel(ChatOpenAI)``
into the store, under ``run_id``, and writes ``{"text", "stopped"}`` of the final
message to ``out``.

``python -m tests.readers_child follow <store> <run_id> <seed> <out>`` attaches at
a random offset, follows the run to its end reconnecting after a random number
of events each time (with the last offset it saw), then reads the part before
its first offset from the log, and writes ``{"text", "offsets", "final"}`` to
``out``.

``<store>`` is JSON: ``["file", dir]``, ``["diskcache", dir]`` or
``["redis", url, prefix]``.

The tests call :func:`main` with those arguments in processes forked from a
fork server that has imported this module (and LangChain) once.
"""

from __future__ import annotations

import json
import random
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from langchain_openai import ChatOpenAI

from awaken_langchain import (
    DiskCacheStreamCheckpointStore,
    FileStreamCheckpointStore,
    RecoveringChatModel,
    RetryPolicy,
    RunEvent,
    RunOffsetError,
    StreamCheckpointStore,
    UnknownRunError,
    follow,
)


def open_store(spec: list[str], *, reader: bool) -> StreamCheckpointStore:
    kind = spec[0]
    if kind == "file":
        return FileStreamCheckpointStore(spec[1], read_only=reader)
    if kind == "diskcache":
        return DiskCacheStreamCheckpointStore(spec[1])
    if kind == "postgres":
        from awaken_langchain.stores.postgres import PostgresStreamCheckpointStore

        return PostgresStreamCheckpointStore(spec[1], table=spec[2], max_connections=8)
    from awaken_langchain.stores.redis import RedisStreamCheckpointStore

    return RedisStreamCheckpointStore(spec[1], prefix=spec[2])


def produce(store: StreamCheckpointStore, base_url: str, run_id: str, out: Path) -> None:
    inner = ChatOpenAI(base_url=base_url, api_key="x", model="gpt-4o-mini", max_retries=0)
    model = RecoveringChatModel(
        model=inner, store=store, retry_policy=RetryPolicy(sleep=lambda seconds: None)
    )
    message: Any = None
    for chunk in model.stream("Tell me a long story", config={"run_id": uuid.UUID(run_id)}):
        message = chunk if message is None else message + chunk
    awaken = message.response_metadata["awaken"]
    out.write_text(json.dumps({"text": message.text, "stopped": awaken["stopped"]}))


def _events(store: StreamCheckpointStore, run_id: str, after: int) -> Any:
    while True:
        try:
            return follow(store, run_id, after=after)
        except (UnknownRunError, RunOffsetError):
            time.sleep(0.005)  # not started yet, or not that far yet


def follow_randomly(store: StreamCheckpointStore, run_id: str, seed: int, out: Path) -> None:
    rng = random.Random(seed)
    first = rng.randint(0, 40)
    cursor = first
    seen: list[RunEvent] = []
    final = None
    while final is None:
        events = _events(store, run_id, cursor)
        budget = rng.randint(1, 25)
        for event in events:
            seen.append(event)
            cursor = event.offset
            if event.final:
                final = event.type
                break
            budget -= 1
            if budget == 0:
                break
        events.close()  # a reader that goes away mid-answer
        time.sleep(rng.random() * 0.02)
    before = [event for event in follow(store, run_id) if event.offset <= first]
    text = "".join(event.text for event in before + seen)
    offsets = [event.offset for event in seen]
    out.write_text(json.dumps({"text": text, "offsets": offsets, "first": first, "final": final}))


def main(argv: list[str]) -> None:
    mode, spec = argv[0], json.loads(argv[1])
    store = open_store(spec, reader=mode == "follow")
    with store:
        if mode == "produce":
            produce(store, argv[2], argv[3], Path(argv[4]))
        else:
            follow_randomly(store, argv[2], int(argv[3]), Path(argv[4]))


if __name__ == "__main__":
    main(sys.argv[1:])
