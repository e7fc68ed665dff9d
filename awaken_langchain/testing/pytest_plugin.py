"""Pytest fixtures for the loopback provider server.

Enable them in a ``conftest.py``::

    pytest_plugins = ["awaken_langchain.testing.pytest_plugin"]
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from awaken_langchain.testing.server import LoopbackProvider


@pytest.fixture
def loopback_provider() -> Iterator[LoopbackProvider]:
    """A running :class:`LoopbackProvider` on a free port, stopped after the test.

    The test fails at teardown if the server raised while answering
    (:attr:`LoopbackProvider.errors`), so a broken scenario cannot pass unseen.
    """
    with LoopbackProvider() as server:
        yield server
    if server.errors:
        pytest.fail(f"the loopback provider failed while answering: {server.errors!r}")
