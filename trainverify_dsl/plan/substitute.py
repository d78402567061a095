"""Template-parameter and loop-variable substitution on AST statements.

An environment maps a parameter or loop variable to a *closed* value (already substituted in
the caller's environment), so substitution never recurses through environments. A path
argument replaces the parameter where it heads a path, a name argument where a mesh axis
name is expected, a number (expression) where a value is expected; any other use is a
``TEMPLATE_ARGUMENT_KIND`` problem, reported through ``KindError``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from trainverify_dsl.parse import ast
from trainverify_dsl.report.span import Span

Env = dict[str, ast.Value]


class KindError(Exception):
    """A parameter bound to a value of the wrong kind for where it is used."""

    def __init__(self, param: str, expected: str, got: str):
        super().__init__(param, expected, got)
        self.param, self.expected, self.got = param, expected, got


def describe_value(value: ast.Value) -> str:
    match value:
        case ast.Path(segments=(ast.Name(),)) | ast.NameRef():
            return "a name"
        case ast.Path():
            return "a path"
        case ast.TupleValue():
            return "a tuple"
    return "a number"


def _bare_name(value: ast.Value) -> str | None:
    match value:
        case ast.NameRef(name=name) | ast.Path(segments=(ast.Name(name=name),)):
            return name
    return None


def path(node: ast.Path, env: Env) -> ast.Path:
    head = node.segments[0] if node.segments else None
    if not isinstance(head, ast.Name) or head.name not in env:
        return node
    bound = env[head.name]
    if isinstance(bound, ast.Path):
        return ast.Path(bound.segments + node.segments[1:], node.span)
    name = _bare_name(bound)
    if name is None:
        raise KindError(head.name, "a path", describe_value(bound))
    return ast.Path((ast.Name(name, head.span),) + node.segments[1:], node.span)


def target(node: ast.Target, env: Env) -> ast.Target:
    if isinstance(node, ast.GradRef):
        return ast.GradRef(path(node.path, env), node.span)
    return path(node, env)


def ident(node: ast.Ident, env: Env) -> ast.Ident:
    """A name where a mesh axis (or word) is expected."""
    if node.name not in env:
        return node
    name = _bare_name(env[node.name])
    if name is None:
        raise KindError(node.name, "a mesh axis name", describe_value(env[node.name]))
    return ast.Ident(name, node.span)


def expr(node: ast.Expr, env: Env) -> ast.Expr:
    match node:
        case ast.NameRef(name=name) if name in env:
            return _as_expr(name, env[name])
        case ast.BinOp(op, left, right, span):
            return ast.BinOp(op, expr(left, env), expr(right, env), span)
        case ast.Neg(operand, span):
            return ast.Neg(expr(operand, env), span)
    return node


def _as_expr(param: str, bound: ast.Value) -> ast.Expr:
    if isinstance(bound, ast.Num | ast.NameRef | ast.BinOp | ast.Neg):
        return bound
    name = _bare_name(bound)
    if name is None:
        raise KindError(param, "a value", describe_value(bound))
    return ast.NameRef(name, bound.span)


def value(node: ast.Value, env: Env) -> ast.Value:
    match node:
        case ast.Path(segments=(ast.Name(name=name),)) | ast.NameRef(name=name) if name in env:
            return env[name]
        case ast.Path():
            return path(node, env)
        case ast.TupleValue(items, span):
            return ast.TupleValue(tuple(value(item, env) for item in items), span)
    return expr(node, env)


def options(nodes: tuple[ast.Option, ...], env: Env) -> tuple[ast.Option, ...]:
    return tuple(ast.Option(o.key, value(o.value, env), o.span) for o in nodes)


def _idents(nodes: tuple[ast.Ident, ...], env: Env) -> tuple[ast.Ident, ...]:
    if not any(n.name in env for n in nodes):
        return nodes
    return tuple(ident(n, env) for n in nodes)


def _dims(nodes: tuple[ast.DimEntry, ...], env: Env) -> tuple[ast.DimEntry, ...]:
    if not any(a.name in env for d in nodes for a in d.axes):
        return nodes
    return tuple(ast.DimEntry(_idents(d.axes, env), d.span, d.order) for d in nodes)


def _placement(node: ast.Placement, env: Env) -> ast.Placement:
    op = ident(node.op, env) if node.op is not None else None
    axis = ident(node.axis, env) if node.axis is not None else None
    return replace(node, op=op, axis=axis)


def statement(stmt: Any, env: Env) -> Any:
    """``stmt`` with every parameter use substituted (leaf statements only)."""
    if not env:
        return stmt
    changes: dict[str, Any] = {}
    for name in stmt.__dataclass_fields__:
        old = getattr(stmt, name)
        if type(old) in _NO_PARAMETERS:
            continue
        new = _field(name, old, env)
        if new is not old:
            changes[name] = new
    return replace(stmt, **changes) if changes else stmt


#: Field values no parameter can occur in (``_field`` returns them unchanged).
_NO_PARAMETERS = frozenset({str, int, type(None), Span})


def _field(name: str, node: Any, env: Env) -> Any:
    match node:
        case ast.Path() | ast.GradRef():
            return target(node, env)
        case ast.Ident() if name != "name":
            return ident(node, env)
        case ast.Num() | ast.NameRef() | ast.BinOp() | ast.Neg():
            return expr(node, env)
        case tuple():
            return _tuple_field(node, env)
        case ast.OptimizerDecl():  # the body of ``on dp=1: optimizer ...``
            return statement(node, env)
    return node


def _tuple_field(items: tuple, env: Env) -> tuple:
    if not items:
        return items
    first = items[0]
    if isinstance(first, ast.Option):
        return options(items, env)
    if isinstance(first, ast.DimEntry):
        return _dims(items, env)
    if isinstance(first, ast.Placement):
        return tuple(_placement(p, env) for p in items)
    if isinstance(first, ast.Ident):
        return _idents(items, env)
    if isinstance(first, ast.Path | ast.GradRef):
        return tuple(target(t, env) for t in items)
    if isinstance(first, ast.MeshAxis):
        return tuple(replace(a, size=expr(a.size, env)) for a in items)
    if isinstance(first, ast.OnCoord):
        return tuple(replace(c, axis=ident(c.axis, env), value=expr(c.value, env))
                     for c in items)
    return items
