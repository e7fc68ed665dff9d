"""The example chat app in a real browser: headless Chromium, driven by Playwright.

The page (``awaken_langchain.examples.chat``) follows answers with ``EventSource``
and keeps the last offset it rendered in ``sessionStorage``. Each test checks
what a person sees: the complete answer once (or the stopped partial), after a
reload, after the producing process was killed and replaced, after a stop
pressed in another tab.

Chromium is Debian's ``chromium`` package (Playwright never downloads a
browser here). When it or Playwright is missing the tests are skipped, unless
``AWAKEN_REQUIRE_BROWSER=1`` is set (CI), in which case they fail. Screenshots
go to ``$AWAKEN_ARTIFACTS`` (default ``artifacts/`` in the checkout).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from awaken_langchain import follow
from awaken_langchain.examples.chat import (
    ChatAgent,
    build_agent,
    build_app,
    loopback_provider,
    scripted_answer,
)
from awaken_langchain.testing import Fault, LoopbackProvider, Scenario

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parent.parent
REQUIRE_ENV = "AWAKEN_REQUIRE_BROWSER"
TIMEOUT = 20.0
"""Longest wait for anything the page should show, in seconds."""


def chromium_binary() -> str:
    """The system Chromium, or skip (fail when ``AWAKEN_REQUIRE_BROWSER=1``)."""
    found = os.environ.get("AWAKEN_CHROMIUM") or next(
        filter(None, map(shutil.which, ("chromium", "chromium-browser"))), None
    )
    reason = None
    if found is None:
        reason = "no chromium binary (apt-get install chromium)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            reason = "the playwright package is not installed (the dev extra)"
    if reason is not None:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but {reason}")
        pytest.skip(reason)
    assert found is not None
    return found


def artifacts() -> Path:
    path = Path(os.environ.get("AWAKEN_ARTIFACTS") or REPO_ROOT / "artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


class App:
    """The example app served by uvicorn on a free port, its provider and its agent."""

    def __init__(self, directory: Path) -> None:
        import uvicorn

        self.directory = directory
        self.provider: LoopbackProvider = loopback_provider(delay=0.01).start()
        self.agent: ChatAgent = build_agent(directory, self.provider.base_url_openai)
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.socket.getsockname()[1]}/"
        config = uvicorn.Config(
            build_app(self.agent, keepalive=1.0),
            log_level="warning",
            timeout_graceful_shutdown=1,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + TIMEOUT
        while not self.server.started:
            assert self.thread.is_alive()
            assert time.monotonic() < deadline
            time.sleep(0.01)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.socket.close()
        self.provider.stop()
        self.agent.close()


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[App]:
    chromium_binary()
    served = App(tmp_path_factory.mktemp("chat"))
    yield served
    served.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    executable = chromium_binary()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, headless=True)
        yield launched
        launched.close()


@pytest.fixture
def context(browser: Any) -> Iterator[Any]:
    opened = browser.new_context(viewport={"width": 900, "height": 700})
    yield opened
    opened.close()


def eventually(what: str, check: Callable[[], Any], timeout: float = TIMEOUT) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"the page never showed {what}"
        time.sleep(0.01)
    return value


def answer_text(page: Any) -> str:
    return str(page.locator(".turn .answer").last.text_content())


def status(page: Any) -> str | None:
    turns = page.locator(".turn")
    if turns.count() == 0:
        return None
    return str(turns.last.get_attribute("data-status"))


def final_event(app: App, run_id: str) -> Any:
    return list(follow(app.agent.store, run_id))[-1]


def test_a_page_reloaded_mid_answer_shows_the_whole_answer_once(app: App, context: Any) -> None:
    question = "What happens when I reload?"
    expected = scripted_answer(question)
    app.provider.enqueue(Scenario(text=expected, chunk_size=4, delay=0.02))  # about 3 s
    page = context.new_page()
    streams: list[str] = []
    page.on("request", lambda r: streams.append(r.url) if "/events" in r.url else None)
    page.goto(app.url)
    page.fill("#question", question)
    page.click("#send")
    eventually("part of the answer", lambda: len(answer_text(page)) >= 60)
    before = answer_text(page)
    page.reload()
    eventually("the end of the answer", lambda: status(page) == "completed")

    run_id = str(page.locator(".turn").last.get_attribute("data-run"))
    final = final_event(app, run_id)
    assert final.type == "completed"
    assert final.message().text == expected
    assert answer_text(page) == expected  # all of it, once
    assert len(before) < len(expected)  # the reload came mid-answer
    # the page came back at the offset it had reached, not from the start
    assert len(streams) == 2
    assert streams[0].endswith("?after=0")
    assert not streams[1].endswith("?after=0")
    page.screenshot(path=artifacts() / "browser-reload.png")


def child(app: App, conversation: str, run_id: str, out: Path, *question: str) -> Any:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.browser_child",
            str(app.directory),
            app.provider.base_url_openai,
            conversation,
            run_id,
            str(out),
            *question,
        ],
        cwd=REPO_ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    return process


def ready(process: Any) -> None:
    assert process.stdout.readline() == "ready\n"


def go(process: Any) -> None:
    process.stdin.write("go\n")
    process.stdin.flush()


def test_a_page_shows_the_answer_once_when_its_process_is_killed_and_replaced(
    app: App, context: Any, tmp_path: Path
) -> None:
    question = "What if the process dies?"
    expected = scripted_answer(question)
    conversation, run_id = str(uuid.uuid4()), str(uuid.uuid4())
    # the first process's stream stalls after its role chunk and 44 chunks of text, four
    # chunks past its last checkpoint (every 8 chunks): it is killed there
    app.provider.enqueue(
        Scenario(text=expected, chunk_size=4, delay=0.01, fault=Fault.stall(30, after_events=45))
    )
    stalled = expected[: 44 * 4]
    first = child(app, conversation, run_id, tmp_path / "first.json", question)
    replacement = child(app, conversation, run_id, tmp_path / "replacement.json")
    try:
        ready(first)
        ready(replacement)
        go(first)
        page = context.new_page()
        page.goto(f"{app.url}?run={run_id}")

        def checkpointed() -> bool:
            checkpoint = app.agent.store.get(run_id)
            return checkpoint is not None and len(checkpoint.partial_text or "") >= 100

        eventually("a checkpoint of part of the answer", checkpointed)
        eventually("the answer up to the stall", lambda: answer_text(page) == stalled)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        shown_at_kill = answer_text(page)
        go(replacement)
        eventually("the end of the answer", lambda: status(page) == "completed")
        assert replacement.wait(TIMEOUT) == 0
    finally:
        for process in (first, replacement):
            if process.poll() is None:
                process.kill()
                process.wait(10)
    page.screenshot(path=artifacts() / "browser-replacement.png")
    committed = json.loads((tmp_path / "replacement.json").read_text())
    assert committed == {"text": expected, "stopped": False}
    assert len(shown_at_kill) < len(expected)
    assert final_event(app, run_id).message().text == expected
    logged = "".join(event.text for event in follow(app.agent.store, run_id))
    assert answer_text(page) == logged  # the page shows the run's log, once
    assert answer_text(page) == expected  # once: no stretch repeated, none missing


def test_stop_pressed_in_a_second_tab_stops_the_answer_in_both_tabs(app: App, context: Any) -> None:
    question = "Can I stop you?"
    expected = scripted_answer(question)
    app.provider.enqueue(Scenario(text=expected, chunk_size=4, delay=0.05))  # about 7 s
    first = context.new_page()
    first.goto(app.url)
    first.fill("#question", question)
    first.click("#send")
    eventually("part of the answer", lambda: len(answer_text(first)) >= 20)
    run_id = str(first.locator(".turn").last.get_attribute("data-run"))

    second = context.new_page()  # its own sessionStorage: a tab that only has the link
    second.goto(f"{app.url}?run={run_id}")
    eventually("the answer in the second tab", lambda: len(answer_text(second)) >= 20)
    second.click(".turn .stop")
    for page in (first, second):
        eventually("the stop", lambda page=page: status(page) == "stopped", timeout=5)

    final = final_event(app, run_id)
    assert final.type == "stopped"
    stopped = final.message()
    assert stopped.response_metadata["awaken"]["stopped"] is True
    assert 20 <= len(stopped.text) < len(expected)
    assert expected.startswith(stopped.text)
    assert answer_text(first) == answer_text(second) == stopped.text
    assert first.locator(".turn .status").last.text_content() == "[stopped]"
    # the conversation's memory holds the partial answer as a stopped turn
    conversation = first.evaluate("JSON.parse(sessionStorage.getItem('awaken-chat')).conversation")
    state = app.agent.graph.get_state({"configurable": {"thread_id": conversation}})
    last = state.values["messages"][-1]
    assert last.text == stopped.text
    assert last.response_metadata["awaken"]["stopped"] is True
    first.screenshot(path=artifacts() / "browser-stop-first-tab.png")
    second.screenshot(path=artifacts() / "browser-stop-second-tab.png")
