"""The sync and async drivers of RecoveringChatModel stay twins.

Each async method of the driver must read like its sync twin once the
async-only syntax is taken away (``await``, ``async for``, ``async def``) and
the twin names are mapped (``_arun`` to ``_run``, ``aput`` to ``put``...). A
change made to one driver and not the other fails here.
"""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest

from awaken_langchain.model import RecoveringChatModel

TWINS = [
    ("_run", "_arun"),
    ("_settle", "_asettle"),
    ("_open", "_aopen"),
    ("_carry_out", "_acarry_out"),
    ("_store_step", "_astore_step"),
    ("_generate", "_agenerate"),
    ("_cancel_background", "_acancel_background"),
]

RENAMES = {
    "_arun": "_run",
    "_asettle": "_settle",
    "_aopen": "_open",
    "_acarry_out": "_carry_out",
    "_astore_step": "_store_step",
    "_ainner_chunks": "_inner_chunks",
    "_agenerate": "_generate",
    "_ahand_over": "_hand_over",
    "_acancel_background": "_cancel_background",
    "acancel": "cancel",
    "aend_tap": "end_tap",
    "askip_seen": "skip_seen",
    "aput": "put",
    "adelete": "delete",
    "aclaim": "claim",
    "aget": "get",
    "areport": "report",
    "async_sleep": "sleep",
    "await_": "wait",
    "AsyncIterator": "Iterator",
    "AsyncCallbackManagerForLLMRun": "CallbackManagerForLLMRun",
}


class _Desugar(ast.NodeTransformer):
    """Turns async syntax into its sync shape and maps twin names."""

    def visit_Await(self, node: ast.Await) -> ast.AST:
        return self.visit(node.value)

    def visit_AsyncFor(self, node: ast.AsyncFor) -> ast.AST:
        return self.visit(
            ast.For(
                target=node.target,
                iter=node.iter,
                body=node.body,
                orelse=node.orelse,
                type_comment=None,
            )
        )

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> ast.AST:
        return self.visit(
            ast.FunctionDef(
                name=node.name,
                args=node.args,
                body=node.body,
                decorator_list=node.decorator_list,
                returns=node.returns,
                type_comment=None,
                type_params=[],
            )
        )

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.Name(id=RENAMES.get(node.id, node.id), ctx=node.ctx)

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        value = self.visit(node.value)
        return ast.Attribute(value=value, attr=RENAMES.get(node.attr, node.attr), ctx=node.ctx)


def _yield_from(body: list[ast.stmt]) -> list[ast.stmt]:
    """``for x in it: yield x`` (what async code must write) reads as ``yield from it``."""
    out: list[ast.stmt] = []
    for statement in body:
        if (
            isinstance(statement, ast.For)
            and len(statement.body) == 1
            and isinstance(statement.body[0], ast.Expr)
            and isinstance(statement.body[0].value, ast.Yield)
            and isinstance(statement.target, ast.Name)
            and isinstance(statement.body[0].value.value, ast.Name)
            and statement.body[0].value.value.id == statement.target.id
            and not statement.orelse
        ):
            out.append(ast.Expr(ast.YieldFrom(statement.iter)))
            continue
        for field in ("body", "orelse", "finalbody"):
            inner = getattr(statement, field, None)
            if isinstance(inner, list):
                setattr(statement, field, _yield_from(inner))
        if isinstance(statement, ast.Try):
            for handler in statement.handlers:
                handler.body = _yield_from(handler.body)
        out.append(statement)
    return out


def _shape(name: str) -> str:
    source = textwrap.dedent(inspect.getsource(getattr(RecoveringChatModel, name)))
    tree = _Desugar().visit(ast.parse(source))
    function = tree.body[0]
    function.name = RENAMES.get(function.name, function.name)
    function.body = _yield_from(function.body)
    first = function.body[0] if function.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):  # the docstring
        function.body = function.body[1:]
    return ast.dump(ast.fix_missing_locations(tree), include_attributes=False)


@pytest.mark.parametrize(("sync", "async_"), TWINS, ids=[s for s, _ in TWINS])
def test_the_async_driver_is_the_sync_driver_with_awaits(sync: str, async_: str) -> None:
    assert _shape(async_) == _shape(sync)
