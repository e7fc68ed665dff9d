"""Agents with RecoveringChatModel: a tool call cut off mid-stream never runs.

``langchain.agents.create_agent`` (langchain 1.x) and langchain-classic's
``AgentExecutor`` with ``create_tool_calling_agent`` run with the wrapper as their
model. The tool that matters records every call and has a dangerous default:
``transfer(to, amount, confirm=False)`` run with its default would be the bug.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_classic.agents import AgentExecutor, create_tool_calling_agent
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.tools import BaseTool, tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.sqlite import SqliteSaver

from awaken_langchain import DiskCacheStreamCheckpointStore, RecoveringChatModel
from awaken_langchain.accumulator import INTERRUPTED_TOOL_CALL_ERROR
from awaken_langchain.history import release_committed
from awaken_langchain.recovery import (
    DEFAULT_CONTINUATION_PROMPT,
    INVALID_ARGS_MARKER,
    answer_invalid_tool_calls,
)
from awaken_langchain.retry import RetryPolicy
from awaken_langchain.testing import (
    Fault,
    LoopbackProvider,
    Scenario,
    ScriptedChatModel,
    ScriptedToolCall,
    finish,
    text,
    tool_call,
)


async def _no_wait(_seconds: float) -> None:
    return None


NO_WAIT = RetryPolicy(sleep=lambda _s: None, async_sleep=_no_wait)

WHOLE_TRANSFER = '{"to": "alice", "amount": 100, "confirm": true}'
CUT_TRANSFER = '{"to": "alice", "amount": 100, "conf'


class Bank:
    """Tools that record every call they execute."""

    def __init__(self) -> None:
        self.executed: list[tuple[str, dict[str, Any]]] = []

        @tool
        def transfer(to: str, amount: int, confirm: bool = False) -> str:
            """Transfer money; without confirm=True it is only a dry run."""
            self.executed.append(("transfer", {"to": to, "amount": amount, "confirm": confirm}))
            return "transferred" if confirm else "dry run"

        @tool
        def balance(account: str) -> str:
            """Read an account's balance."""
            self.executed.append(("balance", {"account": account}))
            return "balance: 500"

        self.tools: list[BaseTool] = [transfer, balance]

    def transfers(self) -> list[dict[str, Any]]:
        return [args for name, args in self.executed if name == "transfer"]


def reset() -> ConnectionResetError:
    return ConnectionResetError("connection reset by peer")


def r2_scripts() -> list[list[Any]]:
    """A whole balance call, then a transfer cut off mid-arguments; the model re-issues it."""
    return [
        [
            *tool_call("balance", '{"account": "main"}', id="call_balance", index=0),
            *tool_call("transfer", CUT_TRANSFER, id="call_cut", index=1),
            reset(),
        ],
        [*tool_call("transfer", WHOLE_TRANSFER, id="call_again"), finish("tool_calls")],
        [*text("Sent 100 to alice."), finish()],
    ]


def run_agent(agent: Any, question: str, mode: str) -> list[BaseMessage]:
    state = {"messages": [HumanMessage(question)]}
    if mode == "invoke":
        return list(agent.invoke(state)["messages"])
    final: dict[str, Any] = {}
    for kind, payload in agent.stream(state, stream_mode=["messages", "values"]):
        if kind == "values":
            final = payload
    return list(final["messages"])


def tool_answers(messages: list[BaseMessage]) -> dict[str, str]:
    return {m.tool_call_id: str(m.content) for m in messages if isinstance(m, ToolMessage)}


