"""The `awaken-langchain` command: demo, chat and checkpoints, with good and bad input."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import diskcache
import pytest
from rich.console import Console

from awaken_langchain import DiskCacheStreamCheckpointStore, FileStreamCheckpointStore
from awaken_langchain.checkpoint import CompletedToolCall, InFlightToolCall, StreamCheckpoint
from awaken_langchain.cli import main
from awaken_langchain.stores._base import run_id_bytes
from awaken_langchain.testing import Fault, LoopbackProvider, Scenario, echo_responder

REPO_ROOT = Path(__file__).resolve().parent.parent


def run(*argv: str, stdin: str = "", width: int = 200) -> tuple[int, str]:
    """Run the command in-process; return its exit status and everything it printed."""
    out = io.StringIO()
    console = Console(file=out, width=width, highlight=False, color_system=None)
    status = main(list(argv), stdin=io.StringIO(stdin), console=console)
    return status, " ".join(out.getvalue().split())


def run_process(
    *argv: str, extra_path: Path | None = None, stdin: str = "", timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run `python -m awaken_langchain ARGV` in a child process importing this repository."""
    paths = [str(extra_path)] if extra_path else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, str(REPO_ROOT)])}
    return subprocess.run(
        [sys.executable, "-m", "awaken_langchain", *argv],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


# -- the command line itself ------------------------------------------------------------------


def test_the_console_script_runs_the_cli_main() -> None:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["awaken-langchain"] == "awaken_langchain.cli:main"
    # rich serves only the command: an extra, never a dependency of the library
    assert not any(d.startswith("rich") for d in project["project"]["dependencies"])
    extras = project["project"]["optional-dependencies"]
    assert any(d.startswith("rich") for d in extras["cli"])


def test_python_dash_m_prints_help_and_exits_zero() -> None:
    result = run_process("--help")
    assert result.returncode == 0
    for command in ("demo", "chat", "checkpoints"):
        assert command in result.stdout


def test_the_checkpoints_command_starts_without_importing_langchain(tmp_path: Path) -> None:
    store = tmp_path / "store"
    DiskCacheStreamCheckpointStore(store).close()
    code = (
        "import sys\n"
        "from awaken_langchain.cli import main\n"
        f"status = main(['checkpoints', 'list', '--store', 'diskcache:{store}'])\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('langchain_core', 'langchain', 'langsmith', 'openai', 'anthropic')))\n"
        "sys.exit(status)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize(
    "command",
    [
        ["demo"],
        ["chat"],
        ["checkpoints"],
        ["checkpoints", "list"],
        ["checkpoints", "show"],
        ["checkpoints", "rm"],
        ["checkpoints", "gc"],
    ],
    ids=" ".join,
)
def test_every_command_has_help(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--help"])
    assert exit_info.value.code == 0
    assert "usage: awaken-langchain " + " ".join(command) in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "required: COMMAND"),
        (["launch"], "invalid choice: 'launch'"),
        (["demo", "--speed", "0"], "expected a positive number, got '0'"),
        (["demo", "--speed", "fast"], "expected a number, got 'fast'"),
        (["demo", "--provider", "mistral"], "invalid choice: 'mistral'"),
        (["demo", "--inject-failure", "everything"], "invalid choice: 'everything'"),
        (["chat"], "the following arguments are required: --model"),
        (["checkpoints", "show"], "the following arguments are required: RUN"),
        (["checkpoints", "gc"], "the following arguments are required: --older-than"),
        (["checkpoints", "gc", "--older-than", "-5"], "expected a positive number, got '-5'"),
    ],
)
def test_bad_arguments_exit_2_naming_the_problem(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


# -- demo ------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_demo_runs_end_to_end_and_every_claim_holds(provider: str, tmp_path: Path) -> None:
    status, out = run("demo", "--dir", str(tmp_path), "--provider", provider, "--speed", "40")
    assert status == 0, out
    assert "All 30 claims verified." in out
    for marker in (
        "awaken_retry",
        "awaken_continuation",
        "SIGKILL worker 1",
        "awaken_resume",
        "awaken_provider_resume",
        "awaken_tool_ledger_replay",
        "tool result replayed from the ledger",
    ):
        assert marker in out
    assert "get_forecast ran with {'city': 'Lisbon', 'days': 3}" in out
    assert len((tmp_path / "packing-list.txt").read_text().splitlines()) == 1
    # the committed thread is in the SQLite memory; no in-flight turn is left behind
    assert (tmp_path / "memory.sqlite").is_file()
    status, listing = run("checkpoints", "list", "--store", f"diskcache:{tmp_path}/checkpoints")
    assert (status, listing) == (0, "No in-flight turns.")


@pytest.mark.parametrize(
    ("failure", "steps", "broken_claim"),
    [
        ("retry", "a", "StreamInterruptedError: the streamed turn could not be recovered"),
        ("continuation", "b", "the answer reached the caller whole, with no repeated text"),
        ("tool", "c", "the tool ran exactly once, with complete arguments"),
    ],
)
def test_demo_exits_1_when_a_claim_does_not_hold(
    failure: str, steps: str, broken_claim: str, tmp_path: Path
) -> None:
    status, out = run(
        "demo",
        "--dir",
        str(tmp_path),
        "--speed",
        "40",
        "--steps",
        steps,
        "--inject-failure",
        failure,
    )
    assert status == 1
    assert broken_claim in out
    assert "claims did not hold" in out


@pytest.mark.slow
def test_demo_exits_1_when_the_replacement_cannot_see_the_checkpoint(tmp_path: Path) -> None:
    status, out = run(
        "demo",
        "--dir",
        str(tmp_path),
        "--speed",
        "40",
        "--steps",
        "d",
        "--inject-failure",
        "replacement",
    )
    assert status == 1
    assert "FAILED d. process replaced mid-stream: worker 2, a fresh process, resumed" in out
    assert "not to start over" in out


def test_demo_step_f_kills_a_worker_after_the_tools_effect_and_the_file_holds_it_once(
    tmp_path: Path,
) -> None:
    status, out = run("demo", "--dir", str(tmp_path), "--speed", "40", "--steps", "f")
    assert status == 0, out
    assert "SIGKILL worker 1" in out
    assert "tool result replayed from the ledger" in " ".join(out.split())
    assert "All 7 claims verified." in out
    lines = (tmp_path / "packing-list.txt").read_text().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("sunglasses\t")
    # the worker that resumed the thread did not call the tool: one key, one line
    assert lines[0].split("\t")[1].startswith("awaken-")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--steps", "a,x"], "--steps takes letters from a,b,c,d,e,f"),
        (["--steps", ","], "--steps takes letters from a,b,c,d,e,f"),
    ],
)
def test_demo_rejects_bad_settings(argv: list[str], message: str, tmp_path: Path) -> None:
    status, out = run("demo", "--dir", str(tmp_path), *argv)
    assert status == 2
    assert message in out


