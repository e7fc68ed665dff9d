"""What a provider SDK raises when the loopback server cuts a stream.

The Anthropic SDK let a mid-stream transport error through unwrapped up to
2.16 and wraps it in ``anthropic.APIConnectionError`` from 2.17 on (which
``langchain-anthropic`` wraps once more). Tests that cut a stream assert the
transport error itself, wherever it sits in the cause chain.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest


def caused_by(error: BaseException, kind: type[BaseException]) -> bool:
    """Whether ``error`` or anything in its cause chain is a ``kind``."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


@contextmanager
def raises_cut(kind: type[BaseException]) -> Iterator[None]:
    """Expect the block to fail with ``kind``, raised bare or wrapped by the SDK."""
    with pytest.raises(Exception) as caught:
        yield
    assert caused_by(caught.value, kind), f"expected {kind.__name__}, got {caught.value!r}"
