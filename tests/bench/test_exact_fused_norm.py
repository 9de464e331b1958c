"""bench/exact_fused_norm.py's prototype RMSNorm kernel under Triton's interpreter on CPU: close to
transformers' formula, and a row's output the same bits alone and in a batch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "exact_fused_norm.py"


def test_the_fused_norm_is_close_and_row_invariant_under_the_interpreter() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--interpret"], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert done.returncode == 0 and done.stdout.strip().endswith("OK"), done.stderr[-3000:]
