"""The calculator evaluates arithmetic only, exactly, and within bounds."""

from __future__ import annotations

from fractions import Fraction

import pytest
from graft_calculator import NotArithmetic, evaluate
from graft_calculator.arithmetic import render


@pytest.mark.parametrize("expression, value", [
    ("2+3*4", 14), ("(2+3)*4", 20), ("7/2", Fraction(7, 2)), ("7//2", 3), ("-7%3", 2),
    ("2**10", 1024), ("-(1.5+0.25)", Fraction(-7, 4)), (" 12 * 7 ", 84)])
def test_arithmetic_is_evaluated_exactly(expression: str, value: Fraction) -> None:
    assert evaluate(expression) == value


@pytest.mark.parametrize("expression, reason", [
    ("__import__('os').system('true')", "Call is not arithmetic"),
    ("x+1", "Name is not arithmetic"), ("(1).real", "Attribute is not arithmetic"),
    ("'a'*3", "Constant is not arithmetic"), ("1/0", "division by zero"),
    ("9**9**9", "exponents are whole numbers up to"), ("10**11*10**11", "a value beyond"),
    ("2+", "does not parse"), ("", "0 characters"), ("1" * 201, "201 characters"),
    ("True+1", "Constant is not arithmetic")])
def test_anything_else_is_refused(expression: str, reason: str) -> None:
    with pytest.raises(NotArithmetic, match=reason):
        evaluate(expression)


def test_values_are_rendered_as_integers_or_short_decimals() -> None:
    assert [render(Fraction(v)) for v in ("84", "-7/4", "1/3", "2.50")] == [
        "84", "-1.75", "0.333333", "2.5"]
