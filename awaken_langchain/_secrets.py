"""Masking the secrets a connection URL carries, before any text leaves the library.

A store's URL may hold a password in its user part (``redis://:pw@host``,
``unix://user:pw@/path``) or in its query (``?password=pw``, redis-py reads
``password``, ``ssl_password`` and any other keyword there). Every message that
may name a URL (a store's own description of where it is, a warning, its log
record and its event payload) goes through `redact` first.
"""

from __future__ import annotations

import re

__all__ = ["MASK", "redact"]

MASK = "***"
"""What a secret is replaced with."""

_USERINFO = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/?#@:]*:)[^\s/?#]*@")
"""A URL's ``user:password@`` part (the password runs to the last ``@`` of the netloc,
as `urllib.parse.urlsplit` reads it)."""

_SECRET_PARAMETER = re.compile(
    r"(?P<head>[?&;][^\s=&#;]*(?:pass|pwd|secret|token|api[_-]?key|credential)[^\s=&#;]*=)"
    r"[^\s&#;]*",
    re.IGNORECASE,
)
"""A query parameter whose name says it holds a secret, and its value."""


def redact(text: str) -> str:
    """``text`` with the password of every URL in it, and every secret query value, masked."""
    if "://" not in text and "=" not in text:
        return text
    text = _USERINFO.sub(lambda m: f"{m['head']}{MASK}@", text)
    return _SECRET_PARAMETER.sub(lambda m: f"{m['head']}{MASK}", text)
