"""Tools and structured output on a configurable inner model, bound per call."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.runnables import Runnable, RunnableConfig

__all__ = ["BoundPerCall"]


class BoundPerCall(Runnable[LanguageModelInput, Any]):
    """``<wrapper>.<method>(*args, **kwargs)``, built for the model each call's config picks.

    A configurable inner model (``init_chat_model(configurable_fields=...)``) is
    a different chat model class from call to call, and each class binds tools
    and structured output its own way. So the binding is made at each call, on
    the wrapper around the model that call resolves to, as ``invoke`` resolves it.

    Args:
        wrapper_for: The recovering model around the chat model a call's config
            resolves to.
        method: ``"bind_tools"`` or ``"with_structured_output"``.
        args: Positional arguments of the method.
        kwargs: Keyword arguments of the method.
    """

    def __init__(
        self,
        wrapper_for: Callable[[RunnableConfig | None], BaseChatModel],
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        self.wrapper_for = wrapper_for
        self.method = method
        self.args = args
        self.kwargs = kwargs

    def bound(self, config: RunnableConfig | None = None) -> Runnable[LanguageModelInput, Any]:
        """The binding on the wrapper around the model ``config`` resolves to."""
        runnable: Runnable[LanguageModelInput, Any] = getattr(
            self.wrapper_for(config), self.method
        )(*self.args, **self.kwargs)
        return runnable

    def invoke(
        self, input: LanguageModelInput, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Any:
        return self.bound(config).invoke(input, config, **kwargs)

    async def ainvoke(
        self, input: LanguageModelInput, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Any:
        return await self.bound(config).ainvoke(input, config, **kwargs)

    def stream(
        self, input: LanguageModelInput, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Iterator[Any]:
        yield from self.bound(config).stream(input, config, **kwargs)

    async def astream(
        self, input: LanguageModelInput, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AsyncIterator[Any]:
        async for chunk in self.bound(config).astream(input, config, **kwargs):
            yield chunk
