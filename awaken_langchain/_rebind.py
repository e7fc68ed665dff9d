"""Putting the wrapper where the inner model was: settings and runnable trees."""

from __future__ import annotations

from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.runnables import RunnableBinding, RunnableParallel, RunnableSequence

__all__ = ["replace_model", "with_settings"]


def with_settings(inner: BaseChatModel, settings: dict[str, Any]) -> BaseChatModel:
    """Rebuild ``inner`` with constructor settings that were given to the wrapper."""
    fields = type(inner).model_fields
    names = set(fields) | {f.alias for f in fields.values() if f.alias}
    unknown = sorted(k for k in settings if k not in names)
    if unknown:
        raise ValueError(
            f"RecoveringChatModel does not know the setting(s) {unknown} and the inner model "
            f"{type(inner).__name__} has no such field; set them on the inner model, "
            "or check the spelling"
        )
    current = {
        name: getattr(inner, name)
        for name in inner.model_fields_set
        if name in fields and not fields[name].exclude
    }
    return type(inner)(**{**current, **settings})


def replace_model(runnable: Any, old: BaseChatModel, new: BaseChatModel) -> Any:
    """Return ``runnable`` with every reference to ``old`` replaced by ``new``."""
    # imported here: the fallbacks module pulls in an HTTP client at import time
    from langchain_core.runnables.fallbacks import RunnableWithFallbacks

    if runnable is old:
        return new
    if isinstance(runnable, RunnableBinding):
        bound = replace_model(runnable.bound, old, new)
        if bound is runnable.bound:
            return runnable
        return runnable.model_copy(update={"bound": bound})
    if isinstance(runnable, RunnableSequence):
        steps = [replace_model(step, old, new) for step in runnable.steps]
        if all(a is b for a, b in zip(steps, runnable.steps, strict=True)):
            return runnable
        return RunnableSequence(*steps, name=runnable.name)
    if isinstance(runnable, RunnableParallel):
        branches = {k: replace_model(v, old, new) for k, v in runnable.steps__.items()}
        if all(branches[k] is v for k, v in runnable.steps__.items()):
            return runnable
        return RunnableParallel(branches)
    if isinstance(runnable, RunnableWithFallbacks):
        primary = replace_model(runnable.runnable, old, new)
        fallbacks = [replace_model(f, old, new) for f in runnable.fallbacks]
        if primary is runnable.runnable and all(
            a is b for a, b in zip(fallbacks, runnable.fallbacks, strict=True)
        ):
            return runnable
        return runnable.model_copy(update={"runnable": primary, "fallbacks": fallbacks})
    return runnable