# -- create_agent --------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["invoke", "stream"])
def test_create_agent_never_runs_a_cut_off_call_and_the_model_reissues_it(mode: str) -> None:
    bank = Bank()
    inner = ScriptedChatModel(scripts=r2_scripts())
    agent = create_agent(RecoveringChatModel(model=inner, retry_policy=NO_WAIT), tools=bank.tools)
    messages = run_agent(agent, "pay alice 100", mode)
    assert bank.transfers() == [{"to": "alice", "amount": 100, "confirm": True}]
    assert [name for name, _ in bank.executed] == ["balance", "transfer"]
    assert messages[-1].content == "Sent 100 to alice."
    told = tool_answers(inner.calls[1].messages)
    assert "call_cut" in told  # the model learned the call did not run
    assert "not be executed" in told["call_cut"]
    # create_agent keeps its own repair in state, so memory stays a valid history
    remembered = tool_answers(messages)
    assert set(remembered) == {"call_balance", "call_cut", "call_again"}
    assert remembered["call_cut"] == told["call_cut"]


def test_create_agent_does_not_run_a_call_truncated_by_the_token_limit() -> None:
    scripts = [[*tool_call("transfer", CUT_TRANSFER, id="call_cut"), finish("length")]]
    bank = Bank()
    agent = create_agent(
        RecoveringChatModel(model=ScriptedChatModel(scripts=scripts), retry_policy=NO_WAIT),
        tools=bank.tools,
    )
    run_agent(agent, "pay alice 100", "stream")
    assert bank.executed == []


def test_without_the_wrapper_a_truncated_call_runs_with_its_default_arguments() -> None:
    """The hazard the wrapper removes, measured on the same script."""
    scripts = [
        [*tool_call("transfer", CUT_TRANSFER, id="call_cut"), finish("length")],
        [*text("Done."), finish()],
    ]
    bank = Bank()
    agent = create_agent(ScriptedChatModel(scripts=scripts), tools=bank.tools)
    run_agent(agent, "pay alice 100", "stream")
    assert bank.transfers() == [{"to": "alice", "amount": 100, "confirm": False}]


def test_create_agent_restarts_a_turn_cut_off_in_its_first_tool_call() -> None:
    scripts = [
        [*tool_call("transfer", CUT_TRANSFER, id="call_cut"), reset()],
        [*tool_call("transfer", WHOLE_TRANSFER, id="call_whole"), finish("tool_calls")],
        [*text("Done."), finish()],
    ]
    bank = Bank()
    inner = ScriptedChatModel(scripts=scripts)
    agent = create_agent(RecoveringChatModel(model=inner, retry_policy=NO_WAIT), tools=bank.tools)
    run_agent(agent, "pay alice 100", "stream")
    assert bank.transfers() == [{"to": "alice", "amount": 100, "confirm": True}]
    assert inner.calls[1].messages == inner.calls[0].messages  # plan R4: the same request


def test_create_agent_continues_text_and_drops_a_call_cut_off_after_it() -> None:
    scripts = [
        [
            *text("I will send the money now. "),
            *tool_call("transfer", CUT_TRANSFER, id="c1"),
            reset(),
        ],
        [*tool_call("transfer", WHOLE_TRANSFER, id="c2"), finish("tool_calls")],
        [*text("Done."), finish()],
    ]
    bank = Bank()
    inner = ScriptedChatModel(scripts=scripts)
    agent = create_agent(RecoveringChatModel(model=inner, retry_policy=NO_WAIT), tools=bank.tools)
    messages = run_agent(agent, "pay alice 100", "invoke")
    assert bank.transfers() == [{"to": "alice", "amount": 100, "confirm": True}]
    assert inner.calls[1].messages[-1].content == DEFAULT_CONTINUATION_PROMPT
    assert all(DEFAULT_CONTINUATION_PROMPT not in str(m.content) for m in messages)


async def test_create_agent_async_never_runs_a_cut_off_call() -> None:
    bank = Bank()
    inner = ScriptedChatModel(scripts=r2_scripts())
    agent = create_agent(RecoveringChatModel(model=inner, retry_policy=NO_WAIT), tools=bank.tools)
    result = await agent.ainvoke({"messages": [HumanMessage("pay alice 100")]})
    assert bank.transfers() == [{"to": "alice", "amount": 100, "confirm": True}]
    assert result["messages"][-1].content == "Sent 100 to alice."


