"""`graft_exact.code_form.same_code`: copies of a function match, another body does not."""

from __future__ import annotations

from graft_exact.code_form import same_code


def _double(x):
    return x * 2


def _double_copy(x):
    return x * 2


def _triple(x):
    return x * 3


def _double_renamed(y):
    return y * 2


def test_a_copy_is_the_same_code_and_another_body_is_not() -> None:
    assert same_code(_double_copy, _double)
    assert not same_code(_triple, _double)  # another constant
    assert not same_code(_double_renamed, _double)  # another variable
    assert not same_code(None, _double) and not same_code(len, _double)  # no Python code