def test_demo_refuses_a_dir_that_is_a_file(tmp_path: Path) -> None:
    target = tmp_path / "taken"
    target.write_text("not a directory")
    status, out = run("demo", "--dir", str(target), "--steps", "a")
    assert status == 2
    assert "exists and is not a directory" in out
    assert target.read_text() == "not a directory"


def _hide_module(tmp_path: Path, module: str) -> Path:
    """A directory that, first on PYTHONPATH, makes ``module`` fail to import."""
    hidden = tmp_path / "hidden"
    hidden.mkdir(exist_ok=True)
    (hidden / f"{module}.py").write_text(
        f"raise ImportError({f'No module named {module!r}'!r}, name={module!r})\n"
    )
    return hidden


@pytest.mark.slow
def test_demo_names_the_extra_to_install_when_a_provider_is_missing(tmp_path: Path) -> None:
    hidden = _hide_module(tmp_path, "langchain_anthropic")
    result = run_process(
        "demo", "--provider", "anthropic", "--dir", str(tmp_path / "d"), extra_path=hidden
    )
    assert result.returncode == 2
    assert "pip install 'awaken-langchain[anthropic]'" in " ".join(result.stderr.split())
    assert not (tmp_path / "d").exists()


# -- chat ------------------------------------------------------------------------------------------


@pytest.fixture
def echo_server() -> Iterator[LoopbackProvider]:
    with LoopbackProvider(default=echo_responder()) as server:
        yield server


