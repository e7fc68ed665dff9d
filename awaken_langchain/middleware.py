"""`StreamRecoveryMiddleware`: recovered model calls for LangChain v1 agents.

``langchain.agents.create_agent(model, tools, middleware=[...])`` runs every
model call through the middleware's ``wrap_model_call``. This middleware runs
the call with the request's model, whichever it is at that point (the agent's
model, a model given as a string, one chosen by ``ModelFallbackMiddleware`` or a
router), wrapped in `RecoveringChatModel`: retries before output, continuation
after partial output, whole tool calls only, and an optional checkpoint store.

Where it goes in the list (the first middleware is the outermost layer):

- **after** ``ModelFallbackMiddleware`` and anything else that picks the model,
  so the model it picked is the one protected (a fallback's stream is recovered
  too, and a primary whose budget is spent raises, so the fallback runs);
- **after** ``AnthropicPromptCachingMiddleware``, which checks
  ``isinstance(request.model, ChatAnthropic)``: it must still see the bare
  model. Its ``cache_control`` setting and markers reach the inner model, on the
  first request and on continuation requests;
- **instead of** ``ModelRetryMiddleware``: stacking both multiplies the budgets
  (each of its attempts would be a whole recovered turn).

Fallback models: ``StreamRecoveryMiddleware(fallbacks=[...])`` moves a model
call whose model has spent its budget on to the next model *within the same
turn*. Before any output that is a fresh request; after output the fallback
continues from the text already streamed, so the caller's stream goes on, the
thread gets one AI message for the turn, and ``response_metadata["awaken"]
["models"]`` says which model wrote which part. ``ModelFallbackMiddleware``
instead restarts the whole model call from nothing on the next model: text
already streamed to the caller is produced again (``stream_mode="messages"``
shows it twice) and paid for twice. Use ``fallbacks`` here for outages that
strike mid-stream (a 529 storm, dropped connections); ``ModelFallbackMiddleware``
placed before this middleware still catches what recovery raises (a permanent
error, every model spent).

Example:
    ```python
    from langchain.agents import create_agent
    from langchain.agents.middleware import ModelFallbackMiddleware
    from awaken_langchain import RetryPolicy
    from awaken_langchain.middleware import StreamRecoveryMiddleware

    agent = create_agent(
        "openai:gpt-4o-mini",
        tools=[...],
        middleware=[
            ModelFallbackMiddleware("anthropic:claude-sonnet-4-5"),
            StreamRecoveryMiddleware(retry_policy=RetryPolicy(max_attempts=4)),
        ],
    )

    # or: continue a half-streamed answer on Claude when OpenAI is spent
    agent = create_agent(
        "openai:gpt-4o-mini",
        tools=[...],
        middleware=[StreamRecoveryMiddleware(fallbacks=["anthropic:claude-sonnet-4-5"])],
    )
    ```
"""

from __future__ import annotations

import collections
import logging
import threading
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from langchain.agents.middleware.types import (
    AgentMiddleware,
    AgentState,
    ModelCallResult,
    ModelRequest,
    ModelResponse,
    ToolCallRequest,
)
from langchain.agents.structured_output import AutoStrategy, ProviderStrategy, ToolStrategy
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import ToolCall, ToolMessage
from langgraph.types import Command

from awaken_langchain._provider_resume import provider_resume_problem
from awaken_langchain.checkpoint import StreamCheckpointStore
from awaken_langchain.fallback import resolve_fallbacks
from awaken_langchain.ledger import KeyedTool, ToolLedger, refuse_streaming
from awaken_langchain.model import RecoveringChatModel
from awaken_langchain.retry import RetryPolicy

logger = logging.getLogger(__name__)

__all__ = ["StreamRecoveryMiddleware", "ToolLedgerMiddleware"]

_CACHE_SIZE = 64
"""Wrappers kept per middleware: one per model object seen, least recently used out."""


