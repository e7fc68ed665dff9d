"""Step e: a drop on the Responses API, resumed at the provider with ``provider_resume=True``."""

from __future__ import annotations

from langchain_core.messages import BaseMessage

from awaken_langchain._session import Record, TurnReporter
from awaken_langchain.demo.agent import demo_retry_policy
from awaken_langchain.demo.conversation import A_RESUME, Q_RESUME
from awaken_langchain.demo.stage import Stage, Step, StepResult, difference
from awaken_langchain.model import RecoveringChatModel
from awaken_langchain.recovery import estimate_tokens
from awaken_langchain.testing.server import Fault, FaultKind

RESPONSES_MODEL = "gpt-5-mini"
"""The model name step e asks the loopback provider for, on the Responses API."""
_RESPONSES_EVENTS_BEFORE_TEXT = 4
"""Responses API events before the first text delta (created, in_progress, item and part added)."""


class ProviderResumeStep(Step):
    """Step e: the connection drops while the provider keeps generating the response."""

    title = "drop resumed at the provider"
    short_title = "provider resume"
    question = Q_RESUME
    answer = A_RESUME

    def committed(self) -> list[tuple[type[BaseMessage], str]]:
        """Nothing: a model call outside the agent, not in its memory."""
        return []

    def run(self, stage: Stage, result: StepResult) -> None:
        """A drop on the Responses API: the provider's stream is resumed, nothing regenerated."""
        from langchain_openai import ChatOpenAI

        pieces = stage.model.scenario(Q_RESUME).text_pieces()
        stage.model.schedule(
            Q_RESUME, Fault.drop_after_events(_RESPONSES_EVENTS_BEFORE_TEXT + len(pieces) // 2)
        )
        stage.screen.heading(
            "e. the connection drops; the provider keeps the answer (provider_resume=True)",
            "ChatOpenAI on the Responses API creates the response in background mode; the "
            "connection drops halfway and the provider goes on generating. (One model call "
            "outside the agent.)",
        )
        model = RecoveringChatModel(
            model=ChatOpenAI(
                model=RESPONSES_MODEL,
                base_url=stage.server.base_url_openai,
                api_key="demo-key-not-a-secret",
                max_retries=0,
                use_responses_api=True,
            ),
            provider_resume=True,
            retry_policy=demo_retry_policy(stage.speed),
        )

        def sink(record: Record) -> None:
            result.records.append(record)
            if record.get("type") == "event" and record["name"] == "awaken_provider_resume":
                data = record["data"]
                stage.screen.marker(
                    "↻",
                    f"awaken_provider_resume: {data.get('cause')} after "
                    f"{data.get('chars_so_far')} characters; resuming response "
                    f"{data.get('response_id')} after event {data.get('starting_after')}",
                    "bold green",
                )
            else:
                stage.screen.record(record)

        stage.screen.user(Q_RESUME)
        for _ in model.stream(Q_RESUME, config={"callbacks": [TurnReporter(sink)]}):
            pass
        stage.screen.note("")

    def verify(self, stage: Stage, result: StepResult) -> None:
        """Check step e against the facts."""
        created = [r for r in result.requests if r.provider == "openai-responses"]
        retrievals = [r for r in result.requests if r.method == "GET"]
        first = created[0] if created else None
        fault = first.scenario.fault if first is not None and first.scenario else None
        resumes = result.events("awaken_provider_resume")
        chars = int(resumes[0].get("chars_so_far") or 0) if resumes else 0
        result.check(
            "the connection dropped mid-answer while the provider kept the response running",
            first is not None
            and first.body.get("background") is True
            and fault is not None
            and fault.kind is FaultKind.DROP_AFTER_EVENTS
            and 0 < chars < len(A_RESUME),
            f"{chars} of {len(A_RESUME)} characters had arrived",
        )
        after = fault.count - 1 if fault is not None and fault.count is not None else None
        result.check(
            "the wrapper resumed the provider's stream after the last event it received",
            len(retrievals) == 1
            and f"starting_after={after}" in retrievals[0].query
            and len(resumes) == 1
            and resumes[0].get("starting_after") == after,
            f"{len(retrievals)} retrieval(s), last event received: {after}",
        )
        regenerated = sum(int(m.get("regenerated_output_tokens", 0)) for m in result.awaken())
        result.check(
            "the provider generated the answer once: no second request, no token regenerated",
            len(created) == 1 and regenerated == 0 and result.plans() == ["provider_resume"],
            f"{len(created)} generation(s), {regenerated} tokens regenerated",
        )
        result.check(
            "the answer reached the caller whole, with no repeated text",
            result.text() == A_RESUME,
            difference(result.text(), A_RESUME),
        )
        result.restart_tokens = estimate_tokens(chars)
        result.regenerated_tokens = regenerated
