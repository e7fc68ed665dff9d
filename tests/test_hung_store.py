"""A hung or failing checkpoint store never slows a turn, and checkpointing comes back.

Also here: a sync stream that stalls is closed from the wrapper's side, so the
provider stops generating and no reader thread lingers.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from awaken_langchain import RecoveringChatModel, RetryPolicy
from tests.conftest import Drive

TEXT = "".join(f"w{i:02d} " for i in range(80))

# -- a stalled sync stream is closed ------------------------------------------------------


def pump_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "awaken-stream-pump"]


async def _no_sleep(seconds: float) -> None:
    await asyncio.sleep(0)


@pytest.mark.slow
async def test_a_stalled_stream_is_closed_as_soon_as_the_wrapper_gives_up_on_it(
    drive: Drive,
) -> None:
    from langchain_openai import ChatOpenAI

    from awaken_langchain.testing import Fault, LoopbackProvider, Scenario

    idle = 0.5
    with LoopbackProvider() as server:
        server.enqueue(Scenario(text=TEXT, fault=Fault.stall(30, after_events=5)))
        inner = ChatOpenAI(
            model="gpt-4o-mini", base_url=server.base_url_openai, api_key="x", max_retries=0
        )
        model = RecoveringChatModel(
            model=inner,
            stream_idle_timeout=idle,
            retry_policy=RetryPolicy(sleep=lambda seconds: None, async_sleep=_no_sleep),
        )
        chunks = await drive.stream(model, "Count.")
        answer = "".join(chunk.text for chunk in chunks)
        stalled = server.requests[0]

        assert len(server.requests) == 2  # the wrapper gave up on the stall and continued
        assert answer.startswith(TEXT[:4])
        # The client closed the stalled connection when it moved on, not 30 s later.
        hangup = server.hangups.get(stalled.number)
        assert hangup is not None, server.hangups
        assert hangup - stalled.received_at < idle + 1.0
        # ... and no reader thread is left waiting for the stalled stream.
        for thread in pump_threads():
            thread.join(timeout=1.0)
        assert pump_threads() == []
