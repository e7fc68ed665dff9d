"""Step c: a tool call cut off mid-arguments: not executed, re-issued, run once."""

from __future__ import annotations

import json

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage

from awaken_langchain.demo.conversation import A_AFTER_TOOL, A_TOOL, Q_TOOL, TOOL_ARGS, TOOL_RESULT
from awaken_langchain.demo.scripted import ScriptedModel, has_tool_calls, is_continuation_of
from awaken_langchain.demo.stage import Stage, Step, StepResult, difference
from awaken_langchain.recovery import estimate_tokens
from awaken_langchain.testing.server import Fault


def drop_mid_arguments(model: ScriptedModel, question: str, provider: str) -> tuple[Fault, str]:
    """A connection drop halfway through the first tool call's arguments.

    Returns:
        The fault and the argument text sent before the drop.
    """
    scenario = model.scenario(question)
    text_events = len(scenario.text_pieces())
    args = scenario.argument_pieces(scenario.tool_calls[0])
    sent = len(args) // 2
    # openai: role, text deltas, tool call head; anthropic: message_start, text block
    # start, text deltas, text block stop, tool block start; then argument deltas
    before = text_events + (2 if provider == "openai" else 4)
    return Fault.drop_after_events(before + sent), "".join(args[:sent])


class ToolCutStep(Step):
    """Step c: the connection drops inside the tool call's arguments."""

    title = "tool call cut mid-arguments"
    short_title = "tool cut"
    question = Q_TOOL
    answer = A_TOOL

    def __init__(self) -> None:
        self.cut_arguments = ""
        """The argument text sent before the drop."""

    def committed(self) -> list[tuple[type[BaseMessage], str]]:
        """The question, the call, the tool's result and the answer written from it."""
        return [*super().committed(), (ToolMessage, TOOL_RESULT), (AIMessage, A_AFTER_TOOL)]

    def run(self, stage: Stage, result: StepResult) -> None:
        """A tool call cut off mid-arguments: not executed, re-issued, run once."""
        fault, self.cut_arguments = drop_mid_arguments(stage.model, Q_TOOL, stage.provider)
        stage.model.schedule(Q_TOOL, fault)
        stage.screen.heading(
            "c. a tool call is cut off mid-arguments",
            f"The connection drops after the arguments {self.cut_arguments!r}: "
            "a JSON fragment that a lenient parser would 'repair' and run.",
        )
        stage.turn(result, Q_TOOL)

    def verify(self, stage: Stage, result: StepResult) -> None:
        """Check step c against the facts."""
        assert stage.agent is not None
        requests = result.requests
        cut = self.cut_arguments
        cut_valid = True
        try:
            json.loads(cut)
        except ValueError:
            cut_valid = False
        result.check(
            "the stream broke inside the tool call's arguments",
            bool(requests)
            and requests[0].scenario is not None
            and requests[0].scenario.fault is not None
            and bool(cut)
            and not cut_valid,
            f"arguments sent before the drop: {cut!r}",
        )
        continuation = requests[1] if len(requests) > 1 else None
        result.check(
            "the call was re-issued by a continuation that did not send the cut-off call back",
            continuation is not None
            and is_continuation_of(continuation, A_TOOL)
            and not has_tool_calls(continuation),
        )
        calls = stage.tool_log.calls
        result.check(
            "the tool ran exactly once, with complete arguments",
            calls == [TOOL_ARGS],
            f"tool log: {calls}",
        )
        result.check(
            "the agent answered from the tool's result",
            result.text() == A_TOOL + A_AFTER_TOOL,
            difference(result.text(), A_TOOL + A_AFTER_TOOL),
        )
        result.restart_tokens = estimate_tokens(len(A_TOOL) + len(cut))
        result.regenerated_tokens = sum(
            int(m.get("regenerated_output_tokens", 0)) for m in result.awaken()
        )
