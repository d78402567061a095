"""Exact evaluation of expressions and typed option values (``Fraction``, never floats).

Evaluation is iterative (an explicit stack), so a deeply nested expression cannot overflow
Python's recursion limit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from trainverify_dsl.parse import ast
from trainverify_dsl.plan import messages
from trainverify_dsl.plan.model import OptionValue, Origin
from trainverify_dsl.plan.patterns import pattern_of
from trainverify_dsl.report import codes_plan as codes
from trainverify_dsl.report.diagnostics import Collector

#: Names that have values once the header is read, for "did you mean" on unknown names.
VALUE_NAMES = ("microbatches", "batch", "seq")

#: The largest numerator or denominator (in bits, about 3000 decimal digits) a computed value
#: may have. Literals stay far below it (at most 1000 digits, exponent at most 1000); products
#: can grow without bound, and Python refuses to print integers beyond 4300 digits.
MAX_VALUE_BITS = 10_000


_ARITHMETIC = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a / b,
}


@dataclass(slots=True)
class Evaluator:
    """Evaluates expressions against the known names; failures become diagnostics."""

    collector: Collector
    names: dict[str, Fraction] = field(default_factory=dict)

    def number(self, node: ast.Expr, trail_origin: Origin) -> Fraction | None:
        """The exact value, or ``None`` after reporting why it has none."""
        if type(node) is ast.Num:  # most values are a literal
            return node.value
        values: list[Fraction | None] = []
        todo: list[tuple[ast.Expr, bool]] = [(node, False)]
        while todo:
            expr, ready = todo.pop()
            if isinstance(expr, ast.BinOp | ast.Neg) and not ready:
                todo.append((expr, True))
                children = (expr.left, expr.right) if isinstance(expr, ast.BinOp) else (
                    expr.operand,)
                todo.extend((child, False) for child in reversed(children))
                continue
            values.append(self._apply(expr, values, trail_origin))
        return values[-1] if values else None

    def _apply(self, expr: ast.Expr, values: list[Fraction | None],
               origin: Origin) -> Fraction | None:
        match expr:
            case ast.Num(value=value):
                return value
            case ast.NameRef(name=name):
                return self._name(name, Origin(expr.span, origin.trail))
            case ast.Neg():
                operand = values.pop()
                return None if operand is None else -operand
            case ast.BinOp(op=op):
                right, left = values.pop(), values.pop()
                if left is None or right is None:
                    return None
                return self._binop(op, left, right, Origin(expr.span, origin.trail))
        return None

    def _name(self, name: str, origin: Origin) -> Fraction | None:
        if name in self.names:
            return self.names[name]
        known = sorted(set(self.names) | set(VALUE_NAMES))
        self.collector.add(messages.unknown_name(codes.UNKNOWN_NAME, "name", name, known,
                                                 origin))
        return None

    def _binop(self, op: str, left: Fraction, right: Fraction,
               origin: Origin) -> Fraction | None:
        if op == "/" and right == 0:
            self.collector.add(messages.at(
                codes.DIVISION_BY_ZERO, f"division by zero: {left} / 0", origin,
                help="check the divisor; mesh axis sizes and counts are names with values"))
            return None
        result = _ARITHMETIC[op](left, right)
        if max(result.numerator.bit_length(), result.denominator.bit_length()) > MAX_VALUE_BITS:
            self.collector.add(messages.at(
                codes.INVALID_NUMBER, "the value of this expression is too large (more than "
                "3000 digits)", origin, help="plan quantities are far smaller; check the "
                "exponents and products"))
            return None
        return result

    def integer(self, node: ast.Expr, origin: Origin, what: str,
                minimum: int = 0) -> int | None:
        """A whole number ``>= minimum``; otherwise reported as ``INVALID_NUMBER``."""
        value = self.number(node, origin)
        if value is None:
            return None
        if value.denominator != 1 or value < minimum:
            need = ("a non-negative whole number" if minimum == 0
                    else f"a whole number of at least {minimum}")
            self.collector.add(messages.at(
                codes.INVALID_NUMBER, f"{what} must be {need}, got {value}", origin))
            return None
        return int(value)

    def word(self, node: ast.Value) -> str | None:
        """A bare word value (``avg``, ``llama3_8b``), or ``None`` if not a word."""
        match node:
            case ast.NameRef(name=name) | ast.Path(segments=(ast.Name(name=name),)):
                return name
        return None

    def option(self, node: ast.Value, origin: Origin) -> OptionValue | None:
        """A free-form option value: number, known name's value, word, path, or tuple."""
        match node:
            case ast.TupleValue(items=items):
                parts = tuple(self.option(item, origin) for item in items)
                return None if any(p is None for p in parts) else parts
            case ast.Path():
                word = self.word(node)
                if word is not None and word not in self.names:
                    return word
                if word is None:
                    return str(pattern_of(node))
                return self.names[word]
            case ast.NameRef(name=name) if name not in self.names:
                return name
        return self.number(node, origin)
