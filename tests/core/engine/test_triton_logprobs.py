"""The CUDA log-prob kernels (`graft.engine.triton_logprobs`) checked on CPU by Triton's
interpreter (tests/scripts/logprobs_triton_interpret.py, in its own process: the interpreter is
chosen when the kernels are defined); on the GPU by bench/gpu/head_grads_check.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")


def test_logprob_kernels_match_the_eager_math_under_the_interpreter() -> None:
    script = Path(__file__).resolve().parents[2] / "scripts" / "logprobs_triton_interpret.py"
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert done.returncode == 0 and done.stdout.strip().endswith("OK"), done.stderr[-3000:]