class StreamRecoveryMiddleware(AgentMiddleware[AgentState[Any], Any, Any]):
    """Gives every model call of an agent `RecoveringChatModel`'s recovery.

    Each call runs with ``request.model`` wrapped in a `RecoveringChatModel`
    built from this middleware's settings. One wrapper is built per model object
    and reused. A model that is already a `RecoveringChatModel` is used as it
    is. When recovery gives up (`StreamInterruptedError`, or a permanent
    provider error), the error propagates to the middleware around this one,
    so ``ModelFallbackMiddleware`` placed before it falls back.

    Args:
        retry_policy: Attempts before output, continuations after output,
            backoff, deadlines (`RetryPolicy`).
        store: Where in-flight turns are checkpointed; ``None`` recovers
            in-process only.
        fallbacks: Models a call moves to, in order, when the request's model
            has spent its budget: chat models or ``"provider:model"`` strings
            (resolved once, here). After output the fallback continues the
            turn from what was streamed (see the module docstring for how this
            differs from ``ModelFallbackMiddleware``); each model gets
            ``retry_policy``'s budget afresh.
        **settings: Other `RecoveringChatModel` settings
            (``stream_idle_timeout``, ``checkpoint_every_chunks``,
            ``continuation_prompt``, ``provider_resume``, ...), given to every
            wrapper built. ``provider_resume=True`` resumes the calls of a
            ``ChatOpenAI(use_responses_api=True)``; a call on another model (one
            ``ModelFallbackMiddleware`` picked) is continued by prompt, with a
            warning when its wrapper is built.

    Raises:
        ValueError: If a setting is not a `RecoveringChatModel` setting (inner
            model settings belong on the model given to the agent), or a
            fallback is not a chat model.
    """

    def __init__(
        self,
        *,
        retry_policy: RetryPolicy | None = None,
        store: StreamCheckpointStore | None = None,
        fallbacks: Sequence[BaseChatModel | str] | None = None,
        **settings: Any,
    ) -> None:
        super().__init__()
        own = set(RecoveringChatModel.model_fields) - {
            "model",
            "retry_policy",
            "store",
            "fallbacks",
        }
        unknown = sorted(set(settings) - own)
        if unknown:
            raise ValueError(
                f"StreamRecoveryMiddleware does not know the setting(s) {unknown}; it takes "
                f"retry_policy, store, fallbacks and {sorted(own)}. Model settings (temperature, "
                "max_retries, ...) belong on the model given to create_agent"
            )
        self.retry_policy = retry_policy if retry_policy is not None else RetryPolicy()
        self.store = store
        self.fallbacks = resolve_fallbacks(fallbacks)
        self.settings = settings
        self.tools = []
        self._wrappers: collections.OrderedDict[
            int, tuple[weakref.ref[BaseChatModel], RecoveringChatModel]
        ] = collections.OrderedDict()
        self._lock = threading.Lock()

    def wrapper_for(self, model: BaseChatModel) -> RecoveringChatModel:
        """The `RecoveringChatModel` this middleware runs ``model`` in (built once per model)."""
        if isinstance(model, RecoveringChatModel):
            return model
        with self._lock:
            entry = self._wrappers.get(id(model))
            if entry is not None and entry[0]() is model:
                self._wrappers.move_to_end(id(model))
                return entry[1]
            settings = self.settings
            if settings.get("provider_resume"):
                # the request's model may be one ModelFallbackMiddleware picked: a model
                # that cannot resume at the provider is still protected, by prompt
                problem = provider_resume_problem(model)
                if problem is not None:
                    logger.warning(
                        "%s continues interrupted turns by prompt: %s",
                        type(model).__name__,
                        problem,
                    )
                    settings = {**settings, "provider_resume": False}
            wrapper = RecoveringChatModel(
                model=model,
                retry_policy=self.retry_policy,
                store=self.store,
                fallbacks=[f for f in self.fallbacks if f is not model],
                **settings,
            )
            logger.debug("protecting %s with RecoveringChatModel", type(model).__name__)
            self._wrappers[id(model)] = (weakref.ref(model), wrapper)
            if len(self._wrappers) > _CACHE_SIZE:
                self._wrappers.popitem(last=False)
            return wrapper

    def _protected(self, request: ModelRequest[Any]) -> ModelRequest[Any]:
        """``request`` with its model wrapped, deciding what the agent decides from the model.

        ``create_agent`` picks the structured-output strategy and OpenAI's
        ``strict`` flag by looking at ``request.model``; they are decided here
        from the inner model, so the wrapped call sends what the bare one would.
        """
        inner = request.model
        overrides: dict[str, Any] = {"model": self.wrapper_for(inner)}
        response_format = request.response_format
        if response_format is not None and not isinstance(
            response_format, ToolStrategy | ProviderStrategy
        ):
            schema = (
                response_format.schema
                if isinstance(response_format, AutoStrategy)
                else response_format
            )
            if _supports_provider_strategy(inner, request.tools):
                response_format = ProviderStrategy(schema=schema)
            else:
                response_format = ToolStrategy(schema=schema)
            overrides["response_format"] = response_format
        if (
            isinstance(response_format, ProviderStrategy)
            and _is_openai_compatible(inner)
            and not getattr(inner, "use_responses_api", False)
        ):
            overrides["model_settings"] = {**request.model_settings, "strict": True}
        return request.override(**overrides)

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelCallResult[Any]:
        """Run the model call with the request's model wrapped in `RecoveringChatModel`."""
        return handler(self._protected(request))

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelCallResult[Any]:
        """Run the model call with the request's model wrapped in `RecoveringChatModel`."""
        return await handler(self._protected(request))


