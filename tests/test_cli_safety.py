"""The operator command is safe to point at any store: it shows what is stored, exactly.

It never prints a Redis password, never lets stored text act on the terminal
(rich markup, escape sequences), never cuts a run id, never changes a store it
only reads, and one unreadable record never hides the others.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import diskcache
import pytest
from rich.console import Console

from awaken_langchain import DiskCacheStreamCheckpointStore, FileStreamCheckpointStore
from awaken_langchain.checkpoint import CompletedToolCall, StreamCheckpoint
from awaken_langchain.cli import main
from tests.redis_server import RedisServer

REPO_ROOT = Path(__file__).resolve().parent.parent
SECRET = "s3cret-pass-word"
ESC = "\x1b"


def run(*argv: str, width: int = 200) -> tuple[int, str]:
    """Run the command in-process; return its exit status and everything it printed."""
    out = io.StringIO()
    console = Console(file=out, width=width, highlight=False, color_system=None)
    status = main(list(argv), console=console)
    return status, out.getvalue()


def run_process(*argv: str, columns: int = 120) -> subprocess.CompletedProcess[str]:
    """Run `python -m awaken_langchain ARGV` in a child process importing this repository."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "COLUMNS": str(columns)}
    return subprocess.run(
        [sys.executable, "-m", "awaken_langchain", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def _checkpoint(run_id: str, **fields: object) -> StreamCheckpoint:
    return StreamCheckpoint.model_validate(
        {"run_id": run_id, "thread_id": "thread-1", "model": "openai:gpt-4o-mini", **fields}
    )


STORES = {"diskcache": DiskCacheStreamCheckpointStore, "file": FileStreamCheckpointStore}


def _fill(kind: str, directory: Path, *checkpoints: StreamCheckpoint) -> str:
    with STORES[kind](directory) as store:
        for checkpoint in checkpoints:
            store.put(checkpoint)
    return f"{kind}:{directory}"


# -- a Redis password is never printed ---------------------------------------------------------


@pytest.fixture(scope="module")
def redis_with_password(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis-auth"), password=SECRET)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_the_redis_password_is_masked_in_every_message(redis_with_password: RedisServer) -> None:
    from awaken_langchain.stores.redis import RedisStreamCheckpointStore

    url = redis_with_password.url
    assert SECRET in url
    with RedisStreamCheckpointStore.from_url(url, prefix="awaken") as store:
        store.put(_checkpoint("run-listed"))
    wrong = url.replace(SECRET, SECRET + "-wrong")
    bad_port = f"redis://:{SECRET}@127.0.0.1:notaport/0"
    in_query = f"{redis_with_password.url_without_password}?password={SECRET}"
    wrong_in_query = f"{wrong}?password={SECRET}-wrong"  # the store's errors mask only one
    outputs = {
        "list": run("checkpoints", "list", "--store", url),
        "list (password in the query)": run("checkpoints", "list", "--store", in_query),
        "show": run("checkpoints", "show", "run-missing", "--store", url),
        "rm": run("checkpoints", "rm", "run-missing", "--store", url),
        "wrong password": run("checkpoints", "list", "--store", wrong),
        "wrong password in the query": run("checkpoints", "list", "--store", wrong_in_query),
        "malformed url": run("checkpoints", "list", "--store", bad_port),
    }
    for case, (_status, out) in outputs.items():
        assert SECRET not in out, (case, out)
    assert outputs["list"][0] == 0
    assert "In-flight turns in redis://:***@127.0.0.1" in outputs["list"][1]
    assert "password=***" in outputs["list (password in the query)"][1]
    assert "no checkpoint for run 'run-missing' in redis://:***@" in outputs["show"][1]
    assert outputs["rm"][0] == 1
    assert outputs["wrong password"][0] == 1  # the store failed
    assert "redis://:***@127.0.0.1" in outputs["wrong password"][1]
    assert outputs["wrong password in the query"][0] == 1
    assert "password=***" in outputs["wrong password in the query"][1]
    assert outputs["malformed url"][0] == 2
    assert "redis://:***@127.0.0.1:notaport/0" in outputs["malformed url"][1]


def test_a_redis_head_of_the_wrong_type_is_listed_and_removable(
    redis_with_password: RedisServer,
) -> None:
    import redis

    from awaken_langchain.stores.redis import RedisStreamCheckpointStore

    url = redis_with_password.url
    with RedisStreamCheckpointStore.from_url(url) as store:
        store.put(_checkpoint("run-fine"))
    with redis.Redis.from_url(url) as client:
        client.set("awaken:{run-wrong-type}:head", "a string, not a hash")
    status, out = run("checkpoints", "list", "--store", url, "--json")
    assert status == 0, out
    rows = {row["run_id"]: row for row in json.loads(out)}
    assert "error" not in rows["run-fine"]
    assert "WRONGTYPE" in rows["run-wrong-type"]["error"]
    assert run("checkpoints", "rm", "run-wrong-type", "--store", url)[0] == 0
    status, out = run("checkpoints", "list", "--store", url, "--json")
    assert "run-wrong-type" not in {row["run_id"] for row in json.loads(out)}


# -- stored strings are shown literally ----------------------------------------------------------


MARKUP_RUN = "[bold]run-9[/bold]"
ESCAPE_RUN = f"run-{ESC}[31mred"


@pytest.fixture(params=sorted(STORES))
def hostile_store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store whose ids, tool arguments and text are rich markup and terminal escapes."""
    return _fill(
        str(request.param),
        tmp_path / "store",
        _checkpoint("user-run", thread_id="user-[/]"),
        _checkpoint(MARKUP_RUN, model=":thumbs_up:"),
        _checkpoint(ESCAPE_RUN, partial_text=f"before{ESC}[2Jafter\nline two\u202e"),
        _checkpoint(
            "tool-run",
            completed_tool_calls=[CompletedToolCall(id="c1", name="read", args={"path": "[/tmp]"})],
        ),
    )


def test_list_shows_markup_and_escapes_in_ids_literally(hostile_store: str) -> None:
    status, out = run("checkpoints", "list", "--store", hostile_store)
    assert status == 0, out
    assert "user-[/]" in out
    assert MARKUP_RUN in out
    assert ":thumbs_up:" in out
    assert "run-\\x1b[31mred" in out
    assert ESC not in out


def test_show_prints_tool_arguments_and_text_literally(hostile_store: str) -> None:
    status, out = run("checkpoints", "show", "tool-run", "--store", hostile_store)
    assert status == 0, out
    assert 'read({"path": "[/tmp]"}) id=c1' in out
    status, out = run("checkpoints", "show", ESCAPE_RUN, "--store", hostile_store)
    assert status == 0, out
    assert "Checkpoint run-\\x1b[31mred" in out
    assert "before\\x1b[2Jafter" in out
    assert "line two\\u202e" in out
    assert ESC not in out
    status, out = run("checkpoints", "show", MARKUP_RUN, "--store", hostile_store)
    assert f"Checkpoint {MARKUP_RUN}" in out


def test_errors_show_the_requested_id_literally(hostile_store: str) -> None:
    status, out = run("checkpoints", "show", f"[red]gone{ESC}[2J", "--store", hostile_store)
    assert status == 1
    assert "no checkpoint for run '[red]gone\\x1b[2J'" in out
    assert ESC not in out


def test_json_output_stays_plain_json_with_the_exact_ids(hostile_store: str) -> None:
    status, out = run("checkpoints", "list", "--store", hostile_store, "--json")
    assert status == 0
    assert ESC not in out  # escaped the JSON way, \u001b
    rows = {row["run_id"]: row for row in json.loads(out)}
    assert set(rows) == {"user-run", MARKUP_RUN, ESCAPE_RUN, "tool-run"}
    assert rows["user-run"]["thread_id"] == "user-[/]"
    status, out = run("checkpoints", "show", ESCAPE_RUN, "--store", hostile_store, "--json")
    assert json.loads(out)["partial_text"] == f"before{ESC}[2Jafter\nline two\u202e"


def test_a_screen_clearing_run_id_reaches_a_real_terminal_escaped(hostile_store: str) -> None:
    result = run_process("checkpoints", "list", "--store", hostile_store)
    assert result.returncode == 0, result.stderr
    assert "run-\\x1b[31mred" in result.stdout
    assert ESC not in result.stdout
    result = run_process("checkpoints", "show", ESCAPE_RUN, "--store", hostile_store)
    assert result.returncode == 0, result.stderr
    assert ESC not in result.stdout


# -- run ids are never cut -----------------------------------------------------------------------


@pytest.mark.parametrize("width", [30, 60, 80, 120, 200])
def test_list_never_cuts_a_run_id_at_any_terminal_width(width: int, tmp_path: Path) -> None:
    run_ids = [str(uuid.UUID(int=n * 0x1234567890ABCDEF1234567890ABCDEF)) for n in (1, 2, 3)]
    spec = _fill(
        "diskcache",
        tmp_path,
        *(
            _checkpoint(
                run_id,
                thread_id=f"a-long-thread-identifier-{run_id}",
                model="anthropic:claude-sonnet-5-20990101",
                partial_text="x" * 1000,
            )
            for run_id in run_ids
        ),
    )
    status, out = run("checkpoints", "list", "--store", spec, width=width)
    assert status == 0
    for run_id in run_ids:
        assert run_id in out, out


def test_list_at_120_columns_keeps_every_uuid_whole_in_a_real_process(tmp_path: Path) -> None:
    run_ids = [str(uuid.uuid4()) for _ in range(3)]
    spec = _fill(
        "file",
        tmp_path,
        *(_checkpoint(r, thread_id=f"thread-{uuid.uuid4()}") for r in run_ids),
    )
    result = run_process("checkpoints", "list", "--store", spec, columns=120)
    assert result.returncode == 0, result.stderr
    for run_id in run_ids:
        assert run_id in result.stdout, result.stdout


# -- list and show change nothing on disk --------------------------------------------------------


def _snapshot(directory: Path) -> dict[str, tuple[int, int, str]]:
    """Every path under ``directory``: mode, size and content digest (the directory's mode too)."""
    found = {".": (directory.stat().st_mode, 0, "")}
    for path in sorted(directory.rglob("*")):
        info = path.stat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""
        found[str(path.relative_to(directory))] = (info.st_mode, info.st_size, digest)
    return found


@pytest.mark.parametrize("kind", sorted(STORES))
def test_list_and_show_change_nothing_on_disk(kind: str, tmp_path: Path) -> None:
    directory = tmp_path / "store"
    spec = _fill(kind, directory, _checkpoint("run-a", partial_text="Hello"))
    os.chmod(directory, 0o755)
    before = _snapshot(directory)
    for argv in (("list",), ("list", "--json"), ("show", "run-a"), ("show", "run-z")):
        result = run_process("checkpoints", *argv, "--store", spec)
        assert result.returncode in (0, 1), result.stderr
        assert _snapshot(directory) == before, argv


@pytest.mark.parametrize("kind", sorted(STORES))
@pytest.mark.parametrize("action", ["list", "show", "rm", "gc"])
def test_a_directory_without_a_store_exits_1_naming_the_path(
    kind: str, action: str, tmp_path: Path
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o755)
    os.chmod(empty, 0o755)
    argv = {"list": [], "show": ["run-a"], "rm": ["run-a"], "gc": ["--older-than", "5"]}[action]
    status, out = run("checkpoints", action, *argv, "--store", f"{kind}:{empty}")
    assert status == 1, out
    assert f"there is no checkpoint store at {empty}" in " ".join(out.split())
    assert list(empty.iterdir()) == []
    assert empty.stat().st_mode & 0o777 == 0o755
    status, out = run("checkpoints", action, *argv, "--store", f"{kind}:{tmp_path / 'missing'}")
    assert status == 1
    assert "(no such directory)" in out
    assert not (tmp_path / "missing").exists()


# -- one unreadable record never hides the others -------------------------------------------------


def _plant_pickled_key(directory: Path) -> None:
    """Write an entry under a pickled key, as diskcache does for any key that is not bytes/str."""
    with diskcache.Cache(str(directory)) as raw:
        raw.set(("h", "planted"), b"anything")


def _plant_undecodable_head_key(directory: Path) -> None:
    with diskcache.Cache(str(directory)) as raw:
        raw.set(b"h\x00\xff\xfe", b"{}")


def _plant_broken_log(directory: Path) -> None:
    (directory / (hashlib.sha256(b"lost").hexdigest() + ".log")).write_bytes(b"not a frame")


@pytest.mark.parametrize(
    ("kind", "plant", "reason"),
    [
        ("diskcache", _plant_pickled_key, "its key is pickled, which is never unpickled"),
        ("diskcache", _plant_undecodable_head_key, "its key names no UTF-8 run id"),
        ("file", _plant_broken_log, "names no run id it can be read back for"),
    ],
    ids=["diskcache-pickled-key", "diskcache-undecodable-key", "file-broken-log"],
)
def test_an_unreadable_record_is_listed_skipped_by_gc_and_removable(
    kind: str, plant: object, reason: str, tmp_path: Path
) -> None:
    directory = tmp_path / kind
    spec = _fill(kind, directory, _checkpoint("run-good", partial_text="fine"))
    assert callable(plant)
    plant(directory)

    status, out = run("checkpoints", "list", "--store", spec, "--json")
    assert status == 0, out
    rows = json.loads(out)
    (good,) = [row for row in rows if row["run_id"] == "run-good"]
    assert "error" not in good
    (bad,) = [row for row in rows if "error" in row]
    assert reason in bad["error"]

    status, out = run("checkpoints", "list", "--store", spec)
    assert status == 0
    assert "run-good" in out
    assert f"cannot be read: {bad['run_id']}" in out

    status, out = run("checkpoints", "show", bad["run_id"], "--store", spec)
    assert status == 1
    assert reason in " ".join(out.split())

    status, out = run("checkpoints", "gc", "--older-than", "3600", "--store", spec)
    assert status == 0, out
    assert "removed 0 checkpoints" in out
    assert "skipped 1 checkpoint that cannot be read" in out
    assert bad["run_id"] in out
    status, out = run("checkpoints", "gc", "--older-than", "3600", "--store", spec, "--json")
    assert [row["run_id"] for row in json.loads(out)["skipped"]] == [bad["run_id"]]

    status, out = run("checkpoints", "rm", bad["run_id"], "--store", spec)
    assert status == 0, out
    status, out = run("checkpoints", "list", "--store", spec, "--json")
    assert [row["run_id"] for row in json.loads(out)] == ["run-good"]
    with STORES[kind](directory) as store:
        kept = store.get("run-good")
    assert kept is not None
    assert kept.partial_text == "fine"


def test_an_unreadable_entry_id_never_removes_a_readable_record(tmp_path: Path) -> None:
    from awaken_langchain.stores._base import unreadable_id

    spec = _fill("diskcache", tmp_path, _checkpoint("run-good"))
    disguised = unreadable_id(b"\x01h\x00run-good")  # names a readable head key
    status, out = run("checkpoints", "rm", disguised, "--store", spec)
    assert status == 1
    status, out = run("checkpoints", "list", "--store", spec, "--json")
    assert [row["run_id"] for row in json.loads(out)] == ["run-good"]


# -- rich is an extra of the command, never needed by the library ---------------------------------

BLOCK_RICH = """
import sys

class RefuseRich:
    def find_spec(self, name, path=None, target=None):
        if name == "rich" or name.startswith("rich."):
            raise ImportError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, RefuseRich())
"""


def _python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [sys.executable, "-c", BLOCK_RICH + code, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


COMMAND_MODULES = {"awaken_langchain.cli", "awaken_langchain._session"}
COMMAND_PACKAGES = ("awaken_langchain.demo.",)


def test_the_library_imports_without_rich() -> None:
    modules = sorted(
        ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts)
        for path in (REPO_ROOT / "awaken_langchain").rglob("*.py")
        if path.name != "__main__.py"
    )
    library = [
        m.removesuffix(".__init__")
        for m in modules
        if m not in COMMAND_MODULES and not m.startswith(COMMAND_PACKAGES)
    ]
    result = _python(
        "import importlib, sys\n"
        f"for name in {library!r}:\n"
        "    importlib.import_module(name)\n"
        "import awaken_langchain.cli\n"  # the command's module itself imports without rich
        "assert not any(m == 'rich' or m.startswith('rich.') for m in sys.modules)\n"
        "print('ok', len(sys.modules))\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok")


def test_the_command_without_rich_says_how_to_install_it_and_exits_2(tmp_path: Path) -> None:
    result = _python(
        "import sys\nfrom awaken_langchain.cli import main\nraise SystemExit(main(sys.argv[1:]))\n",
        "checkpoints",
        "list",
        "--store",
        f"diskcache:{tmp_path}",
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1
    assert "pip install 'awaken-langchain[cli]'" in result.stderr
    assert list(tmp_path.iterdir()) == []


# -- chat shows names and model text literally too ----------------------------------------------


def test_chat_shows_a_markup_thread_and_escaped_model_text_literally(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from awaken_langchain.testing import LoopbackProvider, echo_responder

    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    out = io.StringIO()
    console = Console(file=out, width=200, highlight=False, color_system=None)
    with LoopbackProvider(default=echo_responder()) as server:
        argv = ["chat", "--model", "openai:gpt-4o-mini", "--base-url", server.base_url_openai]
        argv += ["--dir", str(tmp_path), "--thread", "[bold]t-1[/]"]
        status = main(argv, stdin=io.StringIO(f"clear{ESC}[2Jnow\n"), console=console)
    printed = out.getvalue()
    assert status == 0, printed
    assert "thread [bold]t-1[/];" in printed
    assert "continue it with --thread [bold]t-1[/]." in printed
    assert "You said: clear\\x1b[2Jnow" in printed
    assert ESC not in printed
