"""Putting the wrapper where the inner model was: settings and runnable trees."""

from __future__ import annotations

from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.runnables import RunnableBinding, RunnableParallel, RunnableSequence

__all__ = ["replace_model", "with_settings"]


_RUNTIME = (
    "cache",
    "callbacks",
    "custom_get_token_ids",
    "metadata",
    "rate_limiter",
    "tags",
    "verbose",
)
"""langchain-core's run-time objects of a model: set by its user, never derived from
its other settings."""


def with_settings(inner: BaseChatModel, settings: dict[str, Any]) -> BaseChatModel:
    """Rebuild ``inner`` with constructor settings that were given to the wrapper.

    The rebuilt model keeps every setting and run-time object of ``inner``: its
    rate limiter, callbacks, tags, metadata and cache, and the objects its own
    class takes (ChatOpenAI's ``http_client``/``http_async_client``), shared,
    not copied. Only what its validators derive from the settings (SDK clients
    built from ``base_url``, ``timeout``..., the model's profile) is built anew.
    """
    fields = type(inner).model_fields
    names = set(fields) | {f.alias for f in fields.values() if f.alias}
    unknown = sorted(k for k in settings if k not in names)
    if unknown:
        raise ValueError(
            f"RecoveringChatModel does not know the setting(s) {unknown} and the inner model "
            f"{type(inner).__name__} has no such field; set them on the inner model, "
            "or check the spelling"
        )
    given = [name for name in inner.model_fields_set if name in fields and name not in settings]
    current = {name: getattr(inner, name) for name in given if not fields[name].exclude}
    objects = {name: getattr(inner, name) for name in given if fields[name].exclude}
    runtime = {name: value for name, value in objects.items() if name in _RUNTIME}
    rebuilt = type(inner)(**{**current, **runtime, **settings})
    # the class's own excluded fields: kept, unless its validators set them (clients)
    own = {
        name: value
        for name, value in objects.items()
        if name not in _RUNTIME and name not in rebuilt.model_fields_set
    }
    if own:
        rebuilt = type(inner)(**{**current, **runtime, **own, **settings})
    return rebuilt


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
