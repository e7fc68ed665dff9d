"""A PostgreSQL password never leaves the library in clear.

A libpq connection string carries its password in a URL's user part, in its
query (``?password=``) or as a keyword (``password=...``, also quoted). When
the store fails with a wrong password, the Python warning, the log record, the
``awaken_checkpoint_warning`` event and what the ``checkpoints`` command prints
all name where the store is with the password masked.
"""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from warning_outlets import store_failure_outlets

from awaken_langchain._secrets import redact
from awaken_langchain.cli import main
from tests.postgres_server import PostgresServer, shared_postgres_server

pytestmark = pytest.mark.postgres

SECRET = "hunter2-not-the-password"
"""The (wrong) password the DSNs carry: it must appear in no outlet."""

ROLE = "guarded"

DSNS = {
    "user and password": "postgresql://guarded:{secret}@127.0.0.1:{port}/awaken",
    "query password": "postgres://guarded@127.0.0.1:{port}/awaken?password={secret}",
    "keywords": "host=127.0.0.1 port={port} dbname=awaken user=guarded password={secret}",
    "quoted keyword": "host=127.0.0.1 port={port} user=guarded password='{secret} x' dbname=awaken",
}


@pytest.fixture
def guarded() -> PostgresServer:
    """The shared test server, with a role that needs a password other than `SECRET`."""
    server = shared_postgres_server()
    server.add_password_role(ROLE, "the-right-one")
    return server


@pytest.mark.parametrize("form", list(DSNS))
def test_a_postgres_password_is_masked_in_the_warning_the_log_and_the_event(
    form: str, guarded: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    from awaken_langchain.stores.postgres import PostgresStreamCheckpointStore

    dsn = DSNS[form].format(port=guarded.port, secret=SECRET)
    store = PostgresStreamCheckpointStore(dsn, timeout=1)
    outlets = store_failure_outlets(store, caplog)
    assert [SECRET in outlet for outlet in outlets] == [False] * 4
    assert all("***" in outlet for outlet in outlets)  # where the password was
    assert all('password authentication failed for user "guarded"' in o for o in outlets)


@pytest.mark.parametrize(
    ("form", "command"),
    [("user and password", ["list"]), ("query password", ["show", "run-1"])],
    ids=["list", "show"],
)
def test_the_checkpoints_command_never_prints_a_postgres_password(
    form: str, command: list[str], guarded: PostgresServer
) -> None:
    dsn = DSNS[form].format(port=guarded.port, secret=SECRET)
    out = io.StringIO()
    console = Console(file=out, width=200, highlight=False, color_system=None)
    status = main(["checkpoints", *command, "--store", dsn], console=console)
    printed = out.getvalue()
    assert status == 1, printed
    assert SECRET not in printed
    assert "***" in printed
    assert "password authentication failed" in printed


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("postgresql://app:hunter2pw@db:5432/app", "postgresql://app:***@db:5432/app"),
        (
            "postgres://app:hunter2pw@db/app?sslmode=require",
            "postgres://app:***@db/app?sslmode=require",
        ),
        (
            "postgresql://app@db/app?password=hunter2pw&x=1",
            "postgresql://app@db/app?password=***&x=1",
        ),
        (
            "host=db user=app password=hunter2pw dbname=app",
            "host=db user=app password=*** dbname=app",
        ),
        ("host=db password='hunter2 pw' dbname=app", "host=db password=*** dbname=app"),
        ("host=db password = hunter2pw dbname=app", "host=db password = *** dbname=app"),
        ("failed at password=hunter2pw sslpassword=k3y", "failed at password=*** sslpassword=***"),
        ("postgresql://app@db/app", "postgresql://app@db/app"),
        ("redis://:hunter2pw@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0"),
        (
            "rediss://h:1/0?ssl_password=k&password=hunter2pw",
            "rediss://h:1/0?ssl_password=***&password=***",
        ),
        ("unix://:hunter2pw@/tmp/redis.sock", "unix://:***@/tmp/redis.sock"),
        ("the password is wrong", "the password is wrong"),
    ],
    ids=[
        "postgres-url",
        "postgres-url-query",
        "postgres-url-parameter",
        "keywords",
        "quoted-keyword",
        "spaced-keyword",
        "keywords-in-a-message",
        "no-password",
        "redis-url",
        "rediss-query",
        "unix-socket",
        "prose",
    ],
)
def test_redact_masks_every_form_of_connection_password(text: str, shown: str) -> None:
    assert redact(text) == shown


def test_redact_masks_the_secrets_of_the_connection_string_wherever_they_are_quoted() -> None:
    spec = "postgresql://app:p%40ss-word@db/app"
    said = 'connection failed: user "app" with "p@ss-word" and p%40ss-word'
    assert redact(said, spec=spec) == 'connection failed: user "app" with "***" and ***'
