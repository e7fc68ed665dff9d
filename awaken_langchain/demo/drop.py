"""Step b: a connection drop mid-answer, continued with no repeated text."""

from __future__ import annotations

from awaken_langchain.demo.conversation import A_DROP, Q_DROP
from awaken_langchain.demo.scripted import ScriptedModel, events_before_text, is_continuation_of
from awaken_langchain.demo.stage import Stage, Step, StepResult, difference
from awaken_langchain.recovery import estimate_tokens
from awaken_langchain.testing.server import Fault, FaultKind


def drop_mid_text(model: ScriptedModel, question: str, provider: str) -> Fault:
    """A connection drop halfway through the answer's text."""
    pieces = model.scenario(question).text_pieces()
    return Fault.drop_after_events(events_before_text(provider) + len(pieces) // 2)


class DropStep(Step):
    """Step b: the provider closes the connection halfway through the answer."""

    title = "connection drop mid-answer"
    short_title = "dropped"
    question = Q_DROP
    answer = A_DROP

    def run(self, stage: Stage, result: StepResult) -> None:
        """A connection drop mid-answer: continued without repeating text."""
        stage.model.schedule(Q_DROP, drop_mid_text(stage.model, Q_DROP, stage.provider))
        stage.screen.heading(
            "b. the connection drops mid-answer",
            "The provider closes the TCP connection halfway through the answer.",
        )
        stage.turn(result, Q_DROP)

    def verify(self, stage: Stage, result: StepResult) -> None:
        """Check step b against the facts."""
        requests = result.requests
        continuations = result.events("awaken_continuation")
        chars = int(continuations[0].get("chars_so_far") or 0) if continuations else 0
        prefix = A_DROP[:chars]
        result.check(
            "the connection dropped mid-answer",
            bool(requests)
            and requests[0].scenario is not None
            and requests[0].scenario.fault is not None
            and requests[0].scenario.fault.kind is FaultKind.DROP_AFTER_EVENTS
            and 0 < chars < len(A_DROP),
            f"{chars} of {len(A_DROP)} characters had arrived",
        )
        result.check(
            "the continuation request carried exactly the text received, then the prompt",
            len(requests) == 2 and is_continuation_of(requests[1], prefix),
        )
        result.check(
            "the answer reached the caller whole, with no repeated text",
            result.text() == A_DROP,
            difference(result.text(), A_DROP),
        )
        result.restart_tokens = estimate_tokens(chars)
        result.regenerated_tokens = sum(
            int(m.get("regenerated_output_tokens", 0)) for m in result.awaken()
        )
