"""The kernel prototypes of #27 (bench/exact_*.py) under Triton's interpreter on CPU:
``exact_split_matmul.py``'s product gives the same bits summed by one program per tile or split
over programs and added in order, at every batch size and against a larger batch's rows;
``exact_fused_norm.py``'s RMSNorm is close to transformers' formula and row-invariant."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("script", ["exact_split_matmul.py", "exact_fused_norm.py"])
def test_the_prototype_passes_its_check_under_the_interpreter(interpreted_ok, script) -> None:
    interpreted_ok(f"bench/{script}", "--interpret")
