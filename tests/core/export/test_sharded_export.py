"""Export under FSDP2 gives exactly the unsharded model's tensors: on two gloo ranks through the
copy plan (equal row blocks) and through the per-parameter path (uneven shards), on one rank
through the copy plan; in the trained dtype and cast to bf16 (each rank casts its shard before
the gather)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "export_sharded.py"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(("ranks", "vocab_size", "planned"),
                         [(2, 128, True), (2, 129, False), (1, 129, True)])
@pytest.mark.slow
def test_sharded_export_equals_the_unsharded_tensors(tmp_path: Path, ranks: int, vocab_size: int,
                                                     planned: bool, dtype: str) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={ranks}",
               str(SCRIPT), str(tmp_path), str(vocab_size), dtype]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    saved = torch.load(tmp_path / "export.pt")
    assert saved["planned"] is planned
    assert all(count > 1 for count in saved["buckets"]), saved["buckets"]
    weights, reference = saved["weights"], saved["reference"]
    assert weights.keys() == reference.keys()
    for name, tensor in reference.items():
        assert weights[name].dtype == getattr(torch, dtype), name
        assert torch.equal(weights[name], tensor), name
