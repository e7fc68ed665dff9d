"""What only the PostgreSQL store has: its DSN, tables, schema versions and deadlines.

The contract itself (round trips, appends, fencing, expiry, gc, signing) runs in
``test_store_conformance.py`` through the shipped kit.
"""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from awaken_langchain import StreamCheckpoint, StreamCheckpointError
from awaken_langchain.cli import main
from tests.postgres_server import PASSWORD, PostgresServer, free_port, shared_postgres_server

REPO_ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

psycopg = pytest.importorskip("psycopg")
postgres = pytest.importorskip("awaken_langchain.stores.postgres")
Store = postgres.PostgresStreamCheckpointStore


def checkpoint(run_id: str = "run-1", text: str = "Hello", **update: object) -> StreamCheckpoint:
    return StreamCheckpoint(
        run_id=run_id,
        thread_id="thread-1",
        model="gpt-test",
        message_id="msg-1",
        partial_text=text,
        **update,  # type: ignore[arg-type]
    )


@pytest.fixture
def postgres_server() -> PostgresServer:
    return shared_postgres_server()


@pytest.fixture
def table() -> str:
    return f"t_{uuid.uuid4().hex[:16]}"


@pytest.fixture
def store(postgres_server: PostgresServer, table: str) -> Iterator[object]:
    with Store(postgres_server.dsn, table=table) as made:
        yield made


def raw(server: PostgresServer) -> psycopg.Connection:  # type: ignore[name-defined]
    return psycopg.connect(server.dsn, autocommit=True)


# -- the DSN and its password ------------------------------------------------------------


@pytest.mark.parametrize(
    "form",
    [
        "postgresql://awaken:{pw}@127.0.0.1:{port}/awaken",
        "host=127.0.0.1 port={port} user=awaken password={pw}",
    ],
    ids=["url", "keywords"],
)
def test_unreachable_server_fails_within_the_deadline_naming_it_without_the_password(
    form: str,
) -> None:
    port = free_port()  # nothing listens there
    secret = "never-shown-secret"
    store = Store(form.format(pw=secret, port=port), timeout=1)
    started = time.monotonic()
    with pytest.raises(StreamCheckpointError) as caught:
        store.get("run-1")
    elapsed = time.monotonic() - started
    store.close()
    message = str(caught.value)
    assert elapsed < 1 + 2.0  # the deadline, plus a margin for a busy machine
    assert f"{port}" in message
    assert "PostgreSQL get failed" in message
    assert secret not in message
    assert secret not in repr(caught.value.__cause__)
    assert caught.value.__cause__ is None  # the driver's own text is quoted masked
    assert caught.value.run_id == "run-1"


def test_missing_database_is_named(postgres_server: PostgresServer, table: str) -> None:
    dsn = postgres_server.dsn.rpartition("/")[0] + "/no_such_database"
    with (
        Store(dsn, table=table, timeout=2) as store,
        pytest.raises(StreamCheckpointError) as caught,
    ):
        store.put(checkpoint())
    assert 'database "no_such_database" does not exist' in str(caught.value)
    assert PASSWORD not in str(caught.value)
    assert "***" in str(caught.value)


def test_a_row_locked_by_another_session_costs_at_most_the_deadline(
    postgres_server: PostgresServer, table: str
) -> None:
    with Store(postgres_server.dsn, table=table, timeout=1) as store:
        epoch = store.claim("run-1")
        store.put(checkpoint(epoch=epoch))
        with raw(postgres_server) as other, other.transaction():
            other.execute(f"SELECT * FROM {table}_epochs FOR UPDATE")  # a stuck session
            started = time.monotonic()
            with pytest.raises(StreamCheckpointError, match="PostgreSQL claim failed"):
                store.claim("run-1")
            assert time.monotonic() - started < 1 + 2.0
        assert store.claim("run-1") == epoch + 1  # the store works again once the lock is gone
        got = store.get("run-1")
        assert got is not None
        assert got.partial_text == "Hello"


# -- tables and their layout version ---------------------------------------------------------


def test_first_use_creates_the_tables_and_records_the_layout_version(
    postgres_server: PostgresServer, store: object, table: str
) -> None:
    store.put(checkpoint())  # type: ignore[attr-defined]
    with raw(postgres_server) as conn:
        version = conn.execute(f"SELECT version FROM {table}_schema").fetchall()
        tables = {
            row[0]
            for row in conn.execute(
                "SELECT tablename FROM pg_tables WHERE tablename LIKE %s", (table + "%",)
            )
        }
    assert version == [(postgres.SCHEMA_VERSION,)]
    suffixes = ("_segments", "_epochs", "_floor", "_schema", "_runlogs", "_events")
    assert tables == {table, *(table + s for s in suffixes)}


