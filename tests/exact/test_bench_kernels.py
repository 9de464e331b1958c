"""bench/exact_kernels.py's CPU smoke run (``--tiny``): a row for every kernel, the exact ones
row-invariant, so the GPU call that writes the kernel table does not fail on a typo."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_the_tiny_run_has_every_kernel_and_the_exact_rows_are_invariant(tmp_path: Path) -> None:
    out = tmp_path / "kernels.json"
    done = subprocess.run([sys.executable, str(BENCH / "exact_kernels.py"), "--tiny", "--repeats",
                           "2", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert {r["kernel"] for r in rows} == {"matmul", "rmsnorm", "silu", "logsumexp",
                                           "attention decode", "attention packed row"}
    assert all(r["exact_rows_invariant"] for r in rows)
