"""Which requests may think silently before their first chunk (pure, no I/O).

A reasoning model can stay silent for minutes while it reasons (OpenAI's
reasoning models on Chat Completions send nothing until the answer begins), so
its stream gets the longer ``reasoning_stream_idle_timeout`` instead of being
taken for a stall, cut, and asked again at the price of the reasoning each time.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from langchain_core.language_models import BaseChatModel

from awaken_langchain.request import model_settings

_SETTINGS = ("reasoning_effort", "reasoning", "thinking")
"""The settings that turn reasoning on or off (OpenAI, Responses, Anthropic, Ollama)."""
_NAME_PREFIXES = ("o1", "o3", "o4", "gpt-5", "gpt-oss", "qwq", "magistral")
_NAME_WORDS = frozenset(("o1", "o3", "o4", "r1"))
_NAME_PARTS = ("reasoner", "reasoning", "thinking")
_WORD_BREAKS = re.compile(r"[-_:.@]")


def reasons(model: BaseChatModel, kwargs: Mapping[str, Any]) -> bool:
    """Whether a request to ``model`` with the call's ``kwargs`` may reason before it answers.

    The first that knows decides: a reasoning setting of the call, then of the
    model (``reasoning_effort``, ``reasoning``, ``thinking``, also inside
    ``model_kwargs``: on, or off with ``"none"`` or ``{"type": "disabled"}``);
    the model's LangChain profile (``reasoning_output``); its name, for a model
    LangChain has no profile entry for (a model served behind another base URL).
    """
    settings = model_settings(model)
    extra = settings.get("model_kwargs")
    for source in (kwargs, settings, extra if isinstance(extra, Mapping) else {}):
        for name in _SETTINGS:
            asked = _asked(source.get(name))
            if asked is not None:
                return asked
    profile = getattr(model, "profile", None)
    if isinstance(profile, Mapping) and profile.get("reasoning_output") is not None:
        return bool(profile["reasoning_output"])
    return _reasoning_name(str(model._get_ls_params().get("ls_model_name") or ""))


def _asked(value: Any) -> bool | None:
    """Whether a reasoning setting turns reasoning on (``None``: it says nothing)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return value.strip().lower() != "none" if value.strip() else None
    if isinstance(value, Mapping):
        if not value:
            return None
        effort = value.get("effort")
        off = isinstance(effort, str) and effort.strip().lower() == "none"
        return not (off or value.get("type") == "disabled")
    return bool(value) or None


def _reasoning_name(name: str) -> bool:
    """Whether a model name belongs to a family known to reason by default."""
    name = name.lower().rsplit("/", 1)[-1]  # "openai/gpt-oss-120b" as routers spell it
    return (
        name.startswith(_NAME_PREFIXES)
        or any(word in _NAME_WORDS for word in _WORD_BREAKS.split(name))
        or any(part in name for part in _NAME_PARTS)
    )
