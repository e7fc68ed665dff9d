"""Recoverable streamed LLM turns for LangChain.

Retry before output, continue after partial output, checkpoint the in-flight
turn, gate tool calls on complete JSON, and hand only complete turns to memory.

Recovery events are logged under the ``awaken_langchain`` logger (one child
logger per module), which has a `logging.NullHandler`: configure logging to see
them.
"""

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from awaken_langchain.callbacks import AsyncStreamCheckpointHandler, StreamCheckpointHandler
    from awaken_langchain.checkpoint import StreamCheckpoint, StreamCheckpointStore
    from awaken_langchain.classify import ErrorInfo, ErrorKind, classify_error
    from awaken_langchain.errors import (
        AwakenError,
        StreamCheckpointError,
        StreamCheckpointFencedError,
        StreamCheckpointWarning,
        StreamEndedEarlyError,
        StreamInterruptedError,
        StreamStalledError,
    )
    from awaken_langchain.ledger import ToolLedger
    from awaken_langchain.model import RecoveringChatModel
    from awaken_langchain.readers import (
        RunEvent,
        RunOffsetError,
        UnknownRunError,
        afollow,
        arequest_stop,
        follow,
        request_stop,
    )
    from awaken_langchain.retry import RetryPolicy
    from awaken_langchain.stores import (
        DiskCacheStreamCheckpointStore,
        FileStreamCheckpointStore,
        InMemoryStreamCheckpointStore,
    )

_HOMES = {
    "AsyncStreamCheckpointHandler": "callbacks",
    "StreamCheckpointHandler": "callbacks",
    "StreamCheckpoint": "checkpoint",
    "StreamCheckpointStore": "checkpoint",
    "ErrorInfo": "classify",
    "ErrorKind": "classify",
    "classify_error": "classify",
    "AwakenError": "errors",
    "StreamCheckpointError": "errors",
    "StreamCheckpointFencedError": "errors",
    "StreamCheckpointWarning": "errors",
    "StreamEndedEarlyError": "errors",
    "StreamInterruptedError": "errors",
    "StreamStalledError": "errors",
    "ToolLedger": "ledger",
    "RecoveringChatModel": "model",
    "RunEvent": "readers",
    "RunOffsetError": "readers",
    "UnknownRunError": "readers",
    "afollow": "readers",
    "arequest_stop": "readers",
    "follow": "readers",
    "request_stop": "readers",
    "RetryPolicy": "retry",
    "DiskCacheStreamCheckpointStore": "stores",
    "FileStreamCheckpointStore": "stores",
    "InMemoryStreamCheckpointStore": "stores",
}
"""Where each public name lives. They are imported on first use, so a program that
needs only the stores (the ``checkpoints`` command) does not import LangChain."""


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})


__version__ = "0.1.0"
"""The package version, following Semantic Versioning; the package metadata reads it here."""

logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "AsyncStreamCheckpointHandler",
    "AwakenError",
    "DiskCacheStreamCheckpointStore",
    "FileStreamCheckpointStore",
    "InMemoryStreamCheckpointStore",
    "ErrorInfo",
    "ErrorKind",
    "RecoveringChatModel",
    "RetryPolicy",
    "RunEvent",
    "RunOffsetError",
    "StreamCheckpoint",
    "StreamCheckpointError",
    "StreamCheckpointFencedError",
    "StreamCheckpointHandler",
    "StreamCheckpointStore",
    "StreamCheckpointWarning",
    "StreamEndedEarlyError",
    "StreamInterruptedError",
    "StreamStalledError",
    "ToolLedger",
    "UnknownRunError",
    "__version__",
    "afollow",
    "arequest_stop",
    "classify_error",
    "follow",
    "request_stop",
]
