"""Expert-parallel fused tensors stream as row blocks (one ep rank's block at a time) that sinks
assemble: a tiny Qwen3-MoE split over ep with `graft.engine.expert_parallel` and a handler that
keeps its experts fused (`expert_rows_worker.py`, gloo ranks; no model plugin)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).resolve().parent / "expert_rows_worker.py"


def run_worker(out: Path, ranks: int, ep: int) -> dict:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={ranks}", str(WORKER), str(out), str(ep)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return torch.load(out / "result.pt")


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The worker on 2 ranks with ep_size 2 (efsdp 1)."""
    return run_worker(tmp_path_factory.mktemp("expert-rows"), 2, 2)


def assert_sinks_hold_the_fused_tensors(result: dict, ep: int) -> None:
    expected = {name.replace(".experts.", ".experts.fused_"): tensor
                for name, tensor in result["params"].items()}
    for label in ("hf", "rows", "whole"):  # a HF directory, a state dict, a whole-tensor sink
        got = result[label]
        assert got.keys() == expected.keys(), label
        for name, tensor in expected.items():
            assert torch.equal(got[name], tensor), (label, name)
    # Every fused tensor arrived as ep blocks of num_experts / ep rows, never whole.
    fused = {name for name in expected if ".experts.fused_" in name}
    rows = 8 // ep
    assert sorted(result["blocks"]) == sorted((name, first, rows) for name in fused
                                              for first in range(0, 8, rows))
    assert result["hf_bytes"] == result["rows_bytes"] == result["whole_bytes"]


def test_fused_experts_stream_as_row_blocks_that_sinks_assemble(two_ranks: dict) -> None:
    assert_sinks_hold_the_fused_tensors(two_ranks, ep=2)


@pytest.mark.slow
def test_row_blocks_gathered_over_efsdp_on_four_ranks(tmp_path: Path) -> None:
    assert_sinks_hold_the_fused_tensors(run_worker(tmp_path, 4, 2), ep=2)


def test_delta_of_a_fused_tensor_sends_only_changed_expert_rows(two_ranks: dict) -> None:
    assert two_ranks["delta"].keys() == two_ranks["after"].keys()
    for name, tensor in two_ranks["after"].items():
        assert torch.equal(two_ranks["delta"][name], tensor), name
    assert two_ranks["delta_bytes"] == 64 * 32 * 4 + 8  # one expert's down_proj row + its index
