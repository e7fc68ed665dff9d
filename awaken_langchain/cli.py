"""The ``awaken-langchain`` command.

- ``awaken-langchain demo``: the whole mission, offline, against a loopback provider.
- ``awaken-langchain chat --model PROVIDER:MODEL``: an interactive, recovering chat.
- ``awaken-langchain checkpoints list|show|rm|gc``: operators see and manage in-flight turns.

Exit status: 0 on success, 1 when the command ran but failed (a demo claim did
not hold, a checkpoint was not found), 2 on bad input.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from awaken_langchain._extras import (
    INSTALL_CLI,
    PROVIDER_EXTRAS,
    CommandError,
    require,
    require_agents,
    visible,
)
from awaken_langchain._secrets import redact
from awaken_langchain.checkpoint import StreamCheckpoint, StreamCheckpointStore, encode_checkpoint
from awaken_langchain.errors import StreamCheckpointError

if TYPE_CHECKING:  # rich is an extra: imported when the command runs, never by the library
    from rich.console import Console
    from rich.text import Text

DEFAULT_DIR = Path(".awaken")
"""Where ``demo`` and ``chat`` keep checkpoints and memory unless ``--dir`` says otherwise."""

STORE_FORMS = "diskcache:PATH, file:PATH, or a redis://, rediss://, unix:// or postgresql:// URL"


def shown_store(spec: str) -> str:
    """``spec`` as the command prints it: its passwords masked as ``***``.

    Masks what :func:`~awaken_langchain._secrets.redact` masks, also in a
    malformed URL, and escapes hidden characters (see :func:`visible`).
    """
    return visible(redact(spec, spec=spec))


# -- checkpoint stores by name ---------------------------------------------------------------


def open_store(
    spec: str, *, ttl: float | None = None, read_only: bool = False
) -> StreamCheckpointStore:
    """Open the checkpoint store that ``spec`` names.

    A local store must already exist; it is never created here.

    Args:
        spec: ``diskcache:PATH``, ``file:PATH``, or a ``redis://``, ``rediss://``,
            ``unix://`` or ``postgresql://`` URL.
        ttl: The store's TTL (what ``gc`` removes).
        read_only: Open a local store for reading only: nothing on disk changes.

    Raises:
        CommandError: If ``spec`` is malformed, needs an extra that is not
            installed (exit status 2), or names no store (exit status 1).
    """
    shown = shown_store(spec)
    scheme, sep, rest = spec.partition(":")
    if scheme in ("redis", "rediss", "unix") and sep:
        require("redis", "redis", purpose=f"--store {scheme}://...")
        try:
            redis_store = importlib.import_module("awaken_langchain.stores.redis")
        except ImportError as exc:
            raise CommandError(
                "this version of awaken-langchain has no Redis checkpoint store "
                f"(awaken_langchain.stores.redis: {exc}); upgrade awaken-langchain"
            ) from exc
        try:
            store: StreamCheckpointStore = redis_store.RedisStreamCheckpointStore.from_url(
                spec, ttl=ttl
            )
            return store
        except (ValueError, StreamCheckpointError) as exc:
            raise CommandError(f"--store {shown}: {redact(str(exc), spec=spec)}") from exc
    if scheme in ("postgres", "postgresql") and sep:
        require("psycopg", "postgres", purpose=f"--store {scheme}://...")
        require("psycopg_pool", "postgres", purpose=f"--store {scheme}://...")
        from awaken_langchain.stores.postgres import PostgresStreamCheckpointStore

        try:
            return PostgresStreamCheckpointStore(spec, ttl=ttl, read_only=read_only)
        except (ValueError, StreamCheckpointError) as exc:
            raise CommandError(f"--store {shown}: {redact(str(exc), spec=spec)}") from exc
    if scheme in ("diskcache", "file") and sep:
        if not rest:
            raise CommandError(f"--store {shown} names no directory; write {scheme}:PATH")
        path = Path(rest).expanduser()
        if path.exists() and not path.is_dir():
            raise CommandError(f"--store {shown}: {visible(str(path))} is a file, not a directory")
        from awaken_langchain.stores.diskcache import DiskCacheStreamCheckpointStore
        from awaken_langchain.stores.file import FileStreamCheckpointStore

        store_class = (
            DiskCacheStreamCheckpointStore if scheme == "diskcache" else FileStreamCheckpointStore
        )
        try:
            # Opening read-only first proves a store is there, without creating one.
            local = store_class(path, ttl=ttl, read_only=True)
            if not read_only:
                local.close()
                local = store_class(path, ttl=ttl)
            return local
        except StreamCheckpointError as exc:
            raise CommandError(f"--store {shown}: {exc}", exit_code=1) from exc
    raise CommandError(f"--store {shown!r} is not a checkpoint store; write {STORE_FORMS}")


# -- checkpoints ---------------------------------------------------------------------------------


def _row(store: StreamCheckpointStore, run_id: str, now: float) -> dict[str, Any]:
    """One checkpoint as the operator sees it (or why it cannot be read)."""
    try:
        checkpoint = store.get(run_id)
    except StreamCheckpointError as exc:
        return {"run_id": run_id, "error": str(exc)}
    if checkpoint is None:
        return {"run_id": run_id, "error": "gone (completed or expired meanwhile)"}
    return _summary(checkpoint, now)


def _summary(checkpoint: StreamCheckpoint, now: float) -> dict[str, Any]:
    return {
        "run_id": checkpoint.run_id,
        "thread_id": checkpoint.thread_id,
        "model": checkpoint.model,
        "age_seconds": round(max(0.0, now - checkpoint.updated_at), 3),
        "updated_at": checkpoint.updated_at,
        "size_bytes": len(encode_checkpoint(checkpoint)),
        "retry_count": checkpoint.retry_count,
        "epoch": checkpoint.epoch,
        "text_chars": len(checkpoint.partial_text),
        "completed_tool_calls": len(checkpoint.completed_tool_calls),
        "in_flight_tool_call": checkpoint.in_flight_tool_call is not None,
    }


def _rows(store: StreamCheckpointStore, *, ledger: bool = False) -> list[dict[str, Any]]:
    """The store's in-flight turns, or (``ledger``) its tool ledger records."""
    from awaken_langchain._ledger_record import LEDGER_PREFIX

    now = store.clock()
    return [
        (_ledger_row if ledger else _row)(store, run_id, now)
        for run_id in store.list_run_ids()
        if run_id.startswith(LEDGER_PREFIX) == ledger
    ]