def test_create_agent_with_chat_openai_and_sqlite_memory(
    loopback_provider: LoopbackProvider, tmp_path: Path
) -> None:
    server = loopback_provider
    server.enqueue(
        Scenario(
            tool_calls=[
                ScriptedToolCall("balance", {"account": "main"}, id="call_balance"),
                ScriptedToolCall(
                    "transfer", {"to": "alice", "amount": 100, "confirm": True}, id="call_cut"
                ),
            ],
            fault=Fault.drop_after_events(12),  # inside the transfer's arguments
        )
    )
    server.enqueue(
        Scenario(
            tool_calls=[
                ScriptedToolCall(
                    "transfer", {"to": "alice", "amount": 100, "confirm": True}, id="call_again"
                )
            ]
        )
    )
    server.enqueue(Scenario(text="Sent 100 to alice."))
    model = ChatOpenAI(
        model="gpt-4o-mini", base_url=server.base_url_openai, api_key="x", max_retries=0
    )
    bank = Bank()
    connection = sqlite3.connect(tmp_path / "agent.sqlite", check_same_thread=False)
    store = DiskCacheStreamCheckpointStore(tmp_path / "checkpoints")
    agent = create_agent(
        RecoveringChatModel(model=model, retry_policy=NO_WAIT, store=store),
        tools=bank.tools,
        checkpointer=SqliteSaver(connection),
    )
    config = {"configurable": {"thread_id": "customer-1"}}
    for _ in agent.stream(
        {"messages": [HumanMessage("pay alice 100")]}, config, stream_mode="messages"
    ):
        pass
    memory = agent.get_state(config).values["messages"]
    connection.close()
    assert bank.transfers() == [{"to": "alice", "amount": 100, "confirm": True}]
    assert memory[-1].content == "Sent 100 to alice."
    assert all(r.rejected_by is None for r in server.requests)
    assert len(server.requests_for("openai")) == 3
    cut = [m for m in memory if isinstance(m, AIMessage) and m.invalid_tool_calls]
    assert [c["id"] for c in cut[0].invalid_tool_calls] == ["call_cut"]
    # each model call released the turn before it; only the last awaits its release
    assert [c.complete for c in store.list_checkpoints()] == [True]
    release_committed(memory, store)
    assert store.list_run_ids() == []
    store.close()


# -- AgentExecutor (langchain-classic) -------------------------------------------------------

PROMPT = ChatPromptTemplate.from_messages(
    [
        ("system", "You move money carefully."),
        ("human", "{input}"),
        ("placeholder", "{agent_scratchpad}"),
    ]
)


def executor(model: Any, bank: Bank) -> AgentExecutor:
    agent = create_tool_calling_agent(model, bank.tools, PROMPT)
    return AgentExecutor(agent=agent, tools=bank.tools)


def test_agent_executor_never_runs_a_cut_off_call_and_the_model_is_told() -> None:
    bank = Bank()
    inner = ScriptedChatModel(scripts=r2_scripts())
    result = executor(RecoveringChatModel(model=inner, retry_policy=NO_WAIT), bank).invoke(
        {"input": "pay alice 100"}
    )
    assert result["output"] == "Sent 100 to alice."
    assert bank.transfers() == [{"to": "alice", "amount": 100, "confirm": True}]
    told = tool_answers(inner.calls[1].messages)  # the executor itself ignores invalid calls
    assert "call_cut" in told
    assert "was not executed" in told["call_cut"]


def loopback_model(server: LoopbackProvider, provider: str) -> Any:
    if provider == "openai":
        return ChatOpenAI(
            model="gpt-4o-mini", base_url=server.base_url_openai, api_key="x", max_retries=0
        )
    from langchain_anthropic import ChatAnthropic

    return ChatAnthropic(
        model="claude-sonnet-4-6",
        base_url=server.base_url_anthropic,
        api_key="x",
        max_retries=0,
    )


