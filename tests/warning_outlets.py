"""Where a store failure is told: the Python warning, the log record, the event."""

from __future__ import annotations

import logging
import warnings
from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler

from awaken_langchain.checkpoint import StreamCheckpointStore
from awaken_langchain.model import RecoveringChatModel
from awaken_langchain.retry import RetryPolicy
from awaken_langchain.testing.scripted import ScriptedChatModel, finish, text


class _Events(BaseCallbackHandler):
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def on_custom_event(self, name: str, data: Any, **kwargs: Any) -> None:
        self.events.append((name, data))


def store_failure_outlets(
    store: StreamCheckpointStore, caplog: pytest.LogCaptureFixture
) -> list[str]:
    """Run one turn on a ``store`` that fails; return each outlet's text of its one warning.

    The turn is still answered; the warning, the log record (its message and
    every attribute) and the ``awaken_checkpoint_warning`` event each tell it once.
    """
    model = RecoveringChatModel(
        model=ScriptedChatModel(scripts=[[*text("still answered"), finish()]]),
        store=store,
        retry_policy=RetryPolicy(sleep=lambda _s: None),
        checkpoint_deadline=10.0,  # the store's own error, not the writer's deadline, is told
    )
    handler = _Events()
    with (
        caplog.at_level(logging.WARNING, logger="awaken_langchain"),
        warnings.catch_warnings(record=True) as caught,
    ):
        warnings.simplefilter("always")
        answer = model.invoke("q", config={"callbacks": [handler]})
    store.close()
    assert answer.content == "still answered"

    said = [str(w.message) for w in caught if "checkpoint store failed" in str(w.message)]
    logged = [r for r in caplog.records if "checkpoint store failed" in r.getMessage()]
    sent = [data for name, data in handler.events if name == "awaken_checkpoint_warning"]
    assert len(said) == len(logged) == len(sent) == 1  # each outlet got the warning
    return [said[0], logged[0].getMessage(), str(vars(logged[0])), str(sent[0])]
