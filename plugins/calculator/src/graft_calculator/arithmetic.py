"""Safe arithmetic: an expression is parsed (`ast`) and only numbers, ``+ - * / // %``, ``**``
with a small exponent and parentheses are evaluated; never ``eval``.

Results stay small (`MAX_MAGNITUDE`), so a tool call cannot make the environment compute for
long or print a huge number.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from fractions import Fraction

MAX_LENGTH = 200  # characters of one expression
MAX_EXPONENT = 16
MAX_MAGNITUDE = 10 ** 12

BINARY: dict[type, Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
}


class NotArithmetic(ValueError):
    """The expression is not plain arithmetic, or its value is undefined or too large."""


def evaluate(expression: str) -> Fraction:
    """The exact value of ``expression`` (integers, decimals, ``+ - * / // % **``,
    parentheses); `NotArithmetic` for anything else."""
    text = expression.strip()
    if not text or len(text) > MAX_LENGTH:
        raise NotArithmetic(f"an expression of {len(text)} characters (1 to {MAX_LENGTH})")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise NotArithmetic(f"{text!r} does not parse: {exc.msg}") from exc
    return _value(tree.body)


def _value(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _bounded(Fraction(str(node.value)))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _value(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        return _power(_value(node.left), _value(node.right))
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
        left, right = _value(node.left), _value(node.right)
        if right == 0 and not isinstance(node.op, ast.Add | ast.Sub | ast.Mult):
            raise NotArithmetic("division by zero")
        return _bounded(BINARY[type(node.op)](left, right))
    raise NotArithmetic(f"{type(node).__name__} is not arithmetic (numbers, + - * / // % **)")


def _power(base: Fraction, exponent: Fraction) -> Fraction:
    if exponent.denominator != 1 or abs(exponent) > MAX_EXPONENT:
        raise NotArithmetic(f"exponents are whole numbers up to {MAX_EXPONENT}")
    if base == 0 and exponent < 0:
        raise NotArithmetic("division by zero")
    return _bounded(base ** int(exponent))


def _bounded(value: Fraction) -> Fraction:
    if abs(value) > MAX_MAGNITUDE:
        raise NotArithmetic(f"a value beyond {MAX_MAGNITUDE:.0e}")
    return value


def render(value: Fraction) -> str:
    """An integer as itself, anything else as a decimal of up to 6 places (trailing zeros cut)."""
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.6f}".rstrip("0").rstrip(".")
