"""An example chat app: a LangChain agent behind a page that follows its answers.

One command, offline (the model is the project's loopback provider)::

    pip install 'awaken-langchain[demo]'
    python -m awaken_langchain.examples.chat      # then open http://127.0.0.1:8000/

The page asks with ``POST /ask``, which starts a turn of the agent in a thread
and answers with the run's id; the page reads the answer from
``GET /api/runs/{run_id}/events`` with ``EventSource`` and stops it with
``POST /api/runs/{run_id}/stop`` (the routes of `awaken_langchain.web`). It
keeps the run id and the last offset it rendered in ``sessionStorage``: reload
it mid-answer and it reads on from there. Open ``/?run=<run_id>`` in another
tab to follow the same answer there, and stop it from either tab.

The agent is ``create_agent`` over a `RecoveringChatModel` (``ChatOpenAI``
pointed at the loopback provider), with a `DiskCacheStreamCheckpointStore` and
SQLite memory in ``--dir``: a second process started on the same directory
(another instance behind a load balancer) serves the same answers and can stop
them, and a process that resumes an unfinished turn of the memory writes on to
the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sqlite3
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from langchain_core.runnables import RunnableConfig

from awaken_langchain.checkpoint import check_run_id
from awaken_langchain.errors import StreamCheckpointError
from awaken_langchain.model import RecoveringChatModel
from awaken_langchain.readers import UnknownRunError, _Follower
from awaken_langchain.recovery import DEFAULT_CONTINUATION_PROMPT
from awaken_langchain.stores._base import make_private_database
from awaken_langchain.stores.diskcache import DiskCacheStreamCheckpointStore
from awaken_langchain.testing import LoopbackProvider, Scenario, continuation_responder
from awaken_langchain.testing.server import RecordedRequest

__all__ = [
    "ANSWER_ID",
    "ChatAgent",
    "build_agent",
    "build_app",
    "loopback_provider",
    "main",
    "scripted_answer",
]

logger = logging.getLogger(__name__)

ANSWER_ID = "answer_id"
"""The ``configurable`` key that carries a turn's run id to the model call's checkpoint."""

DEFAULT_DIR = Path(".awaken") / "web-chat"
"""Where the app keeps its checkpoints, run logs and memory unless ``--dir`` says otherwise."""

MAX_QUESTION = 4000
"""The longest question the app accepts, in characters."""


def scripted_answer(question: str) -> str:
    """What the loopback provider answers to ``question``."""
    return (
        f'You asked: "{question}". This answer is streamed by the loopback provider, a '
        "local stand-in for a model API, a few characters at a time. Reload the page "
        "while it is being written: the page reconnects with the last offset it showed "
        "and goes on from there, without repeating or losing a word. Open the same "
        "answer in a second tab and press Stop in either one: the process that writes "
        "the answer ends the turn, keeps the partial answer as a stopped turn, and both "
        "tabs show where it stopped."
    )


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def loopback_provider(*, delay: float = 0.03, chunk_size: int = 4) -> LoopbackProvider:
    """A loopback provider that answers every question with `scripted_answer`.

    A continuation request (a recovering model asking to go on after a cut) is
    answered with the rest of the interrupted answer.

    Args:
        delay: Seconds between two streamed chunks.
        chunk_size: Characters per chunk.
    """

    def respond(request: RecordedRequest) -> Scenario:
        messages = request.messages
        questions = [
            _text(m)
            for m in messages
            if m.get("role") == "user" and _text(m) != DEFAULT_CONTINUATION_PROMPT
        ]
        answer = Scenario(
            text=scripted_answer(questions[-1] if questions else ""),
            chunk_size=chunk_size,
            delay=delay,
        )
        if messages and _text(messages[-1]) == DEFAULT_CONTINUATION_PROMPT:
            return continuation_responder(answer)(request)
        return answer

    return LoopbackProvider(default=respond)


def _answer_key(config: RunnableConfig) -> str | None:
    value = (config.get("configurable") or {}).get(ANSWER_ID)
    return str(value) if value is not None else None


@dataclass
class ChatAgent:
    """The app's agent: a LangGraph graph, its checkpoint store and its memory."""

    graph: Any
    store: DiskCacheStreamCheckpointStore
    connection: sqlite3.Connection
    busy: set[str] = field(default_factory=set)
    """Conversations with a turn in progress in this process."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def config(self, conversation: str, run_id: str) -> RunnableConfig:
        """The config of a turn: the conversation's thread, and the run id of its answer."""
        return {"configurable": {"thread_id": conversation, ANSWER_ID: run_id}}

    def answer(self, conversation: str, question: str, run_id: str) -> None:
        """Run one turn; readers follow it as ``run_id``."""
        try:
            self.graph.invoke(
                {"messages": [{"role": "user", "content": question}]},
                self.config(conversation, run_id),
            )
        except Exception:  # readers get the run's `failed` event; the log gets the rest
            logger.exception("the turn %s failed", run_id)
        finally:
            with self.lock:
                self.busy.discard(conversation)

    def resume(self, conversation: str, run_id: str) -> Any:
        """Finish the unfinished turn of ``conversation`` (after its process died)."""
        return self.graph.invoke(None, self.config(conversation, run_id))

    def close(self) -> None:
        """Close the memory and the store."""
        self.connection.close()
        self.store.close()