def _ledger_row(store: StreamCheckpointStore, run_id: str, now: float) -> dict[str, Any]:
    """One tool ledger record as the operator sees it (or why it cannot be read)."""
    from awaken_langchain._ledger_record import read_record

    try:
        checkpoint = store.get(run_id)
        if checkpoint is None:
            return {"run_id": run_id, "error": "gone (expired or removed meanwhile)"}
        record = read_record(checkpoint)
    except StreamCheckpointError as exc:
        return {"run_id": run_id, "error": str(exc)}
    return {
        "run_id": run_id,
        "scope": record.scope,
        "tool": record.tool,
        "tool_call_id": record.tool_call_id,
        "state": record.state,
        "epoch": record.epoch,
        "age_seconds": round(max(0.0, now - checkpoint.updated_at), 3),
        "size_bytes": len(encode_checkpoint(checkpoint)),
    }


_LEDGER_COLUMNS = ("record", "thread", "tool", "call id", "state", "age")


def _print_ledger_rows(console: Console, rows: list[dict[str, Any]], title: str) -> None:
    """Print ledger records as a table (record keys whole), unreadable ones after it."""
    from rich.table import Table

    table = Table(title=_literal(title))
    for column in _LEDGER_COLUMNS:
        table.add_column(column, no_wrap=column == "record")
    for row in rows:
        if "error" not in row:
            values = (
                row["run_id"],
                row["scope"],
                row["tool"],
                row["tool_call_id"],
                row["state"],
                _age(row["age_seconds"]),
            )
            table.add_row(*(_literal(value) for value in values))
    console.print(table)
    for unreadable in (row for row in rows if "error" in row):
        console.print(
            _literal("cannot be read: ", "bold red")
            + _literal(unreadable["run_id"])
            + _literal(f": {unreadable['error']}", "red"),
            soft_wrap=True,
        )


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} d"


