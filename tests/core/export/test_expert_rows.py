"""Expert-parallel fused tensors stream as row blocks (one ep rank's block at a time) that sinks
assemble, or that an exporter's filter sends on their own: a tiny Qwen3-MoE split over ep with
`graft.engine.distributed.expert_parallel` and a handler that keeps its experts fused
(`expert_rows_worker.py`, gloo ranks; no model plugin)."""

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


@pytest.mark.slow
def test_fused_experts_stream_as_row_blocks_that_sinks_assemble(two_ranks: dict) -> None:
    assert_sinks_hold_the_fused_tensors(two_ranks, ep=2)


@pytest.mark.slow
def test_row_blocks_gathered_over_efsdp_on_four_ranks(tmp_path: Path) -> None:
    assert_sinks_hold_the_fused_tensors(run_worker(tmp_path, 4, 2), ep=2)


def test_a_filter_sends_row_blocks_apart_from_the_bucket(two_ranks: dict) -> None:
    expected = {name.replace(".experts.", ".experts.fused_"): tensor
                for name, tensor in two_ranks["params"].items()}
    apart = {name for name in expected if ".experts.fused_down_proj" in name}
    assert apart and two_ranks["filtered"].keys() == expected.keys() - apart
    for name, tensor in two_ranks["filtered"].items():
        assert torch.equal(tensor, expected[name]), name
    updates = two_ranks["updates"]  # each ep block on its own, as the filter made it
    assert sorted((name, first) for name, first, _ in updates) == sorted(
        (name, first) for name in apart for first in (0, 4))
    for name, first, values in updates:
        assert torch.equal(values, expected[name][first:first + values.shape[0]]), name
    assert two_ranks["filtered_bytes"] == two_ranks["hf_bytes"]
