"""``engine.fuse_loss_into_head`` on two gloo ranks (FSDP2): through `TrainEngine.forward_backward`
the RL loss and SFT's NLL give the unfused path's loss, metrics and gradients under every
built-in ``loss_agg_mode``, with half the head calls."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from graft.losses import BUILTIN_AGG_MODES

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "fused_head_grads.py"


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fused")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node=2", str(SCRIPT), str(out)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("loss", ["ppo", "sft"])
@pytest.mark.parametrize("mode", BUILTIN_AGG_MODES)
def test_two_ranks_fused_equals_unfused(results: Path, loss: str, mode: str) -> None:
    fused, unfused = (torch.load(results / f"{loss}-{mode}-{kind}.pt")
                      for kind in ("fused", "unfused"))
    assert fused["loss"] == pytest.approx(unfused["loss"], rel=1e-6, abs=1e-9)
    assert fused["metrics"] == pytest.approx(unfused["metrics"], rel=1e-6, abs=1e-9)
    for name, grad in unfused["grads"].items():
        error = float((fused["grads"][name] - grad).norm() / grad.norm().clamp_min(1e-30))
        assert error <= 1e-6, f"{loss} {mode}: gradient of {name} off by {error:.2e}"


@pytest.mark.parametrize("loss", ["ppo", "sft"])
def test_the_fused_head_runs_each_chunk_once(results: Path, loss: str) -> None:
    calls = torch.load(results / "calls.pt")
    # per micro-batch the model's own (empty) call, then each chunk once (fused) or twice
    micro_batches = 2 * len(BUILTIN_AGG_MODES)
    fused, unfused = calls[f"{loss}-fused"] - micro_batches, calls[f"{loss}-unfused"] - micro_batches
    assert 0 < 2 * fused == unfused