def _size(size: int) -> str:
    return f"{size} B" if size < 10_000 else f"{size / 1024:.0f} KiB"


def _literal(value: object, style: str = "", *, keep: str = "") -> Text:
    """Stored text as rich shows it: no markup, no emoji codes, hidden characters escaped.

    Args:
        value: What to show (``str()`` of it).
        style: The rich style of the whole text.
        keep: Characters shown as themselves (see :func:`visible`).
    """
    from rich.text import Text

    return Text(visible(str(value), keep=keep), style=style)


_ROOM_PER_COLUMN = 7
"""Terminal cells each column but the run needs (4 of content, padding and border) for a table."""

_COLUMNS = ("run", "thread", "model", "age", "size", "retries", "epoch", "text", "tools")


def _cells(row: dict[str, Any]) -> list[Text]:
    """The table cells of one readable row, every stored string shown literally."""
    tools = str(row["completed_tool_calls"]) + (
        " + 1 cut off" if row["in_flight_tool_call"] else ""
    )
    values = (
        row["run_id"],
        row["thread_id"] or "-",
        row["model"] or "-",
        _age(row["age_seconds"]),
        _size(row["size_bytes"]),
        row["retry_count"],
        row["epoch"],
        f"{row['text_chars']} chars",
        tools,
    )
    return [_literal(value) for value in values]


def _print_rows(console: Console, rows: list[dict[str, Any]], title: str) -> None:
    """Print rows as a table whose run ids are whole, or, if none fits, one block per run.

    Run ids are what an operator copies into ``show`` and ``rm``: they are never
    cut, folded or shortened; every other column may fold or shrink. Records
    that cannot be read follow the table, one line each with the reason.
    """
    from rich.segment import Segment, Segments
    from rich.table import Table

    cells = [_cells(row) for row in rows if "error" not in row]
    widest = max((row[0].cell_len for row in cells), default=3)
    table = Table(title=_literal(title))
    for column in _COLUMNS:
        table.add_column(
            column,
            justify="right" if column in ("age", "size", "retries", "epoch") else "left",
            no_wrap=column == "run",
            min_width=widest if column == "run" else None,
        )
    for row in cells:
        table.add_row(*row)
    # a table whose other columns have room to show something, and whose ids are whole
    roomy = console.width >= widest + _ROOM_PER_COLUMN * (len(_COLUMNS) - 1) + 4
    lines = console.render_lines(table, console.options, pad=False) if cells and roomy else []
    rendered = "\n".join("".join(segment.text for segment in line) for line in lines)
    if lines and all(row[0].plain in rendered for row in cells):
        console.print(Segments(segment for line in lines for segment in (*line, Segment.line())))
    else:  # no readable turn, or too narrow a terminal for a table with whole ids
        console.print(_literal(title, "bold"), soft_wrap=True)
        for row in cells:
            console.print(_literal("run ", "bold") + row[0], soft_wrap=True)
            fields = zip(_COLUMNS[1:], row[1:], strict=True)
            console.print(_literal("  " + ", ".join(f"{n} {cell.plain}" for n, cell in fields)))
    for unreadable in (row for row in rows if "error" in row):
        console.print(
            _literal("cannot be read: ", "bold red")
            + _literal(unreadable["run_id"])
            + _literal(f": {unreadable['error']}", "red"),
            soft_wrap=True,
        )


def cmd_checkpoints_list(args: argparse.Namespace, console: Console) -> int:
    """List in-flight turns (or, with ``--ledger``, tool ledger records)."""
    with _store(args, read_only=True) as store:
        rows = _rows(store, ledger=args.ledger)
    if args.json:
        _print_json(console, rows)
        return 0
    if args.ledger:
        if not rows:
            console.print(_literal("No tool ledger records."))
        else:
            _print_ledger_rows(console, rows, f"Tool ledger records in {shown_store(args.store)}")
        return 0
    if not rows:
        console.print(_literal("No in-flight turns."))
        return 0
    _print_rows(console, rows, f"In-flight turns in {shown_store(args.store)}")
    return 0


