"""bench/exact_split_matmul.py's prototype product (``K`` summed in fixed chunks, in one program
per tile or split over programs and added in order) under Triton's interpreter on CPU: the two
ways give the same bits at every batch size, and the rows of a larger batch's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "exact_split_matmul.py"


def test_split_and_whole_sums_are_the_same_bits_under_the_interpreter() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--interpret"], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert done.returncode == 0 and done.stdout.strip().endswith("OK"), done.stderr[-3000:]
