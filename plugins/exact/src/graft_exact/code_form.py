"""`same_code`: whether two functions are the same code, line for line.

transformers copies a family's functions into each modeling module ("Copied from" / modular):
Qwen3's RMSNorm forward and rotary embedding are Llama's, as separate function objects. The
exact kernels replace such code only where it is Llama's form, compared by the compiled code.
"""

from __future__ import annotations

from typing import Any


def same_code(function: Any, reference: Any) -> bool:
    """Whether ``function`` compiles to ``reference``'s bytecode with the same names, constants
    (its docstring included) and variables; False when either is not a Python function."""
    keys = []
    for candidate in (function, reference):
        code = getattr(candidate, "__code__", None)
        if code is None:
            return False
        keys.append((code.co_code, code.co_names, code.co_consts, code.co_varnames))
    return keys[0] == keys[1]