def cmd_checkpoints_show(args: argparse.Namespace, console: Console) -> int:
    """Show one in-flight turn."""
    from rich.table import Table

    with _store(args, read_only=True) as store:
        try:
            checkpoint = store.get(args.run_id)
        except StreamCheckpointError as exc:
            raise CommandError(
                f"checkpoint {args.run_id!r} cannot be read: {exc}", exit_code=1
            ) from exc
        now = store.clock()
    if checkpoint is None:
        raise CommandError(_not_found(args.run_id, args.store), exit_code=1)
    from awaken_langchain._ledger_record import is_ledger_record

    if is_ledger_record(checkpoint):
        return _show_ledger_record(args, console, checkpoint, now)
    if args.json:
        _print_json(console, checkpoint.model_dump(mode="json"))
        return 0
    summary = _summary(checkpoint, now)
    console.print(_literal("Checkpoint ", "bold") + _literal(checkpoint.run_id), soft_wrap=True)
    table = Table(show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    fields: list[tuple[str, str]] = [
        ("thread", checkpoint.thread_id or "-"),
        ("model", checkpoint.model or "-"),
        ("message id", checkpoint.message_id or "-"),
        ("age", _age(summary["age_seconds"])),
        ("size", _size(summary["size_bytes"])),
        ("retries", str(checkpoint.retry_count)),
        ("epoch", str(checkpoint.epoch)),
    ]
    for call in checkpoint.completed_tool_calls:
        fields.append(("tool call", f"{call.name}({json.dumps(call.args)}) id={call.id}"))
    if checkpoint.in_flight_tool_call is not None:
        cut = checkpoint.in_flight_tool_call
        fields.append(("cut-off call", f"{cut.name}: {cut.partial_args!r}"))
    for name, value in fields:
        table.add_row(name, _literal(value))
    table.add_row("text", _literal(checkpoint.partial_text or "(none)", keep="\n\t"))
    console.print(table)
    return 0


def _show_ledger_record(
    args: argparse.Namespace, console: Console, checkpoint: StreamCheckpoint, now: float
) -> int:
    """Show one tool ledger record in full."""
    import dataclasses

    from rich.table import Table

    from awaken_langchain._ledger_record import read_record

    try:
        record = read_record(checkpoint)
    except StreamCheckpointError as exc:
        raise CommandError(f"record {args.run_id!r} cannot be read: {exc}", exit_code=1) from exc
    if args.json:
        _print_json(console, dataclasses.asdict(record))
        return 0
    console.print(_literal("Tool ledger record ", "bold") + _literal(record.run_id), soft_wrap=True)
    table = Table(show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    fields = [
        ("idempotency key", record.key),
        ("thread", record.scope),
        ("tool call id", record.tool_call_id),
        ("tool", f"{record.tool}({json.dumps(record.args, ensure_ascii=False)})"),
        ("state", record.state),
        ("epoch", str(record.epoch)),
        ("started", f"{_age(max(0.0, now - record.started_at))} ago"),
    ]
    if record.ended_at is not None:
        fields.append(("ended", f"{_age(max(0.0, now - record.ended_at))} ago"))
    if record.result is not None:
        fields.append(("result", json.dumps(record.result, ensure_ascii=False)))
    if record.error is not None:
        fields.append(("error", record.error))
    for name, value in fields:
        table.add_row(name, _literal(value))
    console.print(table)
    return 0


def cmd_checkpoints_rm(args: argparse.Namespace, console: Console) -> int:
    """Remove in-flight turns."""
    missing = []
    with _store(args) as store:
        present = set(store.list_run_ids())
        for run_id in args.run_ids:
            if run_id not in present:
                missing.append(run_id)
                continue
            store.delete(run_id)
            if not args.json:
                console.print(_literal(f"removed {run_id}"), soft_wrap=True)
    if args.json:
        removed = [r for r in args.run_ids if r not in missing]
        _print_json(console, {"removed": removed, "missing": missing})
    if missing and not args.missing_ok:
        raise CommandError(
            "; ".join(_not_found(run_id, args.store) for run_id in missing)
            + " (pass --missing-ok to ignore)",
            exit_code=1,
        )
    return 0


def cmd_checkpoints_gc(args: argparse.Namespace, console: Console) -> int:
    """Remove checkpoints not written for longer than ``--older-than``.

    A checkpoint that cannot be read is skipped and reported, never a reason to stop.
    """
    with _store(args, ttl=args.older_than) as store:
        removed = store.gc()
        skipped = [row for row in _rows(store) + _rows(store, ledger=True) if "error" in row]
    if args.json:
        _print_json(
            console,
            {"removed": removed, "older_than_seconds": args.older_than, "skipped": skipped},
        )
        return 0
    console.print(
        f"removed {removed} checkpoint{'s' if removed != 1 else ''} "
        f"not written for more than {args.older_than:g} s"
    )
    if skipped:
        console.print(
            _literal(
                f"skipped {len(skipped)} checkpoint{'s' if len(skipped) != 1 else ''} that "
                "cannot be read (remove with `awaken-langchain checkpoints rm RUN`):",
                "yellow",
            )
        )
        for row in skipped:
            console.print(_literal(f"  {row['run_id']}: {row['error']}"), soft_wrap=True)
    return 0


@contextmanager
def _store(
    args: argparse.Namespace, *, ttl: float | None = None, read_only: bool = False
) -> Iterator[StreamCheckpointStore]:
    store = open_store(args.store, ttl=ttl, read_only=read_only)
    try:
        yield store
    except StreamCheckpointError as exc:
        raise CommandError(
            f"the checkpoint store failed: {redact(str(exc), spec=args.store)}", exit_code=1
        ) from exc
    finally:
        store.close()


def _not_found(run_id: str, store: str) -> str:
    shown = shown_store(store)
    return (
        f"no checkpoint for run {run_id!r} in {shown}; "
        f"`awaken-langchain checkpoints list --store {shown}` shows the in-flight turns"
    )


def _print_json(console: Console, value: Any) -> None:
    r"""Print ``value`` as JSON; hidden characters (``\u001b``, ``\u202e``) as JSON escapes."""
    text = json.dumps(value, indent=2, ensure_ascii=False)
    if not text.replace("\n", "").isprintable():
        text = "".join(
            json.dumps(char)[1:-1] if char != "\n" and visible(char) != char else char
            for char in text
        )
    console.file.write(text + "\n")
    console.file.flush()


# -- demo ------------------------------------------------------------------------------------------


def cmd_demo(args: argparse.Namespace, console: Console) -> int:
    """Run the demo."""
    from awaken_langchain.demo import DemoSettings, run_demo

    steps = tuple(s.strip() for s in args.steps.split(",") if s.strip())
    settings = DemoSettings(
        directory=args.dir,
        provider=args.provider,
        speed=args.speed,
        steps=steps,
        inject_failure=args.inject_failure,
    )
    return 0 if run_demo(settings, console) else 1


# -- chat ------------------------------------------------------------------------------------------


def chat_model(spec: str, base_url: str | None) -> Any:
    """Create the provider's chat model with ``init_chat_model``.

    Raises:
        CommandError: If the spec is malformed, the integration is not
            installed, or the client cannot be created (for example no API key).
    """
    provider, sep, name = spec.partition(":")
    if not sep or not provider or not name:
        raise CommandError(
            f"--model {spec!r} must be PROVIDER:MODEL, for example openai:gpt-4o-mini or "
            "anthropic:claude-sonnet-5"
        )
    if provider in PROVIDER_EXTRAS:
        module, extra = PROVIDER_EXTRAS[provider]
        require(module, extra, purpose=f"--model {spec}")
    from langchain.chat_models import init_chat_model

    settings: dict[str, Any] = {}
    if base_url is not None:
        settings["base_url"] = base_url
    if provider in PROVIDER_EXTRAS:
        settings["max_retries"] = 0  # the wrapper retries; SDK retries would hide failures
    try:
        return init_chat_model(f"{provider}:{name}", **settings)
    except ImportError as exc:
        raise CommandError(
            f"--model {spec}: the LangChain integration for {provider!r} is not installed ({exc})"
        ) from exc
    except ValueError as exc:  # an unknown provider or model
        first_line = str(exc).strip().splitlines()[0]
        raise CommandError(f"--model {spec}: {first_line}; check the provider name") from exc
    except Exception as exc:
        key = f"{provider.upper()}_API_KEY"
        raise CommandError(
            f"--model {spec}: the chat model could not be created: {exc}. "
            f"Check the provider name and its API key (usually the {key} environment variable)"
        ) from exc


def cmd_chat(args: argparse.Namespace, console: Console, stdin: IO[str]) -> int:
    """Chat interactively; every turn is recoverable and committed to memory."""
    from rich.text import Text

    from awaken_langchain._session import (
        CHECKPOINTS_DIR,
        MEMORY_FILE,
        Record,
        Screen,
        assemble_agent,
        pending_turn,
        run_turn,
    )

    require_agents("awaken-langchain chat")
    client = chat_model(args.model, args.base_url)
    thread = args.thread or f"chat-{uuid.uuid4().hex[:12]}"
    agent = assemble_agent(args.dir, client)
    screen = Screen(console)

    def show(record: Record) -> None:
        screen.record(record)

    def turn(question: str | None) -> bool:
        try:
            run_turn(agent, thread, question, show)
            screen.note("")
            return True
        except KeyboardInterrupt:
            raise
        except Exception as exc:
            screen.note(
                f"the turn failed and was not committed: {type(exc).__name__}: {exc}", "bold red"
            )
            return False

    failures = 0
    try:
        console.print(
            Text.assemble(
                ("awaken-langchain chat", "bold"),
                visible(
                    f" with {args.model}; thread {thread}; checkpoints in "
                    f"{args.dir / CHECKPOINTS_DIR}, memory in {args.dir / MEMORY_FILE}. "
                    "Type /exit (or end the input) to leave."
                ),
            )
        )
        if pending_turn(agent, thread):
            screen.note("This thread has an unfinished turn; finishing it first.", "bold yellow")
            screen.console.print(Text("model ", style="bold green"), end="")
            failures += not turn(None)
        while True:
            console.print(Text("you> ", style="bold cyan"), end="")
            line = stdin.readline()
            if not line:
                console.print()
                break
            message = line.strip()
            if message in ("/exit", "/quit"):
                break
            if not message:
                continue
            console.print(Text("model ", style="bold green"), end="")
            failures += not turn(message)
    finally:
        agent.close()
    console.print(
        _literal(f"Thread {thread} is saved; continue it with --thread {thread}."), soft_wrap=True
    )
    return 1 if failures else 0


# -- the parser ------------------------------------------------------------------------------------


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser."""
    parser = argparse.ArgumentParser(
        prog="awaken-langchain",
        description="Streamed LLM turns that survive failure, for LangChain.",
    )
    from awaken_langchain import __version__

    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    demo = commands.add_parser(
        "demo",
        help="see retries, continuations, whole tool calls and process replacement, offline",
        description=(
            "Run an agent through the real ChatOpenAI (or ChatAnthropic) client against a "
            "loopback provider that fails on purpose: a 429 with a retry hint, a connection "
            "drop mid-answer, a tool call cut off mid-arguments, and a worker process killed "
            "mid-stream. Every claim is checked against the recorded facts; the exit status "
            "is 1 if any does not hold."
        ),
    )
    demo.add_argument(
        "--dir",
        type=Path,
        default=DEFAULT_DIR,
        help="where checkpoints and memory are kept (default ./.awaken)",
    )
    demo.add_argument(
        "--provider",
        choices=sorted(PROVIDER_EXTRAS),
        default="openai",
        help="which client and wire format to use (default openai)",
    )
    demo.add_argument(
        "--speed",
        type=_positive,
        default=1.0,
        help="divide every delay by this factor (default 1: about a minute)",
    )
    demo.add_argument(
        "--steps",
        default="a,b,c,d,e,f",
        help="which steps to run, comma-separated (default a,b,c,d,e,f)",
    )
    demo.add_argument(
        "--inject-failure",
        choices=("retry", "continuation", "tool", "replacement"),
        default=None,
        help=(
            "break one claim on purpose to see the checks fail: no retry budget, a "
            "continuation that repeats an earlier sentence, a re-issued tool call sent "
            "twice, or a replacement worker that cannot see the checkpoints"
        ),
    )
    demo.set_defaults(handler=cmd_demo)

    chat = commands.add_parser(
        "chat",
        help="chat with a real model; every turn recoverable, memory on disk",
        description=(
            "An interactive chat through langchain's init_chat_model, wrapped in "
            "RecoveringChatModel, with checkpoints and a LangGraph memory in --dir. "
            "Needs the provider's API key (OPENAI_API_KEY, ANTHROPIC_API_KEY, ...)."
        ),
    )
    chat.add_argument(
        "--model", required=True, help="PROVIDER:MODEL, for example openai:gpt-4o-mini"
    )
    chat.add_argument("--base-url", default=None, help="the provider's API base URL")
    chat.add_argument(
        "--dir",
        type=Path,
        default=DEFAULT_DIR,
        help="where checkpoints and memory are kept (default ./.awaken)",
    )
    chat.add_argument(
        "--thread", default=None, help="continue this conversation thread (default: a new one)"
    )
    chat.set_defaults(handler=cmd_chat)

    checkpoints = commands.add_parser(
        "checkpoints",
        help="list, inspect, remove and expire in-flight turns",
        description="See and manage the in-flight turns a checkpoint store holds.",
    )
    actions = checkpoints.add_subparsers(dest="action", metavar="ACTION", required=True)
    store_help = f"the checkpoint store: {STORE_FORMS} (default diskcache:.awaken/checkpoints)"

    def common(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--store", default="diskcache:.awaken/checkpoints", help=store_help)
        sub.add_argument("--json", action="store_true", help="print JSON instead of a table")

    listing = actions.add_parser(
        "list",
        help="list in-flight turns: run, thread, model, age, size, retries, epoch",
        description="List the in-flight turns in a checkpoint store.",
    )
    listing.add_argument(
        "--ledger",
        action="store_true",
        help="list tool ledger records (one per tool call) instead of in-flight turns",
    )
    common(listing)
    listing.set_defaults(handler=cmd_checkpoints_list)
    show = actions.add_parser(
        "show", help="show one in-flight turn", description="Show one in-flight turn in full."
    )
    show.add_argument("run_id", metavar="RUN", help="the run id (see `checkpoints list`)")
    common(show)
    show.set_defaults(handler=cmd_checkpoints_show)
    remove = actions.add_parser(
        "rm",
        help="remove in-flight turns",
        description="Remove in-flight turns (their processes can no longer resume them).",
    )
    remove.add_argument("run_ids", metavar="RUN", nargs="+", help="run ids to remove")
    remove.add_argument(
        "--missing-ok", action="store_true", help="do not fail when a run has no checkpoint"
    )
    common(remove)
    remove.set_defaults(handler=cmd_checkpoints_rm)
    collect = actions.add_parser(
        "gc",
        help="remove checkpoints not written for a while",
        description="Remove the checkpoints that were not written for more than --older-than.",
    )
    collect.add_argument(
        "--older-than",
        type=_positive,
        required=True,
        metavar="SECONDS",
        help="remove checkpoints last written more than this many seconds ago",
    )
    common(collect)
    collect.set_defaults(handler=cmd_checkpoints_gc)
    return parser


def main(
    argv: Sequence[str] | None = None,
    *,
    stdin: IO[str] | None = None,
    console: Console | None = None,
) -> int:
    """Run the ``awaken-langchain`` command.

    Args:
        argv: The arguments (default ``sys.argv[1:]``).
        stdin: Where ``chat`` reads the user's messages (default standard input).
        console: Where output goes (default standard output).

    Returns:
        The exit status.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        from rich.console import Console
    except ImportError as exc:
        sys.stderr.write(
            f"awaken-langchain: error: the command needs the Python package 'rich', which is "
            f"not installed ({exc}); install it with: {INSTALL_CLI}\n"
        )
        return 2
    console = console or Console(highlight=False)
    errors = Console(stderr=True, highlight=False) if console.file is sys.stdout else console
    started = time.monotonic()
    try:
        if args.command == "chat":
            return cmd_chat(args, console, stdin or sys.stdin)
        status: int = args.handler(args, console)
        return status
    except CommandError as exc:
        errors.print(_literal(f"awaken-langchain: error: {exc}", "bold red"), soft_wrap=True)
        return exc.exit_code
    except KeyboardInterrupt:
        errors.print(
            _literal(f"awaken-langchain: interrupted after {time.monotonic() - started:.1f} s")
        )
        return 130