def _supports_provider_strategy(model: BaseChatModel, tools: list[Any]) -> bool:
    """Whether ``create_agent`` would use the provider's structured output for ``model``."""
    from langchain.agents import factory

    decide: Callable[..., bool] = factory._supports_provider_strategy
    return decide(model, tools=tools)


def _is_openai_compatible(model: BaseChatModel) -> bool:
    """Whether ``create_agent`` adds ``strict=True`` for ``model`` (a ``BaseChatOpenAI``)."""
    from langchain.agents import factory

    decide: Callable[[BaseChatModel], bool] = factory._is_openai_compatible_model
    return decide(model)


class ToolLedgerMiddleware(AgentMiddleware[AgentState[Any], Any, Any]):
    """Runs every tool call of a ``create_agent`` agent through a `ToolLedger`.

    A call that already finished under the same thread and ``tool_call_id``
    (a replacement process re-running the tools step after a crash) gets its
    recorded result and the tool is not called; a call that started and never
    finished is handled by the ledger's ``on_unknown`` policy. Use it alongside
    `StreamRecoveryMiddleware` (the order between the two does not matter: one
    wraps model calls, the other tool calls). Put it after middleware that
    rewrites tool calls, so the ledger records the call that actually runs.

    Example:
        ```python
        agent = create_agent(
            model,
            tools=[send_email],
            middleware=[StreamRecoveryMiddleware(), ToolLedgerMiddleware(ToolLedger(store))],
            checkpointer=saver,
        )
        ```

    Args:
        ledger: The ledger the calls go through.
    """

    def __init__(self, ledger: ToolLedger) -> None:
        super().__init__()
        if not isinstance(ledger, ToolLedger):
            raise TypeError(
                f"ToolLedgerMiddleware takes a ToolLedger, got {type(ledger).__name__}; "
                "build one with ToolLedger(store)"
            )
        self.ledger = ledger

    def wrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], ToolMessage | Command[Any]],
    ) -> ToolMessage | Command[Any]:
        """Run the call through the ledger: replayed, reported, or run and recorded."""
        if request.tool is None:  # not a registered tool: the tool node answers it
            return handler(request)
        refuse_streaming(request.tool)

        def execute(call: ToolCall) -> ToolMessage | Command[Any]:
            return handler(_keyed(request, call))

        return self.ledger.run_call(request.tool_call, request.tool, execute, _config(request))

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]],
    ) -> ToolMessage | Command[Any]:
        """Async twin of `wrap_tool_call`."""
        if request.tool is None:
            return await handler(request)
        refuse_streaming(request.tool)

        async def execute(call: ToolCall) -> ToolMessage | Command[Any]:
            return await handler(_keyed(request, call))

        return await self.ledger.arun_call(
            request.tool_call, request.tool, execute, _config(request)
        )


def _keyed(request: ToolCallRequest, call: ToolCall) -> ToolCallRequest:
    """The request, its tool receiving the idempotency key the ledger added to ``call``."""
    if call is request.tool_call or request.tool is None:
        return request
    given = request.tool_call["args"]
    injected = {name: value for name, value in call["args"].items() if name not in given}
    return request.override(tool=KeyedTool.of(request.tool, injected))


def _config(request: ToolCallRequest) -> Any:
    runtime = getattr(request, "runtime", None)
    return getattr(runtime, "config", None)
