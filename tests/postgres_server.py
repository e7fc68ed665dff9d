"""A real PostgreSQL for the tests: ``initdb`` into a temporary directory, on a free port.

The suite never talks to a database it did not start. The server comes from
Debian's ``postgresql`` package (binaries under ``/usr/lib/postgresql/*/bin``).
When it is missing the PostgreSQL tests are skipped with the reason, unless
``AWAKEN_REQUIRE_POSTGRES=1`` is set (CI), in which case they fail.

``initdb`` refuses to run as root: as root, the cluster is created and run by
the ``postgres`` system user the package adds (through ``runuser``).
"""

from __future__ import annotations

import atexit
import glob
import hashlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from awaken_langchain.stores.postgres import PostgresStreamCheckpointStore

REQUIRE_ENV = "AWAKEN_REQUIRE_POSTGRES"
DSN_ENV = "AWAKEN_TEST_POSTGRES_DSN"
"""Where the shared test server listens; child processes of a test inherit it."""

PASSWORD = "s3cret-test-password"
"""The test user's password (the server trusts loopback, the DSN still carries it)."""


def _unavailable(message: str) -> None:
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{message} ({REQUIRE_ENV}=1 makes the PostgreSQL tests mandatory)")
    pytest.skip(message)


def postgres_binaries() -> Path:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres``, or skip/fail."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("initdb")
    if on_path is not None:
        return Path(on_path).parent
    _unavailable(
        "PostgreSQL is not installed; install it (apt-get install postgresql) "
        "to run the PostgreSQL store tests"
    )
    raise AssertionError("unreachable")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PostgresServer:
    """One PostgreSQL cluster in its own directory, on a loopback port."""

    def __init__(self, directory: Path) -> None:
        self.binaries = postgres_binaries()
        self.directory = directory
        self.data = directory / "data"
        self.port = free_port()
        self.as_user: list[str] = []
        if os.geteuid() == 0:  # initdb and postgres refuse root
            self.as_user = ["runuser", "-u", "postgres", "--"]
            shutil.chown(directory, "postgres")
        os.chmod(directory, 0o700)

    @property
    def dsn(self) -> str:
        """The server's ``postgresql://`` URL, with the test user's password."""
        return f"postgresql://awaken:{PASSWORD}@127.0.0.1:{self.port}/awaken"

    def _run(self, *args: str) -> None:
        done = subprocess.run(
            [*self.as_user, *args], capture_output=True, text=True, timeout=120, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"{args[0]} failed: {done.stdout}{done.stderr}")

    def start(self) -> None:
        """Create the cluster (first time), start it and wait until it accepts connections."""
        if not self.data.exists():
            self._run(
                str(self.binaries / "initdb"),
                "-D",
                str(self.data),
                "-U",
                "awaken",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-sync",
            )
        self._run(
            str(self.binaries / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.directory / "postgres.log"),
            "-w",
            "-t",
            "60",
            "-o",
            f"-p {self.port} -k {self.directory} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
            "-c max_connections=200",
            "start",
        )
        self._create_database()

    def _create_database(self) -> None:
        import psycopg

        deadline = time.monotonic() + 30
        while True:
            try:
                with psycopg.connect(
                    f"host=127.0.0.1 port={self.port} user=awaken dbname=postgres",
                    autocommit=True,
                    connect_timeout=5,
                ) as conn:
                    exists = conn.execute(
                        "SELECT 1 FROM pg_database WHERE datname = 'awaken'"
                    ).fetchone()
                    if exists is None:
                        conn.execute("CREATE DATABASE awaken")
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def add_password_role(self, role: str, password: str) -> None:
        """Add a login ``role`` that must give ``password`` (every other user stays trusted)."""
        import psycopg
        from psycopg import sql

        hba = self.data / "pg_hba.conf"
        rule = f"host all {role} 127.0.0.1/32 scram-sha-256\n"
        if rule not in hba.read_text():
            hba.write_text(rule + hba.read_text())  # the first matching line decides
        with psycopg.connect(
            f"host=127.0.0.1 port={self.port} user=awaken dbname=awaken", autocommit=True
        ) as conn:
            exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
            if exists is None:
                conn.execute(
                    sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                        sql.Identifier(role), sql.Literal(password)
                    )
                )
            conn.execute("SELECT pg_reload_conf()")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the server rereads the file in the background
            try:
                psycopg.connect(
                    f"host=127.0.0.1 port={self.port} user={role} dbname=awaken password=not-it",
                    connect_timeout=5,
                ).close()
            except psycopg.OperationalError:
                return
            time.sleep(0.05)
        raise RuntimeError(f"the server did not start asking {role} for a password")

    def processes(self) -> list[int]:
        """The postmaster's process id and those of every process it started."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        children = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    fields = (entry / "stat").read_text().rpartition(")")[2].split()
                except OSError:
                    continue
                if int(fields[1]) == postmaster:
                    children.append(int(entry.name))
        return [postmaster, *children]

    def stop(self, mode: str = "immediate") -> None:
        """Stop the server: at once by default (its data is thrown away with the directory);
        ``mode="fast"`` ends its sessions and writes what they committed, as a restart does.
        """
        subprocess.run(
            [
                *self.as_user,
                str(self.binaries / "pg_ctl"),
                "-D",
                str(self.data),
                "-m",
                mode,
                "stop",
            ],
            capture_output=True,
            timeout=60,
            check=False,
        )

    def remove(self) -> None:
        """Stop the server and delete its directory."""
        self.stop()
        for _ in range(20):  # a process still ending may write a last file
            shutil.rmtree(self.directory, ignore_errors=True)
            if not self.directory.exists():
                return
            time.sleep(0.1)


_shared: PostgresServer | None = None


def shared_postgres_server() -> PostgresServer:
    """Return this process's shared test server, starting it on first use."""
    global _shared
    if _shared is None:
        try:
            import psycopg  # noqa: F401
            import psycopg_pool  # noqa: F401
        except ImportError:
            _unavailable("psycopg is not installed: pip install 'awaken-langchain[postgres]'")
        directory = Path(tempfile.mkdtemp(prefix="awaken-postgres-"))
        server = PostgresServer(directory)
        atexit.register(server.remove)
        server.start()
        os.environ[DSN_ENV] = server.dsn
        _shared = server
    return _shared


