"""OpenTelemetry spans of recovering turns, when ``opentelemetry-api`` is installed.

One span per turn covers all its attempts, named and described after the
OpenTelemetry GenAI semantic conventions (``chat {model}``,
``gen_ai.operation.name``, ``gen_ai.provider.name``, ``gen_ai.request.model``,
response id, model, finish reasons and token usage when the provider sent
them). Each recovery event (retry, continuation, resume, checkpoint warning)
is a span event named after the event, its payload under ``awaken.*``
attributes. A turn that fails ends with an error status and the exception.

Without ``opentelemetry-api`` every call here is one cached check; with the API
but no recording tracer provider (no SDK, or the turn sampled out), one
non-recording span per turn. The span is
not made the current span: a turn's chunks are yielded from a generator, and a
context attached there would leak into the caller's code between chunks.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

__all__ = ["TurnSpan", "start_turn"]

_SCOPE = "awaken_langchain"
_PLAIN = (str, bool, int, float)


@functools.cache
def _tracer() -> Tracer | None:
    """The library's tracer, or ``None`` without ``opentelemetry-api``."""
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    from awaken_langchain import __version__

    return trace.get_tracer(_SCOPE, __version__)


def _attribute(value: Any) -> Any:
    """A span attribute value: plain values as they are, lists of them, else text."""
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return list(value)
    return str(value)


class TurnSpan:
    """The span of one turn."""

    def __init__(self, span: Span) -> None:
        self._span = span

    def event(self, name: str, data: Mapping[str, Any]) -> None:
        """Add a recovery event, its payload under ``awaken.*`` attributes, to the span."""
        attributes = {
            f"awaken.{key}": _attribute(value) for key, value in data.items() if value is not None
        }
        self._span.add_event(name, attributes)

    def end(self, acc: Any, metadata: Mapping[str, Any], failure: BaseException | None) -> None:
        """End the span with what the turn answered and what recovery it took.

        Args:
            acc: The turn's accumulator (its response metadata, message id, usage).
            metadata: The turn's ``AwakenMetadata`` (attempts, retries, plans, ...).
            failure: What the turn raised, or ``None`` when it answered.
        """
        from opentelemetry.trace import Status, StatusCode

        span = self._span
        response = acc.response_metadata if isinstance(acc.response_metadata, dict) else {}
        response_id = response.get("id")
        if not response_id and not str(acc.message_id).startswith("lc_"):
            response_id = acc.message_id  # the provider's id, kept as the message id
        if response_id:
            span.set_attribute("gen_ai.response.id", str(response_id))
        response_model = response.get("model_name") or response.get("model")
        if response_model:
            span.set_attribute("gen_ai.response.model", str(response_model))
        reason = response.get("finish_reason") or response.get("stop_reason")
        if reason:
            span.set_attribute("gen_ai.response.finish_reasons", [str(reason)])
        usage = acc.usage
        if usage:
            span.set_attribute("gen_ai.usage.input_tokens", int(usage.get("input_tokens", 0)))
            span.set_attribute("gen_ai.usage.output_tokens", int(usage.get("output_tokens", 0)))
        span.set_attribute("awaken.attempts", metadata["attempts"])
        span.set_attribute("awaken.retries", metadata["retries"])
        span.set_attribute("awaken.continuations", metadata["continuations"])
        span.set_attribute("awaken.resumed", metadata["resumed"])
        span.set_attribute("awaken.plans", list(metadata["plans"]))
        if isinstance(failure, Exception):
            span.set_attribute("error.type", type(failure).__qualname__)
            span.record_exception(failure)
            span.set_status(Status(StatusCode.ERROR, f"{type(failure).__name__}: {failure}"))
        span.end()


def start_turn(model: str | None, provider: str | None) -> TurnSpan | None:
    """Start the span of a turn, or return ``None`` without ``opentelemetry-api``."""
    tracer = _tracer()
    if tracer is None:
        return None
    from opentelemetry.trace import SpanKind

    attributes: dict[str, Any] = {"gen_ai.operation.name": "chat"}
    if provider:
        attributes["gen_ai.provider.name"] = provider
        attributes["gen_ai.system"] = provider  # the name older conventions read
    if model:
        attributes["gen_ai.request.model"] = model
    name = f"chat {model}" if model else "chat"
    span = tracer.start_span(name, kind=SpanKind.CLIENT, attributes=attributes)
    if not span.is_recording():  # no SDK configured, or sampled out: nothing to add
        span.end()
        return None
    return TurnSpan(span)
