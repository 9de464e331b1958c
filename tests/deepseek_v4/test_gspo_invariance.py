"""GSPO's gradient does not depend on how a mini-batch is split over ranks and micro-batches
(the core's losses hold to the same: tests/core/engine/test_loss_invariance.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from graft.losses.modes import BUILTIN_AGG_MODES

SCRIPT = Path(__file__).resolve().parent / "scripts" / "gspo_grads.py"
pytestmark = pytest.mark.slow  # the script on one rank, then on two: ~20 s on 2 cores


def run(out: Path, *, ranks: int, micro_batches: int) -> None:
    out.mkdir()
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc-per-node={ranks}"]
    command = [*(launcher if ranks > 1 else [sys.executable]), str(SCRIPT), str(out),
               str(micro_batches)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.fixture(scope="module")
def gradients(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("gspo")
    run(root / "one_rank", ranks=1, micro_batches=4)
    run(root / "two_ranks", ranks=2, micro_batches=1)
    return root / "one_rank", root / "two_ranks"


@pytest.mark.parametrize("mode", BUILTIN_AGG_MODES)
def test_one_rank_four_micro_batches_equals_two_ranks_one_each(gradients, mode: str) -> None:
    one = torch.load(gradients[0] / f"{mode}.pt")
    two = torch.load(gradients[1] / f"{mode}.pt")
    assert one.keys() == two.keys()
    for name in one:
        scale = max(1.0, float(two[name].abs().max()))
        assert torch.allclose(one[name], two[name], rtol=1e-6, atol=1e-6 * scale), (
            f"{name}: max diff {(one[name] - two[name]).abs().max():.3g}")
    assert any(g.abs().max() > 1e-4 for g in one.values())


def test_modes_give_different_gradients(gradients) -> None:
    grads = [torch.load(gradients[0] / f"{m}.pt")["lm_head.weight"] for m in BUILTIN_AGG_MODES]
    for i in range(len(grads)):
        for j in range(i + 1, len(grads)):
            assert not torch.allclose(grads[i], grads[j])
