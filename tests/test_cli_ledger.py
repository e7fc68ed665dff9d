"""`awaken-langchain checkpoints` lists, shows and removes tool ledger records."""

from __future__ import annotations

import json
from pathlib import Path

from langchain_core.tools import tool

from awaken_langchain import DiskCacheStreamCheckpointStore, ToolLedger
from awaken_langchain.ledger import idempotency_key
from tests.test_cli import run


@tool
def lookup(city: str) -> str:
    """Look up a city."""
    return f"Sunny in {city}."


def ledger_with_one_call(directory: Path) -> str:
    with DiskCacheStreamCheckpointStore(directory) as store:
        ToolLedger(store).wrap(lookup).invoke(
            {"type": "tool_call", "id": "call_1", "name": "lookup", "args": {"city": "Paris"}},
            {"configurable": {"thread_id": "thread-1"}},
        )
    return "tool-ledger:" + idempotency_key("thread-1", "call_1")


def test_ledger_records_are_listed_apart_from_in_flight_turns(tmp_path: Path) -> None:
    record = ledger_with_one_call(tmp_path / "store")
    store = f"diskcache:{tmp_path / 'store'}"

    status, turns = run("checkpoints", "list", "--store", store)
    ledger_status, listed = run("checkpoints", "list", "--ledger", "--store", store)
    _, as_json = run("checkpoints", "list", "--ledger", "--json", "--store", store)

    assert (status, turns) == (0, "No in-flight turns.")
    assert ledger_status == 0
    for shown in (record, "thread-1", "lookup", "call_1", "finished"):
        assert shown in listed
    [row] = json.loads(as_json)
    assert (row["run_id"], row["state"], row["tool"]) == (record, "finished", "lookup")


def test_a_ledger_record_is_shown_with_its_call_and_result(tmp_path: Path) -> None:
    record = ledger_with_one_call(tmp_path / "store")
    store = f"diskcache:{tmp_path / 'store'}"

    status, shown = run("checkpoints", "show", record, "--store", store)
    _, as_json = run("checkpoints", "show", record, "--json", "--store", store)

    assert status == 0
    assert 'lookup({"city": "Paris"})' in shown
    assert "Sunny in Paris." in shown
    assert idempotency_key("thread-1", "call_1") in shown
    assert json.loads(as_json)["state"] == "finished"


def test_a_removed_ledger_record_lets_the_call_run_again(tmp_path: Path) -> None:
    record = ledger_with_one_call(tmp_path / "store")
    store = f"diskcache:{tmp_path / 'store'}"

    status, _ = run("checkpoints", "rm", record, "--store", store)
    _, listed = run("checkpoints", "list", "--ledger", "--store", store)

    assert status == 0
    assert listed == "No tool ledger records."
