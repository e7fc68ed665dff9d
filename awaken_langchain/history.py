"""Committing complete turns to memory, then releasing their checkpoints.

Memory (a LangGraph checkpointer, a chat message history) is the authority for
messages; a stream checkpoint holds only the turn that memory does not have yet.
The hand-over between the two works like this:

1. When a turn finishes and the commit boundary is known, `RecoveringChatModel`
   does not delete its checkpoint: it rewrites it as *complete* (the whole
   answer, ``StreamCheckpoint.complete``) and marks the returned message with
   ``response_metadata["awaken"]["checkpoint_complete"] = True``.
2. Memory commits the turn: LangGraph when the model node returns; a chat
   history through :func:`commit_turn`.
3. The complete checkpoint is deleted once the commit is observed: by
   :func:`commit_turn` right after its ``add_messages`` call, or, in LangGraph,
   by the next model call of the thread, whose input then contains the committed
   message (:func:`release_committed` does the same after a graph run).

A process that crashes between 1 and 2 leaves a complete checkpoint; the
replacement's model call (same key) returns the finished answer without asking
the provider. A crash between 2 and 3 leaves a checkpoint whose message is
already in memory: committing the same turn again adds nothing (messages are
matched by id), and the next model call of the thread releases it.

LangGraph's default ``durability="async"`` writes a step's checkpoint while the
next step runs, so the release by the next model call may, in a crash, come
before the previous step was durably saved; the re-run then asks the provider
again (memory still holds no partial or duplicated turn). Run the
graph with ``durability="sync"`` (an ``invoke``/``stream`` argument) when a
crash must never cost a request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    BaseMessageChunk,
    ToolMessage,
    message_chunk_to_message,
)

from awaken_langchain.errors import StreamCheckpointError
from awaken_langchain.events import store_failure

if TYPE_CHECKING:
    from langchain_core.chat_history import BaseChatMessageHistory

    from awaken_langchain.checkpoint import StreamCheckpoint, StreamCheckpointStore

__all__ = [
    "acommit_turn",
    "arelease_committed",
    "commit_turn",
    "kept_checkpoint_key",
    "last_kept_checkpoint",
    "last_kept_checkpoint_key",
    "prepare_turn",
    "release_committed",
]


def kept_checkpoint_key(message: BaseMessage) -> str | None:
    """The key of the complete checkpoint kept for ``message``, if one was kept.

    Only assistant messages returned by `RecoveringChatModel` that kept their
    finished turn in the store until memory commits it carry one.
    """
    if not isinstance(message, AIMessage):
        return None
    awaken = message.response_metadata.get("awaken")
    if not isinstance(awaken, dict) or not awaken.get("checkpoint_complete"):
        return None
    key = awaken.get("checkpoint_key")
    return key if isinstance(key, str) and key else None


def last_kept_checkpoint_key(messages: Sequence[BaseMessage]) -> str | None:
    """The kept checkpoint key of the last assistant message in ``messages``."""
    last = last_kept_checkpoint(messages)
    return None if last is None else last[0]


def last_kept_checkpoint(messages: Sequence[BaseMessage]) -> tuple[str, str | None] | None:
    """The kept checkpoint key and the message id of the last assistant message in ``messages``.

    Both are only what the messages say: the record under the key is released
    only if it is the complete record of that message (see
    ``TurnEngine.releasable``).
    """
    for message in reversed(messages):
        if isinstance(message, AIMessage):
            key = kept_checkpoint_key(message)
            return None if key is None else (key, message.id)
    return None


def release_committed(messages: Sequence[BaseMessage], store: StreamCheckpointStore) -> None:
    """Delete the complete checkpoint of the last assistant message in memory.

    Call it with the messages memory now holds (for example
    ``graph.get_state(config).values["messages"]`` after a graph run) to release
    the last turn's checkpoint without waiting for the thread's next model call.
    A failed deletion warns and leaves the committed turn valid. Only the
    complete record kept for that very message is deleted (see `_Release`).
    """
    last = last_kept_checkpoint(messages)
    if last is not None:
        _delete(store, _Release(*last))


async def arelease_committed(messages: Sequence[BaseMessage], store: StreamCheckpointStore) -> None:
    """Async twin of :func:`release_committed`."""
    last = last_kept_checkpoint(messages)
    if last is not None:
        await _adelete(store, _Release(*last))


def commit_turn(
    history: BaseChatMessageHistory,
    messages: Sequence[BaseMessage],
    *,
    store: StreamCheckpointStore | None = None,
    key: str | None = None,
) -> list[BaseMessage]:
    """Add one complete turn to a chat history, once, then release its checkpoint.

    The turn's messages (typically ``[human, ai]``, or ``[human, ai, tool, ...,
    ai]`` for a turn with tool calls) are added in one ``add_messages`` call,
    skipping any whose id the history already holds, so committing the same
    turn twice (a crash after the commit, before the checkpoint was deleted)
    adds nothing the second time. Messages without an id get one derived from
    the turn's assistant message id, which is stable across a resumed turn.
    Chunks are stored as complete messages. The history's messages are read
    once to find the ids it already holds.

    Args:
        history: The chat message history to commit to.
        messages: The turn, ending with the assistant's final message.
        store: The checkpoint store the turn's model used; the complete
            checkpoints kept for the turn's assistant messages (recorded in
            their ``response_metadata["awaken"]``) are deleted after the commit.
        key: One more checkpoint key to delete after the commit.

    Returns:
        The messages that were added.

    Raises:
        ValueError: If the turn does not end with an assistant message, holds
            the partial output of an interrupted turn, or an assistant tool call
            has no answering ``ToolMessage`` in the turn.
    """
    turn = prepare_turn(messages)
    existing = {m.id for m in history.messages if m.id}
    new = [m for m in turn if m.id not in existing]
    if new:
        history.add_messages(new)
    if store is not None:
        for release in _released_keys(turn, key):
            _delete(store, release)
    return new


async def acommit_turn(
    history: BaseChatMessageHistory,
    messages: Sequence[BaseMessage],
    *,
    store: StreamCheckpointStore | None = None,
    key: str | None = None,
) -> list[BaseMessage]:
    """Async twin of :func:`commit_turn`."""
    turn = prepare_turn(messages)
    existing = {m.id for m in await history.aget_messages() if m.id}
    new = [m for m in turn if m.id not in existing]
    if new:
        await history.aadd_messages(new)
    if store is not None:
        for release in _released_keys(turn, key):
            await _adelete(store, release)
    return new


def prepare_turn(messages: Sequence[BaseMessage]) -> list[BaseMessage]:
    """Check that ``messages`` form a complete turn and give every message an id.

    Raises:
        ValueError: If the turn is empty, does not end with an assistant
            message, holds the partial output of an interrupted turn, or leaves
            an assistant tool call unanswered.
    """
    turn: list[BaseMessage] = [
        message_chunk_to_message(m) if isinstance(m, BaseMessageChunk) else m for m in messages
    ]
    if not turn or not isinstance(turn[-1], AIMessage):
        raise ValueError(
            "a turn to commit must end with the assistant's message; pass the turn's "
            "messages in order, e.g. [human_message, ai_message]"
        )
    for message in turn:
        awaken = message.response_metadata.get("awaken")
        if isinstance(awaken, dict) and awaken.get("interrupted"):
            raise ValueError(
                f"assistant message {message.id!r} is the partial output of a turn that "
                "could not be completed (StreamInterruptedError.partial); only complete "
                "turns are committed: retry the turn, or resume it from its checkpoint"
            )
    answered = {m.tool_call_id for m in turn if isinstance(m, ToolMessage)}
    for message in turn:
        if isinstance(message, AIMessage):
            missing = [c.get("id") for c in message.tool_calls if c.get("id") not in answered]
            if missing:
                raise ValueError(
                    f"the turn's assistant message {message.id!r} has tool calls {missing} "
                    "without a ToolMessage answering them; a turn is complete only when "
                    "its tool calls are answered: run the tools and commit their "
                    "ToolMessages and the model's final answer together"
                )
    anchor = turn[-1].id
    if anchor is None:
        return turn
    return [
        m if m.id else m.model_copy(update={"id": f"{anchor}--{position}"})
        for position, m in enumerate(turn)
    ]


@dataclass(frozen=True, slots=True)
class _Release:
    """A checkpoint a committed turn releases, and the message that names it.

    A key read from a message is only what the message says (messages may come
    from a client): the record is deleted only if it is complete and was kept
    for that message (same id), with the record's epoch, so a newer owner of the
    run fences the delete. A key the caller passes itself is deleted as given.
    """

    key: str
    message_id: str | None = None
    trusted: bool = False

    def deletable(self, kept: StreamCheckpoint) -> bool:
        """Whether ``kept``, read under the key, is the named message's finished turn."""
        return kept.complete and self.message_id is not None and kept.message_id == self.message_id


def _released_keys(turn: Sequence[BaseMessage], key: str | None) -> list[_Release]:
    """The checkpoints a committed turn releases: its kept ones, and ``key``."""
    releases: dict[str, _Release] = {}
    for message in turn:
        kept = kept_checkpoint_key(message)
        if kept is not None:
            releases.setdefault(kept, _Release(kept, message.id))
    if key is not None:
        releases[key] = _Release(key, trusted=True)
    return list(releases.values())


def _delete(store: StreamCheckpointStore, release: _Release) -> None:
    key = release.key
    try:
        if release.trusted:
            store.delete(key)
        elif (kept := store.get(key)) is not None and release.deletable(kept):
            store.delete(key, epoch=kept.epoch)
    except StreamCheckpointError as exc:
        store_failure(key, f"could not delete the committed turn's checkpoint {key!r}", exc).log()


async def _adelete(store: StreamCheckpointStore, release: _Release) -> None:
    key = release.key
    try:
        if release.trusted:
            await store.adelete(key)
        elif (kept := await store.aget(key)) is not None and release.deletable(kept):
            await store.adelete(key, epoch=kept.epoch)
    except StreamCheckpointError as exc:
        store_failure(key, f"could not delete the committed turn's checkpoint {key!r}", exc).log()
