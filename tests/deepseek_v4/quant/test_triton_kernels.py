"""The Triton quantisers on CPU, in Triton's interpreter: FP4 bit for bit, FP8 scales (the
interpreter's fp8 cast is not the GPU's; bench/gpu/qat_check.py checks the codes on a GPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from graft.errors import ConfigError
from graft_deepseek_v4.quant.kernels import select_kernels

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "triton_interpreted.py"


def test_triton_kernels_match_the_reference_in_the_interpreter() -> None:
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                            env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [row["case"] for row in rows] == ["rows 1x128", "kv 1x64", "tiles 128x128", "fp4 1x32"]
    for row in rows:
        assert all(value for key, value in row.items() if key != "case"), row


def test_kernel_choice() -> None:
    import torch

    assert select_kernels("auto", torch.device("cpu")).name == "torch"
    assert select_kernels("torch", torch.device("cpu")).name == "torch"
    with pytest.raises(ConfigError, match="qat_kernel=triton needs a CUDA device"):
        select_kernels("triton", torch.device("cpu"))
