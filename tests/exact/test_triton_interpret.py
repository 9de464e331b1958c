"""The CUDA exact kernels (Triton) checked on CPU by Triton's interpreter
(tests/exact/scripts/triton_interpret.py)."""

from __future__ import annotations

import pytest


@pytest.mark.slow  # the interpreter: ~20 s on 2 cores
def test_triton_kernels_are_row_invariant_under_the_interpreter(interpreted_ok) -> None:
    interpreted_ok("tests/exact/scripts/triton_interpret.py")
