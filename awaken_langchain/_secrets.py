"""Masking the secrets a connection string carries, before any text leaves the library.

A store's connection string may hold a password in a URL's user part
(``redis://:pw@host``, ``unix://user:pw@/path``, ``postgresql://app:pw@db/app``),
in a URL's query (``?password=pw``; redis-py reads ``password``, ``ssl_password``
and any other keyword there, libpq ``password`` and ``sslpassword``) or in a
libpq keyword string (``host=db password=pw``, also quoted: ``password='p w'``).
Every message that may name a connection string (a store's own description of
where it is, a warning, its log record, its event payload, what the
``checkpoints`` command prints) goes through `redact` first.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

__all__ = ["MASK", "redact"]

MASK = "***"
"""What a secret is replaced with."""

_SHORTEST_QUOTED = 4
"""A known password shorter than this is masked only where it stands as a password
(in a URL's user part or as a parameter's value), not wherever it appears in a text."""

_USERINFO = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/?#@:]*:)[^\s/?#]*@")
"""A URL's ``user:password@`` part (the password runs to the last ``@`` of the netloc,
as `urllib.parse.urlsplit` reads it)."""

_SECRET_PARAMETER = re.compile(
    r"(?P<head>(?:(?<=[?&;\s(,])|^)"
    r"[^\s=&#;?(,]*(?:pass|pwd|secret|token|api[_-]?key|credential)[^\s=&#;]*\s*=\s*)"
    r"(?P<value>'(?:[^'\\]|\\.)*'|[^\s&#;]*)",
    re.IGNORECASE,
)
"""A parameter whose name says it holds a secret, and its value: in a URL's query
(``?password=pw``) or in a libpq keyword string (``password = 'p w'``)."""


def _secrets_of(spec: str) -> list[str]:
    """The secret values ``spec`` holds, as written and as a library may quote them."""
    found: list[str] = []
    _, sep, rest = spec.partition("://")
    if sep:  # also a malformed URL's user part, which `_USERINFO` may not match
        cut = min((i for i in (rest.find("?"), rest.find("#")) if i != -1), default=len(rest))
        userinfo, at, _ = rest[:cut].rpartition("@")
        if at and ":" in userinfo:
            found.append(userinfo.partition(":")[2])
    found += [m["value"] for m in _SECRET_PARAMETER.finditer(spec)]
    variants = {form for value in found for form in (value, value.strip("'"), unquote(value))}
    return sorted((v for v in variants if len(v) >= _SHORTEST_QUOTED), key=len, reverse=True)


def redact(text: str, *, spec: str | None = None) -> str:
    """``text`` with every password and secret parameter in it masked as ``***``.

    Args:
        text: A message that may quote connection strings.
        spec: The connection string the message is about. Its secrets are also
            masked wherever they appear in ``text`` (a driver's error may quote
            a password outside any URL, or percent-decoded).
    """
    if spec:
        for secret in _secrets_of(spec):
            text = text.replace(secret, MASK)
    if "://" not in text and "=" not in text:
        return text
    text = _USERINFO.sub(lambda m: f"{m['head']}{MASK}@", text)
    return _SECRET_PARAMETER.sub(lambda m: f"{m['head']}{MASK}", text)