def answered_ids(request: Any) -> list[str]:
    """Tool call ids answered in a recorded OpenAI or Anthropic request."""
    ids: list[str] = []
    for message in request.messages:
        if message["role"] == "tool":
            ids.append(message["tool_call_id"])
        elif isinstance(message["content"], list):
            ids += [b["tool_use_id"] for b in message["content"] if b.get("type") == "tool_result"]
    return ids


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_agent_executor_with_real_clients_sends_only_valid_histories(
    loopback_provider: LoopbackProvider, provider: str
) -> None:
    server = loopback_provider
    transfer = {"to": "alice", "amount": 100, "confirm": True}
    server.enqueue(
        Scenario(
            tool_calls=[
                ScriptedToolCall("balance", {"account": "main"}, id="call_balance"),
                ScriptedToolCall("transfer", transfer, id="call_cut"),
            ],
            fault=Fault.drop_after_events(12 if provider == "openai" else 10),
        )
    )
    server.enqueue(Scenario(tool_calls=[ScriptedToolCall("transfer", transfer, id="call_again")]))
    server.enqueue(Scenario(text="Sent 100 to alice."))
    bank = Bank()
    wrapper = RecoveringChatModel(model=loopback_model(server, provider), retry_policy=NO_WAIT)
    result = executor(wrapper, bank).invoke({"input": "pay alice 100"})
    if provider == "openai":
        assert result["output"] == "Sent 100 to alice."
    else:  # with tools bound, ChatAnthropic streams text as content blocks
        assert result["output"] == [{"type": "text", "text": "Sent 100 to alice.", "index": 0}]
    assert bank.transfers() == [transfer]
    requests = server.requests
    assert [r.rejected_by for r in requests] == [None, None, None]  # no unanswered tool call
    assert sorted(answered_ids(requests[1])) == ["call_balance", "call_cut"]


# -- the request-time answer, as a pure function ------------------------------------------


def test_unanswered_invalid_calls_are_answered_in_the_request_only() -> None:
    cut = AIMessage(
        content="",
        id="ai-1",
        tool_calls=[{"name": "balance", "args": {"account": "main"}, "id": "ok"}],
        invalid_tool_calls=[
            {
                "type": "invalid_tool_call",
                "name": "transfer",
                "args": INVALID_ARGS_MARKER + '{"to": "sav',
                "id": "cut",
                "error": None,
            },
            {
                "type": "invalid_tool_call",
                "name": "transfer",
                "args": "{",
                "id": None,
                "error": None,
            },
        ],
        response_metadata={
            "awaken": {
                "not_executed": [
                    {
                        "id": "cut",
                        "name": "transfer",
                        "error": INTERRUPTED_TOOL_CALL_ERROR,
                        "interrupted": True,
                    }
                ]
            }
        },
    )
    history = [HumanMessage("q"), cut, ToolMessage("500", tool_call_id="ok")]
    request = answer_invalid_tool_calls(history)
    assert len(history) == 3  # the caller's list (memory) is untouched
    assert history[1].invalid_tool_calls[0]["args"].startswith(INVALID_ARGS_MARKER)
    sent = request[1]
    assert isinstance(sent, AIMessage)
    assert [c["args"] for c in sent.invalid_tool_calls] == ['{"to": "sav', "{"]  # as written
    added = [m for m in request if m not in history and m is not sent]
    assert len(added) == 1
    assert isinstance(added[0], ToolMessage)
    assert added[0].tool_call_id == "cut"
    assert "cut off" in str(added[0].content)
    assert request.index(added[0]) == 2  # right after the assistant message
    assert answer_invalid_tool_calls(request) == request  # answered calls are left alone


def test_a_call_malformed_in_a_complete_stream_is_not_called_interrupted() -> None:
    malformed = AIMessage(
        content="",
        id="ai-2",
        invalid_tool_calls=[
            {"type": "invalid_tool_call", "name": "f", "args": "nope", "id": "m", "error": None}
        ],
    )
    request = answer_invalid_tool_calls([HumanMessage("q"), malformed])
    (answer,) = [m for m in request if isinstance(m, ToolMessage)]
    assert "not a complete JSON object" in str(answer.content)
    assert "interrupt" not in str(answer.content)
