"""Gradient norm and clipping on FSDP2 shards agree with torch's own implementation."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from graft.engine.distributed.grad_norm import clip_grad_norm


def test_matches_torch_clip_grad_norm_on_plain_tensors() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    model(torch.randn(3, 8)).square().sum().backward()
    reference = copy.deepcopy(model)
    for ours, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        theirs.grad = ours.grad.clone()
    norm = clip_grad_norm(model.parameters(), 0.5)
    expected = torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.5)
    torch.testing.assert_close(norm, expected)
    for ours, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(ours.grad, theirs.grad)


def test_no_clipping_leaves_gradients_alone() -> None:
    layer = torch.nn.Linear(4, 4)
    layer(torch.randn(2, 4)).sum().backward()
    before = layer.weight.grad.clone()
    norm = clip_grad_norm(layer.parameters(), float("inf"))
    assert torch.equal(layer.weight.grad, before) and norm > 0



SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "grad_norm_replicas.py"


@pytest.mark.slow
def test_every_element_counts_once_whatever_the_layout(tmp_path: Path) -> None:
    """4 gloo ranks, ``ep=2``: gradients sharded over all ranks, replicated over all ranks,
    split over (efsdp, ep), and replicated over efsdp but split over ep. Before, replicated
    gradients counted once per rank (a norm 2x too large for 4 replicas)."""
    out = tmp_path / "norms.json"
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                             "--nproc-per-node=4", str(SCRIPT), str(out)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    for norm, expected in json.loads(out.read_text()):
        assert norm == pytest.approx(expected, rel=1e-6)
