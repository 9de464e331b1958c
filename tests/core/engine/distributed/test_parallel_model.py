"""A run's model from a local Hugging Face directory: built without parameter memory, sharded,
filled from rank 0's single read; 2 gloo ranks load exactly what one rank and the files hold."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from graft.testing.checkpoint import save_tiny_checkpoint

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "load_pretrained.py"


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_checkpoint("tiny-qwen3-moe", tmp_path_factory.mktemp("hf") / "tiny-moe", seed=5)


def load(hf_dir: Path, out: Path, ranks: int) -> dict[str, torch.Tensor]:
    out.mkdir()
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                             f"--nproc-per-node={ranks}", str(SCRIPT), str(hf_dir), str(out)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return torch.load(out / "weights.pt")


@pytest.mark.slow
def test_two_ranks_load_exactly_what_one_rank_and_the_files_hold(hf_dir: Path,
                                                                 tmp_path: Path) -> None:
    one, two = load(hf_dir, tmp_path / "one", 1), load(hf_dir, tmp_path / "two", 2)
    files = load_file(hf_dir / "model.safetensors")
    assert one.keys() == two.keys() == files.keys()
    for name, tensor in files.items():
        assert torch.equal(one[name], tensor) and torch.equal(two[name], tensor), name