def test_tables_of_a_newer_layout_are_refused_naming_the_upgrade(
    postgres_server: PostgresServer, store: object, table: str
) -> None:
    store.put(checkpoint())  # type: ignore[attr-defined]
    with raw(postgres_server) as conn:
        conn.execute(f"UPDATE {table}_schema SET version = 99")
    with (
        Store(postgres_server.dsn, table=table) as newer,
        pytest.raises(
            StreamCheckpointError, match="layout version 99, newer than this awaken-langchain"
        ),
    ):
        newer.get("run-1")


def test_tables_of_layout_1_are_upgraded_in_place_keeping_their_checkpoints(
    postgres_server: PostgresServer, store: object, table: str
) -> None:
    from awaken_langchain import UnknownRunError, follow

    stored = checkpoint(text="Kept across the upgrade")
    store.put(stored)  # type: ignore[attr-defined]
    with raw(postgres_server) as conn:  # the tables as release 1 left them: no event logs
        conn.execute(f"DROP TABLE {table}_runlogs, {table}_events")
        conn.execute(f"UPDATE {table}_schema SET version = 1")
    with (
        Store(postgres_server.dsn, table=table, read_only=True) as reader,
        pytest.raises(StreamCheckpointError, match="layout version 1; open the store once"),
    ):
        reader.get("run-1")
    with Store(postgres_server.dsn, table=table) as upgraded:
        assert upgraded.get("run-1").partial_text == "Kept across the upgrade"
        with pytest.raises(UnknownRunError):  # the readers' tables are there, still empty
            follow(upgraded, "run-1")
    with raw(postgres_server) as conn:
        version = conn.execute(f"SELECT version FROM {table}_schema").fetchall()
        logs = conn.execute(f"SELECT count(*) FROM {table}_runlogs").fetchall()
    assert version == [(2,)]
    assert logs == [(0,)]


def test_read_only_store_creates_nothing(postgres_server: PostgresServer, table: str) -> None:
    with (
        Store(postgres_server.dsn, table=table, read_only=True) as store,
        pytest.raises(StreamCheckpointError, match="creates nothing"),
    ):
        store.list_run_ids()
    with raw(postgres_server) as conn:
        found = conn.execute("SELECT to_regclass(%s)", (table + "_schema",)).fetchone()
    assert found == (None,)


def test_appends_write_segments_not_the_whole_text(
    postgres_server: PostgresServer, store: object, table: str
) -> None:
    text = "x" * 100_000
    store.put(checkpoint(text=text))  # type: ignore[attr-defined]
    for _ in range(200):
        text += "y" * 16
        store.put(checkpoint(text=text))  # type: ignore[attr-defined]
    with raw(postgres_server) as conn:
        rows = conn.execute(f"SELECT octet_length(data) FROM {table}_segments").fetchall()
    assert sum(size for (size,) in rows) == len(text)
    assert len(rows) <= 12  # O(log n) segments, not one per put
    got = store.get("run-1")  # type: ignore[attr-defined]
    assert got is not None
    assert got.partial_text == text


def test_hostile_run_ids_are_parameters_never_sql(
    postgres_server: PostgresServer, store: object, table: str
) -> None:
    hostile = f"x'); DROP TABLE {table}; --"
    epoch = store.claim(hostile)  # type: ignore[attr-defined]
    store.put(checkpoint(hostile, "kept", epoch=epoch))  # type: ignore[attr-defined]
    assert store.list_run_ids() == [hostile]  # type: ignore[attr-defined]
    with raw(postgres_server) as conn:
        assert conn.execute("SELECT to_regclass(%s)", (table,)).fetchone() != (None,)


# -- the command line -------------------------------------------------------------------------


def test_checkpoints_cli_reads_a_postgres_store_and_masks_its_password(
    postgres_server: PostgresServer,
) -> None:
    with Store(postgres_server.dsn) as store:  # the default table, as the CLI opens it
        store.put(checkpoint("cli-run", "from the database"))
    out = io.StringIO()
    console = Console(file=out, width=300, highlight=False, color_system=None)
    status = main(["checkpoints", "list", "--store", postgres_server.dsn], console=console)
    printed = " ".join(out.getvalue().split())
    assert status == 0, printed
    assert "cli-run" in printed
    assert PASSWORD not in printed
    with Store(postgres_server.dsn) as store:
        store.delete("cli-run")


