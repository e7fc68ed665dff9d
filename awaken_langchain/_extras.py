"""Optional dependencies of the command line, and the error a command reports."""

from __future__ import annotations

import importlib
import unicodedata
from types import ModuleType


class CommandError(Exception):
    """A command cannot go on; the message says what to change.

    Attributes:
        exit_code: The process exit status the command line returns.
    """

    def __init__(self, message: str, *, exit_code: int = 2) -> None:
        self.exit_code = exit_code
        super().__init__(message)


PROVIDER_EXTRAS: dict[str, tuple[str, str]] = {
    "openai": ("langchain_openai", "openai"),
    "anthropic": ("langchain_anthropic", "anthropic"),
}
"""Provider name -> (integration module, extra that installs it)."""


def require(module: str, extra: str, *, purpose: str) -> ModuleType:
    """Import an optional module, or explain which extra installs it.

    Args:
        module: The module to import.
        extra: The ``awaken-langchain`` extra that installs it.
        purpose: What needs the module, for the message.

    Raises:
        CommandError: If the module is not installed.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise CommandError(
            f"{purpose} needs the Python package {module!r}, which is not installed "
            f"({exc}); install it with: pip install 'awaken-langchain[{extra}]'"
        ) from exc


def require_agents(purpose: str) -> None:
    """Check that LangGraph, its SQLite checkpointer and ``langchain`` are installed."""
    for module in ("langchain.agents", "langgraph", "langgraph.checkpoint.sqlite"):
        require(module, "agents", purpose=purpose)


def require_provider(provider: str, purpose: str) -> ModuleType:
    """Import the LangChain integration of ``provider`` (``openai`` or ``anthropic``)."""
    module, extra = PROVIDER_EXTRAS[provider]
    return require(module, extra, purpose=purpose)


INSTALL_CLI = "pip install 'awaken-langchain[cli]'"
"""How to install what the command line needs (``rich``)."""

_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
"""Control, format (bidi overrides...), lone surrogate and line/paragraph separator characters."""


def visible(text: str, *, keep: str = "") -> str:
    r"""Return ``text`` as a terminal may show it: every hidden character escaped.

    Control characters (``\x1b`` that would clear the screen), format characters
    (bidi overrides that reorder what is shown), lone surrogates and line
    separators are written as Python escapes (``\x1b``, ``\u202e``), so that
    stored text is shown literally and can never act on the terminal.

    Args:
        text: The text to show.
        keep: Characters shown as themselves (``"\n\t"`` for multi-line text).
    """
    if text.isprintable():
        return text  # the common case: nothing to escape
    return "".join(
        char.encode("unicode_escape").decode("ascii")
        if char not in keep and unicodedata.category(char) in _HIDDEN_CATEGORIES
        else char
        for char in text
    )
