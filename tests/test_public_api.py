import awaken_langchain


def test_public_names_are_pinned() -> None:
    assert sorted(awaken_langchain.__all__) == sorted(
        [
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
    )


def test_every_public_name_is_importable() -> None:
    for name in awaken_langchain.__all__:
        assert getattr(awaken_langchain, name) is not None