def test_checkpoints_cli_names_an_unreachable_postgres_without_its_password() -> None:
    port = free_port()
    dsn = f"postgresql://app:never-shown-secret@127.0.0.1:{port}/app"
    out = io.StringIO()
    console = Console(file=out, width=300, highlight=False, color_system=None)
    status = main(["checkpoints", "list", "--store", dsn], console=console)
    printed = " ".join(out.getvalue().split())
    assert status != 0
    assert "never-shown-secret" not in printed
    assert f"postgresql://app:***@127.0.0.1:{port}/app" in printed


# -- the async twins ------------------------------------------------------------------------


def test_async_twins_share_the_stores_one_pool_across_event_loops(
    postgres_server: PostgresServer, store: object
) -> None:
    async def turn() -> str | None:
        epoch = await store.aclaim("run-1")  # type: ignore[attr-defined]
        await store.aput(checkpoint(text="async", epoch=epoch))  # type: ignore[attr-defined]
        await store.aput(checkpoint(text="async text", epoch=epoch))  # type: ignore[attr-defined]
        got = await store.aget("run-1")  # type: ignore[attr-defined]
        return got.partial_text if got else None

    assert asyncio.run(turn()) == "async text"
    connected = store._pool.get_stats()["connections_num"]  # type: ignore[attr-defined]
    for _ in range(3):  # a fresh loop each time, on the connections the first one made
        assert asyncio.run(turn()) == "async text"
    assert store._pool.get_stats()["connections_num"] == connected  # type: ignore[attr-defined]
    got = store.get("run-1")  # type: ignore[attr-defined]
    assert got is not None
    assert got.partial_text == "async text"


_MANY_LOOPS = """
import asyncio, os, sys
from awaken_langchain import StreamCheckpoint
from awaken_langchain.stores.postgres import PostgresStreamCheckpointStore

store = PostgresStreamCheckpointStore(os.environ["AWAKEN_TEST_POSTGRES_DSN"], table=sys.argv[1])

def checkpoint(run_id, text, epoch):
    return StreamCheckpoint(run_id=run_id, thread_id="thread-1", model="gpt-test",
                            message_id="msg-1", partial_text=text, epoch=epoch)

async def first_calls_at_once(loop_number):
    runs = [f"run-{loop_number}-{task}" for task in range(24)]
    epochs = await asyncio.gather(*(store.aclaim(run_id) for run_id in runs))
    await asyncio.gather(*(store.aput(checkpoint(r, "text", e)) for r, e in zip(runs, epochs)))
    got = await asyncio.gather(*(store.aget(run_id) for run_id in runs))
    return sum(1 for found in got if found is not None and found.partial_text == "text")

for loop_number in range(40):  # every asyncio.run is a fresh event loop
    assert asyncio.run(store.aget("run-missing")) is None
    epoch = asyncio.run(store.aclaim("run-shared"))
    asyncio.run(store.aput(checkpoint("run-shared", f"text {loop_number}", epoch)))
    assert asyncio.run(store.aget("run-shared")).partial_text == f"text {loop_number}"
    if loop_number % 4 == 0:
        assert asyncio.run(first_calls_at_once(loop_number)) == 24
asyncio.run(store.aclose())
print("all loops ended")
"""