def build_agent(directory: Path, base_url: str, **settings: Any) -> ChatAgent:
    """The agent: ``create_agent`` over a recovering ``ChatOpenAI``, state in ``directory``.

    Args:
        directory: Holds the checkpoint store (``checkpoints/``, with the run
            logs readers follow) and the memory (``memory.sqlite``).
        base_url: The OpenAI-compatible API (the loopback provider's
            ``base_url_openai``).
        **settings: Further `RecoveringChatModel` settings.
    """
    from langchain.agents import create_agent
    from langchain_openai import ChatOpenAI
    from langgraph.checkpoint.sqlite import SqliteSaver

    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    store = DiskCacheStreamCheckpointStore(directory / "checkpoints")
    model = RecoveringChatModel(
        model=ChatOpenAI(model="gpt-4o-mini", base_url=base_url, api_key="loopback", max_retries=0),
        store=store,
        # the model call's checkpoint, and so the run readers follow, is the turn's answer id
        checkpoint_key=_answer_key,
        **settings,
    )
    memory = directory / "memory.sqlite"
    make_private_database(memory)  # the conversations: readable by their owner only
    connection = sqlite3.connect(memory, check_same_thread=False)
    graph = create_agent(model, [], checkpointer=SqliteSaver(connection))
    return ChatAgent(graph=graph, store=store, connection=connection)


def _page() -> str:
    return resources.files(__package__).joinpath("chat.html").read_text(encoding="utf-8")


def _wait_for_log(store: DiskCacheStreamCheckpointStore, run_id: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        follower = _Follower(store, run_id, 0)
        try:
            follower.open()
            return
        except UnknownRunError:
            time.sleep(0.01)
        finally:
            follower.close()


def build_app(agent: ChatAgent, *, keepalive: float = 15.0) -> Any:
    """The Starlette app: the page at ``/``, ``POST /ask``, and the reader routes under ``/api``.

    Args:
        agent: The agent that answers.
        keepalive: Seconds of silence after which an event stream sends a comment.
    """
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, JSONResponse, Response
    from starlette.routing import Mount, Route

    from awaken_langchain.web import reader_routes

    page = _page()

    async def index(request: Request) -> Response:
        return HTMLResponse(page, headers={"Cache-Control": "no-store"})

    async def ask(request: Request) -> Response:
        try:
            body = await request.json()
            question = body["question"]
            conversation = check_run_id(body["conversation"])
        except (ValueError, KeyError, TypeError, StreamCheckpointError):
            return JSONResponse({"error": "expected {question, conversation}"}, status_code=400)
        if not isinstance(question, str) or not 0 < len(question) <= MAX_QUESTION:
            return JSONResponse({"error": "the question must be text"}, status_code=400)
        with agent.lock:
            if conversation in agent.busy:
                return JSONResponse(
                    {"error": "this conversation is still answering"}, status_code=409
                )
            agent.busy.add(conversation)
        run_id = str(uuid.uuid4())
        threading.Thread(
            target=agent.answer, args=(conversation, question, run_id), daemon=True
        ).start()
        # answer once the run's log exists, so that the page's first request finds it
        await asyncio.to_thread(_wait_for_log, agent.store, run_id, 10.0)
        return JSONResponse({"run_id": run_id}, status_code=201)

    return Starlette(
        routes=[
            Route("/", index),
            Route("/ask", ask, methods=["POST"]),
            Mount("/api", routes=reader_routes(agent.store, keepalive=keepalive)),
        ]
    )


def _smoke(url: str) -> str:
    """Ask one question over HTTP as the page does; return the streamed answer."""
    import httpx

    with httpx.Client(base_url=url, timeout=30) as client:
        assert "EventSource" in client.get("/").text
        conversation = str(uuid.uuid4())
        asked = client.post("/ask", json={"question": "Hello?", "conversation": conversation})
        asked.raise_for_status()
        run_id = asked.json()["run_id"]
        text, final = "", ""
        with client.stream("GET", f"/api/runs/{run_id}/events") as events:
            kind = ""
            for line in events.iter_lines():
                if line.startswith("event: "):
                    kind = line[len("event: ") :]
                elif line.startswith("data: ") and kind == "text":
                    text += json.loads(line[len("data: ") :])["text"]
                elif line.startswith("data: ") and kind in ("completed", "stopped", "failed"):
                    final = kind
                    break
    if final != "completed" or text != scripted_answer("Hello?"):
        raise RuntimeError(f"the smoke test read {final!r}: {text!r}")
    return text


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the example chat app (``python -m awaken_langchain.examples.chat``)."""
    parser = argparse.ArgumentParser(
        prog="python -m awaken_langchain.examples.chat",
        description="A chat page over a recovering LangChain agent, offline.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="default 8000; 0 picks one")
    parser.add_argument(
        "--dir",
        type=Path,
        default=DEFAULT_DIR,
        help=f"checkpoints, run logs and memory (default ./{DEFAULT_DIR})",
    )
    parser.add_argument(
        "--delay", type=float, default=0.03, help="seconds between chunks (default 0.03)"
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="ask one question over HTTP, check the streamed answer, and exit",
    )
    args = parser.parse_args(argv)
    import uvicorn

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    with loopback_provider(delay=args.delay) as provider:
        agent = build_agent(args.dir, provider.base_url_openai)
        server = uvicorn.Server(
            uvicorn.Config(
                build_app(agent),
                host=args.host,
                port=args.port,
                log_level="warning",
                timeout_graceful_shutdown=1,
            )
        )
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        try:
            while not server.started:
                if not thread.is_alive():
                    return 1
                time.sleep(0.01)
            port = server.servers[0].sockets[0].getsockname()[1]
            url = f"http://{args.host}:{port}"
            if args.smoke:
                print(_smoke(url))
                return 0
            print(f"Chat at {url}/ (the model: a loopback provider at {provider.url}; Ctrl-C ends)")
            with contextlib.suppress(KeyboardInterrupt):
                while thread.is_alive():
                    thread.join(0.5)
        finally:
            server.should_exit = True
            thread.join(5)
            agent.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
