"""Deterministic answers from a request's own tools and output schemas.

Pure functions behind :func:`~awaken_langchain.testing.schema_responder`: read
which tools a request offers or forces and which structured output it asks for,
in each wire format, and build a JSON value valid against a JSON schema.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from awaken_langchain.testing._scenarios import Provider

_STRING_FORMATS = {
    "date-time": "2026-01-01T00:00:00Z",
    "date": "2026-01-01",
    "time": "00:00:00Z",
    "email": "user@example.com",
    "uri": "https://example.com/",
    "url": "https://example.com/",
    "uuid": "00000000-0000-4000-8000-000000000000",
    "ipv4": "192.0.2.1",
}
_MAX_DEPTH = 16


def example_value(schema: Any, *, name: str = "value", root: Any = None, depth: int = 0) -> Any:
    """A plausible value valid against ``schema``, the same on every call.

    Every listed object property is filled (required or not); strings are
    ``"example <name>"`` (or a sample of their ``format``) fitted to the length
    bounds; integers are 3 and numbers 1.5, moved inside their bounds; arrays
    hold ``max(minItems, 1)`` items (none when ``maxItems`` is 0); ``enum`` and
    ``const`` give their first value; ``anyOf``/``oneOf`` their first non-null
    branch; ``$ref`` is resolved against the root's ``$defs``/``definitions``.

    Args:
        schema: A JSON schema (a mapping; ``True``/empty accepts anything).
        name: The property the value is for, used in strings.
        root: The root schema for ``$ref`` resolution (defaults to ``schema``).
        depth: Recursion depth (recursive schemas stop at a bounded depth).

    Returns:
        The JSON-ready value.
    """
    root = schema if root is None else root
    if not isinstance(schema, Mapping) or depth > _MAX_DEPTH:
        return f"example {name}"
    if "$ref" in schema:
        return example_value(
            _resolve(root, str(schema["$ref"])), name=name, root=root, depth=depth + 1
        )
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list) and branches:
            typed = [
                b for b in branches if not (isinstance(b, Mapping) and b.get("type") == "null")
            ]
            return example_value((typed or branches)[0], name=name, root=root, depth=depth + 1)
    if isinstance(schema.get("allOf"), list) and schema["allOf"]:
        merged: dict[str, Any] = {}
        for part in schema["allOf"]:
            merged.update(_resolve(root, str(part["$ref"])) if "$ref" in part else part)
        return example_value(merged, name=name, root=root, depth=depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
    if kind == "object":
        properties = schema.get("properties")
        if not isinstance(properties, Mapping):
            return {}
        return {
            key: example_value(sub, name=key, root=root, depth=depth + 1)
            for key, sub in properties.items()
        }
    if kind == "array":
        count = max(int(schema.get("minItems", 1)), 1)
        if schema.get("maxItems") == 0:
            count = 0
        items = schema.get("items", {})
        return [example_value(items, name=name, root=root, depth=depth + 1) for _ in range(count)]
    if kind == "integer":
        return int(_bounded(schema, 3, 1))
    if kind == "number":
        return _bounded(schema, 1.5, 0.5)
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return _fitted_string(schema, name)


def _resolve(root: Any, ref: str) -> Any:
    node = root
    for part in ref.removeprefix("#/").split("/") if ref.startswith("#/") else []:
        node = node.get(part, {}) if isinstance(node, Mapping) else {}
    return node


def _bounded(schema: Mapping[str, Any], value: float, step: float) -> float:
    low, high = schema.get("minimum"), schema.get("maximum")
    if isinstance(schema.get("exclusiveMinimum"), int | float):
        low = schema["exclusiveMinimum"] + step
    if isinstance(schema.get("exclusiveMaximum"), int | float):
        high = schema["exclusiveMaximum"] - step
    if isinstance(low, int | float) and value < low:
        value = low
    if isinstance(high, int | float) and value > high:
        value = high
    return value


def _fitted_string(schema: Mapping[str, Any], name: str) -> str:
    text = _STRING_FORMATS.get(str(schema.get("format")), f"example {name}")
    maximum, minimum = schema.get("maxLength"), schema.get("minLength")
    if isinstance(maximum, int):
        text = text[:maximum]
    if isinstance(minimum, int) and len(text) < minimum:
        text += "x" * (minimum - len(text))
    return text


# -- reading a request ------------------------------------------------------------------


@dataclass(frozen=True)
class OfferedTool:
    """A tool a request offers: its name and its argument schema."""

    name: str
    parameters: Mapping[str, Any]


def offered_tools(provider: Provider, body: Mapping[str, Any]) -> list[OfferedTool]:
    """The function tools ``body`` offers, in order (server-side tools are left out)."""
    tools: list[OfferedTool] = []
    for tool in body.get("tools") or []:
        if not isinstance(tool, Mapping):
            continue
        if provider == "openai":
            function = tool.get("function") if tool.get("type") == "function" else None
            if isinstance(function, Mapping):
                tools.append(OfferedTool(str(function["name"]), function.get("parameters") or {}))
        elif provider == "openai-responses":
            if tool.get("type") == "function":
                tools.append(OfferedTool(str(tool["name"]), tool.get("parameters") or {}))
        elif tool.get("type", "custom") == "custom" and "input_schema" in tool:
            tools.append(OfferedTool(str(tool["name"]), tool.get("input_schema") or {}))
    return tools


def tool_choice(provider: Provider, body: Mapping[str, Any]) -> tuple[str, str | None]:
    """How the request lets the model use tools.

    Returns:
        ``("named", name)``, ``("any", None)`` (``"required"``, Anthropic
        ``{"type": "any"}``), ``("none", None)`` or ``("auto", None)``.
    """
    choice = body.get("tool_choice")
    if choice == "required" or (isinstance(choice, Mapping) and choice.get("type") == "any"):
        return "any", None
    if choice == "none" or (isinstance(choice, Mapping) and choice.get("type") == "none"):
        return "none", None
    if isinstance(choice, Mapping):
        if provider == "openai" and isinstance(choice.get("function"), Mapping):
            return "named", str(choice["function"].get("name"))
        if choice.get("type") in ("function", "tool") and "name" in choice:
            return "named", str(choice["name"])
    return "auto", None


def mentioned_tool(tools: Sequence[OfferedTool], prompt: str) -> OfferedTool:
    """The tool with the longest name the prompt mentions, else the first tool."""
    named = [tool for tool in tools if tool.name in prompt]
    return max(named, key=lambda tool: len(tool.name)) if named else tools[0]


def answer_format(provider: Provider, body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The structured-output format the request asks for, as ``{"type", "schema"?}``.

    Chat Completions ``response_format``, Responses ``text.format`` and
    Anthropic ``output_config.format``/``output_format``, each ``json_schema``
    or ``json_object``; ``None`` for free text.
    """
    if provider == "openai":
        fmt = body.get("response_format")
        if isinstance(fmt, Mapping) and fmt.get("type") == "json_schema":
            inner = fmt.get("json_schema") or {}
            return {"type": "json_schema", "schema": inner.get("schema") or {}}
    elif provider == "openai-responses":
        text = body.get("text")
        fmt = text.get("format") if isinstance(text, Mapping) else None
    else:
        config = body.get("output_config")
        fmt = config.get("format") if isinstance(config, Mapping) else body.get("output_format")
    if isinstance(fmt, Mapping) and fmt.get("type") in ("json_schema", "json_object"):
        return {"type": fmt["type"], "schema": fmt.get("schema") or {}}
    return None


def json_object_for(prompt: str) -> dict[str, Any]:
    """A JSON object for JSON mode (no schema): the keys the prompt quotes, else ``answer``."""
    keys = list(dict.fromkeys(re.findall(r"['\"`]([A-Za-z_][A-Za-z0-9_]*)['\"`]", prompt)))
    return {key: f"example {key}" for key in keys} or {"answer": prompt}
