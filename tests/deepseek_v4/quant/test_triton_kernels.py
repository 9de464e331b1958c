"""The Triton quantisers on CPU, in Triton's interpreter: FP4 bit for bit, FP8 scales (the
interpreter's fp8 cast is not the GPU's; bench/gpu/qat_check.py checks the codes on a GPU)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import types
from dataclasses import replace
from pathlib import Path

import pytest

from graft.errors import ConfigError
from graft_deepseek_v4.quant.kernels import select_kernels

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "triton_interpreted.py"


def test_triton_kernels_match_the_reference_in_the_interpreter(requires_triton: None) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                            env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [row["case"] for row in rows] == ["rows 1x128", "kv 1x64", "tiles 128x128", "fp4 1x32"]
    for row in rows:
        assert all(value for key, value in row.items() if key != "case"), row


def test_kernel_choice_on_cpu() -> None:
    import torch

    assert select_kernels("auto", torch.device("cpu")).name == "torch"
    assert select_kernels("torch", torch.device("cpu")).name == "torch"
    with pytest.raises(ConfigError, match="qat_kernel=triton cannot run here: the model is on "
                                          "cpu, not a CUDA GPU"):
        select_kernels("triton", torch.device("cpu"))


@pytest.fixture
def cuda_gpu(monkeypatch):
    """A CUDA GPU of a given compute capability, mocked (there is none here), Triton importable;
    the Triton kernels' module is not imported (it compiles nothing, but needs real Triton)."""
    import torch

    from graft_deepseek_v4.quant import kernels

    def gpu(capability: tuple[int, int], name: str) -> torch.device:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
        if importlib.util.find_spec("triton") is None:
            monkeypatch.setitem(sys.modules, "triton", types.ModuleType("triton"))
        monkeypatch.setattr(kernels, "triton_kernels",
                            lambda: replace(kernels.torch_kernels(), name="triton"))
        return torch.device("cuda", 0)

    return gpu


@pytest.mark.parametrize(("capability", "name"), [((9, 0), "NVIDIA H200"),
                                                   ((8, 9), "NVIDIA L40S")])
def test_auto_picks_triton_from_sm89_on(cuda_gpu, capability, name: str) -> None:
    device = cuda_gpu(capability, name)
    assert select_kernels("auto", device).name == "triton"
    assert select_kernels("triton", device).name == "triton"
    assert select_kernels("torch", device).name == "torch"


@pytest.mark.parametrize(("capability", "name"), [((8, 0), "NVIDIA A100-SXM4-80GB"),
                                                   ((8, 6), "NVIDIA A10"), ((7, 0), "Tesla V100")])
def test_auto_picks_pytorch_below_sm89_where_triton_has_no_fp8(cuda_gpu, capability,
                                                               name: str) -> None:
    device = cuda_gpu(capability, name)
    assert select_kernels("auto", device).name == "torch"
    sm = f"SM{capability[0]}{capability[1]}"
    with pytest.raises(ConfigError, match=rf"qat_kernel=triton cannot run here: the GPU "
                                          rf"\({name}\) is {sm}; .*tl.float8e4nv.*from SM89"):
        select_kernels("triton", device)
