"""`awaken-langchain demo`: the whole mission, offline, in about a minute.

A LangGraph agent (``create_agent``) with a SQLite-backed memory talks through
the real ``ChatOpenAI`` (or ``ChatAnthropic``) client, wrapped in
:class:`~awaken_langchain.RecoveringChatModel` with the embedded
:class:`~awaken_langchain.DiskCacheStreamCheckpointStore`, to the loopback
provider server. Six turns each meet one failure:

a. a 429 with a retry hint before any output: retried after the hint;
b. a connection drop mid-answer: continued, with no repeated text;
c. a tool call cut off mid-arguments: not executed, re-issued, run once;
d. a process replacement: a worker process is killed with SIGKILL mid-stream
   and a fresh worker finishes the same turn from the checkpoint;
e. a connection drop under the OpenAI Responses API with ``provider_resume=True``:
   the provider keeps generating the background response, and the wrapper
   resumes its stream after the last event received (one model call outside
   the agent, with the real ``ChatOpenAI(use_responses_api=True)``, whatever
   ``--provider`` says);
f. a process killed after a tool's effect: a worker's tool appends to a file,
   the worker is killed with SIGKILL before LangGraph saved the tool's result,
   and a fresh worker resumes the thread; the tool ledger replays the recorded
   result, so the file holds the effect once.

Every claim is then checked against facts (the requests the server recorded,
the text received, the tool's log, the memory's messages), and the demo fails
(exit status 1) if any claim does not hold.

One module per step (`rate_limit`, `drop`, `tool_cut`, `replacement`,
`provider_resume`, `ledger_replay`), each scheduling its failure, playing its turn and checking
its claims; `runner` plays them in order and prints the verdict. They share the
conversation (`conversation`), the scripted model behind the loopback server
(`scripted`), the agent (`agent`) and what every step works with (`stage`).
The worker processes of steps d and f (`worker`) run ``python -m awaken_langchain.demo``
and report tokens and recovery events as JSON lines on their standard output.
"""

from awaken_langchain.demo.runner import run_demo
from awaken_langchain.demo.stage import DemoSettings

__all__ = ["DemoSettings", "run_demo"]
