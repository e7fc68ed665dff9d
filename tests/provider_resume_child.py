"""The worker a provider-resume crash test kills with SIGKILL.

It streams one turn through ``RecoveringChatModel(provider_resume=True)`` over
``ChatOpenAI(use_responses_api=True)`` pointed at the test's loopback provider,
with a diskcache checkpoint store in the test's directory, and reports every
streamed chunk's text on a pipe (``{"event": "token", "text"}``), so the test can
kill it mid-turn. The turn's checkpoint key is the run id the test chose.
"""

from __future__ import annotations

import uuid
from multiprocessing.connection import Connection

from langchain_openai import ChatOpenAI

from awaken_langchain import DiskCacheStreamCheckpointStore, RecoveringChatModel

QUESTION = "What is the capital of France?"


def worker(base_url: str, directory: str, run_id: str, conn: Connection) -> None:
    """Stream the turn, reporting each chunk; the test kills this process mid-turn."""
    model = RecoveringChatModel(
        model=ChatOpenAI(
            model="gpt-5-mini",
            base_url=base_url,
            api_key="x",
            max_retries=0,
            use_responses_api=True,
        ),
        provider_resume=True,
        store=DiskCacheStreamCheckpointStore(directory),
        checkpoint_every_chunks=1,
    )
    for chunk in model.stream(QUESTION, config={"run_id": uuid.UUID(run_id)}):
        conn.send({"event": "token", "text": chunk.text})
    conn.send({"event": "done"})