def test_asyncio_run_returns_for_every_fresh_loop_and_for_concurrent_first_calls(
    postgres_server: PostgresServer, table: str
) -> None:
    # psycopg_pool's asyncio pool loses the cancellation asyncio.run sends a task of
    # it that is connecting as the loop ends, and asyncio.run then waits forever:
    # a child process, so that a hang fails this test instead of hanging the suite.
    try:
        done = subprocess.run(
            [sys.executable, "-c", _MANY_LOOPS, table],
            capture_output=True,
            text=True,
            timeout=60,
            env={
                **os.environ,
                "PYTHONPATH": str(REPO_ROOT),
                "AWAKEN_TEST_POSTGRES_DSN": postgres_server.dsn,
            },
            check=False,
        )
    except subprocess.TimeoutExpired as hung:
        printed = hung.stderr.decode(errors="replace") if hung.stderr else ""
        pytest.fail(f"asyncio.run did not return within 60 s; the child printed: {printed}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "all loops ended"
    assert "error connecting" not in done.stderr


def test_async_unreachable_server_fails_within_the_deadline() -> None:
    store = Store(f"postgresql://app:never-shown-secret@127.0.0.1:{free_port()}/app", timeout=1)
    started = time.monotonic()
    with pytest.raises(StreamCheckpointError) as caught:
        asyncio.run(store.aget("run-1"))
    assert time.monotonic() - started < 1 + 2.0
    assert "never-shown-secret" not in str(caught.value)
    store.close()


# -- a borrowed pool -------------------------------------------------------------------------


@pytest.fixture
def borrowed_pool(postgres_server: PostgresServer) -> Iterator[Any]:
    import psycopg_pool

    with psycopg_pool.ConnectionPool(postgres_server.dsn, min_size=1, max_size=2) as pool:
        yield pool


def test_a_borrowed_pool_gets_the_deadline_per_transaction_and_stays_open(
    postgres_server: PostgresServer, borrowed_pool: Any, table: str
) -> None:
    store = Store(pool=borrowed_pool, table=table, timeout=1)
    epoch = store.claim("run-1")
    with raw(postgres_server) as other, other.transaction():
        other.execute(f"SELECT * FROM {table}_epochs FOR UPDATE")  # a stuck session
        started = time.monotonic()
        with pytest.raises(StreamCheckpointError, match="PostgreSQL claim failed at the given"):
            store.claim("run-1")
        assert time.monotonic() - started < 1 + 2.0
    store.close()
    with borrowed_pool.connection() as conn:  # the store did not close what it borrowed
        assert conn.execute("SHOW statement_timeout").fetchone() == ("0",)  # nor changed it
    assert Store(pool=borrowed_pool, table=table).claim("run-1") == epoch + 1


def test_an_exhausted_pool_costs_at_most_the_deadline_and_says_so(
    borrowed_pool: Any, table: str
) -> None:
    store = Store(pool=borrowed_pool, table=table, timeout=1)
    store.put(checkpoint(text="written before"))
    held = [borrowed_pool.getconn(), borrowed_pool.getconn()]  # other work holds them all
    try:
        started = time.monotonic()
        with pytest.raises(StreamCheckpointError, match="PoolTimeout"):
            store.put(checkpoint(text="written before, and more"))
        assert time.monotonic() - started < 1 + 2.0
    finally:
        for conn in held:
            borrowed_pool.putconn(conn)
    got = store.get("run-1")
    assert got is not None
    assert got.partial_text == "written before"  # nothing written before is lost


# -- faults a production database brings --------------------------------------------------


def test_a_user_without_privileges_gets_an_error_naming_them_and_nothing_is_lost(
    postgres_server: PostgresServer, table: str
) -> None:
    with Store(postgres_server.dsn, table=table) as owner:
        owner.put(checkpoint(text="written by the owner"))
    role = f"r_{uuid.uuid4().hex[:12]}"
    with raw(postgres_server) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN")  # trusted on loopback; owns nothing
    dsn = f"host=127.0.0.1 port={postgres_server.port} user={role} dbname=awaken"
    with Store(dsn, table=table, timeout=2) as intruder:
        with pytest.raises(StreamCheckpointError) as caught:
            intruder.put(checkpoint(text="overwritten?"))
        with pytest.raises(StreamCheckpointError):
            intruder.delete("run-1")
    assert "permission denied" in str(caught.value) or "permission denied" in str(
        caught.value.__cause__
    )
    assert "privileges" in str(caught.value)
    with Store(postgres_server.dsn, table=table) as owner:
        got = owner.get("run-1")
    assert got is not None
    assert got.partial_text == "written by the owner"


def _once_back(store: Any, run_id: str) -> StreamCheckpoint | None:
    """``store.get(run_id)`` once the store's pool has reconnected (it backs off meanwhile)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            return store.get(run_id)  # type: ignore[no-any-return]
        except StreamCheckpointError as exc:
            if "PoolTimeout" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_a_server_restarted_mid_turn_costs_only_the_writes_made_while_it_was_down(
    table: str,
) -> None:
    # its own server (under /tmp, which the postgres user can reach), since it stops
    server = PostgresServer(Path(tempfile.mkdtemp(prefix="awaken-postgres-")))
    server.start()
    try:
        with Store(server.dsn, table=table, timeout=1) as store:
            epoch = store.claim("run-1")
            store.put(checkpoint(text="before the restart", epoch=epoch))
            server.stop(mode="fast")  # a restart: its sessions end, the server goes down
            started = time.monotonic()
            with pytest.raises(StreamCheckpointError) as caught:
                store.put(checkpoint(text="before the restart, while down", epoch=epoch))
            assert time.monotonic() - started < 5
            assert PASSWORD not in str(caught.value)
            server.start()
            got = _once_back(store, "run-1")  # what was written before the restart is there
            assert got is not None
            assert got.partial_text == "before the restart"
            store.put(checkpoint(text="before the restart, while down, after", epoch=epoch))
            got = store.get("run-1")
            assert got is not None
            assert got.partial_text == "before the restart, while down, after"
    finally:
        server.remove()
