"""Recoverable streamed LLM turns for LangChain.

Retry before output, continue after partial output, checkpoint the in-flight
turn, gate tool calls on complete JSON, and hand only complete turns to memory.
"""

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
from awaken_langchain.model import RecoveringChatModel
from awaken_langchain.retry import RetryPolicy
from awaken_langchain.stores import (
    DiskCacheStreamCheckpointStore,
    FileStreamCheckpointStore,
    InMemoryStreamCheckpointStore,
)

__version__ = "0.1.0"

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
    "StreamCheckpoint",
    "StreamCheckpointError",
    "StreamCheckpointFencedError",
    "StreamCheckpointHandler",
    "StreamCheckpointStore",
    "StreamCheckpointWarning",
    "StreamEndedEarlyError",
    "StreamInterruptedError",
    "StreamStalledError",
    "__version__",
    "classify_error",
]