@pytest.fixture(scope="session")
def postgres_server() -> PostgresServer:
    """The shared PostgreSQL server of this test process."""
    return shared_postgres_server()


def table_for(location: Path) -> str:
    """The table name that stands for a per-test store location."""
    return "t_" + hashlib.sha256(str(location).encode()).hexdigest()[:16]


def postgres_store_on(location: Path, **kwargs: Any) -> PostgresStreamCheckpointStore:
    """Build a PostgreSQL store whose tables are shared by every store on ``location``.

    Works in child processes too: the server's DSN comes from the environment
    the test process set when it started the server.
    """
    from awaken_langchain.stores.postgres import PostgresStreamCheckpointStore

    dsn = os.environ.get(DSN_ENV) or shared_postgres_server().dsn
    return PostgresStreamCheckpointStore(
        dsn, table=table_for(location), max_connections=8, **kwargs
    )


def _raw_connection(store: Any) -> Any:
    import psycopg

    return psycopg.connect(store.dsn, autocommit=True, connect_timeout=10)


def corrupt_postgres(store: Any, location: Path, run_id: str, part: str) -> None:
    """Overwrite a run's stored head or text with garbage, behind the store's back."""
    from psycopg import sql

    from awaken_langchain.stores._base import run_id_bytes

    table = table_for(location)
    with _raw_connection(store) as conn:
        if part == "head":
            statement = sql.SQL("UPDATE {} SET head = %s WHERE run_id = %s").format(
                sql.Identifier(table)
            )
        else:
            statement = sql.SQL("UPDATE {} SET data = %s WHERE run_id = %s AND seq = 0").format(
                sql.Identifier(table + "_segments")
            )
        done = conn.execute(
            statement, (b"\x00garbage" if part == "head" else b"\xff\xfe\xfd", run_id_bytes(run_id))
        )
        assert done.rowcount == 1


def postgres_records(store: Any, location: Path) -> int:
    """How many rows a store on ``location`` holds: heads, segments, epochs and its floor."""
    from psycopg import sql

    table = table_for(location)
    total = 0
    with _raw_connection(store) as conn:
        for suffix in ("", "_segments", "_epochs", "_floor"):
            exists = conn.execute("SELECT to_regclass(%s)", (table + suffix,)).fetchone()
            if exists is None or exists[0] is None:
                continue
            row = conn.execute(
                sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table + suffix))
            ).fetchone()
            total += int(row[0]) if row is not None else 0
    return total
