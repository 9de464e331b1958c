"""The CUDA exact kernels (Triton) checked on CPU by Triton's interpreter
(tests/scripts/exact_triton_interpret.py, in its own process: the interpreter is chosen when
the kernels are defined)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")


@pytest.mark.slow  # the interpreter: ~20 s on 2 cores
def test_triton_kernels_are_row_invariant_under_the_interpreter() -> None:
    script = Path(__file__).resolve().parents[3] / "scripts" / "exact_triton_interpret.py"
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert done.returncode == 0 and done.stdout.strip().endswith("OK"), done.stderr[-3000:]
