"""R2 on two gloo ranks equal to one, with ids > 255 (a 512-expert preset override) recorded,
stored as int16 and replayed; each rank keeps its own micro-batches' routes."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parent / "scripts" / "two_rank_replay.py"


def one_rank(out: Path) -> dict:
    """The script's ``main`` in this process (a world of one)."""
    out.mkdir()
    spec = importlib.util.spec_from_file_location("two_rank_replay", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.main(str(out))
    return {**torch.load(out / "result.pt"), "routes": torch.load(out / "routes0.pt")}


def two_ranks(out: Path) -> dict:
    out.mkdir()
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                             "--nproc-per-node=2", str(SCRIPT), str(out)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    routes = [r for rank in (0, 1) for r in torch.load(out / f"routes{rank}.pt")]
    return {**torch.load(out / "result.pt"), "routes": routes}


@pytest.mark.slow
def test_two_gloo_ranks_replay_exactly_what_one_rank_does(tmp_path: Path) -> None:
    one, two = one_rank(tmp_path / "one"), two_ranks(tmp_path / "two")
    # the routes each rank recorded for its micro-batch: the same int16 ids as one rank's
    assert len(one["routes"]) == len(two["routes"]) == 2
    for a, b in zip(one["routes"], two["routes"], strict=True):
        assert a.dtype == b.dtype == torch.int16 and torch.equal(a, b)
    assert max(int(r.max()) for r in two["routes"]) > 255
    # the replayed update: same gradients and metrics on one and two ranks
    assert two["metrics"]["router_replay/mismatch_fraction"] > 0.05  # replay did change routes
    for name, value in one["metrics"].items():
        assert two["metrics"][name] == pytest.approx(value, rel=1e-9), name
    for name, grad in one["grads"].items():
        scale = max(1.0, float(grad.abs().max()))
        torch.testing.assert_close(two["grads"][name], grad, rtol=1e-6, atol=1e-6 * scale)