def _memory(directory: Path, thread: str) -> list[tuple[str, str]]:
    from langgraph.checkpoint.sqlite import SqliteSaver

    with sqlite3.connect(directory / "memory.sqlite") as connection:
        saved = SqliteSaver(connection).get({"configurable": {"thread_id": thread}})
    assert saved is not None
    return [(m.type, m.text) for m in saved["channel_values"]["messages"]]


def test_chat_streams_answers_and_commits_every_turn_to_memory(
    echo_server: LoopbackProvider, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    echo_server.enqueue(  # the first answer drops after "You said: he"; then the rest
        Scenario(text="You said: hello, and here is more.", fault=Fault.drop_after_events(4)),
        Scenario(text="llo, and here is more."),
    )
    status, out = run(
        "chat",
        "--model",
        "openai:gpt-4o-mini",
        "--base-url",
        echo_server.base_url_openai,
        "--dir",
        str(tmp_path),
        "--thread",
        "t-1",
        stdin="hello\n\nhow are you?\n/exit\nnot read\n",
    )
    assert status == 0, out
    assert "awaken_continuation" in out
    assert "You said: how are you?" in out
    assert "--thread t-1" in out
    assert _memory(tmp_path, "t-1") == [
        ("human", "hello"),
        ("ai", "You said: hello, and here is more."),
        ("human", "how are you?"),
        ("ai", "You said: how are you?"),
    ]
    assert len(echo_server.requests) == 3  # a continuation, then the second turn


def test_chat_ends_at_end_of_input_and_continues_a_thread(
    echo_server: LoopbackProvider, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    base = ["chat", "--model", "anthropic:claude-sonnet-5", "--dir", str(tmp_path)]
    base += ["--base-url", echo_server.base_url_anthropic, "--thread", "t-2"]
    assert run(*base, stdin="first")[0] == 0
    assert run(*base, stdin="second\n")[0] == 0
    assert _memory(tmp_path, "t-2") == [
        ("human", "first"),
        ("ai", "You said: first"),
        ("human", "second"),
        ("ai", "You said: second"),
    ]
    # the second process sent the whole thread from memory
    assert [m["role"] for m in echo_server.requests[-1].messages] == ["user", "assistant", "user"]


def test_chat_reports_a_failed_turn_and_exits_1(
    echo_server: LoopbackProvider, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    echo_server.enqueue(Scenario(fault=Fault.http_error(401)))
    status, out = run(
        "chat",
        "--model",
        "openai:gpt-4o-mini",
        "--base-url",
        echo_server.base_url_openai,
        "--dir",
        str(tmp_path),
        stdin="hello\nagain\n",
    )
    assert status == 1
    assert "the turn failed and was not committed" in out
    assert "401" in out
    assert "You said: again" in out
    assert len(echo_server.requests) == 2  # an authentication error is never retried


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("gpt-4o-mini", "--model 'gpt-4o-mini' must be PROVIDER:MODEL"),
        ("openai:", "must be PROVIDER:MODEL"),
        ("nosuchprovider:model-x", "Unable to infer model provider"),
    ],
)
def test_chat_rejects_a_bad_model(model: str, message: str, tmp_path: Path) -> None:
    status, out = run("chat", "--model", model, "--dir", str(tmp_path), stdin="hi\n")
    assert status == 2
    assert message in out


def test_chat_without_an_api_key_names_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    status, out = run("chat", "--model", "openai:gpt-4o-mini", "--dir", str(tmp_path))
    assert status == 2
    assert "OPENAI_API_KEY" in out


@pytest.mark.slow
def test_chat_names_the_extra_to_install_when_a_provider_is_missing(tmp_path: Path) -> None:
    hidden = _hide_module(tmp_path, "langchain_openai")
    result = run_process(
        "chat",
        "--model",
        "openai:gpt-4o-mini",
        "--dir",
        str(tmp_path / "d"),
        extra_path=hidden,
        stdin="hi\n",
    )
    assert result.returncode == 2
    assert "pip install 'awaken-langchain[openai]'" in " ".join(result.stderr.split())


# -- checkpoints -----------------------------------------------------------------------------------


def _checkpoint(run_id: str, **fields: object) -> StreamCheckpoint:
    return StreamCheckpoint.model_validate(
        {"run_id": run_id, "thread_id": "thread-1", "model": "openai:gpt-4o-mini", **fields}
    )


@pytest.fixture(params=["diskcache", "file"])
def store_spec(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store holding two in-flight turns; the second one carries tool calls."""
    kind = str(request.param)
    directory = tmp_path / kind
    store_class = (
        DiskCacheStreamCheckpointStore if kind == "diskcache" else FileStreamCheckpointStore
    )
    with store_class(directory) as store:
        store.claim("run-a")
        store.put(_checkpoint("run-a", partial_text="Hello, wor", retry_count=1, epoch=1))
        store.claim("run-b")
        store.claim("run-b")
        store.put(
            _checkpoint(
                "run-b",
                partial_text="Checking.",
                epoch=2,
                completed_tool_calls=[CompletedToolCall(id="c1", name="lookup", args={"q": 1})],
                in_flight_tool_call=InFlightToolCall(name="send", partial_args='{"to": "x'),
            )
        )
    return f"{kind}:{directory}"


def test_list_shows_every_in_flight_turn(store_spec: str) -> None:
    status, out = run("checkpoints", "list", "--store", store_spec)
    assert status == 0
    for shown in ("run-a", "run-b", "thread-1", "openai:gpt-4o-mini", "10 chars", "1 + 1 cut off"):
        assert shown in out


def test_list_as_json_gives_the_operator_fields(store_spec: str) -> None:
    status, out = run("checkpoints", "list", "--store", store_spec, "--json")
    assert status == 0
    rows = {row["run_id"]: row for row in json.loads(out)}
    assert set(rows) == {"run-a", "run-b"}
    a = rows["run-a"]
    assert (a["thread_id"], a["model"], a["retry_count"], a["epoch"]) == (
        "thread-1",
        "openai:gpt-4o-mini",
        1,
        1,
    )
    assert a["text_chars"] == 10
    assert a["size_bytes"] > 10
    assert 0 <= a["age_seconds"] < 60
    assert rows["run-b"]["completed_tool_calls"] == 1
    assert rows["run-b"]["in_flight_tool_call"] is True


def test_list_of_an_empty_store_says_so(tmp_path: Path) -> None:
    DiskCacheStreamCheckpointStore(tmp_path).close()
    assert run("checkpoints", "list", "--store", f"diskcache:{tmp_path}") == (
        0,
        "No in-flight turns.",
    )
    assert run("checkpoints", "list", "--store", f"diskcache:{tmp_path}", "--json") == (0, "[]")


def test_show_prints_one_turn_in_full(store_spec: str) -> None:
    status, out = run("checkpoints", "show", "run-b", "--store", store_spec)
    assert status == 0
    assert 'lookup({"q": 1}) id=c1' in out
    assert 'send: \'{"to": "x\'' in out
    assert "Checking." in out
    status, out = run("checkpoints", "show", "run-b", "--store", store_spec, "--json")
    assert json.loads(out)["completed_tool_calls"] == [
        {"id": "c1", "name": "lookup", "args": {"q": 1}, "index": 0}
    ]


def test_show_of_a_missing_run_exits_1_and_points_to_list(store_spec: str) -> None:
    status, out = run("checkpoints", "show", "run-z", "--store", store_spec)
    assert status == 1
    assert "no checkpoint for run 'run-z'" in out
    assert "checkpoints list" in out


def test_rm_removes_only_the_named_turns(store_spec: str) -> None:
    assert run("checkpoints", "rm", "run-a", "--store", store_spec) == (0, "removed run-a")
    _status, out = run("checkpoints", "list", "--store", store_spec, "--json")
    assert [row["run_id"] for row in json.loads(out)] == ["run-b"]


def test_rm_of_a_missing_run_exits_1_unless_missing_ok(store_spec: str) -> None:
    status, out = run("checkpoints", "rm", "run-z", "run-a", "--store", store_spec)
    assert status == 1
    assert "no checkpoint for run 'run-z'" in out
    assert "--missing-ok" in out
    status, out = run("checkpoints", "rm", "run-z", "--store", store_spec, "--missing-ok", "--json")
    assert status == 0
    assert json.loads(out) == {"removed": [], "missing": ["run-z"]}
    status, out = run("checkpoints", "list", "--store", store_spec, "--json")
    assert [row["run_id"] for row in json.loads(out)] == ["run-b"]


def test_gc_removes_only_turns_older_than_the_limit(tmp_path: Path) -> None:
    hour_ago = time.time() - 3600
    with DiskCacheStreamCheckpointStore(tmp_path, clock=lambda: hour_ago) as old:
        old.put(_checkpoint("stale", partial_text="old"))
    with DiskCacheStreamCheckpointStore(tmp_path) as fresh:
        fresh.put(_checkpoint("fresh", partial_text="new"))
    spec = f"diskcache:{tmp_path}"
    status, out = run("checkpoints", "gc", "--older-than", "600", "--store", spec)
    assert (status, out) == (0, "removed 1 checkpoint not written for more than 600 s")
    status, out = run("checkpoints", "list", "--store", spec, "--json")
    assert [row["run_id"] for row in json.loads(out)] == ["fresh"]
    status, out = run("checkpoints", "gc", "--older-than", "600", "--store", spec, "--json")
    assert json.loads(out) == {"removed": 0, "older_than_seconds": 600.0, "skipped": []}


def test_bad_store_values_exit_2_naming_the_forms(tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    cases = {
        "bogus": "is not a checkpoint store; write diskcache:PATH, file:PATH, or a redis://",
        "sqlite:/tmp/x": "is not a checkpoint store",
        "diskcache:": "names no directory; write diskcache:PATH",
        f"diskcache:{a_file}": "is a file, not a directory",
    }
    for spec, message in cases.items():
        status, out = run("checkpoints", "list", "--store", spec)
        assert (status, message in out) == (2, True), (spec, out)
    assert a_file.read_text() == "x"


def test_a_corrupted_checkpoint_is_listed_so_it_can_be_removed(tmp_path: Path) -> None:
    with DiskCacheStreamCheckpointStore(tmp_path) as store:
        store.put(_checkpoint("broken", partial_text="text"))
    with diskcache.Cache(str(tmp_path)) as raw:  # damage the stored text, keep the head
        raw.set(b"s\x00" + run_id_bytes("broken") + b"\x000", b"\xff\xfe\xfd")
    spec = f"diskcache:{tmp_path}"
    status, out = run("checkpoints", "list", "--store", spec)
    assert status == 0
    assert "broken" in out
    assert "corrupted" in out
    status, out = run("checkpoints", "show", "broken", "--store", spec)
    assert status == 1
    assert "cannot be read" in out
    assert run("checkpoints", "rm", "broken", "--store", spec)[0] == 0
    assert run("checkpoints", "list", "--store", spec)[1] == "No in-flight turns."


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_redis_store_urls_are_opened_lazily(tmp_path: Path) -> None:
    if importlib.util.find_spec("awaken_langchain.stores.redis") is None:
        status, out = run("checkpoints", "list", "--store", "redis://127.0.0.1:1/0")
        assert status == 2
        assert "has no Redis checkpoint store" in out
        return
    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("needs a redis-server binary")
    port = _free_port()
    process = subprocess.Popen(
        [server, "--port", str(port), "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
    )
    try:
        url = f"redis://127.0.0.1:{port}/0"
        for _ in range(100):
            status, out = run("checkpoints", "list", "--store", url, "--json")
            if status == 0:
                break
            time.sleep(0.05)
        assert (status, out) == (0, "[]")
    finally:
        process.terminate()
        process.wait(timeout=10)


# -- README ----------------------------------------------------------------------------------------


def _readme_section(title: str, page: str = "README.md") -> str:
    text = (REPO_ROOT / page).read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def test_readme_set_up_has_two_commands_the_demo_and_the_test_suite() -> None:
    setup = _readme_section("Set-up")
    commands = [line for line in setup.splitlines() if line.startswith("python3 -m venv")]
    assert len(commands) == 2
    assert commands[0].endswith(".venv/bin/awaken-langchain demo")
    assert '.venv/bin/pip install -e ".[demo]"' in commands[0]
    lines = setup.splitlines()
    marker = lines.index("# install everything and run the whole test suite")
    assert lines[marker + 1] == commands[1]
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    extras = project["project"]["optional-dependencies"]
    assert extras["demo"] == ["awaken-langchain[openai,anthropic,agents,cli,web]"]
    assert "demo" in extras["dev"][0]


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_readme_quick_start_runs_against_the_provider_api(
    provider: str,
    loopback_provider: LoopbackProvider,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    blocks = _readme_section("Against the real APIs", "docs/getting-started.md")
    blocks = blocks.split("```python\n")[1:]
    code = next(block.split("```")[0] for block in blocks if f"langchain_{provider}" in block)
    assert len(code.strip().splitlines()) == 7  # two imports, a blank line, four lines
    monkeypatch.setenv(f"{provider.upper()}_API_KEY", "test-key")
    url = loopback_provider.base_url_openai if provider == "openai" else loopback_provider.url
    monkeypatch.setenv(f"{provider.upper()}_BASE_URL", url)
    before_text = 1 if provider == "openai" else 2  # role chunk | message and block start
    loopback_provider.enqueue(  # drops after "Back", "pres", "sure"; then the rest
        Scenario(text="Backpressure is a signal.", fault=Fault.drop_after_events(before_text + 3)),
        Scenario(text=" is a signal."),
    )
    exec(compile(code, "docs/getting-started.md", "exec"), {})
    assert capsys.readouterr().out == "Backpressure is a signal."
    assert len(loopback_provider.requests) == 2  # the drop was continued


# -- chat finishes a turn a killed chat process left behind ---------------------------------------


@pytest.mark.slow
def test_chat_finishes_the_turn_a_killed_chat_process_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    answer = "One. Two. Three. Four. Five. Six. Seven. Eight. Nine. Ten. Eleven. Twelve."
    with LoopbackProvider(default=echo_responder()) as server:
        # The role event and nine text deltas before the stall: the chunk rule (a write
        # at most every 8 chunks) saves the turn however fast they arrive. With fewer,
        # only the time rule could, and it is checked when a chunk arrives: a turn whose
        # first few chunks all come within 0.25 s and then stall is not written.
        server.enqueue(Scenario(text=answer, fault=Fault.stall(60, after_events=10)))
        argv = ["chat", "--model", "openai:gpt-4o-mini", "--base-url", server.base_url_openai]
        argv += ["--dir", str(tmp_path), "--thread", "t-killed"]
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OPENAI_API_KEY": "test-key"}
        process = subprocess.Popen(
            [sys.executable, "-m", "awaken_langchain", *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        try:
            assert process.stdin is not None
            process.stdin.write("count to ten\n")
            process.stdin.flush()
            saved = None
            deadline = time.monotonic() + 90
            # Watch read-only: opening the store for writing takes SQLite's write lock,
            # and the chat's opening claim waits only checkpoint_deadline (0.5 s) for it
            # before the turn goes on without checkpoints.
            while saved is None and time.monotonic() < deadline:
                time.sleep(0.1)
                if (tmp_path / "checkpoints" / "cache.db").is_file():
                    with DiskCacheStreamCheckpointStore(
                        tmp_path / "checkpoints", read_only=True
                    ) as store:
                        found = store.list_checkpoints()
                    saved = found[0] if found and found[0].partial_text else None
            assert saved is not None, "the chat process never checkpointed its turn"
        finally:
            process.kill()
            process.wait(timeout=30)
        server.default = Scenario(text=answer[len(saved.partial_text.rstrip()) :])
        status, out = run(*argv, stdin="")
    assert status == 0, out
    assert "finishing it first" in out
    assert "awaken_resume" in out
    assert _memory(tmp_path, "t-killed") == [("human", "count to ten"), ("ai", answer)]


@pytest.mark.parametrize(
    ("fault", "shown"),
    [
        (
            Fault.drop_before_headers(),
            "awaken_retry: connection (OpenAIConnectionError: Connection error.)",
        ),
        (
            Fault.rate_limited(retry_after=1),
            "awaken_retry: rate_limited (HTTP 429), retry hint 1 s",
        ),
    ],
    ids=["no-http-status", "http-status"],
)
def test_a_retry_names_its_http_status_or_else_its_error(
    echo_server: LoopbackProvider,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fault: Fault,
    shown: str,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    echo_server.enqueue(Scenario(fault=fault))
    status, out = run(
        "chat",
        "--model",
        "openai:gpt-4o-mini",
        "--base-url",
        echo_server.base_url_openai,
        "--dir",
        str(tmp_path),
        stdin="hello\n",
    )
    assert status == 0, out
    assert shown in out
    assert "None" not in out
    assert "You said: hello" in out
