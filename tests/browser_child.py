"""A process that writes an answer of the example chat app, for the browser tests.

``python -m tests.browser_child <dir> <base_url> <conversation> <run_id> <out> [QUESTION]``
builds the example's agent over ``<dir>`` (the directory the app serves), prints
``ready``, waits for a line on standard input, then answers ``QUESTION`` in
``<conversation>`` as run ``<run_id>``; without ``QUESTION`` it finishes the
conversation's unfinished turn (a replacement for a process that died). It
writes ``{"text", "stopped"}`` of the turn's final message to ``<out>``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from awaken_langchain.examples.chat import build_agent


def main(argv: list[str]) -> None:
    directory, base_url, conversation, run_id, out = argv[:5]
    question = argv[5] if len(argv) > 5 else None
    # checkpoints every 8 chunks and never by time: where a stream stalls, the last
    # checkpoint is the same on a fast machine and on a loaded one
    agent = build_agent(Path(directory), base_url, checkpoint_every_seconds=3600.0)
    print("ready", flush=True)
    if not sys.stdin.readline():
        return
    try:
        config = agent.config(conversation, run_id)
        if question is None:
            state = agent.resume(conversation, run_id)
        else:
            state = agent.graph.invoke(
                {"messages": [{"role": "user", "content": question}]}, config
            )
        message = state["messages"][-1]
        awaken = message.response_metadata["awaken"]
        Path(out).write_text(json.dumps({"text": message.text, "stopped": awaken["stopped"]}))
    finally:
        agent.close()


if __name__ == "__main__":
    main(sys.argv[1:])
